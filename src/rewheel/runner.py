"""The cycle and the commands built on it: snapshot, history, rollback, run, resume.

Everything here acts on a `Target` (a recipe, or a bare `--python` interpreter) under the
environment's lock, journals each destructive step before doing it, and returns
dataclasses; rendering and exit codes belong to the CLI.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rewheel import journal
from rewheel.environment import Environment
from rewheel.errors import SnapshotError
from rewheel.journal import EnvLock, RunJournal, interrupted_error  # noqa: F401 (re-exported)
from rewheel.paths import state_home
from rewheel.recipe import Recipe
from rewheel.snapshot import (Progress, RestoreResult, SnapshotMeta, SnapshotResult, Store,
                              restore_snapshot, take_snapshot, unstash_cleanup)

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass
class Target:
    recipe: Recipe
    env: Environment
    store: Store

    @property
    def label(self) -> str:
        return self.recipe.source

    @property
    def cli_ref(self) -> str:
        return str(self.recipe.path) if self.recipe.path else f"--python {self.recipe.python}"


def open_target(recipe: Recipe) -> Target:
    env = Environment.inspect(recipe.python)
    return Target(recipe, env, Store(env.prefix, recipe.store or state_home()))


def protected_snapshots(store: Store) -> set[str]:
    """Snapshots a pending rollback may need: those of unfinished runs, and the newest
    pre-upgrade one (the default rollback target)."""
    keep = {j.snapshot_id for j in journal.list_runs(store.env_dir) if not j.finished and j.snapshot_id}
    pre = [m for m in store.list() if m.status == "pre-upgrade"]
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


def snapshot_now(t: Target, *, label: str = "", progress: Progress | None = None) -> SnapshotCommandResult:
    with EnvLock(t.store.env_dir, "snapshot"):
        journal.refuse_if_interrupted(t.store.env_dir, t.cli_ref)
        res = take_snapshot(t.env, t.store, label=label, status="manual", progress=progress)
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

    @property
    def interrupted(self) -> RunJournal | None:
        return next((r for r in self.runs if not r.finished), None)

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "snapshots": [s.to_json() for s in self.snapshots],
                "runs": [r.summary() for r in self.runs],
                "interrupted_run": self.interrupted.id if self.interrupted else None}


def history(t: Target) -> History:
    from packaging.utils import canonicalize_name

    names = [canonicalize_name(r.name) for r in t.recipe.install.requirements]
    names += [k for k in KEY_PACKAGES if k not in names]
    return History(t.cli_ref, t.store.list(), journal.list_runs(t.store.env_dir), names)


# --------------------------------------------------------------------------------------
# rollback
# --------------------------------------------------------------------------------------
@dataclass
class RollbackResult:
    snapshot: SnapshotMeta
    restore: RestoreResult
    run_id: str
    service: dict[str, Any] | None = None
    finished_run: str | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"status": "restored", "snapshot_id": self.snapshot.id, "run_id": self.run_id,
                "restore": self.restore.to_json(), "service": self.service,
                "versions": self.snapshot.versions, "finished_interrupted_run": self.finished_run,
                "steps": self.steps}


def default_rollback_snapshot(store: Store) -> SnapshotMeta:
    """The newest snapshot taken before an upgrade; else the newest snapshot at all."""
    interrupted = journal.interrupted_run(store.env_dir)
    if interrupted and interrupted.snapshot_id:
        return store.get(interrupted.snapshot_id)
    metas = store.list()
    if not metas:
        raise SnapshotError("no snapshots exist for this environment",
                            hint="`rewheel snapshot TARGET` takes one")
    pre = [m for m in metas if m.status == "pre-upgrade"]
    return pre[0] if pre else metas[0]


def rollback(t: Target, ref: str | None = None, *, say: Say = _quiet,
             progress: Progress | None = None, service_ops: Any = None) -> RollbackResult:
    """Restore a snapshot; with a recipe that has a service, stop it first and start and
    health-check it after. Finishes an interrupted run as `rolled-back`."""
    with EnvLock(t.store.env_dir, "rollback"):
        snap = t.store.get(ref) if ref else default_rollback_snapshot(t.store)
        interrupted = journal.interrupted_run(t.store.env_dir)
        j = RunJournal.create(t.store.env_dir, "rollback", snapshot_id=snap.id, recipe=t.label)
        steps: list[dict[str, Any]] = []
        svc = service_ops(t, j, steps, say) if service_ops else None
        if svc:
            svc.stop()
        j.append("step", name="restore", snapshot_id=snap.id)
        say(f"restoring snapshot {snap.id} ({snap.label or snap.status}) into {t.env.prefix}")
        t0 = time.monotonic()
        res = restore_snapshot(t.env, snap, progress=progress)
        res.cleanup_restored = unstash_cleanup(snap)
        steps.append({"name": "restore", "ok": True, "seconds": round(time.monotonic() - t0, 3)})
        service_state = None
        if svc:
            service_state = svc.start_and_verify()
        if interrupted is not None:
            interrupted.append("finished", status="rolled-back", by_run=j.id)
        j.append("finished", status="restored", snapshot_id=snap.id)
        return RollbackResult(snap, res, j.id, service_state,
                              interrupted.id if interrupted else None, steps)


def service_ops_for(t: Target) -> Callable[..., Any] | None:
    """The stop/start/verify steps around a restore, when the recipe names a service."""
    if t.recipe.service is None:
        return None
    from rewheel.servicesteps import ServiceSteps

    return lambda target, j, steps, say: ServiceSteps(target, j, steps, say)
