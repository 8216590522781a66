"""Crash-safe run state: the per-environment lock and each run's append-only journal.

The lock is an `flock` on a machine-wide file keyed by the environment prefix's device and
inode (`paths.lock_dir`), so it holds whichever state home a command uses. The kernel drops it
when the last descriptor on it is closed, so a `kill -9` never leaves a stale lock — but it
does leave a journal without a `finished` record, which is how the next command learns that a
run was interrupted. The descriptor is inherited by uv and the smoke test (`proc.lend_fd`):
while anything rewheel started still runs, the lock stays held. Every record is fsynced
before the step it announces acts.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rewheel import proc, records
from rewheel.errors import InterruptedRun, JournalDamaged, JournalWriteError, LinkInState, LockHeld, PreflightError
from rewheel.paths import fsync_dir, lock_dir, lock_name
from rewheel.records import (AnyRecord, ChildEnded, ChildStarted, ChildStarting, Finish, Installed, Note, R,
                             SnapshotTaken, Started, Step)
from rewheel.statuses import Finished, StepName

RECLAIM_WAIT_S = 10.0  # after stopping a dead holder's children: how long the lock may take to free


def _prefix_of(env_dir: Path) -> Path:
    """The environment a state folder belongs to (its env.json), else the folder itself."""
    try:
        prefix = json.loads((env_dir / "env.json").read_text())["prefix"]
        if isinstance(prefix, str) and prefix and os.path.isdir(prefix):
            return Path(prefix)
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        pass
    return env_dir


def _describe(pids: list[int]) -> str:
    return ", ".join(f"{p} ({(proc.cmdline(p) or '?')[:80]})" for p in pids)


class EnvLock:
    """One rewheel process per environment at a time, whichever state home it uses.

    `prefix`: the environment to lock (default: the one `env_dir`'s env.json names; a folder
    without one, such as a bisection's state, locks itself). The lock file holds JSON lines:
    the holder (pid, /proc start time, purpose), then each child it started. A command that
    finds the lock taken exits 4 naming the holder — or, when that rewheel is gone, the
    processes it started that still hold the lock.

    `reclaim=True` (resume, rollback): when the holder is gone, its recorded children (in the
    lock file or the interrupted run's journal) are stopped — SIGTERM to every process of the group,
    up to 10 s, SIGKILL, wait until gone — and the lock is taken; with the lock taken, recorded
    children that still run are stopped the same way. All before any file is touched;
    `stopped` lists what was stopped.
    """

    def __init__(self, env_dir: Path, purpose: str, *, prefix: Path | None = None,
                 reclaim: bool = False, say: Callable[[str], None] | None = None) -> None:
        self.env_dir = Path(env_dir)
        self.purpose = purpose
        self.prefix = Path(prefix) if prefix is not None else _prefix_of(self.env_dir)
        self.reclaim = reclaim
        self.say = say or (lambda _msg: None)
        self.path: Path | None = None
        self.fd: int | None = None
        self.previous: list[dict[str, Any]] = []  # what the last holder left in the file
        self.stopped: list[proc.StoppedChild] = []
        self.journal: RunJournal | None = None  # set by a run: children are journaled there too
        self._end = 0
        self._owner = os.geteuid()  # the lock folder's owner, once known

    # -- the lock file ----------------------------------------------------------------
    def _lock_path(self) -> tuple[Path, int]:
        try:
            st = os.stat(self.prefix)
        except OSError:
            st = os.stat(self.env_dir)
        try:
            d = lock_dir(st.st_uid)
        except OSError as exc:
            raise PreflightError(f"cannot lock {self.prefix}: {exc}",
                                 hint="remove or fix that folder (or set REWHEEL_LOCK_DIR for every "
                                      "rewheel on this machine); nothing was changed") from None
        owner = os.lstat(d).st_uid
        return d / lock_name(st), owner

    @staticmethod
    def _records(fd: int) -> list[dict[str, Any]]:
        out = []
        raw = os.pread(fd, 1 << 20, 0).decode(errors="replace")
        for line in raw.splitlines():
            try:
                doc = json.loads(line)
            except (ValueError, RecursionError):  # not a record rewheel wrote: skipped
                continue
            if isinstance(doc, dict):
                out.append(doc)
        return out

    def _try(self) -> int | list[dict[str, Any]]:
        """The locked descriptor, or the records of the current holder when it is taken."""
        assert self.path is not None
        for _ in range(50):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    from rewheel.owned import linked

                    raise linked(self.path) from None
                raise
            fst = os.fstat(fd)
            if not stat.S_ISREG(fst.st_mode):
                os.close(fd)
                raise PreflightError(f"lock file {self.path} is not a regular file: refusing to use it")
            if os.geteuid() == 0 and fst.st_uid != self._owner:
                os.fchown(fd, self._owner, -1)  # root made it in the owner's folder
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                try:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                    return self._records(fd)
                finally:
                    os.close(fd)
            # The last holder removes the file on release: make sure this is still the file
            # the path names, else lock the new one.
            try:
                pst = os.lstat(self.path)
            except FileNotFoundError:
                os.close(fd)
                continue
            if (pst.st_dev, pst.st_ino) != (fst.st_dev, fst.st_ino):
                os.close(fd)
                continue
            return fd
        raise LockHeld(f"could not take the lock {self.path}: it kept being replaced",
                       hint="another rewheel is starting and ending on this environment; try again")

    # -- who holds it -----------------------------------------------------------------
    def holder_now(self) -> dict[str, Any] | None:
        """The live rewheel holding this lock now (its lock-file record: pid, purpose, ...),
        read without taking the lock — a status must never make a run wait; None when
        nobody holds it (no lock file, or its holder is gone)."""
        try:
            path, _ = self._lock_path()
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (OSError, PreflightError, LinkInState):  # a link: refused where the lock is taken
            return None
        try:
            holder = self._holder(self._records(fd))
        finally:
            os.close(fd)
        return holder if holder is not None and self._holder_alive(holder) else None

    @staticmethod
    def _holder(records: list[dict[str, Any]]) -> dict[str, Any] | None:
        return next((r for r in records if "pid" in r), None)

    @staticmethod
    def _holder_alive(holder: dict[str, Any] | None) -> bool:
        if holder is None:
            return True  # unknown: assume a live rewheel
        try:
            pid = int(holder["pid"])
        except (TypeError, ValueError):
            return True
        st = proc.proc_stat(pid)
        if st is None or not st.live:
            return False
        return holder.get("start") is None or st.start == holder.get("start")

    def _recorded_children(self, records: list[dict[str, Any]]) -> list[proc.Child]:
        """Children named by the lock file's records and by this home's interrupted runs."""
        found: dict[tuple[int, int | None], proc.Child] = {}
        docs: list[tuple[Any, float | None]] = [(r["child"], None) for r in records if isinstance(r.get("child"), dict)]
        for j in list_runs(self.env_dir):
            if not j.finished:
                docs += [(r.to_json(), r.time) for r in j.all(ChildStarted)]
        for doc, around in docs:
            c = proc.Child.from_json(doc, around)
            if c is not None:
                found[(c.pid, c.start)] = c
        return list(found.values())

    def _stop(self, children: list[proc.Child]) -> None:
        for c in children:
            done = proc.stop_child(c)
            if done is None:
                continue
            self.stopped.append(done)
            how = "stopped" if done.stopped else "could NOT stop"
            procs = ", ".join(f"{p} ({(done.commands.get(str(p)) or '?')[:80]})" for p in done.processes)
            self.say(f"{how} {c.name} (pid {c.pid}, process group {c.pgid}, {done.signal}) left "
                     f"running by an interrupted rewheel: {procs}")

    def _users(self, records: list[dict[str, Any]]) -> list[int]:
        """The live processes a gone holder left holding the lock: its recorded children's,
        and whatever this user can see holding the lock file open."""
        assert self.path is not None
        pids: list[int] = []
        for c in self._recorded_children(records):
            pids += [p for p in c.live_members() if p not in pids]
        return pids + [p for p in proc.fd_holders(self.path) if p not in pids]

    def _refuse(self, records: list[dict[str, Any]]) -> LockHeld:
        holder = self._holder(records)
        what = f"pid {holder.get('pid')}: {holder.get('purpose')}" if holder else "unknown"
        if self._holder_alive(holder):
            return LockHeld(f"another rewheel process holds this environment ({what})",
                            hint="wait for it to finish; the lock is released when it exits")
        pids = self._users(records)
        running = _describe(pids) if pids else "unknown processes (not visible to this user)"
        return LockHeld(f"the rewheel process that held this environment ({what}) is gone, but "
                        f"processes it started still run and hold its lock: {running}",
                        hint="`rewheel resume TARGET` stops them and finishes or undoes the interrupted run "
                             "(a rollback to one of its snapshots stops them too); or wait until they end")

    # -- enter / exit -----------------------------------------------------------------
    def __enter__(self) -> EnvLock:
        self.path, self._owner = self._lock_path()
        got = self._try()
        if not isinstance(got, int) and not self._holder_alive(self._holder(got)):
            # The holder is gone, and what still held the lock a moment ago may have ended
            # since (a smoke test that outlived a killed rewheel by milliseconds): nobody left
            # holding it, ask once more instead of refusing for "unknown processes".
            if not self._users(got):
                got = self._try()
        if not isinstance(got, int):
            if not self.reclaim or self._holder_alive(self._holder(got)):
                raise self._refuse(got)
            # The holder is gone; what it started is not: stop that, then take the lock.
            self._stop(self._recorded_children(got))
            deadline = time.monotonic() + RECLAIM_WAIT_S
            while not isinstance(got, int):
                if time.monotonic() >= deadline:
                    raise self._refuse(got)
                time.sleep(0.1)
                got = self._try()
        fd = got
        self.previous = self._records(fd)
        os.ftruncate(fd, 0)
        line = json.dumps({"pid": os.getpid(), "start": proc.start_time(os.getpid()),
                           "purpose": self.purpose, "prefix": str(self.prefix),
                           "state": str(self.env_dir)}) + "\n"
        os.pwrite(fd, line.encode(), 0)
        self._end = len(line.encode())
        self.fd = fd
        proc.lend_fd(fd)
        proc.watch(self)
        if self.reclaim:
            # Recorded children that no longer hold the lock may still run (a worker that
            # closed its descriptors): stopped too, before anything is touched.
            try:
                self._stop(self._recorded_children(self.previous))
            except BaseException:
                self.__exit__()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is None:
            return
        proc.unwatch(self)
        proc.unlend_fd(self.fd)
        if not proc.live_children() and self.path is not None:
            # Nothing rewheel started shares the descriptor: remove the file while holding the
            # lock (a waiter re-checks the path), so lock files do not pile up.
            try:
                os.unlink(self.path)
            except OSError:
                pass
        # Closed, not unlocked: a child that survived its kill keeps holding the lock.
        os.close(self.fd)
        self.fd = None

    # -- proc watcher: the children this holder starts ---------------------------------
    def child_starting(self, name: str) -> None:
        if self.journal is not None:
            self.journal.append(ChildStarting(name=name))

    def child_started(self, child: proc.Child) -> None:
        if self.fd is not None:
            line = (json.dumps({"child": child.to_json()}) + "\n").encode()
            os.pwrite(self.fd, line, self._end)
            self._end += len(line)
        if self.journal is not None:
            self.journal.append(ChildStarted(**child.to_json()))

    def child_ended(self, child: proc.Child) -> None:
        if self.journal is not None:
            self.journal.append(ChildEnded(pid=child.pid, pgid=child.pgid, name=child.name))


def new_run_id() -> str:
    import secrets  # here, not at import: every command imports the journal, few start a run

    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass
class RunJournal:
    """The append-only record of one run: `<envdir>/runs/<id>/journal.jsonl`."""

    dir: Path
    records: list[AnyRecord] = field(default_factory=list)
    # Lines `load` skipped (line number, their first characters): torn or not rewheel's.
    damaged: list[tuple[int, str]] = field(default_factory=list)
    _damage_noted: bool = field(default=False, repr=False)
    # An unfinished journal with a finished run after it (`list_runs`): that later run proves it
    # settled — it could not have started while this one waited — so it is never resumed over
    # the newer state (its `finished` record may be one a newer rewheel wrote, or damaged).
    superseded_by: str | None = None

    @property
    def id(self) -> str:
        return self.dir.name

    @classmethod
    def create(cls, env_dir: Path, started: Started) -> RunJournal:
        run_dir = env_dir / "runs" / new_run_id()
        try:
            run_dir.mkdir(parents=True, mode=0o700)
            fsync_dir(run_dir.parent)
            j = cls(run_dir)
            j.append(started)
        except (OSError, JournalWriteError) as exc:
            # A journal that could not be started (a full disk) must not be left behind: it
            # would read as an interrupted run. Nothing was changed yet.
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)
            reason = exc.reason if isinstance(exc, JournalWriteError) else exc.strerror or exc
            raise PreflightError(f"cannot write the journal in {run_dir.parent}: {reason}",
                                 hint="free disk there (or move the store: [snapshots] store, "
                                      "REWHEEL_HOME); nothing was changed") from None
        return j

    @classmethod
    def load(cls, run_dir: Path) -> RunJournal:
        """The records of a run folder. A line that is not a record rewheel wrote — torn by a
        crash or a full disk, or garbage from any cause — is skipped and remembered in
        `damaged` (line number, its start), and the records after it still count: one bad line
        must never hide the `finished` record that closes the run. A journal that is not a
        regular file is refused (exit 2), never read: a FIFO would hang, a folder has no lines;
        a symlink is LinkInState (exit 3), as any link in rewheel's own folders."""
        j = cls(run_dir)
        path = run_dir / "journal.jsonl"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return j
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a link in rewheel's own folders (`owned`): exit 3
                from rewheel.owned import linked

                raise linked(path) from None
            if exc.errno != errno.EISDIR:
                raise JournalDamaged(f"cannot read the journal {path}: {exc.strerror or exc}",
                                     hint=f"fix its permissions, or move the run folder {run_dir} "
                                          "out of the store") from None
            fd = -1
        try:
            if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
                raise JournalDamaged(f"the journal {path} is not a regular file",
                                     hint=f"move the run folder {run_dir} out of the store (it was not "
                                          "written by rewheel); nothing was changed")
            with os.fdopen(os.dup(fd), "rb") as f:
                raw = f.read()
        finally:
            if fd >= 0:
                os.close(fd)
        for n, line in enumerate(raw.decode("utf-8", errors="replace").split("\n"), 1):
            if not line.strip():
                continue
            rec = _record(line)
            if rec is None:
                j.damaged.append((n, line[:120]))
            else:
                j.records.append(rec)
        return j

    def append(self, rec: R) -> R:
        """Write one record and fsync it: all of it, or nothing and a `JournalWriteError`.

        A short write (a full disk) is finished or, when the rest cannot be written, cut
        off again, so a half record is never left behind to be read later. A journal whose last
        line was torn before (a crash mid-write) gets its new record on a line of its own."""
        if self.damaged and not self._damage_noted:
            # Recorded once in the journal itself: what `load` skipped, so the history says so.
            self._damage_noted = True
            self.append(Note(damaged_lines=[n for n, _ in self.damaged],
                             damaged_text=[text for _, text in self.damaged[:5]]))
        rec = replace(rec, time=time.time())
        event = rec.event
        line = (json.dumps(rec.to_json(), default=str) + "\n").encode()
        path = self.dir / "journal.jsonl"
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise JournalWriteError(event, path, exc) from None
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # the last record was torn: start a line of its own
            try:
                view = memoryview(line)
                while view:
                    n = os.write(fd, view)
                    if n <= 0:
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    view = view[n:]
                os.fsync(fd)
            except BaseException as exc:
                # Take the partial record back out (a full disk, or a signal's exception
                # mid-write), so no reader ever sees half of it: the step did not start.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                    os.fsync(fd)
                if isinstance(exc, OSError):
                    raise JournalWriteError(event, path, exc) from None
                raise
        finally:
            os.close(fd)
        self.records.append(rec)
        _maybe_fault(rec)
        return rec

    # Derived state -------------------------------------------------------------------
    def all(self, kind: type[R]) -> list[R]:
        """The records of one type, oldest first."""
        return [r for r in self.records if isinstance(r, kind)]

    def first(self, kind: type[R]) -> R | None:
        return next((r for r in self.records if isinstance(r, kind)), None)

    def last(self, kind: type[R]) -> R | None:
        return next((r for r in reversed(self.records) if isinstance(r, kind)), None)

    def stepped(self, name: StepName) -> bool:
        """Whether that step began (its record is written before it acts)."""
        return any(s.name == name for s in self.all(Step))

    @property
    def kind(self) -> str:
        start = self.first(Started)
        return start.kind if start else "run"

    @property
    def finished(self) -> bool:
        return self.last(Finish) is not None or self.superseded_by is not None

    @property
    def status(self) -> str:
        fin = self.last(Finish)
        if fin is None and self.superseded_by is not None:
            return Finished.SUPERSEDED
        return str(fin.status) if fin else Finished.INTERRUPTED

    @property
    def snapshot_id(self) -> str | None:
        """The snapshot this command restores (a rollback's target, a run's pre-upgrade one):
        a run's last `SnapshotTaken` (a pre-upgrade snapshot taken again replaced the first),
        else the first record that names one."""
        taken = [r.snapshot_id for r in self.records if isinstance(r, SnapshotTaken)]
        if taken:
            return taken[-1]
        for r in self.records:
            sid = r.snapshot_id if isinstance(r, Started | Step | SnapshotTaken | Finish) else None
            if sid:
                return sid
        return None

    @property
    def last_step(self) -> str | None:
        steps = self.all(Step)
        return str(steps[-1].name) if steps else None

    def summary(self) -> dict[str, Any]:
        started = self.first(Started)
        start = started or Started()
        fin = self.last(Finish)
        installed = self.last(Installed)
        return {"id": self.id, "kind": self.kind, "status": self.status,
                "started": started.time if started else None,
                "finished": fin.time if fin else None,
                "snapshot_id": self.snapshot_id, "last_step": self.last_step,
                "recipe": start.recipe, "before": (fin.before if fin else None) or start.before,
                "after": fin.after if fin else None,
                # What the upgrade installed, also when it was reverted afterwards.
                "attempted": (installed.versions if installed else None) or (fin.attempted if fin else None),
                # From the stop to the first healthy answer (None: the service was not stopped).
                "downtime": fin.downtime if fin else None,
                # Lines that were not records (torn by a crash or a full disk), skipped.
                **({"damaged_lines": [n for n, _ in self.damaged]} if self.damaged else {}),
                **({"superseded_by": self.superseded_by} if self.superseded_by and not fin else {})}


def _record(line: str) -> AnyRecord | None:
    """One journal line as the record rewheel wrote, or None when it is not one."""
    try:
        return records.from_json(json.loads(line))
    except (ValueError, RecursionError):
        return None


_fault_seen: dict[str, int] = {}


def _maybe_fault(rec: AnyRecord) -> None:
    """Testing hook for crash safety: `REWHEEL_FAULT_AT=step:reinstall` (or `snapshot`,
    `finished`, ...) makes this process kill itself with SIGKILL right after that record
    is durable — exactly what a power cut or an OOM kill at that boundary does.
    `KEY#N`: at the Nth record of that key this process writes (default the first; only
    once, so a polite signal's own clean-up records are not signalled again)."""
    want = os.environ.get("REWHEEL_FAULT_AT")
    if not want:
        return
    key = f"{rec.event}:{rec.name}" if isinstance(rec, Step) else rec.event
    name, _, nth = want.partition("#")
    if name != key:
        return
    _fault_seen[key] = _fault_seen.get(key, 0) + 1
    if _fault_seen[key] == (int(nth) if nth.isdigit() else 1):
        os.kill(os.getpid(), fault_signal())


def fault_signal() -> int:
    """The signal the testing hooks send: SIGKILL, or `REWHEEL_FAULT_SIGNAL` (TERM, INT, HUP:
    an operator's Ctrl-C, a service manager's stop, a closed terminal at that very point; STOP: a
    pause there, for a test to change the host — fill the disk — before it goes on)."""
    import signal

    name = os.environ.get("REWHEEL_FAULT_SIGNAL", "KILL").upper().removeprefix("SIG")
    return int(getattr(signal, f"SIG{name}", signal.SIGKILL))


def list_runs(env_dir: Path) -> list[RunJournal]:
    runs_dir = env_dir / "runs"
    if not runs_dir.is_dir():
        return []
    runs = [RunJournal.load(d) for d in runs_dir.iterdir() if d.is_dir()]
    # Newest first by when each started: ids made within one second differ only in their
    # random part, so their names alone do not order them.
    runs.sort(key=lambda j: (j.records[0].time if j.records else 0, j.id), reverse=True)
    later: str | None = None  # the newest run with a `finished` record of its own
    for j in runs:
        if not j.records:
            continue
        if j.last(Finish) is not None:
            later = later or j.id
        elif later is not None:
            j.superseded_by = later
    return runs


def interrupted_run(env_dir: Path) -> RunJournal | None:
    """The newest run that never finished (its process died), if any. Call under the lock."""
    for j in list_runs(env_dir):
        if not j.finished and j.records:
            return j
    return None


def interrupted_error(j: RunJournal, target: str) -> InterruptedRun:
    return InterruptedRun(
        f"{j.kind} {j.id} on {target} was interrupted (last step: {j.last_step or 'start'})"
        + (f"; its journal has {len(j.damaged)} damaged line(s), skipped" if j.damaged else ""),
        hint=f"`rewheel resume {target}` finishes or undoes it"
             + (f"; `rewheel rollback {target}` restores its pre-upgrade snapshot {j.snapshot_id}"
                if j.snapshot_id else ""))


def refuse_if_interrupted(env_dir: Path, target: str) -> None:
    j = interrupted_run(env_dir)
    if j is not None:
        raise interrupted_error(j, target)
