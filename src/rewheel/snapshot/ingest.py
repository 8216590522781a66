"""What a snapshot knows of a file before it reads it, and what a changed file becomes.

Owns: the stat cache (`Previous`: the newest snapshot of the same roots; a file with the
inode, size, mtime, ctime and mode it recorded is unchanged, and its object is that
snapshot's), the environment's distributions read once and only when a changed file needs
them (`Dists`), an earlier restore's proofs (`Aliased`), and `Ingest`: a changed file's
sha256 (RECORD's, a proof's, or its bytes') and its object — a private copy or clone for a
file a person may edit or no RECORD proves, a hard link for a large binary RECORD proves,
nothing at all for a content the store already holds.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from rewheel.environment import Distribution, Environment, RecordEntry
from rewheel.errors import SnapshotDamaged
from rewheel.snapshot.manifest import Folder, Manifest, ManifestDamaged
from rewheel.snapshot.objects import Objects, object_name
from rewheel.snapshot.store import SnapshotMeta, Store, aliased_files
from rewheel.snapshot.tree import (TIE_HASH_MAX, Root, hand_editable, hash_file, provably_pristine, proven_sha,
                                   shared_paths)

# --------------------------------------------------------------------------------------
# The stat cache: the newest snapshot of the same roots
# --------------------------------------------------------------------------------------
class Previous:
    """The newest snapshot of these roots, when it names objects (version 3): each live file
    it recorded with the same inode, size, mtime, ctime and mode is unchanged since, and its
    object is the one that snapshot names. Objects a committed manifest names are kept by
    the store's sweep, so they are there."""

    def __init__(self, store: Store, roots: list[Root], of: SnapshotMeta | None = None) -> None:
        """`of`: that snapshot rather than the newest."""
        self.meta: SnapshotMeta | None = None
        self.man: Manifest | None = None
        real = [os.path.realpath(r.path) for r in roots]
        for meta in [of] if of is not None else store.list():
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


class Aliased:
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


def sha256_of(field: str | None) -> str | None:
    """RECORD's hash field (`sha256=<urlsafe base64>`) as hex, or None."""
    return RecordEntry("", field, None).sha256_hex if field else None


class Dists:
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
        """abs path -> (RECORD's hash field as written, size, install time) — `tree.record_index`,
        but the hash left as RECORD spells it until a file needs it (`sha256_of`): converting
        every row of a vLLM environment's RECORDs costs more than the few files that changed."""
        if self._records is None:
            index: dict[str, tuple[str | None, int | None, int]] = {}
            for d in self.dists:
                t = d.install_time_ns
                for e in d.record:
                    # A path two distributions ship holds the bytes of the one installed last.
                    prev = index.get(e.path)
                    if prev is None or prev[2] <= t:
                        index[e.path] = (e.hash, e.size, t)
            self._records = index
        return self._records

    @property
    def shared(self) -> dict[str, list[tuple[str | None, int | None, int]]]:
        if self._shared is None:
            self._shared = shared_paths(self.dists)
        return self._shared


# --------------------------------------------------------------------------------------
# A file that changed: its sha256 and its object
# --------------------------------------------------------------------------------------
class Ingest:
    """What a changed file becomes in the store. `dry`: only count (the estimate)."""

    def __init__(self, objects: Objects | None, dists: Dists, aliased: Aliased, *, dry: bool = False,
                 take_over: bool = False) -> None:
        """`take_over`: a rollback's undo snapshot — a file whose bytes the store lacks is
        linked, not copied, and listed in `taken` (see `privatize`)."""
        self.objects, self.dists, self.aliased, self.dry = objects, dists, aliased, dry
        self.take_over = take_over and not dry
        self.taken: list[tuple[str, str, int]] = []  # (object name, live path, inode)
        self.n_taken = self.bytes_taken = 0
        self.reflink: bool | None = None  # probed on the first file stored
        self.can_link = True
        self.planned: set[str] = set()  # (dry) private objects the snapshot would write
        self.n_copied = self.bytes_copied = 0  # private objects written
        self.n_reused = self.bytes_reused = 0  # contents already stored (unchanged, or seen before)
        self.n_private = self.bytes_private = 0  # hand-editable files: never the live inode

    def proven(self, ri: int, rel: str, src: str, st: os.stat_result) -> str | None:
        """The sha256 the file provably has without reading it (RECORD; an earlier restore's
        proof; a small file written in RECORD's clock tick, by its bytes), else None."""
        raw = self.dists.records.get(src)
        rec = (sha256_of(raw[0]), raw[1], raw[2]) if raw is not None else None
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
        objs = self.objects
        if self.take_over and (editable or sha is None) and objs is not None and self.can_link:
            got = self._take_over(objs, src, st, sha, editable)
            if got is not None:
                return got
        if editable and sha is not None:
            self.n_private += 1
            self.bytes_private += size
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
            cloned = objs.clone_hashed_in(src) if self._clones(objs, src) else None
            if cloned is not None:
                sha, _, new = cloned
                if new:
                    self.n_copied += 1
                else:
                    self._reused(size)
                return sha, "R", st.st_ino, st.st_ctime_ns
            sha, _, new = objs.copy_hashed_in(src)
            if new:
                self.n_copied += 1
                self.bytes_copied += min(size, st.st_blocks * 512)
            else:
                self._reused(size)
            return sha, "C", st.st_ino, st.st_ctime_ns
        if not self.dry and objs is not None:
            if self._clones(objs, src):
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
                    # Always the live inode, also where the store had these bytes already under
                    # another file's: the next walk then finds this one unchanged.
                    same = (ost.st_dev, ost.st_ino) == (st.st_dev, st.st_ino)
                    return sha, "L", st.st_ino, ost.st_ctime_ns if same else st.st_ctime_ns
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
        self._copy(sha, src, st)
        return sha, "C", st.st_ino, st.st_ctime_ns

    def _clones(self, objs: Objects, src: str) -> bool:
        """Whether this filesystem clones (XFS, btrfs): probed once, on the first file stored.
        Where it does, every file is a clone of its own (none is linked)."""
        if self.reflink is None:
            self.reflink = objs.can_clone(src)
        return self.reflink

    def _take_over(self, objs: Objects, src: str, st: os.stat_result, sha: str | None, editable: bool
                   ) -> tuple[str | None, str, int, int] | None:
        """A file the restore after this snapshot will replace: its bytes stored once (a
        private object the store has), or its live inode linked and listed to be settled once
        the restore is done (`privatize`). None where the caller stores it as usual (a
        filesystem that clones: a clone costs no copy; links refused)."""
        if self._clones(objs, src):
            return None
        size = st.st_size
        if sha is None:
            sha = hash_file(src)  # read, not written
        if objs.has_private(sha, size):
            self._reused(size)
            if editable:
                self.n_private += 1
                self.bytes_private += size
            return sha, "C", st.st_ino, st.st_ctime_ns
        ost = objs.link_in(src, sha, st)
        if ost is None:
            self.can_link = False  # the store is on another filesystem: copies from now on
            return None
        if (ost.st_dev, ost.st_ino) != (st.st_dev, st.st_ino):
            self._reused(size)  # the same bytes and mtime, linked by an earlier snapshot
            return sha, "L", st.st_ino, st.st_ctime_ns
        self.taken.append((object_name(sha, "L", st.st_mtime_ns), src, st.st_ino))
        self.n_taken += 1
        self.bytes_taken += size
        return sha, "L", ost.st_ino, ost.st_ctime_ns

    def _copy(self, sha: str, src: str, st: os.stat_result) -> None:
        assert self.objects is not None
        if self.objects.copy_in(src, sha, st.st_size):
            self.n_copied += 1
            self.bytes_copied += min(st.st_size, st.st_blocks * 512)
        else:
            self._reused(st.st_size)

    def _reused(self, size: int) -> None:
        self.n_reused += 1
        self.bytes_reused += size
