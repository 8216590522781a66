"""The commands that act on an environment, one module each, every one acting on a `Target`
(a recipe, or a bare `--python` interpreter) under the environment's lock, journaling each
destructive step before it acts, and returning dataclasses; rendering and exit codes belong
to the CLI.

- `target`: `Target`, `open_target`, and the refusals made before anything is touched
  (a system interpreter, a broken SSL_CERT_FILE).
- `results`: every result and report the commands return, and their JSON.
- `service_steps`: the service around a restore or an upgrade (stop, start, verify), and
  the root cause of a start that failed.
- `snapshots`: snapshot, history, pin/unpin, forget; which snapshots pruning keeps.
- `rollback`: rollback; the default rollback snapshot; refusing a failed build.
- `cycle`: the run cycle's steps (`Cycle`), with its staged preparation in
  `cycle_staging` and its revert in `cycle_revert`.
- `run`: `run`, the whole cycle, kept or reverted.
- `resume`: finish or undo an interrupted run.
- `smoke`: the smoke test and the health check alone.
- `why`: the suspects of a log's root cause, from a recorded upgrade.

The entry points the CLI calls are re-exported here. `run`, `rollback` and `resume` name
both a module and its command: here (`commands.run`) the function; reach a module's other
names with `from rewheel.commands.run import ...`.
"""

from __future__ import annotations

from rewheel.commands.results import RollbackResult, RunReport
from rewheel.commands.resume import resume
from rewheel.commands.rollback import default_rollback_snapshot, refuse_failed_build, rollback, rollback_error
from rewheel.commands.run import run
from rewheel.commands.smoke import smoke_only
from rewheel.commands.snapshots import forget, forget_target, history, set_pinned, snapshot_now
from rewheel.commands.target import Target, open_target, refuse_system_interpreter
from rewheel.commands.why import suspects_for

__all__ = ["RollbackResult", "RunReport", "Target", "default_rollback_snapshot", "forget", "forget_target",
           "history", "open_target", "refuse_failed_build", "refuse_system_interpreter", "resume", "rollback",
           "rollback_error", "run", "set_pinned", "smoke_only", "snapshot_now", "suspects_for"]
