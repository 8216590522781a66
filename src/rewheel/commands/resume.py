"""`resume`: finish or undo an interrupted command: record an upgrade that had passed every
check, abort one that had changed nothing, else revert it from its pre-upgrade snapshot
(an interrupted rollback or revert is run again)."""

from __future__ import annotations

from rewheel import journal
from rewheel.commands.cycle import Cycle
from rewheel.commands.results import ResumeResult, json_value, kept_status
from rewheel.commands.rollback import close_superseded
from rewheel.commands.service_steps import cause_text, service_root_cause
from rewheel.commands.target import Say, Target, quiet, refuse_broken_tls, refuse_system_interpreter
from rewheel.errors import RestoreError, RewheelError, ServiceError, out_of_space
from rewheel.journal import EnvLock
from rewheel.snapshot import Progress


def resume(t: Target, *, say: Say = quiet, progress: Progress | None = None) -> ResumeResult:
    """An interrupted upgrade is undone (restored from its pre-upgrade snapshot) unless it had
    already passed every check and was only recording its result, which is then finished.
    An interrupted rollback or revert is run again (restores are idempotent)."""
    # The interrupted rewheel's uv or smoke test, if still running, is stopped (and waited
    # for) when the lock is taken, before any file is touched.
    refuse_system_interpreter(t)
    refuse_broken_tls(t)
    with EnvLock(t.store.env_dir, "resume", prefix=t.env.prefix, reclaim=True, say=say) as lk:
        j = journal.interrupted_run(t.store.env_dir)
        if j is None:
            return ResumeResult("nothing-to-resume", None, "no interrupted run",
                                stopped_processes=lk.stopped)
        steps_seen = [r.get("name") for r in j.records if r["event"] == "step"]
        cyc = Cycle.from_journal(t, j, say=say, progress=progress)

        if j.kind == "run" and "keep" in steps_seen and "revert" not in steps_seen:
            assert cyc.snap is not None
            j.append("step", name="keep", resumed=True)
            cyc.report.after = t.env.versions()
            cyc.snap.extra["upgraded_to"] = cyc.report.after
            cyc.snap.save()
            cyc.report.status = kept_status(cyc.report.before, cyc.report.after, True)
            j.append("finished", status=cyc.report.status, resumed=True, after=cyc.report.after)
            close_superseded(t.store.env_dir, j)
            return ResumeResult("upgraded", j.id, "finished recording a verified upgrade", cyc.report,
                                stopped_processes=lk.stopped)

        served = any(r["event"] == "step" and r.get("name") == "snapshot" and r.get("served") for r in j.records)
        if cyc.snap is None or (served and "stop" not in steps_seen):
            # Interrupted before the snapshot existed, or a staged run's snapshot taken while
            # the service served and before its stop: the environment was not touched.
            j.append("step", name="abort", resumed=True)
            try:
                if cyc.svc is not None and cyc.was_active and not cyc.svc.was_active():
                    cyc.report.service = cyc.svc.start_and_verify()
            except ServiceError as exc:
                if out_of_space(exc):  # not started for want of space: still open, for a resume once there is room
                    raise RestoreError(exc.message, hint=f"free disk there, then `rewheel resume {t.cli_ref}` "
                                                         "starts it (nothing had been changed)") from exc
                # Finished all the same (nothing had been changed): a stale record would
                # block every later command with exit 4. The cause comes from its log.
                cyc.report.root_cause, cyc.report.diagnosis = service_root_cause(cyc.svc, cyc.package())
                j.append("finished", status="failed", resumed=True, service_error=exc.message,
                         root_cause=json_value(cyc.report.root_cause))
                close_superseded(t.store.env_dir, j)
                exc.message += f"; its log says{cause_text(cyc.report.root_cause)}" if cyc.report.root_cause else ""
                raise
            j.append("finished", status="aborted", resumed=True)
            close_superseded(t.store.env_dir, j)
            cyc.report.status = "failed"
            return ResumeResult("aborted", j.id, "nothing had been changed; service restored as it was", cyc.report,
                                stopped_processes=lk.stopped)

        def close() -> None:
            j.append("finished", status=cyc.report.status, resumed=True, after=cyc.report.after,
                     root_cause=json_value(cyc.report.root_cause))
            # Older interrupted journals below this one describe states already overwritten.
            close_superseded(t.store.env_dir, j)

        # Interrupted again (a signal, a kill): the run stays open for the next `resume`.
        try:
            cyc.revert(f"resuming interrupted {j.kind} {j.id} (last step: {j.last_step})")
        except RewheelError as exc:
            if not out_of_space(exc):  # a full disk: still open, for a resume once there is space
                close()
            raise
        close()
        cyc.prune_after_revert()
        return ResumeResult("reverted", j.id, f"restored pre-upgrade snapshot {cyc.snap.id}", cyc.report,
                            stopped_processes=lk.stopped)
