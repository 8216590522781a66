"""The command line: parse, call one core function, render, map errors to exit codes.

Core modules never print or exit; they return dataclasses. With `--json` one JSON document
goes to stdout and any human text to stderr; without it the human report goes to stdout.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from rewheel import report
from rewheel.errors import ConfirmationRequired, RewheelError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Upgrade a service's Python environment and keep the upgrade only once it is proven.")

F = TypeVar("F", bound=Callable[..., Any])

JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON document on stdout; human text on stderr.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Answer yes to the confirmation (needed without a terminal).")]
PythonOpt = Annotated[str | None, typer.Option("--python", help="Target an interpreter instead of a recipe.")]
TargetArg = Annotated[str | None, typer.Argument(help="A recipe file, or use --python PATH.", show_default=False)]


def consoles(json_mode: bool) -> tuple[Console, Console]:
    """(report console, progress console). In JSON mode both human streams go to stderr."""
    err = Console(stderr=True, highlight=False)
    out = err if json_mode else Console(highlight=False)
    return out, err


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    sys.stdout.flush()


def confirm(question: str, yes: bool) -> None:
    """Ask on a terminal; --yes answers; without a terminal and without --yes, refuse (exit 2)."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise ConfirmationRequired(f"{question} — refusing without a terminal",
                                   hint="pass --yes to confirm non-interactively")
    if not typer.confirm(question, default=False, err=True):
        raise ConfirmationRequired("not confirmed; nothing was changed")


def handles_errors(fn: F) -> F:
    """Map RewheelError to its exit code, as JSON on stdout too when --json was given."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        json_mode = bool(kwargs.get("json_out"))
        try:
            return fn(*args, **kwargs)
        except RewheelError as exc:
            if json_mode:
                emit_json(exc.to_json())
            report.print_error(Console(stderr=True, highlight=False), exc)
            raise typer.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


def main() -> None:
    app()


# ---- commands: one function each; parse, call one core function, render. ----
def _target(target: str | None, python: str | None):  # -> runner.Target
    from rewheel import recipe, runner

    return runner.open_target(recipe.load_target(target, python))


def _progress(err: Console):
    """A rich status line for long file work; returns (callback, status)."""
    status = err.status("working…")

    def cb(phase: str, done: int, total: int) -> None:
        status.update(f"{phase}: {done:,}" + (f" / {total:,}" if total else " files"))

    return cb, status


@app.command()
@handles_errors
def check(recipe_path: Annotated[str, typer.Argument(metavar="RECIPE", help="Recipe file to validate.")],
          json_out: JsonOpt = False) -> None:
    """Validate a recipe and its preconditions; changes nothing."""
    from rewheel import preflight

    result = preflight.check_recipe(recipe_path)
    out, _ = consoles(json_out)
    if json_out:
        emit_json(result.to_json())
    else:
        report.render_check(out, result)
    if not result.ok:
        raise typer.Exit(2)


@app.command()
@handles_errors
def snapshot(target: TargetArg = None, python: PythonOpt = None,
             label: Annotated[str, typer.Option("--label", help="A label for the snapshot.")] = "",
             json_out: JsonOpt = False) -> None:
    """Take a snapshot of the environment now."""
    from rewheel import runner

    t = _target(target, python)
    out, err = consoles(json_out)
    cb, status = _progress(err)
    with status:
        result = runner.snapshot_now(t, label=label, progress=cb)
    if json_out:
        emit_json(result.to_json())
    else:
        report.render_snapshot(out, result)


@app.command()
@handles_errors
def history(target: TargetArg = None, python: PythonOpt = None, json_out: JsonOpt = False) -> None:
    """Snapshots and runs, newest first, with status and key versions."""
    from rewheel import runner

    result = runner.history(_target(target, python))
    out, err = consoles(json_out)
    if json_out:
        emit_json(result.to_json())
    else:
        report.render_history(out, result)
    if result.interrupted is not None:
        # History is how an operator investigates, so it reports fully — then exits 4 like
        # every other command while an interrupted run is pending.
        report.print_error(err, runner.interrupted_error(result.interrupted, result.target))
        raise typer.Exit(4)


@app.command()
@handles_errors
def rollback(target: TargetArg = None,
             snapshot_id: Annotated[str | None, typer.Argument(metavar="[SNAPSHOT]", help="Snapshot id (default: the newest taken before an upgrade).")] = None,
             python: PythonOpt = None, yes: YesOpt = False, json_out: JsonOpt = False) -> None:
    """Restore a snapshot (stops and starts the service when given a recipe)."""
    from rewheel import runner

    if python and target and snapshot_id is None:
        target, snapshot_id = None, target
    t = _target(target, python)
    out, err = consoles(json_out)
    snap = t.store.get(snapshot_id) if snapshot_id else runner.default_rollback_snapshot(t.store)
    confirm(f"Restore {t.env.prefix} to snapshot {snap.id} ({snap.label or snap.status}, "
            f"{snap.created_iso})?", yes)
    cb, status = _progress(err)
    with status:
        result = runner.rollback(t, snap.id, say=lambda m: err.print(m, highlight=False),
                                 progress=cb, service_ops=runner.service_ops_for(t))
    if json_out:
        emit_json(result.to_json())
    else:
        report.render_rollback(out, result)
