"""The revert (`Reverting`, a part of `cycle.Cycle`): stop, keep the failed build as a
snapshot, restore the pre-upgrade snapshot, move cleanup paths back, start and verify; the
pruning after it; and what a signal in the middle of the swap leaves, said exactly."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rewheel.commands.results import RevertRecord, RunReport, StepRecord
from rewheel.commands.service_steps import ServiceSteps, cause_text
from rewheel.commands.transaction import Transaction
from rewheel.commands.snapshots import protected_snapshots, pruned_text, restore_changed
from rewheel.commands.target import Say, Target
from rewheel.errors import RestoreError, RewheelError, SnapshotError, out_of_space
from rewheel.journal import RunJournal
from rewheel.snapshot import (Progress, RestoreResult, SnapshotMeta, check_cleanup_entries, take_snapshot)
from rewheel.records import FailedSnapshot, Note, Step
from rewheel.statuses import RunStatus, StepName


class Reverting:
    """Undo a failed upgrade (or finish an interrupted revert, for `resume`)."""

    # The cycle's state these steps read and set (`Cycle.__init__` sets it up).
    t: Target
    j: RunJournal
    report: RunReport
    say: Say
    progress: Progress | None
    svc: ServiceSteps | None
    snap: SnapshotMeta | None
    was_active: bool
    down_t0: float | None
    revert_t0: float | None

    if TYPE_CHECKING:
        def package(self) -> str | None: ...

    def _keep_failed_state(self, revert: RevertRecord) -> None:
        """Snapshot what the restore replaces, so that nothing is lost to it: a failed upgrade
        (`failed-upgrade`, to be diffed and inspected later: `rewheel diff TARGET <pre-upgrade>
        <failed>`), or — a `resume` that finishes an interrupted rollback, or finds the
        environment changed since the failed build was kept — an undo point (`pre-rollback`,
        as a rollback's own). Pristine files are shared by links, so this costs little; if it
        fails, the restore goes ahead anyway (and says so). Never a half-restored state (a
        restore interrupted midway, finished by `resume`): its own restore replaced it."""
        from rewheel.commands.rollback import PRE_ROLLBACK
        from rewheel.commands.snapshots import env_matches

        if self.j.stepped(StepName.RESTORE):
            return
        kept = self.j.first(FailedSnapshot)
        noted = next((n.undo_snapshot_id for n in self.j.all(Note) if n.undo_snapshot_id), None)
        held = kept.failed_snapshot_id if kept is not None else noted
        if held is not None:
            try:
                if env_matches(self.t, self.t.store.get(held)):
                    return  # what the restore replaces is that snapshot already
            except (SnapshotError, RewheelError):
                pass  # gone or damaged: snapshot it again
        failed = self.j.kind == "run" and kept is None
        label = (f"failed upgrade of run {self.j.id}" if failed
                 else f"before resume of {self.j.kind} {self.j.id} (the state it replaced)")
        try:
            res = take_snapshot(self.t.env, self.t.store, label=label,
                                status="failed-upgrade" if failed else PRE_ROLLBACK, run_id=self.j.id,
                                progress=self.progress, exclude=self.t.recipe.snapshot_exclude)
        except Exception as exc:
            revert.failed_snapshot_error = str(exc)
            return
        if failed:
            self.j.append(FailedSnapshot(failed_snapshot_id=res.meta.id))
            revert.failed_snapshot_id = res.meta.id
            self.say(f"kept the failed state as snapshot {res.meta.id} for inspection")
        else:
            self.j.append(Note(undo_snapshot_id=res.meta.id))
            revert.undo_snapshot_id = res.meta.id
            self.say(f"snapshot {res.meta.id} holds the state this resume replaces "
                     f"(`rewheel rollback {self.t.cli_ref} {res.meta.id}` undoes it)")

    def interrupted_error(self, exc: BaseException) -> Exception:
        """What a signal in the middle of the swap leaves, said exactly (InterruptedRun, exit 4):
        the step, whether the service is stopped (nothing serves until a resume), and the
        command that finishes it, with the recipe path as the user gave it."""
        from rewheel.errors import InterruptedRun

        how = getattr(exc, "signame", None) or "Ctrl-C"
        ref = self.t.cli_ref
        stopped = self.j.stepped(StepName.STOP)
        msg = f"run {self.j.id} was interrupted ({how}) at its {self.j.last_step or 'start'} step"
        if self.svc is not None and self.down_t0 is not None and (
                self.svc.healthy_at is None or self.svc.healthy_at <= self.down_t0):
            msg += (f"; the service ({self.svc.manager.describe()}) is STOPPED: it was running before the run, "
                    "and nothing serves until the run is resumed")
        elif self.svc is not None and stopped and not self.was_active:
            msg += "; the service was not running before the run and stays stopped"
        elif self.t.recipe.service is not None and not stopped:
            msg += "; the service was not stopped"
        undo = (f" (undoing it restores snapshot {self.snap.id}"
                + (" and starts the service again)" if self.was_active and self.svc is not None else ")")
                if self.snap is not None else "")
        return InterruptedRun(msg, hint=f"`rewheel resume {ref}` finishes or undoes it{undo}; "
                                        f"`rewheel status {ref}` shows where it stands")

    def prune_after_revert(self) -> None:
        """`[snapshots] keep` after a revert, as after a kept upgrade: reverted runs leave two
        snapshots each (before, and the failed build). Once the journal is finished, so that
        what a plain rollback needs now is what `protected_snapshots` protects; never the
        pinned ones, this run's pre-upgrade snapshot or the failed build it just kept."""
        if self.report.status != RunStatus.REVERTED or self.snap is None:
            return
        rv = self.report.revert
        keep = protected_snapshots(self.t.store, self.t.recipe.keep) | {self.snap.id}
        if rv is not None:
            keep |= {i for i in (rv.failed_snapshot_id, rv.undo_snapshot_id) if i}
        try:
            self.report.pruned = self.t.store.prune(self.t.recipe.keep, keep)
        except (OSError, SnapshotError) as exc:  # the revert is done: retention tries again next time
            self.say(f"(old snapshots not pruned: {exc})")
            return
        if self.report.pruned:
            self.say("pruned old snapshots ([snapshots] keep): " + pruned_text(self.t.store, self.report.pruned))

    def _drop_identical_failed_state(self, revert: RevertRecord, res: RestoreResult) -> None:
        """A restore that changed no byte proves the "failed build" kept before it is the good
        state itself (interrupted before the reinstall wrote anything, or it rewrote the same
        bytes): it is removed, not kept as a failed build that no `diff` would show a change in."""
        undo = revert.undo_snapshot_id
        if undo is not None and not restore_changed(res):
            try:  # an undo point of the very state restored: nothing to undo
                self.t.store.delete(undo)
                revert.undo_snapshot_id = None
            except (OSError, SnapshotError):
                pass
        fid = revert.failed_snapshot_id
        if fid is None or restore_changed(res):
            return
        try:
            self.t.store.delete(fid)
        except (OSError, SnapshotError):
            return  # kept: retention removes it later
        self.j.append(Note(failed_snapshot_dropped=fid))
        revert.failed_snapshot_id = None
        revert.failed_snapshot_dropped = fid
        self.say(f"the failed state was the restored state, byte for byte: snapshot {fid} removed")

    def _refused_cleanup(self) -> RewheelError | None:
        assert self.snap is not None
        try:
            check_cleanup_entries(self.snap, self.t.recipe.cleanup_paths)
        except RewheelError as exc:
            self.j.append(Note(cleanup_refused=exc.message))
            return exc
        return None

    def revert(self, reason: str) -> None:
        """Stop, restore the snapshot, move cleanup paths back, start, verify."""
        t0 = time.monotonic()
        self.revert_t0 = t0
        self.j.append(Step(name=StepName.REVERT, reason=reason))
        self.say(f"── revert: {reason}")
        revert = RevertRecord(reason)
        self.report.revert = revert
        try:
            assert self.snap is not None
            # Cleanup entries the recipe does not allow (a tampered meta.json) are found before
            # anything is stopped or restored. The environment's files do not depend on them:
            # they are restored and the service started all the same (a failed build must not
            # stay live for want of a stray file), then the revert fails on them (exit 3),
            # with nothing moved back.
            refused = self._refused_cleanup()
            txn = Transaction(self.t, self.j, self.snap, self.svc, say=self.say, progress=self.progress,
                              package=self.package)
            if self.svc is not None:
                txn.recover()  # damaged stored bytes: recovered, or refused, while the service is as it is
                self.svc.stop()
            self._keep_failed_state(revert)
            res = txn.restore(defer_removal=True)
            txn.move_back(res, refused=refused is not None)
            revert.restore = res
            revert.recovered = txn.recovery
            self.say(f"restored snapshot {self.snap.id}: {res.written:,} files written, "
                     f"{res.deleted:,} removed, {res.verified:,} verified"
                     + (f" ({res.proven_same:,} proven identical, left in place)" if res.proven_same else ""))
            self._drop_identical_failed_state(revert, res)
            self.report.after = self.t.env.versions()
            back = txn.service_back(res, was_up=self.was_active, up_now=False, stopped=True)
            if back.error is not None:
                # Named from the service's log, as for a failed upgrade; a resume has no
                # upgrade cause of its own, so this is the report's.
                revert.root_cause = back.root_cause
                if self.report.root_cause is None:
                    self.report.root_cause, self.report.diagnosis = back.root_cause, back.diagnosis
                raise back.error
            if back.left_stopped:
                revert.service_skipped = "the service was not running before the run: left stopped"
                self.say(revert.service_skipped)
            elif self.svc is not None:
                revert.service = back.health
                self.say("the old service is healthy again")
            if refused is not None:
                raise type(refused)(f"{refused.message}; the environment's files were restored"
                                    + (" and the service restarted" if revert.service is not None else "")
                                    + ", nothing was moved back", hint=refused.hint)
        except RewheelError as exc:
            revert.error = str(exc)
            self.report.steps.append(StepRecord.since("revert", False, t0))
            self.report.status = RunStatus.FAILED
            cause = f"; its log says{cause_text(revert.root_cause)}" if revert.root_cause else ""
            snap_id = self.snap.id if self.snap else "?"
            if out_of_space(exc):
                # Cut off by a full disk, not refused: the journal stays open (see `run`, `resume`).
                hint = (f"free disk there, then `rewheel resume {self.t.cli_ref}` finishes the revert (restores "
                        f"snapshot {snap_id} and starts the service as it was)")
            else:
                hint = (exc.hint or "") + (f"\nthe pre-upgrade snapshot is {snap_id}; run `rewheel rollback "
                                           f"{self.t.cli_ref} {self.snap.id if self.snap else ''} --yes` once the "
                                           "cause is fixed")
            raise RestoreError(f"revert failed: {exc.message}{cause}", hint=hint) from exc
        self.report.steps.append(StepRecord.since("revert", True, t0))
        self.report.status = RunStatus.REVERTED
