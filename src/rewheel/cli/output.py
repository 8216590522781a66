"""Where a command's words go: the consoles (a plain stderr that never imports rich when it
need not, the fitted rich ones), one JSON document on stdout with `--json`, the confirmation
question, progress lines and a tool's streamed output, and the status line of a long command."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer

from rewheel import jsonout, report
from rewheel.errors import ConfirmationRequired

if TYPE_CHECKING:
    from rich.console import Console
    from rich.status import Status

    from rewheel.snapshot import Progress  # the progress-callback type, defined once there


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


def emit_json(doc: Any) -> None:
    sys.stdout.write(jsonout.dumps(doc) + "\n")  # = json.dumps(doc, indent=2, default=str)
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
