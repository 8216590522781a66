"""A warm interpreter that starts `python -m rewheel` commands by forking (the suite's
launcher; tests/support_cli.py is its client).

Every rewheel command the suite runs is its own process: its own pid, argv, environment,
working folder and standard streams, exit status and signals, the real CLI from
`rewheel/__main__.py` on. What a fork from here skips is only what every such process
repeats before its first line of rewheel runs: the interpreter's start and the imports
(a third of a second of CPU each, about half of the suite's CPU when every command paid it),
and the TLS context rewheel's HTTP clients share once made (35 ms; made here for this
server's SSL_CERT_FILE and SSL_CERT_DIR, which a command with other values does not use).

    python tests/support_zygote.py SOCKET

imports rewheel's modules (not its `__main__`s), listens on the Unix socket SOCKET, and
prints `ready`. Each connection carries one command: a JSON request (argv after
`rewheel`, the environment, the working folder) with three file descriptors (stdin, stdout,
stderr) passed beside it. The server forks; the child becomes the command (below) and the
server answers `{"pid": N}` at once and `{"status": S}` (`os.waitpid`'s status) when the
child has ended. A fourth descriptor, when one comes, holds the command before its first line
until a byte arrives on it: the client attaches a tracer (strace -p) in the meantime. The
server exits when its standard input closes (the test process that started it has gone).

The child is made what `subprocess.run([sys.executable, "-m", "rewheel", *argv])` would
start: only fds 0-2 open, the environment replaced, the working folder changed, `sys.path[0]`
the working folder, signal dispositions and standard streams as a fresh interpreter sets
them, its command line in /proc (setproctitle) the command's, and at the end what the
interpreter's own exit does (threads' shutdown, atexit, flushing; exit status 120 when the
flush fails, death by the signal of a KeyboardInterrupt). What the interpreter fixes at start
from the environment (PYTHON*, the locale, colour and terminal settings read by the CLI
libraries at import) cannot be replaced: for a request whose values differ from the
server's, the client starts a real interpreter instead (support_cli.INTERPRETER_KEYS).

A request with `"guard": true` (and `python tests/support_zygote.py --guarded ARGV`, its real-
interpreter twin) runs the command under `guard`: stopped with exit GUARD_EXIT before the
first thing it would change — how the suite runs a printed hint as typed (support_hints)."""

from __future__ import annotations

import array
import io
import json
import os
import pkgutil
import re
import selectors
import signal
import socket
import sys


def preload() -> None:
    import importlib

    import rewheel

    for m in pkgutil.walk_packages(rewheel.__path__, "rewheel."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)
    # What the commands import when they render or speak HTTP.
    for name in ("httpx", "rich.console", "rich.progress", "rich.table", "rich.markup", "rich.text"):
        importlib.import_module(name)
    # The TLS context rewheel's HTTP clients share (rewheel.httpclient: made once per process,
    # keyed by SSL_CERT_FILE and SSL_CERT_DIR), made for this server's values: a command with
    # the same values finds it made, as its own second client would; other values make theirs.
    from rewheel import httpclient

    try:
        httpclient._tls_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    except (OSError, ValueError):
        pass  # (a bad SSL_CERT_FILE: each command meets it, as a new interpreter would)


def _streams() -> None:
    """Standard streams as a fresh interpreter makes them on fds 0-2 (encoding from the
    locale, which the client keeps equal to the server's; stderr backslash-escapes and is
    line-buffered; stdout is line-buffered only on a terminal)."""
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                                 encoding=sys.stdin.encoding, errors=sys.stdin.errors)
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                                                   encoding=sys.stdout.encoding, errors=sys.stdout.errors,
                                                   line_buffering=os.isatty(1))
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                                   encoding=sys.stderr.encoding, errors="backslashreplace",
                                                   line_buffering=True)


def _become(req: dict, fds: list[int]) -> None:
    """In the forked child: become `python -m rewheel ARGV` and exit as it would."""
    for target, fd in zip((0, 1, 2), fds[:3], strict=True):
        os.dup2(fd, target)
    hold = fds[3:]  # held until a tracer has attached (the client's `attach`): read on fd 3
    if hold:
        os.dup2(hold[0], 3)
    os.closerange(4 if hold else 3, min(os.sysconf("SC_OPEN_MAX"), 1 << 16))
    try:
        os.setpgid(0, req["pgid"])  # the test process's group, as a child of it would be
    except OSError:
        pass
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as the interpreter sets it at start
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    # The command line first: setproctitle moves the C environment's strings to make room,
    # which it can only do before they are replaced.
    _title(" ".join([sys.executable, "-m", "rewheel", *req["argv"]]))
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    os.umask(req["umask"])
    _streams()
    sys.path[0] = os.getcwd()
    code = 0
    try:
        import runpy

        sys.argv = ["-m", *req["argv"]]
        if req.get("guard"):
            guard()
        if hold:
            if not os.read(3, 1):
                os._exit(70)  # the client went before the tracer attached: never run untraced
            os.close(3)
        runpy.run_module("rewheel", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException as e:  # noqa: BLE001 - the interpreter prints it and exits 1, or dies of SIGINT
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1
    code = _finalize(code)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


# support_hints.GUARD_EXIT (that module imports the CLI; this one must not before preload)
GUARD_EXIT = 86
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# Audit events that change something: files and folders, and signals to other processes.
_CHANGES = {"os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.link", "os.symlink", "os.chmod",
            "os.chown", "os.utime", "os.truncate", "os.mkfifo", "os.mknod", "shutil.rmtree", "shutil.copyfile",
            "shutil.copymode", "shutil.copystat", "shutil.move", "os.kill", "os.killpg", "os.setxattr",
            "os.removexattr", "os.chflags", "os.lchmod", "os.lchown", "os.exec", "os.posix_spawn", "os.spawn"}
# Processes that only read: the target interpreter's probes, uv's reports and dry runs, the
# service manager's and the GPUs' state.
_READ_ONLY_TOOLS = {"nvidia-smi", "journalctl"}
_SYSTEMCTL_READS = {"show", "is-active", "is-failed", "is-enabled", "status", "cat", "list-units"}


def _read_only_process(argv: list[str]) -> bool:
    name = os.path.basename(argv[0]) if argv else ""
    if name in _READ_ONLY_TOOLS:
        return True
    if name == "systemctl":
        return any(a in _SYSTEMCTL_READS for a in argv[1:])
    if name == "uv":
        return "--dry-run" in argv or argv[1:2] == ["--version"] or argv[1:3] in (
            ["pip", "list"], ["pip", "show"], ["pip", "freeze"])
    # An interpreter's probe (`python -c ...`, `-I -c`): what rewheel learns about a target.
    return re.fullmatch(r"python[\d.]*", name) is not None and "-c" in argv[1:4]


def _own_child(pid: int, gone_ok: bool) -> bool:
    """Whether `pid` (a process, or a process group's leader) is a child this process started
    (a probe it ends, with its group) — or, `gone_ok`, a process that is gone: signalling it
    changes nothing of anyone else's."""
    pid = abs(pid)  # (kill(-PGID): the group)
    if pid <= 1:
        return False  # this process's own group, or every process
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return gone_ok
    return ppid == os.getpid()


def _changes(event: str, args: tuple) -> bool:
    """Whether the event would change anything: making a folder that is there already
    (`mkdir(exist_ok=True)`), setting the mode a file has, or signalling a child of its own
    (a probe's process group, ended) does not."""
    import stat

    try:
        if event in ("os.kill", "os.killpg"):
            # (A group whose leader is gone may still have members: only a live child's counts.)
            return not _own_child(args[0], gone_ok=event == "os.kill" and args[0] > 0)
        if event == "os.mkdir":
            return not os.path.isdir(args[0])
        if event == "os.chmod" and isinstance(args[0], (str, bytes, os.PathLike)):
            return stat.S_IMODE(os.stat(args[0]).st_mode) != args[1]
    except (OSError, TypeError, ValueError):
        pass
    return True


def guard() -> None:
    """From here on, the first change — a file opened for writing, a folder made, a rename or
    removal, a mode or time set, a signal sent, a process started that is not a read-only
    probe — ends this process with GUARD_EXIT, before it happens, saying on stderr what it
    was. Reading, sockets, pipes, forks, /dev and /proc are free."""
    sys.dont_write_bytecode = True  # (an import's byte-code cache is not the command's change)

    def stop(what: str) -> None:
        try:
            os.write(2, f"[guard] stopped before its first change: {what}\n".encode(errors="replace"))
        finally:
            os._exit(GUARD_EXIT)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            if not isinstance(path, (str, bytes, os.PathLike)):
                return  # a descriptor
            text = os.fsdecode(path)
            if text.startswith(("/dev/", "/proc/")):
                return
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & _WRITE_FLAGS):
                stop(f"open {text} for writing")
        elif event in _CHANGES:
            if not _changes(event, args):
                return
            stop(f"{event} {args[0] if args else ''}")
        elif event == "subprocess.Popen":
            argv = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a)
                    for a in (args[1] if isinstance(args[1], (list, tuple)) else [args[1]])]
            if not _read_only_process(argv):
                stop(f"start {' '.join(argv)[:200]}")

    sys.addaudithook(hook)


def _title(title: str | None = None) -> None:
    try:
        import setproctitle
    except ImportError:  # only /proc's command line differs: the warm server's
        return
    setproctitle.setproctitle(title if title is not None else setproctitle.getproctitle())


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    try:
        print(value, file=sys.stderr)
    except Exception:  # noqa: BLE001
        pass
    return 1


def _finalize(code: int) -> int:
    """The interpreter's exit: non-daemon threads joined, atexit run, streams flushed (a
    failed flush of stdout: the warning and exit status 120, as Python does)."""
    import atexit
    import threading

    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001
        try:
            sys.stderr.write("Exception ignored on flushing sys.stdout:\nBrokenPipeError: [Errno 32] Broken pipe\n")
        except Exception:  # noqa: BLE001
            pass
        code = code or 120
    try:
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
    return code


def _recv(conn: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    data = b""
    while not data.endswith(b"\n"):
        msg, anc, _flags, _addr = conn.recvmsg(1 << 20, socket.CMSG_SPACE(4 * fds.itemsize))
        if not msg:
            raise EOFError("the client closed the connection")
        data += msg
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return json.loads(data), list(fds)


def serve(path: str) -> None:
    _title()  # set up while the environment is the one the interpreter started with
    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin, selectors.EVENT_READ, "parent")
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            what = key.data
            if what == "parent":
                if not os.read(sys.stdin.fileno(), 4096):
                    return
            elif what == "accept":
                conn, _ = listener.accept()
                try:
                    req, fds = _recv(conn)
                except (OSError, EOFError, ValueError):
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    try:
                        _become(req, fds)
                    finally:
                        os._exit(70)
                for fd in fds:
                    os.close(fd)
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                pidfd = os.pidfd_open(pid)
                sel.register(pidfd, selectors.EVENT_READ, ("child", pid, conn))
            else:
                _, pid, conn = what
                sel.unregister(key.fileobj)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                try:
                    conn.sendall(json.dumps({"status": status}).encode() + b"\n")
                except OSError:
                    pass
                conn.close()


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # not tests/: `python -m` puts the working folder first
    if sys.argv[1] == "--guarded":  # `python -m rewheel ARGV` under the guard, in this interpreter
        import runpy

        sys.argv = ["-m", *sys.argv[2:]]
        guard()
        runpy.run_module("rewheel", run_name="__main__", alter_sys=True)
    else:
        serve(sys.argv[1])
