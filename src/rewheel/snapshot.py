"""Snapshots: the store, the manifest, taking one, and restoring one byte for byte.

A snapshot is `<envdir>/snapshots/<id>/` with `meta.json` (label, status, versions,
distributions), `manifest.json` (every file, folder and symlink under the environment's
roots with its mode, size, mtime, the inode a shared file has in common with the store and
— where known — sha256; stored by folder, as columns) and `tree/` (the contents).

Sharing: a file whose bytes provably equal what its wheel installed (RECORD hash known,
size equal, not modified since the install) is hard-linked into the tree (or reflinked,
or copied when the store is on another filesystem), and its hash is taken from RECORD, so
an 8 GB environment is captured without reading 8 GB. Every other file — hand-patched,
unlisted, or of unknown provenance — is copied and hashed while copying, so that editing
it in place later cannot change the snapshot.

Restore compares the live tree with the manifest folder by folder (a shared file found at
another inode was replaced: no stat needed; any other file is stat'ed), checks every stored
file it will use and every manifest entry it acts on, and refuses a damaged snapshot
before anything changes. It then replaces files in place (unlink, link to the stored
inode; copies are staged and renamed in), moves unwanted folders out in one rename each,
resets modes and mtimes, syncs, and verifies every folder it changed. The restore is
idempotent, so a restore interrupted mid-commit is finished by running it again. A large
restore runs in two lanes — this process and a forked one, each owning half the folders —
which both check everything before either commits.
"""

from __future__ import annotations

import binascii
import contextlib
import csv
import errno
import fcntl
import fnmatch
import gc
import glob
import hashlib
import json
import marshal
import os
import re
import secrets
import shutil
import signal
import stat
import struct
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rewheel.environment import Distribution, Environment, RecordEntry
from rewheel.errors import RestoreError, RewheelError, SnapshotDamaged, SnapshotError, UsageError
from rewheel.paths import atomic_write, ensure_private_dir, env_dir, fsync_dir, state_home

MANIFEST_VERSION = 2  # 2: by folder, as columns, with shared inodes; version 1 still loads
_FICLONE = 0x40049409
_CHUNK = 1 << 20
_TIE_HASH_MAX = 1 << 20  # files up to this size with RECORD's mtime are checked by hash
STAGING_PREFIX = ".rewheel-restore-"

Progress = Callable[[str, int, int], None]  # (phase, done, total)


# --------------------------------------------------------------------------------------
# Scope: which paths of an environment a snapshot owns
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Root:
    path: str
    whole: bool  # True: every file below; False: only files some RECORD lists


def scope_of(env: Environment) -> list[Root]:
    roots = [Root(str(r), True) for r in env.roots]
    if env.kind == "system":
        roots.append(Root(str(env.scripts_dir), False))
    return roots


def _shared_paths(dists: list[Distribution]) -> dict[str, list[tuple[str | None, int | None, int]]]:
    """Paths several distributions' RECORDs list -> every owner's (sha256, size, install
    time). Such a file holds the bytes of whichever wrote it last — not always the one
    whose RECORD is newest (one uv run installs in parallel) — so it is proven by any owner
    whose RECORD it matches."""
    seen: set[str] = set()
    multi: set[str] = set()
    for d in dists:
        for e in d.record:
            if e.path in seen:
                multi.add(e.path)
            else:
                seen.add(e.path)
    owners: dict[str, list[tuple[str | None, int | None, int]]] = {}
    if multi:  # a few paths: their owners in full
        for d in dists:
            t = d.install_time_ns
            for e in d.record:
                if e.path in multi:
                    owners.setdefault(e.path, []).append((e.sha256_hex, e.size, t))
    return owners


def _proven_sha(src: str, st: os.stat_result, owners: list[tuple[str | None, int | None, int]]) -> str | None:
    """The sha256 a file several distributions ship provably has, or None (copy it): the
    owners it could be (size equal, not modified after that owner's RECORD) agree, else
    its bytes decide."""
    fits = {o[0] for o in owners if o[0] and o[1] == st.st_size and st.st_mtime_ns <= o[2]}
    if len(fits) == 1 and all(st.st_mtime_ns < o[2] for o in owners if o[0] in fits):
        return fits.pop()
    if fits:
        h = hash_file(src)
        return h if h in fits else None
    return None


def _record_index(dists: list[Distribution]) -> dict[str, tuple[str | None, int | None, int]]:
    """abs path -> (sha256 hex from RECORD, size from RECORD, install time of its dist)."""
    index: dict[str, tuple[str | None, int | None, int]] = {}
    for d in dists:
        t = d.install_time_ns
        for e in d.record:
            # A path two distributions ship holds the bytes of the one installed last: only
            # its RECORD can prove the file (the other's was overwritten after it was written).
            prev = index.get(e.path)
            if prev is None or prev[2] <= t:
                index[e.path] = (e.sha256_hex, e.size, t)
    return index


def nested_prefix(path: str, rel: str, root: str) -> bool:
    """A folder inside an environment that is another environment (a venv with its own
    `pyvenv.cfg`, a conda env with its own `conda-meta`), or a conda base's package cache
    (`pkgs/` beside `conda-meta/`): not this environment's files, so never captured,
    reverted or removed by its snapshots."""
    if os.path.lexists(f"{path}/pyvenv.cfg") or os.path.isdir(f"{path}/conda-meta"):
        return True
    return rel == "pkgs" and os.path.isdir(f"{root}/conda-meta")


def exclusion(globs: list[str] | tuple[str, ...]) -> Callable[[str], bool] | None:
    """`[snapshots] exclude`: a glob with a slash matches the path from the prefix (`*`
    crosses folders), one without matches a name at any depth. None when there are none."""
    if not globs:
        return None
    full = [fnmatch.translate(g.strip("/")) for g in globs if "/" in g.strip("/")]
    names = [fnmatch.translate(g) for g in globs if "/" not in g.strip("/")]
    by_path = re.compile("|".join(full)).match if full else None
    by_name = re.compile("|".join(names)).match if names else None

    def excluded(rel: str) -> bool:
        return bool((by_path and by_path(rel)) or (by_name and by_name(rel.rpartition("/")[2])))
    return excluded


def _walk(roots: list[Root], owned: set[str] | dict[str, Any], skip: set[str],
          nested: list[str] | None = None,
          excluded: Callable[[str], bool] | None = None) -> Iterator[tuple[int, str, os.stat_result]]:
    """Yield (root index, relative path, lstat) for everything a scope holds, parents first.
    Nested environments are left out (and their paths added to `nested`)."""
    for ri, root in enumerate(roots):
        if not root.whole:
            base = root.path.rstrip("/") + "/"
            for p in sorted(owned):
                if p.startswith(base):
                    try:
                        yield ri, p[len(base):], os.lstat(p)
                    except FileNotFoundError:
                        pass
            continue
        stack = [""]
        base = root.path.rstrip("/") + "/"
        while stack:
            rel = stack.pop()
            full = base + rel if rel else root.path
            try:
                it = os.scandir(full)
            except (FileNotFoundError, NotADirectoryError):
                continue
            with it:
                children = sorted(it, key=lambda e: e.name)
            subdirs = []
            for de in children:
                if de.path in skip or de.name.startswith(STAGING_PREFIX):
                    continue
                crel = f"{rel}/{de.name}" if rel else de.name
                if excluded is not None and ri == 0 and excluded(crel):
                    continue
                st = de.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode) and nested_prefix(de.path, crel, root.path):
                    if nested is not None:
                        nested.append(de.path)
                    continue
                yield ri, crel, st
                if stat.S_ISDIR(st.st_mode):
                    subdirs.append(crel)
            stack.extend(reversed(subdirs))


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "f"
    if stat.S_ISDIR(mode):
        return "d"
    if stat.S_ISLNK(mode):
        return "l"
    return "o"


def _safe_rel(rel: Any) -> bool:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\x00" in rel:
        return False
    if "//" in rel or rel.endswith("/"):
        return False  # an empty component
    # "." and ".." components, by substring tests (this runs once per manifest entry).
    wrapped = f"/{rel}/"
    return "/./" not in wrapped and "/../" not in wrapped


# --------------------------------------------------------------------------------------
# Metadata
# --------------------------------------------------------------------------------------
@dataclass
class SnapshotMeta:
    id: str
    path: Path
    label: str
    status: str  # "manual" | "pre-upgrade" | "upgraded" | "reverted" | ...
    created: float
    prefix: str
    python: str
    kind: str
    versions: dict[str, str]
    distributions: list[dict[str, Any]]
    files: int
    bytes_total: int
    bytes_copied: int
    bytes_linked: int
    link_mode: str
    run_id: str | None = None
    cleanup: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def created_iso(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.created))

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "label": self.label, "status": self.status,
                "created": self.created_iso, "versions": self.versions, "path": str(self.path),
                "files": self.files, "bytes_total": self.bytes_total,
                "bytes_copied": self.bytes_copied, "bytes_linked": self.bytes_linked,
                "link_mode": self.link_mode, "run_id": self.run_id, "prefix": self.prefix,
                "cleanup": self.cleanup, **self.extra}

    def save(self) -> None:
        doc = {k: v for k, v in self.__dict__.items() if k != "path"}
        atomic_write(self.path / "meta.json", json.dumps(doc, indent=1, default=str))

    @classmethod
    def load(cls, path: Path) -> SnapshotMeta:
        try:
            doc = json.loads((path / "meta.json").read_text())
            return cls(path=path, **doc)
        except (OSError, ValueError, TypeError) as exc:
            raise SnapshotDamaged(f"snapshot {path.name}: unreadable meta.json ({exc})",
                                  hint=f"inspect or delete {path}") from None


# --------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------
class Store:
    """Snapshots and runs of one environment."""

    def __init__(self, prefix: Path, home: Path | None = None) -> None:
        self.home = ensure_private_dir(home or state_home())
        self.env_dir = env_dir(self.home, prefix)
        self.snapshots_dir = self.env_dir / "snapshots"
        self.snapshots_dir.mkdir(exist_ok=True, mode=0o700)

    def list(self) -> list[SnapshotMeta]:
        metas = []
        for d in self.snapshots_dir.iterdir():
            if d.is_dir() and not d.name.startswith(".") and (d / "meta.json").exists():
                try:
                    metas.append(SnapshotMeta.load(d))
                except SnapshotDamaged:
                    continue
        return sorted(metas, key=lambda m: m.created, reverse=True)

    def damaged(self) -> list[str]:
        """Snapshot folders that `list` leaves out because their metadata cannot be read."""
        bad = []
        for d in sorted(self.snapshots_dir.iterdir()):
            if d.is_dir() and not d.name.startswith("."):
                try:
                    SnapshotMeta.load(d)
                except SnapshotDamaged:
                    bad.append(d.name)
        return bad

    def get(self, ref: str) -> SnapshotMeta:
        shown = repr(ref if len(ref) <= 80 else ref[:60] + "…") + (
            f" ({len(ref):,} characters)" if len(ref) > 80 else "")
        if not ref.strip():
            raise SnapshotError(f"empty snapshot reference {ref!r}",
                                hint="`rewheel history TARGET` lists the snapshots")
        # An id is a plain folder name; a label may hold any text ("cu12.8/torch2.7"). A
        # reference longer than a file name can be (NAME_MAX) can only be a label.
        if "/" not in ref and not ref.startswith(".") and len(ref) <= 255:
            exact = self.snapshots_dir / ref
            try:
                found = (exact / "meta.json").exists()
            except (OSError, ValueError):  # too long a name, a NUL, an unencodable character
                found = False
            if found:
                return SnapshotMeta.load(exact)
        matches = [m for m in self.list() if m.id.startswith(ref) or m.label == ref]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise SnapshotError(f"no snapshot {shown} for {self.env_dir.name}",
                                hint="`rewheel history TARGET` lists the snapshots")
        raise SnapshotError(f"snapshot reference {ref!r} is ambiguous: "
                            + ", ".join(m.id for m in matches))

    def delete(self, snap_id: str) -> None:
        path = self.snapshots_dir / snap_id
        trash = self.snapshots_dir / f".deleting-{snap_id}"
        os.rename(path, trash)  # atomic: a half-deleted snapshot is never listed
        shutil.rmtree(trash, ignore_errors=True)

    def prune(self, keep: int, protect: set[str] = frozenset()) -> list[str]:
        """Keep the newest `keep` snapshots; never delete a protected one. Oldest go first.
        Called under the environment's lock, it also clears what killed snapshots and
        deletions left behind (`.tmp-*`, `.deleting-*`)."""
        for leftover in self.snapshots_dir.iterdir():
            if leftover.name.startswith((".tmp-", ".deleting-")):
                shutil.rmtree(leftover, ignore_errors=True)
        removed = []
        metas = self.list()
        surplus = len(metas) - keep
        for m in reversed(metas):
            if surplus <= 0:
                break
            if m.id in protect:
                continue
            self.delete(m.id)
            removed.append(m.id)
            surplus -= 1
        return removed


# --------------------------------------------------------------------------------------
# Taking a snapshot
# --------------------------------------------------------------------------------------
class _Linker:
    """Share a file's contents with the store: hard link, else reflink, else copy."""

    def __init__(self) -> None:
        self.can_link = True
        self.can_reflink = True
        self.modes: set[str] = set()

    def share(self, src: str, dst: str) -> str:
        if self.can_link:
            try:
                os.link(src, dst)
                self.modes.add("hardlink")
                return "link"
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES):
                    raise
                self.can_link = exc.errno == errno.EMLINK
        if self.can_reflink:
            try:
                with open(src, "rb") as s, open(dst, "wb") as d:
                    fcntl.ioctl(d.fileno(), _FICLONE, s.fileno())
                self.modes.add("reflink")
                return "reflink"
            except OSError:
                self.can_reflink = False
                os.unlink(dst)
        shutil.copyfile(src, dst)
        self.modes.add("copy")
        return "copy"


_ZEROS = bytes(_CHUNK)


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
            chunk = s.read(_CHUNK)
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
        for _ in range(0, data - pos, _CHUNK):  # the hole reads as zeros
            h.update(_ZEROS[:min(_CHUNK, data - pos - _)])
        if data >= size:
            break
        hole = os.lseek(fd_in, data, os.SEEK_HOLE)
        s.seek(data)
        d.seek(data)
        left = hole - data
        while left > 0:
            chunk = s.read(min(_CHUNK, left))
            if not chunk:
                break
            h.update(chunk)
            d.write(chunk)
            left -= len(chunk)
        pos = hole
    d.truncate(size)
    return h.hexdigest(), size


def hash_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


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
                "files_reused": m.extra.get("files_reused", 0), "bytes_reused": m.extra.get("bytes_reused", 0)}


def estimate_snapshot(env: Environment, store: Store, *, dists: list[Distribution] | None = None,
                      exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a snapshot of the environment would cost now, for the plan a person reads
    before saying yes: the walk `take_snapshot` makes, without linking or copying. Files no
    RECORD proves are copied (an unchanged one the previous snapshot holds is shared with
    it instead); the rest are shared with the environment at no disk cost (on one
    filesystem)."""
    dists = dists if dists is not None else env.distributions()
    records = _record_index(dists)
    roots = scope_of(env)
    previous = _PreviousCopies(store, roots)
    files = to_copy = bytes_to_copy = bytes_reused = bytes_total = 0
    nested: list[str] = []
    src_base = [r.path.rstrip("/") + "/" for r in roots]
    for ri, rel, st in _walk(roots, records, {str(store.home)}, nested, exclusion(exclude)):
        if not stat.S_ISREG(st.st_mode):
            continue
        files += 1
        size = st.st_size
        bytes_total += size
        rec = records.get(src_base[ri] + rel)
        if rec and rec[0] and rec[1] == size and st.st_mtime_ns <= rec[2]:
            continue
        if size >= _REUSE_MIN and previous.holds(ri, rel, st):
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
        return self._prev or None

    def _find(self, ri: int, rel: str, st: os.stat_result) -> tuple[SnapshotMeta, Folder, int] | None:
        prev = self._load()
        if prev is None:
            return None
        meta, man = prev
        folder, _, name = rel.rpartition("/")
        f = man.folders.get((ri, folder))
        i = f.index.get(name) if f is not None else None
        if (f is None or i is None or f.types[i] != "f" or f.stored[i] != "C" or f.sizes[i] != st.st_size
                or f.mtimes[i] != st.st_mtime_ns or not _safe_rel(rel)):
            return None
        return meta, f, i

    def holds(self, ri: int, rel: str, st: os.stat_result) -> bool:
        return self._find(ri, rel, st) is not None

    def share(self, ri: int, rel: str, st: os.stat_result, dst: str) -> str | None:
        """Link dst to the previous snapshot's stored copy of rel; its sha256, or None."""
        found = self._find(ri, rel, st)
        if found is None:
            return None
        meta, f, i = found
        try:
            sha = f.sha(i)
            stored = f"{meta.path}/tree/{ri}/{rel}"
            sst = os.lstat(stored)
            if not (stat.S_ISREG(sst.st_mode) and sst.st_size == st.st_size and sst.st_mtime_ns == st.st_mtime_ns
                    and isinstance(sha, str)):
                return None
            os.link(stored, dst)
        except (OSError, ManifestDamaged):
            return None
        return sha


def take_snapshot(env: Environment, store: Store, *, label: str = "", status: str = "manual",
                  run_id: str | None = None, progress: Progress | None = None,
                  dists: list[Distribution] | None = None, exclude: tuple[str, ...] = ()) -> SnapshotResult:
    """Capture the environment's files into a new snapshot in `store`. `exclude`: globs
    (`[snapshots] exclude`) left out, and left alone by its restore."""
    t0 = time.monotonic()
    dists = dists if dists is not None else env.distributions()
    records = _record_index(dists)
    shared = _shared_paths(dists)
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
    skip = {str(store.home)}
    nested: list[str] = []
    previous = _PreviousCopies(store, roots)
    # Plain concatenation, not os.path.join: this loop runs once per file.
    src_base = [r.path.rstrip("/") + "/" for r in roots]
    dst_base = [f"{tree}/{ri}/" for ri in range(len(roots))]
    try:
        for i, (ri, rel, st) in enumerate(_walk(roots, records, skip, nested, exclusion(exclude))):
            src = src_base[ri] + rel
            dst = dst_base[ri] + rel
            kind = _kind(st.st_mode)
            mode = stat.S_IMODE(st.st_mode)
            if kind == "d":
                # _walk yields parents first, so the parent already exists in the tree:
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
                    sha_shared = _proven_sha(src, st, shared[src])
                    rec = (sha_shared, size, st.st_mtime_ns + 1) if sha_shared else None
                if rec and rec[0] and rec[1] == size and (
                        st.st_mtime_ns < rec[2]
                        # Written in the same clock tick as RECORD (INSTALLER, REQUESTED,
                        # uv_cache.json...): not provably older, so prove it by its bytes
                        # (small files) rather than paying for a copy.
                        or (st.st_mtime_ns == rec[2] and size <= _TIE_HASH_MAX and hash_file(src) == rec[0])):
                    how = linker.share(src, dst)
                    sha = rec[0]
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
            id=snap_id, path=store.snapshots_dir / snap_id, label=label, status=status,
            created=time.time(), prefix=str(env.prefix), python=str(env.python), kind=env.kind,
            versions={d.name: d.version_text for d in dists},
            distributions=[d.to_json() for d in dists],
            files=sum(1 for e in entries if e[2] == "f"), bytes_total=bytes_total,
            bytes_copied=bytes_copied, bytes_linked=bytes_linked,
            link_mode="+".join(sorted(linker.modes)) or "none", run_id=run_id,
            extra={**({"nested_skipped": nested} if nested else {}),
                   **({"files_reused": n_reused, "bytes_reused": bytes_reused} if n_reused else {})})
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


# --------------------------------------------------------------------------------------
# Restoring
# --------------------------------------------------------------------------------------
_STORED = {"link": "L", "reflink": "R", "copy": "C", None: "-"}
_STORED_BACK = {v: k for k, v in _STORED.items()}


class ManifestDamaged(ValueError):
    """Raised by Folder while it reads an entry; the restore reports it as SnapshotDamaged."""


class Folder:
    """One folder of a manifest, as columns with one item per entry, in `names` order:
    `types` ("f" file, "d" folder, "l" symlink, "o" socket/FIFO/device: one character
    each), `modes`, `sizes`, `mtimes` (ns), `stored` ("L" hard link, "R" reflink, "C" copy,
    "-" nothing stored: one character each), `inos` (the inode a linked file shares with
    the store, else None) and `cold`: JSON text {"sha256": [...], "target": [...]}, read
    only for the entries a restore acts on. Columns load several times faster than one
    list per entry, and a restore compares the whole tree with them."""

    __slots__ = ("names", "types", "modes", "sizes", "mtimes", "stored", "inos", "cold", "_index", "_cold")

    def __init__(self, names: list[str], types: str, modes: list[int], sizes: list[int], mtimes: list[int],
                 stored: str, inos: list[int | None], cold: str | None) -> None:
        self.names, self.types, self.modes, self.sizes, self.mtimes = names, types, modes, sizes, mtimes
        self.stored, self.inos, self.cold = stored, inos, cold
        self._index: dict[str, int] | None = None
        self._cold: dict[str, list[Any]] | None = None

    @classmethod
    def of(cls, entries: list[list[Any]]) -> Folder:
        """From full entries [root, path, type, mode, size, mtime_ns, sha256, stored, target, ino]
        (version 1 entries have no ino)."""
        cols = list(zip(*(e if len(e) > 9 else [*e, None] for e in entries), strict=True))
        _, paths, types, modes, sizes, mtimes, sha, stored, target, inos = cols
        cold = (json.dumps({"sha256": sha, "target": target}, separators=(",", ":"))
                if any(sha) or any(target) else None)
        return cls([p.rpartition("/")[2] for p in paths], "".join(types), list(modes), list(sizes), list(mtimes),
                   "".join(_STORED.get(h, "-") for h in stored), list(inos), cold)

    def to_json(self, ri: int, rel: str) -> list[Any]:
        return [ri, rel, self.names, self.types, self.modes, self.sizes, self.mtimes, self.stored, self.inos,
                self.cold]

    @property
    def index(self) -> dict[str, int]:
        if self._index is None:
            self._index = dict(zip(self.names, range(len(self.names)), strict=True))
        return self._index

    def entry(self, ri: int, rel: str, i: int, *, sha: bool = True) -> list[Any]:
        """Entry i in full: [root, path, type, mode, size, mtime_ns, sha256, stored, target, ino].
        `sha=False`: a linked file's sha256 is left out (None) — a restore links the stored
        inode, checked by size and mtime, and needs no hash to do it."""
        kind = self.types[i]
        sha256 = target = None
        if self.cold is not None and (kind == "l" or kind == "f" and (sha or self.stored[i] != "L")):
            try:
                if self._cold is None:
                    self._cold = json.loads(self.cold)
                sha256, target = self._cold["sha256"][i], self._cold["target"][i]
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise ManifestDamaged(f"{self.names[i]}: sha256 and target do not load ({exc})") from None
        name = self.names[i]
        return [ri, f"{rel}/{name}" if rel else name, kind, self.modes[i], self.sizes[i], self.mtimes[i], sha256,
                _STORED_BACK.get(self.stored[i]), target, self.inos[i]]

    def entries(self, ri: int, rel: str) -> list[list[Any]]:
        return [self.entry(ri, rel, i) for i in range(len(self.names))]

    def sha(self, i: int) -> str | None:
        """Entry i's sha256 alone (from the cold part, decoded once per folder)."""
        if self.cold is None:
            return None
        try:
            if self._cold is None:
                self._cold = json.loads(self.cold)
            return self._cold["sha256"][i]
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ManifestDamaged(f"{self.names[i]}: sha256 does not load ({exc})") from None

    def shape_ok(self) -> bool:
        """Columns of the right types and lengths, types and stored codes known."""
        names, types, modes, sizes, mtimes, stored, inos, cold = (
            self.names, self.types, self.modes, self.sizes, self.mtimes, self.stored, self.inos, self.cold)
        return (type(names) is list and type(types) is str and type(stored) is str and type(modes) is list
                and type(sizes) is list and type(mtimes) is list and type(inos) is list
                and (cold is None or type(cold) is str)
                and len(names) == len(types) == len(modes) == len(sizes) == len(mtimes) == len(stored) == len(inos)
                and not types.strip("fdlo") and not stored.strip("LRC-"))


@dataclass
class Manifest:
    """A snapshot's manifest: every entry under the roots, by folder ((root, folder) ->
    Folder). An entry in full is [root, path, type, mode, size, mtime_ns, sha256, stored,
    target, ino]. Version 2 stores the folders as columns; version 1 (one flat list of
    9-field entries) still loads."""
    roots: list[Root]
    folders: dict[tuple[int, str], Folder]
    real_roots: list[str] | None = None
    exclude: list[str] = field(default_factory=list)  # `[snapshots] exclude` when it was taken

    @property
    def entries(self) -> list[list[Any]]:
        return [e for (ri, rel), f in self.folders.items() for e in f.entries(ri, rel)]

    def to_json(self) -> dict[str, Any]:
        return {"version": MANIFEST_VERSION, "roots": [r.__dict__ for r in self.roots],
                # Where the roots really were (a prefix reached through a symlink is the same
                # environment by its real path, even once the symlink is gone).
                "real_roots": self.real_roots, "exclude": self.exclude,
                "folder_fields": ["root", "path", "names", "types", "modes", "sizes", "mtimes_ns", "stored",
                                  "inos", "cold"],
                "folders": [f.to_json(ri, rel) for (ri, rel), f in self.folders.items()]}

    @classmethod
    def of(cls, roots: list[Root], entries: list[list[Any]], real_roots: list[str] | None,
           exclude: list[str] | None = None) -> Manifest:
        by_folder: dict[tuple[int, str], list[list[Any]]] = {}
        for e in entries:
            key = (e[0], e[1].rpartition("/")[0])
            kids = by_folder.get(key)
            if kids is None:
                kids = by_folder[key] = []
            kids.append(e)
        return cls(roots, {k: Folder.of(v) for k, v in by_folder.items()}, real_roots, exclude or [])

    @classmethod
    def load(cls, snap: SnapshotMeta, *, validate: bool = True) -> Manifest:
        """Read a snapshot's manifest. `validate=False` checks only its shape, for the
        restore, which checks the folders as it walks them and each entry it acts on."""
        path = snap.path / "manifest.json"
        try:
            doc = json.loads(path.read_text())
            roots = [Root(str(r["path"]), bool(r["whole"])) for r in doc["roots"]]
            real_roots = [str(r) for r in doc["real_roots"]] if "real_roots" in doc else None
            exclude = doc.get("exclude") or []
            if not (isinstance(exclude, list) and all(type(g) is str for g in exclude)):
                raise TypeError("exclude is not a list of globs")
            if "folders" in doc:
                folders = {(item[0], item[1]): Folder(*item[2:]) for item in doc["folders"]}
                if not all(type(ri) is int and 0 <= ri < len(roots) and type(rel) is str and f.shape_ok()
                           for (ri, rel), f in folders.items()):
                    raise TypeError("a folder's columns do not line up")
                man = cls(roots, folders, real_roots, exclude)
            else:  # version 1: one flat list
                entries = doc["entries"]
                bad = next((e for e in entries if not (
                    isinstance(e, list) and len(e) == 9 and type(e[0]) is int and 0 <= e[0] < len(roots)
                    and type(e[1]) is str and e[2] in ("f", "d", "l", "o"))), None)
                if bad is not None:
                    raise _bad_entry(snap, bad)
                man = cls.of(roots, entries, real_roots, exclude)
            entries = man.entries if validate else []
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            raise SnapshotDamaged(f"snapshot {snap.id}: manifest {path} is unreadable ({exc})",
                                  hint="restore another snapshot (`rewheel history`)") from None
        if validate:
            seen = set()
            for e in entries:
                if not _safe_rel(e[1]) or (e[0], e[1]) in seen:
                    raise _bad_entry(snap, e)
                if e[2] == "l" and not isinstance(e[8], str):
                    raise SnapshotDamaged(f"snapshot {snap.id}: symlink entry {e[1]} has no target")
                seen.add((e[0], e[1]))
        return man


def _bad_entry(snap: SnapshotMeta, e: Any) -> SnapshotDamaged:
    return SnapshotDamaged(
        f"snapshot {snap.id}: manifest entry {str(e)[:200]} is invalid or escapes the prefix",
        hint="the snapshot was tampered with or damaged; restore another one")


@dataclass
class RestoreResult:
    snapshot_id: str
    written: int
    deleted: int
    chmodded: int
    unchanged: int
    verified: int
    seconds: float
    cleanup_restored: int = 0
    folders_rebuilt: int = 0  # missing folders built whole from the store and renamed in
    displaced: list[str] = field(default_factory=list)  # moved out, not yet deleted
    removal_seconds: float = 0.0  # deleting what was moved out (after `seconds`, if deferred)
    phases: dict[str, float] = field(default_factory=dict)  # seconds: load, scan, stage, commit, verify, finish
    lanes: int = 1  # processes that shared the work
    # Files left in place: not the stored inode, but proven to hold its bytes (a reinstall
    # at the same version unpacked the same bytes anew); counted in `unchanged`.
    proven_same: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot_id, "written": self.written, "deleted": self.deleted,
                "chmodded": self.chmodded, "unchanged": self.unchanged, "verified": self.verified,
                "seconds": round(self.seconds, 3), "cleanup_restored": self.cleanup_restored,
                "folders_rebuilt": self.folders_rebuilt, "removal_seconds": round(self.removal_seconds, 3),
                "lanes": self.lanes, "proven_same": self.proven_same}


def _live_roots(snap: SnapshotMeta, man: Manifest, live_roots: list[Root]) -> list[Root]:
    """The manifest's roots at the paths the environment is reached by now. The same prefix
    reached through a symlink (`/srv/env` -> `/data/env`) is the same environment: compare
    real paths, and act on the live paths (the symlink a snapshot went through may be gone)."""
    real = man.real_roots or [os.path.realpath(r.path) for r in man.roots]
    if real != [os.path.realpath(r.path) for r in live_roots]:
        raise SnapshotError(
            f"snapshot {snap.id} was taken of {', '.join(r.path for r in man.roots)}, "
            f"not of {', '.join(r.path for r in live_roots)}")
    return [Root(lr.path, mr.whole) for lr, mr in zip(live_roots, man.roots, strict=True)]


def _raise_if_problems(env: Environment, snap: SnapshotMeta, problems: list[str]) -> None:
    if problems:
        raise RestoreError(
            f"environment {env.prefix} does not match snapshot {snap.id} after restore: "
            + "; ".join(problems[:10]) + (f" (+{len(problems) - 10} more)" if len(problems) > 10 else ""),
            hint=f"run `rewheel rollback --python {env.python} {snap.id} --yes` again; if it keeps failing, "
                 "recreate the environment by hand")


def _entry_problem(e: list[Any], st: os.stat_result, path: str) -> str | None:
    """How a live entry differs from its manifest entry, or None when it matches."""
    kind = _kind(st.st_mode)
    if kind != e[2]:
        return f"type differs: {e[1]}"
    if kind == "f" and not _same_file(e, st):
        return f"content differs: {e[1]}"
    if kind in ("f", "d") and stat.S_IMODE(st.st_mode) != e[3]:
        return f"mode differs: {e[1]} ({oct(stat.S_IMODE(st.st_mode))} vs {oct(e[3])})"
    if kind == "l" and os.readlink(path) != e[8]:
        return f"symlink target differs: {e[1]}"
    return None


def _owned_now(roots: list[Root], env: Environment) -> set[str]:
    if all(r.whole for r in roots):
        return set()
    return {e.path for d in env.distributions() for e in d.record}


def _same_file(e: list[Any], st: os.stat_result) -> bool:
    return (stat.S_ISREG(st.st_mode) and st.st_size == e[4] and st.st_mtime_ns == e[5])


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NO_LINK = (errno.EXDEV, errno.EMLINK, errno.EPERM, errno.ENOTSUP)  # link(2) cannot: copy instead


def _check_fields(snap: SnapshotMeta, e: list[Any]) -> None:
    """The fields a restore acts on have the types it needs (checked for the entries it
    acts on only, before it acts)."""
    if (type(e[3]) is not int or type(e[5]) is not int or (e[2] == "f" and type(e[4]) is not int)
            or (e[2] == "l" and (type(e[8]) is not str or not e[8] or "\x00" in e[8] or len(e[8]) > 4095))
            or e[2] not in ("f", "d", "l") or not 0 <= e[3] <= 0o7777):
        raise _bad_entry(snap, e)
    if e[2] == "f" and e[3] & (stat.S_ISUID | stat.S_ISGID):
        # No wheel installs a set-id file: a manifest asking for one is not applied as root.
        raise SnapshotDamaged(f"snapshot {snap.id}: {e[1]} would be restored set-user/group-id (mode {e[3]:o})",
                              hint="no installer makes such a file; the manifest was tampered with. "
                                   "Restore another snapshot")


def _check_stored(snap: SnapshotMeta, tree: str, e: list[Any]) -> os.stat_result:
    p = f"{tree}/{e[0]}/{e[1]}"  # hot: plain concatenation, not os.path.join
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        raise SnapshotDamaged(f"snapshot {snap.id}: stored file {e[1]} is missing ({p})",
                              hint="restore another snapshot (`rewheel history`)") from None
    if not stat.S_ISREG(st.st_mode) or st.st_size != e[4] or st.st_mtime_ns != e[5]:
        raise SnapshotDamaged(
            f"snapshot {snap.id}: stored file {e[1]} was changed after the snapshot "
            f"(size {st.st_size} vs {e[4]}, mtime differs: {st.st_mtime_ns != e[5]})",
            hint="the file was edited in place or the store was tampered with; restore another snapshot")
    return st


def _remove_stale_staging(roots: list[Root]) -> None:
    """A restore killed mid-way leaves its staging folder at a root; the next restore (which
    finishes the job) removes it, so no trace of rewheel stays in the environment."""
    for r in roots:
        try:
            names = os.listdir(r.path)
        except OSError:
            continue
        for name in names:
            if name.startswith(STAGING_PREFIX):
                shutil.rmtree(os.path.join(r.path, name), ignore_errors=True)


def _check_tree(snap: SnapshotMeta, man: Manifest) -> None:
    """What a restore needs of the manifest's folders before it walks them.

    It only ever acts on paths joined from the folders' names, walking down from a root,
    so a folder is safe when its names are plain, unique names and it is itself a folder
    entry of its parent — `../../etc/evil` has no such chain. That costs a few operations
    per folder, none per entry; the fields of each entry the restore acts on are checked
    when it does (`_check_fields`)."""
    for (ri, rel), f in man.folders.items():
        prefix = f"{rel}/" if rel else ""
        try:
            if not man.roots[ri].whole:  # RECORD-listed files only: paths, checked one by one
                ok = all(_safe_rel(prefix + n) for n in f.names) and not f.types.strip("fl")
            else:
                names = "\n".join(f.names)
                index = f.index
                ok = not ("/" in names or "\x00" in names or "" in index or "." in index or ".." in index
                          or len(index) != len(f.names))
                if ok and rel:
                    parent, _, name = rel.rpartition("/")
                    pf = man.folders.get((ri, parent))
                    i = pf.index.get(name) if pf is not None else None
                    ok = i is not None and pf is not None and pf.types[i] == "d"
        except TypeError:  # a name that is not a string
            ok = False
        if not ok:
            raise _bad_entry(snap, f"folder {prefix or '.'} of root {ri} ({', '.join(map(str, f.names[:5]))})")


def share_folders(man: Manifest, n: int) -> list[set[tuple[int, str]]]:
    """The manifest's folders shared out between n lanes, balanced by entries: the same
    shares in every lane, since all read the same manifest."""
    shares: list[set[tuple[int, str]]] = [set() for _ in range(n)]
    load = [0] * n
    for key, f in man.folders.items():
        j = load.index(min(load))
        load[j] += 1 + len(f.names)
        shares[j].add(key)
    return shares


@dataclass(eq=False)
class _Dir:
    """One live folder compared with the manifest: what it needs."""
    ri: int
    rel: str  # "" for a root
    path: str
    entry: list[Any] | None  # the folder's own manifest entry (None for a root)
    st: os.stat_result | None  # its lstat (None for a root)
    writes: list[list[Any]] = field(default_factory=list)  # files and symlinks to (re)place
    chmods: list[list[Any]] = field(default_factory=list)
    extras: list[tuple[str, bool]] = field(default_factory=list)  # (path, is a folder)
    missing: list[list[Any]] = field(default_factory=list)  # folders to build whole

    @property
    def touched(self) -> bool:
        return bool(self.writes or self.extras or self.missing)

    @property
    def attrs_off(self) -> bool:
        e, st = self.entry, self.st
        return e is not None and st is not None and (stat.S_IMODE(st.st_mode) != e[3] or st.st_mtime_ns != e[5])


_EMPTY = Folder([], "", [], [], [], "", [], None)


ALIASES = "aliases.json"  # in a snapshot's folder: live files proven to hold its bytes


class _SameBytes:
    """Live files a restore may leave in place although they are not the stored inode,
    because their bytes provably equal the snapshot's — without reading them.

    A force-reinstall (`reinstall = "all"`) unpacks fresh copies of every distribution, so
    same-version files come back byte for byte under new inodes and new mtimes. Such a file
    is proven identical when its distribution was reinstalled at the same version (the same
    `<name>-<version>.dist-info` folder is in the manifest, its RECORD is not the captured
    one), the live RECORD lists it with the manifest's sha256 and size, only one reinstalled
    RECORD claims it, and it was not modified after that RECORD was written (RECORD is
    written last). Once proven, the file's (inode, mtime) is kept beside the snapshot
    (`aliases.json`): after the rollback the old RECORD is back and the proof no longer
    reads off the tree, but the same inode with the same mtime still holds the same bytes,
    for the next restore and for `verify`. Anything in doubt is relinked, as before."""

    def __init__(self, env: Environment, snap: SnapshotMeta, man: Manifest, roots: list[Root]) -> None:
        self.env, self.snap, self.man, self.roots = env, snap, man, roots
        self._live: dict[str, dict[str, tuple[str, str, int]]] | None = None
        self._aliases: dict[str, list[int]] | None = None
        self.found: dict[str, list[int]] = {}  # proven by this restore: "ri/path" -> [ino, mtime]

    @property
    def useless(self) -> bool:
        """Nothing can be proven: no distribution reinstalled at its version, no aliases."""
        return not self.live() and not self.aliases()

    def aliases(self) -> dict[str, list[int]]:
        if self._aliases is None:
            self._aliases = _read_aliases(self.snap.path / ALIASES)
        return self._aliases

    def live(self) -> dict[str, dict[str, tuple[str, str, int]]]:
        """Site folder ("/…/site-packages/") -> RECORD path -> (RECORD's hash field, size as
        written, install time), from the RECORDs of distributions reinstalled at the version
        the snapshot holds; paths two of them claim are left out. Rows are kept as RECORD
        writes them (tens of thousands: no per-row conversion); only the files looked up are
        compared."""
        if self._live is not None:
            return self._live
        live: dict[str, dict[str, tuple[str, str, int]]] = {}
        for site in dict.fromkeys(os.path.realpath(p) for p in self.env.site_dirs):
            for ri, root in enumerate(self.roots):
                base = os.path.realpath(root.path).rstrip("/") + "/"
                if root.whole and site.startswith(base):
                    site_rel = site[len(base):].strip("/")
                    break
            else:
                continue
            sf = self.man.folders.get((ri, site_rel))
            try:
                names = os.listdir(site) if sf is not None else []
            except OSError:
                continue
            index: dict[str, tuple[str, str, int]] = {}
            claimed: set[str] = set()
            for name in names:
                if not name.endswith(".dist-info") or sf is None:
                    continue
                i = sf.index.get(name)
                df = self.man.folders.get((ri, f"{site_rel}/{name}" if site_rel else name))
                j = df.index.get("RECORD") if df is not None else None
                if i is None or sf.types[i] != "d" or df is None or j is None or df.types[j] != "f":
                    continue  # not in the snapshot at this version
                record = f"{site}/{name}/RECORD"
                try:
                    st = os.lstat(record)
                    if st.st_size == df.sizes[j] and st.st_mtime_ns == df.mtimes[j]:
                        continue  # the captured RECORD: not reinstalled
                    with open(record, encoding="utf-8", errors="replace", newline="") as fh:
                        lines = fh.read().splitlines()
                except OSError:
                    continue
                t = st.st_mtime_ns
                for line in lines:
                    # Plain rows split from the right (a path may hold commas only when quoted).
                    if '"' in line:
                        try:
                            row = next(csv.reader([line]))
                        except (csv.Error, StopIteration):
                            continue
                    else:
                        row = line.rsplit(",", 2)
                    if len(row) != 3 or not row[1].startswith("sha256="):
                        continue
                    rel = row[0]  # `../../bin/x` and other odd spellings never match a lookup
                    if rel in index:
                        claimed.add(rel)
                    index[rel] = (row[1], row[2], t)
            for rel in claimed:
                del index[rel]
            if index:
                live[site.rstrip("/") + "/"] = index
        self._live = live
        return live

    def folder(self, ri: int, rel: str, path: str) -> _FolderProof | None:
        """What the files directly in folder `rel` (at `path`) are looked up by; None when
        none of them can be proven (no reinstalled RECORD covers it, no aliases). Once per
        folder, so the per-file work is two dict lookups."""
        rows: dict[str, tuple[str, str, int]] = {}
        spelled = ""
        p = path.rstrip("/") + "/"
        for site, index in self.live().items():
            if p.startswith(site):
                rows, spelled = index, p[len(site):]
                break
        aliases = self.aliases()
        if not rows and not aliases:
            return None
        return _FolderProof(rows, spelled, f"{ri}/{rel}/" if rel else f"{ri}/", aliases, p)

    def same(self, fp: _FolderProof, name: str, size: int, sha: Callable[[], str | None],
             lstat: Callable[[], os.stat_result]) -> bool:
        """Whether the live file `name` in the folder `fp` describes (of `size` bytes in the
        manifest, sha256 from `sha()`; its lstat from `lstat()`) holds the snapshot's bytes.
        Cheapest first: most files a restore asks about are neither aliased nor reinstalled."""
        alias = fp.aliases.get(fp.key + name) if fp.aliases else None
        rec = fp.rows.get(fp.spelled + name) if fp.rows else None
        if alias is None and rec is None:
            return False
        st = lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return False
        if alias is not None and alias[0] == st.st_ino and alias[1] == st.st_mtime_ns:
            return True
        if rec is None or rec[1] != str(size) or st.st_mtime_ns > rec[2]:
            return False
        want = sha()
        if not isinstance(want, str) or rec[0] != _record_hash(want):
            return False
        # Written in the same clock tick as RECORD: not provably older, so proven by its bytes
        # where that is cheap (as a snapshot does), else relinked.
        if st.st_mtime_ns == rec[2] and (size > _TIE_HASH_MAX or hash_file(fp.path + name) != want):
            return False
        self.found[fp.key + name] = [st.st_ino, st.st_mtime_ns]
        return True


class _FolderProof(NamedTuple):
    """`_SameBytes` for one folder: its files' RECORD rows (by the path RECORD spells, which
    starts with `spelled`), their alias keys (`key` + name), and the folder's path + "/"."""
    rows: dict[str, tuple[str, str, int]]
    spelled: str
    key: str
    aliases: dict[str, list[int]]
    path: str


def _record_hash(sha_hex: str) -> str:
    """A sha256 as RECORD writes it: `sha256=` and urlsafe base64 without padding."""
    try:
        raw = bytes.fromhex(sha_hex)
    except ValueError:
        return ""
    b64 = binascii.b2a_base64(raw, newline=False).rstrip(b"=").replace(b"+", b"-").replace(b"/", b"_")
    return "sha256=" + b64.decode("ascii")


def _read_aliases(path: Path) -> dict[str, list[int]]:
    """`aliases.json`: none yet, or a damaged one, is empty (it only costs relinks)."""
    try:
        doc = json.loads(path.read_text())
        keys, inos, mtimes = doc["paths"], doc["inos"], doc["mtimes"]
        if not (len(keys) == len(inos) == len(mtimes)):
            return {}
        return {k: [i, m] for k, i, m in zip(keys, inos, mtimes, strict=True)
                if type(k) is str and type(i) is int and type(m) is int}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _save_aliases(snap: SnapshotMeta, found: dict[str, list[int]]) -> None:
    """Remember the files a restore proved identical (see `_SameBytes`). Best effort: without
    it the next restore relinks them, which is also right."""
    if not found:
        return
    path = snap.path / ALIASES
    try:
        files = _read_aliases(path)
        files.update(found)
        # Columns: several times cheaper to write and read than one small list per file.
        keys = list(files)
        atomic_write(path, json.dumps({"version": 2, "paths": keys, "inos": [files[k][0] for k in keys],
                                       "mtimes": [files[k][1] for k in keys]}, separators=(",", ":")))
    except OSError:
        pass


class _Restore:
    """One restore: scan (compare the live tree with the manifest), check and stage, commit,
    verify. Nothing in the environment changes before the commit, and the commit starts
    only once every stored file it will use has been checked."""

    def __init__(self, env: Environment, snap: SnapshotMeta, man: Manifest, roots: list[Root],
                 progress: Progress | None, lane: tuple[int, int] | None = None) -> None:
        self.env, self.snap, self.roots = env, snap, roots
        self.tree = str(snap.path / "tree")
        self.progress = progress
        _check_tree(snap, man)
        self.man = man
        self.folders = man.folders
        # Lane k of n owns its share of the folders; None: this restore owns every folder.
        self.owned = share_folders(man, lane[1])[lane[0]] if lane is not None else None
        home = Path(os.path.realpath(Path(snap.path).parents[3]))  # the store's home, when inside the prefix
        self.skip = {str(home.parent): home.name}
        self.staging: dict[int, str] = {}
        self.n = 0  # staged names
        self.written = 0
        self.others = 0  # sockets, FIFOs, devices in the manifest: not content, not verified
        # Files left in place because their bytes are proven the snapshot's (a reinstall at
        # the same version); None once nothing can be proven here.
        self.same: _SameBytes | None = _SameBytes(env, snap, man, roots)
        self.same_checked = False
        self.proof_of: tuple[int, str] | None = None  # the folder `proof` is for
        self.proof: _FolderProof | None = None
        # `REWHEEL_FAULT_AT=restore-commit:N`: SIGKILL this process once it has put N files in
        # place (crash-safety tests kill at a real point inside the commit).
        fault = os.environ.get("REWHEEL_FAULT_AT", "")
        self.kill_at = int(fault.partition(":")[2]) if fault.startswith("restore-commit:") else -1
        self.excluded = exclusion(man.exclude)
        self.proven = 0
        self.todo = 0
        self.dirs: list[_Dir] = []  # the folders that need anything, children first
        # What the commit puts in place, by entry: the stored inode it links (checked),
        # or the staged copy / built folder it renames.
        self.links: dict[tuple[int, str], os.stat_result] = {}  # by (root, path)
        self.staged: dict[int, str] = {}

    # Scan ------------------------------------------------------------------------------
    def scan_root(self, ri: int) -> None:
        path = self.roots[ri].path
        try:
            fd = os.open(path, _DIR_FLAGS)
        except FileNotFoundError:  # the root itself is gone: everything is missing
            if self.owned is not None and (ri, "") not in self.owned:
                return  # the root's lane builds it all
            d = _Dir(ri, "", path, None, None)
            self.dirs.append(d)
            self.add_missing(d, self.folders.get((ri, "")) or _EMPTY, set())
            return
        try:
            self.scan(ri, "", path, None, None, fd)
        finally:
            os.close(fd)

    def scan(self, ri: int, rel: str, path: str, own: tuple[Folder, str, int] | None, st: os.stat_result | None,
             fd: int) -> None:
        """Compare folder `rel` (open as fd: every stat is relative to it; `own`: where its
        own entry is, in its parent's columns) with the manifest; keep it if it needs anything."""
        f = self.folders.get((ri, rel)) or _EMPTY
        if self.owned is not None and (ri, rel) not in self.owned:
            self.pass_through(ri, rel, path, f, fd)
            return
        find, types, modes, sizes, mtimes, inos = f.index.get, f.types, f.modes, f.sizes, f.mtimes, f.inos
        is_reg, mode_of = stat.S_ISREG, stat.S_IMODE
        writes: list[list[Any]] = []
        chmods: list[list[Any]] = []
        extras: list[tuple[str, bool]] = []
        missing: list[list[Any]] = []
        prefix = f"{rel}/" if rel else ""
        skip = self.skip.get(path)
        matched = 0
        with os.scandir(fd) as it:
            for de in it:
                name = de.name
                i = find(name)
                if i is None:
                    if name == skip or (not rel and name.startswith(STAGING_PREFIX)):
                        continue
                    if self.excluded is not None and ri == 0 and self.excluded(prefix + name):
                        continue  # `[snapshots] exclude`: neither captured nor removed
                    if de.is_dir(follow_symlinks=False):
                        if not nested_prefix(f"{path}/{name}", prefix + name, self.roots[ri].path):
                            extras.append((f"{path}/{name}", True))
                    elif de.is_file(follow_symlinks=False) or de.is_symlink():
                        extras.append((f"{path}/{name}", False))
                    # sockets, FIFOs, devices are not content: neither captured nor removed
                    continue
                matched += 1
                kind = types[i]
                if kind == "f":
                    # A shared file at another inode was replaced: no stat needed to know.
                    ino = inos[i]
                    lst = None
                    if ino is None or de.inode() == ino:
                        lst = de.stat(follow_symlinks=False)
                        if lst.st_mtime_ns == mtimes[i] and lst.st_size == sizes[i] and is_reg(lst.st_mode):
                            if mode_of(lst.st_mode) != modes[i]:
                                chmods.append(f.entry(ri, rel, i, sha=False))
                            continue
                    if self.same is not None and self.proven_same(f, ri, rel, i, path, de, lst):
                        if mode_of(de.stat(follow_symlinks=False).st_mode) != modes[i]:
                            chmods.append(f.entry(ri, rel, i, sha=False))
                        continue
                elif kind == "d":
                    if de.is_dir(follow_symlinks=False):
                        sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                        try:
                            self.scan(ri, prefix + name, f"{path}/{name}", (f, rel, i), os.fstat(sub), sub)
                        finally:
                            os.close(sub)
                        continue
                    extras.append((f"{path}/{name}", False))
                    missing.append(f.entry(ri, rel, i))
                    continue
                elif kind == "l":
                    e = f.entry(ri, rel, i)
                    if de.is_symlink() and os.readlink(name, dir_fd=fd) == e[8]:
                        continue
                    writes.append(e)
                    continue
                else:
                    self.others += 1
                    continue  # "o": whatever is there now stays
                if de.is_dir(follow_symlinks=False):
                    extras.append((f"{path}/{name}", True))
                writes.append(f.entry(ri, rel, i, sha=False))
        attrs_off = own is not None and st is not None and (
            mode_of(st.st_mode) != own[0].modes[own[2]] or st.st_mtime_ns != own[0].mtimes[own[2]])
        if matched < len(f.names) or writes or chmods or extras or missing or attrs_off:
            d = _Dir(ri, rel, path, own[0].entry(ri, own[1], own[2]) if own is not None else None, st,
                     writes, chmods, extras, missing)
            if matched < len(f.names):
                self.add_missing(d, f, set(os.listdir(fd)) if matched else set())
            if d.touched or d.chmods or d.attrs_off:
                self.dirs.append(d)

    def proven_same(self, f: Folder, ri: int, rel: str, i: int, path: str, de: os.DirEntry[str],
                    lst: os.stat_result | None) -> bool:
        """A changed-looking file whose bytes are proven the snapshot's (see `_SameBytes`)."""
        same = self.same
        assert same is not None
        if not self.same_checked:
            self.same_checked = True
            if same.useless:
                self.same = None  # nothing to prove in this tree: no further work for it
                return False
        if self.proof_of != (ri, rel):
            self.proof_of, self.proof = (ri, rel), same.folder(ri, rel, path)
        if self.proof is None:
            return False
        ok = same.same(self.proof, f.names[i], f.sizes[i], lambda: f.sha(i),
                       lambda: lst or de.stat(follow_symlinks=False))
        self.proven += ok
        return ok

    def pass_through(self, ri: int, rel: str, path: str, f: Folder, fd: int) -> None:
        """A folder another lane compares: only go down to the folders below it (known from
        the manifest). One that is no longer a folder is left to the owner of this one."""
        prefix = f"{rel}/" if rel else ""
        owned = self.owned or set()
        i = f.types.find("d")
        while i >= 0:
            name = f.names[i]
            i_next = f.types.find("d", i + 1)
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                i = i_next
                continue
            try:
                child = prefix + name
                self.scan(ri, child, f"{path}/{name}", (f, rel, i),
                          os.fstat(sub) if (ri, child) in owned else None, sub)
            finally:
                os.close(sub)
            i = i_next

    def add_missing(self, d: _Dir, f: Folder, present: set[str]) -> None:
        for i, name in enumerate(f.names):
            if name not in present:
                if f.types[i] == "o":
                    self.others += 1
                else:
                    e = f.entry(d.ri, d.rel, i, sha=False)
                    (d.missing if e[2] == "d" else d.writes).append(e)

    def scan_listed(self, ri: int) -> _Dir:
        """A root of which only RECORD-listed files are ours (a system interpreter's
        scripts folder): compare those files one by one."""
        root = self.roots[ri]
        d = _Dir(ri, "", root.path, None, None)
        self.dirs.append(d)
        want = {e[1]: e for (r, rel), f in self.folders.items() if r == ri for e in f.entries(r, rel)}
        base = root.path.rstrip("/") + "/"
        owned = {p[len(base):] for p in _owned_now(self.roots, self.env) if p.startswith(base)}
        for rel, e in want.items():
            p = base + rel
            try:
                lst = os.lstat(p)
            except FileNotFoundError:
                d.writes.append(e)
                continue
            if e[2] == "f" and _same_file(e, lst):
                if stat.S_IMODE(lst.st_mode) != e[3]:
                    d.chmods.append(e)
                continue
            if e[2] == "l" and stat.S_ISLNK(lst.st_mode) and os.readlink(p) == e[8]:
                continue
            if stat.S_ISDIR(lst.st_mode):
                d.extras.append((p, True))
            d.writes.append(e)
        d.extras.extend((base + rel, False) for rel in owned - want.keys() if os.path.lexists(base + rel))
        return d

    def count(self, ri: int, rel: str) -> int:
        f = self.folders.get((ri, rel)) or _EMPTY
        n = len(f.types) - f.types.count("o")
        for i in (i for i, k in enumerate(f.types) if k == "d"):
            n += self.count(ri, f"{rel}/{f.names[i]}" if rel else f.names[i])
        return n

    def path_of(self, d: _Dir, e: list[Any]) -> str:
        if self.roots[d.ri].whole:
            return f"{d.path}/{e[1].rpartition('/')[2]}"
        return f"{d.path.rstrip('/')}/{e[1]}"

    # Check and stage ---------------------------------------------------------------------
    def stage_path(self, ri: int) -> str:
        s = self.staging.get(ri)
        if s is None:
            root = self.roots[ri].path
            os.makedirs(root, exist_ok=True)
            s = self.staging[ri] = os.path.join(root, STAGING_PREFIX + secrets.token_hex(4))
            os.mkdir(s, 0o700)
        self.n += 1
        return f"{s}/{self.n}"

    def discard_staging(self) -> None:
        """A restore that stops: what it staged (and anything it moved out) goes."""
        for s in self.staging.values():
            shutil.rmtree(s, ignore_errors=True)

    def check_links(self, d: _Dir) -> None:
        """Before the commit: every stored inode folder d's files will be linked to exists
        and still has the manifest's size and mtime (one fstatat each, in its folder)."""
        links = [e for e in d.writes if e[2] == "f" and e[7] == "link"]
        if not links:
            return
        try:
            sfd = os.open(self.stored_folder(d), _DIR_FLAGS)
        except OSError:
            _check_stored(self.snap, self.tree, links[0])  # raises, naming the file
            raise
        try:
            for e in links:
                try:
                    st = os.lstat(e[1].rpartition("/")[2], dir_fd=sfd)
                except FileNotFoundError:
                    st = None
                if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != e[4] or st.st_mtime_ns != e[5]:
                    _check_stored(self.snap, self.tree, e)  # raises, naming the file
                self.links[(e[0], e[1])] = st
        finally:
            os.close(sfd)

    def stored_folder(self, d: _Dir) -> str:
        return f"{self.tree}/{d.ri}/{d.rel}" if d.rel else f"{self.tree}/{d.ri}"

    def place(self, e: list[Any], dst: str) -> None:
        """Put entry e (a file or symlink) at dst, a path that is free: a link to the
        stored inode (checked against the manifest first) or a checked copy."""
        if e[2] == "l":
            os.symlink(e[8], dst)
        else:
            sst = self.links.get((e[0], e[1]))
            if e[7] == "link":
                if sst is None:
                    sst = self.links[(e[0], e[1])] = _check_stored(self.snap, self.tree, e)
                try:
                    os.link(f"{self.tree}/{e[0]}/{e[1]}", dst)
                except OSError as exc:
                    if exc.errno not in _NO_LINK:
                        raise
                    del self.links[(e[0], e[1])]  # another filesystem now: copy instead
                    sst = None
                    self.copy(e, dst)
            else:
                self.copy(e, dst)
            # A link shares the stored inode: its mode and mtime are already right unless
            # someone changed them; only then pay for chmod and utime.
            if sst is None or stat.S_IMODE(sst.st_mode) != e[3]:
                os.chmod(dst, e[3])
            if sst is None or sst.st_mtime_ns != e[5]:
                os.utime(dst, ns=(e[5], e[5]))
        self.count_written()

    def count_written(self) -> None:
        self.written += 1
        if self.written == self.kill_at:  # testing hook: a power cut halfway through the commit
            os.kill(os.getpid(), signal.SIGKILL)
        if self.progress and self.written % 500 == 0:
            # In two lanes, this process counts its own half (the other prints nothing).
            self.progress("restore" if self.owned is None else "restore (lane 1 of 2)", self.written, self.todo)

    def copy(self, e: list[Any], dst: str) -> None:
        src = f"{self.tree}/{e[0]}/{e[1]}"
        if e[7] == "link":
            _check_stored(self.snap, self.tree, e)
        sha, _ = copy_hashed(src, dst)
        if e[6] and sha != e[6]:
            raise SnapshotDamaged(
                f"snapshot {self.snap.id}: stored file {e[1]} does not match its recorded sha256 "
                f"(expected {e[6][:12]}…, found {sha[:12]}…)",
                hint="the store was tampered with or damaged; restore another snapshot")

    def build(self, ri: int, rel: str, e: list[Any], dst: str) -> None:
        """Build folder `rel` whole at dst, exactly as the manifest has it."""
        os.mkdir(dst, 0o700)
        f = self.folders.get((ri, rel)) or _EMPTY
        for i, name in enumerate(f.names):
            if f.types[i] == "o":
                self.others += 1
                continue
            k = f.entry(ri, rel, i, sha=False)
            _check_fields(self.snap, k)
            if k[2] == "d":
                self.build(ri, k[1], k, f"{dst}/{name}")
            else:
                self.place(k, f"{dst}/{name}")
        os.chmod(dst, e[3])
        os.utime(dst, ns=(e[5], e[5]))  # last: any entry added below would change it

    def stage(self) -> None:
        for d in self.dirs:
            self.todo += len(d.writes) + sum(1 + self.count(d.ri, e[1]) for e in d.missing)
        for d in self.dirs:
            for e in d.writes:
                _check_fields(self.snap, e)
            for e in d.chmods:
                _check_fields(self.snap, e)
            if d.entry is not None:
                _check_fields(self.snap, d.entry)
            if self.roots[d.ri].whole:
                self.check_links(d)
            for e in d.writes:
                if e[2] == "f" and (e[7] != "link" or not self.roots[d.ri].whole):
                    # A copy is staged (its sha256 checked on the way) and renamed in.
                    tmp = self.stage_path(d.ri)
                    self.place(e, tmp)
                    self.staged[id(e)] = tmp
            for e in d.missing:
                tmp = self.stage_path(d.ri)
                self.build(d.ri, e[1], e, tmp)
                self.staged[id(e)] = tmp

    # Commit ----------------------------------------------------------------------------
    def commit(self) -> None:
        for d in self.dirs:
            if self.roots[d.ri].whole:
                self.commit_folder(d)
            else:
                self.commit_listed(d)

    def commit_folder(self, d: _Dir) -> None:
        """Apply folder d's changes, every call relative to the open folder (and to the
        open stored folder for links): no path is resolved again per file."""
        e = d.entry
        attrs_off = d.attrs_off
        try:
            fd = os.open(d.path, _DIR_FLAGS)
        except FileNotFoundError:
            if e is not None:
                raise
            os.makedirs(d.path)  # the root itself was gone
            fd = os.open(d.path, _DIR_FLAGS)
        sfd = -1
        try:
            for p, is_dir in d.extras:
                name = p.rpartition("/")[2]
                if is_dir:
                    # One rename out of the environment; deleted once it is back.
                    try:
                        os.rename(name, self.stage_path(d.ri), src_dir_fd=fd)
                    except OSError as exc:
                        if exc.errno != errno.EXDEV:  # a mount point inside the prefix
                            raise
                        shutil.rmtree(p)
                else:
                    try:
                        os.unlink(name, dir_fd=fd)
                    except FileNotFoundError:
                        pass
            for k in d.missing:
                os.rename(self.staged[id(k)], k[1].rpartition("/")[2], dst_dir_fd=fd)
            for k in d.writes:
                name = k[1].rpartition("/")[2]
                tmp = self.staged.get(id(k))
                if tmp is not None:
                    os.replace(tmp, name, dst_dir_fd=fd)
                    continue
                # Replaced in place: an unlink and a link cost less than staging a link and
                # renaming it (the service is stopped; a restore cut short here is finished
                # by the next).
                try:
                    os.unlink(name, dir_fd=fd)
                except FileNotFoundError:
                    pass
                if k[2] == "l":
                    os.symlink(k[8], name, dir_fd=fd)
                    self.count_written()
                    continue
                if sfd < 0:
                    sfd = os.open(self.stored_folder(d), _DIR_FLAGS)
                sst = self.links[(k[0], k[1])]
                try:
                    os.link(name, name, src_dir_fd=sfd, dst_dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in _NO_LINK:
                        raise
                    del self.links[(k[0], k[1])]
                    self.place(k, f"{d.path}/{name}")  # copies
                    continue
                if stat.S_IMODE(sst.st_mode) != k[3]:
                    os.chmod(name, k[3], dir_fd=fd)
                if sst.st_mtime_ns != k[5]:
                    os.utime(name, ns=(k[5], k[5]), dir_fd=fd)
                self.count_written()
            for k in d.chmods:
                os.chmod(k[1].rpartition("/")[2], k[3], dir_fd=fd)
            # The folder itself last: every change above altered its mtime.
            if e is not None and d.st is not None:
                if stat.S_IMODE(d.st.st_mode) != e[3]:
                    os.chmod(fd, e[3])
                if d.touched or attrs_off:
                    os.utime(fd, ns=(e[5], e[5]))
        finally:
            os.close(fd)
            if sfd >= 0:
                os.close(sfd)

    def commit_listed(self, d: _Dir) -> None:
        for p, is_dir in d.extras:
            if is_dir:
                os.rename(p, self.stage_path(d.ri))
            else:
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        for e in d.writes:
            p = self.path_of(d, e)
            tmp = self.staged.get(id(e))
            if tmp is None:  # a symlink
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
                os.makedirs(os.path.dirname(p), exist_ok=True)
                self.place(e, p)
                continue
            try:
                os.replace(tmp, p)
            except FileNotFoundError:  # the file's folder may be gone
                os.makedirs(os.path.dirname(p), exist_ok=True)
                os.replace(tmp, p)
        for e in d.chmods:
            os.chmod(self.path_of(d, e), e[3])

    # Verify ----------------------------------------------------------------------------
    def verify(self) -> list[str]:
        """What differs from the manifest in the folders this restore changed (nothing, when
        it worked): each holds exactly the manifest's names, with the manifest's mode and
        mtime (folders it built, all the way down); copies, symlinks and re-moded files are
        stat'ed again. A re-linked file needs no second look: link(2) made its name the
        stored inode whose size and mtime were checked just before, and a copy had its
        sha256 checked while it was made."""
        problems: list[str] = []
        for d in self.dirs:
            for e in d.writes + d.chmods:
                if (e[0], e[1]) in self.links and self.roots[d.ri].whole:
                    continue
                p = self.path_of(d, e)
                try:
                    st = os.lstat(p)
                except FileNotFoundError:
                    problems.append(f"missing: {e[1]}")
                    continue
                problem = _entry_problem(e, st, p)
                if problem:
                    problems.append(problem)
            if not self.roots[d.ri].whole:
                problems.extend(f"extra: {p}" for p, _ in d.extras if os.path.lexists(p))
            elif d.touched:
                self.check_folder(d.ri, d.rel, d.path, d.entry, problems, deep=False)
                for e in d.missing:
                    self.check_folder(d.ri, e[1], self.path_of(d, e), e, problems, deep=True)
            elif d.attrs_off and d.entry is not None:
                # Only its mode or mtime was reset (a reinstall touches every folder it writes
                # into): its names were compared by the scan and the commit changed none.
                try:
                    st = os.lstat(d.path)
                except FileNotFoundError:
                    problems.append(f"missing: {d.rel}")
                    continue
                if not stat.S_ISDIR(st.st_mode) or stat.S_IMODE(st.st_mode) != d.entry[3] \
                        or st.st_mtime_ns != d.entry[5]:
                    problems.append(f"folder mode or mtime differs: {d.rel}")
        return problems

    def summary(self) -> dict[str, Any]:
        """What this lane did, for the lane that reports the restore."""
        return {"written": self.written, "deleted": sum(len(d.extras) for d in self.dirs),
                "chmodded": sum(len(d.chmods) for d in self.dirs),
                "folders_rebuilt": sum(len(d.missing) for d in self.dirs), "others": self.others,
                "displaced": list(self.staging.values()), "proven": self.proven,
                "aliases": self.same.found if self.same is not None else {}}

    def check_folder(self, ri: int, rel: str, path: str, e: list[Any] | None, problems: list[str],
                     deep: bool) -> None:
        if e is not None:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                problems.append(f"missing: {rel}")
                return
            if not stat.S_ISDIR(st.st_mode):
                problems.append(f"type differs: {rel}")
                return
            if stat.S_IMODE(st.st_mode) != e[3] or st.st_mtime_ns != e[5]:
                problems.append(f"folder mode or mtime differs: {rel}")
        f = self.folders.get((ri, rel)) or _EMPTY
        prefix = f"{rel}/" if rel else ""
        try:
            live = set(os.listdir(path))
        except FileNotFoundError:
            live = set()
        # Sets, compared in C: this runs for every folder the commit touched.
        if "o" in f.types:  # sockets and the like: neither required nor extra
            others = {n for n, k in zip(f.names, f.types, strict=True) if k == "o"}
            want = set(f.names) - others
            live -= others
        else:
            want = set(f.names)
        extra = live - want
        extra.discard(self.skip.get(path))
        for n in sorted(extra):  # none, normally: only a socket or FIFO, or a nested env, may stay
            kind = _kind(os.lstat(f"{path}/{n}").st_mode)
            if (not n.startswith(STAGING_PREFIX) and kind != "o"
                    and not (kind == "d" and nested_prefix(f"{path}/{n}", prefix + n, self.roots[ri].path))
                    and not (self.excluded is not None and ri == 0 and self.excluded(prefix + n))):
                problems.append(f"extra: {prefix}{n}")
        problems.extend(f"missing: {prefix}{n}" for n in sorted(want - live))
        if deep:
            for i in (i for i, k in enumerate(f.types) if k == "d"):
                name = f.names[i]
                self.check_folder(ri, prefix + name, f"{path}/{name}", f.entry(ri, rel, i), problems, deep)


LANES_MIN_FILES = 4000  # below this, a second lane costs more (a fork) than it saves


def restore_lanes_setting() -> int | None:
    """`REWHEEL_RESTORE_LANES` (1 or 2), or None when unset. Commands check it before they
    act (`runner.open_target`), so a bad value changes nothing."""
    forced = os.environ.get("REWHEEL_RESTORE_LANES", "").strip()
    if forced and forced not in ("1", "2"):
        raise UsageError(f"REWHEEL_RESTORE_LANES={forced!r}: expected 1 or 2",
                         hint="unset it to let rewheel choose (2 on Linux with two CPUs, for a large environment)")
    return int(forced) if forced else None


def _auto_lanes(snap: SnapshotMeta) -> int:
    """`REWHEEL_RESTORE_LANES` when set; otherwise two lanes on Linux (where a fork is cheap
    and safe beside a progress display's thread) with two CPUs, for enough files to share."""
    forced = restore_lanes_setting()
    if forced is not None:
        return forced
    return 2 if (sys.platform.startswith("linux") and (os.cpu_count() or 1) >= 2
                 and snap.files >= LANES_MIN_FILES) else 1


def restore_snapshot(env: Environment, snap: SnapshotMeta, *, progress: Progress | None = None,
                     full_verify: bool = False, defer_removal: bool = False,
                     lanes: int | None = None) -> RestoreResult:
    """Make the environment's files exactly the snapshot's, then verify. Offline; no uv.

    Cost: one listing of the environment, a stat of each file that may be unchanged (a
    shared file found at another inode needs none), and work in proportion to what
    changed: a link and an unlink per replaced file. Folders that must go (a failed
    build's new subpackages and dist-info) leave in one rename each and are deleted after
    the environment is back — by the caller, once it has restarted the service, with
    `defer_removal=True` (`RestoreResult.displaced`, `remove_displaced`).

    With `lanes=2` (the default on two or more CPUs, for a snapshot of LANES_MIN_FILES files
    or more) the folders are shared out between this process and a forked one, which
    compare, check, commit and verify their own folders at the same time: the work is
    system calls, and a second process makes them on a second CPU (threads would queue on
    the GIL between calls). Both lanes have checked everything they will use before either
    changes anything; a lane that fails before the commit stops both.
    `full_verify=True` walks the whole environment again after the commit.
    """
    t0 = time.perf_counter()
    phases: dict[str, float] = {}

    def mark(name: str) -> None:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0 - sum(phases.values())

    n = _auto_lanes(snap) if lanes is None else max(1, min(2, lanes))
    # Tens of thousands of names, numbers, entries and stat results, none of them in a
    # cycle: the cyclic collector would only walk them again and again.
    with _gc_paused():
        live_roots = scope_of(env)
        _remove_stale_staging(live_roots)
        # The other lane is forked before the manifest is read: each reads its own copy
        # (in parallel), so neither pays for copy-on-write pages of the other's objects.
        peer = _Peer.start(env, snap, live_roots, remove=not defer_removal) if n == 2 else None
        try:
            r = _prepare(env, snap, live_roots, (0, 2) if peer else None, progress, mark)
        except BaseException:
            if peer is not None:
                peer.stop()
            raise
        try:
            if peer is not None:
                peer.staged()  # raises what stopped the other lane, if anything did
                mark("stage")
                peer.go()
            try:
                r.commit()
            except OSError as exc:
                raise _failed_midway(env, snap, exc) from exc
            mark("commit")
        except BaseException:
            r.discard_staging()
            if peer is not None:
                peer.stop()
            raise
        # The flush runs while the verification reads the tree back and the plan is freed
        # (the kernel does the one, Python the others); it has finished before this
        # returns or raises, so a restore reported done is on disk. It starts once both
        # lanes have committed, so it covers what each wrote.
        syncer = threading.Thread(target=os.sync, name="rewheel-sync", daemon=True)
        back: RestoreResult | None = None
        other: dict[str, Any] = {}
        try:
            try:
                if peer is not None:
                    peer.committed()
                syncer.start()
                problems = [] if full_verify else r.verify()
                done = r.summary()
                if peer is not None:
                    other = peer.done()
                    problems += other.pop("problems")
                    other_aliases = other.pop("aliases")
                    done = {k: v + other[k] for k, v in done.items() if k != "aliases"}
                    done["aliases"] = {**r.summary()["aliases"], **other_aliases}
                # Proven before the commit, true whatever the verification finds.
                _save_aliases(snap, done["aliases"])
                if full_verify:
                    verified = verify(env, snap, r.man)
                else:
                    _raise_if_problems(env, snap, problems)
                    verified = sum(len(f.names) for f in r.folders.values()) - done["others"]
            except BaseException:
                r.discard_staging()
                for p in other.get("displaced", ()):  # what the other lane moved out
                    shutil.rmtree(p, ignore_errors=True)
                raise
            mark("verify")
            res = back = RestoreResult(snap.id, done["written"], done["deleted"], done["chmodded"],
                                       verified - done["written"] - done["chmodded"], verified, 0.0,
                                       folders_rebuilt=done["folders_rebuilt"], displaced=done["displaced"],
                                       phases=phases, lanes=n, proven_same=done["proven"])
            del r  # freed here, so the collector has none of it to walk once back on
        finally:
            if syncer.ident is not None:
                syncer.join()
            t_back = time.perf_counter()
            if peer is not None:
                if not defer_removal and back is not None:
                    remove_displaced(back)  # while the other lane deletes what it moved out
                peer.reap()
        mark("finish")
    # `seconds`: until the environment is back, verified and on disk. Deleting what was
    # moved out of it is counted apart (`removal_seconds`), whenever it happens.
    res.seconds = t_back - t0
    if not defer_removal:
        remove_displaced(res)
        res.removal_seconds = time.perf_counter() - t_back
    return res


def _failed_midway(env: Environment, snap: SnapshotMeta, exc: OSError) -> RestoreError:
    """A commit stopped by the system (in either lane): what to do about it."""
    return RestoreError(f"restoring snapshot {snap.id} into {env.prefix} failed midway: {exc}",
                        hint=f"fix the cause (disk full? permissions?) and run `rewheel rollback --python "
                             f"{env.python} {snap.id}` again; the restore is idempotent")


def _prepare(env: Environment, snap: SnapshotMeta, live_roots: list[Root], lane: tuple[int, int] | None,
             progress: Progress | None, mark: Callable[[str], None]) -> _Restore:
    """Read the manifest, compare the lane's folders with it, check and stage what they
    need. Nothing in the environment has changed when this returns or raises."""
    man = Manifest.load(snap, validate=False)
    # Acted on by their real paths: a prefix reached through a symlink (`/srv/env` ->
    # `/data/env`) is walked with O_NOFOLLOW from a root that must be the folder itself.
    roots = [Root(os.path.realpath(r.path), r.whole) for r in _live_roots(snap, man, live_roots)]
    r = _Restore(env, snap, man, roots, progress, lane)  # indexes the manifest, validating it
    mark("load")
    try:
        for ri, root in enumerate(roots):
            if root.whole:
                r.scan_root(ri)
            elif lane is None or lane[0] == 0:
                r.scan_listed(ri)
    except ManifestDamaged as exc:
        raise _bad_entry(snap, exc) from None
    mark("scan")
    try:
        r.stage()  # every stored file the commit will use is checked here
    except BaseException as exc:
        r.discard_staging()
        if isinstance(exc, ManifestDamaged):
            raise _bad_entry(snap, exc) from None
        if isinstance(exc, OSError):
            raise RestoreError(
                f"restoring snapshot {snap.id} into {env.prefix} stopped while staging, before anything "
                f"changed: {exc}",
                hint=f"fix the cause (disk full? permissions?) and run `rewheel rollback --python {env.python} "
                     f"{snap.id}` again") from exc
        raise
    mark("stage")
    return r


_ERRORS: dict[str, type[RewheelError]] = {c.__name__: c for c in (SnapshotDamaged, RestoreError, SnapshotError)}


class _Peer:
    """The second lane of a restore: a forked process, and a pipe each way. It sends
    ("staged",) or ("failed", …) once its folders are compared, checked and staged, waits
    for "go" (or "stop", or the end of the pipe: it then discards its staging and exits),
    commits and sends ("committed",), verifies and sends ("done", summary) — or
    ("failed", error class, message, hint) at any point."""

    def __init__(self, pid: int, rfd: int, wfd: int) -> None:
        self.pid, self.rfd, self.wfd = pid, rfd, wfd

    @classmethod
    def start(cls, env: Environment, snap: SnapshotMeta, live_roots: list[Root], *, remove: bool = False) -> _Peer:
        up_r, up_w = os.pipe()
        down_r, down_w = os.pipe()
        with warnings.catch_warnings():
            # Python 3.12+ warns about forking a process with threads (a progress display):
            # the child touches none of their locks — it prints nothing, and leaves by _exit.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.close(up_r)
                os.close(down_w)
                _lane_child(env, snap, live_roots, down_r, up_w, remove)
                code = 0
            finally:
                os._exit(code)
        os.close(up_w)
        os.close(down_r)
        return cls(pid, up_r, down_w)

    def _recv(self) -> tuple[Any, ...]:
        try:
            return _recv(self.rfd)
        except (EOFError, OSError, ValueError) as exc:
            raise RestoreError(f"the restore's second process ended without reporting ({exc or 'no reply'})",
                               hint="run the rollback again; the restore is idempotent") from None

    def staged(self) -> None:
        msg = self._recv()
        if msg[0] != "staged":
            raise _error_from(msg)

    def go(self) -> None:
        _send(self.wfd, ("go",))

    def committed(self) -> None:
        msg = self._recv()
        if msg[0] != "committed":
            raise _error_from(msg)

    def done(self) -> dict[str, Any]:
        msg = self._recv()
        if msg[0] != "done":
            raise _error_from(msg)
        return msg[1]

    def stop(self) -> None:
        """Before the commit: the other lane discards what it staged and exits."""
        with contextlib.suppress(OSError):
            _send(self.wfd, ("stop",))
        self.reap()

    def reap(self) -> None:
        for fd in (self.rfd, self.wfd):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _lane_child(env: Environment, snap: SnapshotMeta, live_roots: list[Root], rfd: int, wfd: int,
                remove: bool = False) -> None:
    """The body of the second lane (in the forked process)."""
    with contextlib.suppress(ValueError):  # (not the main thread: then Ctrl-C never reaches this one)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the first lane decides; Ctrl-C reaches it
    try:
        r = _prepare(env, snap, live_roots, (1, 2), None, lambda name: None)
    except BaseException as exc:
        _send(wfd, _error_msg(exc))
        return
    try:
        _send(wfd, ("staged",))
        go = _recv(rfd)[0] == "go"
    except (EOFError, OSError, ValueError):  # the first lane stopped (and closed its end) first
        go = False
    if not go:
        r.discard_staging()
        return
    try:
        r.commit()
        _send(wfd, ("committed",))  # the first lane flushes both lanes' writes from here
        problems = r.verify()
    except BaseException as exc:
        r.discard_staging()
        if isinstance(exc, OSError):
            exc = _failed_midway(env, snap, exc)
        _send(wfd, _error_msg(exc))
        return
    done = r.summary()
    if remove and not problems:
        # What this lane moved out is deleted here, on the second CPU, while the first lane
        # deletes its own; the first waits for this process before it returns.
        displaced, done["displaced"] = done["displaced"], []
        _send(wfd, ("done", {**done, "problems": problems}))
        for path in displaced:
            shutil.rmtree(path, ignore_errors=True)
        return
    _send(wfd, ("done", {**done, "problems": problems}))


def _error_msg(exc: BaseException) -> tuple[Any, ...]:
    if isinstance(exc, RewheelError):
        return ("failed", type(exc).__name__, exc.message, exc.hint)
    return ("failed", type(exc).__name__, str(exc), None)


def _error_from(msg: tuple[Any, ...]) -> BaseException:
    _, name, message, hint = msg
    if name == "KeyboardInterrupt":  # the other lane ignores SIGINT; only a test raises it there
        return KeyboardInterrupt()
    cls = _ERRORS.get(name)
    if cls is None:
        return RestoreError(f"the restore's second process failed: {name}: {message}",
                            hint="run the rollback again; the restore is idempotent")
    return cls(message, hint=hint)


def _send(fd: int, msg: tuple[Any, ...]) -> None:
    """One message between the lanes: its length, then marshal (both ends are this code)."""
    data = marshal.dumps(msg)
    view = memoryview(struct.pack("<I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _recv(fd: int) -> tuple[Any, ...]:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise EOFError("the other lane closed its pipe")
            buf += chunk
        return buf

    (size,) = struct.unpack("<I", exactly(4))
    msg = marshal.loads(exactly(size))
    if not isinstance(msg, tuple) or not msg:
        raise ValueError("a malformed message")
    return msg


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def remove_displaced(res: RestoreResult) -> float:
    """Delete what a restore moved out of the environment (a failed build's files)."""
    t0 = time.monotonic()
    for p in res.displaced:
        shutil.rmtree(p, ignore_errors=True)
    res.displaced = []
    res.removal_seconds = time.monotonic() - t0
    return res.removal_seconds


def verify(env: Environment, snap: SnapshotMeta, man: Manifest | None = None) -> int:
    """Check the live environment against the manifest; raise RestoreError on any difference."""
    man = man or Manifest.load(snap)
    roots = [Root(os.path.realpath(r.path), r.whole) for r in _live_roots(snap, man, scope_of(env))]
    owned = _owned_now(roots, env)
    owned.update(os.path.join(roots[e[0]].path, e[1]) for e in man.entries if not roots[e[0]].whole)
    want = {(e[0], e[1]): e for e in man.entries if e[2] != "o"}
    same = _SameBytes(env, snap, man, roots)
    problems: list[str] = []
    seen = 0
    for ri, rel, st in _walk(roots, owned, {os.path.realpath(Path(snap.path).parents[3])}, None,
                             exclusion(man.exclude)):
        e = want.get((ri, rel))
        if e is None:
            if _kind(st.st_mode) != "o":
                problems.append(f"extra: {rel}")
            continue
        seen += 1
        path = os.path.join(roots[ri].path, rel)
        problem = _entry_problem(e, st, path)
        if problem and problem.startswith("content differs") and roots[ri].whole:
            folder, _, name = rel.rpartition("/")
            fp = same.folder(ri, folder, os.path.join(roots[ri].path, folder))
            if fp is None or not same.same(fp, name, e[4], lambda e=e: e[6], lambda st=st: st):
                problems.append(problem)
                continue
            problem = _entry_problem([*e[:5], st.st_mtime_ns, *e[6:]], st, path)  # its mode, still
        if problem:
            problems.append(problem)
    if seen != len(want):
        problems.append(f"missing: {len(want) - seen} entries")
    _raise_if_problems(env, snap, problems)
    return seen


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
    for src in cleanup_matches(globs, [snap.prefix, str(snap.path.parents[3]), *(protected or [])]):
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
    protected = [snap.prefix, str(snap.path.parents[3])]
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
