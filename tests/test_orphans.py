"""Children must not outlive rewheel unnoticed (issue 14, item 3).

uv and the smoke test run in their own sessions. They inherit the environment lock's
descriptor, so while one of them lives no other command can take the environment; their
process groups (pid + /proc start time) are journaled, so `resume`/`rollback` stop them —
and wait — before touching a file; SIGTERM and SIGHUP stop them like Ctrl-C does. Real
processes throughout; rewheel is killed at real points (the journal's fault hook)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rewheel import proc
from rewheel.errors import LockHeld
from rewheel.installer import find_uv
from rewheel.journal import EnvLock
from support_run import make_host


def _alive(pid: int) -> bool:
    st = proc.proc_stat(pid)
    return st is not None and st.state not in ("Z", "X")


def _wait_for(pred, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# --------------------------------------------------------------------------------------
# the mechanism: an inherited lock descriptor, recorded children, stopping them
# --------------------------------------------------------------------------------------
HOLDER = """
import sys
from pathlib import Path
from rewheel import proc
from rewheel.journal import EnvLock

with EnvLock(Path(sys.argv[1]), "holder", prefix=Path(sys.argv[2])):
    proc.stream(["sh", "-c", "echo $$; exec sleep 120"], on_line=lambda l: print(l, flush=True))
"""


def test_a_killed_holders_child_keeps_the_lock_until_reclaimed(tmp_path: Path) -> None:
    prefix, state = tmp_path / "env", tmp_path / "state"
    prefix.mkdir()
    state.mkdir()
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(state), str(prefix)],
                         stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert p.stdout is not None
        child = int(p.stdout.readline())
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert _alive(child)
        # The holder is gone; its child still holds the lock, and is named.
        with pytest.raises(LockHeld) as exc:
            with EnvLock(state, "run", prefix=prefix):
                pass
        assert "is gone" in exc.value.message and str(child) in exc.value.message
        # resume/rollback stop it (and wait until it is gone), then take the lock.
        said: list[str] = []
        with EnvLock(state, "resume", prefix=prefix, reclaim=True, say=said.append) as lk:
            assert not _alive(child)
            assert [d.child.pid for d in lk.stopped] == [child]
            assert lk.stopped[0].stopped and lk.stopped[0].signal == "SIGTERM"
            assert lk.stopped[0].to_json()["pid"] == child and "still_running" not in lk.stopped[0].to_json()
            assert "sleep" in said[0] and str(child) in said[0]
    finally:
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_recycled_pid_is_never_killed(tmp_path: Path) -> None:
    p = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        start = proc.start_time(p.pid)
        assert start is not None
        # Recorded with another start time: the pid now names a different process.
        assert proc.stop_child(proc.Child(p.pid, p.pid, start - 1, "uv"), term_wait_s=1) is None
        assert proc.stop_child(proc.Child(p.pid, p.pid, None, "uv"), term_wait_s=1) is None
        time.sleep(0.2)
        assert p.poll() is None
        done = proc.stop_child(proc.Child(p.pid, p.pid, start, "sleep", proc.boot_id()), term_wait_s=5)
        assert done is not None and done.stopped and done.processes == [p.pid]
        assert p.wait(timeout=5) == -signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# --------------------------------------------------------------------------------------
# end to end: kill -9 of rewheel while uv is still installing
# --------------------------------------------------------------------------------------
# rewheel, with `find_uv` pointed at a wrapper: a real rewheel process, killed for real.
LAUNCH = ("import sys, rewheel.installer as i; w = sys.argv.pop(1); i.find_uv = lambda: w; "
          "sys.argv[0] = 'rewheel'; from rewheel.cli import main; main()")

# A uv that is slow in a deterministic way: the real install runs (the environment changes),
# then it keeps running until `go` exists — and then writes once more into the environment,
# as a uv still at work would. Plans (--dry-run) and everything else pass straight through.
WRAPPER = """#!/bin/sh
case " $* " in *" --dry-run "*) exec {real} "$@" ;; esac
if [ "$1" = pip ] && [ "$2" = install ]; then
  echo $$ > {d}/uv.pid
  {real} "$@" > {d}/uv.out 2>&1
  rc=$?
  : > {d}/installed
  i=0
  while [ ! -e {d}/go ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
  if [ -e {d}/go ]; then echo "LATE = 1" > {site}/toypkg_late_write.py; fi
  exit $rc
fi
exec {real} "$@"
"""


def _site_packages(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("command", ["resume", "rollback"])
def test_kill_9_while_uv_installs_then_resume_stops_it_first(tmp_path: Path, command: str) -> None:
    h = make_host(tmp_path, "2.0.0", "good")
    d = tmp_path / "slow-uv"
    d.mkdir()
    wrapper = d / "uv"
    wrapper.write_text(WRAPPER.format(real=find_uv(), d=d, site=_site_packages(h.python)))
    wrapper.chmod(0o755)
    uv_pid = 0
    try:
        h.start_service()
        before = h.state()
        cp = subprocess.run([sys.executable, "-c", LAUNCH, str(wrapper), "run", str(h.recipe), "--yes",
                             "--quiet"], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                            env={**os.environ, "REWHEEL_FAULT_AT": "child"}, timeout=180)
        # Killed right after the journal recorded uv's process group.
        assert cp.returncode == -9, cp.stderr
        _wait_for(lambda: (d / "uv.pid").exists() and (d / "installed").exists(), what="the orphaned uv")
        uv_pid = int((d / "uv.pid").read_text())
        assert _alive(uv_pid)
        assert h.state() != before  # the orphan did install

        # While the orphan lives, no new command takes the environment: exit 4, naming it.
        again = h.rewheel("run", str(h.recipe), "--yes", "--json")
        assert again.returncode == 4, again.stderr
        doc = json.loads(again.stdout)
        assert doc["error"] == "LockHeld" and str(uv_pid) in doc["message"], doc
        other = h.rewheel("snapshot", "--python", str(h.python), "--json",
                          env={"REWHEEL_HOME": str(tmp_path / "another-home")})
        assert other.returncode == 4 and str(uv_pid) in json.loads(other.stdout)["message"]

        # resume (or rollback) stops it (and waits) before touching a file, then undoes the run.
        res = h.rewheel(command, str(h.recipe), "--yes", "--json")
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert out["status"] == ("reverted" if command == "resume" else "restored"), out
        assert [s["pid"] for s in out["stopped_processes"]] == [uv_pid], out["stopped_processes"]
        assert out["stopped_processes"][0]["stopped"] is True
        assert f"pid {uv_pid}" in res.stderr  # the human lines say so too
        assert not _alive(uv_pid)
        assert h.state() == before  # byte-exact
        assert h.served_version() == "1.0.0"

        # Had it survived, it would write now: it does not, and nothing changes.
        (d / "go").touch()
        time.sleep(1.0)
        assert not list(Path(_site_packages(h.python)).glob("toypkg_late_write.py"))
        assert h.state() == before
        assert h.rewheel("history", str(h.recipe)).returncode == 0
    finally:
        (d / "go").touch()
        if uv_pid and _alive(uv_pid):
            os.killpg(uv_pid, signal.SIGKILL)
        h.stop_service()
        h._index.stop()  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------
# SIGTERM / SIGHUP during the smoke test
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_during_smoke_leaves_no_smoke_process(tmp_path: Path, sig: int) -> None:
    h = make_host(tmp_path, "2.0.0", "good")
    pids_file = tmp_path / "smoke-pids"
    # The smoke command forks a worker (as vLLM forks one per GPU), in its process group.
    smoke = ("import os, subprocess, sys, time; "
             "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
             f"open({str(pids_file)!r} + '.tmp', 'w').write(f'{{os.getpid()}} {{w.pid}}'); "
             f"os.replace({str(pids_file)!r} + '.tmp', {str(pids_file)!r}); time.sleep(120)")
    h.write_recipe(smoke__command=["{python}", "-c", smoke])
    pids: list[int] = []
    try:
        h.start_service()
        before = h.state()
        p = subprocess.Popen([sys.executable, "-m", "rewheel", "run", str(h.recipe), "--yes", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        _wait_for(pids_file.exists, timeout=120, what="the smoke test")
        pids = [int(x) for x in pids_file.read_text().split()]
        assert all(_alive(x) for x in pids)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 4, err
        doc = json.loads(out)  # one JSON document, as for Ctrl-C
        assert doc["error"] == "InterruptedRun", doc
        assert signal.Signals(sig).name in doc["message"] and "resume" in doc["hint"]
        # rewheel waited until the whole group was gone before it exited.
        assert not [x for x in pids if _alive(x)], "the smoke test's process group survived"
        res = h.rewheel("resume", str(h.recipe), "--yes", "--json")
        assert res.returncode == 0, res.stderr
        rdoc = json.loads(res.stdout)
        assert rdoc["status"] == "reverted" and rdoc["stopped_processes"] == []
        assert h.state() == before
        assert h.served_version() == "1.0.0"
    finally:
        for x in pids:
            if _alive(x):
                os.kill(x, signal.SIGKILL)
        h.stop_service()
        h._index.stop()  # type: ignore[attr-defined]
