"""Crash-safe run state: the per-environment lock and each run's append-only journal.

The lock is an `flock` on `<envdir>/lock`: the kernel drops it when its holder dies, so a
`kill -9` never leaves a stale lock — but it does leave a journal without a `finished`
record, which is how the next command learns that a run was interrupted. Every record is
fsynced before the step it announces acts.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewheel.errors import InterruptedRun, LockHeld
from rewheel.paths import fsync_dir


class EnvLock:
    """One rewheel process per environment at a time."""

    def __init__(self, env_dir: Path, purpose: str) -> None:
        self.path = env_dir / "lock"
        self.purpose = purpose
        self.fd: int | None = None

    def __enter__(self) -> EnvLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise
            try:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            finally:
                os.close(fd)
            raise LockHeld(f"another rewheel process holds this environment ({holder or 'unknown'})",
                           hint="wait for it to finish; the lock is released when it exits") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {self.purpose}".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass
class RunJournal:
    """The append-only record of one run: `<envdir>/runs/<id>/journal.jsonl`."""

    dir: Path
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.dir.name

    @classmethod
    def create(cls, env_dir: Path, kind: str, **info: Any) -> RunJournal:
        run_dir = env_dir / "runs" / new_run_id()
        run_dir.mkdir(parents=True, mode=0o700)
        fsync_dir(run_dir.parent)
        j = cls(run_dir)
        j.append("started", kind=kind, **info)
        return j

    @classmethod
    def load(cls, run_dir: Path) -> RunJournal:
        j = cls(run_dir)
        path = run_dir / "journal.jsonl"
        if path.exists():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    j.records.append(json.loads(line))
                except ValueError:
                    break  # a torn last write: everything before it stands
        return j

    def append(self, event: str, **data: Any) -> dict[str, Any]:
        rec = {"event": event, "time": time.time(), **data}
        line = json.dumps(rec, default=str) + "\n"
        fd = os.open(self.dir / "journal.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self.records.append(rec)
        _maybe_fault(event, data)
        return rec

    # Derived state -------------------------------------------------------------------
    def first(self, event: str) -> dict[str, Any] | None:
        return next((r for r in self.records if r["event"] == event), None)

    def last(self, event: str) -> dict[str, Any] | None:
        return next((r for r in reversed(self.records) if r["event"] == event), None)

    @property
    def kind(self) -> str:
        start = self.first("started")
        return str(start.get("kind", "run")) if start else "run"

    @property
    def finished(self) -> bool:
        return self.last("finished") is not None

    @property
    def status(self) -> str:
        fin = self.last("finished")
        return str(fin.get("status")) if fin else "interrupted"

    @property
    def snapshot_id(self) -> str | None:
        for r in self.records:
            if r.get("snapshot_id"):
                return str(r["snapshot_id"])
        return None

    @property
    def last_step(self) -> str | None:
        steps = [r for r in self.records if r["event"] == "step"]
        return str(steps[-1]["name"]) if steps else None

    def summary(self) -> dict[str, Any]:
        start = self.first("started") or {}
        fin = self.last("finished") or {}
        installed = self.last("installed") or {}
        return {"id": self.id, "kind": self.kind, "status": self.status,
                "started": start.get("time"), "finished": fin.get("time"),
                "snapshot_id": self.snapshot_id, "last_step": self.last_step,
                "recipe": start.get("recipe"), "before": fin.get("before") or start.get("before"),
                "after": fin.get("after"),
                # What the upgrade installed, also when it was reverted afterwards.
                "attempted": installed.get("versions")}


def _maybe_fault(event: str, data: dict[str, Any]) -> None:
    """Testing hook for crash safety: `REWHEEL_FAULT_AT=step:reinstall` (or `snapshot`,
    `finished`, ...) makes this process kill itself with SIGKILL right after that record
    is durable — exactly what a power cut or an OOM kill at that boundary does."""
    want = os.environ.get("REWHEEL_FAULT_AT")
    if not want:
        return
    key = f"{event}:{data.get('name')}" if event == "step" else event
    if want == key:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def list_runs(env_dir: Path) -> list[RunJournal]:
    runs_dir = env_dir / "runs"
    if not runs_dir.is_dir():
        return []
    return [RunJournal.load(d) for d in sorted(runs_dir.iterdir(), reverse=True) if d.is_dir()]


def interrupted_run(env_dir: Path) -> RunJournal | None:
    """The newest run that never finished (its process died), if any. Call under the lock."""
    for j in list_runs(env_dir):
        if not j.finished and j.records:
            return j
    return None


def interrupted_error(j: RunJournal, target: str) -> InterruptedRun:
    return InterruptedRun(
        f"{j.kind} {j.id} on {target} was interrupted (last step: {j.last_step or 'start'})",
        hint=f"`rewheel resume {target}` finishes or undoes it; `rewheel rollback {target}` "
             f"restores its pre-upgrade snapshot {j.snapshot_id or ''}".rstrip())


def refuse_if_interrupted(env_dir: Path, target: str) -> None:
    j = interrupted_run(env_dir)
    if j is not None:
        raise interrupted_error(j, target)
