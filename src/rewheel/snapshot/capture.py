"""Taking a snapshot: walk the environment, name each file's object, store what is new.

Owns: `take_snapshot` and `estimate_snapshot` (the walk they make is `capture_walk`, what
a changed file becomes is `ingest`), how many processes take one (`capture_lanes`), what a
failed snapshot tells a person, and the file copies other modules share (`copy_hashed`,
`copy_plain`, `clone_file`).

What a snapshot costs is what changed since the last one. A live file whose inode, size,
mtime, ctime and mode are those the newest snapshot recorded is the same file, unchanged —
an edit in place changes the ctime even when it puts the mtime back — so its object is that
snapshot's, found without reading, linking or copying anything (git's index works so). Only
the other files are looked at: their sha256 comes from RECORD (or an earlier restore's proof,
or their bytes), and a content already in the store is not stored again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rewheel.environment import Distribution, Environment
from rewheel.errors import SnapshotError, UsageError
from rewheel.paths import fsync_dir
from rewheel.snapshot import privatize
from rewheel.snapshot.capture_walk import CaptureWalk
from rewheel.snapshot.ingest import Dists
from rewheel.snapshot.manifest import Manifest
from rewheel.snapshot.objects import Objects, copy_fd, copy_fd_hashed
from rewheel.snapshot.store import SnapshotMeta, Store
from rewheel.snapshot.tree import Progress, excluded_distribution_file

_FICLONE = 0x40049409


# --------------------------------------------------------------------------------------
# File copies (also used by the restore and the recovery)
# --------------------------------------------------------------------------------------
def clone_file(src: str, dst: str) -> bool:
    """Make dst a copy-on-write clone of src (FICLONE); False where the filesystem has
    none, or src and dst are on different ones (dst is then left absent)."""
    try:
        fi = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fo = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                fcntl.ioctl(fo, _FICLONE, fi)
            finally:
                os.close(fo)
        finally:
            os.close(fi)
        return True
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dst)
        return False


def copy_plain(src: str, dst: str, st: os.stat_result) -> None:
    """Copy src (whose lstat is `st`) to a new file dst in the kernel where it can, and give
    dst src's mtime. For a file whose sha256 is already known (RECORD)."""
    fi = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fo = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            copy_fd(fi, fo, st.st_size)
            os.utime(fo, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fo)
    finally:
        os.close(fi)


def copy_hashed(src: str, dst: str) -> tuple[str, int]:
    """Copy src to dst, returning (sha256 hex, size) of the bytes copied, in one pass. A
    sparse file stays sparse: its holes are hashed as the zeros they read as, not written.
    (Plain descriptors, not Python's buffered files: no terminal check per file opened.)"""
    fi = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fo = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            return copy_fd_hashed(fi, fo)
        finally:
            os.close(fo)
    finally:
        os.close(fi)


# --------------------------------------------------------------------------------------
# Taking a snapshot
# --------------------------------------------------------------------------------------
@dataclass
class SnapshotResult:
    meta: SnapshotMeta
    seconds: float
    files_linked: int
    files_copied: int

    def to_json(self) -> dict[str, Any]:
        m = self.meta
        return {"id": m.id, "path": str(m.path), "files": m.files, "bytes_copied": m.bytes_copied,
                "bytes_linked": m.bytes_linked, "bytes_total": m.bytes_total,
                "link_mode": m.link_mode, "files_linked": self.files_linked,
                "files_copied": self.files_copied, "seconds": round(self.seconds, 3),
                "label": m.label, "status": m.status, "nested_skipped": m.extra.get("nested_skipped", []),
                "files_reused": m.extra.get("files_reused", 0), "bytes_reused": m.extra.get("bytes_reused", 0),
                "files_unchanged": m.extra.get("files_unchanged", 0),
                "files_taken_over": m.extra.get("files_taken_over", 0),
                "files_private": m.extra.get("files_private", 0), "bytes_private": m.extra.get("bytes_private", 0)}


def estimate_snapshot(env: Environment, store: Store, *, dists: list[Distribution] | None = None,
                      exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a snapshot of the environment would cost now, for the plan a person reads
    before saying yes: the walk `take_snapshot` makes, without storing anything. Files
    unchanged since the last snapshot cost nothing; of the rest, a content the store already
    holds costs nothing either, large binaries RECORD proves are hard-linked (no disk), and
    everything else is copied (its bytes, or what a sparse file occupies)."""
    lazy = Dists(env, dists)
    if exclude:
        _refuse_excluded_distributions(env, lazy.records, exclude)
    with Objects(store.env_dir, create=False) as objs:
        w = CaptureWalk(env, store, lazy, exclude, objs if objs.root.is_dir() else None, dry=True)
        w.run()
    ing = w.ingest
    free = shutil.disk_usage(store.snapshots_dir).free
    return {"files": w.files, "bytes_total": w.bytes_total, "files_to_copy": ing.n_copied,
            "bytes_to_copy": ing.bytes_copied, "bytes_reused": ing.bytes_reused, "files_unchanged": w.unchanged,
            "store_free": free, "nested_skipped": w.nested}


def take_snapshot(env: Environment, store: Store, *, label: str = "", status: str = "manual",
                  run_id: str | None = None, progress: Progress | None = None,
                  dists: list[Distribution] | None = None, exclude: tuple[str, ...] = (),
                  take_over: bool = False) -> SnapshotResult:
    """Capture the environment's files into a new snapshot in `store`. `exclude`: globs
    (`[snapshots] exclude`) left out, and left alone by its restore. `take_over`: a
    rollback's undo snapshot, taken just before its restore — files whose bytes the store
    lacks are linked, not copied, and settled after the restore (`privatize`)."""
    t0 = time.monotonic()
    privatize.settle(store.env_dir)  # what an earlier undo snapshot left to settle, first
    lazy = Dists(env, dists)
    if exclude:
        _refuse_excluded_distributions(env, lazy.records, exclude)
    snap_id = secrets.token_hex(4)
    tmp = store.snapshots_dir / f".tmp-{snap_id}"
    try:
        tmp.mkdir(mode=0o700)
    except OSError as exc:  # a full disk already
        raise _snapshot_failed(exc, env, store) from None
    try:
        with Objects(store.env_dir) as objs, _gc_paused():
            w = CaptureWalk(env, store, lazy, exclude, objs, take_over=take_over)
            w.run(progress, lanes=capture_lanes())
        roots = w.roots
        Manifest(roots, w.folders, [os.path.realpath(r.path) for r in roots], list(exclude)).save(
            tmp, same_as=w.prev.man)
        versions, distributions = w.distributions()
        ing = w.ingest
        meta = SnapshotMeta(
            id=snap_id, path=store.snapshots_dir / snap_id, home=store.home, label=label, status=status,
            created=time.time(), prefix=str(env.prefix), python=str(env.python), kind=env.kind,
            versions=versions, distributions=distributions,
            files=w.files, bytes_total=w.bytes_total, bytes_copied=ing.bytes_copied, bytes_linked=w.bytes_linked,
            link_mode=w.link_mode, run_id=run_id,
            extra={**({"nested_skipped": w.nested} if w.nested else {}),
                   **({"files_unchanged": w.unchanged} if w.unchanged else {}),
                   **({"files_reused": ing.n_reused, "bytes_reused": ing.bytes_reused} if ing.n_reused else {}),
                   **({"files_private": ing.n_private, "bytes_private": ing.bytes_private} if ing.n_private else {}),
                   **({"files_taken_over": ing.n_taken, "bytes_taken_over": ing.bytes_taken} if ing.n_taken else {}),
                   **({"links_refused": True} if not ing.can_link else {})})
        if ing.taken:
            privatize.write_record(tmp, ing.taken)
        meta.path = tmp
        meta.save()
        os.rename(tmp, store.snapshots_dir / snap_id)
        fsync_dir(store.snapshots_dir)
        meta.path = store.snapshots_dir / snap_id
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise _snapshot_failed(exc, env, store) from None
        raise
    return SnapshotResult(meta, time.monotonic() - t0, w.n_linked, ing.n_copied)


def capture_lanes() -> int:
    """How many processes take a snapshot: `REWHEEL_RESTORE_LANES` when set (it means the
    same for both: 1 keeps rewheel to one CPU), else two where the system allows."""
    from rewheel.snapshot.lanes import restore_lanes_setting

    forced = restore_lanes_setting()
    return forced if forced is not None else 2


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Tens of thousands of names, numbers and stat results, none of them in a cycle: the
    cyclic collector would only walk them again and again."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _refuse_excluded_distributions(env: Environment, records: dict[str, Any], exclude: tuple[str, ...]) -> None:
    """`[snapshots] exclude` leaves out caches, never a distribution's files or metadata: a
    snapshot without them could not restore it (a rollback would say "restored" and change
    nothing there). Refused before anything is stopped or written (exit 2)."""
    hit = excluded_distribution_file(exclude, str(env.prefix), records)
    if hit is not None:
        glob, rel = hit
        raise UsageError(f"[snapshots] exclude: {glob!r} would leave {rel} out of the snapshot of {env.prefix}, "
                         "and an installed distribution's files or metadata are there",
                         hint="exclude caches only, e.g. \"*.pt\" or \"lib/python3*/site-packages/*/.cache\"; "
                              "nothing was changed")


def _snapshot_failed(exc: OSError, env: Environment, store: Store) -> SnapshotError:
    """What a failed snapshot tells a person: the store's disk is full, or a file of the
    environment cannot be read — both before anything in the environment changed (exit 2;
    the partial snapshot is already removed)."""
    why = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SnapshotError(f"no space left in the store {store.snapshots_dir} while taking the snapshot "
                             f"of {env.prefix}: {why}",
                             hint="free disk there, put the store elsewhere ([snapshots] store or "
                                  "REWHEEL_HOME), or leave caches out ([snapshots] exclude); the partial "
                                  "snapshot was removed; taking it changed nothing in the environment")
    name = os.fsdecode(exc.filename) if exc.filename is not None else None
    if name is not None and not name.startswith(str(store.home)):
        return SnapshotError(f"cannot read {name} to take the snapshot of {env.prefix}: {why}",
                             hint="make it readable by this user, or leave it out of snapshots "
                                  "([snapshots] exclude); taking the snapshot changed nothing in the environment")
    return SnapshotError(f"the snapshot of {env.prefix} into {store.snapshots_dir} failed: {why}"
                         + (f" ({name})" if name else ""),
                         hint="the partial snapshot was removed; taking it changed nothing in the environment")
