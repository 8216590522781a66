"""The one restore transaction that revert, rollback and resume share (`Transaction`):
stored bytes an edit damaged recovered before anything is stopped, the restore journaled
and run, cleanup paths moved back, the service started and health-checked if it ran before
(only checked when no byte changed and it still runs; left stopped when it did not run),
the root cause read from its log when it does not come back, and what the restore moved
out of the environment discarded once the service is back.

What comes before it differs by command and stays with the command: a revert stops the
failed build and keeps it as a snapshot; a rollback decides whether anything changes at all
and snapshots the state it replaces (its undo). What a failure means differs too: a revert
raises (exit 3), a rollback reports `service-failed`. The steps here return what happened
as data (`ServiceBack`) and leave the wording to the caller."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rewheel.commands.results import DiagnosisRecord
from rewheel.commands.service_steps import ServiceSteps, service_root_cause
from rewheel.commands.snapshots import restore_changed
from rewheel.commands.target import Say, Target
from rewheel.errors import ServiceError, SnapshotDamaged
from rewheel.journal import RunJournal
from rewheel.snapshot import (PreparedRestore, Progress, RestoreResult, SnapshotMeta, discard_displaced,
                              prepare_restore, restore_snapshot, unstash_cleanup)
from rewheel.records import Note, Step
from rewheel.statuses import StepName

if TYPE_CHECKING:
    from rewheel.diagnose import RootCause
    from rewheel.recovery import Recovery
    from rewheel.service import HealthResult


@dataclass
class ServiceBack:
    """How the service came out of a restore (no `[service]`: all empty)."""
    health: HealthResult | None = None  # started (or, no byte changed, checked): healthy
    left_stopped: bool = False  # it did not run before: not started
    error: ServiceError | None = None  # it did not come back healthy ...
    root_cause: RootCause | None = None  # ... and why, from its log
    diagnosis: DiagnosisRecord | None = None
    stopped_at: float | None = None  # judged unchanged (left running), yet the restore changed files


class Transaction:
    """Restore snapshot `snap` into the target's environment, under journal `j`, with the
    service `svc` (None without a `[service]`) around it. Call, in order: `recover` (before
    anything is stopped; optional), `restore`, `move_back`, `service_back`. `package`: the
    upgraded package's import name, which the diagnosis of a failed start looks for."""

    def __init__(self, t: Target, j: RunJournal, snap: SnapshotMeta, svc: ServiceSteps | None, *, say: Say,
                 progress: Progress | None, package: Callable[[], str | None], checked: bool = False,
                 recovery: Recovery | None = None) -> None:
        self.t, self.j, self.snap, self.svc = t, j, snap, svc
        self.say, self.progress, self.package = say, progress, package
        self.recovery = recovery
        # `recover` ran (here, or before the journal existed: `checked`): a damaged file the
        # restore then meets is not looked for again.
        self._checked = checked

    def recover(self) -> Recovery | None:
        """Stored files an edit in place damaged (one stat each): their bytes found in the
        environment, uv's cache or the recipe's index (uv's default index when it names
        none) and put back into the snapshot, or the command refused (exit 3) — before the
        service is stopped or a file changes. Without it, `restore` does the same once the
        restore's own check of the files it needs refused one, before it changed anything."""
        self._checked = True
        self.recovery = recover_stored_bytes(self.t, self.snap, self.say)
        return self.recovery

    def prepare(self) -> PreparedRestore:
        """The restore compared, checked and staged, nothing in the environment changed (see
        `prepare_restore`): before a service is stopped, so that its downtime holds only the
        commit. Raises what refuses the snapshot (another environment's, a damaged store)."""
        return prepare_restore(self.t.env, self.snap, progress=self.progress)

    def restore(self, *, defer_removal: bool, prepared: PreparedRestore | None = None) -> RestoreResult:
        """Journal the restore, then run it (commit `prepared`, when the caller prepared it and
        the environment is still what it compared). `defer_removal`: what it moves out (a
        failed build's new folders) is deleted by `service_back`, once the service is back up."""
        self.j.append(Step(name=StepName.RESTORE, snapshot_id=self.snap.id))
        if prepared is not None:
            return prepared.commit(defer_removal=defer_removal)
        try:
            return restore_snapshot(self.t.env, self.snap, progress=self.progress, defer_removal=defer_removal)
        except SnapshotDamaged:
            if self._checked:
                raise
            again = recover_stored_bytes(self.t, self.snap, self.say)  # raises the refusal when no source has the bytes
            if again is None or not again.recovered:
                raise
            self.recovery = again
        return restore_snapshot(self.t.env, self.snap, progress=self.progress, defer_removal=defer_removal)

    def move_back(self, res: RestoreResult, *, refused: bool = False) -> None:
        """The recipe's cleanup paths the run moved into the snapshot, moved back (none when
        its entries were `refused`: tampered with, found before anything changed)."""
        res.cleanup_restored = 0 if refused else unstash_cleanup(self.snap, self.t.recipe.cleanup_paths)

    def service_back(self, res: RestoreResult, *, was_up: bool, up_now: bool, stopped: bool) -> ServiceBack:
        """The service after the restore: started and health-checked when it ran before
        (`was_up`) and was stopped for the restore; only health-checked when it still runs
        (`up_now`, not `stopped`) — unless the restore changed files after all, when it is
        stopped and started, so that it does not keep running the bytes it loaded before;
        left stopped when it did not run. A start that fails is diagnosed from its log. What
        the restore moved out goes to the store's trash either way."""
        out = ServiceBack()
        svc = self.svc
        try:
            if svc is None:
                return out
            if not stopped and restore_changed(res):
                self.j.append(Note(unchanged_but_restored=True))
                out.stopped_at = time.monotonic()
                svc.stop()
                stopped = True
            try:
                if not was_up:
                    out.left_stopped = True
                elif not stopped and up_now:
                    out.health = svc.verify_running("no byte changed: the service was not restarted")
                else:
                    out.health = svc.start_and_verify()
            except ServiceError as exc:
                out.error = exc
                out.root_cause, out.diagnosis = service_root_cause(svc, self.package())
        finally:
            # The store's trash: deleted once this has exited, and then what an undo snapshot
            # took over settled (`privatize`), by the same detached process.
            discard_displaced(res, self.t.store.home, settle=self.t.store.env_dir)
        return out


def recover_stored_bytes(t: Target, snap: SnapshotMeta, say: Say) -> Recovery | None:
    """`Transaction.recover` for a command that checks before its journal exists."""
    from rewheel.recovery import recover_before_restore

    inst = t.recipe.install
    # A recipe's indexes — uv's default index when it names none, as its installs use; a bare
    # `--python` rollback reaches for the network only where the environment says nothing.
    indexed = t.recipe.path is not None or bool(inst.index_url or inst.extra_index_urls or inst.find_links)
    return recover_before_restore(t.env, snap, cli_ref=t.cli_ref,
                                  fetcher=(lambda: t.host.fetcher(t.recipe)) if indexed else None, say=say)
