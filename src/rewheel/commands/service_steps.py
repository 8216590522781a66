"""The service around a restore or an upgrade (`ServiceSteps`: stop and wait for the GPUs,
start and health-check, each journaled and timed as a step), and the root cause of a start
that failed, read from the service's log."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rewheel.commands.results import DiagnosisRecord, StepRecord
from rewheel.commands.target import Say, Target
from rewheel.errors import ServiceError
from rewheel.journal import RunJournal
from rewheel.records import Healthy, Note, Step
from rewheel.statuses import StepName

if TYPE_CHECKING:
    from rewheel.diagnose import RootCause
    from rewheel.service import HealthResult


class ServiceSteps:
    """The service around a restore or an upgrade: stop (and wait for GPUs), start and verify."""

    def __init__(self, t: Target, j: RunJournal, steps: list[StepRecord], say: Say) -> None:
        self.t = t
        self.j = j
        self.steps = steps
        self.say = say
        self.host = t.host
        spec = t.recipe.service
        assert spec is not None  # made only for a recipe with a [service]
        self.spec = spec
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
        self.j.append(Note(service_start_skipped=reason))
        self.say(reason)
        self.steps.append(StepRecord("start", True, 0.0, skipped=True, reason=reason))

    def verify_running(self, reason: str) -> HealthResult:
        """Health-check the running service without restarting it."""
        from rewheel import service

        t0 = time.monotonic()
        self.j.append(Note(service_not_restarted=reason))
        self.say(f"{reason}; checking {self.manager.describe()} is healthy")
        try:
            health = self.host.wait_ready(self.manager, self.spec, client=self.host.client,
                                          started_at=time.time(), on_progress=self.say)
        except service.HealthCheckFailed:
            self.steps.append(StepRecord.since("health", False, t0))
            raise
        self.steps.append(StepRecord.since("health", True, t0, restarted=False))
        self.j.append(Healthy(detail=health.detail))
        health.restarted = False
        return health

    def stop(self) -> None:
        t0 = time.monotonic()
        self.j.append(Step(name=StepName.STOP, service=self.manager.describe()))
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
        self.j.append(Step(name=StepName.START, service=self.manager.describe()))
        self.say(f"starting {self.manager.describe()}")
        self.started_at = time.time()
        try:
            self.manager.start()
        except BaseException as exc:
            self.starts.append((t0, time.monotonic() - t0, 0.0))
            if isinstance(exc, OSError):
                # Its log or pid record could not be written (a full disk): not started. The
                # OSError is its explicit cause: `out_of_space` reads it there even after the
                # error is raised again elsewhere (a re-raise inside another `except` replaces
                # the implicit context, never the cause).
                raise ServiceError(
                    f"could not start {self.manager.describe()}: {exc.strerror or exc} (writing its log or "
                    f"pid record under {exc.filename or self.t.store.env_dir})",
                    hint="free disk there, then `rewheel resume TARGET`") from exc
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
        self.j.append(Healthy(detail=health.detail))
        return health

    def log_lines(self) -> Any:
        return self.manager.log_lines(self.started_at or time.time())


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
