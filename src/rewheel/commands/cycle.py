"""The run cycle's steps (`Cycle`): preflight and the one resolution, stop, snapshot (or,
staged, its check after the stop), reinstall, diff, smoke, start, keep; the downtime they
add up to, and the diagnosis of a failure. The staged preparation is `cycle_staging`, the
revert `cycle_revert`; `run` strings the steps together, `resume` rebuilds an interrupted
cycle from its journal."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewheel.commands.cycle_revert import Reverting
from rewheel.commands.cycle_staging import Staging
from rewheel.commands.results import (DOWNTIME_PARTS, DiagnosisRecord, Downtime, Failure, RunPlan, RunReport,
                                      StepRecord)
from rewheel.commands.service_steps import ServiceSteps, cause_text, service_root_cause
from rewheel.commands.snapshots import protected_snapshots, pruned_text, still_the_snapshot
from rewheel.commands.target import Say, Target
from rewheel.errors import SnapshotError
from rewheel.journal import RunJournal
from rewheel.snapshot import Progress, SnapshotMeta, take_snapshot
from rewheel.records import Installed, Note, SnapshotTaken, Started, Step
from rewheel.statuses import RunStatus, StepName, kept_status

if TYPE_CHECKING:
    from rewheel.diagnose import RootCause


class _Step:
    """Journal a step before it acts; time it; record ok/failed in the report."""

    def __init__(self, run: Cycle, step: Step) -> None:
        self.run, self.step, self.name = run, step, str(step.name)

    def __enter__(self) -> _Step:
        self.t0 = time.monotonic()
        self.run.j.append(self.step)
        self.run.say(f"── {self.name}")
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # Each step ends with its time, as it started with its name — and how: a step cut short
        # by a signal to rewheel (Ctrl-C, SIGTERM) was interrupted, not failed; a smoke test
        # killed from outside was killed, not failed (the report's steps line says so too).
        reason = None
        if exc is None:
            how = "done"
        elif isinstance(exc, KeyboardInterrupt):
            how = reason = f"interrupted ({getattr(exc, 'signame', None) or 'Ctrl-C'})"
        elif getattr(exc, "killed_by", None):
            how = reason = f"killed by {exc.killed_by}"
        else:
            how = "FAILED"
        self.run.report.steps.append(StepRecord.since(self.name, exc is None, self.t0, reason=reason))
        self.run.say(f"   {self.name} {how} in {time.monotonic() - self.t0:.1f}s")


class Cycle(Staging, Reverting):
    """One run's steps, acting on `t` through `t.host`; `from_journal` rebuilds an
    interrupted one for `resume`."""

    def __init__(self, t: Target, *, lock: str | None, say: Say,
                 on_output: Say, progress: Progress | None) -> None:
        self.t = t
        self.host = t.host
        self.lock = lock
        # `--lock FILE` as read at the plan (installer.FrozenLock): `lock` is then its copy.
        self.frozen: Any = None
        # `keep-old-version`: the distributions the plan keeps (a patch scan before the stop).
        self.planned_keep: dict[str, str] | None = None
        self.say = say
        self.on_output = on_output
        self.progress = progress
        self.report = RunReport(status=RunStatus.FAILED, recipe=t.label)
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
                     progress: Progress | None) -> Cycle:
        """The cycle an interrupted run's journal describes: its id, the versions before it,
        whether the service ran before it, its pre-upgrade snapshot (None when it was
        interrupted before taking one)."""
        cyc = cls(t, lock=None, say=say, on_output=say, progress=progress)
        noted = [n.service_was_active for n in j.all(Note) if n.service_was_active is not None]
        cyc.j = j
        cyc.was_active = any(noted)
        cyc.report.run_id = j.id
        started = j.first(Started)
        cyc.report.before = (started.before if started else None) or {}
        if t.recipe.service is not None:
            cyc.svc = ServiceSteps(t, j, cyc.report.steps, say)
            if noted:
                cyc.report.service_before = "active" if cyc.was_active else "inactive"
        cyc.snap = t.store.get(j.snapshot_id) if j.snapshot_id else None
        cyc.report.snapshot_id = j.snapshot_id  # the report (and --json) names what was restored
        return cyc

    # -- steps --------------------------------------------------------------------------
    def preflight(self, confirm: Callable[[RunReport], None] | None, dry_run: bool) -> bool:

        t0 = time.monotonic()
        if not self.t.recipe.install.packages and not self.lock:
            from rewheel.errors import RecipeError

            raise RecipeError(self.t.recipe.source, "install.packages",
                              "missing: a run needs the packages to upgrade (or --lock FILE)",
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
            raise checks.refusal(f"`rewheel check {self.t.cli_ref}` shows every check; nothing was changed")
        if self.prepared is not None:
            from rewheel.staging import planned_swap

            plan = planned_swap(self.prepared, self.t.recipe)
        elif self.lock:
            self._freeze_lock()
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
            self.report.status = RunStatus.PLANNED
            return False
        if confirm:
            confirm(self.report)
        return True

    def _freeze_lock(self) -> None:
        """`--lock FILE`, read once here, at the plan: copied (with its sha256) into
        `<env>/resolution/`, and that copy is what the plan shows, the install installs and the
        installed versions are checked against — a file replaced while the run waits at its
        question or its stop changes nothing (the copy moves into the run's folder)."""
        import shutil

        from rewheel.installer import freeze_lock

        folder = self.t.store.env_dir / "resolution"
        shutil.rmtree(folder, ignore_errors=True)
        self.frozen = freeze_lock(Path(self.lock or ""), folder)
        self.lock = str(self.frozen.path)
        self.say(f"   the lock {self.frozen.source} (sha256 {self.frozen.sha256[:16]}…), read now: "
                 f"{len(self.frozen.versions)} distribution(s), installed from the copy {self.lock}")

    def _resolve(self) -> Any:  # installer.InstallPlan
        """The one resolution (resolution.resolve), made in `<env>/resolution/`: its lock stays
        there for a dry run to show, and moves with a run into the run's folder. Under
        `keep-old-version` the distributions a patch scan finds patched now are pinned at their
        installed versions in it: the kept versions get the guards every plan gets (wheels only,
        no downgrade of a recipe package, installed = plan), decided before the stop."""
        import shutil

        folder = self.t.store.env_dir / "resolution"
        shutil.rmtree(folder, ignore_errors=True)
        recipe = self.t.recipe
        if recipe.patch_policy == "keep-old-version":
            self.planned_keep = self._patched_now()
            recipe = _pinned(recipe, self.planned_keep)
            if self.planned_keep:
                self.say("   keeping patched distributions: "
                         + ", ".join(f"{k} {v}" for k, v in self.planned_keep.items()))
        self.say("── resolve (what uv picks against the live environment)")
        self.resolution = self.host.resolve(recipe, self.t.env, folder=folder, say=self.say)
        for h in self.resolution.held_back:
            self.say(f"   held back: {h.summary()}")
        return self.resolution.plan

    def _patched_now(self) -> dict[str, str]:
        """`keep-old-version`'s kept distributions as the environment has them now (a patch
        scan before the stop; the snapshot's own scan, in the window, must find the same)."""
        from rewheel import patches as patchmod

        fetcher = self.host.fetcher(self.t.recipe)
        try:
            scan = patchmod.scan(self.t.env, store=self.t.store, fetcher=fetcher)
        finally:
            fetcher.close()
        before = self.t.env.versions()
        return {n: before[n] for n in sorted(patchmod.patched_distributions(scan)) if n in before}

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
        self.j.append(Note(service_was_active=self.was_active, service_judged_by=st.judged_by))
        if not st.up:
            self.say(f"{self.svc.manager.describe()} is not running: it is not started after the run")
        else:
            self.down_t0 = time.monotonic()
        self.svc.stop()

    def snapshot(self, served: bool = False) -> None:
        """The pre-upgrade snapshot and the patch scan (`served`: taken while the service still
        serves, see `check_snapshot`; its cleanup paths wait for the stop)."""
        from rewheel import patches as patchmod

        with _Step(self, Step(name=StepName.SNAPSHOT, served=served)):
            dists = self.t.env.distributions()
            fetcher = self.host.fetcher(self.t.recipe)
            try:
                self.scan = patchmod.scan(self.t.env, store=self.t.store, fetcher=fetcher)
            finally:
                fetcher.close()
            self._take(dists)
            run_dir = self.j.dir
            self.report.patches = list(self.scan.patches)
            self.report.patch_files = [str(p) for p in patchmod.save_patches(self.scan, run_dir)]
            self.report.hazards = sorted(patchmod.hazard_packages(self.scan))
            if not served:
                self.stash_cleanup()

    def _take(self, dists: Any = None) -> None:
        """The pre-upgrade snapshot itself (the journal's last `SnapshotTaken` names the one a
        revert or a resume restores)."""
        res = take_snapshot(self.t.env, self.t.store, label=f"before run {self.j.id}",
                            status="pre-upgrade", run_id=self.j.id, progress=self.progress, dists=dists,
                            exclude=self.t.recipe.snapshot_exclude)
        self.snap = res.meta
        self.j.append(SnapshotTaken(snapshot_id=res.meta.id))
        self.report.snapshot_id = res.meta.id
        self.report.snapshot = res
        self.say(f"snapshot {res.meta.id}: {res.meta.files:,} files, {res.files_linked:,} shared "
                 f"by {res.meta.link_mode}, {res.files_copied:,} copied")

    def _drop(self, stale: SnapshotMeta) -> None:
        """A pre-upgrade snapshot taken again: the first one removed (the journal names the new one)."""
        try:
            self.t.store.delete(stale.id)
        except (OSError, SnapshotError):
            pass  # retention removes it later

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
        with _Step(self, Step(name=StepName.SNAPSHOT_CHECK, snapshot_id=self.snap.id)):
            same = still_the_snapshot(self.t, self.snap)
        if not same:
            stale = self.snap
            self.say(f"the environment changed while the service served: snapshot {stale.id} is taken again")
            self.snapshot()
            self._drop(stale)
        else:
            self.stash_cleanup()

    def reinstall(self) -> None:
        from rewheel import patches as patchmod

        with _Step(self, Step(name=StepName.REINSTALL)):
            keep: dict[str, str] = {}
            if self.t.recipe.patch_policy == "keep-old-version":
                keep = {n: self.report.before[n] for n in patchmod.patched_distributions(self.scan)
                        if n in self.report.before}
                if keep:
                    self.say("keeping patched distributions: " + ", ".join(f"{k} {v}" for k, v in keep.items()))
                if self.planned_keep is not None and keep != self.planned_keep:
                    from rewheel.errors import InstallError

                    # Patched since the plan (or unpatched): the plan's lock would replace a
                    # patched file, or keep one it need not. Nothing is installed; reverted.
                    raise InstallError(
                        "the patched distributions changed between the plan and the stop: planned to keep "
                        + (", ".join(f"{k} {v}" for k, v in self.planned_keep.items()) or "none") + "; found "
                        + (", ".join(f"{k} {v}" for k, v in keep.items()) or "none"),
                        hint="run again: the plan is made from the patches as they are then")
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
            elif self.lock is None and self.resolution is not None:
                # The resolution's lock: exactly the plan's versions, whatever the index
                # published since; what the lock leaves out (editable installs) stays. Kept
                # (`keep-old-version`) distributions are pinned in it and not reinstalled.
                self.installed = self.host.install(self.t.recipe, lock=self.resolution.lock, sync=False,
                                                   on_line=self.on_output, log_path=log, keep=keep or None,
                                                   also_reinstall=self.report.hazards)
            else:
                # --lock FILE: a sync to the copy read at the plan.
                self.installed = self.host.install(self.t.recipe, lock=Path(self.lock) if self.lock else None,
                                                   on_line=self.on_output, log_path=log, keep=keep,
                                                   also_reinstall=self.report.hazards)
            fetched = list(getattr(self.installed, "fetched", None) or [])
            if fetched:
                self.report.fetched_after_stop = fetched
                self.j.append(Note(fetched_after_stop=fetched))
                if self.prepared is not None:
                    self.say("fetched after the stop (not in uv's cache): " + ", ".join(fetched))

    def rewarm(self, served: bool = False) -> None:
        """Staged, before the stop: uv's cache entries of patched packages (`hazards`: the
        patch written in place changed the cached bytes too) are cleaned, and the prepared
        lock built again in a throwaway environment — which fetches their clean wheels — so
        that the swap installs offline, nothing fetched in the window. `served`: the
        pre-upgrade snapshot was taken while the service serves, and is taken again after
        the cleaning (see below)."""
        import shutil

        from rewheel import staging
        from rewheel.errors import InstallError

        hazards = sorted(set(self.report.hazards) - self.cleaned)
        if self.prepared is None or not hazards:
            return
        with _Step(self, Step(name=StepName.REWARM, packages=hazards)):
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
            if served and self.snap is not None:
                # Cleaning uv's cache unlinked its side of the patched packages' files: their
                # link counts, so their ctimes, changed after the snapshot recorded them, and
                # the window's check would take it all again. Taken again now, while the
                # service serves (the files themselves are the same: cheap).
                stale = self.snap
                self._take()
                self._drop(stale)

    def diff(self) -> None:
        from rewheel import diff as diffmod
        from rewheel import patches as patchmod

        with _Step(self, Step(name=StepName.DIFF)):
            self.report.after = self.t.env.versions()
            self.report.attempted = dict(self.report.after)
            # When the install began: the distributions an `unshare` handles (a resume finishing
            # a kept run reads it here).
            self.j.append(Installed(versions=self.report.after, install_ns=self.install_ns))
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
        elif self.resolution is not None and self.lock is None and self.installed is not None:
            planned = dict(self.resolution.locked)
        elif self.frozen is not None and self.installed is not None:
            planned = dict(self.frozen.versions)  # `--lock FILE`: what it held at the plan
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
        # Announced, so that a kill in the middle leaves a run `resume` finishes the unshare of.
        self.j.append(Step(name=StepName.UNSHARE, install_ns=self.install_ns))
        try:
            files, size = staging.unshare(self.t.env, self.install_ns)
        except Exception as exc:  # noqa: BLE001 - the upgrade is kept; the report says what was left
            self.j.append(Note(unshare_failed=str(exc)))
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
        with _Step(self, Step(name=StepName.SMOKE)):
            log = self.j.dir / "smoke.log"
            self.report.logs["smoke"] = str(log)
            res = self.host.smoke(self.t.recipe, log_path=log, on_line=self.on_output)
            if not res.ok:
                self.diagnose_file(log)
                killed = getattr(res, "killed_by", None)
                why = (f"timed out after {self.t.recipe.smoke.timeout_s}s" if res.timed_out
                       else f"was killed by {killed} (from outside rewheel: the build was not proven)" if killed
                       else f"exited {res.returncode}")
                exc = SmokeFailed(f"smoke test {why}" + cause_text(self.report.root_cause), hint=f"full log: {log}")
                exc.killed_by = killed  # type: ignore[attr-defined]  # the step line says so
                raise exc

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
        with _Step(self, Step(name=StepName.KEEP)):
            assert self.snap is not None
            self.snap.extra["upgraded_to"] = self.report.after
            self.snap.save()
            reinstalled = bool(getattr(self.installed, "changes", None))
            self.report.status = kept_status(self.report.before, self.report.after, reinstalled)
            pruned = self.t.store.prune(self.t.recipe.keep, protected_snapshots(self.t.store, self.t.recipe.keep) | {self.snap.id})
            self.report.pruned = pruned
            if pruned:
                self.say("pruned old snapshots ([snapshots] keep): " + pruned_text(self.t.store, pruned))

    def downtime(self) -> Downtime | None:
        """The service's downtime so far (see Downtime); None when it was never stopped."""
        if self.down_t0 is None or self.svc is None:
            return None
        healthy = self.svc.healthy_at
        ongoing = healthy is None or healthy <= self.down_t0
        end = time.monotonic() if ongoing or healthy is None else healthy
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
    def package(self) -> str | None:
        return self.t.env.import_name(self.named)

    def diagnose_file(self, log: Path) -> None:
        from rewheel import diagnose

        try:
            d = diagnose.analyse_file(log, package=self.package())
        except Exception as exc:  # diagnosis must never mask the failure itself
            self.report.diagnosis = DiagnosisRecord(error=str(exc))
            return
        self._suspects(d.root)
        self.report.root_cause = d.root
        self.report.diagnosis = DiagnosisRecord(str(log), d.summary())

    def diagnose_service(self) -> None:
        if self.svc is None:
            return
        root, self.report.diagnosis = service_root_cause(self.svc, self.package())
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


def _pinned(recipe: Any, keep: dict[str, str]) -> Any:  # recipe.Recipe
    """The recipe with `keep` (name -> version) pinned among its packages: a kept recipe package
    at its version, any other kept distribution added (`==`), so that the one resolution keeps
    them and guards them as it guards the rest."""
    from dataclasses import replace

    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    if not keep:
        return recipe
    packages: list[str] = []
    for p in recipe.install.packages:
        try:
            name = canonicalize_name(Requirement(p).name)
        except InvalidRequirement:
            packages.append(p)
            continue
        packages.append(f"{name}=={keep[name]}" if name in keep else p)
    named = {canonicalize_name(n) for n in recipe.install.names}
    packages += [f"{n}=={v}" for n, v in keep.items() if n not in named]
    return replace(recipe, install=replace(recipe.install, packages=tuple(packages)))
