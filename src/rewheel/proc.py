"""The one seam for subprocesses: argv lists only, never a shell.

`run` captures output; `stream` hands each output line to a callback as it arrives, keeps a
log file, and on timeout kills the child's whole process group (model-init smoke tests
fork worker processes that would otherwise outlive their parent).
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rewheel.errors import CommandNotFound


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


def kill_group(pgid: int, grace_s: float = 5.0) -> None:
    """SIGTERM a process group, then SIGKILL whatever is left after `grace_s`."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


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
    proc = subprocess.Popen(resolved, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=dict(env) if env is not None else None,
                            cwd=cwd, start_new_session=True)
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
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
            try:
                os.killpg(proc.pid, 0)
                kill_group(proc.pid, grace_s=2.0)
            except ProcessLookupError:
                pass
    except BaseException:
        # Ctrl-C, or an on_line callback that raised: the child runs in its own session, so
        # nothing else would stop it (a uv still writing into the environment, a smoke test
        # still holding the GPUs). Kill its group before giving up.
        kill_group(proc.pid, grace_s=2.0)
        proc.wait()
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
