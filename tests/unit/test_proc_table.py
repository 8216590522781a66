"""rewheel's one reader of /proc/<pid>/stat (`proc.proc_stat`), on this test's own process,
and the process-group question that needs no scan of the process table when the group is gone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rewheel import proc, service


def test_proc_stat_reads_this_process() -> None:
    me = proc.proc_stat(os.getpid())
    assert me is not None and me.live
    assert (me.pid, me.ppid, me.pgid, me.sid) == (os.getpid(), os.getppid(), os.getpgrp(), os.getsid(0))
    assert me.comm == Path("/proc/self/comm").read_text().rstrip("\n")
    assert me.start == proc.start_time(os.getpid()) > 0
    assert me in [p for p in proc.process_table() if p.pid == os.getpid()]


def test_no_such_process_reads_as_none() -> None:
    pid = 2**22 + 1  # above pid_max's ceiling: never a process
    assert proc.proc_stat(pid) is None and proc.start_time(pid) is None
    assert not service.common._alive(pid)


def test_a_gone_group_is_answered_without_reading_every_process(monkeypatch: pytest.MonkeyPatch) -> None:
    def scan() -> list[int]:
        raise AssertionError("the whole process table was read for a group that does not exist")

    monkeypatch.setattr(proc, "_all_pids", scan)
    assert proc.group_members(2**22 + 1) == []


def test_a_live_group_lists_its_members() -> None:
    assert os.getpid() in proc.group_members(os.getpgrp())
    assert proc.group_members(os.getpgrp()) == sorted(proc.group_members(os.getpgrp()))
