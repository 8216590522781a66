"""The words rewheel's state is made of, as types: what a command's result says (`RunStatus`,
`RollbackStatus`, `ResumeStatus`), how a journal ends (`Finished`), the kinds of journal
record (`Event`), and the exit code of each result status.

Each is a `StrEnum`: its members are the very strings the `--json` output, the journals and
the history have always held (the contract), so JSON, `str()` and comparisons with what is
read back from disk are unchanged; what changes is that a misspelt status is a name error,
and a status with no exit code is a type error (`assert_never`), not a quiet exit 3.
"""

from __future__ import annotations

from enum import StrEnum
from typing import assert_never

from rewheel.errors import EXIT_OK, EXIT_REVERTED, EXIT_UNRESTORED


class RunStatus(StrEnum):
    """How `rewheel run` ended (`RunReport.status`)."""

    UPGRADED = "upgraded"        # kept, and a version changed
    REINSTALLED = "reinstalled"  # kept: fresh files at the same versions
    UNCHANGED = "unchanged"      # kept: nothing to do
    PLANNED = "planned"          # --dry-run
    PREPARED = "prepared"        # --prepare-only
    REVERTED = "reverted"        # a check failed; the old state is back and verified
    REJECTED = "rejected"        # the staged build failed its checks before the stop
    FAILED = "failed"            # failed and not put back (or the put-back failed)


class RollbackStatus(StrEnum):
    """How `rewheel rollback` ended (`RollbackResult.status`)."""

    RESTORED = "restored"
    SERVICE_FAILED = "service-failed"  # the files are the snapshot's; the service did not come back


class ResumeStatus(StrEnum):
    """What `rewheel resume` did (`ResumeResult.status`)."""

    NOTHING = "nothing-to-resume"
    UPGRADED = "upgraded"  # a verified upgrade whose recording was interrupted, finished
    ABORTED = "aborted"    # interrupted before anything changed
    REVERTED = "reverted"  # undone from its pre-upgrade snapshot
    RESTORED = "restored"  # an interrupted rollback, run again


class Finished(StrEnum):
    """The `status` of a journal's `finished` record. A journal without one is
    `INTERRUPTED` (never written: it is what a missing record means)."""

    UPGRADED = RunStatus.UPGRADED.value
    REINSTALLED = RunStatus.REINSTALLED.value
    UNCHANGED = RunStatus.UNCHANGED.value
    PREPARED = RunStatus.PREPARED.value
    REJECTED = RunStatus.REJECTED.value
    REVERTED = RunStatus.REVERTED.value
    FAILED = RunStatus.FAILED.value
    ABORTED = "aborted"          # a resumed run that had changed nothing
    RESTORED = "restored"        # a rollback
    REFUSED = "refused"          # a rollback refused before it changed anything
    ROLLED_BACK = "rolled-back"  # an interrupted run a rollback finished
    SUPERSEDED = "superseded"    # an interrupted journal a later command settled
    INTERRUPTED = "interrupted"

    @classmethod
    def of(cls, status: RunStatus) -> Finished:
        """How a run that ended with `status` is journaled."""
        match status:
            case RunStatus.UPGRADED | RunStatus.REINSTALLED | RunStatus.UNCHANGED | RunStatus.PREPARED \
                    | RunStatus.REJECTED | RunStatus.REVERTED | RunStatus.FAILED:
                return cls(status.value)
            case RunStatus.PLANNED:  # a dry run starts no journal
                raise ValueError("a planned run is not journaled")
            case _:
                assert_never(status)


class BisectStatus(StrEnum):
    """How `rewheel bisect` ended (`BisectResult.status`, its journal's `finished` record)."""

    FOUND = "found"              # the first bad build, next to the last good one
    AMBIGUOUS = "ambiguous"      # builds that could not be installed sit next to the first bad one
    GOOD_IS_BAD = "good-is-bad"  # the build named good fails too
    BAD_IS_GOOD = "bad-is-good"  # the build named bad passes
    UNTESTABLE = "untestable"    # the good or the bad build could not be installed


class StepName(StrEnum):
    """A journal's `step` records: what began (`records.Step.name`)."""

    PREPARE = "prepare"                # a staged run's build in a throwaway environment
    STOP = "stop"
    SNAPSHOT = "snapshot"
    SNAPSHOT_CHECK = "snapshot-check"  # a snapshot taken while it served: unchanged since?
    REWARM = "rewarm"                  # clean wheels into uv's cache before the stop
    REINSTALL = "reinstall"
    DIFF = "diff"
    SMOKE = "smoke"
    START = "start"
    KEEP = "keep"
    UNSHARE = "unshare"                # a kept run's files unlinked from uv's cache
    REVERT = "revert"
    RESTORE = "restore"
    ABORT = "abort"                    # `resume` of a run interrupted before it changed anything
    TEST = "test"                      # a bisection: one build tested


class Event(StrEnum):
    """The kinds of journal record (`RunJournal.append`)."""

    STARTED = "started"
    STEP = "step"        # a step begins: written before it acts (name=...)
    NOTE = "note"        # a fact a later command needs (the service's state, ...)
    SNAPSHOT = "snapshot"
    FAILED_SNAPSHOT = "failed-snapshot"
    INSTALLED = "installed"
    HEALTHY = "healthy"
    FINISHED = "finished"
    CHILD = "child"                    # a process rewheel started (uv, the smoke test)
    CHILD_STARTING = "child-starting"
    CHILD_ENDED = "child-ended"
    CANDIDATES = "candidates"          # bisect: the builds it searches
    VERDICT = "verdict"                # bisect: one build tested


# `RollbackResult.undo_snapshot_error` of a rollback told not to take one (`--no-undo`).
UNDO_SKIPPED = "skipped (--no-undo)"


def run_exit(status: RunStatus) -> int:
    """0 kept or planned; 1 not kept, the old state verified; 3 not put back."""
    match status:
        case (RunStatus.UPGRADED | RunStatus.REINSTALLED | RunStatus.UNCHANGED | RunStatus.PLANNED
              | RunStatus.PREPARED):
            return EXIT_OK
        case RunStatus.REVERTED | RunStatus.REJECTED:
            return EXIT_REVERTED
        case RunStatus.FAILED:
            return EXIT_UNRESTORED
        case _:
            assert_never(status)


def rollback_exit(status: RollbackStatus) -> int:
    match status:
        case RollbackStatus.RESTORED:
            return EXIT_OK
        case RollbackStatus.SERVICE_FAILED:
            return EXIT_UNRESTORED
        case _:
            assert_never(status)


def kept_status(before: dict[str, str], after: dict[str, str], reinstalled: bool) -> RunStatus:
    """A kept run's status: `upgraded` only when a version changed; else `reinstalled` (fresh
    files at the same versions) or `unchanged`."""
    if before != after:
        return RunStatus.UPGRADED
    return RunStatus.REINSTALLED if reinstalled else RunStatus.UNCHANGED
