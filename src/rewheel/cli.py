"""The command line: parse, call one core function, render, map errors to exit codes.

Core modules never print or exit; they return dataclasses. With `--json` one JSON document
goes to stdout and any human text to stderr; without it the human report goes to stdout.
"""

from __future__ import annotations

import copy
import errno
import functools
import gc
import json
import os
import re
import signal
import sys
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import click
import typer

from rewheel import report
from rewheel.errors import (EXIT_BUSY, EXIT_OK, EXIT_REVERTED, EXIT_USAGE, ConfirmationRequired, OutputLost,
                            RewheelError)
from rewheel.statuses import RunStatus

if TYPE_CHECKING:
    from rich.console import Console
    from rich.status import Status

    from rewheel.snapshot import Progress  # the progress-callback type, defined once there

# Plain click help (rich_markup_mode=None): one line per option with its placeholder word,
# the same on every terminal and in a pipe, and `--help` starts without rich's help renderer.
# suggest_commands off: click itself says "Did you mean ...?" (typer's would say it twice).
app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None, suggest_commands=False,
                  help="Upgrade a service's Python environment and keep the upgrade only once it is proven.\n\n"
                       "RECIPE is a recipe file; TARGET a recipe file, or an environment given with "
                       "--python PATH; SNAPSHOT a snapshot id, a unique prefix of one, or its exact label "
                       "(`rewheel history TARGET` lists them).")

F = TypeVar("F", bound=Callable[..., Any])

# The program's name in usage lines and hints: what a person types.
PROG = "rewheel"


def _keep_argument_help() -> None:
    """Typer sets an argument's help and then click's Argument.__init__ (8.2 and later, which
    takes `help` itself) resets it to None: `rewheel diff --help` listed `[A] [B]` with no
    word on them. Hand the help to click too."""
    from typer.core import TyperArgument

    init = TyperArgument.__init__
    if getattr(init, "keeps_help", False):
        return

    def __init__(self: TyperArgument, *args: Any, help: str | None = None, **kw: Any) -> None:  # noqa: A002
        init(self, *args, help=help, **kw)
        self.help = help

    __init__.keeps_help = True  # type: ignore[attr-defined]
    TyperArgument.__init__ = __init__  # type: ignore[method-assign]


_keep_argument_help()

JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON document on stdout; human text on stderr.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Answer yes to the confirmation (needed without a terminal).")]
PythonOpt = Annotated[str | None, typer.Option("--python", metavar="PATH", help="Target an interpreter instead of a recipe.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", help="Also list the packages reinstalled at the same version.")]
TargetArg = Annotated[str | None, typer.Argument(help="A recipe file (or give --python PATH instead).", show_default=False)]


def _set_plain(value: bool) -> None:
    if value:
        report.PLAIN = True


# On the commands that print tables; also accepted before the command (`rewheel --plain …`).
PlainOpt = Annotated[bool, typer.Option("--plain", callback=_set_plain,
                                        help="One fact per line instead of tables (the default when stdout is not a terminal).")]


def _stderr_console() -> Console:
    # Messages name paths and URLs: never broken inside one — fitted between words on a
    # terminal, never wrapped in a pipe or a log (which get grepped); see report.fitted_console.
    # (rich is imported there, not with this module: `--help` never needs it.)
    return report.fitted_console(stderr=True, highlight=False, emoji=False)


def consoles(json_mode: bool) -> tuple[Console, Console]:
    """(report console, progress console). In JSON mode both human streams go to stderr."""
    err: Console = _PlainStderr() if _PlainStderr.fits() else _stderr_console()  # type: ignore[assignment]
    if json_mode:
        return err, err
    # emoji=False: rewheel writes no `:name:` codes, and text from files must not turn into one.
    return report.fitted_console(highlight=False, emoji=False), err


class _PlainStderr:
    """The stderr console when stderr is not a terminal (a pipe, a log, a script's capture)
    and nothing forces colour: plain text is written as rich would write it there, and rich
    itself is imported only for what it must render (markup, a table, an error). A --json
    command run by a script — a rollback, a snapshot — then never pays for importing rich
    (about 50 ms). Its status line is nothing, as rich's is on such a stream."""

    _PLAIN_KW = frozenset(("style", "highlight", "markup", "end", "soft_wrap", "emoji"))

    def __init__(self) -> None:
        self._rich: Console | None = None

    @staticmethod
    def fits() -> bool:
        import os

        try:
            tty = sys.stderr.isatty()
        except (AttributeError, ValueError):
            return False
        return not tty and not any(os.environ.get(k) for k in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"))

    def real(self) -> Console:
        if self._rich is None:
            self._rich = _stderr_console()
        return self._rich

    def print(self, *objects: Any, **kw: Any) -> None:
        # Only plain strings with nothing for rich to do: no markup to parse, no tab to expand.
        if (objects and all(type(o) is str for o in objects) and kw.keys() <= self._PLAIN_KW
                and not any("\t" in o or (kw.get("markup", True) is not False and "[" in o) for o in objects)):
            sys.stderr.write(" ".join(objects) + kw.get("end", "\n"))
            sys.stderr.flush()
            return
        self.real().print(*objects, **kw)

    def status(self, *args: Any, **kw: Any) -> _NoStatus:
        return _NoStatus()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real(), name)


class _NoStatus:
    """A status line on a stream that is not a terminal: nothing to draw."""

    def __enter__(self) -> _NoStatus:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def update(self, *args: Any, **kw: Any) -> None: ...


# `rewheel smoke`: the smoke test or the health check failed (nothing was changed, so no revert).
EXIT_CHECK_FAILED = EXIT_REVERTED
# Aborted at a typer prompt (--json mode), as click itself exits.
EXIT_ABORTED = 1


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    sys.stdout.flush()


def show(out: Console, json_out: bool, result: Any, render: Callable[[Console, Any], None]) -> None:
    """Where a command's result leaves: one JSON document on stdout (made here, at the edge,
    from the result's `to_json`), or its human rendering from `report` on `out`."""
    if json_out:
        emit_json(result.to_json())
    else:
        render(out, result)


def confirm(question: str, yes: bool) -> None:
    """Ask on a terminal; --yes answers; without a terminal and without --yes, refuse (exit 2)."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise ConfirmationRequired(f"no terminal to ask on, so nothing was changed: {question.rstrip('?')}",
                                   hint="to confirm without a terminal, add --yes: "
                                        f"`{report.typed_line('rewheel … --yes', add='--yes')}`")
    if not typer.confirm(question, default=False, err=True):
        from rewheel.errors import NotConfirmed

        raise NotConfirmed("not confirmed; nothing was changed")


def handles_errors(fn: F) -> F:
    """Map RewheelError to its exit code, as JSON on stdout too when --json was given."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        json_mode = bool(kwargs.get("json_out"))
        typed = _typed_target(kwargs)
        failure: RewheelError
        try:
            return fn(*args, **kwargs)
        except RewheelError as exc:
            failure = exc
            if isinstance(exc, OutputLost):
                _as_typed(exc, typed)
                report.print_error(_stderr_console(), exc)  # (no JSON: stdout is what was lost)
                _said_output_lost()
                raise typer.Exit(exc.exit_code) from None
        except (typer.Exit, typer.Abort, click.exceptions.ClickException):
            raise  # typer's own ways out (an exit code, a prompt's abort, a usage error)
        except OSError as exc:
            # A full disk is the host's state, not a bug: said, with what to do (exit 3).
            from rewheel.errors import DiskFull

            failure = DiskFull(exc) if exc.errno in (errno.ENOSPC, errno.EDQUOT) else internal_error(exc)
        except Exception as exc:  # noqa: BLE001 - a bug: no traceback on the terminal
            failure = internal_error(exc)
        except KeyboardInterrupt as exc:
            # Ctrl-C, SIGTERM or SIGHUP (see `Terminated`): the child being waited on (uv, the
            # smoke test) has had its whole process group killed on the way here. Say what
            # state things are in (a run's journal now shows it as interrupted) instead of a
            # bare exit 130, and keep --json one document.
            from rewheel.errors import InterruptedRun

            failure = getattr(exc, "failure", None) or InterruptedRun(  # a run says exactly (commands.run)
                f"interrupted ({exc.signame if isinstance(exc, Terminated) else 'Ctrl-C'})",
                hint=None if typed is None else
                "if this was changing an environment, its run is recorded as interrupted: "
                f"`rewheel resume {typed}` finishes or undoes it, `rewheel history {typed}` shows it")
        _as_typed(failure, typed)
        lost: OutputLost | None = None
        if json_mode:
            try:
                emit_json(failure.to_json())
            except OutputLost as exc:  # the failure's own exit code stands; the loss is said too
                lost = exc
                _said_output_lost()
        report.print_error(_stderr_console(), failure)
        if lost is not None:
            _stderr_console().print(f"(its JSON answer could not be written to stdout either: "
                                    f"{lost.message.rsplit(': ', 1)[-1]})", markup=False, highlight=False)
        raise typer.Exit(failure.exit_code)

    return wrapper  # type: ignore[return-value]


def _typed_target(kwargs: dict[str, Any]) -> str | None:
    """The target as the person typed it, for hints they can paste: the recipe path, or
    `--python PATH` (then a positional argument is a snapshot, not a target)."""
    import shlex

    if kwargs.get("python"):
        return f"--python {shlex.quote(str(kwargs['python']))}"
    given = kwargs.get("target") or kwargs.get("recipe_path")
    return shlex.quote(str(given)) if given else None


# A placeholder word of the usage in a message (`rewheel history TARGET`).
_PLACEHOLDER = re.compile(r"\b(TARGET|RECIPE)\b")
# The command line as typed, a flag added or dropped (errors.as_typed).
_AS_TYPED = re.compile(r"<as typed(?: \+(\S+))?(?: -(\S+))?>")


def _as_typed(err: RewheelError, typed: str | None) -> None:
    """Core modules that do not know what was typed say TARGET or RECIPE in their hints, or the
    command line as typed (errors.as_typed); the message a person reads names what they gave
    instead, so that the hint pastes as it is."""
    if err.hint:
        err.hint = _AS_TYPED.sub(lambda m: report.typed_line(m.group(0), add=m.group(1) or "", drop=m.group(2) or ""),
                                 err.hint)
    if typed is not None:
        err.message = _PLACEHOLDER.sub(lambda _m: typed, err.message)
        if err.hint:
            err.hint = _PLACEHOLDER.sub(lambda _m: typed, err.hint)
    if err.hint:
        err.hint = _HINTED.sub(_keep_yes, err.hint)


# A command in a hint.
_HINTED = re.compile(r"`(rewheel [^`]+)`")


def _keep_yes(m: re.Match[str]) -> str:
    """A hinted command that retries the one typed (the same command and arguments: `rewheel
    resume X` after `rewheel resume X --yes` was interrupted) keeps the --yes the person gave:
    a script that pastes it is not refused for want of a terminal. Another command, or another
    snapshot, is a new decision, asked anew."""
    import shlex

    argv = report.ARGV or []
    if "--yes" not in argv and "-y" not in argv:
        return m.group(0)
    try:
        words = shlex.split(m.group(1))[1:]
    except ValueError:
        return m.group(0)
    if "--yes" in words or "-y" in words or [w for w in words if not w.startswith("-")] != [
            a for a in argv if not a.startswith("-")]:
        return m.group(0)
    return f"`{m.group(1)} --yes`"


def internal_error(exc: BaseException) -> RewheelError:
    """An exception no error class describes — a bug in rewheel, not the user's mistake: its
    traceback is written to a private file under the state home (else the temporary folder),
    and the error that is printed names that file (exit 5)."""
    import os
    import tempfile
    import time
    import traceback

    from rewheel.errors import InternalError, RewheelError
    from rewheel.paths import state_home

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    text = f"rewheel {' '.join(sys.argv[1:])}\n{time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n\n{text}"
    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    where: str | None = None
    for folder in (state_home() / "crashes", Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            if folder.name == "crashes":
                from rewheel.owned import refuse_links

                refuse_links(folder.parent, folder)  # a link there: the temporary folder instead
            path = folder / (name if folder.name == "crashes" else f"rewheel-crash-{name}")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            where = str(path)
            break
        except (OSError, RewheelError):
            continue
    what = f"{type(exc).__name__}: {exc}"
    return InternalError(f"internal error (a bug in rewheel): {what}",
                         hint=(f"the traceback is in {where}; " if where else "the traceback could not be written; ")
                         + "please report it with that file", traceback_file=where)


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
    report.ARGV = sys.argv[1:]  # (hints that retry the command name it as typed)
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


# ---- commands: one function each; parse, call one core function, render. ----
def _target(target: str | None, python: str | None):  # -> commands.Target
    from rewheel import environment, recipe

    r = recipe.load_target(target, python)
    environment.probe_early(r.python)  # the interpreter answers while the commands import
    from rewheel import commands

    return commands.open_target(r)


def _refuse_empty_ref(name: str, ref: str | None, *, default: bool = True) -> None:
    """An empty snapshot reference is a mistake (an unset shell variable), never "the default"
    (`default`: whether leaving it out gives one)."""
    if ref is not None and not ref.strip():
        from rewheel.errors import UsageError

        raise UsageError(f"{name}: empty snapshot reference {ref!r}",
                         hint="give a snapshot id, a unique prefix of one or an exact label "
                              "(`rewheel history TARGET` lists them)"
                              + (", or leave it out for the default" if default else ""))


def _target_and_ref(target: str | None, ref: str | None, python: str | None, *,
                    required: bool = False) -> tuple[str | None, str | None]:
    """(TARGET, SNAPSHOT) as given: with --python the one positional argument is the
    snapshot. `required`: a command with no default snapshot."""
    if python and target is not None and ref is None:
        target, ref = None, target
    if required and ref is None:
        from rewheel.errors import UsageError

        # Never a default here: an unset shell variable must not pick a snapshot.
        raise UsageError("missing SNAPSHOT", hint="give a snapshot id, a unique prefix of one or an exact label "
                                                  "(`rewheel history TARGET` lists them)")
    _refuse_empty_ref("SNAPSHOT", ref, default=not required)
    return target, ref


def _target_and_snapshot(target: str | None, ref: str | None, python: str | None) -> tuple[str | None, str]:
    """(TARGET, SNAPSHOT) for a command that has no default snapshot: one must be named."""
    target, named = _target_and_ref(target, ref, python, required=True)
    assert named is not None  # required: refused above when missing
    return target, named


def _exit_if_interrupted(t, err: Console) -> None:  # t: commands.Target
    """Read-only commands are how an operator investigates, so they report fully — then exit
    4 like every other command while an interrupted run is pending."""
    from rewheel import journal
    from rewheel.status import interrupted_now

    j = interrupted_now(t)  # a journal a live rewheel is writing is running, not interrupted
    if j is not None:
        report.print_error(err, journal.interrupted_error(j, t.cli_ref))
        raise typer.Exit(EXIT_BUSY)


def _streams(err: Console, quiet: bool = False) -> tuple[Callable[[str], None], Callable[[str], None]]:
    """(say, on_output): rewheel's own progress lines, and a tool's streamed output (uv, the
    smoke test), dimmed and indented; both to stderr so that --json stays one document."""

    def say(msg: str) -> None:
        if msg.startswith("── ") and _step_line is not None:
            _step_line.begin(msg[3:].split(":", 1)[0])  # a step starts: the status line follows it
        err.print(report.clean(msg), highlight=False, markup=False)

    def on_output(line: str) -> None:
        if not quiet:
            err.print("  │ " + report.clean(line, lines=False), style="dim", highlight=False, markup=False)

    return say, on_output


def _progress(err: Console) -> tuple[Progress, Status]:
    """A rich status line for long work; returns (callback, status). The line names the step
    under way (a `── step` line from `say` starts one), its seconds so far, and the files it
    reported last — never the last step's count through the next ones."""
    global _step_line
    line = _step_line = _StepLine()
    status = err.status(line)

    def cb(phase: str, done: int, total: int) -> None:
        line.detail = f"{phase}: {done:,}" + (f" / {total:,} files" if total else " files")

    return cb, status


@app.command()
@handles_errors
def check(recipe_path: Annotated[str, typer.Argument(metavar="RECIPE", help="Recipe file to validate.")],
          json_out: JsonOpt = False) -> None:
    """Validate a recipe and its preconditions; changes nothing."""
    from rewheel import preflight

    result = preflight.check_recipe(recipe_path)
    out, _ = consoles(json_out)
    show(out, json_out, result, report.render_check)
    if not result.ok:
        raise typer.Exit(result.exit_code or EXIT_USAGE)  # what the commands would exit with


@app.command()
@handles_errors
def snapshot(target: TargetArg = None, python: PythonOpt = None,
             label: Annotated[str, typer.Option("--label", metavar="LABEL", help="A label for the snapshot.")] = "",
             json_out: JsonOpt = False) -> None:
    """Take a snapshot of the environment now."""
    t = _target(target, python)
    from rewheel import commands  # (after the probe has started: see _target)

    out, err = consoles(json_out)
    cb, status = _progress(err)
    with status:
        result = commands.snapshot_now(t, label=label, progress=cb)
    show(out, json_out, result, report.render_snapshot)


@app.command()
@handles_errors
def history(target: TargetArg = None, python: PythonOpt = None, json_out: JsonOpt = False,
            plain: PlainOpt = False) -> None:
    """Snapshots and runs, newest first, with status and key versions."""
    t = _target(target, python)
    from rewheel import commands  # (after the probe has started: see _target)

    result = commands.history(t)
    out, err = consoles(json_out)
    show(out, json_out, result, report.render_history)
    if not json_out:
        report.render_history_marks(out, result)
    _exit_if_interrupted(t, err)


@app.command()
@handles_errors
def rollback(target: TargetArg = None,
             snapshot_id: Annotated[str | None, typer.Argument(metavar="[SNAPSHOT]", help="Snapshot id (default: the one taken before the last upgrade still in place).")] = None,
             python: PythonOpt = None, yes: YesOpt = False,
             force: Annotated[bool, typer.Option("--force", help="Restore a snapshot of a failed build (refused without it).")] = False,
             no_undo: Annotated[bool, typer.Option("--no-undo", help="Do not snapshot the state it replaces first (faster; it cannot be undone).")] = False,
             json_out: JsonOpt = False) -> None:
    """Restore a snapshot (stops and starts the service when given a recipe)."""
    target, snapshot_id = _target_and_ref(target, snapshot_id, python)
    t = _target(target, python)
    from rewheel import commands  # (after the probe has started: see _target)

    commands.refuse_system_interpreter(t)  # before a question or a snapshot lookup
    out, err = consoles(json_out)
    snap = t.store.get(snapshot_id) if snapshot_id is not None else commands.default_rollback_snapshot(t.store)
    commands.refuse_failed_build(snap, force, t.cli_ref)  # exit 2 before the question
    confirm(report.clean(f"Restore {t.env.prefix} to snapshot {snap.id} ({snap.label or snap.status}, "
                         f"{snap.created_iso})?", lines=False), yes)
    cb, status = _progress(err)
    with status:
        result = commands.rollback(t, snap.id, force=force, undo=not no_undo, say=_streams(err)[0],
                                 progress=cb)
    show(out, json_out, result, report.render_rollback)
    if not json_out:
        report.render_rollback_more(out, result)
    if result.error:
        report.print_error(err, commands.rollback_error(result))
    raise typer.Exit(result.exit_code)


@app.command()
@handles_errors
def run(recipe_path: Annotated[str, typer.Argument(metavar="RECIPE", help="The recipe to run.")],
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Preflight and show the plan; change nothing.")] = False,
        lock: Annotated[str | None, typer.Option("--lock", metavar="FILE", help="Install exactly this pylock.toml instead of the newest.")] = None,
        no_revert: Annotated[bool, typer.Option("--no-revert", help="On failure leave the failed state for debugging.")] = False,
        prepare_only: Annotated[bool, typer.Option("--prepare-only", help="Prepare and pre-check the upgrade while the service serves; stop there.")] = False,
        prepared: Annotated[bool, typer.Option("--prepared", help="Swap in the upgrade --prepare-only made (refused when stale).")] = False,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not stream uv's and the smoke test's output.")] = False,
        yes: YesOpt = False, json_out: JsonOpt = False, verbose: VerboseOpt = False,
        plain: PlainOpt = False) -> None:
    """The whole cycle: prepare (staged, while the service serves), stop, snapshot, install, diff, smoke, start, keep — or revert."""
    from rewheel import recipe as recipemod
    from rewheel import commands

    if lock is not None and not Path(lock).is_file():
        from rewheel.errors import UsageError

        raise UsageError(f"--lock {lock}: no such file")
    t = commands.open_target(recipemod.load_recipe(recipe_path))
    out, err = consoles(json_out)
    say, on_output = _streams(err, quiet)
    cb, status = _progress(err)

    def ask(rep) -> None:
        status.stop()  # no spinner over a question
        report.render_plan(err, rep, verbose=verbose)
        during = ("the service is stopped for the swap only" if rep.staged
                  else "the service is stopped during the upgrade")
        confirm(f"Upgrade {t.env.prefix} as planned ({during})?", yes)
        status.start()

    with status:
        result = commands.run(t, dry_run=dry_run, lock=lock, no_revert=no_revert, prepare_only=prepare_only,
                            prepared=prepared, say=say, on_output=on_output, progress=cb, confirm=ask)

    def render(console: Console, rep: commands.RunReport) -> None:
        if dry_run or rep.status == RunStatus.PREPARED:
            report.render_plan(console, rep, verbose=verbose)
        report.render_run(console, rep, verbose=verbose)
        report.render_pruned(console, rep.pruned)

    show(out, json_out, result, render)
    raise typer.Exit(result.exit_code)


@app.command()
@handles_errors
def resume(target: TargetArg = None, python: PythonOpt = None, yes: YesOpt = False,
           json_out: JsonOpt = False) -> None:
    """Finish or undo a run that was interrupted."""
    from rewheel import commands, journal

    t = _target(target, python)
    commands.refuse_system_interpreter(t)  # before the question
    out, err = consoles(json_out)
    j = journal.interrupted_run(t.store.env_dir)
    if j is not None:
        confirm(f"Resume interrupted {j.kind} {j.id} on {t.env.prefix} (last step: {j.last_step})?", yes)
    result = commands.resume(t, say=_streams(err)[0])
    show(out, json_out, result, report.render_resume)


@app.command()
@handles_errors
def smoke(recipe_path: Annotated[str, typer.Argument(metavar="RECIPE", help="The recipe: its smoke test and health check.")],
          json_out: JsonOpt = False) -> None:
    """Run only the smoke test and the health check against the live environment."""
    from rewheel import recipe as recipemod
    from rewheel import commands

    t = commands.open_target(recipemod.load_recipe(recipe_path))
    out, err = consoles(json_out)
    say, on_output = _streams(err)
    result = commands.smoke_only(t, on_output=on_output, say=say)
    show(out, json_out, result, report.render_smoke)
    raise typer.Exit(EXIT_OK if result.ok else EXIT_CHECK_FAILED)


@app.command()
@handles_errors
def why(
    logfile: Annotated[str | None, typer.Argument(metavar="LOGFILE", show_default=False,
                                                  help="A log file; '-' or nothing (without --unit) reads stdin.")] = None,
    unit: Annotated[str | None, typer.Option("--unit", "-u", metavar="UNIT", help="Read this systemd unit's journal.")] = None,
    since: Annotated[str | None, typer.Option("--since", "-S", metavar="TIME",
                                              help="With --unit: journal entries since TIME (journalctl syntax).")] = None,
    package: Annotated[str | None, typer.Option("--package", "-p", metavar="NAME",
                                                help="The upgraded package, by distribution name as everywhere else (e.g. vllm; "
                                                     "where the import name differs, e.g. flashinfer-python, give that: flashinfer): "
                                                     "its deepest frame is reported.")] = None,
    json_out: JsonOpt = False,
    run_id: Annotated[str | None, typer.Option("--run", metavar="ID", help="Name the suspects: the changes of this run's upgrade on the crash's path.")] = None,
    snapshot_ref: Annotated[str | None, typer.Option("--snapshot", metavar="SNAPSHOT", help="Name the suspects: the changes since this snapshot on the crash's path.")] = None,
) -> None:
    """The root cause of a crash in a log: exception, rank, deepest frame, repetitions; with
    --run or --snapshot, the changes of the upgrade it points at."""
    from rewheel import diagnose
    from rewheel.errors import UsageError

    if unit and logfile not in (None, "-"):
        raise UsageError("give either LOGFILE or --unit, not both")
    if since and not unit:
        raise UsageError("--since needs --unit (it selects journal entries)")
    if unit:
        result = diagnose.analyse_journal(unit, since, package=package)
    elif logfile in (None, "-"):
        if logfile is None and sys.stdin.isatty():
            raise UsageError("no log given", hint="rewheel why LOGFILE | rewheel why --unit UNIT | ... | rewheel why -")
        result = diagnose.analyse_stream(package=package)
    else:
        result = diagnose.analyse_file(logfile, package=package)
    if run_id is not None or snapshot_ref is not None:
        from rewheel import commands

        if run_id is not None and snapshot_ref is not None:
            raise UsageError("give either --run or --snapshot, not both")
        commands.suspects_for(result, run_id=run_id, snapshot=snapshot_ref)
    out, _err = consoles(json_out)
    show(out, json_out, result, report.render_why)


@app.command()
@handles_errors
def diff(target: TargetArg = None,
         a: Annotated[str | None, typer.Argument(metavar="[A]", help="Older snapshot (default: the newest).", show_default=False)] = None,
         b: Annotated[str | None, typer.Argument(metavar="[B]", help="Newer snapshot (default: the live environment).", show_default=False)] = None,
         python: PythonOpt = None,
         stat_only: Annotated[bool, typer.Option("--stat", help="Only the changed files with their +/- line counts.")] = False,
         package: Annotated[str | None, typer.Option("--package", "-p", metavar="NAME", help="Only this distribution's files, with unified diffs.")] = None,
         path_glob: Annotated[str | None, typer.Option("--path", metavar="GLOB", help="Only files whose path relative to the environment's prefix matches this glob (e.g. '*/vllm/*', 'bin/*'), with unified diffs.")] = None,
         show_patch: Annotated[bool, typer.Option("--patch", help="Unified diffs of every changed text file, with paths relative to the environment's prefix (a '# patch:' line before them names it): cd there and git apply.")] = False,
         json_out: JsonOpt = False, verbose: VerboseOpt = False, plain: PlainOpt = False) -> None:
    """Versions and source files between two snapshots, or a snapshot and the live environment."""
    from rewheel import diff as diffmod
    from rewheel.errors import UsageError

    if python:
        given = [x for x in (target, a, b) if x is not None]
        if len(given) > 2:
            raise UsageError("with --python give at most two snapshots: [A] [B]")
        target, a, b = None, *(given + [None, None])[:2]
    _refuse_empty_ref("A", a)
    _refuse_empty_ref("B", b)
    t = _target(target, python)
    out, err = consoles(json_out)
    with_diffs = not stat_only and (show_patch or bool(package) or bool(path_glob))
    cb, status = _progress(err)
    with status:
        result = diffmod.diff_target(t.env, t.store, a, b, package=package, path_glob=path_glob,
                                     with_diffs=with_diffs, progress=cb)
    show(out, json_out, result, functools.partial(report.render_diff, stat_only=stat_only, verbose=verbose))
    _exit_if_interrupted(t, err)


@app.command()
@handles_errors
def patches(target: TargetArg = None, python: PythonOpt = None,
            package: Annotated[list[str] | None, typer.Option("--package", "-p", metavar="NAME", help="Only these distributions (repeatable).")] = None,
            offline: Annotated[bool, typer.Option("--offline", help="Do not fetch wheels from the index for pristine copies.")] = False,
            thorough: Annotated[bool, typer.Option("--thorough", help="Hash every file instead of trusting size and install time.")] = False,
            json_out: JsonOpt = False, plain: PlainOpt = False) -> None:
    """Installed files that differ from what their wheel installed, with unified diffs."""
    from rewheel import patches as patchmod

    t = _target(target, python)
    out, err = consoles(json_out)
    with err.status("scanning installed files…"):
        result = patchmod.scan_target(t, dists=package or None, offline=offline, thorough=thorough)
    show(out, json_out, result, functools.partial(report.render_patches, target=t.cli_ref))
    _exit_if_interrupted(t, err)


@app.command()
@handles_errors
def ci(recipe_path: Annotated[str, typer.Argument(metavar="RECIPE", help="The recipe whose nightly to qualify.")],
       junit: Annotated[str | None, typer.Option("--junit", metavar="FILE", help="Write JUnit XML (one test case per step).")] = None,
       summary: Annotated[str | None, typer.Option("--summary", metavar="FILE", help="Append a Markdown summary (e.g. $GITHUB_STEP_SUMMARY).")] = None,
       promote: Annotated[bool, typer.Option("--promote", help="On success write lockfiles/pylock.<recipe>.toml.")] = False,
       lockfiles: Annotated[str, typer.Option("--lockfiles", metavar="DIR", help="Where qualified locks live.")] = "lockfiles",
       venv_python: Annotated[str | None, typer.Option("--venv-python", metavar="PATH|VERSION", help="Interpreter for the throwaway environment (default: the recipe's).")] = None,
       quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not stream uv's and the smoke test's output.")] = False,
       packages_only: Annotated[bool, typer.Option("--packages-only", help="Start from the recipe's packages alone, not from the target environment's pinned set.")] = False,
       board: Annotated[str | None, typer.Option("--board", metavar="DIR", help="Write the board (rewheel board) there, this verdict included.")] = None,
       json_out: JsonOpt = False, plain: PlainOpt = False) -> None:
    """Qualify the newest nightly in a throwaway environment; report for CI; promote its lock."""
    from pathlib import Path

    from rewheel import qualify
    from rewheel import recipe as recipemod

    rec = recipemod.load_recipe(recipe_path, check_interpreter=venv_python is None)
    out, err = consoles(json_out)

    say, on_output = _streams(err, quiet)

    result = qualify.qualify(rec, lockfiles=Path(lockfiles), promote=promote, interpreter=venv_python,
                             say=say, on_output=on_output, from_target=not packages_only)
    qualify.write_reports(result, junit=Path(junit) if junit else None,
                          summary=Path(summary) if summary else None)
    if board:
        from rewheel.board import write_board

        err.print(f"board: {write_board(Path(board)).index}", highlight=False, markup=False)
    show(out, json_out, result, report.render_ci)
    if not json_out:
        report.render_ci_base(out, result)
    raise typer.Exit(result.exit_code)


@app.command()
@handles_errors
def bisect(recipe_path: Annotated[str, typer.Argument(metavar="RECIPE", help="The recipe (its indexes and smoke test).")],
           good: Annotated[str, typer.Option("--good", metavar="VERSION", help="A build that passes the smoke test.")],
           bad: Annotated[str, typer.Option("--bad", metavar="VERSION", help="A later build that fails it.")],
           package: Annotated[str | None, typer.Option("--package", "-p", metavar="NAME", help="The package to bisect (default: the recipe's first).")] = None,
           repo: Annotated[str | None, typer.Option("--repo", metavar="PATH", help="A local git clone: the commits between good and bad.")] = None,
           github: Annotated[str | None, typer.Option("--github", metavar="OWNER/REPO", help="Take the commits from this repository's compare API.")] = None,
           github_api: Annotated[str, typer.Option("--github-api", metavar="URL", help="The GitHub API base URL.")] = "https://api.github.com",
           commit_index_base: Annotated[str | None, typer.Option("--commit-index-base", metavar="URL", help="Base of the per-commit indexes <URL>/<sha>/ (default: from an extra index ending in /nightly).")] = None,
           venv_python: Annotated[str | None, typer.Option("--venv-python", metavar="PATH|VERSION", help="Interpreter for the throwaway environments (default: the recipe's).")] = None,
           restart: Annotated[bool, typer.Option("--restart", help="Forget verdicts journaled by an earlier run of this bisection.")] = False,
           quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not stream uv's and the smoke test's output.")] = False,
           json_out: JsonOpt = False) -> None:
    """Find the first bad nightly between a good and a bad one (resumable)."""
    from rewheel import bisection
    from rewheel import recipe as recipemod

    rec = recipemod.load_recipe(recipe_path, check_interpreter=venv_python is None)
    out, err = consoles(json_out)

    say, on_output = _streams(err, quiet)

    result = bisection.bisect(rec, good=good, bad=bad, package=package, repo=repo, github=github,
                              github_api=github_api, commit_base=commit_index_base,
                              interpreter=venv_python, restart=restart,
                              say=say, on_output=on_output)
    show(out, json_out, result, report.render_bisect)
    raise typer.Exit(result.exit_code)


@app.command()
@handles_errors
def verify(target: TargetArg = None,
           snapshot_id: Annotated[str | None, typer.Argument(metavar="[SNAPSHOT]", help="Snapshot id, unique prefix or label (default: every snapshot).")] = None,
           python: PythonOpt = None,
           full: Annotated[bool, typer.Option("--full", help="Hash every stored file against the manifest's sha256 (reads every byte).")] = False,
           json_out: JsonOpt = False) -> None:
    """Check snapshots' stored files against their manifests, like git fsck (exit 3 if damaged)."""
    from rewheel.errors import EXIT_UNRESTORED
    from rewheel.snapshot import verify_store

    target, snapshot_id = _target_and_ref(target, snapshot_id, python)
    t = _target(target, python)
    out, err = consoles(json_out)
    with err.status("checking stored files…"):
        result = verify_store(t.store, snapshot_id, full=full, target=t.cli_ref, env=t.env)
    show(out, json_out, result, report.render_verify)
    if not result.ok:
        raise typer.Exit(EXIT_UNRESTORED)
    _exit_if_interrupted(t, err)


# ---- pin, unpin, forget: one snapshot by id (git-like verbs; `forget` as restic names it) ----
@app.command()
@handles_errors
def pin(target: TargetArg = None, snapshot_id: Annotated[str | None, typer.Argument(metavar="SNAPSHOT", help="Snapshot id, unique prefix or exact label.", show_default=False)] = None,
        python: PythonOpt = None, json_out: JsonOpt = False) -> None:
    """Pin a snapshot: retention (the recipe's snapshots.keep) never prunes it, forget refuses it."""
    _set_pinned(target, snapshot_id, python, json_out, True)


@app.command()
@handles_errors
def unpin(target: TargetArg = None, snapshot_id: Annotated[str | None, typer.Argument(metavar="SNAPSHOT", help="Snapshot id, unique prefix or exact label.", show_default=False)] = None,
          python: PythonOpt = None, json_out: JsonOpt = False) -> None:
    """Unpin a snapshot: retention (snapshots.keep) may prune it again."""
    _set_pinned(target, snapshot_id, python, json_out, False)


def _set_pinned(target: str | None, snapshot_id: str | None, python: str | None, json_out: bool,
                pinned: bool) -> None:
    target, ref = _target_and_snapshot(target, snapshot_id, python)
    t = _target(target, python)
    from rewheel import commands  # (after the probe has started: see _target)

    result = commands.set_pinned(t, ref, pinned)
    out, _ = consoles(json_out)
    show(out, json_out, result, report.render_pin)


@app.command()
@handles_errors
def forget(target: TargetArg = None, snapshot_id: Annotated[str | None, typer.Argument(metavar="SNAPSHOT", help="Snapshot id, unique prefix or exact label.", show_default=False)] = None,
           python: PythonOpt = None, yes: YesOpt = False, json_out: JsonOpt = False) -> None:
    """Remove one snapshot from the store (not a pinned one, nor one an interrupted run needs)."""
    target, ref = _target_and_snapshot(target, snapshot_id, python)
    t = _target(target, python)
    from rewheel import commands  # (after the probe has started: see _target)

    snap = commands.forget_target(t, ref)  # refused (exit 2) before the question
    confirm(report.clean(f"Remove snapshot {snap.id} ({snap.label or snap.status}, {snap.created_iso}) "
                         f"of {t.env.prefix}? It cannot be restored afterwards", lines=False), yes)
    result = commands.forget(t, snap.id)
    out, _ = consoles(json_out)
    show(out, json_out, result, report.render_forget)


@app.command()
@handles_errors
def status(target: TargetArg = None, python: PythonOpt = None, json_out: JsonOpt = False) -> None:
    """Where the environment stands: key versions, the snapshot it equals, runs, the service."""
    from rewheel import status as statusmod

    t = _target(target, python)
    result = statusmod.status(t)
    out, err = consoles(json_out)
    show(out, json_out, result, report.render_status)
    _exit_if_interrupted(t, err)


@app.command("fleet-report")
@handles_errors
def fleet_report(
    reports: Annotated[list[str], typer.Argument(metavar="REPORT...", show_default=False,
                                                 help="One `rewheel run --json` document per host: HOST.json, or HOST=FILE.")],
    expect: Annotated[list[str] | None, typer.Option("--expect", metavar="HOSTS", help="Hosts of the rollout (comma-separated, repeatable): those without a report were not reached.")] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the Markdown summary instead of the table.")] = False,
    summary: Annotated[str | None, typer.Option("--summary", metavar="FILE", help="Append the Markdown summary (e.g. $GITHUB_STEP_SUMMARY).")] = None,
    json_out: JsonOpt = False,
    plain: PlainOpt = False,
) -> None:
    """Summarize a rollout over many hosts: per host the status, versions, downtime and root
    cause; root causes grouped across hosts. Each REPORT is what `rewheel run --json` printed
    on one host, as HOST.json or HOST=FILE. Exit 1 when a host was reverted, 3 when one could
    not be restored."""
    from rewheel import fleet

    result = fleet.fleet_report(reports, expect=expect)
    if summary:
        fleet.write_summary(result, Path(summary))
    out, _ = consoles(json_out)
    if markdown and not json_out:
        sys.stdout.write(fleet.markdown(result))
    else:
        show(out, json_out, result, report.render_fleet)
    raise typer.Exit(result.exit_code)


@app.command()
@handles_errors
def board(target: TargetArg = None, python: PythonOpt = None,
          out_dir: Annotated[str, typer.Option("--out", metavar="DIR", help="The folder to write the site to (new, empty, or an earlier board's).", show_default=False)] = ...,  # type: ignore[assignment]
          fleet: Annotated[str | None, typer.Option("--fleet", metavar="DIR", help="A rollout's run reports (HOST.json, as fleet-report reads them).")] = None,
          expect: Annotated[list[str] | None, typer.Option("--expect", metavar="HOSTS", help="With --fleet: the rollout's hosts in order (comma-separated, repeatable).")] = None,
          waves: Annotated[str, typer.Option("--waves", metavar="LIST", help="With --fleet: the rollout's waves, as the playbook's serial.")] = "1,30%,100%",
          json_out: JsonOpt = False) -> None:
    """Write a static HTML site of what rewheel knows: every environment's runs, rollbacks
    and snapshots (or TARGET's), each run's versions, source diff, patches, root cause and
    step timings, the nightlies `ci` qualified and `bisect` searched, a fleet's rollout. It
    opens from file:// (no server, no network)."""
    from rewheel.board import write_board

    t = _target(target, python) if target is not None or python is not None else None
    result = write_board(Path(out_dir), target=t, fleet=Path(fleet) if fleet else None, expect=expect, waves=waves)
    out, _ = consoles(json_out)
    show(out, json_out, result, report.render_board)


# ---- global options: `--plain`, `--version` ----
def _plain_first(args: list[str]) -> list[str]:
    """`--plain` is a global option (`rewheel --plain history X`); it is accepted after the
    command too (`rewheel history X --plain`), where a person types it, by moving it first."""
    cut = args.index("--") if "--" in args else len(args)
    if "--plain" not in args[:cut] or args[:1] == ["--plain"]:
        return args
    return ["--plain", *(a for a in args[:cut] if a != "--plain"), *args[cut:]]


def _app_for(args: list[str]) -> typer.Typer:
    """The app with only the command that `args` names, or the whole app.

    Typer builds the click parameters of every registered command at each start (about
    30 ms for these); running one command needs only its own, and parses, checks and
    reports usage errors exactly as the whole app does. Anything else (no command, a typo,
    a global option such as `--help` before one) gets the whole app, whose messages list
    every command."""
    i = 0
    while i < len(args) and args[i] == "--plain":
        i += 1
    if i == len(args) or args[i].startswith("-"):
        return app
    named = [c for c in app.registered_commands
             if (c.name or (c.callback.__name__.replace("_", "-") if c.callback else None)) == args[i]]
    if len(named) != 1:
        return app
    one = copy.copy(app)
    one.registered_commands = named
    return one


def _print_version(value: bool) -> None:
    if value:
        from rewheel import __version__

        typer.echo(f"rewheel {__version__}")
        raise typer.Exit()


@app.callback()
def _global_options(
    plain: Annotated[bool, typer.Option("--plain", help="One fact per line instead of tables (the default when stdout is not a terminal).")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print rewheel's version and exit.")] = False,
) -> None:
    del version  # handled eagerly by its callback
    if plain:
        report.PLAIN = True


# ---- one line each in `rewheel --help` ----
# click cuts a command's description in the command list to what fits 80 columns (with
# "..."); these say each command's job in that room. `rewheel COMMAND --help` shows the full
# description (the command's docstring).
_SHORT_HELP = {
    "check": "Validate a recipe and the host; changes nothing.",
    "snapshot": "Take a snapshot of an environment now.",
    "history": "Snapshots and runs, newest first, with key versions.",
    "rollback": "Restore a snapshot; stops and starts the service around it.",
    "run": "Upgrade: stop, snapshot, reinstall, test, start — or revert.",
    "resume": "Finish or undo an interrupted run.",
    "smoke": "Smoke test and health check of the live environment.",
    "why": "The root cause of a crash, from a log or a unit's journal.",
    "diff": "Versions and files between snapshots, or one and now.",
    "patches": "Installed files edited since their wheel installed them.",
    "ci": "Qualify the newest nightly in a throwaway environment.",
    "bisect": "Find the first bad nightly between a good and a bad one.",
    "verify": "Check snapshots' stored files against their manifests.",
    "status": "Where the environment stands: versions, snapshot, runs, service.",
    "pin": "Keep a snapshot from retention.",
    "unpin": "Let retention prune a pinned snapshot again.",
    "forget": "Remove one snapshot from the store.",
    "fleet-report": "Summarize a rollout over many hosts from their run reports.",
    "board": "Write a static HTML site of the runs, nightlies and fleet.",
}
for _info in app.registered_commands:
    _name = _info.name or (_info.callback.__name__ if _info.callback else "")
    if _info.short_help is None and _name in _SHORT_HELP:
        _info.short_help = _SHORT_HELP[_name]


# ---- the status line of a long command ----
class _StepLine:
    """What the spinner says, re-rendered on every refresh: the step under way, its seconds
    so far, and the latest progress the step reported (files done of total)."""

    def __init__(self) -> None:
        import time

        self._clock = time.monotonic
        self.step, self.t0, self.detail = "working", self._clock(), ""

    def begin(self, step: str) -> None:
        self.step, self.t0, self.detail = step, self._clock(), ""

    def __rich__(self) -> str:
        return f"{self.step} {self._clock() - self.t0:.0f}s" + (f" — {self.detail}" if self.detail else "")


_step_line: _StepLine | None = None
