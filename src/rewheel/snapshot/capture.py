"""Taking a snapshot: walk the environment, share what RECORD proves, copy the rest.

Owns: `take_snapshot` and `estimate_snapshot`, the linker (hard link, reflink or copy into
the store), hashed and sparse copies (`copy_hashed`), and reuse of an unchanged copy from
the previous snapshot (`_PreviousCopies`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import stat
import time
from dataclasses import dataclass
from typing import Any

from rewheel.environment import Distribution, Environment
from rewheel.errors import SnapshotDamaged, SnapshotError, UsageError
from rewheel.paths import atomic_write, fsync_dir
from rewheel.snapshot.manifest import Folder, Manifest, ManifestDamaged
from rewheel.snapshot.store import SnapshotMeta, Store, aliased_files
from rewheel.snapshot.tree import (CHUNK, Progress, Root, TIE_HASH_MAX, excluded_distribution_file, exclusion,
                                   hand_editable, hash_file, kind_of, provably_pristine, proven_sha, record_index, safe_rel, scope_of,
                                   shared_paths, walk)

_FICLONE = 0x40049409


# --------------------------------------------------------------------------------------
# Taking a snapshot
# --------------------------------------------------------------------------------------
class _Linker:
    """Share a file's contents with the store: a reflink where the filesystem offers one
    (XFS, btrfs, bcachefs), else a hard link, else a copy.

    A reflink is a copy-on-write clone: an edit later written in place into the live file
    cannot reach the snapshot's copy, as it does through a hard link (one inode). Whether
    clones work between the environment and the store is probed once, on the first shared
    file (one ioctl that fails at once on ext4): where they do, the whole snapshot is
    reflinked; where not, nothing per file is added to the hard-link path."""

    def __init__(self) -> None:
        self.can_link = True
        self.prefer_reflink: bool | None = None  # None: not probed yet
        self.modes: set[str] = set()

    def share(self, src: str, dst: str) -> str:
        if self.prefer_reflink is None:
            self.prefer_reflink = clone_file(src, dst)
            if self.prefer_reflink:
                self.modes.add("reflink")
                return "reflink"
        elif self.prefer_reflink:
            if clone_file(src, dst):
                self.modes.add("reflink")
                return "reflink"
            # A clone refused further down (another filesystem mounted inside the prefix):
            # share this one as the filesystem allows.
        if self.can_link:
            try:
                os.link(src, dst)
                self.modes.add("hardlink")
                return "link"
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES):
                    raise
                self.can_link = exc.errno == errno.EMLINK
        shutil.copyfile(src, dst)
        self.modes.add("copy")
        return "copy"

    def private(self, src: str, dst: str, st: os.stat_result) -> str:
        """A copy of its own for a file a person may edit (`hand_editable`): a reflink where
        the filesystem has them (the store gets its own inode at no disk cost), else a copy
        of the bytes, with the source's mtime. Never a hard link."""
        if self.prefer_reflink is None:
            self.prefer_reflink = clone_file(src, dst)
            cloned = self.prefer_reflink
        else:
            cloned = self.prefer_reflink and clone_file(src, dst)
        if cloned:
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
            self.modes.add("reflink")
            return "reflink"
        copy_plain(src, dst, st)
        self.modes.add("copy")
        return "copy"


def clone_file(src: str, dst: str) -> bool:
    """Make dst a copy-on-write clone of src (FICLONE); False where the filesystem has
    none, or src and dst are on different ones (dst is then left absent)."""
    try:
        with open(src, "rb") as s, open(dst, "wb") as d:
            fcntl.ioctl(d.fileno(), _FICLONE, s.fileno())
        return True
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dst)
        return False


def copy_plain(src: str, dst: str, st: os.stat_result) -> None:
    """Copy src (whose lstat is `st`) to a new file dst in the kernel (copy_file_range: no
    byte passes through this process; where the filesystem shares extents, it may share
    them), and give dst src's mtime. For a file whose sha256 is already known (RECORD)."""
    fi = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fo = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                while os.copy_file_range(fi, fo, max(st.st_size, CHUNK)):
                    pass
            except OSError as exc:  # no in-kernel copy between these two (an older kernel, EXDEV)
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
                    raise
                os.lseek(fi, 0, os.SEEK_SET)
                os.ftruncate(fo, 0)
                os.lseek(fo, 0, os.SEEK_SET)
                while chunk := os.read(fi, CHUNK):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fo, view):]
            os.utime(fo, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fo)
    finally:
        os.close(fi)


_ZEROS = bytes(CHUNK)


def copy_hashed(src: str, dst: str) -> tuple[str, int]:
    """Copy src to dst, returning (sha256 hex, size) of the bytes copied, in one pass. A
    sparse file stays sparse: its holes are hashed as the zeros they read as, not written."""
    h = hashlib.sha256()
    n = 0
    with open(src, "rb") as s, open(dst, "wb") as d:
        st = os.fstat(s.fileno())
        if st.st_blocks * 512 < st.st_size and hasattr(os, "SEEK_DATA"):
            return _copy_sparse(s, d, st.st_size)
        while True:
            chunk = s.read(CHUNK)
            if not chunk:
                break
            h.update(chunk)
            d.write(chunk)
            n += len(chunk)
    return h.hexdigest(), n


def _copy_sparse(s: Any, d: Any, size: int) -> tuple[str, int]:
    """Copy the data extents of a sparse file (SEEK_DATA / SEEK_HOLE) and leave the holes."""
    h = hashlib.sha256()
    fd_in = s.fileno()
    pos = 0
    while pos < size:
        try:
            data = os.lseek(fd_in, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no data after pos, only a hole to the end
                raise
            data = size
        for _ in range(0, data - pos, CHUNK):  # the hole reads as zeros
            h.update(_ZEROS[:min(CHUNK, data - pos - _)])
        if data >= size:
            break
        hole = os.lseek(fd_in, data, os.SEEK_HOLE)
        s.seek(data)
        d.seek(data)
        left = hole - data
        while left > 0:
            chunk = s.read(min(CHUNK, left))
            if not chunk:
                break
            h.update(chunk)
            d.write(chunk)
            left -= len(chunk)
        pos = hole
    d.truncate(size)
    return h.hexdigest(), size


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
                "files_private": m.extra.get("files_private", 0), "bytes_private": m.extra.get("bytes_private", 0)}


def estimate_snapshot(env: Environment, store: Store, *, dists: list[Distribution] | None = None,
                      exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a snapshot of the environment would cost now, for the plan a person reads
    before saying yes: the walk `take_snapshot` makes, without linking or copying. Files no
    RECORD proves are copied, and so are the hand-editable files it proves (`hand_editable`);
    an unchanged one the previous snapshot holds is shared with it instead. The rest are
    shared with the environment at no disk cost (on one filesystem)."""
    dists = dists if dists is not None else env.distributions()
    records = record_index(dists)
    _refuse_excluded_distributions(env, records, exclude)
    roots = scope_of(env)
    previous = _PreviousCopies(store, roots)
    files = to_copy = bytes_to_copy = bytes_reused = bytes_total = 0
    nested: list[str] = []
    src_base = [r.path.rstrip("/") + "/" for r in roots]
    for ri, rel, st in walk(roots, records, {str(store.home)}, nested, exclusion(exclude)):
        if not stat.S_ISREG(st.st_mode):
            continue
        files += 1
        size = st.st_size
        bytes_total += size
        rec = records.get(src_base[ri] + rel)
        # A tie with RECORD's mtime counts as a copy here (a snapshot proves a small one by
        # its bytes): the estimate errs towards more space, never less.
        if rec and rec[0] and provably_pristine(size, st.st_mtime_ns, rec[1], rec[2]):
            if not hand_editable(rel.rpartition("/")[2], size):
                continue
            # Hand-editable: copied, unless the previous snapshot holds it unchanged.
            if previous.holds(ri, rel, st):
                bytes_reused += size
                continue
        elif size >= _REUSE_MIN and previous.holds(ri, rel, st):
            bytes_reused += size
            continue
        to_copy += 1
        # Sparse files are copied sparse: what they occupy, not their length.
        bytes_to_copy += min(size, st.st_blocks * 512)
    free = shutil.disk_usage(store.snapshots_dir).free
    return {"files": files, "bytes_total": bytes_total, "files_to_copy": to_copy,
            "bytes_to_copy": bytes_to_copy, "bytes_reused": bytes_reused, "store_free": free,
            "nested_skipped": nested}


_REUSE_MIN = 64 << 10  # smaller copies cost less than looking for them in the previous snapshot


class _PreviousCopies:
    """The newest earlier snapshot of the same roots, for files a snapshot must copy (no
    RECORD proves them: a model cache, a debug dump written into a package folder): one
    that is still as that snapshot stored it (same size and mtime, a regular file) is linked
    to its stored copy instead of copied again. Stored copies are never written after they
    are made, so snapshots may share them; deleting one snapshot leaves the other's."""

    def __init__(self, store: Store, roots: list[Root]) -> None:
        self.store, self.roots = store, roots
        self._prev: tuple[SnapshotMeta, Manifest] | None | bool = False

    def _load(self) -> tuple[SnapshotMeta, Manifest] | None:
        if self._prev is False:
            self._prev = None
            real = [os.path.realpath(r.path) for r in self.roots]
            for meta in self.store.list():
                try:
                    man = Manifest.load(meta, validate=False)
                except SnapshotDamaged:
                    continue
                if (man.real_roots or [os.path.realpath(r.path) for r in man.roots]) == real:
                    self._prev = (meta, man)
                break
        return self._prev if isinstance(self._prev, tuple) else None

    def _find(self, ri: int, rel: str, st: os.stat_result) -> tuple[SnapshotMeta, Folder, int] | None:
        prev = self._load()
        if prev is None:
            return None
        meta, man = prev
        folder, _, name = rel.rpartition("/")
        f = man.folders.get((ri, folder))
        i = f.index.get(name) if f is not None else None
        if (f is None or i is None or f.types[i] != "f" or f.stored[i] != "C" or f.sizes[i] != st.st_size
                or f.mtimes[i] != st.st_mtime_ns or not safe_rel(rel)):
            return None
        return meta, f, i

    def holds(self, ri: int, rel: str, st: os.stat_result) -> bool:
        return self._find(ri, rel, st) is not None

    def share(self, ri: int, rel: str, st: os.stat_result, dst: str, want: str | None = None) -> str | None:
        """Link dst to the previous snapshot's stored copy of rel; its sha256, or None.
        `want`: the sha256 the file is known to have (RECORD's), which that copy's must be."""
        found = self._find(ri, rel, st)
        if found is None:
            return None
        meta, f, i = found
        try:
            sha = f.sha(i)
            stored = f"{meta.path}/tree/{ri}/{rel}"
            sst = os.lstat(stored)
            if not (stat.S_ISREG(sst.st_mode) and sst.st_size == st.st_size and sst.st_mtime_ns == st.st_mtime_ns
                    and isinstance(sha, str) and (want is None or sha == want)):
                return None
            os.link(stored, dst)
        except (OSError, ManifestDamaged):
            return None
        return sha


class _Aliased:
    """Files a restore proved to hold a snapshot's bytes under a new inode (`aliases.bin`,
    see `SameBytes`): after a rollback over a force-reinstall their mtimes are newer than the
    RECORD put back, so RECORD no longer proves them — but the same inode with the same mtime
    and size still holds the bytes whose sha256 the restore recorded. Linked, not copied."""

    def __init__(self, store: Store, roots: list[Root]) -> None:
        self.store, self.roots = store, roots
        self._by: dict[tuple[int, str], list[Any]] | None = None

    def _load(self) -> dict[tuple[int, str], list[Any]]:
        by: dict[tuple[int, str], list[Any]] = {}
        where = sorted(((os.path.realpath(r.path).rstrip("/") + "/", ri) for ri, r in enumerate(self.roots)),
                       key=lambda w: len(w[0]), reverse=True)  # the innermost root first
        for path, v in aliased_files(self.store).items():
            hit = next(((ri, path[len(base):]) for base, ri in where if path.startswith(base)), None)
            if hit is not None:
                by[hit] = v
        return by

    def sha(self, ri: int, rel: str, st: os.stat_result) -> str | None:
        """The sha256 a restore proved for this very file (inode, mtime, size), else None."""
        if self._by is None:
            self._by = self._load()
        v = self._by.get((ri, rel))
        if v is None or v[0] != st.st_ino or v[1] != st.st_mtime_ns or v[2] != st.st_size:
            return None
        return v[3]


def take_snapshot(env: Environment, store: Store, *, label: str = "", status: str = "manual",
                  run_id: str | None = None, progress: Progress | None = None,
                  dists: list[Distribution] | None = None, exclude: tuple[str, ...] = ()) -> SnapshotResult:
    """Capture the environment's files into a new snapshot in `store`. `exclude`: globs
    (`[snapshots] exclude`) left out, and left alone by its restore."""
    t0 = time.monotonic()
    dists = dists if dists is not None else env.distributions()
    records = record_index(dists)
    _refuse_excluded_distributions(env, records, exclude)
    shared = shared_paths(dists)
    roots = scope_of(env)
    snap_id = secrets.token_hex(4)
    tmp = store.snapshots_dir / f".tmp-{snap_id}"
    tree = tmp / "tree"
    try:
        tree.mkdir(parents=True, mode=0o700)
        for ri in range(len(roots)):
            (tree / str(ri)).mkdir()
    except OSError as exc:  # a full disk already
        shutil.rmtree(tmp, ignore_errors=True)
        raise _snapshot_failed(exc, env, store) from None
    linker = _Linker()
    entries: list[list[Any]] = []
    bytes_total = bytes_copied = bytes_linked = 0
    n_linked = n_copied = n_reused = bytes_reused = 0
    n_private = bytes_private = 0  # hand-editable files RECORD proves: copied (or reflinked, or reused)
    skip = {str(store.home)}
    nested: list[str] = []
    previous = _PreviousCopies(store, roots)
    aliased = _Aliased(store, roots)
    # Plain concatenation, not os.path.join: this loop runs once per file.
    src_base = [r.path.rstrip("/") + "/" for r in roots]
    dst_base = [f"{tree}/{ri}/" for ri in range(len(roots))]
    try:
        for i, (ri, rel, st) in enumerate(walk(roots, records, skip, nested, exclusion(exclude))):
            src = src_base[ri] + rel
            dst = dst_base[ri] + rel
            kind = kind_of(st.st_mode)
            mode = stat.S_IMODE(st.st_mode)
            if kind == "d":
                # walk yields parents first, so the parent already exists in the tree:
                # one mkdir per folder, and no per-file makedirs (3 syscalls a file).
                try:
                    os.mkdir(dst)
                except FileExistsError:
                    pass
                entries.append([ri, rel, "d", mode, 0, st.st_mtime_ns, None, None, None, None])
            elif kind == "l":
                entries.append([ri, rel, "l", mode, 0, 0, None, None, os.readlink(src), None])
            elif kind == "f":
                if not roots[ri].whole:  # RECORD-listed files only: no parent entries walked
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                rec = records.get(src)
                size = st.st_size
                bytes_total += size
                if src in shared:  # several owners: any whose RECORD the file matches proves it
                    sha_shared = proven_sha(src, st, shared[src])
                    rec = (sha_shared, size, st.st_mtime_ns + 1) if sha_shared else None
                pristine = bool(rec and rec[0] and provably_pristine(size, st.st_mtime_ns, rec[1], rec[2]))
                if not pristine:
                    sha_aliased = aliased.sha(ri, rel, st)
                    if sha_aliased is not None:
                        rec, pristine = (sha_aliased, size, st.st_mtime_ns + 1), True
                if pristine or (
                        # Written in the same clock tick as RECORD (INSTALLER, REQUESTED,
                        # uv_cache.json...): not provably older, so prove it by its bytes
                        # (small files) rather than paying for a copy.
                        rec and rec[0] and st.st_mtime_ns == rec[2] and size <= TIE_HASH_MAX
                        and hash_file(src) == rec[0]):
                    assert rec is not None  # pristine, or proven by its bytes: RECORD's entry
                    sha = rec[0]
                    if hand_editable(rel.rpartition("/")[2], size):
                        # Never one inode with the live file: an edit written in place into it
                        # must not reach the snapshot. An unchanged copy the previous snapshot
                        # stored is shared instead (store with store), else a copy of its own.
                        n_private += 1
                        bytes_private += size
                        if previous.share(ri, rel, st, dst, sha) is not None:
                            how = "copy"
                        else:
                            how = linker.private(src, dst, st)
                            bytes_copied += size if how == "copy" else 0
                            bytes_linked += size if how == "reflink" else 0
                            n_copied += how == "copy"
                    else:
                        how = linker.share(src, dst)
                        if how == "link":
                            bytes_linked += size
                            n_linked += 1
                        else:
                            bytes_copied += size if how == "copy" else 0
                            bytes_linked += size if how == "reflink" else 0
                            n_copied += how == "copy"
                            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
                else:
                    how = "copy"
                    sha = previous.share(ri, rel, st, dst) if size >= _REUSE_MIN else None
                    if sha is not None:
                        n_reused += 1
                        bytes_reused += size
                    else:
                        sha, size = copy_hashed(src, dst)
                        bytes_copied += size
                        n_copied += 1
                        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
                # A shared file's inode is the stored one: a restore that finds another inode at
                # that path knows the file was replaced without stat'ing it.
                entries.append([ri, rel, "f", mode, size, st.st_mtime_ns, sha, how, None,
                                st.st_ino if how == "link" else None])
            else:
                entries.append([ri, rel, "o", mode, 0, 0, None, None, None, None])
            if progress and i % 500 == 0:
                progress("snapshot", i, 0)
        manifest = Manifest.of(roots, entries, [os.path.realpath(r.path) for r in roots], list(exclude)).to_json()
        atomic_write(tmp / "manifest.json", json.dumps(manifest, separators=(",", ":")))
        meta = SnapshotMeta(
            id=snap_id, path=store.snapshots_dir / snap_id, home=store.home, label=label, status=status,
            created=time.time(), prefix=str(env.prefix), python=str(env.python), kind=env.kind,
            versions={d.name: d.version_text for d in dists},
            distributions=[d.to_json() for d in dists],
            files=sum(1 for e in entries if e[2] == "f"), bytes_total=bytes_total,
            bytes_copied=bytes_copied, bytes_linked=bytes_linked,
            link_mode="+".join(sorted(linker.modes)) or "none", run_id=run_id,
            extra={**({"nested_skipped": nested} if nested else {}),
                   **({"files_reused": n_reused, "bytes_reused": bytes_reused} if n_reused else {}),
                   **({"files_private": n_private, "bytes_private": bytes_private} if n_private else {})})
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
    return SnapshotResult(meta, time.monotonic() - t0, n_linked, n_copied)


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
