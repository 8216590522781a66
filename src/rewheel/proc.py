"""The one seam for subprocesses: argv lists only, never a shell.

`run` captures output; `stream` hands each output line to a callback as it arrives, keeps a
log file, and on timeout kills the child's whole process group (model-init smoke tests
fork worker processes that would otherwise outlive their parent).

`stream` children (uv, the smoke test) run in their own sessions, so a `kill -9` of rewheel
does not stop them. Two things keep that safe: they inherit the environment lock's descriptor
(`lend_fd`), so the lock stays held while any of them lives, and every start and end is
reported to the registered watchers (`watch`: the lock file and the run's journal), with the
child's pid, process group and /proc start time — so `resume` can find and stop exactly those
processes later (`stop_child`), never a process that merely reuses the pid.
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from rewheel.errors import CommandNotFound


def backoff(cap_s: float, first_s: float = 0.05) -> Iterator[float]:
    """Gaps for a poll: `first_s`, doubling up to `cap_s`. A service or a GPU that is ready
    within a fraction of a second is seen at once (that is downtime saved), and a model that
    loads for minutes is still asked only every `cap_s`."""
    gap = min(first_s, cap_s)
    while True:
        yield gap
        gap = min(cap_s, gap * 2)


@dataclass
class Completed:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str = ""
    timed_out: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def which(name: str, env: Mapping[str, str] | None = None) -> str | None:
    path = (env or os.environ).get("PATH")
    return shutil.which(name, path=path)


def _resolve(argv: Sequence[str], env: Mapping[str, str] | None) -> list[str]:
    if not argv:
        raise ValueError("empty argv")
    argv = [str(a) for a in argv]
    exe = argv[0]
    if os.sep not in exe:
        found = which(exe, env)
        if not found:
            raise CommandNotFound(f"command not found: {exe!r} (argv: {' '.join(argv)})",
                                  hint=f"install {exe} or put it on PATH")
        argv[0] = found
    elif not os.path.exists(exe):
        raise CommandNotFound(f"command not found: {exe}")
    return argv


def run(argv: Sequence[str], *, timeout: float | None = None,
        env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
        input: str | None = None) -> Completed:
    """Run argv to completion, capturing stdout and stderr as text."""
    resolved = _resolve(argv, env)
    start = time.monotonic()
    try:
        cp = subprocess.run(resolved, capture_output=True, text=True, timeout=timeout,
                            env=dict(env) if env is not None else None, cwd=cwd, input=input,
                            errors="replace")
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return Completed(list(argv), -9, out, err, timed_out=True,
                         seconds=time.monotonic() - start)
    return Completed(list(argv), cp.returncode, cp.stdout, cp.stderr,
                     seconds=time.monotonic() - start)


class Started:
    """A child started by `start`, its output collected by `wait` — what `run` does, in two
    halves, so that the caller works while the child runs."""

    def __init__(self, argv: Sequence[str], popen: subprocess.Popen[str] | None, error: OSError | None) -> None:
        self.argv, self.popen, self.error = list(argv), popen, error
        self.t0 = time.monotonic()

    def wait(self, timeout: float | None = None) -> Completed:
        """The child's result (as `run` gives it); an OSError from its start is raised here."""
        if self.error is not None or self.popen is None:
            raise self.error or OSError("not started")
        try:
            out, err = self.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            out, err = self.popen.communicate()
            return Completed(self.argv, -9, out or "", err or "", timed_out=True, seconds=time.monotonic() - self.t0)
        return Completed(self.argv, self.popen.returncode, out, err, seconds=time.monotonic() - self.t0)


def start(argv: Sequence[str]) -> Started:
    """Start argv now, its stdout and stderr captured as text; `Started.wait` collects them."""
    resolved = _resolve(argv, None)
    try:
        popen = subprocess.Popen(resolved, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                 text=True, errors="replace")
    except OSError as exc:
        return Started(argv, None, exc)
    return Started(argv, popen, None)


def detach(argv: Sequence[str]) -> None:
    """Start argv and leave it running, never waited for: its own session, stdin, stdout and
    stderr on /dev/null (a caller reading this process's output is not held up by it), and no
    descriptor of this process (it never holds the environment lock). For work that need not
    hold up this command's exit, such as deleting a folder already out of every user's way."""
    subprocess.Popen(_resolve(argv, None), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)


def kill_group(pgid: int, grace_s: float = 5.0, *, gone_wait_s: float = 5.0) -> bool:
    """SIGTERM a process group, then SIGKILL whatever is left after `grace_s`; then wait (up to
    `gone_wait_s`) until no member is left (a zombie, dead but not yet reaped, counts as gone).
    Returns whether the group is gone."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    if _wait_group_gone(pgid, grace_s):
        return True
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    return _wait_group_gone(pgid, gone_wait_s)


def _wait_group_gone(pgid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        if not group_members(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


# --- the processes rewheel starts, and finding them again after a crash ------------------------

@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat rewheel needs."""

    pid: int
    state: str
    pgid: int
    sid: int
    start: int  # clock ticks after boot: with the pid, names one process for good
    ppid: int = 0
    comm: str = ""

    @property
    def live(self) -> bool:
        """Running or sleeping: not a zombie (dead, not yet reaped) nor dead."""
        return self.state not in ("Z", "X")


def proc_stat(pid: int) -> ProcStat | None:
    """/proc/<pid>/stat, or None when there is no such process."""
    # One open, one read, one close: a scan of the process table reads this for every process,
    # and each is called many times a command (Path.read_bytes adds a stat, an ioctl, a seek).
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    # "pid (comm) state ppid pgrp session ... starttime(22nd)": comm may hold spaces and ")"
    close = raw.rfind(")")
    rest = raw[close + 2:].split()
    try:
        return ProcStat(pid, rest[0], int(rest[2]), int(rest[3]), int(rest[19]), ppid=int(rest[1]),
                        comm=raw[raw.find("(") + 1:close])
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    st = proc_stat(pid)
    return st.start if st else None


_BOOT: list[str | None] = []


def boot_id() -> str | None:
    """This boot's id (/proc/sys/kernel/random/boot_id): with a pid and its start time, what
    names one process for good — a record from another boot names a process that is gone."""
    if not _BOOT:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
                _BOOT.append(f.read().strip() or None)
        except (OSError, ValueError):
            _BOOT.append(None)
    return _BOOT[0]


# The largest pid Linux gives (PID_MAX_LIMIT on 64-bit): a recorded pid outside 2..this is not one.
PID_MAX = 1 << 22


def valid_pid(value: Any) -> bool:
    """Whether a value read from a record can name a process rewheel started: an int (not a
    bool) above 1 — never 0 or -1 (which `kill` reads as "my group", "everything"), never init."""
    return type(value) is int and 1 < value <= PID_MAX


def same_boot(boot: str | None, around_epoch: float | None = None, start_ticks: int | None = None) -> bool:
    """Whether a record was written in this boot: its boot id is this boot's; or, for a record
    written before boot ids were recorded, the process's start time (`start_ticks`, ticks after
    this boot) falls within a minute of the moment the record says it was started
    (`around_epoch`). Neither known: unproven, so False."""
    if boot is not None:
        return boot == boot_id()
    if around_epoch is None or start_ticks is None:
        return False
    started = _epoch_of(start_ticks)
    return started is not None and abs(started - around_epoch) < 60.0


def _epoch_of(ticks: int) -> float | None:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def _all_pids() -> list[int]:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def process_table() -> list[ProcStat]:
    """Every live process this user can see (zombies left out)."""
    return [st for st in map(proc_stat, _all_pids()) if st is not None and st.live]


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, in pid order."""
    try:
        os.killpg(pgid, 0)  # no such group: no scan of the whole process table
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    return sorted(st.pid for st in process_table() if st.pgid == pgid)


_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/\s@'\"<>`]+@")


def cmdline(pid: int) -> str:
    """A process's command line, for messages: the userinfo of URLs in it (an index's
    credentials) masked as `***@`."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    text = " ".join(a.decode(errors="replace") for a in raw.split(b"\0") if a)
    return _USERINFO.sub(lambda m: m.group(1) + "***@", text)[:200]


@dataclass(frozen=True)
class Child:
    """A process `stream` started in its own session: the leader of process group `pgid`."""

    pid: int
    pgid: int
    start: int | None
    name: str
    # The boot it started in (`boot_id`); None in records of an older rewheel, which are then
    # placed in this boot by `around` (when the record was written, epoch seconds).
    boot: str | None = None
    around: float | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "pgid": self.pgid, "start": self.start, "name": self.name, "boot": self.boot}

    @classmethod
    def from_json(cls, doc: Any, around: float | None = None) -> Child | None:
        """The child a record names, or None when the record cannot name one: a pid or group
        that is not a valid pid (0, -1, a float, a string, a list), a start time that is not
        a count of ticks."""
        if not isinstance(doc, dict):
            return None
        pid, pgid, start, boot = doc.get("pid"), doc.get("pgid"), doc.get("start"), doc.get("boot")
        if not (valid_pid(pid) and valid_pid(pgid)):
            return None
        assert isinstance(pid, int) and isinstance(pgid, int)
        if start is not None and not (type(start) is int and start >= 0):
            return None
        if boot is not None and not isinstance(boot, str):
            return None
        name = doc.get("name")
        return cls(pid, pgid, start, name if isinstance(name, str) and name else "?", boot, around)

    def live_members(self) -> list[int]:
        """The processes of this child's group that still run — provably this child's. With
        its leader alive (pid, start time and boot all match): the whole group. With the pid
        naming another process now: nothing (Linux reuses no number still in use as a process
        group's id, so the group had ended). With no process of that pid: the members of group
        (and session) `pgid` started no earlier than the leader. Nothing without a start time,
        nothing of another boot."""
        if self.start is None or not valid_pid(self.pgid):
            return []
        if self.boot is not None or self.around is not None:
            if not same_boot(self.boot, self.around, self.start):
                return []
        elif boot_id() is not None:
            return []  # neither boot nor time recorded: unproven
        st = proc_stat(self.pid)
        if st is not None and st.live and st.start != self.start:
            return []  # a recycled pid
        leader_ok = st is not None and st.start == self.start and st.live
        return [ps.pid for ps in process_table()
                if ps.pgid == self.pgid and (leader_ok or (ps.sid == self.pgid and ps.start >= self.start))]


@dataclass
class StoppedChild:
    """What `stop_child` did to what was left of a child's process group: its members, their
    command lines (for messages; by pid as text), the last signal sent, whether all are gone,
    and those still running when not. JSON: the child's keys, then these (`still_running`
    only when some are)."""

    child: Child
    processes: list[int]
    commands: dict[str, str]
    signal: str = "SIGTERM"
    stopped: bool = False
    still_running: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        doc = {**self.child.to_json(), "processes": self.processes, "commands": self.commands,
               "signal": self.signal, "stopped": self.stopped}
        if self.still_running:
            doc["still_running"] = self.still_running
        return doc


def stop_child(child: Child, *, term_wait_s: float = 10.0, kill_wait_s: float = 10.0) -> StoppedChild | None:
    """Stop what is left of a recorded child's process group (SIGTERM, wait up to `term_wait_s`,
    SIGKILL, wait up to `kill_wait_s` until every member is gone). None when nothing of it
    runs; else what was done: the pids, the last signal sent, whether all are gone."""
    members = child.live_members()
    if not members:
        return None
    done = StoppedChild(child, members, {str(p): cmdline(p) for p in members})

    def signal_all(sig: int) -> None:
        for pid in child.live_members():  # re-checked each time: never a recycled pid
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def wait_gone(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while child.live_members():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    signal_all(signal.SIGTERM)
    done.signal = "SIGTERM"
    if not wait_gone(term_wait_s):
        signal_all(signal.SIGKILL)
        done.signal = "SIGKILL"
        wait_gone(kill_wait_s)
    done.still_running = child.live_members()
    done.stopped = not done.still_running
    return done


def fd_holders(path: str | Path) -> list[int]:
    """Processes (other than this one) with a descriptor open on the file `path` — those this
    user may look at."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    key = (st.st_dev, st.st_ino)
    me = os.getpid()
    out = []
    for pid in _all_pids():
        if pid == me:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                fst = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (fst.st_dev, fst.st_ino) == key:
                out.append(pid)
                break
    return out


_lent_fds: list[int] = []
_watchers: list[Any] = []
_live: dict[int, Child] = {}


def lend_fd(fd: int) -> None:
    """Every `stream` child inherits `fd` from now on (the environment lock's descriptor)."""
    _lent_fds.append(fd)


def unlend_fd(fd: int) -> None:
    if fd in _lent_fds:
        _lent_fds.remove(fd)


def watch(watcher: Any) -> None:
    """Tell `watcher` about every `stream` child: `child_starting(name)` before it is started,
    `child_started(Child)` once it runs, `child_ended(Child)` once its whole group is gone. A
    watcher may define any of the three."""
    _watchers.append(watcher)


def unwatch(watcher: Any) -> None:
    if watcher in _watchers:
        _watchers.remove(watcher)


@contextmanager
def watching(watcher: Any) -> Iterator[None]:
    watch(watcher)
    try:
        yield
    finally:
        unwatch(watcher)


def live_children() -> list[Child]:
    """`stream` children of this process whose group may still run."""
    return list(_live.values())


def _notify(event: str, arg: Any) -> None:
    for w in list(_watchers):
        fn = getattr(w, event, None)
        if fn is not None:
            fn(arg)


def _ended(child: Child) -> None:
    if group_members(child.pgid):
        return  # something of it survived even SIGKILL (uninterruptible): still "live"
    _live.pop(child.pid, None)
    try:
        _notify("child_ended", child)
    except Exception:  # a record that could not be written must not mask the result
        pass


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP while a child group is being killed: a second Ctrl-C (or
    SIGTERM) must not abandon that cleanup half-way and leave the group running."""
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    except (OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def stream(argv: Sequence[str], *, on_line: Callable[[str], None] | None = None,
           timeout: float | None = None, env: Mapping[str, str] | None = None,
           cwd: str | Path | None = None, log_path: str | Path | None = None,
           redact: Callable[[str], str] | None = None) -> Completed:
    """Run argv in its own process group with stdout+stderr merged, line by line.

    Each line (redacted when `redact` is given) goes to `on_line` and to `log_path`. On
    timeout the whole process group is killed and `timed_out` is set. The returned
    `stdout` holds the last 2,000 lines (the full output is in the log).
    """
    resolved = _resolve(argv, env)
    start = time.monotonic()
    log = open(log_path, "a", encoding="utf-8") if log_path else None
    tail: list[str] = []
    name = os.path.basename(resolved[0])
    try:
        _notify("child_starting", name)
    except BaseException:
        if log:
            log.close()
        raise
    sel = selectors.DefaultSelector()
    # The environment lock's descriptor goes along (pass_fds): while anything of this child's
    # group lives, the lock stays held, also after a `kill -9` of rewheel.
    proc = subprocess.Popen(resolved, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=dict(env) if env is not None else None,
                            cwd=cwd, start_new_session=True, pass_fds=tuple(_lent_fds))
    assert proc.stdout is not None
    child = Child(proc.pid, proc.pid, None, name)
    buf = b""
    timed_out = False

    def emit(raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if redact:
            line = redact(line)
        if log:
            log.write(line + "\n")
            log.flush()
        tail.append(line)
        if len(tail) > 2000:
            del tail[:1000]
        if on_line:
            on_line(line)

    try:
        child = Child(proc.pid, proc.pid, start_time(proc.pid), name, boot_id())
        _live[child.pid] = child
        sel.register(proc.stdout, selectors.EVENT_READ)
        _notify("child_started", child)
        eof = False
        while not eof:
            remaining = None if timeout is None else timeout - (time.monotonic() - start)
            if remaining is not None and remaining <= 0:
                timed_out = True
                break
            events = sel.select(timeout=min(remaining, 0.5) if remaining is not None else 0.5)
            if not events:
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                eof = True
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                emit(raw)
        if buf:
            emit(buf)
        if timed_out:
            kill_group(proc.pid)
            proc.wait()
            if log:
                log.write(f"[rewheel] killed process group {proc.pid} after {timeout}s timeout\n")
        else:
            proc.wait()
            # Children that detached from the pipe but stayed in the group are ours to reap.
            if group_members(proc.pid):
                kill_group(proc.pid, grace_s=2.0)
        _ended(child)
    except BaseException:
        # Ctrl-C, SIGTERM/SIGHUP, or an on_line callback that raised: the child runs in its
        # own session, so nothing else would stop it (a uv still writing into the environment,
        # a smoke test still holding the GPUs). Kill its group, and wait until it is gone,
        # before giving up.
        with _signals_deferred():
            kill_group(proc.pid, grace_s=2.0)
            proc.wait()
            _ended(child)
        raise
    finally:
        sel.close()
        proc.stdout.close()
        if log:
            log.close()
    return Completed(list(argv), proc.returncode if not timed_out else -9, "\n".join(tail),
                     timed_out=timed_out, seconds=time.monotonic() - start)


def spawn_detached(argv: Sequence[str], *, log_path: str | Path,
                   env: Mapping[str, str] | None = None,
                   cwd: str | Path | None = None) -> subprocess.Popen[bytes]:
    """Start argv as a long-running service and return at once.

    The child gets its own session (so it outlives rewheel and a Ctrl-C at the terminal
    does not reach it, and its process group can be killed as a whole), stdin from
    /dev/null, and stdout+stderr appended to `log_path`. The caller records the pid.
    """
    resolved = _resolve(argv, env)
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(resolved, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT,
                                env=dict(env) if env is not None else None, cwd=cwd,
                                start_new_session=True)
