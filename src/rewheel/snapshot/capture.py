"""Taking a snapshot: walk the environment, name each file's object, store what is new.

Owns: `take_snapshot` and `estimate_snapshot`, the stat cache they read (`_Previous`: the
newest snapshot of the same roots), how a new file becomes an object (`_Ingest`: a private
copy or clone for anything a person may edit or no RECORD proves, a hard link for a large
binary RECORD proves), and the file copies other modules share (`copy_hashed`, `copy_plain`,
`clone_file`).

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
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rewheel.environment import Distribution, Environment
from rewheel.errors import SnapshotDamaged, SnapshotError, UsageError
from rewheel.paths import fsync_dir
from rewheel.snapshot.lanes import fork_child, recv_msg, send_msg
from rewheel.snapshot.manifest import Folder, Manifest, ManifestDamaged
from rewheel.snapshot.objects import Objects, copy_fd, copy_fd_hashed
from rewheel.snapshot.store import SnapshotMeta, Store, aliased_files
from rewheel.snapshot.tree import (STAGING_PREFIX, Progress, Root, TIE_HASH_MAX, excluded_distribution_file,
                                   exclusion, hand_editable, hash_file, nested_prefix, provably_pristine, proven_sha,
                                   record_index, scope_of, shared_paths, walk)

_FICLONE = 0x40049409
_HOW = {"L": "link", "C": "copy", "R": "reflink"}
_ZERO32 = bytes(32)
# Below this many entries in the packages to share, one process walks them all (a fork costs more).
_LANES_MIN_ENTRIES = 4000


def _by_name(de: os.DirEntry[str]) -> str:
    return de.name


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
# The stat cache: the newest snapshot of the same roots
# --------------------------------------------------------------------------------------
class _Previous:
    """The newest snapshot of these roots, when it names objects (version 3): each live file
    it recorded with the same inode, size, mtime, ctime and mode is unchanged since, and its
    object is the one that snapshot names. Objects a committed manifest names are kept by
    the store's sweep, so they are there."""

    def __init__(self, store: Store, roots: list[Root]) -> None:
        self.meta: SnapshotMeta | None = None
        self.man: Manifest | None = None
        real = [os.path.realpath(r.path) for r in roots]
        for meta in store.list():
            try:
                man = Manifest.load(meta, validate=False)
            except SnapshotDamaged:
                continue
            if man.uses_objects and (man.real_roots or [os.path.realpath(r.path) for r in man.roots]) == real:
                self.meta, self.man = meta, man
            break
        self._key: tuple[int, str] | None = None
        self._f: Folder | None = None
        self._shas: list[Any] | None = None

    def folder(self, ri: int, rel: str) -> Folder | None:
        if self.man is None:
            return None
        if self._key != (ri, rel):
            self._key, self._f, self._shas = (ri, rel), self.man.folders.get((ri, rel)), None
        return self._f

    def hit(self, ri: int, folder: str, name: str, st: os.stat_result) -> tuple[str, str] | None:
        """(sha256, stored code) of an unchanged file, else None."""
        f = self.folder(ri, folder)
        if f is None or f.ctimes is None:
            return None
        i = f.index.get(name)
        if (i is None or f.types[i] != "f" or f.ctimes[i] != st.st_ctime_ns or f.inos[i] != st.st_ino
                or f.sizes[i] != st.st_size or f.mtimes[i] != st.st_mtime_ns
                or f.modes[i] != stat.S_IMODE(st.st_mode)):
            return None
        try:
            if self._shas is None:
                self._shas = f.shas()
            sha = self._shas[i]
        except ManifestDamaged:
            return None
        return (sha, f.stored[i]) if isinstance(sha, str) else None

    def dist_infos(self) -> set[tuple[int, str]]:
        if self.man is None:
            return set()
        return {k for k in self.man.folders if k[1].endswith(".dist-info")}


class _Aliased:
    """Files a restore proved to hold a snapshot's bytes under a new inode (`aliases.bin`,
    see `SameBytes`): after a rollback over a force-reinstall their mtimes are newer than the
    RECORD put back, so RECORD no longer proves them — but the same inode with the same mtime
    and size still holds the bytes whose sha256 the restore recorded."""

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


class _Dists:
    """The environment's distributions and what their RECORDs say, read once and only when
    a file changed since the last snapshot needs them (reading every RECORD of a vLLM
    environment costs a third of a second)."""

    def __init__(self, env: Environment, dists: list[Distribution] | None) -> None:
        self.env = env
        self._dists = dists
        self._records: dict[str, tuple[str | None, int | None, int]] | None = None
        self._shared: dict[str, list[tuple[str | None, int | None, int]]] | None = None

    @property
    def given(self) -> bool:
        return self._dists is not None

    @property
    def dists(self) -> list[Distribution]:
        if self._dists is None:
            self._dists = self.env.distributions()
        return self._dists

    @property
    def records(self) -> dict[str, tuple[str | None, int | None, int]]:
        if self._records is None:
            self._records = record_index(self.dists)
        return self._records

    @property
    def shared(self) -> dict[str, list[tuple[str | None, int | None, int]]]:
        if self._shared is None:
            self._shared = shared_paths(self.dists)
        return self._shared


# --------------------------------------------------------------------------------------
# A file that changed: its sha256 and its object
# --------------------------------------------------------------------------------------
class _Ingest:
    """What a changed file becomes in the store. `dry`: only count (the estimate)."""

    def __init__(self, objects: Objects | None, dists: _Dists, aliased: _Aliased, *, dry: bool = False) -> None:
        self.objects, self.dists, self.aliased, self.dry = objects, dists, aliased, dry
        self.reflink: bool | None = None  # probed on the first file stored
        self.can_link = True
        self.planned: set[str] = set()  # (dry) private objects the snapshot would write
        self.n_copied = self.bytes_copied = 0  # private objects written
        self.n_reused = self.bytes_reused = 0  # contents already stored (unchanged, or seen before)
        self.n_private = self.bytes_private = 0  # hand-editable files: never the live inode

    def proven(self, ri: int, rel: str, src: str, st: os.stat_result) -> str | None:
        """The sha256 the file provably has without reading it (RECORD; an earlier restore's
        proof; a small file written in RECORD's clock tick, by its bytes), else None."""
        rec = self.dists.records.get(src)
        size = st.st_size
        if src in self.dists.shared:  # several owners: any whose RECORD the file matches proves it
            sha_shared = proven_sha(src, st, self.dists.shared[src])
            rec = (sha_shared, size, st.st_mtime_ns + 1) if sha_shared else None
        if rec and rec[0] and provably_pristine(size, st.st_mtime_ns, rec[1], rec[2]):
            return rec[0]
        sha = self.aliased.sha(ri, rel, st)
        if sha is not None:
            return sha
        # Written in the same clock tick as RECORD (INSTALLER, REQUESTED, uv_cache.json...):
        # not provably older, so proven by its bytes (small files) rather than a copy.
        if rec and rec[0] and st.st_mtime_ns == rec[2] and size <= TIE_HASH_MAX and hash_file(src) == rec[0]:
            return rec[0]
        return None

    def store(self, ri: int, rel: str, src: str, st: os.stat_result) -> tuple[str | None, str, int, int]:
        """(sha256, stored code, inode, ctime) for a file the last snapshot did not have as it
        is now; puts its object into the store unless it is there already. (`dry`: the sha256
        of a file no RECORD proves is None, and nothing is written.)"""
        size = st.st_size
        sha = self.proven(ri, rel, src, st)
        editable = hand_editable(rel.rpartition("/")[2], size)
        if editable and sha is not None:
            self.n_private += 1
            self.bytes_private += size
        objs = self.objects
        if sha is None:
            # No RECORD proves it: a copy, hashed while it is made (kept when the store lacks it).
            if self.dry or objs is None:
                # A small one is hashed, so that a content stored once counts once (as the
                # snapshot will find); a large one counts as a copy: never less than it costs.
                sha = hash_file(src) if size <= TIE_HASH_MAX else None
                if sha is not None and (sha in self.planned or (objs is not None and objs.has_private(sha, size))):
                    self._reused(size)
                else:
                    if sha is not None:
                        self.planned.add(sha)
                    self.n_copied += 1
                    self.bytes_copied += min(size, st.st_blocks * 512)
                return sha, "C", st.st_ino, st.st_ctime_ns
            sha, _, new = objs.copy_hashed_in(src)
            if new:
                self.n_copied += 1
                self.bytes_copied += min(size, st.st_blocks * 512)
            else:
                self._reused(size)
            return sha, "C", st.st_ino, st.st_ctime_ns
        if not self.dry and objs is not None:
            if self.reflink is None:
                # Whether this filesystem clones (XFS, btrfs): probed once, on the first file
                # stored. Where it does, every file is a clone of its own (none is linked).
                self.reflink = objs.can_clone(src)
            if self.reflink:
                if objs.has_private(sha, size):
                    self._reused(size)
                elif objs.clone_in(src, sha):
                    self.n_copied += 1
                else:  # a clone refused further down (another filesystem mounted inside)
                    self._copy(sha, src, st)
                return sha, "R", st.st_ino, st.st_ctime_ns
            if not editable and self.can_link:
                ost = objs.link_in(src, sha, st)
                if ost is not None:
                    # Linking changed the live inode's ctime (its link count): recorded as it is now.
                    same = (ost.st_dev, ost.st_ino) == (st.st_dev, st.st_ino)
                    ctime = ost.st_ctime_ns if same else st.st_ctime_ns
                    return sha, "L", ost.st_ino, ctime
                self.can_link = False  # the store is on another filesystem: copies from now on
        elif not editable and self.can_link:
            return sha, "L", st.st_ino, st.st_ctime_ns
        if self.dry:
            if sha in self.planned or (objs is not None and objs.has_private(sha, size)):
                self._reused(size)
            else:
                self.planned.add(sha)
                self.n_copied += 1
                self.bytes_copied += min(size, st.st_blocks * 512)
            return sha, "C", st.st_ino, st.st_ctime_ns
        assert objs is not None
        if objs.has_private(sha, size):
            self._reused(size)
        else:
            self._copy(sha, src, st)
        return sha, "C", st.st_ino, st.st_ctime_ns

    def _copy(self, sha: str, src: str, st: os.stat_result) -> None:
        assert self.objects is not None
        self.objects.copy_in(src, sha, st.st_size)
        self.n_copied += 1
        self.bytes_copied += min(st.st_size, st.st_blocks * 512)

    def _reused(self, size: int) -> None:
        self.n_reused += 1
        self.bytes_reused += size


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
                "files_private": m.extra.get("files_private", 0), "bytes_private": m.extra.get("bytes_private", 0)}


class _Walk:
    """One pass over the environment that names each entry's bytes, folder by folder: the
    stat cache for files the last snapshot recorded as they are now, `_Ingest` for the rest.
    A folder in which nothing changed keeps the last snapshot's columns as they are."""

    def __init__(self, env: Environment, store: Store, dists: _Dists, exclude: tuple[str, ...],
                 objects: Objects | None, *, dry: bool = False) -> None:
        self.env, self.store, self.dists, self.exclude = env, store, dists, exclude
        self.roots = scope_of(env)
        self.prev = _Previous(store, self.roots)
        self.ingest = _Ingest(objects, dists, _Aliased(store, self.roots), dry=dry)
        self.folders: dict[tuple[int, str], Folder] = {}
        self.nested: list[str] = []
        self.files = self.bytes_total = self.unchanged = self.entries = 0
        self.bytes_linked = self.n_linked = 0
        self.codes: set[str] = set()
        self.dist_info_changed = self.prev.man is None
        self.dist_infos: set[tuple[int, str]] = set()
        self.excluded = exclusion(exclude)
        self.skip = str(store.home)
        self.progress: Progress | None = None

    def run(self, progress: Progress | None = None, *, lanes: int = 1) -> None:
        """The whole walk. `lanes=2`: the packages of site-packages are shared out between this
        process and a forked one (balanced by the last snapshot's entries, or by RECORD's),
        each walking and storing its own; the other sends its folders back. The work is system
        calls (stats, links, copies), which a second process makes on a second CPU."""
        self.progress = progress
        split = self._split() if lanes == 2 else None
        if split is None:
            self._lane(None)
        else:
            self._two_lanes(split)
        if self.dist_infos != set(self.prev.dist_infos()):  # a .dist-info folder came or went
            self.dist_info_changed = True

    def _lane(self, split: tuple[int, str, frozenset[str]] | None, lane: int = 0) -> None:
        """Walk what lane `lane` owns: with `split` (root, site-packages, the names of its
        packages lane 1 owns), lane 1 takes those packages' folders, lane 0 everything else."""
        for ri, root in enumerate(self.roots):
            if lane == 1:
                if split is not None and ri == split[0]:
                    base = f"{root.path.rstrip('/')}/{split[1]}" if split[1] else root.path.rstrip("/")
                    prefix = f"{split[1]}/" if split[1] else ""
                    stack = [(prefix + n, f"{base}/{n}") for n in sorted(split[2], reverse=True)]
                    while stack:
                        rel, path = stack.pop()
                        stack.extend(reversed(self._folder(ri, rel, path)))
                continue
            if not root.whole:
                self._listed(ri)
                continue
            stack = [("", root.path)]
            while stack:
                rel, path = stack.pop()
                subdirs = self._folder(ri, rel, path)
                if split is not None and (ri, rel) == split[:2]:
                    mine = len(split[1]) + 1 if split[1] else 0
                    subdirs = [d for d in subdirs if d[0][mine:] not in split[2]]
                stack.extend(reversed(subdirs))

    def _split(self) -> tuple[int, str, frozenset[str]] | None:
        """Where the second lane's share is: the packages (folders) of the largest
        site-packages, about half the entries by the last snapshot's count (else by RECORD's);
        None when there is nothing worth sharing."""
        import sys

        if not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2:
            return None
        best: tuple[int, str] | None = None
        for site in self.env.site_dirs:
            real = os.path.realpath(site)
            for ri, r in enumerate(self.roots):
                base = os.path.realpath(r.path).rstrip("/")
                if r.whole and (real == base or real.startswith(base + "/")):
                    best = best or (ri, real[len(base) + 1:] if real != base else "")
                    break
        if best is None:
            return None
        ri, site_rel = best
        site_path = f"{self.roots[ri].path.rstrip('/')}/{site_rel}" if site_rel else self.roots[ri].path
        weight: dict[str, int] = {}
        if self.prev.man is not None:
            prefix = f"{site_rel}/" if site_rel else ""
            for (fri, rel), f in self.prev.man.folders.items():
                if fri == ri and rel.startswith(prefix) and len(rel) > len(prefix):
                    top = rel[len(prefix):].partition("/")[0]
                    weight[top] = weight.get(top, 0) + len(f.names)
        else:
            real_site = os.path.realpath(site_path).rstrip("/") + "/"
            for path in self.dists.records:
                if path.startswith(real_site):
                    top, _, below = path[len(real_site):].partition("/")
                    if below:
                        weight[top] = weight.get(top, 0) + 1
        try:
            with os.scandir(site_path) as it:
                dirs = [de.name for de in it if de.is_dir(follow_symlinks=False)
                        and not de.name.startswith(STAGING_PREFIX) and de.path != self.skip]
        except OSError:
            return None
        total = sum(weight.get(d, 0) for d in dirs)
        if total < _LANES_MIN_ENTRIES:
            return None
        share: list[str] = []
        load = 0
        for d in sorted(dirs, key=lambda n: -weight.get(n, 0)):
            if load + weight.get(d, 0) <= total // 2:
                share.append(d)
                load += weight.get(d, 0)
        # A name `exclude` or another environment takes out is the first lane's to leave out.
        prefix = f"{site_rel}/" if site_rel else ""
        share = [d for d in share if not (self.excluded is not None and ri == 0 and self.excluded(prefix + d))
                 and not nested_prefix(f"{site_path}/{d}", prefix + d, self.roots[ri].path)]
        return (ri, site_rel, frozenset(share)) if share else None

    def _two_lanes(self, split: tuple[int, str, frozenset[str]]) -> None:
        rfd, wfd = os.pipe()

        def body() -> None:
            os.close(rfd)
            try:
                self._lane(split, 1)
                msg: tuple[Any, ...] = ("done", self._export())
            except BaseException as exc:  # noqa: BLE001 - reported to the first lane, which raises it
                msg = ("failed", type(exc).__name__, getattr(exc, "message", str(exc)), getattr(exc, "hint", None),
                       getattr(exc, "errno", None), getattr(exc, "filename", None))
            send_msg(wfd, msg)

        pid = fork_child(body)
        os.close(wfd)
        try:
            try:
                self._lane(split, 0)
            finally:
                try:
                    msg = recv_msg(rfd)
                except (EOFError, OSError, ValueError) as exc:
                    msg = ("failed", "RuntimeError", f"the snapshot's second process ended without reporting ({exc})",
                           None, None, None)
        finally:
            os.close(rfd)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        if msg[0] != "done":
            _, name, message, hint, err, filename = msg
            if err is not None:
                raise OSError(err, message, filename)
            if name == "UsageError":
                raise UsageError(message, hint=hint)
            raise SnapshotError(f"the snapshot's second process failed: {name}: {message}", hint=hint or "")
        self._merge(msg[1])

    def _export(self) -> dict[str, Any]:
        """This lane's result, for the pipe: a folder the last snapshot holds as it is goes
        by its name alone."""
        prev = self.prev.man.folders if self.prev.man is not None else {}
        folders: list[tuple[int, str, Any]] = []
        for (ri, rel), f in self.folders.items():
            if prev.get((ri, rel)) is f:
                folders.append((ri, rel, None))
            else:
                folders.append((ri, rel, (list(f.names), f.types, list(f.modes), list(f.sizes), list(f.mtimes),
                                          f.stored, list(f.inos), list(f.ctimes or ()), f.sha_bytes(), f.targets)))
        ing = self.ingest
        return {"folders": folders, "nested": self.nested, "dist_infos": sorted(self.dist_infos),
                "dist_info_changed": self.dist_info_changed, "codes": sorted(self.codes),
                "n": [self.files, self.bytes_total, self.unchanged, self.entries, self.bytes_linked, self.n_linked,
                      ing.n_copied, ing.bytes_copied, ing.n_reused, ing.bytes_reused, ing.n_private,
                      ing.bytes_private]}

    def _merge(self, got: dict[str, Any]) -> None:
        prev = self.prev.man.folders if self.prev.man is not None else {}
        for ri, rel, cols in got["folders"]:
            if cols is None:
                self.folders[(ri, rel)] = prev[(ri, rel)]
            else:
                names, types, modes, sizes, mtimes, stored, inos, ctimes, shab, targets = cols
                self.folders[(ri, rel)] = Folder(names, types, modes, sizes, mtimes, stored, inos, None, ctimes, shab,
                                                 targets)
        self.nested += got["nested"]
        self.dist_infos.update(tuple(k) for k in got["dist_infos"])
        self.dist_info_changed = self.dist_info_changed or got["dist_info_changed"]
        self.codes.update(got["codes"])
        ing = self.ingest
        (files, total, unchanged, entries, blinked, nlinked, ncopied, bcopied, nreused, breused, nprivate,
         bprivate) = got["n"]
        self.files += files
        self.bytes_total += total
        self.unchanged += unchanged
        self.entries += entries
        self.bytes_linked += blinked
        self.n_linked += nlinked
        ing.n_copied += ncopied
        ing.bytes_copied += bcopied
        ing.n_reused += nreused
        ing.bytes_reused += breused
        ing.n_private += nprivate
        ing.bytes_private += bprivate

    def _folder(self, ri: int, rel: str, path: str) -> list[tuple[str, str]]:
        """Take folder `rel` (at `path`); returns its subfolders to take next, (rel, path)."""
        try:
            with os.scandir(path) as it:
                listing = {de.name: de for de in it}
        except (FileNotFoundError, NotADirectoryError):
            return []
        pf = self.prev.folder(ri, rel)
        if pf is not None and pf.ctimes is not None and pf.shab is not None:
            subdirs = self._unchanged(ri, rel, pf, listing)
            if subdirs is not None:
                return subdirs
        return self._changed(ri, rel, path, pf, sorted(listing.values(), key=_by_name))

    def _unchanged(self, ri: int, rel: str, pf: Folder, listing: dict[str, os.DirEntry[str]]
                   ) -> list[tuple[str, str]] | None:
        """When every entry of the folder is as the last snapshot recorded it (files: inode,
        size, mtime, ctime, mode; folders: mtime, mode; symlinks: target), its columns are
        taken as they are: its subfolders, to take next. None at the first difference."""
        names, types = pf.names, pf.types
        extra = len(listing) - len(names)
        if extra < 0:
            return None
        if extra:  # only names no snapshot holds may be left over (a staging folder, the store)
            prefix = f"{rel}/" if rel else ""
            left = [n for n in listing.keys() - pf.index.keys()
                    if not (n.startswith(STAGING_PREFIX) or listing[n].path == self.skip
                            or (self.excluded is not None and ri == 0 and self.excluded(prefix + n)))]
            if left:
                return None
        modes, sizes, mtimes, inos, ctimes, stored = pf.modes, pf.sizes, pf.mtimes, pf.inos, pf.ctimes, pf.stored
        assert ctimes is not None
        subdirs: list[tuple[str, str]] = []
        prefix = f"{rel}/" if rel else ""
        files = total = linked = linked_bytes = 0
        for k, name in enumerate(names):
            de = listing.get(name)
            if de is None:
                return None
            st = de.stat(follow_symlinks=False)
            m = st.st_mode
            kind = types[k]
            if kind == "f":
                if not (ctimes[k] == st.st_ctime_ns and inos[k] == st.st_ino and sizes[k] == st.st_size
                        and mtimes[k] == st.st_mtime_ns and m & 0o170000 == 0o100000 and modes[k] == m & 0o7777):
                    return None
                files += 1
                total += sizes[k]
                if stored[k] == "L":
                    linked += 1
                    linked_bytes += sizes[k]
            elif kind == "d":
                # A folder whose mtime is the same has had no entry added since: it cannot have
                # become another environment (a pyvenv.cfg or conda-meta in it) meanwhile.
                if not (m & 0o170000 == 0o040000 and mtimes[k] == st.st_mtime_ns and modes[k] == m & 0o7777):
                    return None
                subdirs.append((prefix + name, de.path))
            elif kind == "l":
                if not (m & 0o170000 == 0o120000 and modes[k] == m & 0o7777
                        and pf.link_targets()[k] == os.readlink(de.path)):
                    return None
            elif m & 0o170000 in (0o100000, 0o040000, 0o120000) or modes[k] != m & 0o7777:
                return None
        self.files += files
        self.bytes_total += total
        self.unchanged += files
        self.n_linked += linked
        self.bytes_linked += linked_bytes
        self.codes.update(c for c in set(stored) if c != "-")
        self.entries += len(names)
        if self.progress is not None:
            self.progress("snapshot", self.entries, 0)
        if rel.endswith(".dist-info"):
            self.dist_infos.add((ri, rel))
        self.folders[(ri, rel)] = pf
        return subdirs

    def _changed(self, ri: int, rel: str, path: str, pf: Folder | None, ents: list[os.DirEntry[str]]
                 ) -> list[tuple[str, str]]:
        """A folder in which something changed (or that the last snapshot lacks): entry by
        entry, unchanged files still taken from the last snapshot."""
        prefix = f"{rel}/" if rel else ""
        p_names = pf.names if pf is not None else []
        p_shab = pf.sha_bytes() if pf is not None and pf.ctimes is not None else b""
        same = pf is not None and pf.ctimes is not None
        names: list[str] = []
        types: list[str] = []
        modes: list[int] = []
        sizes: list[int] = []
        mtimes: list[int] = []
        stored: list[str] = []
        inos: list[int | None] = []
        ctimes: list[int] = []
        shab: list[bytes] = []
        targets: list[str | None] | None = None
        subdirs: list[tuple[str, str]] = []
        ingest, excluded, mode_of = self.ingest, self.excluded, stat.S_IMODE
        root_path = self.roots[ri].path
        for de in ents:
            name = de.name
            if name.startswith(STAGING_PREFIX) or de.path == self.skip:
                continue
            if excluded is not None and ri == 0 and excluded(prefix + name):
                continue
            st = de.stat(follow_symlinks=False)
            m = st.st_mode
            mode = mode_of(m)
            i = len(names)
            j: int | None = i if same and i < len(p_names) and p_names[i] == name else None
            if j is None and pf is not None:
                same = False
                j = pf.index.get(name)
            if stat.S_ISREG(m):
                size = st.st_size
                self.files += 1
                self.bytes_total += size
                if (j is not None and pf is not None and pf.ctimes is not None and pf.types[j] == "f"
                        and pf.ctimes[j] == st.st_ctime_ns and pf.inos[j] == st.st_ino and pf.sizes[j] == size
                        and pf.mtimes[j] == st.st_mtime_ns and pf.modes[j] == mode and pf.stored[j] != "-"
                        and p_shab[32 * j:32 * j + 32] != _ZERO32):
                    code, digest, ino, ctime = pf.stored[j], p_shab[32 * j:32 * j + 32], st.st_ino, st.st_ctime_ns
                    self.unchanged += 1
                else:
                    same = False
                    sha, code, ino, ctime = ingest.store(ri, prefix + name, de.path, st)
                    digest = bytes.fromhex(sha) if sha else _ZERO32
                if code == "L":
                    self.n_linked += 1
                    self.bytes_linked += size
                self.codes.add(code)
                kind, target = "f", None
            else:
                size = 0
                code, digest, ino, ctime, target = "-", _ZERO32, None, 0, None
                if stat.S_ISDIR(m):
                    if nested_prefix(de.path, prefix + name, root_path):
                        self.nested.append(de.path)
                        same = False
                        continue
                    kind = "d"
                    subdirs.append((prefix + name, de.path))
                    if same and j is not None and pf is not None and (pf.types[j] != "d" or pf.mtimes[j] != st.st_mtime_ns):
                        same = False
                elif stat.S_ISLNK(m):
                    kind, target = "l", os.readlink(de.path)
                    if targets is None:
                        targets = [None] * i
                    if same and j is not None and pf is not None and (
                            pf.types[j] != "l" or pf.link_targets()[j] != target):
                        same = False
                else:
                    kind = "o"
                    if same and j is not None and pf is not None and pf.types[j] != "o":
                        same = False
                if same and j is not None and pf is not None and pf.modes[j] != mode:
                    same = False
            names.append(name)
            types.append(kind)
            modes.append(mode)
            sizes.append(size)
            mtimes.append(st.st_mtime_ns if kind in "fd" else 0)
            stored.append(code)
            inos.append(ino)
            ctimes.append(ctime)
            shab.append(digest)
            if targets is not None:
                targets.append(target)
        self.entries += len(names)
        if self.progress is not None:
            self.progress("snapshot", self.entries, 0)
        key = (ri, rel)
        in_dist_info = ".dist-info" in rel
        if rel.endswith(".dist-info"):
            self.dist_infos.add(key)
        if same and pf is not None and len(names) == len(p_names):
            self.folders[key] = pf  # nothing in it changed: the last snapshot's columns, as they are
        else:
            self.dist_info_changed = self.dist_info_changed or in_dist_info
            self.folders[key] = Folder(names, "".join(types), modes, sizes, mtimes, "".join(stored), inos, None,
                                       ctimes, b"".join(shab), targets)
        return subdirs

    def _listed(self, ri: int) -> None:
        """A root of which only RECORD-listed files are the environment's (a system
        interpreter's scripts folder): those files, one by one."""
        entries: list[list[Any]] = []
        base = self.roots[ri].path.rstrip("/") + "/"
        for _, rel, st in walk([self.roots[ri]], self.dists.records, {self.skip}, None, None):
            if not stat.S_ISREG(st.st_mode):
                continue
            self.files += 1
            self.bytes_total += st.st_size
            self.dist_info_changed = True
            sha, code, ino, ctime = self.ingest.store(ri, rel, base + rel, st)
            if code == "L":
                self.n_linked += 1
                self.bytes_linked += st.st_size
            self.codes.add(code)
            entries.append([ri, rel, "f", stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, sha, _HOW[code], None,
                            ino, ctime])
        by: dict[str, list[list[Any]]] = {}
        for e in entries:
            by.setdefault(e[1].rpartition("/")[0], []).append(e)
        for folder, es in by.items():
            self.folders[(ri, folder)] = Folder.of(es)
        self.entries += len(entries)

    def distributions(self) -> tuple[dict[str, str], list[dict[str, Any]]]:
        """(versions, distributions) for meta.json: the previous snapshot's when no
        `.dist-info` folder changed since (each file in them unchanged), else read now."""
        prev = self.prev.meta
        if prev is not None and not self.dist_info_changed and not self.dists.given:
            return dict(prev.versions), list(prev.distributions)
        dists = self.dists.dists
        return {d.name: d.version_text for d in dists}, [d.to_json() for d in dists]

    @property
    def link_mode(self) -> str:
        return "+".join(sorted({"L": "hardlink", "C": "copy", "R": "reflink"}[c] for c in self.codes)) or "none"


def estimate_snapshot(env: Environment, store: Store, *, dists: list[Distribution] | None = None,
                      exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a snapshot of the environment would cost now, for the plan a person reads
    before saying yes: the walk `take_snapshot` makes, without storing anything. Files
    unchanged since the last snapshot cost nothing; of the rest, a content the store already
    holds costs nothing either, large binaries RECORD proves are hard-linked (no disk), and
    everything else is copied (its bytes, or what a sparse file occupies)."""
    lazy = _Dists(env, dists)
    if exclude:
        _refuse_excluded_distributions(env, lazy.records, exclude)
    with Objects(store.env_dir, create=False) as objs:
        w = _Walk(env, store, lazy, exclude, objs if objs.root.is_dir() else None, dry=True)
        w.run()
    ing = w.ingest
    free = shutil.disk_usage(store.snapshots_dir).free
    return {"files": w.files, "bytes_total": w.bytes_total, "files_to_copy": ing.n_copied,
            "bytes_to_copy": ing.bytes_copied, "bytes_reused": ing.bytes_reused, "files_unchanged": w.unchanged,
            "store_free": free, "nested_skipped": w.nested}


def take_snapshot(env: Environment, store: Store, *, label: str = "", status: str = "manual",
                  run_id: str | None = None, progress: Progress | None = None,
                  dists: list[Distribution] | None = None, exclude: tuple[str, ...] = ()) -> SnapshotResult:
    """Capture the environment's files into a new snapshot in `store`. `exclude`: globs
    (`[snapshots] exclude`) left out, and left alone by its restore."""
    t0 = time.monotonic()
    lazy = _Dists(env, dists)
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
            w = _Walk(env, store, lazy, exclude, objs)
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
                   **({"files_private": ing.n_private, "bytes_private": ing.bytes_private} if ing.n_private else {})})
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
