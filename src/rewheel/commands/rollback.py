"""`rollback`: restore a snapshot, the service stopped around it and started again if it
ran; the state it replaces snapshotted first (`pre-rollback`) so that it can be undone;
stored bytes an edit damaged recovered before anything is stopped. Also which snapshot a
plain rollback picks, when a failed build is refused, and the closing of the journals a
restore supersedes."""

from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Set as AbstractSet

from rewheel import journal
from rewheel.commands.results import Downtime, RollbackResult, StepRecord, json_value
from rewheel.commands.service_steps import ServiceSteps, cause_text
from rewheel.commands.transaction import ServiceBack, Transaction, recover_stored_bytes
from rewheel.commands.snapshots import (protected_snapshots, still_the_snapshot, pruned_text, reverted_snapshots,
                                        upgrades_in_place)
from rewheel.commands.target import Say, Target, quiet, refuse_broken_tls, refuse_system_interpreter, target_refusals
from rewheel.errors import RewheelError, SnapshotDamaged, SnapshotError, as_typed, out_of_space
from rewheel.journal import EnvLock, RunJournal
from rewheel.snapshot import (PreparedRestore, Progress, SnapshotMeta, Store, check_cleanup_entries, take_snapshot)
from rewheel.snapshot import privatize
from rewheel.records import Finish, Note, Started, Step
from rewheel.statuses import UNDO_SKIPPED, Finished, RollbackStatus, StepName


# A build that failed its checks, kept for inspection: never a default rollback target,
# restored only with `--force`.
FAILED_BUILD = "failed-upgrade"
# The state a rollback replaced, snapshotted first so that the rollback can be undone.
PRE_ROLLBACK = "pre-rollback"


def is_failed_build(snap: SnapshotMeta) -> bool:
    """Whether a snapshot holds a build that failed (or never passed) its checks: the state
    a revert kept (`failed-upgrade`), or the state a rollback replaced while it was such a
    build (`extra.failed_build`)."""
    return snap.failed_build


def refuse_failed_build(snap: SnapshotMeta, force: bool, cli_ref: str) -> None:
    """Restoring a failed build puts back what its checks rejected: only with --force.
    Exit 2 (SnapshotError) naming the snapshot and its label, before anything is asked,
    stopped or changed."""
    if force or not is_failed_build(snap):
        return
    what = snap.label or snap.status
    raise SnapshotError(
        f"snapshot {snap.id} ({what}) is a failed build: restoring it puts back a build that "
        "failed its checks",
        hint=f"to restore it anyway (to debug it), add --force: `{as_typed(add='--force')}`; without a "
             f"SNAPSHOT, rollback picks the snapshot taken before the last "
             f"upgrade still in place (`rewheel history {cli_ref}` lists them); nothing was changed")


def default_rollback_snapshot(store: Store) -> SnapshotMeta:
    """The snapshot an interrupted run began from; else the newest snapshot taken before an
    upgrade still in place (a reverted run's pre-upgrade snapshot is what the revert already
    put back: never the default); else the newest snapshot at all — never a failed build
    (those need to be named, with --force), and an undo point (`pre-rollback`) only when
    nothing else is left: a second plain `rollback` must not undo the first."""
    interrupted = journal.interrupted_run(store.env_dir)
    if interrupted and interrupted.snapshot_id:
        snap = store.get(interrupted.snapshot_id)
        if not is_failed_build(snap):
            return snap
    metas = store.list()
    if not metas:
        raise SnapshotError("no snapshots exist for this environment",
                            hint="`rewheel snapshot TARGET` takes one")
    pre = upgrades_in_place(store, metas)
    if pre:
        return pre[0]
    reverted = reverted_snapshots(store, metas)
    usable = [m for m in metas if not is_failed_build(m) and m.id not in reverted]
    usable = [m for m in usable if m.status != PRE_ROLLBACK] or usable
    if not usable and reverted:
        raise SnapshotError("no upgrade is in place to undo: every upgrade of this environment was undone "
                            "(reverted, or closed by a rollback), and what replaced it restored the snapshot "
                            "taken before it "
                            f"({', '.join(m.id for m in metas if m.id in reverted)})",
                            hint="`rewheel history TARGET` lists the snapshots; name one to restore it; "
                                 "nothing was changed")
    if not usable:
        raise SnapshotError(f"every snapshot of this environment is a failed build ({', '.join(m.id for m in metas)}): "
                            "there is no default rollback target",
                            hint="name one and add --force to restore a failed build anyway; nothing was changed")
    return usable[0]


def noted_active(j: RunJournal | None) -> bool:
    """Whether a journal recorded the service as running before its run began."""
    if j is None:
        return False
    noted = [n.service_was_active for n in j.all(Note) if n.service_was_active is not None]
    return bool(noted and noted[0])


def left_service_down(j: RunJournal) -> bool:
    """Whether a command may have left the service stopped although it was running before."""
    if not j.finished:
        return True
    if j.status != Finished.FAILED:
        return False
    fin = j.last(Finish)
    # A run that failed before its reinstall ("error") started the service again itself.
    return (fin is None or fin.error is None
            or any(n.restart_after_abort_failed is not None for n in j.all(Note)))


def rollback(t: Target, ref: str | None = None, *, force: bool = False, undo: bool = True, say: Say = quiet,
             progress: Progress | None = None) -> RollbackResult:
    """Restore a snapshot; with a recipe that has a service, stop it first and start and
    health-check it after — if it was running before (or before the interrupted run this
    rollback finishes). A service that was stopped stays stopped. When the environment
    already matches the snapshot, nothing is stopped or restarted (a running service is
    only health-checked). Finishes an interrupted run as `rolled-back`.

    A failed build is restored only with `force`. The state the rollback replaces is
    snapshotted first (`pre-rollback`), so the rollback can be undone by restoring that;
    `undo=False` skips it (an urgent rollback pays only for the restore: a snapshot of a real
    vLLM environment is seconds more), and the result says it cannot be undone.
    When the service then fails to come back, the result says so (status "service-failed",
    exit 3) with the root cause read from the service's log, and the journal is finished:
    the next command is not blocked by a stale interrupted record."""
    # An interrupted rewheel's uv or smoke test that still runs is stopped (and waited for)
    # when the lock is taken, before any file is touched.
    refuse_system_interpreter(t)
    refuse_broken_tls(t)
    target_refusals(t)  # a tampered record: exit 3 before the lock, a journal or a signal
    with EnvLock(t.store.env_dir, "rollback", prefix=t.env.prefix, reclaim=True, say=say) as lk:
        snap = t.store.get(ref) if ref is not None else default_rollback_snapshot(t.store)
        refuse_failed_build(snap, force, t.cli_ref)  # before a journal exists: nothing to close
        check_cleanup_entries(snap, t.recipe.cleanup_paths)  # tampered or re-linked: refused, nothing changed
        interrupted = journal.interrupted_run(t.store.env_dir)
        runs = journal.list_runs(t.store.env_dir)
        # The last command, if it left the service stopped: interrupted, or failed without
        # putting things back (`--no-revert`, a revert that could not verify, a restart
        # after an aborted run that failed).
        left_down = next((r for r in runs[:1] if left_service_down(r)), interrupted)
        replaces_failed = _live_is_failed_build(t, runs, interrupted)
        # With a service: before it is stopped. Without one the restore itself checks every
        # stored file it needs before it changes anything, at no extra cost (see below).
        recovery = recover_stored_bytes(t, snap, say) if t.recipe.service is not None else None
        j = RunJournal.create(t.store.env_dir,
                              Started(kind="rollback", snapshot_id=snap.id, recipe=t.label, force=force))
        steps: list[StepRecord] = []
        svc = ServiceSteps(t, j, steps, say) if t.recipe.service is not None else None
        txn = Transaction(t, j, snap, svc, say=say, progress=progress,
                          package=lambda: t.env.import_name(t.recipe.install.names),
                          checked=t.recipe.service is not None, recovery=recovery)
        was_up = up_now = unchanged = stopped = suspect = False
        prepared: PreparedRestore | None = None
        try:
            try:
                st = svc.status() if svc else None
                try:
                    # The restore compared, checked and staged now, while a service still
                    # serves: its downtime then holds only the commit. The comparison also says
                    # whether a restore would change any byte (a running service is then left
                    # alone, and no undo snapshot is taken).
                    t_prep = time.monotonic()
                    prepared = txn.prepare()
                    unchanged = not prepared.changes
                    steps.append(StepRecord.since("restore-prepare", True, t_prep))
                except (SnapshotDamaged, SnapshotError):
                    if svc:
                        raise
                    # Nothing to stop: the restore's own checks refuse it below, with their
                    # precise message, before any file changes (and before an undo snapshot).
                    suspect = True
                if svc and not unchanged:
                    svc.check_stoppable(st)
            except Exception:
                # Refused before anything changed. (A kill or Ctrl-C leaves the journal open,
                # as one in the middle of staging always did: the next command finishes it.)
                j.append(Finish(status=Finished.REFUSED, snapshot_id=snap.id))
                raise
            undo_id = undo_error = None
            served_undo = False
            down_t0: float | None = None
            if svc is not None and st is not None:
                up_now = st.up
                # Up now, or up before the run that stopped it and left it so.
                was_up = up_now or noted_active(left_down)
                j.append(Note(service_was_active=was_up, service_judged_by=st.judged_by,
                              environment_unchanged=unchanged))
                if unchanged:
                    say(f"{t.env.prefix} already matches snapshot {snap.id}: the service is not stopped")
                else:
                    if undo and up_now:
                        # The undo snapshot while the service still serves: out of the downtime,
                        # proven still current by one stat walk once it is stopped (below).
                        undo_id, undo_error = _snapshot_replaced_state(t, j, snap, steps,
                                                                       failed_build=replaces_failed,
                                                                       say=say, progress=progress, served=True)
                        served_undo = undo_id is not None
                    stopped = True
                    down_t0 = time.monotonic() if up_now else None
                    try:
                        svc.stop()
                    except Exception as exc:
                        # Nothing was changed: put the service back as it was (as a run does) and
                        # finish, so that no stale record blocks the next command with exit 4.
                        try:
                            if was_up and not svc.was_active():
                                svc.start_and_verify()
                        except Exception as again:  # noqa: BLE001 - the stop's failure is reported
                            j.append(Note(restart_after_abort_failed=str(again)))
                        finally:
                            if undo_id is not None:
                                _forget_quietly(t.store, undo_id)  # nothing was replaced: nothing to undo
                            j.append(Finish(status=Finished.FAILED, snapshot_id=snap.id,
                                            error=getattr(exc, "message", None) or str(exc)))
                        raise
            if not undo and not unchanged:
                undo_error = UNDO_SKIPPED
                j.append(Note(undo_snapshot_error=undo_error))
            elif served_undo:
                assert undo_id is not None
                checked_id, undo_error = _check_undo_snapshot(t, j, snap, undo_id, steps,
                                                              failed_build=replaces_failed, say=say,
                                                              progress=progress)
                if checked_id != undo_id and prepared is not None:
                    # The environment changed while the service stopped: what was compared
                    # before no longer holds. Compared again by the restore itself.
                    prepared.discard()
                    prepared = None
                undo_id = checked_id
            elif not unchanged and not suspect and undo_id is None and undo_error is None:
                undo_id, undo_error = _snapshot_replaced_state(t, j, snap, steps, failed_build=replaces_failed,
                                                               say=say, progress=progress)
            say(f"restoring snapshot {snap.id} ({snap.label or snap.status}) into {t.env.prefix}")
            t0 = time.monotonic()
            try:
                # What the restore moved out (a failed build's new folders) is deleted once the
                # service is back up (the environment is restored and synced already), by the
                # process that then settles what the undo snapshot took over (`privatize`).
                committing, prepared = prepared, None
                res = txn.restore(defer_removal=True, prepared=committing)
            except (SnapshotError, SnapshotDamaged):
                # Refused before anything changed (wrong environment, damaged store): this
                # rollback is over — leaving it unfinished would block every later command with
                # exit 4 — and the service it stopped goes back up.
                try:
                    if svc and stopped and was_up:
                        svc.start_and_verify()
                finally:
                    j.append(Finish(status=Finished.REFUSED, snapshot_id=snap.id))
                raise
        except Exception:
            # The undo snapshot's taken-over files are still the environment's: made the store's
            # own now. (A kill leaves them to the next snapshot or restore, which does it first.)
            _settle_quietly(t)
            raise
        finally:
            if prepared is not None:  # given up before its commit (an error, a signal)
                prepared.discard()
        txn.move_back(res)
        steps.append(StepRecord.since("restore", True, t0))
        back = txn.service_back(res, was_up=was_up, up_now=up_now, stopped=stopped)
        if back.stopped_at is not None and up_now:
            down_t0 = back.stopped_at
        if back.left_stopped:
            assert svc is not None
            svc.skip_start("the service was not running before: it stays stopped")
        if interrupted is not None:
            # The files are the snapshot's now, whether or not the service came back.
            interrupted.append(Finish(status=Finished.ROLLED_BACK, by_run=j.id))
        superseded = close_superseded(t.store.env_dir, j, skip={interrupted.id} if interrupted else set())
        result = RollbackResult(snap, res, j.id, back.health, interrupted.id if interrupted else None, steps,
                                lk.stopped, undo_snapshot_id=undo_id, undo_snapshot_error=undo_error,
                                undo_needs_force=bool(undo_id) and replaces_failed,
                                superseded_runs=superseded, target=t.cli_ref, recovered=txn.recovery,
                                downtime=_rollback_downtime(down_t0, steps, svc))
        if back.error is not None:
            assert svc is not None
            _service_failed_after_restore(t, svc, result, back)
            if out_of_space(back.error):
                # Not started for want of space: the rollback stays open in its journal, and
                # `resume` starts the service once there is room (the files are restored).
                result.hint = f"free disk there, then `rewheel resume {t.cli_ref}` starts it"
                return result
            # Finished, not left interrupted: the files are restored and verified; what is
            # wrong is the service, which the result names (no "error" key: see left_service_down).
            j.append(Finish(status=Finished.FAILED, snapshot_id=snap.id, service_error=result.error,
                            root_cause=json_value(result.root_cause), downtime=json_value(result.downtime)))
            return result
        j.append(Finish(status=Finished.RESTORED, snapshot_id=snap.id, downtime=json_value(result.downtime)))
        keep = protected_snapshots(t.store, t.recipe.keep) | {snap.id} | ({undo_id} if undo_id else set())
        result.pruned = t.store.prune(t.recipe.keep, keep)
        if result.pruned:
            say("pruned old snapshots ([snapshots] keep): " + pruned_text(t.store, result.pruned))
        return result


def _live_is_failed_build(t: Target, runs: list[RunJournal], interrupted: RunJournal | None) -> bool:
    """Whether the live environment holds a build that failed or never passed its checks:
    an upgrade interrupted after its reinstall began, one that failed and was left in place
    (`--no-revert`), or a failed build restored with --force."""
    if interrupted is not None and interrupted.kind == "run":
        return interrupted.stepped(StepName.REINSTALL)
    newest = next((r for r in runs if r.finished), None)
    if newest is None:
        return False
    fin = newest.last(Finish)
    if newest.kind == "run":
        return newest.status == Finished.FAILED and bool(fin and fin.kept_failed_state)
    if newest.kind == "rollback" and newest.status in (Finished.RESTORED, Finished.FAILED) and newest.snapshot_id:
        try:
            return is_failed_build(t.store.get(newest.snapshot_id))
        except SnapshotError:
            return False
    return False


ROLLBACK_DOWNTIME_PARTS = ("stop", "snapshot", "restore", "start", "ready")


def _rollback_downtime(down_t0: float | None, steps: list[StepRecord], svc: ServiceSteps | None) -> Downtime | None:
    """A rollback's downtime, as a run's (Downtime): from the moment the stop of a running
    service began to its first healthy answer, with the steps in that window as parts — the
    stop, the undo snapshot's check (and a snapshot taken again), the restore, the start and
    the wait for health. None when no running service was stopped."""
    if down_t0 is None or svc is None:
        return None
    healthy = svc.healthy_at
    ongoing = healthy is None or healthy <= down_t0
    end = time.monotonic() if ongoing or healthy is None else healthy
    parts = dict.fromkeys(ROLLBACK_DOWNTIME_PARTS, 0.0)
    names = {"stop": "stop", "snapshot": "snapshot", "snapshot-check": "snapshot", "restore": "restore"}
    # Only what ran in the window: an undo snapshot taken while the service served is before it.
    stop_at = next((i for i, s in enumerate(steps) if s.name == "stop"), len(steps))
    for step in steps[stop_at:]:
        if step.name in names:
            parts[names[step.name]] += step.seconds
    first = [st for st in svc.starts if st[0] >= down_t0]
    if first:
        parts["start"], parts["ready"] = first[0][1], first[0][2]
    return Downtime(max(0.0, end - down_t0), parts, ongoing)


def _settle_quietly(t: Target) -> None:
    try:
        privatize.settle(t.store.env_dir)
    except Exception:  # noqa: BLE001 - the rollback's own error is what is reported; settled next time
        pass


def _forget_quietly(store: Store, snapshot_id: str) -> None:
    try:
        store.delete(snapshot_id)
    except (OSError, SnapshotError):
        pass  # retention removes it later


def _check_undo_snapshot(t: Target, j: RunJournal, target: SnapshotMeta, undo_id: str, steps: list[StepRecord], *,
                         failed_build: bool, say: Say, progress: Progress | None) -> tuple[str | None, str | None]:
    """In the window: one stat walk (what `verify` compares) proves the environment still is
    the undo snapshot taken while the service served — as a staged run's `snapshot-check`.
    Anything changed since (an edit, a byte-compiled cache written): the snapshot is taken
    again, now, and the stale one removed. Returns (snapshot id, error)."""
    t0 = time.monotonic()
    j.append(Step(name=StepName.SNAPSHOT_CHECK, purpose="undo", snapshot_id=undo_id))
    try:
        same = still_the_snapshot(t, t.store.get(undo_id))
    except (SnapshotDamaged, SnapshotError):
        same = False
    steps.append(StepRecord.since("snapshot-check", True, t0))
    if same:
        return undo_id, None
    say(f"the environment changed while the service served: the undo snapshot {undo_id} is taken again")
    _forget_quietly(t.store, undo_id)
    j.append(Note(undo_snapshot_stale=undo_id))
    return _snapshot_replaced_state(t, j, target, steps, failed_build=failed_build, say=say, progress=progress)


def _snapshot_replaced_state(t: Target, j: RunJournal, target: SnapshotMeta, steps: list[StepRecord], *,
                             failed_build: bool, say: Say, progress: Progress | None,
                             served: bool = False) -> tuple[str | None, str | None]:
    """Snapshot the state a rollback is about to replace, so that restoring it undoes the
    rollback (rolls forward to an upgraded build even once its nightly left the index).
    As cheap as any snapshot: files their RECORD proves are shared by links. A rollback is
    often urgent: when the snapshot cannot be taken (a full disk), the rollback goes ahead,
    and the result says it cannot be undone. `served`: taken before the stop (then checked
    in the window by `_check_undo_snapshot`). Returns (snapshot id, error)."""
    t0 = time.monotonic()
    j.append(Step(name=StepName.SNAPSHOT, purpose="undo", served=served))
    try:
        # Taken over (`privatize`): its files with bytes the store lacks are exactly those the
        # restore replaces, so they are linked now, not copied, and settled once it is done.
        res = take_snapshot(t.env, t.store, label=f"before rollback {j.id} to {target.id}", status=PRE_ROLLBACK,
                            run_id=j.id, progress=progress, exclude=t.recipe.snapshot_exclude, take_over=True)
    except Exception as exc:  # noqa: BLE001 - any failure: reported, the restore still goes ahead
        msg = getattr(exc, "message", None) or str(exc)
        j.append(Note(undo_snapshot_error=msg))
        steps.append(StepRecord.since("snapshot", False, t0))
        say(f"could not snapshot the state this rollback replaces ({msg}): going ahead; it cannot be undone")
        return None, msg
    if failed_build:
        res.meta.extra["failed_build"] = True  # never a default target, restored only with --force
        res.meta.save()
    j.append(Note(undo_snapshot_id=res.meta.id))
    steps.append(StepRecord.since("snapshot", True, t0))
    say(f"snapshot {res.meta.id} holds the state this rollback replaces "
        f"(`rewheel rollback {t.cli_ref} {res.meta.id}{' --force' if failed_build else ''}` undoes it)")
    return res.meta.id, None


def _service_failed_after_restore(t: Target, svc: ServiceSteps, result: RollbackResult, back: ServiceBack) -> None:
    """Fill a rollback's result for a service that did not come back healthy: the root cause
    from its log, what failed, and what a person can do (exit 3)."""
    assert back.error is not None and back.diagnosis is not None
    rc, diag = back.root_cause, back.diagnosis
    result.status = RollbackStatus.SERVICE_FAILED
    result.root_cause, result.diagnosis = rc, diag
    msg = back.error.message
    result.error = (f"restored snapshot {result.snapshot.id} into {t.env.prefix} (verified), but "
                    f"{svc.manager.describe()} did not come back healthy: {msg}"
                    + (f"; its log says{cause_text(rc)}" if rc else ""))
    force = " --force" if result.undo_needs_force else ""
    undo = (f"; `rewheel rollback {t.cli_ref} {result.undo_snapshot_id} --yes{force}` puts back the state "
            "this rollback replaced") if result.undo_snapshot_id else ""
    result.hint = (f"the service's log: {diag.source or svc.manager.log_location(0)}; fix the cause, then "
                   f"start the service (or `rewheel rollback {t.cli_ref} --yes` once more){undo}")


def rollback_error(result: RollbackResult) -> RewheelError:
    """A failed rollback's outcome as the error the CLI prints (exit 3)."""
    from rewheel.errors import RestoreError

    return RestoreError(result.error or "rollback failed", hint=result.hint)


def close_superseded(env_dir: Path, by: RunJournal, *, skip: AbstractSet[str] = frozenset()) -> list[str]:
    """Finish, as `superseded`, every journal left unfinished below the one `by` just
    settled (rollbacks killed one after another each leave one): the environment is now
    what `by` made it, so none of them needs resuming, and none may block the next command
    with exit 4 or need a rollback of its own. Returns their ids."""
    closed = []
    for r in journal.list_runs(env_dir):
        # (one superseded already by a finished run after it gets its record now, naming that run)
        if r.id == by.id or r.id in skip or r.last(Finish) is not None or not r.records:
            continue
        r.append(Finish(status=Finished.SUPERSEDED, by_run=r.superseded_by or by.id))
        closed.append(r.id)
    return closed
