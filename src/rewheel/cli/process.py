"""The process around a command: `main` (the console script's entry), SIGTERM and SIGHUP acting
like Ctrl-C (`Terminated`), a umask that never makes anything world-writable, and a stdout whose
lost reader or full disk is said once (`_GuardedStdout`, `OutputLost`)."""

from __future__ import annotations

import gc
import os
import signal
import sys
from typing import Any

import typer

from rewheel import report
from rewheel.cli.typer_app import PROG, _app_for, _plain_first, app
from rewheel.cli.output import _stderr_console, emit_json
from rewheel.errors import EXIT_OK, OutputLost

# Aborted at a typer prompt (--json mode), as click itself exits.
EXIT_ABORTED = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, handled exactly like Ctrl-C (KeyboardInterrupt): a service manager
    stopping rewheel, or its terminal going away, must not leave uv or the smoke test running."""

    def __init__(self, signum: int) -> None:
        self.signame = signal.Signals(signum).name
        super().__init__(self.signame)


_terminating = False


def _on_terminate(signum: int, _frame: Any) -> None:
    global _terminating
    if _terminating:
        return  # one is enough: a second must not interrupt the cleanup the first started
    _terminating = True
    raise Terminated(signum)


def install_signal_handlers() -> None:
    """SIGTERM and SIGHUP raise `Terminated` in the main thread, as SIGINT raises
    KeyboardInterrupt. (Python handlers are reset to the default in the children.)"""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_terminate)


class _GuardedStdout:
    """sys.stdout (and its binary buffer, which click writes to), whose first failed write or
    flush — its reader gone (EPIPE), a full disk (ENOSPC, /dev/full) — raises `OutputLost`
    instead of an OSError that would read as the command's own failure (a DiskFull saying
    "resume"), or as click's silent exit 1. From then on fd 1 is /dev/null: what is still
    buffered, and the interpreter's last flush, go nowhere. A loss something swallowed (click
    probes a stream with an empty write) is said by `main` once the command is over."""

    def __init__(self, stream: Any, state: dict[str, Any] | None = None) -> None:
        self._stream = stream
        self.state: dict[str, Any] = state if state is not None else {"lost": None, "said": False}

    @property
    def lost(self) -> OSError | None:
        lost: OSError | None = self.state["lost"]
        return lost

    def _lose(self, exc: OSError) -> None:
        first = self.lost is None
        self.state["lost"] = exc
        try:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, 1)
            os.close(fd)
        except OSError:
            pass
        if first:
            raise OutputLost(exc) from None

    def write(self, data: Any) -> int:
        if self.lost is not None:
            return len(data)
        try:
            return int(self._stream.write(data))
        except OSError as exc:
            self._lose(exc)
            return len(data)

    def flush(self) -> None:
        if self.lost is not None:
            return
        try:
            self._stream.flush()
        except OSError as exc:
            self._lose(exc)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    @property
    def buffer(self) -> Any:
        inner = getattr(self._stream, "buffer", None)
        return _GuardedStdout(inner, self.state) if inner is not None else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _said_output_lost() -> None:
    guard = sys.stdout
    if isinstance(guard, _GuardedStdout):
        guard.state["said"] = True


def main() -> None:
    from rewheel.errors import OutputLost

    if not isinstance(sys.stdout, _GuardedStdout) and sys.stdout is not None:
        sys.stdout = _GuardedStdout(sys.stdout)  # type: ignore[assignment]
    try:
        try:
            _main()
        finally:
            # The answer leaves now: one that cannot is said here, not in an "Exception ignored"
            # from the interpreter's last flush.
            guard = sys.stdout
            if isinstance(guard, _GuardedStdout):
                guard.flush()
                if guard.lost is not None and not guard.state["said"]:
                    raise OutputLost(guard.lost)
    except OutputLost as exc:  # outside a command (a usage error, --help, --version), or swallowed
        report.print_error(_stderr_console(), exc)
        raise SystemExit(exc.exit_code) from None
    finally:
        # The command has answered. The interpreter's collections at exit would walk every
        # object still alive (some 40 ms after a restore) only to free memory that the
        # process gives back as it ends; frozen objects are left out of them. Exit handlers,
        # the flushing of open files and the finalizers of objects not in cycles still run.
        gc.freeze()


def _main() -> None:
    install_signal_handlers()
    # Nothing rewheel writes (runs, snapshots, stored copies, logs, what uv installs) is ever
    # world-writable, whatever umask it was started with; group bits stay as the caller set them.
    os.umask(os.umask(0o002) | 0o002)
    # A terminal or pipe that cannot show every character (PYTHONIOENCODING=ascii:strict, a C
    # locale) gets escapes for the rest, never an encoding error halfway through an answer.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and (getattr(stream, "errors", None) or "strict") == "strict":
            reconfigure(errors="backslashreplace")
    sys.argv[1:] = _plain_first(sys.argv[1:])
    report.text.ARGV = sys.argv[1:]  # (hints that retry the command name it as typed)
    this = _app_for(sys.argv[1:])
    if "--json" not in sys.argv[1:]:
        # The usage lines name the program a person types, however it was started (`python -m
        # rewheel`, a wrapper script): click would say `python -m rewheel` for the former.
        this(prog_name=PROG)
        return
    # A usage error (unknown option, missing argument) is reported by typer before any
    # command runs, as human text only; with --json a script still gets one JSON document.
    try:
        code = this(standalone_mode=False, prog_name=PROG)
    except typer.Abort:
        _stderr_console().print("aborted", markup=False)
        sys.exit(EXIT_ABORTED)
    except Exception as exc:
        fmt = getattr(exc, "format_message", None)
        if fmt is None or not isinstance(getattr(exc, "exit_code", None), int):
            raise
        from rewheel.errors import UsageError

        args = sys.argv[1:]
        named = next((a for a in args if not a.startswith("-")), None)
        known = {c.name or (c.callback.__name__.replace("_", "-") if c.callback else "")
                 for c in app.registered_commands}
        if named in known and "--json" in args[:args.index(named)]:
            import shlex

            # `rewheel --json history X`: --json is each command's option, given after its name.
            hint = f"--json goes after the command: `{shlex.join([PROG, *(a for a in args if a != '--json'), '--json'])}`"
        else:
            hint = f"`rewheel {named + ' ' if named in known else ''}--help` shows the usage"
        err = UsageError(fmt(), hint=hint)
        emit_json(err.to_json())
        report.print_error(_stderr_console(), err)
        sys.exit(err.exit_code)
    sys.exit(code if isinstance(code, int) else EXIT_OK)
