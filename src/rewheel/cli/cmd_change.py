"""The commands that check, change or test an environment: `check`, `snapshot`, `rollback`,
`run`, `resume`, `smoke` (parse, call one core function, render, exit)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rewheel import report
from rewheel.cli.typer_app import JsonOpt, PlainOpt, PythonOpt, TargetArg, VerboseOpt, YesOpt
from rewheel.cli.failures import handles_errors
from rewheel.cli.output import _progress, _streams, confirm, consoles, show
from rewheel.cli.targets import _target, _target_and_ref
from rewheel.errors import EXIT_OK, EXIT_REVERTED, EXIT_USAGE
from rewheel.statuses import RunStatus

if TYPE_CHECKING:
    from rich.console import Console


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
    from rewheel import commands
    from rewheel import recipe as recipemod

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


# `rewheel smoke`: the smoke test or the health check failed (nothing was changed, so no revert).
EXIT_CHECK_FAILED = EXIT_REVERTED


@handles_errors
def smoke(recipe_path: Annotated[str, typer.Argument(metavar="RECIPE", help="The recipe: its smoke test and health check.")],
          json_out: JsonOpt = False) -> None:
    """Run only the smoke test and the health check against the live environment."""
    from rewheel import commands
    from rewheel import recipe as recipemod

    t = commands.open_target(recipemod.load_recipe(recipe_path))
    out, err = consoles(json_out)
    say, on_output = _streams(err)
    result = commands.smoke_only(t, on_output=on_output, say=say)
    show(out, json_out, result, report.render_smoke)
    raise typer.Exit(EXIT_OK if result.ok else EXIT_CHECK_FAILED)
