"""`run`: the whole upgrade cycle (docs/run-cycle.md): the usage checks, the lock and the
journal around it, the staged preparation, and the swap the service is down for (`_swap`),
kept or reverted."""

from __future__ import annotations

from collections.abc import Callable

from rewheel import journal
from rewheel.commands.cycle import Cycle
from rewheel.commands.results import RevertRecord, RunReport, StepRecord, json_value
from rewheel.commands.target import Say, Target, quiet, refuse_system_interpreter
from rewheel.journal import EnvLock, RunJournal
from rewheel.snapshot import Progress, unstash_cleanup
from rewheel.records import Finish, Note, Started
from rewheel.statuses import Finished, RunStatus


def run(t: Target, *, dry_run: bool = False, lock: str | None = None, no_revert: bool = False,
        prepare_only: bool = False, prepared: bool = False,
        say: Say = quiet, on_output: Say = quiet, progress: Progress | None = None,
        confirm: Callable[[RunReport], None] | None = None) -> RunReport:
    """The whole run cycle (docs/run-cycle.md). Returns the report — status "failed" (exit 3) when a revert
    could not verify the old state. Raises for preflight and usage problems (nothing changed)
    and for a failure before the reinstall (the service is put back as it was).

    Staged (`[install] staged`, the default): the upgrade is prepared and pre-checked while the
    service serves — a build that fails there is `rejected` and the service never stops — then
    swapped in offline from uv's cache. `prepare_only` stops after the prepare (`prepared`);
    `prepared` swaps in what an earlier `prepare_only` made, refused when it is stale."""
    from rewheel import staging
    from rewheel.errors import UsageError, as_typed

    refuse_system_interpreter(t)
    if dry_run and (prepare_only or prepared):
        flag = "--prepare-only" if prepare_only else "--prepared"
        raise UsageError(f"--dry-run and {flag} exclude each other: {flag} changes things, --dry-run never does",
                         hint=f"`{as_typed(drop=flag)}` shows the plan; then `{as_typed(drop='--dry-run')}` "
                              f"{'prepares the upgrade' if prepare_only else 'swaps in what was prepared'}")
    if prepare_only and prepared:
        raise UsageError("--prepare-only and --prepared exclude each other",
                         hint="--prepare-only prepares now; --prepared swaps in what was prepared")
    if prepared and lock:
        raise UsageError("--prepared installs the lock prepared earlier; give --lock to --prepare-only instead")
    staged = prepare_only or prepared or t.recipe.install.staged
    if staged and t.recipe.patch_policy == "keep-old-version":
        if prepare_only or prepared:
            raise UsageError(f'{t.recipe.source}: patches.policy = "keep-old-version" cannot be staged: which '
                             "distributions keep their version is known only from the snapshot's patch scan",
                             hint="run without --prepare-only/--prepared (the unstaged cycle)")
        staged = False
        say('patches.policy = "keep-old-version": the upgrade is not staged (its kept versions come from '
            "the snapshot's patch scan)")
    cyc = Cycle(t, lock=lock, say=say, on_output=on_output, progress=progress)
    cyc.report.staged = staged
    with EnvLock(t.store.env_dir, "run", prefix=t.env.prefix) as lk:
        journal.refuse_if_interrupted(t.store.env_dir, t.cli_ref)
        if prepared and not dry_run:
            cyc.load_prepared()  # refused here when stale: before the question
        if not cyc.preflight(None if prepare_only else confirm, dry_run):
            return cyc.report
        if staged and not prepared and not cyc.prepare(prepare_only):
            return cyc.report  # rejected, or prepared only: the service was never stopped
        started = Started(kind="run", recipe=t.label, lock=lock, before=cyc.report.before,
                          plan=json_value(cyc.report.plan), staged=staged,
                          prepared=cyc.prepared.lock if cyc.prepared else None)
        cyc.j = RunJournal.create(t.store.env_dir, started)
        lk.journal = cyc.j  # uv and the smoke test are journaled (pid, group, start time)
        cyc.report.run_id = cyc.j.id
        cyc.report.run_dir = str(cyc.j.dir)
        if cyc.resolution is not None and cyc.prepared is None:
            # The lock the unstaged install uses stays with its run.
            import shutil

            dest = cyc.j.dir / cyc.resolution.lock.name
            shutil.copyfile(cyc.resolution.lock, dest)
            cyc.resolution.moved(dest)
        if cyc.frozen is not None and cyc.prepared is None:
            # `--lock FILE` as read at the plan: its copy stays with the run, and says what it was.
            import shutil

            dest = cyc.j.dir / "pylock.toml"
            shutil.copyfile(cyc.frozen.path, dest)
            cyc.lock = str(dest)
            cyc.j.append(Note(lock_source=cyc.frozen.source, lock_sha256=cyc.frozen.sha256, lock_copy=str(dest)))
        try:
            return _swap(cyc, no_revert)
        except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP: the journal stays unfinished
            exc.failure = cyc.interrupted_error(exc)  # type: ignore[attr-defined]  # what the CLI says
            raise
        finally:
            if cyc.prepared is not None and cyc.j.last_step not in (None, "stop", "snapshot", "snapshot-check"):
                # Installed (kept or reverted): used up; its lock and logs stay with the run.
                kept = staging.discard(t.store.env_dir, keep_in=cyc.j.dir)
                if kept is not None:
                    cyc.prepared.moved(staging.folder(t.store.env_dir), kept)


def _swap(cyc: Cycle, no_revert: bool) -> RunReport:
    """Stop, snapshot, install, diff, smoke, start, keep — or revert: the part of the cycle
    the service is down for."""
    from rewheel.errors import RestoreError, RewheelError, out_of_space

    t = cyc.t
    try:
        if cyc.prepared is not None and t.recipe.service is not None:
            cyc.snapshot(served=True)
            cyc.rewarm(served=True)
            cyc.stop()
            cyc.check_snapshot()
        else:
            cyc.stop()
            cyc.snapshot()
            cyc.rewarm()
    except Exception as exc:
        # Nothing was installed yet: put the service back as it was and stop here.
        cyc.record_failure(exc)
        again = _restart_after_abort(cyc)
        cyc.report.downtime = cyc.downtime()
        if out_of_space(again):
            # Not started again for want of space: the run stays open in its journal, and
            # `resume` starts the service once there is room.
            raise RestoreError(f"{cyc.j.last_step} failed: {getattr(exc, 'message', exc)}; nothing was installed, "
                               f"but the service could not be started again: {getattr(again, 'message', again)}",
                               hint=f"free disk there, then `rewheel resume {t.cli_ref}` starts it") from exc
        cyc.j.append(Finish(status=Finished.FAILED, error=str(exc), downtime=json_value(cyc.report.downtime)))
        raise
    try:
        cyc.reinstall()
        cyc.diff()
        cyc.smoke()
        cyc.start()
        cyc.keep()
    except Exception as exc:  # any failure after the reinstall began is reverted
        reason = f"{cyc.j.last_step} failed: {cyc.record_failure(exc)}"
        cyc.finish_file_diff()  # of the failed build, before a restore replaces it
        if not cyc.report.steps or cyc.report.steps[-1].name != cyc.j.last_step:
            cyc.report.steps.append(StepRecord(cyc.j.last_step or "?", False))
        if no_revert:
            cyc.report.status = RunStatus.FAILED
            cyc.unshare()  # left for debugging, and edited in place: not through uv's cache
            cyc.report.after = t.env.versions()
            cyc.report.downtime = cyc.downtime()
            cyc.j.append(Finish(status=Finished.FAILED, kept_failed_state=True, before=cyc.report.before,
                                after=cyc.report.after, downtime=json_value(cyc.report.downtime)))
            return cyc.report
        # A signal (Ctrl-C, SIGTERM, SIGHUP) or a kill during the revert leaves the run open in
        # its journal: `resume` finishes the restore. Only an ended revert closes it.
        try:
            cyc.revert(reason)
        except RewheelError as rexc:
            # Exit 3: the report says what failed and what a person must do.
            cyc.report.status = RunStatus.FAILED
            cyc.report.revert = cyc.report.revert or RevertRecord(reason)
            cyc.report.revert.error, cyc.report.revert.hint = rexc.message, rexc.hint
            if out_of_space(rexc):
                # Cut off by a full disk, not refused: the run stays open in its journal, and
                # `resume` finishes the revert once there is space (restores are idempotent).
                cyc.report.downtime = cyc.downtime()
                return cyc.report
        cyc.report.downtime = cyc.downtime()
        cyc.j.append(Finish(status=Finished.of(cyc.report.status), reason=reason,
                            before=cyc.report.before, after=cyc.report.after,
                            root_cause=json_value(cyc.report.root_cause), downtime=json_value(cyc.report.downtime)))
        cyc.prune_after_revert()
        return cyc.report
    cyc.report.downtime = cyc.downtime()
    cyc.finish_file_diff()  # the service answers already: outside the downtime
    cyc.unshare()
    cyc.j.append(Finish(status=Finished.of(cyc.report.status), before=cyc.report.before, after=cyc.report.after,
                        downtime=json_value(cyc.report.downtime)))
    return cyc.report


def _restart_after_abort(cyc: Cycle) -> Exception | None:
    """Put the service back as it was; the failure to, if any (recorded in the journal)."""
    if cyc.svc is not None and cyc.was_active:
        try:
            if cyc.snap is not None:
                unstash_cleanup(cyc.snap, cyc.t.recipe.cleanup_paths)
            cyc.svc.start_and_verify()
        except Exception as exc:  # report the original failure; this one goes in the journal
            cyc.j.append(Note(restart_after_abort_failed=str(exc)))
            return exc
    return None
