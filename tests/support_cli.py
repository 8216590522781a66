"""How the suite runs a `rewheel` command to its end: `rewheel(*args, ...)`, with the arguments
and the answer of `subprocess.run([sys.executable, "-m", "rewheel", *args], capture_output=True)`.

The command is its own process either way. By default it is forked from a warm interpreter
that has imported rewheel already (tests/support_zygote.py, one per test process), which
spares each command the interpreter's start and the imports: a third of a second of CPU, and
the suite runs a few thousand commands. Output is read from pipes until both close and the
exit status comes from `waitpid`, as `subprocess.run` has them; a timeout kills the command
and raises `subprocess.TimeoutExpired`.

A real interpreter is started instead (`subprocess.run`, the same arguments) when the
request sets what an interpreter fixes when it starts (`INTERPRETER_KEYS`: PYTHON*, the
locale, terminal and colour settings some CLI libraries read at import) to other values than
the warm one has, under a wrapper (`prefix`), or when `REWHEEL_TESTS_REAL_CLI=1`. A tracer
(strace, for the fault suites' kill points) attaches to a warm command by pid (`attach`). The
tests whose subject is the interpreter's own start — a command in a pipe, from the console
script, the imports — start it themselves. A command a test watches while it runs (its pid, a
signal, `poll`/`wait`) comes from `start(*args, ...)`, the parts of `subprocess.Popen` the tests
use, warm where it can be."""

from __future__ import annotations

import atexit
import io
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

ZYGOTE = Path(__file__).with_name("support_zygote.py")
# (COLUMNS and LINES are not among them: rich and click read them when they measure the
# terminal, not at import; test_support_cli compares both ways at several widths.)
INTERPRETER_KEYS = re.compile(r"^(PYTHON\w*|LC_\w+|LANG|LANGUAGE|TERM|NO_COLOR|FORCE_COLOR|"
                              r"TTY_\w+|_?TYPER_\w+|TERMINAL_WIDTH|GITHUB_ACTIONS|PY_COLORS|CLICK_\w+|"
                              r"COLORTERM|JUPYTER_\w+|VSCODE_\w+|DATABRICKS_\w+)$")

_lock = threading.Lock()
_server: dict[str, Any] = {}


def argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "rewheel", *args]


def _interpreter_settings(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if INTERPRETER_KEYS.match(k)}


def _zygote() -> dict[str, Any]:
    with _lock:
        z = _server.get("z")
        if z is not None and z["proc"].poll() is None:
            return z
        if z is not None:  # it ended (a test killed it): its folder goes with it
            shutil.rmtree(z["folder"], ignore_errors=True)
        folder = tempfile.mkdtemp(prefix="rewheel-zygote-")
        path = os.path.join(folder, "s")
        env = dict(os.environ)
        proc = subprocess.Popen([sys.executable, str(ZYGOTE), path], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env, cwd=folder)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != b"ready":
            proc.kill()
            proc.wait()
            shutil.rmtree(folder, ignore_errors=True)
            raise RuntimeError(f"the warm interpreter did not start: {line!r}")
        z = {"proc": proc, "path": path, "folder": folder, "settings": _interpreter_settings(env)}
        _server["z"] = z

        def stop(p: subprocess.Popen = proc, folder: str = folder) -> None:
            if p.stdin:
                p.stdin.close()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            shutil.rmtree(folder, ignore_errors=True)  # its socket's folder, left in /tmp otherwise

        atexit.register(stop)
        return z


def _server_for(env: dict[str, str], wrapped: bool = False) -> dict[str, Any] | None:
    """The warm interpreter a command with this environment is forked from, or None when a
    real one must start it: under a wrapper, with `REWHEEL_TESTS_REAL_CLI=1`, or with settings
    an interpreter fixes at start (`INTERPRETER_KEYS`) other than the warm one's."""
    if wrapped or env.get("REWHEEL_TESTS_REAL_CLI") == "1":
        return None
    z = _zygote()
    return z if _interpreter_settings(env) == z["settings"] else None


def _answers(buf: bytearray) -> list[dict[str, Any]]:
    """The warm interpreter's whole answers in `buf` (JSON lines: its pid, then its status),
    taken out of it."""
    found = []
    while b"\n" in buf:
        line, _, rest = bytes(buf).partition(b"\n")
        buf[:] = rest
        found.append(json.loads(line))
    return found


def rewheel(*args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
            input: str | bytes | None = None, stdin: int | IO[Any] | None = None,
            timeout: float | None = None, text: bool = True, check: bool = False,
            umask: int = -1, prefix: list[str] | None = None,
            attach: list[str] | None = None) -> subprocess.CompletedProcess:
    """`subprocess.run([*prefix, *argv(*args)], capture_output=True, ...)`, started warm where it
    can be (never under a `prefix`: a wrapper such as setpriv starts the interpreter).

    `attach`: a tracer that attaches by pid (`[*attach, "-p", PID]`: strace and its options).
    A warm command is held before its first line until the tracer has attached, so the tracer
    sees all of the command but the interpreter's start and imports (which a warm command does
    not make); a real interpreter runs under it as a prefix (`[*attach, *argv]`)."""
    full_env = dict(os.environ if env is None else env)
    cmd = argv(*args)
    z = _server_for(full_env, wrapped=bool(prefix))
    if z is None:
        cp = subprocess.run([*(prefix or attach or []), *cmd], capture_output=True, text=text, env=env,
                            cwd=cwd, input=input, stdin=stdin, timeout=timeout, umask=umask)
    else:
        cp = _run_warm(z, cmd, full_env, cwd, input, stdin, timeout, text, False, umask, attach)
    import support_hints  # (here: it imports the CLI, which a test of the imports must not see first)

    # Every hint it printed, run as typed in the state it left (tests/support_hints.py).
    support_hints.check(args, full_env, cwd, umask, prefix, cp)
    if check:
        cp.check_returncode()
    return cp


def run_guarded(args: list[str], *, env: dict[str, str], cwd: str | Path | None, umask: int,
                prefix: list[str] | None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`rewheel *args` as `rewheel()` runs it (no terminal), stopped before the first thing it
    would change (support_zygote's guard: exit support_hints.GUARD_EXIT) — how a printed hint
    is run as typed without changing the state of the test that printed it."""
    z = _server_for(env, wrapped=bool(prefix))
    if z is None:
        return subprocess.run([*(prefix or []), sys.executable, str(ZYGOTE), "--guarded", *args],
                              capture_output=True, text=True, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                              timeout=timeout, umask=umask)
    return _run_warm(z, argv(*args), env, cwd, None, subprocess.DEVNULL, timeout, True, False, umask, guard=True)


class _Tracer:
    """`[*attach, "-p", PID]` started on a held warm command, which goes on once the tracer
    has attached (/proc's TracerPid names it)."""

    def __init__(self, attach: list[str], pid: int, release_fd: int) -> None:
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([*attach, "-p", str(pid)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.err)
        deadline = time.monotonic() + 30
        while _tracer_of(pid) != self.proc.pid:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close(kill=True)
                raise RuntimeError(f"{attach[0]} did not attach to {pid}: {self.stderr()}")
            time.sleep(0.002)
        os.write(release_fd, b"x")

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def close(self, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        self.proc.wait(30)  # its output (strace -o) complete
        self.err.close()


def _tracer_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _run_warm(z: dict[str, Any], cmd: list[str], env: dict[str, str], cwd: str | Path | None,
              input: str | bytes | None, stdin: int | IO[Any] | None, timeout: float | None,
              text: bool, check: bool, umask: int, attach: list[str] | None = None,
              guard: bool = False) -> subprocess.CompletedProcess:
    deadline = None if timeout is None else time.monotonic() + timeout
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    r_hold, w_hold = os.pipe() if attach else (None, None)
    tracer = None
    w_in = None
    data = input.encode() if isinstance(input, str) else input or b""
    if input is not None:
        in_fd, w_in = os.pipe()
    else:
        in_fd = _fd_for(stdin, 0, os.O_RDONLY)
    try:
        sock = _send(z, cmd, env, cwd, umask, [in_fd, w_out, w_err, *([r_hold] if r_hold is not None else [])],
                     guard=guard)
    finally:
        for fd in (in_fd, w_out, w_err, r_hold):
            if fd is not None:
                os.close(fd)
    out: dict[int, bytearray] = {r_out: bytearray(), r_err: bytearray()}
    answer = bytearray()
    pid = status = None
    sel = selectors.DefaultSelector()
    for fd in (r_out, r_err):
        sel.register(fd, selectors.EVENT_READ)
    sel.register(sock, selectors.EVENT_READ)
    if w_in is not None:
        os.set_blocking(w_in, False)
        sel.register(w_in, selectors.EVENT_WRITE)
    try:
        while len(sel.get_map()) > 0:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                if tracer is not None:
                    tracer.close(kill=True)
                    tracer = None
                raise subprocess.TimeoutExpired(cmd, timeout or 0, bytes(out[r_out]), bytes(out[r_err]))
            for key, _ in sel.select(left):
                if key.fileobj is sock:
                    chunk = sock.recv(65536)
                    answer += chunk
                    for msg in _answers(answer):
                        pid = msg.get("pid", pid)
                        status = msg.get("status", status)
                        if attach and tracer is None and pid is not None and w_hold is not None:
                            try:
                                tracer = _Tracer(attach, pid, w_hold)
                            except BaseException:
                                os.kill(pid, signal.SIGKILL)  # never run untraced
                                raise
                    if not chunk:
                        sel.unregister(sock)
                elif key.fd == w_in:
                    try:
                        data = data[os.write(w_in, data):] if data else b""
                    except BrokenPipeError:  # the command exited without reading it all
                        data = b""
                    if not data:
                        sel.unregister(w_in)
                        os.close(w_in)
                        w_in = None
                else:
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        out[key.fd] += chunk
                    else:
                        sel.unregister(key.fd)
    finally:
        sel.close()
        if tracer is not None:
            tracer.close()
        for fd in (r_out, r_err, w_in, w_hold):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        sock.close()
    if status is None:
        raise RuntimeError(f"the warm interpreter gave no exit status for {cmd}")
    rc = os.waitstatus_to_exitcode(status)
    stdout, stderr = bytes(out[r_out]), bytes(out[r_err])
    if text:
        cp = subprocess.CompletedProcess(cmd, rc, _decode(stdout), _decode(stderr))
    else:
        cp = subprocess.CompletedProcess(cmd, rc, stdout, stderr)
    if check:
        cp.check_returncode()
    return cp


def _send(z: dict[str, Any], cmd: list[str], env: dict[str, str], cwd: str | Path | None, umask: int,
          fds: list[int], guard: bool = False) -> socket.socket:
    """The request for `cmd` with its descriptors (stdin, stdout, stderr[, hold]): the
    connection on which the warm interpreter answers its pid, then its status. `guard`: stopped
    before its first change (support_zygote's guard)."""
    req = {"argv": cmd[3:], "env": env, "cwd": str(Path(cwd).resolve()) if cwd is not None else os.getcwd(),
           "umask": _umask() if umask < 0 else umask, "pgid": os.getpgrp(), "guard": guard}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(z["path"])
        socket.send_fds(sock, [json.dumps(req).encode() + b"\n"], fds)
    except BaseException:
        sock.close()
        raise
    return sock


def start(*args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
          stdin: int | IO[Any] | None = None, stdout: int | IO[Any] | None = None,
          stderr: int | IO[Any] | None = None) -> subprocess.Popen | Started:
    """`subprocess.Popen(argv(*args), ...)` for a command a test watches while it runs (its
    pid, `poll`, `wait`, `send_signal`, `kill`, `returncode`), started warm where it can be.
    stdin, stdout and stderr: None (this process's), `subprocess.DEVNULL`, a descriptor or a
    file, and stderr also `subprocess.STDOUT`; pipes are not offered (a test reads a file it
    gave instead)."""
    full_env = dict(os.environ if env is None else env)
    cmd = argv(*args)
    z = _server_for(full_env)
    if z is None:
        return subprocess.Popen(cmd, env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr)
    fds = [_fd_for(stream, target, os.O_RDONLY if target == 0 else os.O_WRONLY)
           for target, stream in enumerate((stdin, stdout))]
    fds.append(os.dup(fds[1]) if stderr == subprocess.STDOUT else _fd_for(stderr, 2, os.O_WRONLY))
    try:
        sock = _send(z, cmd, full_env, cwd, -1, fds)
    finally:
        for fd in fds:
            os.close(fd)
    return Started(cmd, sock)


def _fd_for(stream: int | IO[Any] | None, target: int, mode: int) -> int:
    """A descriptor of its own for a child's standard stream `target`, as Popen takes one."""
    if stream == subprocess.PIPE:
        raise ValueError("support_cli.start offers no pipes: give a file")
    if stream == subprocess.DEVNULL:
        return os.open(os.devnull, mode)
    if stream is None:
        return os.dup(target)
    return os.dup(stream if isinstance(stream, int) else stream.fileno())


class Started:
    """A warm command running: the parts of `subprocess.Popen` the tests use. Its status
    comes from the warm interpreter (its parent), on the request's connection."""

    def __init__(self, cmd: list[str], sock: socket.socket) -> None:
        self.args = cmd
        self._sock = sock
        self._buf = bytearray()
        self.returncode: int | None = None
        self.pid: int = -1
        while self.pid < 0:
            self._read(None)

    def _read(self, timeout: float | None) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._sock, selectors.EVENT_READ)
        try:
            ready = sel.select(timeout)
        finally:
            sel.close()
        if not ready:
            return
        chunk = self._sock.recv(65536)
        if not chunk:
            raise RuntimeError(f"the warm interpreter closed the connection of {self.args}")
        self._buf += chunk
        for msg in _answers(self._buf):
            if "pid" in msg:
                self.pid = msg["pid"]
            if "status" in msg:
                self.returncode = os.waitstatus_to_exitcode(msg["status"])
                self._sock.close()

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._read(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _decode(b: bytes) -> str:
    # As subprocess's text mode: the locale's encoding and universal newlines.
    return io.TextIOWrapper(io.BytesIO(b)).read()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
