"""The cycle and the commands built on it: snapshot, history, rollback, run, resume.

Everything here acts on a `Target` (a recipe, or a bare `--python` interpreter) under the
environment's lock, journals each destructive step before doing it, and returns
dataclasses; rendering and exit codes belong to the CLI.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewheel import journal
from rewheel.environment import Environment
from rewheel.errors import RewheelError, ServiceError, SnapshotDamaged, SnapshotError
from rewheel.host import Host
from rewheel.journal import EnvLock, RunJournal
from rewheel.paths import state_home
from rewheel.recipe import Recipe
from rewheel.snapshot import (Progress, RestoreResult, SnapshotMeta, SnapshotResult, Store,
                              check_cleanup_entries, discard_displaced, restore_lanes_setting, restore_snapshot, take_snapshot,
                              unstash_cleanup)

if TYPE_CHECKING:
    from rewheel.diagnose import RootCause
    from rewheel.diff import FileChange, PackageChange
    from rewheel.installer import InstallPlan
    from rewheel.patches import Patch, ReapplyResult
    from rewheel.preflight import Check
    from rewheel.proc import StoppedChild
    from rewheel.service import HealthResult
    from rewheel.smoke import SmokeResult

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass
class Target:
    recipe: Recipe
    env: Environment
    store: Store
    # What the commands act through (service manager, uv, smoke runner, fetcher, GPU probe).
    host: Host = field(default_factory=Host.real)

    @property
    def label(self) -> str:
        return self.recipe.source

    @property
    def cli_ref(self) -> str:
        return str(self.recipe.path) if self.recipe.path else f"--python {self.recipe.python}"


def open_target(recipe: Recipe, host: Host | None = None) -> Target:
    """The recipe's environment, its store, and the host the commands act through (the
    real one unless a caller hands another)."""
    restore_lanes_setting()  # a bad value is refused before any command acts
    env = Environment.inspect(recipe.python)
    return Target(recipe, env, Store(env.prefix, _checked_home(recipe, env.prefix)), host or Host.real())


def _checked_home(recipe: Recipe, prefix: Path) -> Path:
    """The store's folder, refused (exit 2, naming where it came from) when it is a file,
    on a pseudo-filesystem (/proc, /sys), or a world-writable folder without the
    sticky bit; created private (0700) when it does not exist."""
    import os

    from rewheel.paths import ensure_private_dir, refuse_home_inside

    if recipe.store is not None:
        home, what = recipe.store, f"{recipe.source}: snapshots.store"
    else:
        home = state_home()
        what = "REWHEEL_HOME" if os.environ.get("REWHEEL_HOME") else "the state folder"
    refuse_home_inside(home, prefix, what=what)
    return ensure_private_dir(home, what=what)


def refuse_system_interpreter(t: Target) -> None:
    """run, rollback and resume change the environment: a system interpreter's (not a venv,
    not a conda env) only when the recipe says `[environment] system = true`. Exit 2 before
    anything is touched; read-only commands are not asked."""
    refused = t.env.system_refusal(t.recipe)
    if refused is not None:
        raise refused


def protected_snapshots(store: Store) -> set[str]:
    """Snapshots a pending rollback may need: those of unfinished runs, and the newest
    pre-upgrade one (the default rollback target)."""
    keep = {j.snapshot_id for j in journal.list_runs(store.env_dir) if not j.finished and j.snapshot_id}
    pre = _upgrades_in_place(store, store.list())
    if pre:
        keep.add(pre[0].id)
    return {k for k in keep if k}


# --------------------------------------------------------------------------------------
# snapshot
# --------------------------------------------------------------------------------------
@dataclass
class SnapshotCommandResult:
    result: SnapshotResult
    pruned: list[str]

    def to_json(self) -> dict[str, Any]:
        return {**self.result.to_json(), "pruned": self.pruned}


def pruned_text(store: Store, ids: list[str]) -> str:
    """`3f2a9c1e (before run …), 8d0b7e44 (failed upgrade of run …, a failed build)`."""
    def one(i: str) -> str:
        m = store.pruned_meta.get(i)
        if m is None:
            return i
        return f"{i} ({m.label or m.status}" + (", a failed build)" if m.failed_build else ")")
    return ", ".join(one(i) for i in ids)


def snapshot_now(t: Target, *, label: str = "", progress: Progress | None = None) -> SnapshotCommandResult:
    with EnvLock(t.store.env_dir, "snapshot", prefix=t.env.prefix):
        journal.refuse_if_interrupted(t.store.env_dir, t.cli_ref)
        res = take_snapshot(t.env, t.store, label=label, status="manual", progress=progress,
                            exclude=t.recipe.snapshot_exclude)
        pruned = t.store.prune(t.recipe.keep, protected_snapshots(t.store) | {res.meta.id})
    return SnapshotCommandResult(res, pruned)


# --------------------------------------------------------------------------------------
# history
# --------------------------------------------------------------------------------------
KEY_PACKAGES = ("vllm", "torch", "flashinfer-python", "transformers", "triton")


@dataclass
class History:
    target: str
    snapshots: list[SnapshotMeta]
    runs: list[RunJournal]
    key_packages: list[str] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)
    # Stored files an edit in place changed, by snapshot id, as the last check found them.
    damaged_files: dict[str, int] = field(default_factory=dict)
    # The live rewheel holding the environment now (status.running_now): its journal is
    # running, not interrupted.
    running: dict[str, Any] | None = None

    @property
    def interrupted(self) -> RunJournal | None:
        if self.running is not None:
            return None
        return next((r for r in self.runs if not r.finished), None)

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target,
                "snapshots": [{**s.to_json(), "damaged_files": self.damaged_files.get(s.id, 0)}
                              for s in self.snapshots],
                "runs": [{**r.summary(), "status": "running"} if self.running and r.id == self.running.get("run_id")
                         else r.summary() for r in self.runs],
                "interrupted_run": self.interrupted.id if self.interrupted else None,
                "damaged_snapshots": self.damaged, "running": self.running}


def history(t: Target) -> History:
    names = t.recipe.install.names
    names += [k for k in KEY_PACKAGES if k not in names]
    metas = t.store.list()
    from rewheel.snapshot.integrity import recorded_damage

    # The damage the last check found, not a check per call: one costs about a stat walk of
    # the environment per snapshot (seconds on a real vLLM store); `status` and `verify` check.
    from rewheel.status import running_now

    return History(t.cli_ref, metas, journal.list_runs(t.store.env_dir), names,
                   t.store.damaged(), {m.id: recorded_damage(m) for m in metas}, running_now(t))


# --------------------------------------------------------------------------------------
# rollback
# --------------------------------------------------------------------------------------
@dataclass
class StepRecord:
    """One step of a run, a rollback or a revert, as the report lists it: its name, whether
    it succeeded, how long it took. `skipped`/`reason` mark a start deliberately not made,
    `restarted` a health check of a service left running; each appears in the JSON only when
    set, as it always has."""

    name: str
    ok: bool
    seconds: float = 0.0
    skipped: bool | None = None
    reason: str | None = None
    restarted: bool | None = None

    @classmethod
    def since(cls, name: str, ok: bool, t0: float, **extra: Any) -> StepRecord:
        """A step that began at `t0` (time.monotonic()) and ends now."""
        return cls(name, ok, round(time.monotonic() - t0, 3), **extra)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class RollbackResult:
    snapshot: SnapshotMeta
    restore: RestoreResult
    run_id: str
    service: HealthResult | None = None
    finished_run: str | None = None
    steps: list[StepRecord] = field(default_factory=list)
    # Processes an interrupted rewheel had started (uv, the smoke test) that were still running
    # and were stopped before anything was restored.
    stopped_processes: list[StoppedChild] = field(default_factory=list)
    # The snapshot of the state this rollback replaced (None when no byte changed, or when
    # it could not be taken: `undo_snapshot_error` says why); restoring it rolls forward.
    undo_snapshot_id: str | None = None
    undo_snapshot_error: str | None = None
    pruned: list[str] = field(default_factory=list)
    # "restored", or "service-failed": the files are the snapshot's, verified, but the
    # service did not come back healthy (exit 3); `root_cause` is read from its log.
    status: str = "restored"
    error: str | None = None
    hint: str | None = None
    root_cause: RootCause | None = None
    diagnosis: DiagnosisRecord | None = None
    # Journals of earlier commands this rollback closed: interrupted ones left below the
    # newest (a stack of killed rollbacks), finished as superseded by this one.
    superseded_runs: list[str] = field(default_factory=list)
    target: str = ""  # how the CLI names the target (for the commands the report suggests)
    # Stored files an edit in place had damaged, recovered before the restore (None: none were).
    recovered: Any = None  # recovery.Recovery
    # From the stop of a running service to its first healthy answer, as a run reports it
    # (None: no running service was stopped).
    downtime: Downtime | None = None

    @property
    def exit_code(self) -> int:
        from rewheel.errors import EXIT_OK, EXIT_UNRESTORED

        return EXIT_OK if self.status == "restored" else EXIT_UNRESTORED

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "snapshot_id": self.snapshot.id, "run_id": self.run_id,
                "restore": self.restore.to_json(), "service": _to_json(self.service),
                "versions": self.snapshot.versions, "finished_interrupted_run": self.finished_run,
                "steps": [s.to_json() for s in self.steps], "stopped_processes": _to_json(self.stopped_processes),
                "recovered": _to_json(self.recovered),
                "undo_snapshot_id": self.undo_snapshot_id, "undo_snapshot_error": self.undo_snapshot_error,
                "pruned": self.pruned, "error": self.error, "hint": self.hint,
                "root_cause": _to_json(self.root_cause), "diagnosis": _to_json(self.diagnosis),
                "superseded_runs": self.superseded_runs, "downtime": _to_json(self.downtime),
                "exit_code": self.exit_code}


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
        hint=f"to restore it anyway (to debug it), add --force: `rewheel rollback {cli_ref} {snap.id} "
             f"--force`; without a SNAPSHOT, rollback picks the snapshot taken before the last "
             f"upgrade still in place (`rewheel history {cli_ref}` lists them); nothing was changed")


# How a run ends whose upgrade is not in place: its pre-upgrade snapshot is what the
# environment already is again, so a plain rollback to it would undo nothing.
UNDONE_RUNS = ("reverted", "rejected", "aborted")


def _reverted_snapshots(store: Store, metas: list[SnapshotMeta]) -> set[str]:
    """The pre-upgrade snapshots of runs whose upgrade was undone (reverted, rejected, aborted)."""
    undone = {j.id for j in journal.list_runs(store.env_dir) if j.status in UNDONE_RUNS}
    return {m.id for m in metas if m.status == "pre-upgrade" and m.run_id in undone}


def _upgrades_in_place(store: Store, metas: list[SnapshotMeta]) -> list[SnapshotMeta]:
    """Pre-upgrade snapshots, newest first, of upgrades still in place."""
    reverted = _reverted_snapshots(store, metas)
    return [m for m in metas if m.status == "pre-upgrade" and m.id not in reverted]


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
    pre = _upgrades_in_place(store, metas)
    if pre:
        return pre[0]
    reverted = _reverted_snapshots(store, metas)
    usable = [m for m in metas if not is_failed_build(m) and m.id not in reverted]
    usable = [m for m in usable if m.status != PRE_ROLLBACK] or usable
    if not usable and reverted:
        raise SnapshotError("no upgrade is in place to undo: every upgrade of this environment was reverted, "
                            f"and its revert already restored the snapshot taken before it "
                            f"({', '.join(m.id for m in metas if m.id in reverted)})",
                            hint="`rewheel history TARGET` lists the snapshots; name one to restore it; "
                                 "nothing was changed")
    if not usable:
        raise SnapshotError(f"every snapshot of this environment is a failed build ({', '.join(m.id for m in metas)}): "
                            "there is no default rollback target",
                            hint="name one and add --force to restore a failed build anyway; nothing was changed")
    return usable[0]


def _env_matches(t: Target, snap: SnapshotMeta) -> bool:
    """Whether the live environment already is the snapshot (the comparison `verify` makes:
    type, size, mtime, mode, link target of every entry; no extra, none missing), so that a
    restore would change no byte. Raises what makes the snapshot unusable here (another
    environment's snapshot, a damaged store), before anything is stopped."""
    from rewheel.errors import RestoreError
    from rewheel.snapshot import verify

    try:
        verify(t.env, snap)
    except (SnapshotDamaged, SnapshotError):
        raise
    except RestoreError:
        return False  # it differs: the restore has work to do
    except Exception:
        return False  # unsure: behave as for a restore that changes files
    return True


def _restore_changed(res: RestoreResult) -> bool:
    return bool(res.written or res.deleted or res.chmodded or res.folders_rebuilt or res.displaced)


def _noted_active(j: RunJournal | None) -> bool:
    """Whether a journal recorded the service as running before its run began."""
    if j is None:
        return False
    notes = [r for r in j.records if r["event"] == "note" and "service_was_active" in r]
    return bool(notes and notes[0]["service_was_active"])


def _left_down(j: RunJournal) -> bool:
    """Whether a command may have left the service stopped although it was running before."""
    if not j.finished:
        return True
    if j.status != "failed":
        return False
    fin = j.last("finished") or {}
    # A run that failed before its reinstall ("error") started the service again itself.
    return "error" not in fin or any("restart_after_abort_failed" in r for r in j.records)


def refuse_broken_tls(t: Target) -> None:
    """A service's health check needs an HTTP client, and httpx cannot make one while
    SSL_CERT_FILE names nothing: refused (exit 2, naming it) before anything is stopped."""
    if t.recipe.service is not None and t.recipe.service.health_url:
        from rewheel.httpclient import check_tls_env

        check_tls_env()


def rollback(t: Target, ref: str | None = None, *, force: bool = False, undo: bool = True, say: Say = _quiet,
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
    with EnvLock(t.store.env_dir, "rollback", prefix=t.env.prefix, reclaim=True, say=say) as lk:
        snap = t.store.get(ref) if ref is not None else default_rollback_snapshot(t.store)
        refuse_failed_build(snap, force, t.cli_ref)  # before a journal exists: nothing to close
        check_cleanup_entries(snap, t.recipe.cleanup_paths)  # tampered or re-linked: refused, nothing changed
        interrupted = journal.interrupted_run(t.store.env_dir)
        runs = journal.list_runs(t.store.env_dir)
        # The last command, if it left the service stopped: interrupted, or failed without
        # putting things back (`--no-revert`, a revert that could not verify, a restart
        # after an aborted run that failed).
        left_down = next((r for r in runs[:1] if _left_down(r)), interrupted)
        replaces_failed = _live_is_failed_build(t, runs, interrupted)
        # With a service: before it is stopped. Without one the restore itself checks every
        # stored file it needs before it changes anything, at no extra cost (see below).
        recovery = _recover_stored_bytes(t, snap, say) if t.recipe.service is not None else None
        j = RunJournal.create(t.store.env_dir, "rollback", snapshot_id=snap.id, recipe=t.label,
                              force=force)
        steps: list[StepRecord] = []
        svc = ServiceSteps(t, j, steps, say) if t.recipe.service is not None else None
        was_up = up_now = unchanged = stopped = suspect = False
        try:
            st = svc.status() if svc else None
            try:
                # Whether a restore would change any byte: a running service is then left
                # alone, and no undo snapshot is taken. A walk of the environment: skipped when
                # neither question is asked (no service, `--no-undo`): the restore's own scan
                # finds an unchanged environment just as well.
                unchanged = _env_matches(t, snap) if svc or undo else False
            except (SnapshotDamaged, SnapshotError):
                if svc:
                    raise
                # Nothing to stop: the restore's own checks refuse it below, with their
                # precise message, before any file changes (and before an undo snapshot).
                suspect = True
            if svc and not unchanged:
                svc.check_stoppable(st)
        except BaseException:
            j.append("finished", status="refused", snapshot_id=snap.id)
            raise
        undo_id = undo_error = None
        served_undo = False
        down_t0: float | None = None
        if svc:
            up_now = st.up
            # Up now, or up before the run that stopped it and left it so.
            was_up = up_now or _noted_active(left_down)
            j.append("note", service_was_active=was_up, service_judged_by=st.judged_by,
                     environment_unchanged=unchanged)
            if unchanged:
                say(f"{t.env.prefix} already matches snapshot {snap.id}: the service is not stopped")
            else:
                if undo and up_now:
                    # The undo snapshot while the service still serves: out of the downtime,
                    # proven still current by one stat walk once it is stopped (below).
                    undo_id, undo_error = _snapshot_replaced_state(t, j, snap, steps, failed_build=replaces_failed,
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
                        j.append("note", restart_after_abort_failed=str(again))
                    finally:
                        if undo_id is not None:
                            _forget_quietly(t.store, undo_id)  # nothing was replaced: nothing to undo
                        j.append("finished", status="failed", snapshot_id=snap.id,
                                 error=getattr(exc, "message", None) or str(exc))
                    raise
        if not undo and not unchanged:
            undo_error = "skipped (--no-undo)"
            j.append("note", undo_snapshot_error=undo_error)
        elif served_undo:
            assert undo_id is not None
            undo_id, undo_error = _check_undo_snapshot(t, j, snap, undo_id, steps, failed_build=replaces_failed,
                                                       say=say, progress=progress)
        elif not unchanged and not suspect and undo_id is None and undo_error is None:
            undo_id, undo_error = _snapshot_replaced_state(t, j, snap, steps, failed_build=replaces_failed,
                                                           say=say, progress=progress)
        j.append("step", name="restore", snapshot_id=snap.id)
        say(f"restoring snapshot {snap.id} ({snap.label or snap.status}) into {t.env.prefix}")
        t0 = time.monotonic()
        try:
            # What the restore moved out (a failed build's new folders) is deleted once the
            # service is back up: the environment is restored and synced already. Without a
            # service, both lanes delete their own at once, inside the restore.
            res, recovery = _restore_recovering(t, snap, say, recovery, progress, svc is not None)
        except (SnapshotError, SnapshotDamaged):
            # Refused before anything changed (wrong environment, damaged store): this
            # rollback is over — leaving it unfinished would block every later command with
            # exit 4 — and the service it stopped goes back up.
            try:
                if svc and stopped and was_up:
                    svc.start_and_verify()
            finally:
                j.append("finished", status="refused", snapshot_id=snap.id)
            raise
        res.cleanup_restored = unstash_cleanup(snap, t.recipe.cleanup_paths)
        steps.append(StepRecord.since("restore", True, t0))
        service_state = None
        failed: Exception | None = None
        try:
            if svc:
                if not stopped and _restore_changed(res):
                    # Judged unchanged, yet the restore changed files: the service (if any
                    # runs) must not keep running the bytes it loaded before.
                    j.append("note", unchanged_but_restored=True)
                    stopped = True
                    down_t0 = time.monotonic() if up_now else None
                    svc.stop()
                try:
                    if not was_up:
                        svc.skip_start("the service was not running before: it stays stopped")
                    elif not stopped and up_now:
                        service_state = svc.verify_running("no byte changed: the service was not restarted")
                    else:
                        service_state = svc.start_and_verify()
                except ServiceError as exc:
                    failed = exc
        finally:
            discard_displaced(res, t.store.home)  # the store's trash: deleted once this has exited
        if interrupted is not None:
            # The files are the snapshot's now, whether or not the service came back.
            interrupted.append("finished", status="rolled-back", by_run=j.id)
        superseded = close_superseded(t.store.env_dir, j, skip={interrupted.id} if interrupted else set())
        result = RollbackResult(snap, res, j.id, service_state, interrupted.id if interrupted else None, steps,
                                lk.stopped, undo_snapshot_id=undo_id, undo_snapshot_error=undo_error,
                                superseded_runs=superseded, target=t.cli_ref, recovered=recovery,
                                downtime=_rollback_downtime(down_t0, steps, svc))
        if failed is not None:
            assert svc is not None
            _service_failed_after_restore(t, svc, result, failed)
            # Finished, not left interrupted: the files are restored and verified; what is
            # wrong is the service, which the result names (no "error" key: see _left_down).
            j.append("finished", status="failed", snapshot_id=snap.id, service_error=result.error,
                     root_cause=_to_json(result.root_cause), downtime=_to_json(result.downtime))
            return result
        j.append("finished", status="restored", snapshot_id=snap.id, downtime=_to_json(result.downtime))
        keep = protected_snapshots(t.store) | {snap.id} | ({undo_id} if undo_id else set())
        result.pruned = t.store.prune(t.recipe.keep, keep)
        if result.pruned:
            say("pruned old snapshots ([snapshots] keep): " + pruned_text(t.store, result.pruned))
        return result


def _restore_recovering(t: Target, snap: SnapshotMeta, say: Say, recovery: Any, progress: Progress | None,
                        defer_removal: bool) -> tuple[RestoreResult, Any]:
    """`restore_snapshot`; when it refuses a stored file an edit damaged (it checks each it
    needs before changing anything) and no check ran before (no service to stop first), the
    bytes are recovered and the restore runs again. A rollback of an intact snapshot pays
    nothing for it."""
    try:
        return restore_snapshot(t.env, snap, progress=progress, defer_removal=defer_removal), recovery
    except SnapshotDamaged:
        if recovery is not None or t.recipe.service is not None:
            raise
        again = _recover_stored_bytes(t, snap, say)  # raises the refusal when no source has the bytes
        if again is None or not again.recovered:
            raise
    return restore_snapshot(t.env, snap, progress=progress, defer_removal=defer_removal), again


def _recover_stored_bytes(t: Target, snap: SnapshotMeta, say: Say) -> Any:  # recovery.Recovery | None
    """Stored files an edit in place damaged (one stat each): their bytes found in the
    environment, uv's cache or the recipe's index and put back into the snapshot, or the
    rollback refused (exit 3) — before the service is stopped or a file changes."""
    from rewheel.recovery import recover_before_restore

    inst = t.recipe.install
    # A recipe's indexes — uv's default index when it names none, as its installs use; a bare
    # `--python` rollback reaches for the network only where the environment says nothing.
    indexed = t.recipe.path is not None or bool(inst.index_url or inst.extra_index_urls or inst.find_links)
    return recover_before_restore(t.env, snap, cli_ref=t.cli_ref,
                                  fetcher=(lambda: t.host.fetcher(t.recipe)) if indexed else None, say=say)


def _live_is_failed_build(t: Target, runs: list[RunJournal], interrupted: RunJournal | None) -> bool:
    """Whether the live environment holds a build that failed or never passed its checks:
    an upgrade interrupted after its reinstall began, one that failed and was left in place
    (`--no-revert`), or a failed build restored with --force."""
    if interrupted is not None and interrupted.kind == "run":
        return any(r.get("name") == "reinstall" for r in interrupted.records if r["event"] == "step")
    newest = next((r for r in runs if r.finished), None)
    if newest is None:
        return False
    fin = newest.last("finished") or {}
    if newest.kind == "run":
        return newest.status == "failed" and bool(fin.get("kept_failed_state"))
    if newest.kind == "rollback" and newest.status in ("restored", "failed") and newest.snapshot_id:
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
    end = time.monotonic() if ongoing else healthy
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
    j.append("step", name="snapshot-check", purpose="undo", snapshot_id=undo_id)
    try:
        same = _env_matches(t, t.store.get(undo_id))
    except (SnapshotDamaged, SnapshotError):
        same = False
    steps.append(StepRecord.since("snapshot-check", True, t0))
    if same:
        return undo_id, None
    say(f"the environment changed while the service served: the undo snapshot {undo_id} is taken again")
    _forget_quietly(t.store, undo_id)
    j.append("note", undo_snapshot_stale=undo_id)
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
    j.append("step", name="snapshot", purpose="undo", served=served)
    try:
        res = take_snapshot(t.env, t.store, label=f"before rollback {j.id} to {target.id}", status=PRE_ROLLBACK,
                            run_id=j.id, progress=progress, exclude=t.recipe.snapshot_exclude)
    except Exception as exc:  # noqa: BLE001 - any failure: reported, the restore still goes ahead
        msg = getattr(exc, "message", None) or str(exc)
        j.append("note", undo_snapshot_error=msg)
        steps.append(StepRecord.since("snapshot", False, t0))
        say(f"could not snapshot the state this rollback replaces ({msg}): going ahead; it cannot be undone")
        return None, msg
    if failed_build:
        res.meta.extra["failed_build"] = True  # never a default target, restored only with --force
        res.meta.save()
    j.append("note", undo_snapshot_id=res.meta.id)
    steps.append(StepRecord.since("snapshot", True, t0))
    say(f"snapshot {res.meta.id} holds the state this rollback replaces "
        f"(`rewheel rollback {t.cli_ref} {res.meta.id}` undoes it)")
    return res.meta.id, None


def service_root_cause(svc: ServiceSteps, package: str | None) -> tuple[RootCause | None, DiagnosisRecord]:
    """The root cause of a service's failed start, from its log or journal since it was
    started (as `run` diagnoses a failed upgrade): (root_cause, diagnosis). Never raises:
    a diagnosis that fails must not mask the failure itself."""
    from rewheel import diagnose

    try:
        d = diagnose.analyse_lines(svc.log_lines(), package=package)
    except Exception as exc:  # noqa: BLE001
        return None, DiagnosisRecord(error=str(exc))
    return d.root, DiagnosisRecord(svc.manager.log_location(svc.started_at or 0), d.summary())


def cause_text(rc: RootCause | None) -> str:
    """`: RuntimeError: CUDA error … in Worker_TP4`, or "" without a root cause."""
    if not rc:
        return ""
    where = f" in {rc.rank}" if rc.rank else ""
    return f": {rc.type}: {rc.message}{where}"


def _service_failed_after_restore(t: Target, svc: ServiceSteps, result: RollbackResult, exc: Exception) -> None:
    """Fill a rollback's result for a service that did not come back healthy: the root cause
    from its log, what failed, and what a person can do (exit 3)."""
    rc, diag = service_root_cause(svc, t.env.import_name(t.recipe.install.names))
    result.status = "service-failed"
    result.root_cause, result.diagnosis = rc, diag
    msg = getattr(exc, "message", None) or str(exc)
    result.error = (f"restored snapshot {result.snapshot.id} into {t.env.prefix} (verified), but "
                    f"{svc.manager.describe()} did not come back healthy: {msg}"
                    + (f"; its log says{cause_text(rc)}" if rc else ""))
    undo = (f"; `rewheel rollback {t.cli_ref} {result.undo_snapshot_id} --yes` puts back the state "
            "this rollback replaced") if result.undo_snapshot_id else ""
    result.hint = (f"the service's log: {diag.source or svc.manager.log_location(0)}; fix the cause, then "
                   f"start the service (or `rewheel rollback {t.cli_ref} --yes` once more){undo}")


def rollback_error(result: RollbackResult) -> Exception:
    """A failed rollback's outcome as the error the CLI prints (exit 3)."""
    from rewheel.errors import RestoreError

    return RestoreError(result.error or "rollback failed", hint=result.hint)


def close_superseded(env_dir: Path, by: RunJournal, *, skip: set[str] = frozenset()) -> list[str]:
    """Finish, as `superseded`, every journal left unfinished below the one `by` just
    settled (rollbacks killed one after another each leave one): the environment is now
    what `by` made it, so none of them needs resuming, and none may block the next command
    with exit 4 or need a rollback of its own. Returns their ids."""
    closed = []
    for r in journal.list_runs(env_dir):
        if r.id == by.id or r.id in skip or r.finished or not r.records:
            continue
        r.append("finished", status="superseded", by_run=by.id)
        closed.append(r.id)
    return closed


class ServiceSteps:
    """The service around a restore or an upgrade: stop (and wait for GPUs), start and verify."""

    def __init__(self, t: Target, j: RunJournal, steps: list[StepRecord], say: Say) -> None:
        self.t = t
        self.j = j
        self.steps = steps
        self.say = say
        self.host = t.host
        self.spec = t.recipe.service
        assert self.spec is not None
        self.manager = self.host.manager(self.spec, t.store.env_dir, t.recipe.python)
        self.started_at: float | None = None
        # Each start: (when it began, seconds in the manager's start, seconds until the first
        # healthy answer or the failure) — a run's downtime parts; and when (time.monotonic())
        # the service last answered healthy.
        self.starts: list[tuple[float, float, float]] = []
        self.healthy_at: float | None = None

    def status(self) -> Any:  # service.ServiceStatus
        return self.manager.status()

    def was_active(self) -> bool:
        """Running or on its way up (systemd's active/activating/reloading; the command
        manager's live recorded pid, or its health URL answering)."""
        return self.manager.status().up

    def check_stoppable(self, st: Any = None) -> None:
        """Refuse (PreflightError) before anything is changed when the service runs where
        rewheel cannot stop it (started outside rewheel, and no `[service] stop`)."""
        check = getattr(self.manager, "check_stoppable", None)
        if check is not None:
            check(st)

    def skip_start(self, reason: str) -> None:
        """Record that the service is deliberately not started (it was not running before)."""
        self.j.append("note", service_start_skipped=reason)
        self.say(reason)
        self.steps.append(StepRecord("start", True, 0.0, skipped=True, reason=reason))

    def verify_running(self, reason: str) -> HealthResult:
        """Health-check the running service without restarting it."""
        from rewheel import service

        t0 = time.monotonic()
        self.j.append("note", service_not_restarted=reason)
        self.say(f"{reason}; checking {self.manager.describe()} is healthy")
        try:
            health = self.host.wait_ready(self.manager, self.spec, client=self.host.client,
                                          started_at=time.time(), on_progress=self.say)
        except service.HealthCheckFailed:
            self.steps.append(StepRecord.since("health", False, t0))
            raise
        self.steps.append(StepRecord.since("health", True, t0, restarted=False))
        self.j.append("healthy", detail=health.detail)
        health.restarted = False
        return health

    def stop(self) -> None:
        t0 = time.monotonic()
        self.j.append("step", name="stop", service=self.manager.describe())
        self.say(f"stopping {self.manager.describe()}")
        self.manager.stop(float(self.spec.stop_timeout_s))
        smoke = self.t.recipe.smoke
        if smoke is not None and smoke.gpus > 0:
            self.say("waiting for GPU memory to be released")
            self.host.gpus_released(float(smoke.gpu_release_timeout_s))
        self.steps.append(StepRecord.since("stop", True, t0))

    def start_and_verify(self) -> HealthResult:
        from rewheel import service

        t0 = time.monotonic()
        self.j.append("step", name="start", service=self.manager.describe())
        self.say(f"starting {self.manager.describe()}")
        self.started_at = time.time()
        try:
            self.manager.start()
        except BaseException:
            self.starts.append((t0, time.monotonic() - t0, 0.0))
            raise
        t1 = time.monotonic()
        try:
            health = self.host.wait_ready(self.manager, self.spec, client=self.host.client,
                                          started_at=self.started_at, on_progress=self.say)
        except service.HealthCheckFailed:
            self.starts.append((t0, t1 - t0, time.monotonic() - t1))
            self.steps.append(StepRecord.since("start", False, t0))
            raise
        # The first healthy answer, not the end of the settle time and the probe after it.
        healthy = t0 + health.first_healthy_s if health.first_healthy_s is not None else time.monotonic()
        self.healthy_at = max(t1, min(healthy, time.monotonic()))
        self.starts.append((t0, t1 - t0, self.healthy_at - t1))
        self.steps.append(StepRecord.since("start", True, t0))
        self.j.append("healthy", detail=health.detail)
        return health

    def log_lines(self) -> Any:
        return self.manager.log_lines(self.started_at or time.time())


# --------------------------------------------------------------------------------------
# run: the whole cycle
# --------------------------------------------------------------------------------------
@dataclass
class RevertRecord:
    """What a revert did: why, the failed build kept as a snapshot, the restore, the service
    brought back (or left stopped), and, when it could not finish, the error and what a
    person must do. A field appears in the JSON only once set; `hint` always with `error`."""

    reason: str
    failed_snapshot_id: str | None = None
    failed_snapshot_error: str | None = None
    restore: RestoreResult | None = None
    service: HealthResult | None = None
    service_skipped: str | None = None
    error: str | None = None
    hint: str | None = None
    # Why the service did not come back after the restore, read from its log.
    root_cause: RootCause | None = None
    # The failed state's snapshot, removed because the restore changed no byte (it was the
    # good state itself).
    failed_snapshot_dropped: str | None = None

    def to_json(self) -> dict[str, Any]:
        # Not asdict: it would deep-copy the restore result (with its displaced folders).
        doc = {f.name: _to_json(getattr(self, f.name)) for f in fields(self)}
        return {k: v for k, v in doc.items() if v is not None or (k == "hint" and self.error is not None)}


def _to_json(value: Any) -> Any:
    """A report's field as JSON: a result object by its own `to_json()`, a list item by item,
    plain data (versions, paths, counters) as it is."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    return value


@dataclass
class RunPlan:
    """What a run will do: uv's plan, and what the pre-upgrade snapshot will cost (the
    snapshot package's estimate: files and bytes to share and to copy, free space at the
    store), added once it is made."""

    install: InstallPlan
    snapshot_estimate: dict[str, Any] | None = None

    @property
    def changes(self) -> list[Any]:  # installer.PlannedChange
        return self.install.changes

    def to_json(self) -> dict[str, Any]:
        doc = self.install.to_json()
        if self.snapshot_estimate is not None:
            doc["snapshot_estimate"] = self.snapshot_estimate
        return doc


@dataclass
class Failure:
    """Where a run failed and why: the step the journal last announced, the error's class and
    message, and for rewheel's own errors their hint and exit code (another exception has
    neither, nor has its JSON the keys)."""

    step: str | None
    error: str
    message: str
    hint: str | None = None
    exit_code: int | None = None

    @classmethod
    def of(cls, step: str | None, exc: BaseException) -> Failure:
        from rewheel.errors import RewheelError

        if isinstance(exc, RewheelError):
            return cls(step, type(exc).__name__, exc.message, exc.hint, exc.exit_code)
        return cls(step, type(exc).__name__, str(exc))

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        if self.exit_code is None:
            del doc["hint"], doc["exit_code"]
        return doc


@dataclass
class Downtime:
    """How long the service was not answering: from the moment its stop began to its first
    healthy answer (the new build's, or after a revert the old one's), with its parts. The
    parts are the steps inside that window; what they leave out (the diff of what changed,
    the journal) is the rest of `seconds`."""

    seconds: float
    parts: dict[str, float]
    # The service has not answered healthy since its stop (`--no-revert`, a revert or a restart
    # that failed): `seconds` runs to the report, not to a healthy answer. In the JSON only when true.
    ongoing: bool = False

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"seconds": round(self.seconds, 3),
                               "parts": {k: round(v, 3) for k, v in self.parts.items()}}
        if self.ongoing:
            doc["ongoing"] = True
        return doc


DOWNTIME_PARTS = ("stop", "snapshot", "install", "smoke", "start", "ready")


@dataclass
class DiagnosisRecord:
    """Where a failed run's root cause was looked for (a log file, a journalctl command) and
    its one-line summary; or why no diagnosis could be made. JSON: the keys that are set."""

    source: str | None = None
    summary: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class RunReport:
    # "upgraded" | "reinstalled" | "unchanged" | "reverted" | "failed" | "planned" | "prepared" | "rejected"
    status: str
    recipe: str
    run_id: str | None = None
    snapshot_id: str | None = None
    before: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)
    # What the reinstall installed, kept when a revert puts `after` back to `before`.
    attempted: dict[str, str] = field(default_factory=dict)
    changes: list[PackageChange] = field(default_factory=list)
    files: list[FileChange] = field(default_factory=list)
    # The diff's counters (files known by manifest/RECORD, hashed, seconds), or {"error"}
    # when the file list could not be made: open-ended figures, kept as the diff gives them.
    file_stats: dict[str, Any] = field(default_factory=dict)
    patches: list[Patch] = field(default_factory=list)
    patch_files: list[str] = field(default_factory=list)
    reapply: list[ReapplyResult] = field(default_factory=list)
    hazards: list[str] = field(default_factory=list)
    root_cause: RootCause | None = None
    failure: Failure | None = None
    steps: list[StepRecord] = field(default_factory=list)
    plan: RunPlan | None = None
    preflight: list[Check] = field(default_factory=list)
    snapshot: SnapshotResult | None = None
    # The cleanup paths moved into the snapshot: the items its meta.json stores
    # ({"path", "stored", "bytes"}), kept as the snapshot package records them.
    cleanup: list[dict[str, Any]] = field(default_factory=list)
    revert: RevertRecord | None = None
    service: HealthResult | None = None
    logs: dict[str, str] = field(default_factory=dict)
    run_dir: str | None = None
    diagnosis: DiagnosisRecord | None = None
    # The service's state before the run ("active" | "inactive"), and how it was judged
    # ("systemd" | "pid" | "health"); None without a [service].
    service_before: str | None = None
    service_judged_by: str | None = None
    # Snapshots `[snapshots] keep` removed when the upgrade was kept, or after a revert.
    pruned: list[str] = field(default_factory=list)
    # Whether the run was staged (prepared and pre-checked while the service served), and the
    # prepared build: its lock, versions and checks (staging.Prepared).
    staged: bool = False
    prepared: Any = None
    # From the stop to the first healthy answer; None when the service was never stopped.
    downtime: Downtime | None = None
    # What uv downloaded after the stop ("numpy (16.1MiB)"): empty when the install came from
    # uv's cache, as a staged swap's does.
    fetched_after_stop: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        from rewheel.errors import EXIT_OK, EXIT_REVERTED, EXIT_UNRESTORED

        return {"upgraded": EXIT_OK, "reinstalled": EXIT_OK, "unchanged": EXIT_OK, "planned": EXIT_OK,
                "prepared": EXIT_OK, "reverted": EXIT_REVERTED, "rejected": EXIT_REVERTED,
                "failed": EXIT_UNRESTORED}[self.status]

    def to_json(self) -> dict[str, Any]:
        # The one place a run's report becomes JSON: each field by its own object's to_json.
        doc = {f.name: _to_json(getattr(self, f.name)) for f in fields(self)}
        doc["exit_code"] = self.exit_code
        return doc


def kept_status(before: dict[str, str], after: dict[str, str], reinstalled: bool) -> str:
    """A kept run's status: "upgraded" only when a version changed; else "reinstalled" (fresh
    files at the same versions) or "unchanged"."""
    if before != after:
        return "upgraded"
    return "reinstalled" if reinstalled else "unchanged"


class _Step:
    """Journal a step before it acts; time it; record ok/failed in the report."""

    def __init__(self, run: _Cycle, name: str, **info: Any) -> None:
        self.run, self.name, self.info = run, name, info

    def __enter__(self) -> _Step:
        self.t0 = time.monotonic()
        self.run.j.append("step", name=self.name, **self.info)
        self.run.say(f"── {self.name}")
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.run.report.steps.append(StepRecord.since(self.name, exc is None, self.t0))
        # Each step ends with its time, as it started with its name.
        self.run.say(f"   {self.name} {'done' if exc is None else 'FAILED'} in {time.monotonic() - self.t0:.1f}s")


class _Cycle:
    """One run's steps, acting on `t` through `t.host`; `from_journal` rebuilds an
    interrupted one for `resume`."""

    def __init__(self, t: Target, *, lock: str | None, say: Say,
                 on_output: Say, progress: Progress | None) -> None:
        self.t = t
        self.host = t.host
        self.lock = lock
        self.say = say
        self.on_output = on_output
        self.progress = progress
        self.report = RunReport(status="failed", recipe=t.label)
        self.svc: ServiceSteps | None = None
        self.snap: SnapshotMeta | None = None
        self.was_active = False
        self.named = t.recipe.install.names
        self.j: RunJournal  # set in run(), or by from_journal
        # The prepared build a staged run swaps in (staging.Prepared), and the downtime's clock:
        # when the stop began (None: the service was not stopped), when a revert began.
        self.prepared: Any = None
        # Staged: the installed files' diff waits until the service answers (see diff()), and
        # the files the swap hard-linked from uv's cache get their own inodes then (unshare).
        self.files_pending = False
        self.install_ns: int | None = None
        # The upgrade's one resolution (resolution.Resolution): its plan is shown, its lock is
        # what the prepare builds or the unstaged reinstall installs. None with --lock/--prepared.
        self.resolution: Any = None
        # What the install reported (installer.InstallResult), and the uv cache entries cleaned
        # of patched bytes (and fetched again) before the stop.
        self.installed: Any = None
        self.cleaned: set[str] = set()
        self.down_t0: float | None = None
        self.revert_t0: float | None = None

    @classmethod
    def from_journal(cls, t: Target, j: RunJournal, *, say: Say,
                     progress: Progress | None) -> _Cycle:
        """The cycle an interrupted run's journal describes: its id, the versions before it,
        whether the service ran before it, its pre-upgrade snapshot (None when it was
        interrupted before taking one)."""
        cyc = cls(t, lock=None, say=say, on_output=say, progress=progress)
        notes = [r for r in j.records if r["event"] == "note"]
        cyc.j = j
        cyc.was_active = any(r.get("service_was_active") for r in notes)
        cyc.report.run_id = j.id
        cyc.report.before = (j.first("started") or {}).get("before") or {}
        if t.recipe.service is not None:
            cyc.svc = ServiceSteps(t, j, cyc.report.steps, say)
            if any("service_was_active" in r for r in notes):
                cyc.report.service_before = "active" if cyc.was_active else "inactive"
        cyc.snap = t.store.get(j.snapshot_id) if j.snapshot_id else None
        cyc.report.snapshot_id = j.snapshot_id  # the report (and --json) names what was restored
        return cyc

    # -- steps --------------------------------------------------------------------------
    def preflight(self, confirm: Callable[[RunReport], None] | None, dry_run: bool) -> bool:
        from rewheel.errors import PreflightError

        t0 = time.monotonic()
        if not self.t.recipe.install.packages and not self.lock:
            from rewheel.errors import RecipeError

            raise RecipeError(self.t.recipe.source, "install.packages",
                              "missing: `rewheel run` needs the packages to upgrade (or --lock FILE)",
                              hint='add [install] with packages = ["vllm"]')
        # A swap of a prepared build needs no index: it installs from uv's cache.
        checks = (self.host.checks(self.t.recipe, client=self.host.client, indexes=False) if self.prepared
                  else self.host.checks(self.t.recipe, client=self.host.client))
        self.report.preflight = list(checks.checks)
        # `[cleanup] paths` never move a system folder, the environment or rewheel's state
        # (as root): refused here, before anything is stopped (UsageError, exit 2).
        from rewheel.snapshot import cleanup_matches
        cleanup_matches(self.t.recipe.cleanup_paths, [str(self.t.env.prefix), str(self.t.store.home)])
        if not checks.ok:
            raise PreflightError("preflight failed: " + "; ".join(f"{c.name}: {c.detail}" for c in checks.failures),
                                 hint=f"`rewheel check {self.t.cli_ref}` shows every check; nothing was changed")
        if self.prepared is not None:
            from rewheel.staging import planned_swap

            plan = planned_swap(self.prepared, self.t.recipe)
        elif self.lock:
            plan = self.host.plan(self.t.recipe, lock=Path(self.lock))
        else:
            plan = self._resolve()
        from rewheel.installer import annotate_plan
        plan.changes = annotate_plan(plan.changes, self.t.env.distributions())
        self.report.plan = RunPlan(plan)
        self._snapshot_cost()
        self.report.before = self.t.env.versions()
        self.report.steps.append(StepRecord.since("preflight", True, t0))
        if dry_run:
            self.report.status = "planned"
            return False
        if confirm:
            confirm(self.report)
        return True

    def _resolve(self) -> Any:  # installer.InstallPlan
        """The one resolution (resolution.resolve), made in `<env>/resolution/`: its lock stays
        there for a dry run to show, and moves with a run into the run's folder."""
        import shutil

        folder = self.t.store.env_dir / "resolution"
        shutil.rmtree(folder, ignore_errors=True)
        self.say("── resolve (what uv picks against the live environment)")
        self.resolution = self.host.resolve(self.t.recipe, self.t.env, folder=folder, say=self.say)
        for h in self.resolution.held_back:
            self.say(f"   held back: {h.summary()}")
        return self.resolution.plan

    def _snapshot_cost(self) -> None:
        """What the pre-upgrade snapshot will cost, in the plan; refused before anything is
        stopped when the store's disk cannot hold it."""
        from rewheel.errors import PreflightError
        from rewheel.snapshot import estimate_snapshot
        from rewheel.report import human_bytes

        est = estimate_snapshot(self.t.env, self.t.store, exclude=self.t.recipe.snapshot_exclude)
        if self.report.plan is not None:
            self.report.plan.snapshot_estimate = est
        need = int(est["bytes_to_copy"] * 1.1) + (64 << 20)
        if need > est["store_free"]:
            raise PreflightError(
                f"the snapshot would copy {human_bytes(est['bytes_to_copy'])} ({est['files_to_copy']:,} files no "
                f"RECORD proves) into {self.t.store.snapshots_dir}, which has {human_bytes(est['store_free'])} free",
                hint="free disk there, put the store elsewhere ([snapshots] store), or leave caches out of "
                     "snapshots ([snapshots] exclude); nothing was changed")

    def stop(self) -> None:
        if self.t.recipe.service is None:
            return
        self.svc = ServiceSteps(self.t, self.j, self.report.steps, self.say)
        st = self.svc.status()
        self.svc.check_stoppable(st)  # before anything is changed
        self.was_active = st.up
        self.report.service_before = "active" if st.up else "inactive"
        self.report.service_judged_by = st.judged_by
        self.j.append("note", service_was_active=self.was_active, service_judged_by=st.judged_by)
        if not st.up:
            self.say(f"{self.svc.manager.describe()} is not running: it is not started after the run")
        else:
            self.down_t0 = time.monotonic()
        self.svc.stop()

    def snapshot(self, served: bool = False) -> None:
        """The pre-upgrade snapshot and the patch scan (`served`: taken while the service still
        serves, see `check_snapshot`; its cleanup paths wait for the stop)."""
        from rewheel import patches as patchmod

        with _Step(self, "snapshot", served=served):
            dists = self.t.env.distributions()
            fetcher = self.host.fetcher(self.t.recipe)
            try:
                self.scan = patchmod.scan(self.t.env, store=self.t.store, fetcher=fetcher)
            finally:
                fetcher.close()
            res = take_snapshot(self.t.env, self.t.store, label=f"before run {self.j.id}",
                                status="pre-upgrade", run_id=self.j.id, progress=self.progress, dists=dists,
                                exclude=self.t.recipe.snapshot_exclude)
            self.snap = res.meta
            self.j.append("snapshot", snapshot_id=res.meta.id)
            self.report.snapshot_id = res.meta.id
            self.report.snapshot = res
            self.say(f"snapshot {res.meta.id}: {res.meta.files:,} files, {res.files_linked:,} shared "
                     f"by {res.meta.link_mode}, {res.files_copied:,} copied")
            run_dir = self.j.dir
            self.report.patches = list(self.scan.patches)
            self.report.patch_files = [str(p) for p in patchmod.save_patches(self.scan, run_dir)]
            self.report.hazards = sorted(patchmod.hazard_packages(self.scan))
            if not served:
                self.stash_cleanup()

    def stash_cleanup(self) -> None:
        from rewheel.snapshot import stash_cleanup

        assert self.snap is not None
        if self.t.recipe.cleanup_paths:
            self.report.cleanup = stash_cleanup(self.snap, self.t.recipe.cleanup_paths)
            self.say(f"moved {len(self.report.cleanup)} cleanup path(s) into the snapshot")

    def check_snapshot(self) -> None:
        """A staged run with a service snapshots while the service still serves (`snapshot(
        served=True)`); once it is stopped, one stat walk (what `verify` compares: type, size,
        mtime, mode, link target of every entry) proves the environment still is that snapshot
        — a second or so in the window instead of the patch scan and the snapshot. Anything
        changed meanwhile (an edit, a byte-compiled cache written): the snapshot is taken
        again, in the window, and the first one removed. Cleanup paths move only now."""
        assert self.snap is not None
        with _Step(self, "snapshot-check", snapshot_id=self.snap.id):
            same = _env_matches(self.t, self.snap)
        if not same:
            stale = self.snap
            self.say(f"the environment changed while the service served: snapshot {stale.id} is taken again")
            self.snapshot()
            try:
                self.t.store.delete(stale.id)
            except (OSError, SnapshotError):
                pass  # retention removes it later
        else:
            self.stash_cleanup()

    def reinstall(self) -> None:
        from rewheel import patches as patchmod

        with _Step(self, "reinstall"):
            keep: dict[str, str] = {}
            if self.t.recipe.patch_policy == "keep-old-version":
                keep = {n: self.report.before[n] for n in patchmod.patched_distributions(self.scan)
                        if n in self.report.before}
                if keep:
                    self.say("keeping patched distributions: " + ", ".join(f"{k} {v}" for k, v in keep.items()))
            late = sorted(set(self.report.hazards) - self.cleaned)
            if late:
                self.say("patched files share bytes with uv's cache (the patch changed the cache too): "
                         "cleaning " + ", ".join(late) + " from the cache")
                self.host.clean_cache(late)
            log = self.j.dir / "install.log"
            self.report.logs["install"] = str(log)
            if self.prepared is not None:
                # Exactly the prepared lock, from uv's warm cache (patched packages' entries were
                # cleaned and fetched again before the stop, see `rewarm`). Only a patch found by
                # a snapshot taken again in the window still needs the network.
                offline = not late
                if not offline:
                    self.say("installing with the network: uv's cache entries of patched packages were cleaned")
                # Hard links from the warm cache: seconds, where copying torch and the CUDA
                # libraries takes a minute of downtime; `unshare` copies them once the service
                # answers (a link mode in uv_args is the recipe's choice, left alone).
                self.install_ns = time.time_ns()
                self.installed = self.host.install(
                    self.t.recipe, lock=Path(self.prepared.lock), on_line=self.on_output, log_path=log, keep=keep,
                    also_reinstall=self.report.hazards, offline=offline, sync=self.lock is not None,
                    link_mode="hardlink")
            elif self.lock is None and self.resolution is not None and not keep:
                # The resolution's lock: exactly the plan's versions, whatever the index
                # published since; what the lock leaves out (editable installs) stays.
                self.installed = self.host.install(self.t.recipe, lock=self.resolution.lock, sync=False,
                                                   on_line=self.on_output, log_path=log,
                                                   also_reinstall=self.report.hazards)
            else:
                # --lock FILE (a sync), or `keep-old-version` (its kept versions, known only from
                # the snapshot's patch scan, constrain a resolution of their own).
                self.installed = self.host.install(self.t.recipe, lock=Path(self.lock) if self.lock else None,
                                                   on_line=self.on_output, log_path=log, keep=keep,
                                                   also_reinstall=self.report.hazards)
            fetched = list(getattr(self.installed, "fetched", None) or [])
            if fetched:
                self.report.fetched_after_stop = fetched
                self.j.append("note", fetched_after_stop=fetched)
                if self.prepared is not None:
                    self.say("fetched after the stop (not in uv's cache): " + ", ".join(fetched))

    def rewarm(self) -> None:
        """Staged, before the stop: uv's cache entries of patched packages (`hazards`: the
        patch written in place changed the cached bytes too) are cleaned, and the prepared
        lock built again in a throwaway environment — which fetches their clean wheels — so
        that the swap installs offline, nothing fetched in the window."""
        import shutil

        from rewheel import staging
        from rewheel.errors import InstallError

        hazards = sorted(set(self.report.hazards) - self.cleaned)
        if self.prepared is None or not hazards:
            return
        with _Step(self, "rewarm", packages=hazards):
            self.say("patched files share bytes with uv's cache: cleaning " + ", ".join(hazards)
                     + " from the cache and fetching them again"
                     + (" (the service keeps serving)" if self.report.service_before == "active" else ""))
            self.host.clean_cache(hazards)
            self.cleaned.update(hazards)
            scratch = staging.new_folder(self.t.store.env_dir)
            try:
                build = self.host.prepare(self.t.recipe, self.t.env, folder=scratch, lock=Path(self.prepared.lock),
                                          offline=False, checks=False, on_line=self.on_output, say=self.say)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            if not build.ok:
                failed = build.failed
                raise InstallError("the clean wheels of " + ", ".join(hazards) + " could not be fetched again: "
                                   + (failed.detail.splitlines()[0] if failed and failed.detail else "uv failed"),
                                   hint="check the indexes; the service was not stopped")

    def diff(self) -> None:
        from rewheel import diff as diffmod
        from rewheel import patches as patchmod

        with _Step(self, "diff"):
            self.report.after = self.t.env.versions()
            self.report.attempted = dict(self.report.after)
            self.j.append("installed", versions=self.report.after)
            self._check_planned()
            assert self.snap is not None
            reapply = self.t.recipe.patch_policy == "reapply" and bool(self.scan.patches)
            if self.prepared is not None and not reapply:
                # Staged: the versions now; the installed files (seconds of hashing on a vLLM
                # environment) once the service answers again, or when a failure needs them.
                self.report.changes = diffmod.diff_versions(
                    self.snap.distributions, [d.to_json() for d in self.t.env.distributions()])
                self.files_pending = True
            else:
                self.file_diff()
            if reapply:
                results = patchmod.reapply(self.scan, self.t.env, self.j.dir)
                self.report.reapply = list(results)
                if patchmod.reapply_failed(results):
                    from rewheel.errors import PatchConflict

                    bad = [r for r in results if r.status in ("conflict", "missing")]
                    raise PatchConflict("local patches could not be carried onto the new version: "
                                        + ", ".join(f"{r.path} ({r.status})" for r in bad),
                                        hint=f"conflict files are in {self.j.dir / 'patches'}")

    def _check_planned(self) -> None:
        """The plan is what happened: every version the lock pinned is installed (InstallError,
        so reverted, when uv installed anything else)."""
        from rewheel.errors import InstallError

        if self.prepared is not None and self.lock is None:
            planned = dict(self.prepared.after)
        elif self.resolution is not None and self.lock is None and self.installed is not None \
                and self.t.recipe.patch_policy != "keep-old-version":
            planned = dict(self.resolution.locked)
        else:
            return
        from rewheel.resolution import installed_as_planned

        wrong = installed_as_planned(planned, self.report.after)
        if wrong:
            raise InstallError("the install does not match its plan: " + "; ".join(wrong[:5])
                               + (f"; … {len(wrong) - 5} more" if len(wrong) > 5 else ""),
                               hint=f"uv's output: {self.report.logs.get('install', 'the install log')}")

    def file_diff(self) -> None:
        """The versions and installed files against the pre-upgrade snapshot."""
        from rewheel import diff as diffmod

        assert self.snap is not None
        self.files_pending = False
        try:
            d = diffmod.diff_trees(self.t.env, self.snap, skip={str(self.t.store.home)})
            self.report.changes, self.report.files = d.packages, d.files
            self.report.file_stats = d.stats
        except Exception as exc:  # the file list is informative, never a reason to revert
            self.report.changes = diffmod.diff_versions(
                self.snap.distributions, [d.to_json() for d in self.t.env.distributions()])
            self.report.file_stats = {"error": str(exc)}

    def unshare(self) -> None:
        """Staged, once the service answers: the files the swap linked from uv's cache
        copied to inodes of their own (staging.unshare). Never fails the run."""
        from rewheel import staging

        if self.install_ns is None or any(a.split("=", 1)[0] == "--link-mode" for a in self.t.recipe.install.uv_args):
            return
        t0 = time.monotonic()
        try:
            files, size = staging.unshare(self.t.env, self.install_ns)
        except Exception as exc:  # noqa: BLE001 - the upgrade is kept; the report says what was left
            self.j.append("note", unshare_failed=str(exc))
            self.say(f"(files still shared with uv's cache: {exc})")
            return
        self.report.steps.append(StepRecord.since("unshare", True, t0))
        if files:
            self.say(f"{files:,} installed files ({size / 2**20:,.0f} MiB) no longer share inodes with uv's cache")

    def finish_file_diff(self) -> None:
        """The file diff a staged run deferred, before anything is restored over it."""
        if self.files_pending:
            self.file_diff()

    def smoke(self) -> None:
        from rewheel.errors import SmokeFailed

        if self.t.recipe.smoke is None:
            return
        with _Step(self, "smoke"):
            log = self.j.dir / "smoke.log"
            self.report.logs["smoke"] = str(log)
            res = self.host.smoke(self.t.recipe, log_path=log, on_line=self.on_output)
            if not res.ok:
                self.diagnose_file(log)
                why = f"timed out after {self.t.recipe.smoke.timeout_s}s" if res.timed_out else f"exited {res.returncode}"
                raise SmokeFailed(f"smoke test {why}" + cause_text(self.report.root_cause), hint=f"full log: {log}")

    def start(self) -> None:
        from rewheel.errors import ServiceError

        if self.svc is None:
            return
        if not self.was_active:
            # A service that was stopped is not started by a run: the smoke test is the check.
            self.svc.skip_start("the service was not running before the run: not started, "
                                "its health check skipped")
            return
        try:
            self.report.service = self.svc.start_and_verify()
        except ServiceError:
            self.diagnose_service()
            raise

    def keep(self) -> None:
        with _Step(self, "keep"):
            assert self.snap is not None
            self.snap.extra["upgraded_to"] = self.report.after
            self.snap.save()
            reinstalled = bool(getattr(self.installed, "changes", None))
            self.report.status = kept_status(self.report.before, self.report.after, reinstalled)
            pruned = self.t.store.prune(self.t.recipe.keep, protected_snapshots(self.t.store) | {self.snap.id})
            self.report.pruned = pruned
            if pruned:
                self.say("pruned old snapshots ([snapshots] keep): " + pruned_text(self.t.store, pruned))

    # -- staging ----------------------------------------------------------------------------
    def prepare(self, prepare_only: bool) -> bool:
        """Prepare the upgrade while the service still serves (staging.build through the host):
        the exact lock, every wheel in uv's cache, the build and its CPU checks in a throwaway
        environment. Returns whether the swap follows; a build that fails a check ends the run
        here as `rejected` (journaled, diagnosed, the service untouched), `--prepare-only` as
        `prepared`."""
        import shutil

        from rewheel import diff as diffmod
        from rewheel import staging

        t = self.t
        t0 = time.monotonic()
        if t.recipe.service is not None:
            # The state before the run, for what the report says of the service when the run
            # ends before its stop (rejected, prepared); the stop reads it again.
            st = self.host.manager(t.recipe.service, t.store.env_dir, t.recipe.python).status()
            self.report.service_before, self.report.service_judged_by = ("active" if st.up else "inactive"), st.judged_by
        served = self.report.service_before == "active"
        self.say("── prepare" + (" (the service keeps serving)" if served else ""))
        # What the prepared build is made from, taken before it is built.
        fingerprint, digest = staging.env_fingerprint(t.env), staging.recipe_digest(t.recipe)
        live = [d.to_json() for d in t.env.distributions()]
        new = staging.new_folder(t.store.env_dir)
        lock = Path(self.lock) if self.lock else self.resolution.lock if self.resolution is not None else None
        if self.resolution is not None:
            # The resolution's log goes with the prepared state it made.
            (new / "logs").mkdir(parents=True, exist_ok=True)
            for name in ("resolve.log", "resolved.txt"):
                if (self.resolution.lock.parent / name).is_file():
                    shutil.copyfile(self.resolution.lock.parent / name, new / "logs" / name)
        build = self.host.prepare(t.recipe, t.env, folder=new, lock=lock,
                                  offline=False, checks=True, on_line=self.on_output, say=self.say)
        prepared = staging.Prepared(
            created=time.time(), recipe=t.label, recipe_sha256=digest, env_fingerprint=fingerprint,
            uv_settings=staging.uv_settings(), uv_version=self.host.uv_version(),
            source=f"lock {self.lock}" if self.lock else "resolved", lock=build.lock,
            reinstall=t.recipe.install.reinstall, before=dict(self.report.before), after=build.versions,
            checks=build.checks, folder=str(new), package=build.package, ok=build.ok)
        self.report.prepared = prepared
        if build.distributions:
            self.report.changes = diffmod.diff_versions(live, build.distributions)
            self.report.attempted = dict(build.versions)
        self.report.steps.append(StepRecord.since("prepare", build.ok, t0))
        if not build.ok:
            self._reject(build, new)
            return False
        staging.save(t.store.env_dir, new, prepared)
        self.prepared = prepared
        self.say(f"prepared: {len(build.versions)} distribution(s) locked in {prepared.lock}, "
                 "every wheel in uv's cache, the checks passed")
        if prepare_only:
            self.report.status = "prepared"
            j = RunJournal.create(t.store.env_dir, "run", recipe=t.label, lock=self.lock, before=self.report.before,
                                  prepare_only=True)
            j.append("step", name="prepare")
            j.append("finished", status="prepared", before=self.report.before, prepared=prepared.lock,
                     downtime=None)
            self.report.run_id, self.report.run_dir = j.id, str(j.dir)
            return False
        return True

    def _reject(self, build: Any, new: Path) -> None:
        """A prepared build failed a check: the run ends `rejected`, with the failing check's
        root cause and the diff of what would have changed; its logs move into the run's
        folder. The service was never stopped, the environment never touched."""
        import shutil

        from rewheel import diagnose
        from rewheel.errors import PrecheckFailed

        t = self.t
        failed = build.failed
        self.report.status = "rejected"
        j = RunJournal.create(t.store.env_dir, "run", recipe=t.label, lock=self.lock, before=self.report.before)
        self.j = j
        self.report.run_id, self.report.run_dir = j.id, str(j.dir)
        dest = j.dir / "prepare"
        try:
            (new / "logs").rename(dest)
            build.moved(new / "logs", dest)
            self.report.prepared.checks = build.checks
        except OSError:
            pass
        # The lock the build was made from stays with the run too: the report names it, and
        # its folder is removed below.
        lock_file = Path(build.lock)
        if lock_file.is_file() and str(lock_file).startswith(str(new) + "/"):
            try:
                dest.mkdir(parents=True, exist_ok=True)
                kept = lock_file.rename(dest / lock_file.name)
                self.report.prepared.lock = build.lock = str(kept)
            except OSError:
                pass
        if self.report.prepared.lock.startswith(str(new) + "/"):
            self.report.prepared.lock = ""  # removed with its folder: never named
        shutil.rmtree(new, ignore_errors=True)
        for c in build.checks:
            if c.log:
                self.report.logs[c.name] = c.log
        j.append("step", name="prepare", check=failed.name)
        if failed.log and Path(failed.log).is_file():
            try:
                d = diagnose.analyse_file(failed.log, package=build.package or self._package())
                self.report.root_cause = d.root
                self.report.diagnosis = DiagnosisRecord(failed.log, d.summary())
            except Exception as exc:  # noqa: BLE001 - a diagnosis never masks the failure itself
                self.report.diagnosis = DiagnosisRecord(error=str(exc))
        first = failed.detail.splitlines()[0] if failed.detail else failed.name
        exc = PrecheckFailed(f"the prepared build failed its {failed.name} check: {first}"
                             + cause_text(self.report.root_cause),
                             hint=f"the service was never stopped and {t.env.prefix} is untouched; "
                                  f"log: {failed.log or '(none)'}")
        self.report.failure = Failure.of("prepare", exc)
        self.say(f"rejected: {exc.message}")
        j.append("finished", status="rejected", before=self.report.before, after=self.report.before,
                 attempted=self.report.attempted, check=failed.name, root_cause=_to_json(self.report.root_cause),
                 downtime=None)

    def load_prepared(self) -> None:
        """`--prepared`: the prepared state, refused (PreparedStale, exit 2, nothing changed)
        when there is none, when the recipe, the live environment or uv's settings changed
        since, or when a wheel of its lock left uv's cache — proven by building it again,
        offline, in a throwaway environment (uv's own dry run does not look into the cache)."""
        import shutil

        from rewheel import staging
        from rewheel.errors import PreparedStale

        t = self.t
        t0 = time.monotonic()
        prepared = staging.load(t.store.env_dir)
        if prepared is None:
            raise PreparedStale(f"nothing is prepared for {t.env.prefix}",
                                hint=f"`rewheel run {t.cli_ref} --prepare-only` prepares the upgrade while the "
                                     "service serves; nothing was changed")
        staging.refuse_stale(staging.stale_reasons(prepared, t.recipe, t.env, uv_now=self.host.uv_version),
                             t.cli_ref)
        self.say(f"── checking the prepared upgrade of {prepared.created_iso} against uv's cache (offline)")
        scratch = staging.new_folder(t.store.env_dir)
        try:
            build = self.host.prepare(t.recipe, t.env, folder=scratch, lock=Path(prepared.lock), offline=True,
                                      checks=False, on_line=self.on_output, say=self.say)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if not build.ok:
            failed = build.failed
            raise PreparedStale(f"the prepared upgrade cannot be installed offline: {failed.detail.splitlines()[0]}",
                                hint=f"a wheel of {prepared.lock} is no longer in uv's cache; prepare it again: "
                                     f"`rewheel run {t.cli_ref} --prepare-only`; nothing was changed")
        self.prepared = prepared
        self.report.prepared = prepared
        self.report.steps.append(StepRecord.since("prepared", True, t0))

    def downtime(self) -> Downtime | None:
        """The service's downtime so far (see Downtime); None when it was never stopped."""
        if self.down_t0 is None or self.svc is None:
            return None
        healthy = self.svc.healthy_at
        ongoing = healthy is None or healthy <= self.down_t0
        end = time.monotonic() if ongoing else healthy
        before_revert = self.report.steps
        if self.revert_t0 is not None:
            idx = next((i for i, s in enumerate(self.report.steps) if s.name == "revert"), len(self.report.steps))
            before_revert = self.report.steps[:idx]
        parts = dict.fromkeys(DOWNTIME_PARTS, 0.0)
        names = {"stop": "stop", "snapshot": "snapshot", "reinstall": "install", "smoke": "smoke"}
        # Only what ran in the window: a staged run's snapshot was taken before the stop, and
        # its check (and a snapshot taken again) after it.
        # A step's first run counts (the revert's own stop and start are recorded before it).
        stop_at = next((i for i, s in enumerate(before_revert) if s.name == "stop"), 0)
        counted: set[str] = set()
        for step in before_revert[stop_at:]:
            if step.name == "snapshot-check":
                parts["snapshot"] += step.seconds
            elif step.name in names and step.name not in counted:
                counted.add(step.name)
                parts[names[step.name]] += step.seconds
        first = [st for st in self.svc.starts if st[0] >= self.down_t0
                 and (self.revert_t0 is None or st[0] < self.revert_t0)]
        if first:
            parts["start"], parts["ready"] = first[0][1], first[0][2]
        if self.revert_t0 is not None:
            parts["revert"] = max(0.0, end - self.revert_t0)
        return Downtime(max(0.0, end - self.down_t0), parts, ongoing)

    def record_failure(self, exc: Exception) -> str:
        """Put the failure into the report (at the step the journal last announced); returns
        its message."""
        self.report.failure = Failure.of(self.j.last_step, exc)
        return self.report.failure.message

    # -- diagnosis ------------------------------------------------------------------------
    def _package(self) -> str | None:
        return self.t.env.import_name(self.named)

    def diagnose_file(self, log: Path) -> None:
        from rewheel import diagnose

        try:
            d = diagnose.analyse_file(log, package=self._package())
        except Exception as exc:  # diagnosis must never mask the failure itself
            self.report.diagnosis = DiagnosisRecord(error=str(exc))
            return
        self._suspects(d.root)
        self.report.root_cause = d.root
        self.report.diagnosis = DiagnosisRecord(str(log), d.summary())

    def diagnose_service(self) -> None:
        if self.svc is None:
            return
        root, self.report.diagnosis = service_root_cause(self.svc, self._package())
        if self.report.diagnosis.error is None:  # a failed diagnosis leaves what was found before
            self._suspects(root)
            self.report.root_cause = root

    def _suspects(self, root: RootCause | None) -> None:
        """The changes of this upgrade that the root cause's frames point at (see
        `rewheel.suspects`): set on the root cause before it is reported."""
        from rewheel import diff as diffmod
        from rewheel import suspects as suspectsmod

        if root is None or not root.frames or self.snap is None:
            return
        self.finish_file_diff()
        if not self.report.files:
            return
        try:
            removed = [] if self.t.recipe.patch_policy == "reapply" else self.report.patches
            root.suspects = suspectsmod.find_suspects(
                root.frames, self.report.files, diffmod.change_texts(self.snap), patches=removed,
                patch_files=self.report.patch_files,
                compare_urls={c.name: c.compare_url for c in self.report.changes if c.compare_url})
        except Exception as exc:  # the suspects inform; they never mask the failure itself
            self.say(f"(suspects not computed: {exc})")

    # -- revert ---------------------------------------------------------------------------
    def _keep_failed_state(self, revert: RevertRecord) -> None:
        """Snapshot the failed build before restoring, so it can be diffed and inspected later
        (`rewheel diff TARGET <pre-upgrade> <failed>`). Pristine files are shared by links, so
        this costs little; if it fails, the restore goes ahead anyway."""
        restoring = any(r["event"] == "step" and r.get("name") == "restore" for r in self.j.records)
        if self.j.kind != "run" or self.j.first("failed-snapshot") is not None or restoring:
            # Only a failed upgrade is worth keeping, and only once; never a half-restored one
            # (a revert interrupted in its restore, finished by `resume`).
            return
        try:
            res = take_snapshot(self.t.env, self.t.store, label=f"failed upgrade of run {self.j.id}",
                                status="failed-upgrade", run_id=self.j.id, progress=self.progress,
                                exclude=self.t.recipe.snapshot_exclude)
            self.j.append("failed-snapshot", failed_snapshot_id=res.meta.id)
            revert.failed_snapshot_id = res.meta.id
            self.say(f"kept the failed state as snapshot {res.meta.id} for inspection")
        except Exception as exc:
            revert.failed_snapshot_error = str(exc)

    def interrupted_error(self, exc: BaseException) -> Exception:
        """What a signal in the middle of the swap leaves, said exactly (InterruptedRun, exit 4):
        the step, whether the service is stopped (nothing serves until a resume), and the
        command that finishes it, with the recipe path as the user gave it."""
        from rewheel.errors import InterruptedRun

        how = getattr(exc, "signame", None) or "Ctrl-C"
        ref = self.t.cli_ref
        stopped = any(r.get("event") == "step" and r.get("name") == "stop" for r in self.j.records)
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
        if self.report.status != "reverted" or self.snap is None:
            return
        rv = self.report.revert
        keep = protected_snapshots(self.t.store) | {self.snap.id}
        if rv is not None and rv.failed_snapshot_id:
            keep.add(rv.failed_snapshot_id)
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
        fid = revert.failed_snapshot_id
        if fid is None or _restore_changed(res):
            return
        try:
            self.t.store.delete(fid)
        except (OSError, SnapshotError):
            return  # kept: retention removes it later
        self.j.append("note", failed_snapshot_dropped=fid)
        revert.failed_snapshot_id = None
        revert.failed_snapshot_dropped = fid
        self.say(f"the failed state was the restored state, byte for byte: snapshot {fid} removed")

    def revert(self, reason: str) -> None:
        """Stop, restore the snapshot, move cleanup paths back, start, verify."""
        from rewheel.errors import RestoreError, RewheelError

        t0 = time.monotonic()
        self.revert_t0 = t0
        self.j.append("step", name="revert", reason=reason)
        self.say(f"── revert: {reason}")
        revert = RevertRecord(reason)
        self.report.revert = revert
        try:
            if self.svc is not None:
                self.svc.stop()
            assert self.snap is not None
            self._keep_failed_state(revert)
            self.j.append("step", name="restore", snapshot_id=self.snap.id)
            res = restore_snapshot(self.t.env, self.snap, progress=self.progress, defer_removal=True)
            res.cleanup_restored = unstash_cleanup(self.snap, self.t.recipe.cleanup_paths)
            revert.restore = res
            self.say(f"restored snapshot {self.snap.id}: {res.written:,} files written, "
                     f"{res.deleted:,} removed, {res.verified:,} verified"
                     + (f" ({res.proven_same:,} proven identical, left in place)" if res.proven_same else ""))
            self._drop_identical_failed_state(revert, res)
            self.report.after = self.t.env.versions()
            try:
                if self.svc is not None and self.was_active:
                    try:
                        revert.service = self.svc.start_and_verify()
                    except ServiceError:
                        # Name the cause from the service's log, as for a failed upgrade; a
                        # resume has no upgrade cause of its own, so this is the report's.
                        revert.root_cause, diag = service_root_cause(self.svc, self._package())
                        if self.report.root_cause is None:
                            self.report.root_cause, self.report.diagnosis = revert.root_cause, diag
                        raise
                    self.say("the old service is healthy again")
                elif self.svc is not None:
                    revert.service_skipped = "the service was not running before the run: left stopped"
                    self.say(revert.service_skipped)
            finally:
                discard_displaced(res, self.t.store.home)  # the failed build's folders, into the trash
        except RewheelError as exc:
            revert.error = str(exc)
            self.report.steps.append(StepRecord.since("revert", False, t0))
            self.report.status = "failed"
            cause = f"; its log says{cause_text(revert.root_cause)}" if revert.root_cause else ""
            raise RestoreError(f"revert failed: {exc.message}{cause}",
                               hint=(exc.hint or "") + f"\nthe pre-upgrade snapshot is {self.snap.id if self.snap else '?'}; "
                               f"run `rewheel rollback {self.t.cli_ref} {self.snap.id if self.snap else ''} --yes` "
                               "once the cause is fixed") from exc
        self.report.steps.append(StepRecord.since("revert", True, t0))
        self.report.status = "reverted"


def run(t: Target, *, dry_run: bool = False, lock: str | None = None, no_revert: bool = False,
        prepare_only: bool = False, prepared: bool = False,
        say: Say = _quiet, on_output: Say = _quiet, progress: Progress | None = None,
        confirm: Callable[[RunReport], None] | None = None) -> RunReport:
    """The whole run cycle (docs/run-cycle.md). Returns the report — status "failed" (exit 3) when a revert
    could not verify the old state. Raises for preflight and usage problems (nothing changed)
    and for a failure before the reinstall (the service is put back as it was).

    Staged (`[install] staged`, the default): the upgrade is prepared and pre-checked while the
    service serves — a build that fails there is `rejected` and the service never stops — then
    swapped in offline from uv's cache. `prepare_only` stops after the prepare (`prepared`);
    `prepared` swaps in what an earlier `prepare_only` made, refused when it is stale."""
    from rewheel import staging
    from rewheel.errors import UsageError

    refuse_system_interpreter(t)
    if dry_run and (prepare_only or prepared):
        flag = "--prepare-only" if prepare_only else "--prepared"
        raise UsageError(f"--dry-run and {flag} exclude each other: {flag} changes things, --dry-run never does",
                         hint="`run RECIPE --dry-run` shows the plan; then run with --prepare-only or --prepared")
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
    cyc = _Cycle(t, lock=lock, say=say, on_output=on_output, progress=progress)
    cyc.report.staged = staged
    with EnvLock(t.store.env_dir, "run", prefix=t.env.prefix) as lk:
        journal.refuse_if_interrupted(t.store.env_dir, t.cli_ref)
        if prepared and not dry_run:
            cyc.load_prepared()  # refused here when stale: before the question
        if not cyc.preflight(None if prepare_only else confirm, dry_run):
            return cyc.report
        if staged and not prepared and not cyc.prepare(prepare_only):
            return cyc.report  # rejected, or prepared only: the service was never stopped
        cyc.j = RunJournal.create(t.store.env_dir, "run", recipe=t.label, lock=lock,
                                  before=cyc.report.before, plan=_to_json(cyc.report.plan), staged=staged,
                                  prepared=cyc.prepared.lock if cyc.prepared else None)
        lk.journal = cyc.j  # uv and the smoke test are journaled (pid, group, start time)
        cyc.report.run_id = cyc.j.id
        cyc.report.run_dir = str(cyc.j.dir)
        if cyc.resolution is not None and cyc.prepared is None:
            # The lock the unstaged install uses stays with its run.
            import shutil

            dest = cyc.j.dir / cyc.resolution.lock.name
            shutil.copyfile(cyc.resolution.lock, dest)
            cyc.resolution.moved(dest)
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


def _swap(cyc: _Cycle, no_revert: bool) -> RunReport:
    """Stop, snapshot, install, diff, smoke, start, keep — or revert: the part of the cycle
    the service is down for."""
    from rewheel.errors import RewheelError

    t = cyc.t
    try:
        if cyc.prepared is not None and t.recipe.service is not None:
            cyc.snapshot(served=True)
            cyc.rewarm()
            cyc.stop()
            cyc.check_snapshot()
        else:
            cyc.stop()
            cyc.snapshot()
            cyc.rewarm()
    except Exception as exc:
        # Nothing was installed yet: put the service back as it was and stop here.
        cyc.record_failure(exc)
        _restart_after_abort(cyc)
        cyc.report.downtime = cyc.downtime()
        cyc.j.append("finished", status="failed", error=str(exc), downtime=_to_json(cyc.report.downtime))
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
            cyc.report.status = "failed"
            cyc.unshare()  # left for debugging, and edited in place: not through uv's cache
            cyc.report.after = t.env.versions()
            cyc.report.downtime = cyc.downtime()
            cyc.j.append("finished", status="failed", kept_failed_state=True, before=cyc.report.before,
                         after=cyc.report.after, downtime=_to_json(cyc.report.downtime))
            return cyc.report
        # A signal (Ctrl-C, SIGTERM, SIGHUP) or a kill during the revert leaves the run open in
        # its journal: `resume` finishes the restore. Only an ended revert closes it.
        try:
            cyc.revert(reason)
        except RewheelError as rexc:
            # Exit 3: the report says what failed and what a person must do.
            cyc.report.status = "failed"
            cyc.report.revert = cyc.report.revert or RevertRecord(reason)
            cyc.report.revert.error, cyc.report.revert.hint = rexc.message, rexc.hint
        cyc.report.downtime = cyc.downtime()
        cyc.j.append("finished", status=cyc.report.status, reason=reason,
                     before=cyc.report.before, after=cyc.report.after,
                     root_cause=_to_json(cyc.report.root_cause), downtime=_to_json(cyc.report.downtime))
        cyc.prune_after_revert()
        return cyc.report
    cyc.report.downtime = cyc.downtime()
    cyc.finish_file_diff()  # the service answers already: outside the downtime
    cyc.unshare()
    cyc.j.append("finished", status=cyc.report.status, before=cyc.report.before, after=cyc.report.after,
                 downtime=_to_json(cyc.report.downtime))
    return cyc.report


def _restart_after_abort(cyc: _Cycle) -> None:
    if cyc.svc is not None and cyc.was_active:
        try:
            if cyc.snap is not None:
                unstash_cleanup(cyc.snap, cyc.t.recipe.cleanup_paths)
            cyc.svc.start_and_verify()
        except Exception as exc:  # report the original failure; this one goes in the journal
            cyc.j.append("note", restart_after_abort_failed=str(exc))


# --------------------------------------------------------------------------------------
# resume: finish or undo an interrupted run
# --------------------------------------------------------------------------------------
@dataclass
class ResumeResult:
    status: str  # "nothing-to-resume" | "reverted" | "upgraded" | "aborted" | "restored"
    run_id: str | None
    action: str
    report: RunReport | None = None
    rollback: RollbackResult | None = None
    # Processes the interrupted rewheel had started (uv, the smoke test) that were still
    # running and were stopped before anything was touched.
    stopped_processes: list[StoppedChild] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "run_id": self.run_id, "action": self.action,
                "report": self.report.to_json() if self.report else None,
                "rollback": self.rollback.to_json() if self.rollback else None,
                "stopped_processes": _to_json(self.stopped_processes)}


def resume(t: Target, *, say: Say = _quiet, progress: Progress | None = None) -> ResumeResult:
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
        cyc = _Cycle.from_journal(t, j, say=say, progress=progress)

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
                # Finished all the same (nothing had been changed): a stale record would
                # block every later command with exit 4. The cause comes from its log.
                cyc.report.root_cause, cyc.report.diagnosis = service_root_cause(cyc.svc, cyc._package())
                j.append("finished", status="failed", resumed=True, service_error=exc.message,
                         root_cause=_to_json(cyc.report.root_cause))
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
                     root_cause=_to_json(cyc.report.root_cause))
            # Older interrupted journals below this one describe states already overwritten.
            close_superseded(t.store.env_dir, j)

        # Interrupted again (a signal, a kill): the run stays open for the next `resume`.
        try:
            cyc.revert(f"resuming interrupted {j.kind} {j.id} (last step: {j.last_step})")
        except RewheelError:
            close()
            raise
        close()
        cyc.prune_after_revert()
        return ResumeResult("reverted", j.id, f"restored pre-upgrade snapshot {cyc.snap.id}", cyc.report,
                            stopped_processes=lk.stopped)


# --------------------------------------------------------------------------------------
# smoke: only the smoke test and the health check, against the live environment
# --------------------------------------------------------------------------------------
@dataclass
class SmokeReport:
    ok: bool
    smoke: SmokeResult | None = None
    health: HealthResult | None = None
    root_cause: RootCause | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {f.name: _to_json(getattr(self, f.name)) for f in fields(self)}


def smoke_only(t: Target, *, on_output: Say = _quiet, say: Say = _quiet) -> SmokeReport:
    from rewheel import diagnose
    from rewheel.errors import ServiceError

    journal.refuse_if_interrupted(t.store.env_dir, t.cli_ref)
    rep = SmokeReport(ok=True)
    package = t.env.import_name(t.recipe.install.names)
    if t.recipe.smoke is not None:
        logs = t.store.env_dir / "smoke"
        logs.mkdir(exist_ok=True)
        log = logs / (time.strftime("%Y%m%d-%H%M%S") + ".log")
        res = t.host.smoke(t.recipe, log_path=log, on_line=on_output)
        rep.smoke = res
        if not res.ok:
            rep.ok = False
            rep.root_cause = diagnose.analyse_file(log, package=package).root
    if t.recipe.service is not None:
        mgr = t.host.manager(t.recipe.service, t.store.env_dir, t.recipe.python)
        try:
            rep.health = t.host.wait_ready(mgr, t.recipe.service, client=t.host.client,
                                           started_at=time.time(), on_progress=say)
        except ServiceError as exc:
            rep.ok = False
            rep.error = str(exc)
            result = getattr(exc, "result", None)  # HealthCheckFailed carries what it saw
            rep.health = result
    return rep


# --------------------------------------------------------------------------------------
# pin, unpin, forget: one snapshot by id
# --------------------------------------------------------------------------------------
@dataclass
class PinResult:
    """`pin`/`unpin`: the snapshot, whether it is pinned now, whether that changed."""

    snapshot: SnapshotMeta
    pinned: bool
    changed: bool

    def to_json(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot.id, "label": self.snapshot.label, "status": self.snapshot.status,
                "pinned": self.pinned, "changed": self.changed}


def set_pinned(t: Target, ref: str, pinned: bool) -> PinResult:
    """Pin (or unpin) one snapshot: a pinned one is never pruned by `[snapshots] keep` and
    never forgotten until unpinned. Only its meta.json changes (atomically, under the
    environment's lock, so that no prune runs meanwhile); allowed while a run is
    interrupted, since protecting a snapshot is what an operator may want first."""
    with EnvLock(t.store.env_dir, "unpin" if not pinned else "pin", prefix=t.env.prefix):
        snap = t.store.get(ref)
        changed = snap.pinned != pinned
        if changed:
            if pinned:
                snap.extra["pinned"] = True
            else:
                snap.extra.pop("pinned", None)
            snap.save()
    return PinResult(snap, pinned, changed)


@dataclass
class ForgetResult:
    """`forget`: the snapshot removed, and the disk it alone held (its copied bytes)."""

    snapshot: SnapshotMeta

    def to_json(self) -> dict[str, Any]:
        return {"removed": self.snapshot.id, "label": self.snapshot.label, "status": self.snapshot.status,
                "versions": self.snapshot.versions, "bytes_copied": self.snapshot.bytes_copied}


def forget_target(t: Target, ref: str) -> SnapshotMeta:
    """The snapshot `forget` would remove, refused (exit 2, SnapshotError) when it is pinned
    or an unfinished run still needs it: for the question, before anything is deleted."""
    snap = t.store.get(ref)
    if snap.pinned:
        raise SnapshotError(f"snapshot {snap.id} ({snap.label or snap.status}) is pinned: not removed",
                            hint=f"`rewheel unpin {t.cli_ref} {snap.id}` first; nothing was changed")
    needed = {j.snapshot_id for j in journal.list_runs(t.store.env_dir) if not j.finished and j.snapshot_id}
    if snap.id in needed:
        raise SnapshotError(f"snapshot {snap.id} ({snap.label or snap.status}) is the one an interrupted run "
                            "restores: not removed",
                            hint=f"`rewheel resume {t.cli_ref}` or `rewheel rollback {t.cli_ref}` first; "
                                 "nothing was changed")
    return snap


def forget(t: Target, ref: str) -> ForgetResult:
    """Remove one snapshot from the store (an atomic rename, then the delete): its shared
    files stay in the environment and in the other snapshots that link them."""
    with EnvLock(t.store.env_dir, "forget", prefix=t.env.prefix):
        snap = forget_target(t, ref)
        t.store.delete(snap.id)
    return ForgetResult(snap)


# ---- `rewheel why LOG --run ID | --snapshot A`: the suspects of a log's root cause ----
def _env_dirs(home: Path) -> list[tuple[Path, Path]]:
    """(env_dir, prefix) of every environment rewheel keeps state for."""
    import json

    out: list[tuple[Path, Path]] = []
    envs = home / "envs"
    if not envs.is_dir():
        return out
    for d in sorted(envs.iterdir()):
        try:
            prefix = json.loads((d / "env.json").read_text(encoding="utf-8"))["prefix"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out.append((d, Path(prefix)))
    return out


def _interpreter(prefix: Path) -> Environment:
    for rel in ("bin/python", "bin/python3", "python.exe", "Scripts/python.exe"):
        if (prefix / rel).exists():
            return Environment.inspect(prefix / rel)
    raise SnapshotError(f"no Python interpreter in {prefix}: cannot compare a snapshot with it",
                        hint="the environment was removed or moved; `rewheel diff TARGET A B` compares two snapshots")


def suspects_for(diag: Any, *, run_id: str | None = None, snapshot: str | None = None,
                 home: Path | None = None) -> None:
    """Set the suspects of `diag`'s root cause from an upgrade rewheel knows: a run (`run_id`:
    its pre-upgrade snapshot against the failed state it kept, else the live environment;
    the local patches it saved), or a snapshot (`snapshot`: it against the live environment
    of its environment). Raises UsageError when the run or snapshot is nowhere."""
    from rewheel import diff as diffmod
    from rewheel import suspects as suspectsmod
    from rewheel.errors import UsageError
    from rewheel.recipe import load_recipe

    root = getattr(diag, "root", None)
    home = home or state_home()
    found: list[tuple[Store, SnapshotMeta, SnapshotMeta | None, Path | None, Path]] = []
    for env_dir, prefix in _env_dirs(home):
        if run_id is not None:
            run_dir = env_dir / "runs" / run_id
            if not (run_dir / "journal.jsonl").is_file():
                continue
            j = RunJournal.load(run_dir)
            if j.snapshot_id is None:
                raise UsageError(f"run {run_id} took no snapshot: there is no upgrade to compare the crash with",
                                 hint=f"its journal: {run_dir / 'journal.jsonl'}")
            store = Store(prefix, home)
            failed = (j.first("failed-snapshot") or {}).get("failed_snapshot_id")
            found.append((store, store.get(j.snapshot_id), store.get(failed) if failed else None, run_dir, prefix))
        else:
            assert snapshot is not None
            store = Store(prefix, home)
            try:
                found.append((store, store.get(snapshot), None, None, prefix))
            except SnapshotError:
                continue
    what = f"run {run_id}" if run_id is not None else f"snapshot {snapshot!r}"
    if not found:
        envs = [f"`rewheel history --python {p}/bin/python`" for _, p in _env_dirs(home)][:3]
        raise UsageError(f"no {what} in {home}",
                         hint=" or ".join(envs) + " lists the runs and snapshots" if envs
                         else "rewheel has recorded no run or snapshot here yet")
    if len(found) > 1:
        raise UsageError(f"{what} is ambiguous: it exists for " + ", ".join(str(f[4]) for f in found),
                         hint=f"give the full snapshot id (`rewheel history --python {found[0][4]}/bin/python` "
                              "lists them)")
    if root is None or not root.frames:
        return
    store, old, new, run_dir, prefix = found[0]
    env = _interpreter(prefix)
    d = diffmod.diff_trees(env, old, new, skip={str(store.home)})
    patches: list[suspectsmod.SavedPatch] = []
    patch_files: list[str] = []
    if run_dir is not None and (run_dir / "patches" / "patches.json").is_file():
        import json

        recipe_path = (RunJournal.load(run_dir).first("started") or {}).get("recipe")
        policy = None
        try:
            policy = load_recipe(recipe_path, check_interpreter=False).patch_policy if recipe_path else None
        except Exception:  # a recipe moved or changed since: its patches count as removed
            policy = None
        if policy != "reapply":
            saved = json.loads((run_dir / "patches" / "patches.json").read_text(encoding="utf-8")).get("patches", [])
            patches = [suspectsmod.SavedPatch.from_json(p) for p in saved if isinstance(p, dict)]
            patch_files = [str(p) for p in sorted((run_dir / "patches").glob("*.patch"))]
    root.suspects = suspectsmod.find_suspects(
        root.frames, d.files, diffmod.change_texts(old, new), patches=patches, patch_files=patch_files,
        compare_urls={c.name: c.compare_url for c in d.packages if c.compare_url})
