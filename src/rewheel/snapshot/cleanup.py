"""Cleanup stashing: `[cleanup]` globs moved out before an upgrade and back on rollback.

Owns: which paths a cleanup glob may never touch (`SYSTEM_FOLDERS`, `cleanup_refusal`),
what the globs match (`cleanup_matches`), and stashing them into a snapshot's folder
(`stash_cleanup`, `unstash_cleanup`, `pending_cleanup`).
"""

from __future__ import annotations

import fnmatch
import glob
import os
import shutil
from typing import Any

from rewheel.errors import SnapshotDamaged, UsageError
from rewheel.snapshot.store import SnapshotMeta

# --------------------------------------------------------------------------------------
# Cleanup paths: moved into a snapshot, moved back on rollback
# --------------------------------------------------------------------------------------
# Folders a cleanup glob may never move (as root), nor anything above or inside the
# environment or rewheel's own state.
SYSTEM_FOLDERS = ("/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/opt", "/proc",
                  "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/tmp", "/usr/local",
                  "/usr/lib", "/usr/bin", "/var/lib", "/var/log", "/mnt", "/media")


def cleanup_refusal(path: str, protected: list[str]) -> str | None:
    """Why a path a cleanup glob matched must not be moved, or None. `protected`: the
    environment's prefix and rewheel's state folder (nothing inside, at or above them)."""
    real = os.path.realpath(path)
    if real in SYSTEM_FOLDERS or os.path.abspath(path) in SYSTEM_FOLDERS:
        return f"{path} is a system folder"
    for p in protected:
        rp = os.path.realpath(p)
        if real == rp or real.startswith(rp.rstrip("/") + "/") or rp.startswith(real.rstrip("/") + "/"):
            return f"{path} is {'inside' if real.startswith(rp.rstrip('/') + '/') else 'or holds'} {p}"
    return None


def cleanup_matches(globs: list[str] | tuple[str, ...], protected: list[str]) -> list[str]:
    """What `[cleanup] paths` would move now; raises UsageError naming the glob and the path
    when any match is a system folder, the environment, rewheel's state, or holds one."""
    found: list[str] = []
    for pattern in globs:
        for src in sorted(glob.glob(pattern)):
            why = cleanup_refusal(src, protected)
            if why is not None:
                raise UsageError(f"[cleanup] paths: {pattern!r} matches {why}; refusing to move it",
                                 hint="narrow the glob to the debris it is meant for, e.g. \"/tmp/*.pt\"")
            if os.path.lexists(src) and src not in found:
                found.append(src)
    return found


def stash_cleanup(snap: SnapshotMeta, globs: list[str] | tuple[str, ...],
                  protected: list[str] | None = None) -> list[dict[str, Any]]:
    """Move files matching the globs into the snapshot (recorded in meta before each move).
    Every match is checked before the first is moved (`cleanup_matches`)."""
    dest = snap.path / "cleanup"
    moved: list[dict[str, Any]] = []
    for src in cleanup_matches(globs, [snap.prefix, str(snap.home), *(protected or [])]):
        if not os.path.lexists(src):
            continue
        dest.mkdir(exist_ok=True, mode=0o700)
        item = {"path": src, "stored": str(len(snap.cleanup)), "bytes": os.lstat(src).st_size}
        snap.cleanup.append(item)
        snap.save()
        shutil.move(src, dest / item["stored"])
        moved.append(item)
    return moved


def _cleanup_item_ok(item: Any, n: int, globs: list[str] | tuple[str, ...], protected: list[str]) -> bool:
    """A stashed cleanup entry that may be moved back: its own slot, an absolute plain path
    that one of the recipe's cleanup globs matches, and not a protected place."""
    if not (isinstance(item, dict) and isinstance(item.get("path"), str) and item.get("stored") == str(n)):
        return False
    path = item["path"]
    if not path.startswith("/") or "\x00" in path or os.path.normpath(path) != path:
        return False
    return any(fnmatch.fnmatchcase(path, g) for g in globs) and cleanup_refusal(path, protected) is None


def unstash_cleanup(snap: SnapshotMeta, globs: list[str] | tuple[str, ...] = ()) -> int:
    """Move stashed cleanup paths back where they were (idempotent). The snapshot's metadata
    is not trusted to say where: each path must still be one the recipe's `[cleanup] paths`
    globs match (a rollback given `--python` alone moves nothing back: `pending_cleanup`)
    and none may be a system folder or the environment; a metadata entry that is not is
    refused (SnapshotDamaged) before anything is moved."""
    protected = [snap.prefix, str(snap.home)]
    if not globs:
        return 0
    bad = [item for n, item in enumerate(snap.cleanup) if not _cleanup_item_ok(item, n, globs, protected)]
    if bad:
        raise SnapshotDamaged(
            f"snapshot {snap.id}: cleanup entr{'y' if len(bad) == 1 else 'ies'} "
            + ", ".join(repr(str(b.get("path") if isinstance(b, dict) else b)[:200]) for b in bad[:3])
            + " in its meta.json match no [cleanup] paths glob of the recipe (or name a protected folder)",
            hint=f"nothing was moved back; inspect {snap.path / 'meta.json'} (the store may have been tampered with)")
    n = 0
    for item in snap.cleanup:
        stored = snap.path / "cleanup" / item["stored"]
        if stored.exists() or stored.is_symlink():
            if not os.path.lexists(item["path"]):
                os.makedirs(os.path.dirname(item["path"]), exist_ok=True)
                shutil.move(str(stored), item["path"])
                n += 1
    return n


def pending_cleanup(snap: SnapshotMeta) -> int:
    """Stashed cleanup paths still in the snapshot (not moved back)."""
    return sum(1 for item in snap.cleanup if isinstance(item, dict)
               and (snap.path / "cleanup" / str(item.get("stored"))).exists())
