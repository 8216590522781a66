"""Snapshots: the store, the manifest, taking one, and restoring one byte for byte.

A snapshot is `<envdir>/snapshots/<id>/` with `meta.json` (label, status, versions,
distributions), `manifest.json` (every file, folder and symlink under the environment's
roots with its mode, size, mtime and — where known — sha256) and `tree/` (the contents).

Sharing: a file whose bytes provably equal what its wheel installed (RECORD hash known,
size equal, not modified since the install) is hard-linked into the tree (or reflinked,
or copied when the store is on another filesystem), and its hash is taken from RECORD, so
an 8 GB environment is captured without reading 8 GB. Every other file — hand-patched,
unlisted, or of unknown provenance — is copied and hashed while copying, so that editing
it in place later cannot change the snapshot.

Restore plans first (stat comparison against the manifest), then stages every file it
must write next to its destination (verifying hashes of copied contents), and only then
commits with `os.replace`; a damaged snapshot is refused before anything changes. The
restore is idempotent, so a restore interrupted mid-commit is finished by running it again.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewheel.environment import Distribution, Environment
from rewheel.errors import RestoreError, SnapshotDamaged, SnapshotError
from rewheel.paths import atomic_write, ensure_private_dir, env_dir, fsync_dir, state_home

MANIFEST_VERSION = 1
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


def _record_index(dists: list[Distribution]) -> dict[str, tuple[str | None, int | None, int]]:
    """abs path -> (sha256 hex from RECORD, size from RECORD, install time of its dist)."""
    index: dict[str, tuple[str | None, int | None, int]] = {}
    for d in dists:
        t = d.install_time_ns
        for e in d.record:
            index[e.path] = (e.sha256_hex, e.size, t)
    return index


def _walk(roots: list[Root], owned: set[str] | dict[str, Any], skip: set[str]) -> Iterator[tuple[int, str, os.stat_result]]:
    """Yield (root index, relative path, lstat) for everything a scope holds, parents first."""
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
        while stack:
            rel = stack.pop()
            full = os.path.join(root.path, rel) if rel else root.path
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
                st = de.stat(follow_symlinks=False)
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
        if not ref:
            raise SnapshotError(f"no snapshot {ref!r}")
        # An id is a plain folder name; a label may hold any text ("cu12.8/torch2.7").
        if "/" not in ref and not ref.startswith("."):
            exact = self.snapshots_dir / ref
            if (exact / "meta.json").exists():
                return SnapshotMeta.load(exact)
        matches = [m for m in self.list() if m.id.startswith(ref) or m.label == ref]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise SnapshotError(f"no snapshot {ref!r} for {self.env_dir.name}",
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


def copy_hashed(src: str, dst: str) -> tuple[str, int]:
    """Copy src to dst, returning (sha256 hex, size) of the bytes copied, in one pass."""
    h = hashlib.sha256()
    n = 0
    with open(src, "rb") as s, open(dst, "wb") as d:
        while True:
            chunk = s.read(_CHUNK)
            if not chunk:
                break
            h.update(chunk)
            d.write(chunk)
            n += len(chunk)
    return h.hexdigest(), n


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
                "label": m.label, "status": m.status}


def take_snapshot(env: Environment, store: Store, *, label: str = "", status: str = "manual",
                  run_id: str | None = None, progress: Progress | None = None,
                  dists: list[Distribution] | None = None) -> SnapshotResult:
    """Capture the environment's files into a new snapshot in `store`."""
    t0 = time.monotonic()
    dists = dists if dists is not None else env.distributions()
    records = _record_index(dists)
    roots = scope_of(env)
    snap_id = secrets.token_hex(4)
    tmp = store.snapshots_dir / f".tmp-{snap_id}"
    tree = tmp / "tree"
    tree.mkdir(parents=True, mode=0o700)
    linker = _Linker()
    entries: list[list[Any]] = []
    bytes_total = bytes_copied = bytes_linked = 0
    n_linked = n_copied = 0
    skip = {str(store.home)}
    for ri in range(len(roots)):
        (tree / str(ri)).mkdir()
    try:
        for i, (ri, rel, st) in enumerate(_walk(roots, records, skip)):
            src = os.path.join(roots[ri].path, rel)
            dst = os.path.join(tree, str(ri), rel)
            kind = _kind(st.st_mode)
            mode = stat.S_IMODE(st.st_mode)
            if kind == "d":
                # _walk yields parents first, so the parent already exists in the tree:
                # one mkdir per folder, and no per-file makedirs (3 syscalls a file).
                try:
                    os.mkdir(dst)
                except FileExistsError:
                    pass
                entries.append([ri, rel, "d", mode, 0, st.st_mtime_ns, None, None, None])
            elif kind == "l":
                entries.append([ri, rel, "l", mode, 0, 0, None, None, os.readlink(src)])
            elif kind == "f":
                if not roots[ri].whole:  # RECORD-listed files only: no parent entries walked
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                rec = records.get(src)
                size = st.st_size
                bytes_total += size
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
                    sha, size = copy_hashed(src, dst)
                    how = "copy"
                    bytes_copied += size
                    n_copied += 1
                    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
                entries.append([ri, rel, "f", mode, size, st.st_mtime_ns, sha, how, None])
            else:
                entries.append([ri, rel, "o", mode, 0, 0, None, None, None])
            if progress and i % 500 == 0:
                progress("snapshot", i, 0)
        manifest = {"version": MANIFEST_VERSION, "roots": [r.__dict__ for r in roots],
                    # Where the roots really were (a prefix reached through a symlink is
                    # the same environment by its real path, even once the symlink is gone).
                    "real_roots": [os.path.realpath(r.path) for r in roots],
                    "fields": ["root", "path", "type", "mode", "size", "mtime_ns", "sha256", "stored", "target"],
                    "entries": entries}
        atomic_write(tmp / "manifest.json", json.dumps(manifest, separators=(",", ":")))
        meta = SnapshotMeta(
            id=snap_id, path=store.snapshots_dir / snap_id, label=label, status=status,
            created=time.time(), prefix=str(env.prefix), python=str(env.python), kind=env.kind,
            versions={d.name: d.version_text for d in dists},
            distributions=[d.to_json() for d in dists],
            files=sum(1 for e in entries if e[2] == "f"), bytes_total=bytes_total,
            bytes_copied=bytes_copied, bytes_linked=bytes_linked,
            link_mode="+".join(sorted(linker.modes)) or "none", run_id=run_id)
        meta.path = tmp
        meta.save()
        os.rename(tmp, store.snapshots_dir / snap_id)
        fsync_dir(store.snapshots_dir)
        meta.path = store.snapshots_dir / snap_id
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SnapshotResult(meta, time.monotonic() - t0, n_linked, n_copied)


# --------------------------------------------------------------------------------------
# Restoring
# --------------------------------------------------------------------------------------
@dataclass
class Manifest:
    roots: list[Root]
    entries: list[list[Any]]
    real_roots: list[str] | None = None

    @classmethod
    def load(cls, snap: SnapshotMeta) -> Manifest:
        path = snap.path / "manifest.json"
        try:
            doc = json.loads(path.read_text())
            roots = [Root(str(r["path"]), bool(r["whole"])) for r in doc["roots"]]
            entries = doc["entries"]
            real_roots = [str(r) for r in doc["real_roots"]] if "real_roots" in doc else None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SnapshotDamaged(f"snapshot {snap.id}: manifest {path} is unreadable ({exc})",
                                  hint="restore another snapshot (`rewheel history`)") from None
        seen = set()
        for e in entries:
            if (not isinstance(e, list) or len(e) != 9 or not isinstance(e[0], int)
                    or not 0 <= e[0] < len(roots) or not _safe_rel(e[1])
                    or e[2] not in ("f", "d", "l", "o") or (e[0], e[1]) in seen):
                raise SnapshotDamaged(
                    f"snapshot {snap.id}: manifest entry {str(e)[:200]} is invalid or escapes the prefix",
                    hint="the snapshot was tampered with or damaged; restore another one")
            if e[2] == "l" and not isinstance(e[8], str):
                raise SnapshotDamaged(f"snapshot {snap.id}: symlink entry {e[1]} has no target")
            seen.add((e[0], e[1]))
        return cls(roots, entries, real_roots)


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

    def to_json(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot_id, "written": self.written, "deleted": self.deleted,
                "chmodded": self.chmodded, "unchanged": self.unchanged, "verified": self.verified,
                "seconds": round(self.seconds, 3), "cleanup_restored": self.cleanup_restored}


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


def _live_walk(roots: list[Root], owned: set[str], skip: set[str]) -> dict[tuple[int, str], os.stat_result]:
    """Every live entry (sockets and the like excepted) with its lstat: the plan's one walk.
    Unlike `_walk` it does not sort (a restore needs no order), which keeps it near the cost
    of a bare stat walk."""
    live: dict[tuple[int, str], os.stat_result] = {}
    for ri, root in enumerate(roots):
        if not root.whole:
            for _ri, rel, st in _walk([root], owned, skip):
                if _kind(st.st_mode) != "o":
                    live[(ri, rel)] = st
            continue
        base_len = len(root.path.rstrip("/")) + 1
        stack = [root.path]
        while stack:
            d = stack.pop()
            try:
                it = os.scandir(d)
            except (FileNotFoundError, NotADirectoryError):
                continue
            with it:
                for de in it:
                    if de.name.startswith(STAGING_PREFIX) or de.path in skip:
                        continue
                    st = de.stat(follow_symlinks=False)
                    m = st.st_mode
                    if stat.S_ISDIR(m):
                        stack.append(de.path)
                    elif not (stat.S_ISREG(m) or stat.S_ISLNK(m)):
                        continue
                    live[(ri, de.path[base_len:])] = st
    return live


def _stored_inodes(tree: Path, n_roots: int) -> dict[tuple[int, str], tuple[int, bool]]:
    """(root, rel) -> (inode, is a regular file) for everything stored, from directory
    listings alone (no stat per file)."""
    out: dict[tuple[int, str], tuple[int, bool]] = {}
    for ri in range(n_roots):
        base = os.path.join(tree, str(ri))
        base_len = len(base) + 1
        stack = [base]
        while stack:
            d = stack.pop()
            try:
                it = os.scandir(d)
            except OSError:
                continue
            with it:
                for de in it:
                    if de.is_dir(follow_symlinks=False):
                        stack.append(de.path)
                    out[(ri, de.path[base_len:])] = (de.inode(), de.is_file(follow_symlinks=False))
    return out


def _check_stored(snap: SnapshotMeta, tree: Path, e: list[Any]) -> os.stat_result:
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


def restore_snapshot(env: Environment, snap: SnapshotMeta, *, progress: Progress | None = None,
                     full_verify: bool = False) -> RestoreResult:
    """Make the environment's files exactly the snapshot's, then verify. Offline; no uv.

    Cost: one stat walk of the environment, directory listings of the store, and work in
    proportion to what changed — a rollback after upgrading torch and vllm touches their
    files only. Verification: the plan compares every live entry with the manifest; after
    the commit every path it wrote, removed or re-moded and every folder whose entries it
    changed is checked again (`full_verify=True`: walk everything again instead).
    """
    t0 = time.monotonic()
    live_roots = scope_of(env)
    tree = snap.path / "tree"
    skip = {str(Path(snap.path).parents[3])}
    _remove_stale_staging(live_roots)
    # The live walk and the store's listing are system calls that release the GIL: run them
    # in threads while this one parses the manifest. (Only for whole roots — a system
    # interpreter's RECORD-owned scope needs the manifest first.)
    pool = ThreadPoolExecutor(2)
    try:
        stored_f = pool.submit(_stored_inodes, tree, len(live_roots))
        live_f = (pool.submit(_live_walk, [Root(r.path, True) for r in live_roots], set(), skip)
                  if all(r.whole for r in live_roots) else None)
        man = Manifest.load(snap)
        roots = _live_roots(snap, man, live_roots)
        # Sockets, FIFOs and devices are not content: neither captured nor removed.
        want = {(e[0], e[1]): e for e in man.entries if e[2] != "o"}
        if live_f is None:
            owned = _owned_now(roots, env)
            owned.update(os.path.join(roots[e[0]].path, e[1]) for e in man.entries if not roots[e[0]].whole)
            live = _live_walk(roots, owned, skip)
        else:
            live = live_f.result()
        stored = stored_f.result()
    finally:
        pool.shutdown(wait=True)

    # Plan ------------------------------------------------------------------------------
    writes: list[list[Any]] = []
    stored_st: dict[int, os.stat_result] = {}
    chmods: list[list[Any]] = []
    unchanged = 0
    for key, e in want.items():
        st = live.get(key)
        kind = e[2]
        if kind == "f":
            # The store must hold every file, intact, before anything changes. A shared
            # file whose live twin is unchanged and still the very same inode is proven by
            # the listing alone; everything else is stat'ed.
            s_ino = stored.get(key)
            if s_ino is None or not s_ino[1]:
                _check_stored(snap, tree, e)  # raises: missing or not a regular file
            same = st is not None and _same_file(e, st)
            if not (same and e[7] == "link" and s_ino[0] == st.st_ino):
                stored_st[id(e)] = _check_stored(snap, tree, e)
            if same:
                if stat.S_IMODE(st.st_mode) != e[3]:
                    chmods.append(e)
                else:
                    unchanged += 1
            else:
                writes.append(e)
        elif kind == "l":
            if st is not None and stat.S_ISLNK(st.st_mode) and os.readlink(os.path.join(roots[e[0]].path, e[1])) == e[8]:
                unchanged += 1
            else:
                writes.append(e)
        elif kind == "d":
            if st is not None and stat.S_ISDIR(st.st_mode):
                unchanged += 1
            # directories are created/fixed during commit
    extras = [k for k, st in live.items() if k not in want or (want[k][2] == "d") != stat.S_ISDIR(st.st_mode)]

    # Stage -----------------------------------------------------------------------------
    staging: dict[int, str] = {}
    staged: list[tuple[list[Any], str]] = []
    try:
        for n, e in enumerate(writes):
            root = roots[e[0]].path
            if e[0] not in staging:
                os.makedirs(root, exist_ok=True)
                staging[e[0]] = os.path.join(root, STAGING_PREFIX + secrets.token_hex(4))
                os.mkdir(staging[e[0]], 0o700)
            tmp = f"{staging[e[0]]}/{n}"
            if e[2] == "l":
                os.symlink(e[8], tmp)
            else:
                src = f"{tree}/{e[0]}/{e[1]}"
                sst = stored_st.get(id(e))
                if e[7] == "link":
                    try:
                        os.link(src, tmp)
                    except OSError:
                        shutil.copyfile(src, tmp)
                        sst = None
                else:
                    sha, size = copy_hashed(src, tmp)
                    sst = None
                    if e[6] and sha != e[6]:
                        raise SnapshotDamaged(
                            f"snapshot {snap.id}: stored file {e[1]} does not match its recorded sha256 "
                            f"(expected {e[6][:12]}…, found {sha[:12]}…)",
                            hint="the store was tampered with or damaged; restore another snapshot")
                # A hard link shares the stored inode: its mode and mtime are already right
                # unless someone changed them; only then pay for chmod and utime.
                if sst is None or stat.S_IMODE(sst.st_mode) != e[3]:
                    os.chmod(tmp, e[3])
                if sst is None or sst.st_mtime_ns != e[5]:
                    os.utime(tmp, ns=(e[5], e[5]))
            staged.append((e, tmp))
            if progress and n % 500 == 0:
                progress("stage", n, len(writes))
    except BaseException:
        for s in staging.values():
            shutil.rmtree(s, ignore_errors=True)
        raise

    # Commit ----------------------------------------------------------------------------
    dirs = sorted((e for e in man.entries if e[2] == "d"), key=lambda e: e[1].count("/"))
    touched: set[tuple[int, str]] = set()  # folders whose entries the commit changes
    created: list[list[Any]] = []
    try:
        for key in sorted(extras, key=lambda k: k[1].count("/"), reverse=True):
            p = os.path.join(roots[key[0]].path, key[1])
            st = live[key]
            touched.add((key[0], key[1].rpartition("/")[0]))
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(p, ignore_errors=True)
            else:
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        removed = set(extras)
        for e in dirs:
            key = (e[0], e[1])
            st = live.get(key)
            if st is None or key in removed or not stat.S_ISDIR(st.st_mode):
                p = os.path.join(roots[e[0]].path, e[1])
                if os.path.lexists(p) and not os.path.isdir(p):
                    os.unlink(p)
                os.makedirs(p, exist_ok=True)
                created.append(e)
                touched.add((e[0], e[1].rpartition("/")[0]))
        for e, tmp in staged:
            p = f"{roots[e[0]].path}/{e[1]}"
            key = (e[0], e[1])
            st = live.get(key)
            if st is not None and key not in removed and stat.S_ISDIR(st.st_mode):
                shutil.rmtree(p)
            try:
                os.replace(tmp, p)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(p), exist_ok=True)
                os.replace(tmp, p)
            if st is None or key in removed:
                touched.add((e[0], e[1].rpartition("/")[0]))
        for e in chmods:
            os.chmod(os.path.join(roots[e[0]].path, e[1]), e[3])
        created_keys = {(e[0], e[1]) for e in created}
        for e in reversed(dirs):
            key = (e[0], e[1])
            st = live.get(key)
            fresh = key in created_keys or st is None
            if fresh or key in touched or stat.S_IMODE(st.st_mode) != e[3] or st.st_mtime_ns != e[5]:
                p = os.path.join(roots[e[0]].path, e[1])
                if fresh or stat.S_IMODE(st.st_mode) != e[3]:
                    os.chmod(p, e[3])
                os.utime(p, ns=(e[5], e[5]))
    except OSError as exc:
        raise RestoreError(f"restoring snapshot {snap.id} into {env.prefix} failed midway: {exc}",
                           hint=f"fix the cause (disk full? permissions?) and run `rewheel rollback --python {env.python} {snap.id}` again; the restore is idempotent") from exc
    finally:
        for s in staging.values():
            shutil.rmtree(s, ignore_errors=True)
    os.sync()

    if full_verify:
        verified = verify(env, snap, man)
    else:
        verified = _verify_changed(env, snap, roots, want, [e for e, _ in staged] + chmods + created,
                                   extras, touched, len(want) - len(writes) - len(chmods))
    return RestoreResult(snap.id, len(writes), len(extras), len(chmods), unchanged, verified,
                         time.monotonic() - t0)


def _verify_changed(env: Environment, snap: SnapshotMeta, roots: list[Root], want: dict[tuple[int, str], list[Any]],
                    changed: list[list[Any]], extras: list[tuple[int, str]], touched: set[tuple[int, str]],
                    seen_ok: int) -> int:
    """After a commit: every entry it wrote or re-moded matches the manifest, every extra is
    gone, and every folder whose entries it changed lists exactly the manifest's entries."""
    problems: list[str] = []
    for e in changed:
        p = f"{roots[e[0]].path}/{e[1]}"
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            problems.append(f"missing: {e[1]}")
            continue
        problem = _entry_problem(e, st, p)
        if problem:
            problems.append(problem)
    for key in extras:
        if key not in want and os.path.lexists(os.path.join(roots[key[0]].path, key[1])):
            problems.append(f"extra: {key[1]}")
    for ri, rel in touched:
        if rel and (ri, rel) not in want:
            continue  # a folder that was itself extra and is gone (checked above)
        if roots[ri].whole:
            d = os.path.join(roots[ri].path, rel) if rel else roots[ri].path
            prefix = f"{rel}/" if rel else ""
            try:
                with os.scandir(d) as it:
                    for de in it:
                        if (ri, prefix + de.name) not in want and not de.name.startswith(STAGING_PREFIX):
                            if _kind(de.stat(follow_symlinks=False).st_mode) != "o":
                                problems.append(f"extra: {prefix + de.name}")
            except FileNotFoundError:
                problems.append(f"missing: {rel}")
    _raise_if_problems(env, snap, problems)
    return seen_ok + len(changed)


def verify(env: Environment, snap: SnapshotMeta, man: Manifest | None = None) -> int:
    """Check the live environment against the manifest; raise RestoreError on any difference."""
    man = man or Manifest.load(snap)
    roots = _live_roots(snap, man, scope_of(env))
    owned = _owned_now(roots, env)
    owned.update(os.path.join(roots[e[0]].path, e[1]) for e in man.entries if not roots[e[0]].whole)
    want = {(e[0], e[1]): e for e in man.entries if e[2] != "o"}
    problems: list[str] = []
    seen = 0
    for ri, rel, st in _walk(roots, owned, {str(Path(snap.path).parents[3])}):
        e = want.get((ri, rel))
        if e is None:
            if _kind(st.st_mode) != "o":
                problems.append(f"extra: {rel}")
            continue
        seen += 1
        problem = _entry_problem(e, st, os.path.join(roots[ri].path, rel))
        if problem:
            problems.append(problem)
    if seen != len(want):
        problems.append(f"missing: {len(want) - seen} entries")
    _raise_if_problems(env, snap, problems)
    return seen


# --------------------------------------------------------------------------------------
# Cleanup paths: moved into a snapshot, moved back on rollback
# --------------------------------------------------------------------------------------
def stash_cleanup(snap: SnapshotMeta, globs: list[str] | tuple[str, ...]) -> list[dict[str, Any]]:
    """Move files matching the globs into the snapshot (recorded in meta before each move)."""
    dest = snap.path / "cleanup"
    moved: list[dict[str, Any]] = []
    for pattern in globs:
        for src in sorted(glob.glob(pattern)):
            if not os.path.lexists(src):
                continue
            dest.mkdir(exist_ok=True, mode=0o700)
            item = {"path": src, "stored": str(len(snap.cleanup)),
                    "bytes": os.lstat(src).st_size}
            snap.cleanup.append(item)
            snap.save()
            shutil.move(src, dest / item["stored"])
            moved.append(item)
    return moved


def unstash_cleanup(snap: SnapshotMeta) -> int:
    """Move stashed cleanup paths back where they were (idempotent)."""
    n = 0
    for item in snap.cleanup:
        stored = snap.path / "cleanup" / item["stored"]
        if stored.exists() or stored.is_symlink():
            if not os.path.lexists(item["path"]):
                os.makedirs(os.path.dirname(item["path"]), exist_ok=True)
                shutil.move(str(stored), item["path"])
                n += 1
    return n
