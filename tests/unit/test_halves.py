"""Work shared with a second process (issue 44), where no process is started: when a fork
pays, and a fork the system refuses. The fork itself, a second process that dies or hangs:
tests/test_diff_counts.py and tests/test_patches.py."""

from __future__ import annotations

import errno
import os

import pytest

from rewheel import halves


def test_a_fork_pays_for_enough_work_with_a_second_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(halves.sys, "platform", "linux")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert halves.worth_sharing(4000, 4000) and not halves.worth_sharing(3999, 4000)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert not halves.worth_sharing(10**6, 4000)
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert not halves.worth_sharing(10**6, 4000)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(halves.sys, "platform", "darwin")  # a fork beside a thread is not safe there
    assert not halves.worth_sharing(10**6, 4000)


def test_a_fork_the_system_refuses_leaves_all_the_work_here(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(body: object) -> int:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(halves, "fork_child", refused)
    done: list[str] = []
    before = set(os.listdir("/proc/self/fd"))
    assert halves.share(lambda: done.append("mine"), lambda: ("theirs",), wait_min=1) is None
    assert done == ["mine"]  # this half done; the caller does the other
    assert set(os.listdir("/proc/self/fd")) == before  # the pipe closed
