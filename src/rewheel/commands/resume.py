"""`resume`: finish or undo an interrupted command: record an upgrade that had passed every
check, abort one that had changed nothing, else revert it from its pre-upgrade snapshot
(an interrupted rollback or revert is run again)."""

from __future__ import annotations

from rewheel import journal
from rewheel.commands.cycle import Cycle
from rewheel.commands.results import ResumeResult, json_value
from rewheel.commands.rollback import close_superseded, left_service_down, noted_active
from rewheel.commands.service_steps import cause_text, service_root_cause
from rewheel.commands.target import Say, Target, quiet, refuse_broken_tls, refuse_system_interpreter, target_refusals
from rewheel.errors import RestoreError, RewheelError, ServiceError, out_of_space
from rewheel.journal import EnvLock
from rewheel.snapshot import Progress, scope_of
from rewheel.snapshot.restore_checks import remove_stale_staging
from rewheel.records import Finish, Installed, Note, Step
from rewheel.statuses import Finished, ResumeStatus, RunStatus, StepName, kept_status


def resume(t: Target, *, say: Say = quiet, progress: Progress | None = None) -> ResumeResult:
    """An interrupted upgrade is undone (restored from its pre-upgrade snapshot) unless it had
    already passed every check and was only recording its result, which is then finished.
    An interrupted rollback or revert is run again (restores are idempotent)."""
    # The interrupted rewheel's uv or smoke test, if still running, is stopped (and waited
    # for) when the lock is taken, before any file is touched.
    refuse_system_interpreter(t)
    refuse_broken_tls(t)
    target_refusals(t)  # a tampered record: exit 3 before the lock, a journal or a signal
    with EnvLock(t.store.env_dir, "resume", prefix=t.env.prefix, reclaim=True, say=say) as lk:
        j = journal.interrupted_run(t.store.env_dir)
        if j is None:
            return ResumeResult(ResumeStatus.NOTHING, None, "no interrupted run",
                                stopped_processes=lk.stopped)
        steps_seen = [s.name for s in j.all(Step)]
        cyc = Cycle.from_journal(t, j, say=say, progress=progress)
        _record_service_state(t, j, cyc)

        if j.kind == "run" and "keep" in steps_seen and "revert" not in steps_seen:
            assert cyc.snap is not None
            j.append(Step(name=StepName.KEEP, resumed=True))
            cyc.report.after = t.env.versions()
            cyc.snap.extra["upgraded_to"] = cyc.report.after
            cyc.snap.save()
            cyc.report.status = kept_status(cyc.report.before, cyc.report.after, True)
            # The unshare a kill may have cut short, done again (it leaves no file of its own
            # behind and copies only what still shares an inode with uv's cache).
            installed = j.last(Installed)
            cyc.install_ns = installed.install_ns if installed else None
            cyc.unshare()
            j.append(Finish(status=Finished.of(cyc.report.status), resumed=True, after=cyc.report.after))
            close_superseded(t.store.env_dir, j)
            return ResumeResult(ResumeStatus.UPGRADED, j.id, "finished recording a verified upgrade", cyc.report,
                                stopped_processes=lk.stopped)

        served = any(s.name == StepName.SNAPSHOT and s.served for s in j.all(Step))
        if cyc.snap is None or (served and "stop" not in steps_seen):
            # Interrupted before the snapshot existed, or a staged run's snapshot taken while
            # the service served and before its stop: the environment was not touched — but
            # for what a rollback killed after preparing its restore had staged beside it.
            j.append(Step(name=StepName.ABORT, resumed=True))
            remove_stale_staging(scope_of(t.env))
            svc = cyc.svc
            try:
                if svc is not None and cyc.was_active and not svc.was_active():
                    cyc.report.service = svc.start_and_verify()
            except ServiceError as exc:
                if out_of_space(exc):  # not started for want of space: still open, for a resume once there is room
                    raise RestoreError(exc.message, hint=f"free disk there, then `rewheel resume {t.cli_ref}` "
                                                         "starts it (nothing had been changed)") from exc
                # Finished all the same (nothing had been changed): a stale record would
                # block every later command with exit 4. The cause comes from its log.
                assert svc is not None  # only a start raises it
                cyc.report.root_cause, cyc.report.diagnosis = service_root_cause(svc, cyc.package())
                j.append(Finish(status=Finished.FAILED, resumed=True, service_error=exc.message,
                                root_cause=json_value(cyc.report.root_cause)))
                close_superseded(t.store.env_dir, j)
                exc.message += f"; its log says{cause_text(cyc.report.root_cause)}" if cyc.report.root_cause else ""
                raise
            j.append(Finish(status=Finished.ABORTED, resumed=True))
            close_superseded(t.store.env_dir, j)
            cyc.report.status = RunStatus.FAILED
            return ResumeResult(ResumeStatus.ABORTED, j.id, "nothing had been changed; service restored as it was", cyc.report,
                                stopped_processes=lk.stopped)

        def close() -> None:
            # A rollback ends as a rollback does (`restored`), a run as a run (`reverted`, `failed`).
            status = (Finished.RESTORED if j.kind == "rollback" and cyc.report.status == RunStatus.REVERTED
                      else Finished.of(cyc.report.status))
            j.append(Finish(status=status, resumed=True, after=cyc.report.after,
                            root_cause=json_value(cyc.report.root_cause)))
            # Older interrupted journals below this one describe states already overwritten.
            close_superseded(t.store.env_dir, j)

        # Interrupted again (a signal, a kill): the run stays open for the next `resume`.
        moved_from = t.env.versions()
        try:
            cyc.revert(f"resuming interrupted {j.kind} {j.id} (last step: {j.last_step})")
        except RewheelError as exc:
            if not out_of_space(exc):  # a full disk: still open, for a resume once there is space
                close()
            raise
        close()
        cyc.prune_after_revert()
        # The report says what this resume moved: the live versions it found, and what it left.
        from rewheel.diff import diff_versions

        cyc.report.before, cyc.report.changes = moved_from, diff_versions(moved_from, cyc.report.after or {})
        if j.kind == "rollback":
            return ResumeResult(ResumeStatus.RESTORED, j.id,
                                f"finished interrupted rollback: restored snapshot {cyc.snap.id}", cyc.report,
                                stopped_processes=lk.stopped)
        return ResumeResult(ResumeStatus.REVERTED, j.id, f"restored pre-upgrade snapshot {cyc.snap.id}", cyc.report,
                            stopped_processes=lk.stopped)


def _record_service_state(t: Target, j: journal.RunJournal, cyc: Cycle) -> None:
    """A command killed before it recorded whether the service ran (its first note, written
    before anything is stopped) had not stopped it: the state now is the state before — or,
    for a rollback, whatever the older command it was finishing had noted and left stopped
    (as the rollback itself would have judged). Recorded in the journal before anything is
    touched, so that a resume killed in turn leaves the same answer to the next one."""
    svc = cyc.svc
    if svc is None or any(n.service_was_active is not None for n in j.all(Note)):
        return
    st = svc.status()
    was = bool(st.up)
    if not was and j.kind == "rollback":
        others = [r for r in journal.list_runs(t.store.env_dir) if r.id != j.id]
        unfinished = next((r for r in others if not r.finished and r.records), None)
        earlier = next((r for r in others[:1] if left_service_down(r)), unfinished)
        was = noted_active(earlier)
    j.append(Note(service_was_active=was, service_judged_by=st.judged_by, resumed=True))
    cyc.was_active = was
    cyc.report.service_before = "active" if was else "inactive"
