"""A command's failures mapped to exit codes (`handles_errors`): a RewheelError as it is (also as
JSON with `--json`), a full disk, Ctrl-C and SIGTERM, and a bug (`internal_error`: its traceback
written to a private file); hints named as the person typed the target and the command line."""

from __future__ import annotations

import errno
import functools
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import typer

from rewheel import report
from rewheel.cli.output import _stderr_console, emit_json
from rewheel.cli.process import Terminated, _said_output_lost
from rewheel.errors import OutputLost, RewheelError

F = TypeVar("F", bound=Callable[..., Any])


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

    argv = report.text.ARGV or []
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
    import tempfile
    import time
    import traceback

    from rewheel.errors import InternalError
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
