"""The commands' results, in one place: what each command returns to the CLI, which renders
it, or prints its `to_json()` for `--json` (docs/reference/json.md), and exits with its
`exit_code`. Plain data: nothing here acts."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from rewheel.statuses import ResumeStatus, RollbackStatus, RunStatus, rollback_exit, run_exit

if TYPE_CHECKING:
    from rewheel.diagnose import RootCause
    from rewheel.diff import FileChange, PackageChange
    from rewheel.installer import InstallPlan
    from rewheel.journal import RunJournal
    from rewheel.patches import Patch, ReapplyResult
    from rewheel.preflight import Check
    from rewheel.proc import StoppedChild
    from rewheel.service import HealthResult
    from rewheel.smoke import SmokeResult
    from rewheel.snapshot import RestoreResult, SnapshotMeta, SnapshotResult


@dataclass
class SnapshotCommandResult:
    result: SnapshotResult
    pruned: list[str]

    def to_json(self) -> dict[str, Any]:
        return {**self.result.to_json(), "pruned": self.pruned}


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
    # The undo snapshot holds a failed build (the rollback replaced one): restored only with --force.
    undo_needs_force: bool = False
    pruned: list[str] = field(default_factory=list)
    # SERVICE_FAILED: the files are the snapshot's, verified, but the service did not come
    # back healthy (exit 3); `root_cause` is read from its log.
    status: RollbackStatus = RollbackStatus.RESTORED
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
        return rollback_exit(self.status)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "snapshot_id": self.snapshot.id, "run_id": self.run_id,
                "restore": self.restore.to_json(), "service": json_value(self.service),
                "versions": self.snapshot.versions, "finished_interrupted_run": self.finished_run,
                "steps": [s.to_json() for s in self.steps], "stopped_processes": json_value(self.stopped_processes),
                "recovered": json_value(self.recovered),
                "undo_snapshot_id": self.undo_snapshot_id, "undo_snapshot_error": self.undo_snapshot_error,
                "pruned": self.pruned, "error": self.error, "hint": self.hint,
                "root_cause": json_value(self.root_cause), "diagnosis": json_value(self.diagnosis),
                "superseded_runs": self.superseded_runs, "downtime": json_value(self.downtime),
                "exit_code": self.exit_code}


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
    # Stored files an edit in place had damaged, recovered before the stop (as a rollback's).
    recovered: Any = None  # recovery.Recovery
    # The state a resume's restore replaced, snapshotted first (an undo point: `pre-rollback`).
    undo_snapshot_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        # Not asdict: it would deep-copy the restore result (with its displaced folders).
        doc = {f.name: json_value(getattr(self, f.name)) for f in fields(self)}
        return {k: v for k, v in doc.items() if v is not None or (k == "hint" and self.error is not None)}


def json_value(value: Any) -> Any:
    """A report's field as JSON: a result object by its own `to_json()`, a list item by item,
    plain data (versions, paths, counters) as it is."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, list):
        return [json_value(v) for v in value]
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
    status: RunStatus
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
        return run_exit(self.status)

    def to_json(self) -> dict[str, Any]:
        # The one place a run's report becomes JSON: each field by its own object's to_json.
        doc = {f.name: json_value(getattr(self, f.name)) for f in fields(self)}
        doc["exit_code"] = self.exit_code
        return doc


@dataclass
class ResumeResult:
    status: ResumeStatus
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
                "stopped_processes": json_value(self.stopped_processes)}


@dataclass
class SmokeReport:
    ok: bool
    smoke: SmokeResult | None = None
    health: HealthResult | None = None
    root_cause: RootCause | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {f.name: json_value(getattr(self, f.name)) for f in fields(self)}


@dataclass
class PinResult:
    """`pin`/`unpin`: the snapshot, whether it is pinned now, whether that changed."""

    snapshot: SnapshotMeta
    pinned: bool
    changed: bool

    def to_json(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot.id, "label": self.snapshot.label, "status": self.snapshot.status,
                "pinned": self.pinned, "changed": self.changed}


@dataclass
class ForgetResult:
    """`forget`: the snapshot removed, and the disk it alone held (its copied bytes)."""

    snapshot: SnapshotMeta

    def to_json(self) -> dict[str, Any]:
        return {"removed": self.snapshot.id, "label": self.snapshot.label, "status": self.snapshot.status,
                "versions": self.snapshot.versions, "bytes_copied": self.snapshot.bytes_copied}
