"""The staged part of a run (`Staging`, a part of `cycle.Cycle`): the upgrade prepared and
pre-checked while the service still serves; a prepared build that fails a check rejected
before any stop; `--prepared` checked against uv's cache before it is swapped in."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewheel.commands.results import DiagnosisRecord, Failure, RunReport, StepRecord, json_value
from rewheel.commands.service_steps import cause_text
from rewheel.commands.target import Say, Target
from rewheel.host import Host
from rewheel.journal import RunJournal
from rewheel.records import Finish, Started, Step
from rewheel.statuses import Finished, RunStatus, StepName


class Staging:
    """Prepare, reject, load the prepared build: a staged run's steps before its swap."""

    # The cycle's state these steps read and set (`Cycle.__init__` sets it up).
    t: Target
    host: Host
    report: RunReport
    say: Say
    on_output: Say
    lock: str | None
    resolution: Any
    prepared: Any
    j: RunJournal

    if TYPE_CHECKING:
        def package(self) -> str | None: ...

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
        # The lock the run was given, else the one its resolution made (the preflight resolves
        # whenever no lock is given, so one of them is there).
        lock = Path(self.lock) if self.lock else self.resolution.lock if self.resolution is not None else None
        assert lock is not None
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
            self.report.status = RunStatus.PREPARED
            j = RunJournal.create(t.store.env_dir, Started(kind="run", recipe=t.label, lock=self.lock,
                                                           before=self.report.before, prepare_only=True))
            j.append(Step(name=StepName.PREPARE))
            j.append(Finish(status=Finished.PREPARED, before=self.report.before, prepared=prepared.lock))
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
        self.report.status = RunStatus.REJECTED
        j = RunJournal.create(t.store.env_dir,
                              Started(kind="run", recipe=t.label, lock=self.lock, before=self.report.before))
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
        j.append(Step(name=StepName.PREPARE, check=failed.name))
        if failed.log and Path(failed.log).is_file():
            try:
                d = diagnose.analyse_file(failed.log, package=build.package or self.package())
                self.report.root_cause = d.root
                self.report.diagnosis = DiagnosisRecord(failed.log, d.summary())
            except Exception as exc:  # noqa: BLE001 - a diagnosis never masks the failure itself
                self.report.diagnosis = DiagnosisRecord(error=str(exc))
        first = failed.detail.splitlines()[0] if failed.detail else failed.name
        err = PrecheckFailed(f"the prepared build failed its {failed.name} check: {first}"
                             + cause_text(self.report.root_cause),
                             hint=f"the service was never stopped and {t.env.prefix} is untouched; "
                                  f"log: {failed.log or '(none)'}")
        self.report.failure = Failure.of("prepare", err)
        self.say(f"rejected: {err.message}")
        j.append(Finish(status=Finished.REJECTED, before=self.report.before, after=self.report.before,
                        attempted=self.report.attempted, check=failed.name,
                        root_cause=json_value(self.report.root_cause)))

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
            assert failed is not None  # not ok: a check failed
            raise PreparedStale(f"the prepared upgrade cannot be installed offline: {failed.detail.splitlines()[0]}",
                                hint=f"a wheel of {prepared.lock} is no longer in uv's cache; prepare it again: "
                                     f"`rewheel run {t.cli_ref} --prepare-only`; nothing was changed")
        self.prepared = prepared
        self.report.prepared = prepared
        self.report.steps.append(StepRecord.since("prepared", True, t0))
