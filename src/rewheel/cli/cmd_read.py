"""The commands that read an environment, its snapshots and logs — `history`, `status`, `why`,
`diff`, `patches`, `verify` — and keep the store's books: `pin`, `unpin`, `forget`."""

from __future__ import annotations

import functools
import sys
from typing import Annotated

import typer

from rewheel import report
from rewheel.cli.typer_app import JsonOpt, PlainOpt, PythonOpt, TargetArg, VerboseOpt, YesOpt
from rewheel.cli.failures import handles_errors
from rewheel.cli.output import _progress, confirm, consoles, show
from rewheel.cli.targets import (
    _exit_if_interrupted,
    _refuse_empty_ref,
    _target,
    _target_and_ref,
    _target_and_snapshot,
)


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


@handles_errors
def pin(target: TargetArg = None, snapshot_id: Annotated[str | None, typer.Argument(metavar="SNAPSHOT", help="Snapshot id, unique prefix or exact label.", show_default=False)] = None,
        python: PythonOpt = None, json_out: JsonOpt = False) -> None:
    """Pin a snapshot: retention (the recipe's snapshots.keep) never prunes it, forget refuses it."""
    _set_pinned(target, snapshot_id, python, json_out, True)


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


@handles_errors
def status(target: TargetArg = None, python: PythonOpt = None, json_out: JsonOpt = False) -> None:
    """Where the environment stands: key versions, the snapshot it equals, runs, the service."""
    from rewheel import status as statusmod

    t = _target(target, python)
    result = statusmod.status(t)
    out, err = consoles(json_out)
    show(out, json_out, result, report.render_status)
    _exit_if_interrupted(t, err)
