"""The second restore lane: a forked peer that restores half the folders.

Owns: how many lanes a restore uses (`auto_lanes`, `REWHEEL_RESTORE_LANES`), the peer
process (`Peer`), its body (`_lane_child`) and the messages on the pipes between them;
`fork_child`, `send_msg` and `recv_msg` also serve a large diff's second process.
The lane's work itself (prepare, commit, verify) is handed in by `restore`, so this module
does not import it.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import signal
import struct
import sys
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from rewheel.environment import Environment
from rewheel.errors import RestoreError, RewheelError, SnapshotDamaged, SnapshotError, UsageError
from rewheel.snapshot.store import SnapshotMeta
from rewheel.snapshot.tree import Root


class Lane(Protocol):
    """One lane's share of a restore, as `restore._Restore` does it."""

    @property
    def touched(self) -> bool: ...
    def commit(self) -> None: ...
    def verify(self) -> list[str]: ...
    def summary(self) -> dict[str, Any]: ...
    def proofs(self) -> tuple[list[Any], ...]: ...
    def discard_staging(self) -> None: ...


class LaneWork(NamedTuple):
    """What the second lane runs, handed in by `restore` (which imports this module, so this
    one cannot import it): read, compare, check and stage a lane's folders; and the error a
    commit stopped by the system becomes."""
    prepare: Callable[[Environment, SnapshotMeta, list[Root], tuple[int, int] | None, Any,
                       Callable[[str], None]], Lane]
    failed_midway: Callable[[Environment, SnapshotMeta, OSError], BaseException]


LANES_MIN_FILES = 4000  # below this, a second lane costs more (a fork) than it saves


def restore_lanes_setting() -> int | None:
    """`REWHEEL_RESTORE_LANES` (1 or 2), or None when unset. Commands check it before they
    act (`commands.open_target`), so a bad value changes nothing."""
    # Exactly "1" or "2": " 2" or "2\n" is refused rather than read one way here and another
    # by whatever else reads the variable; empty is unset.
    forced = os.environ.get("REWHEEL_RESTORE_LANES", "")
    if forced and forced not in ("1", "2"):
        raise UsageError(f"REWHEEL_RESTORE_LANES={forced!r}: expected 1 or 2 (no spaces or newlines)",
                         hint="unset it to let rewheel choose (2 on Linux with two CPUs, for a large environment)")
    return int(forced) if forced else None


def auto_lanes(snap: SnapshotMeta) -> int:
    """`REWHEEL_RESTORE_LANES` when set; otherwise two lanes on Linux (where a fork is cheap
    and safe beside a progress display's thread) with two CPUs, for enough files to share."""
    forced = restore_lanes_setting()
    if forced is not None:
        return forced
    return 2 if (sys.platform.startswith("linux") and (os.cpu_count() or 1) >= 2
                 and snap.files >= LANES_MIN_FILES) else 1


_ERRORS: dict[str, type[RewheelError]] = {c.__name__: c for c in (SnapshotDamaged, RestoreError, SnapshotError)}


class Peer:
    """The second lane of a restore: a forked process, and a pipe each way. It sends
    ("staged", its proofs) or ("failed", …) once its folders are compared, checked and staged, waits
    for "go" (or "stop", or the end of the pipe: it then discards its staging and exits),
    commits and sends ("committed",), verifies and sends ("done", summary) — or
    ("failed", error class, message, hint) at any point."""

    def __init__(self, pid: int, rfd: int, wfd: int) -> None:
        self.pid, self.rfd, self.wfd = pid, rfd, wfd

    @classmethod
    def start(cls, env: Environment, snap: SnapshotMeta, live_roots: list[Root], work: LaneWork) -> Peer:
        up_r, up_w = os.pipe()
        down_r, down_w = os.pipe()

        def body() -> None:
            os.close(up_r)
            os.close(down_w)
            _lane_child(env, snap, live_roots, work, down_r, up_w)

        pid = fork_child(body)
        os.close(up_w)
        os.close(down_r)
        return cls(pid, up_r, down_w)

    def _recv(self) -> tuple[Any, ...]:
        try:
            return recv_msg(self.rfd)
        except (EOFError, OSError, ValueError) as exc:
            raise RestoreError(f"the restore's second process ended without reporting ({exc or 'no reply'})",
                               hint="run the rollback again; the restore is idempotent") from None

    def staged(self) -> tuple[tuple[list[Any], ...], bool]:
        """Wait until the other lane has staged; what it proved (see `Lane.proofs`), and
        whether its commit would change anything (`Lane.touched`)."""
        msg = self._recv()
        if msg[0] != "staged":
            raise _error_from(msg)
        return msg[1], bool(msg[2])

    def go(self) -> None:
        send_msg(self.wfd, ("go",))

    def committed(self) -> None:
        msg = self._recv()
        if msg[0] != "committed":
            raise _error_from(msg)

    def done(self) -> dict[str, Any]:
        msg = self._recv()
        if msg[0] != "done":
            raise _error_from(msg)
        return msg[1]

    def stop(self) -> None:
        """Before the commit: the other lane discards what it staged and exits."""
        with contextlib.suppress(OSError):
            send_msg(self.wfd, ("stop",))
        self.reap()

    def reap(self) -> None:
        for fd in (self.rfd, self.wfd):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _lane_child(env: Environment, snap: SnapshotMeta, live_roots: list[Root], work: LaneWork, rfd: int,
                wfd: int) -> None:
    """The body of the second lane (in the forked process)."""
    try:
        r = work.prepare(env, snap, live_roots, (1, 2), None, lambda name: None)
    except BaseException as exc:
        send_msg(wfd, _error_msg(exc))
        return
    try:
        send_msg(wfd, ("staged", r.proofs(), r.touched))  # known before the commit, written meanwhile
        go = recv_msg(rfd)[0] == "go"
    except (EOFError, OSError, ValueError):  # the first lane stopped (and closed its end) first
        go = False
    if not go:
        r.discard_staging()
        return
    try:
        r.commit()
        send_msg(wfd, ("committed",))  # the first lane flushes both lanes' writes from here
        problems = r.verify()
    except BaseException as exc:
        r.discard_staging()
        if isinstance(exc, OSError):
            exc = work.failed_midway(env, snap, exc)
        send_msg(wfd, _error_msg(exc))
        return
    # What this lane moved out goes with its summary: the first lane takes it all away.
    send_msg(wfd, ("done", {**r.summary(), "problems": problems}))


def _error_msg(exc: BaseException) -> tuple[Any, ...]:
    if isinstance(exc, RewheelError):
        return ("failed", type(exc).__name__, exc.message, exc.hint)
    return ("failed", type(exc).__name__, str(exc), None)


def _error_from(msg: tuple[Any, ...]) -> BaseException:
    _, name, message, hint = msg
    if name == "KeyboardInterrupt":  # the other lane ignores SIGINT; only a test raises it there
        return KeyboardInterrupt()
    cls = _ERRORS.get(name)
    if cls is None:
        return RestoreError(f"the restore's second process failed: {name}: {message}",
                            hint="run the rollback again; the restore is idempotent")
    return cls(message, hint=hint)


def fork_child(body: Callable[[], None]) -> int:
    """Fork a process of rewheel's own that runs `body` and exits (0 once it returned, 1 if
    it raised), never returning into the caller's code; its pid, in the parent. It ignores
    Ctrl-C: the parent decides, and Ctrl-C reaches it."""
    with warnings.catch_warnings():
        # Python 3.12+ warns about forking a process with threads (a progress display): the
        # child touches none of their locks — it prints nothing, and leaves by _exit.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        with contextlib.suppress(ValueError):  # (not the main thread: then Ctrl-C never reaches this one)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        body()
        code = 0
    finally:
        os._exit(code)


def send_msg(fd: int, msg: tuple[Any, ...]) -> None:
    """One message between two processes of rewheel (the lanes; a diff's reader): its length,
    then marshal (both ends are this code)."""
    data = marshal.dumps(msg)
    view = memoryview(struct.pack("<I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def recv_msg(fd: int) -> tuple[Any, ...]:
    def exactly(n: int) -> bytearray:
        # Into one buffer: the last message (the other lane's proofs) is megabytes, read from
        # the pipe 64 KiB at a time.
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = os.readv(fd, [view[got:]])
            if not k:
                raise EOFError("the other lane closed its pipe")
            got += k
        return buf

    (size,) = struct.unpack("<I", exactly(4))
    msg = marshal.loads(exactly(size))
    if not isinstance(msg, tuple) or not msg:
        raise ValueError("a malformed message")
    return msg
