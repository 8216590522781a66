"""What a restore moved out of an environment, taken away after it is back.

Owns: the store's `trash/` (`TRASH`): `discard_displaced` moves each displaced folder (a
failed build's new dist-info and subpackages) there by one rename and starts a detached
`rm -rf` that deletes it after the command exits; `remove_displaced` deletes in place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rewheel import proc
from rewheel.errors import RewheelError
from rewheel.snapshot import privatize

if TYPE_CHECKING:
    from rewheel.snapshot.restore import RestoreResult

# Under the store's home: what restores moved out of environments, while a detached `rm`
# deletes it (`discard_displaced`); a folder older than this is left from one that was stopped.
TRASH = "trash"
TRASH_STALE_S = 3600.0


def remove_displaced(res: RestoreResult) -> float:
    """Delete what a restore moved out of the environment (a failed build's files)."""
    t0 = time.monotonic()
    for p in res.displaced:
        shutil.rmtree(p, ignore_errors=True)
    res.displaced = []
    res.removal_seconds = time.monotonic() - t0
    return res.removal_seconds


def discard_displaced(res: RestoreResult, home: Path, *, settle: Path | None = None) -> float:
    """Take what a restore moved out of the environment away without waiting for its deletion.

    Each displaced folder leaves by one rename into a fresh folder of the store's `trash`
    (on the environment's filesystem whenever snapshots are hard links), and a detached
    `rm -rf` deletes it there after this command has exited: thousands of unlinks that
    would otherwise hold up the rollback's end. The environment is exact when this returns.
    What cannot be moved (the store on another filesystem) is deleted here, as
    `remove_displaced` does; so is everything when no `rm` can be started.
    `settle`: an environment's store whose taken-over objects (`privatize`) are settled by
    the same detached process, once the trash is gone (it links some of them)."""
    t0 = time.monotonic()
    left, bins = _into_trash(res.displaced, Path(home) / TRASH) if res.displaced else ([], [])
    for p in left:
        shutil.rmtree(p, ignore_errors=True)
    store = settle if settle is not None and privatize.pending(settle) else None
    detached = privatize.settle_detached(store, bins) if store is not None else (not bins or _detach_rm(bins))
    if not detached:  # no process to start: all of it here
        for p in bins:
            shutil.rmtree(p, ignore_errors=True)
        if store is not None:
            privatize.settle(store)
    res.displaced = []
    res.removal_seconds = time.monotonic() - t0
    return res.removal_seconds


def _detach_rm(bins: list[str]) -> bool:
    """`rm -rf` of the trash's folders, left running after this command; False where no `rm`
    could be started."""
    try:
        proc.detach(["rm", "-rf", "--", *bins])
    except (OSError, RewheelError):
        return False
    return True


def _into_trash(paths: list[str], trash: Path) -> tuple[list[str], list[str]]:
    """Move `paths` into a new folder of `trash`: (the paths not moved, the folders of the
    trash to delete — this one and what a deletion stopped before its end left)."""
    try:
        trash.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(trash)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            # A link (or someone else's folder) in its place: its stale entries are not the
            # store's to delete. What was displaced is deleted where it is instead.
            return list(paths), []
        bin_ = tempfile.mkdtemp(prefix="restore-", dir=trash)
    except OSError:
        return list(paths), []
    left = []
    for i, p in enumerate(paths):
        try:
            os.rename(p, os.path.join(bin_, str(i)))
        except OSError:  # another filesystem than the store's (EXDEV)
            left.append(p)
    if len(left) == len(paths):
        with contextlib.suppress(OSError):
            os.rmdir(bin_)
        return left, []
    # What a deletion stopped before its end left (the host went down): swept with this one.
    stale = []
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(trash) as it:
        for d in it:
            with contextlib.suppress(OSError):
                if d.path != bin_ and now - d.stat(follow_symlinks=False).st_mtime > TRASH_STALE_S:
                    stale.append(d.path)
    return left, [bin_, *stale]
