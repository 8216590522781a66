"""The one error hierarchy: every failure a user can cause, with the exit code it maps to.

Exit codes are the product contract: 0 done and verified; 1 verification failed
and the environment was restored and verified; 2 bad usage or recipe, nothing changed;
3 the environment could not be restored (a person must act); 4 another run holds the
environment or an interrupted run must be finished first.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_REVERTED = 1
EXIT_USAGE = 2
EXIT_UNRESTORED = 3
EXIT_BUSY = 4
# A bug in rewheel (an exception no error class describes): the traceback goes to a file the
# message names, never to the terminal. Not 1, which Python itself uses for a crash and
# rewheel for "reverted".
EXIT_INTERNAL = 5
# The answer could not be written: stdout closed (its reader went away) or full. What the
# command did is done and recorded; only what it had to say was lost.
EXIT_OUTPUT = 6


def as_typed(*, add: str = "", drop: str = "") -> str:
    """In a hint: the command line the person typed, with a flag added or dropped — what they
    paste to retry it (`rollback … --yes` refused for a failed build: the same line with
    --force, its --yes kept). The CLI puts their command line in (cli._as_typed); a caller
    without one reads the placeholder."""
    return "<as typed" + (f" +{add}" if add else "") + (f" -{drop}" if drop else "") + ">"


class RewheelError(Exception):
    """Base of every error rewheel reports to a user. `message` says what is wrong,
    naming the file, key, value or command; `hint` says what to do about it."""

    exit_code: int = EXIT_USAGE

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"

    def to_json(self) -> dict[str, object]:
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint,
                "exit_code": self.exit_code}


class UsageError(RewheelError):
    """Bad command-line usage; nothing was changed."""


class RecipeError(RewheelError):
    """A recipe that cannot be loaded or is invalid; names the file and key path."""

    def __init__(self, path: object, key: str | None, problem: str, *, hint: str | None = None):
        where = f"{path}: {key}: " if key else f"{path}: "
        super().__init__(where + problem, hint=hint)
        self.path = str(path)
        self.key = key
        self.problem = problem


class TargetError(RewheelError):
    """The interpreter or environment named as a target is unusable."""


class CommandNotFound(RewheelError):
    """An external executable (uv, systemctl, nvidia-smi...) is not on PATH."""


class PreflightError(RewheelError):
    """A precondition of a run does not hold; nothing was changed."""


class ResolutionRefused(PreflightError):
    """The upgrade's resolution would downgrade a package the recipe upgrades, or build one from an
    sdist: refused before anything is built or stopped (exit 2), with uv's explanation."""


class PreparedStale(RewheelError):
    """`run --prepared` with no prepared upgrade, or one the recipe, the live environment, uv's
    settings or uv's cache no longer match: exit 2, nothing changed."""


class InternalError(RewheelError):
    """An unexpected exception: a bug in rewheel. `traceback_file` holds its traceback."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, *, hint: str | None = None, traceback_file: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.traceback_file = traceback_file

    def to_json(self) -> dict[str, object]:
        return {**super().to_json(), "traceback_file": self.traceback_file}


class ConfirmationRequired(RewheelError):
    """A command that changes an environment was neither confirmed on a terminal nor given --yes."""


class NotConfirmed(ConfirmationRequired):
    """The person answered "no" at the question: their choice, not a failure. Shown as a
    plain note, not as an error; the exit code stays that of `ConfirmationRequired`."""

    is_note = True


class StepFailed(RewheelError):
    """A step of the upgrade (install, smoke, start, health, probe) failed; the runner reverts."""

    exit_code = EXIT_REVERTED


class InstallError(StepFailed):
    """uv failed to install the requested set."""


class SmokeFailed(StepFailed):
    """The smoke test exited non-zero or timed out."""


class PrecheckFailed(StepFailed):
    """A staged build failed a check before the service was stopped (`rejected`, exit 1)."""


class ServiceError(StepFailed):
    """The service could not be stopped, started, or did not become healthy."""


class GpuError(StepFailed):
    """GPUs are missing, or still held by processes after the service stopped."""


class PatchConflict(StepFailed):
    """A local patch could not be carried onto the new version cleanly."""


class SnapshotError(RewheelError):
    """A snapshot that does not exist or cannot be taken."""


class RestoreError(RewheelError):
    """The environment could not be restored; a person must act."""

    exit_code = EXIT_UNRESTORED


class SnapshotDamaged(RestoreError):
    """A snapshot failed its integrity check; it was refused before anything was changed."""


class ServiceRecordDamaged(RestoreError):
    """The record of the service rewheel started (service.json) is not one rewheel wrote: a
    tampered or foreign file. No process is signalled by it; a person must look (exit 3)."""


class UnsafeCleanupPath(RewheelError):
    """A stashed cleanup file would go back through a folder that changed into a symlink
    since it was stashed: refused (exit 2); the file stays in the snapshot."""


class LockHeld(RewheelError):
    """Another rewheel process holds this environment."""

    exit_code = EXIT_BUSY


class JournalDamaged(RewheelError):
    """A run's journal that cannot be read as one (not a regular file, unreadable): exit 2,
    nothing was changed; the message names the file."""


class JournalWriteError(RewheelError):
    """A journal record could not be written whole (a full disk, an I/O error): nothing of it
    was kept, and the step it announced did not start. A person must free the disk and
    `resume` (exit 3)."""

    exit_code = EXIT_UNRESTORED

    def __init__(self, event: str, path: object, exc: OSError) -> None:
        done = ("what the command did is done, but its end is not recorded" if event == "finished"
                else "the step it announced was not started")
        super().__init__(f"cannot write the journal {path} (record {event!r}): {exc.strerror or exc}; {done}",
                         hint="free disk there, then `rewheel resume TARGET` finishes or undoes the run")
        self.path = str(path)
        self.reason = exc.strerror or str(exc)
        self.errno = exc.errno


class DiskFull(RewheelError):
    """A write failed for want of space (ENOSPC, a quota) where no step has a sentence of its
    own for it: exit 3, naming the file. The journal says where the command stopped; once the
    disk is freed, `resume` finishes or undoes it."""

    exit_code = EXIT_UNRESTORED

    def __init__(self, exc: OSError) -> None:
        self.errno = exc.errno
        where = f" writing {exc.filename}" if exc.filename else ""
        super().__init__(f"{exc.strerror or exc}{where}; the command stopped there",
                         hint="free disk there, then `rewheel resume TARGET` finishes or undoes what was "
                              "under way (`rewheel status TARGET` shows it)")


class LinkInState(RewheelError):
    """A symlink where a folder or file of rewheel's own is expected, below the state home or
    the lock folders' base (`owned`): refused before anything is written through it (exit 3,
    naming the link; a person must look at what put it there)."""

    exit_code = EXIT_UNRESTORED

    def __init__(self, path: object, target: str) -> None:
        super().__init__(f"{path} is a symlink (to {target}) inside rewheel's own folders: refusing to read "
                         "or write through it",
                         hint="remove the link: rewheel's folders are its own and it never makes a link there "
                              "(if the link stands for something rewheel kept, move that back in its place); "
                              "nothing was changed")
        self.path = str(path)
        self.target = target

    def to_json(self) -> dict[str, object]:
        return {**super().to_json(), "path": self.path, "target": self.target}


def out_of_space(exc: BaseException | None) -> bool:
    """Whether a failure comes from a full disk (ENOSPC, a quota): the exception itself or any
    it was raised from. Such a failure is the host's passing state, not a verdict: the command
    it cut off stays open in its journal, for `resume` to finish once there is space."""
    import errno

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class InterruptedRun(RewheelError):
    """A previous run was interrupted and must be resumed or rolled back first."""

    exit_code = EXIT_BUSY


class OutputLost(RewheelError):
    """stdout could not take the command's answer (EPIPE: its reader closed it; ENOSPC: a full
    disk or /dev/full): one line on stderr, exit 6 — never a traceback, and never "free disk,
    then resume" for a command that had nothing under way."""

    exit_code = EXIT_OUTPUT

    def __init__(self, exc: OSError) -> None:
        import errno

        why = "closed (its reader went away)" if exc.errno == errno.EPIPE else (exc.strerror or str(exc))
        super().__init__(f"the answer could not be written to stdout: {why}",
                         hint="what the command did is done and recorded; `rewheel history TARGET` shows it")
        self.errno = exc.errno
