"""A full disk at a step of `run`, `rollback` and `resume`, on a small real filesystem.

The rewheel home (journal, snapshots, the service's pid and log) lives on a real ext4 of
2.2 GiB on a loop device (the `disk` fixture); in the `env` layout the environment lives there
too, so uv and the restores write onto it. The command is paused right after a journal record
is durable (the fault hook `REWHEEL_FAULT_AT` with `REWHEEL_FAULT_SIGNAL=STOP`); the test then
fills the filesystem, leaving `room` bytes, and lets it go on: the step the record announced
meets ENOSPC in its own writes, and every later write too. The proof, for each: a clear error
(no internal error, no traceback), the journal still read by `status` and `history`, and once
the disk is freed `resume` (or nothing) leaves the environment byte-exact in the old or the new
state, the service running the build that state holds, nothing stray inside the prefix, and no
process of rewheel's left.

Each list of cases below (run, rollback, resume) is the fault suites' sample
(`support_killpoints.sample`: a spread over the list, moved by each session's seed;
`REWHEEL_KILLPOINTS=all` every case)."""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from support_disk import fill as _fill
from support_killpoints import sample
from support_run import SERVER, Host, make_host
import support_cli

# A frame of rewheel's own code in a traceback (a failing smoke test prints its own).
OWN_FRAME = re.compile(r'File "[^"]*/rewheel/[^"]*\.py", line')


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


@dataclass
class Outcome:
    rc: int
    stdout: str
    stderr: str
    paused: int  # how many times the command reached the boundary

    def doc(self) -> dict:
        return json.loads(self.stdout) if self.stdout.strip() else {}


def _paused_run(h: Host, args: list[str], at: str, disk: Path, room: int, nth: int = 1,
                env: dict[str, str] | None = None) -> Outcome:
    """`rewheel ARGS`, paused at the `nth` time the journal record `at` is durable; the disk
    filled then (leaving `room` bytes), and the command let go on to its end."""
    out, err = h.tmp / "cmd.out", h.tmp / "cmd.err"
    with open(out, "w") as fo, open(err, "w") as fe:
        p = support_cli.start(*args, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                              env={**os.environ, **(env or {}), "REWHEEL_FAULT_AT": at,
                                   "REWHEEL_FAULT_SIGNAL": "STOP"})
        paused = 0
        try:
            deadline = time.monotonic() + 240
            while p.poll() is None:
                if time.monotonic() > deadline:
                    raise AssertionError(f"rewheel {' '.join(args)} did not end")
                if _state(p.pid) == "T":
                    paused += 1
                    if paused == nth:
                        _fill(disk, room)
                    os.kill(p.pid, signal.SIGCONT)
                time.sleep(0.01)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    return Outcome(p.returncode, out.read_text(), err.read_text(), paused)


def _service_pids(h: Host) -> list[int]:
    """This test's model servers (its environment's python lies under the test's tmp path):
    the other workers' servers are theirs to count and to kill."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            mine = any(a.startswith(str(h.tmp).encode()) for a in argv)
            if mine and str(SERVER).encode() in argv and _state(int(entry)) not in ("Z", "X"):
                pids.append(int(entry))
    return pids


def _leftover_processes(h: Host) -> list[str]:
    """Processes of this test other than the service: uv, a smoke test, a paused rewheel."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(h.tmp) in cmd and str(SERVER) not in cmd and _state(int(entry)) not in ("Z", "X"):
            found.append(f"{entry}: {cmd[:200]}")
    return found


def _stray(h: Host) -> list[str]:
    return [str(p) for p in h.prefix.rglob("*") if ".rewheel-" in p.name or p.name.startswith(".rewheel")]


def _site(h: Host) -> Path:
    return next((h.prefix / "lib").glob("python3*/site-packages"))


def _record_ok(h: Host, version: str) -> None:
    """The new state: toypkg `version` installed, every file its RECORD lists byte-exact."""
    site = _site(h)
    dist = site / f"toypkg-{version}.dist-info"
    assert dist.is_dir(), sorted(p.name for p in site.iterdir())
    with open(dist / "RECORD", newline="") as f:
        for path, digest, _size in csv.reader(f):
            if not digest:
                continue
            algo, _, want = digest.partition("=")
            got = base64.urlsafe_b64encode(hashlib.new(algo, (site / path).read_bytes()).digest()).rstrip(b"=")
            assert got.decode() == want, f"{path} differs from its RECORD"


def _check_after(h: Host, before: dict, new_version: str) -> str:
    """The environment is the old state byte for byte or the new one (toypkg `new_version`
    exactly as its RECORD says, nothing else changed); the service serves that build; nothing
    stray, no process left. Returns "old" or "new"."""
    now = h.state()
    if now == before:
        which, want = "old", "1.0.0"
    else:
        _record_ok(h, new_version)
        changed = {k for k in set(now) | set(before) if now.get(k) != before.get(k)}
        assert all("toypkg" in k or k.startswith("bin/") for k in changed), sorted(changed)[:20]
        which, want = "new", new_version
    assert h.served_version() == want
    assert len(_service_pids(h)) == 1, _service_pids(h)
    assert _stray(h) == []
    assert _leftover_processes(h) == []
    return which


def _clear(outcome: Outcome) -> None:
    """A sentence, never a bug: no internal error (exit 5), no traceback."""
    assert outcome.rc in (0, 1, 2, 3), (outcome.rc, outcome.stdout, outcome.stderr)
    text = outcome.stdout + outcome.stderr
    assert "internal error" not in text and not OWN_FRAME.search(text), text
    if outcome.rc in (2, 3):
        doc = outcome.doc()
        # An error's sentence, or a report whose revert says what failed.
        said = doc if doc.get("message") or doc.get("error") else doc.get("revert") or {}
        assert said.get("message") or said.get("error"), outcome.stdout + outcome.stderr
        assert said.get("hint"), outcome.stdout


def _journal_readable(h: Host) -> dict:
    """`status` and `history` read the journal (exit 0, or 4 for an interrupted run)."""
    for cmd in ("status", "history"):
        cp = h.rewheel(cmd, str(h.recipe), "--json")
        assert cp.returncode in (0, 4), (cmd, cp.returncode, cp.stdout, cp.stderr)
        assert "Traceback" not in cp.stderr
        doc = json.loads(cp.stdout)
    return doc


def _settle(h: Host, disk: Path) -> str:
    """The disk freed: `resume` finishes or undoes whatever is open (else says nothing is);
    then nothing is. Returns what `resume` did."""
    (disk / "filler").unlink(missing_ok=True)
    res = h.rewheel("resume", str(h.recipe), "--yes", "--json")
    assert res.returncode == 0, (res.stdout, res.stderr)
    hist = h.rewheel("history", str(h.recipe), "--json")
    assert hist.returncode == 0, (hist.stdout, hist.stderr)
    assert not json.loads(hist.stdout).get("interrupted_run")
    return str(json.loads(res.stdout)["status"])


def _host(tmp_path: Path, disk: Path, layout: str, variant: str, monkeypatch: pytest.MonkeyPatch,
          **recipe: object) -> Host:
    monkeypatch.setenv("REWHEEL_HOME", str(disk / "home"))
    h = make_host(disk if layout == "env" else tmp_path, "2.0.0", variant)
    h.tmp = tmp_path
    if recipe:
        h.write_recipe(**recipe)
    h.start_service()
    return h


def _teardown(h: Host) -> None:
    h._index.stop()  # type: ignore[attr-defined]
    for pid in _service_pids(h):
        os.kill(pid, signal.SIGKILL)


def _prove(h: Host, disk: Path, o: Outcome, at: str, before: dict) -> str:
    assert o.paused >= 1, f"never reached {at}: {o.rc} {o.stderr}"
    _clear(o)
    _journal_readable(h)
    resumed = _settle(h, disk)
    which = _check_after(h, before, "2.0.0")
    doc = o.doc()
    print(f"OUTCOME rc={o.rc} status={doc.get('status') or doc.get('error')} resume={resumed} state={which}")
    return which


# (layout, variant, boundary, room). `env`: the environment on the small filesystem too (uv and
# the restores meet the full disk); `home`: only the store. Room 0 at every boundary; 64 KiB
# (the journal fits, a snapshot or an install does not) where it takes another path.
RUN_CASES = [("env", "good", at, 0) for at in ("step:stop", "step:snapshot", "step:snapshot-check",
                                                "step:reinstall", "step:diff", "step:smoke", "step:start",
                                                "step:keep", "finished")] + [
    ("env", "smoke-fails", "step:revert", 0), ("env", "smoke-fails", "step:restore", 0),
    ("env", "smoke-fails", "step:start", 0), ("env", "unstaged", "step:snapshot", 0),
    ("env", "unstaged", "step:reinstall", 0), ("home", "good", "step:start", 0),
    ("env", "good", "step:reinstall", 65536), ("env", "smoke-fails", "step:restore", 65536)]


@pytest.mark.parametrize("layout, variant, at, room", sample(RUN_CASES, "full-disk-run"))
def test_run(tmp_path: Path, disk: Path, layout: str, variant: str, at: str, room: int,
             monkeypatch: pytest.MonkeyPatch) -> None:
    extra = {"install__staged": False} if variant == "unstaged" else {}
    h = _host(tmp_path, disk, layout, "good" if variant == "unstaged" else variant, monkeypatch, **extra)
    try:
        before = h.state()
        o = _paused_run(h, ["run", str(h.recipe), "--yes", "--json"], at, disk, room)
        _prove(h, disk, o, at, before)
    finally:
        _teardown(h)


ROLLBACK_STEPS = ["note", "step:snapshot", "step:stop", "step:snapshot-check", "step:restore", "step:start",
                  "finished"]


@pytest.mark.parametrize("at", sample(ROLLBACK_STEPS, "full-disk-rollback"))
def test_rollback(tmp_path: Path, disk: Path, at: str, monkeypatch: pytest.MonkeyPatch) -> None:
    h = _host(tmp_path, disk, "env", "good", monkeypatch)
    try:
        before = h.state()
        code, rep = h.run_json()
        assert code == 0 and h.served_version() == "2.0.0", rep["_stderr"]
        o = _paused_run(h, ["rollback", str(h.recipe), "--yes", "--json"], at, disk, 0)
        _prove(h, disk, o, at, before)
    finally:
        _teardown(h)


# (how the run was killed, its recipe staged or not, the boundary of `resume` the disk fills at)
RESUME_CASES = [("step:smoke", True, "step:revert"), ("step:smoke", True, "step:stop"),
                ("step:smoke", True, "failed-snapshot"), ("step:smoke", True, "step:restore"),
                ("step:smoke", True, "step:start"), ("step:smoke", True, "finished"),
                ("step:keep", True, "step:keep"), ("step:snapshot", False, "step:abort")]


@pytest.mark.parametrize("killed, staged, at", sample(RESUME_CASES, "full-disk-resume"))
def test_resume(tmp_path: Path, disk: Path, killed: str, staged: bool, at: str,
                monkeypatch: pytest.MonkeyPatch) -> None:
    h = _host(tmp_path, disk, "env", "good", monkeypatch, install__staged=staged)
    try:
        before = h.state()
        cp = h.rewheel("run", str(h.recipe), "--yes", "--quiet", env={"REWHEEL_FAULT_AT": killed})
        assert cp.returncode == -9, cp.stderr
        o = _paused_run(h, ["resume", str(h.recipe), "--yes", "--json"], at, disk, 0)
        _prove(h, disk, o, at, before)
    finally:
        _teardown(h)
