"""Checking a snapshot's stored bytes against its manifest (`rewheel verify`, like git fsck).

Owns: `verify_snapshot` and its result (`VerifyResult`, one `Damage` per stored file that
no longer holds what the manifest says), `verify_store` (`rewheel verify`), and the memo that lets one
pass over several snapshots stat an inode they share only once.

Why it is needed: a file a snapshot shares with the live environment by a hard link is one
inode. An edit written *in place* into the live file (`echo >>`, `open(..., "w")`, vim on a
file with several links) rewrites the snapshot's copy too. Such an edit changes the inode's
mtime (and, mostly, its size), so the fast check — one `stat` per stored file, compared
with the manifest's type, size and mtime — finds it without reading a byte. `full=True`
also hashes every stored file against the manifest's sha256, which catches an edit that
put the old mtime back, and a store tampered with by hand.

Nothing here changes a file; the result names the damaged files for the caller to act on
(the rollback recovers their bytes, `history` and `patches` flag the snapshot).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewheel.errors import SnapshotDamaged
from rewheel.paths import atomic_write
from rewheel.snapshot.manifest import Manifest, ManifestDamaged
from rewheel.snapshot.objects import OBJECT_MTIME_NS, object_name, objects_dir
from rewheel.snapshot.store import SnapshotMeta
from rewheel.snapshot.tree import CHUNK, safe_rel, scope_of, strays

if TYPE_CHECKING:
    from rewheel.environment import Environment

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_HOW = {"L": "link", "R": "reflink", "C": "copy"}

# A folder of hard links (its names, inodes, sizes, mtimes) -> the problems found in it:
# snapshots of an unchanged environment share their stored inodes, and `history` checks
# each such folder once.
SharedInodes = dict[tuple[Any, ...], Any]


@dataclass
class Damage:
    """A stored file that no longer holds the bytes its manifest entry describes."""

    root: int  # index into the manifest's roots
    path: str  # relative to its root
    problem: str  # "missing" | "changed" | "not a file" | "sha256 differs" | "unreadable" | "bad name"
    stored: str  # how the snapshot holds it: "link" | "reflink" | "copy"
    size: int  # what the manifest says
    mtime_ns: int
    found_size: int | None = None  # what the stored file is now (None: gone or unreadable)
    found_mtime_ns: int | None = None
    # A hard link that other names share (the live environment, uv's cache): an edit written
    # in place through one of them is what changed it.
    shared: bool = False
    stored_at: str | None = None  # the stored file itself (an object, or a file of the tree)

    @property
    def stored_path_rel(self) -> str:
        return f"tree/{self.root}/{self.path}"

    def to_json(self) -> dict[str, Any]:
        return {"root": self.root, "path": self.path, "problem": self.problem, "stored": self.stored,
                "size": self.size, "found_size": self.found_size, "shared_inode": self.shared,
                "stored_path": self.stored_at}


@dataclass
class VerifyResult:
    snapshot_id: str
    path: str
    full: bool
    files_checked: int = 0
    bytes_hashed: int = 0
    seconds: float = 0.0
    damaged: list[Damage] = field(default_factory=list)
    manifest_error: str | None = None  # the manifest or meta.json cannot be read at all
    root_paths: list[str] = field(default_factory=list)  # the manifest's roots, for display

    @property
    def ok(self) -> bool:
        return not self.damaged and self.manifest_error is None

    def display(self, d: Damage) -> str:
        """A damaged file as a person finds it: its path in the environment."""
        if 0 <= d.root < len(self.root_paths):
            return f"{self.root_paths[d.root].rstrip('/')}/{d.path}"
        return d.path

    def to_json(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot_id, "path": self.path, "full": self.full, "ok": self.ok,
                "files_checked": self.files_checked, "bytes_hashed": self.bytes_hashed,
                "seconds": round(self.seconds, 3), "manifest_error": self.manifest_error,
                "damaged": [{**d.to_json(), "live_path": self.display(d)} for d in self.damaged]}


def _hash_at(fd: int, name: str, *, close: bool = False) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    try:
        f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    finally:
        if close:
            os.close(fd)
    try:
        while chunk := os.read(f, CHUNK):
            h.update(chunk)
            n += len(chunk)
    finally:
        os.close(f)
    return h.hexdigest(), n


def _check_folder(res: VerifyResult, f: Any, ri: int, prefix: str, fd: int, full: bool) -> int:
    """Every file of one folder checked on its own: names that are not plain (a tampered
    manifest: never opened), a folder that is gone, and `full` (hashes). Returns how many."""
    types, names, stored, sizes, mtimes = f.types, f.names, f.stored, f.sizes, f.mtimes
    add = res.damaged.append
    n = 0
    i = types.find("f")
    while i >= 0:
        n += 1
        name, how = names[i], stored[i]
        kind = _HOW.get(how, how)
        if type(name) is not str or not name or "/" in name or name in (".", "..") or "\x00" in name:
            add(Damage(ri, prefix + str(name), "bad name", kind, sizes[i], mtimes[i]))
            i = types.find("f", i + 1)
            continue
        problem = ""
        st = None
        if fd < 0:
            problem = "missing"
        else:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                problem = "missing"
            except OSError:
                problem = "unreadable"
        if st is not None:
            if not stat.S_ISREG(st.st_mode):
                problem = "not a file"
            elif st.st_size != sizes[i] or st.st_mtime_ns != mtimes[i]:
                problem = "changed"
            elif full:
                try:
                    want = f.sha(i)
                    got, nbytes = _hash_at(fd, name)
                    res.bytes_hashed += nbytes
                    if want is not None and got != want:
                        problem = "sha256 differs"
                except (OSError, ManifestDamaged):
                    problem = "unreadable"
        if problem:
            add(Damage(ri, prefix + name, problem, kind, sizes[i], mtimes[i],
                       st.st_size if st is not None else None, st.st_mtime_ns if st is not None else None,
                       shared=bool(st is not None and how == "L" and st.st_nlink > 1)))
        i = types.find("f", i + 1)
    return n


def verify_snapshot(snapshot: SnapshotMeta | Path | str, full: bool = False, *,
                    shared_inodes: SharedInodes | None = None) -> VerifyResult:
    """Check every stored file of a snapshot against its manifest entry.

    Fast (the default): one `stat` per stored file, relative to its open folder: it must be
    a regular file with the manifest's size and mtime. An edit written in place through a
    hard link changes the mtime, so this finds it. `full=True`: also hash every stored file
    and compare with the manifest's sha256. `shared_inodes`: a memo shared by calls over
    several snapshots of one store, so that a folder of hard links several snapshots hold
    (the manifest records each linked file's inode) is stat'ed once.
    """
    t0 = time.perf_counter()
    if isinstance(snapshot, SnapshotMeta):
        meta: SnapshotMeta | None = snapshot
        sdir = snapshot.path
    else:
        sdir = Path(snapshot)
        meta = None
    res = VerifyResult(sdir.name, str(sdir), full)
    try:
        if meta is None:
            meta = SnapshotMeta.load(sdir, sdir.parent)
        man = Manifest.load(meta, validate=False)
    except SnapshotDamaged as exc:
        res.manifest_error = exc.message
        res.seconds = time.perf_counter() - t0
        return res
    res.snapshot_id = meta.id
    res.root_paths = [r.path for r in man.roots]
    if man.uses_objects:
        res.files_checked = _check_objects(res, man, sdir, full, shared_inodes)
        res.seconds = time.perf_counter() - t0
        record_damage(sdir, len(res.damaged))
        return res
    tree = f"{sdir}/tree"
    memo = shared_inodes
    is_reg = stat.S_ISREG
    add = res.damaged.append
    checked = 0
    for (ri, rel), f in man.folders.items():
        types = f.types
        if "f" not in types:
            continue
        prefix = f"{rel}/" if rel else ""
        folder = f"{tree}/{ri}/{rel}" if rel else f"{tree}/{ri}"
        names, stored, sizes, mtimes, inos = f.names, f.stored, f.sizes, f.mtimes, f.inos
        if type(ri) is not int or (rel and not safe_rel(rel)):  # tampered with: never opened
            res.damaged.extend(Damage(ri, f"{prefix}{n}", "bad name", _HOW.get(h, h), z, m)
                               for n, k, h, z, m in zip(names, types, stored, sizes, mtimes, strict=False) if k == "f")
            checked += types.count("f")
            continue
        # A folder whose files are all hard links, with the very inodes, sizes and mtimes a
        # folder of another snapshot had (an environment unchanged between two snapshots):
        # that folder's answer, without a stat or a loop per file.
        fkey: tuple[Any, ...] | None = None
        if memo is not None and not full and "C" not in stored and "R" not in stored:
            fkey = (ri, rel, tuple(names), tuple(inos), tuple(sizes), tuple(mtimes))
            again = memo.get(fkey)  # type: ignore[call-overload]
            if again is not None:
                checked += types.count("f")
                res.damaged.extend(Damage(ri, prefix + names[i], problem, "link", sizes[i], mtimes[i], shared=True)
                                   for i, problem in again)
                continue
        n_before = len(res.damaged)
        try:
            fd = os.open(folder, _DIR_FLAGS)
        except (OSError, TypeError, ValueError):
            fd = -1
        try:
            try:
                joined = "\n".join(names)
                plain = not ("/" in joined or "\x00" in joined or "" in names or "." in names or ".." in names)
            except TypeError:  # a name that is not a string
                plain = False
            if fd >= 0 and plain and not full:
                # The common case, and the one `history` pays for: one stat per file, no
                # other work unless it differs.
                stat_at = os.stat
                i = types.find("f")
                while i >= 0:
                    checked += 1
                    try:
                        st = stat_at(names[i], dir_fd=fd, follow_symlinks=False)
                    except OSError as exc:
                        how = stored[i]
                        add(Damage(ri, prefix + names[i], "missing" if isinstance(exc, FileNotFoundError)
                                   else "unreadable", _HOW.get(how, how), sizes[i], mtimes[i]))
                    else:
                        if st.st_mtime_ns != mtimes[i] or st.st_size != sizes[i] or not is_reg(st.st_mode):
                            how = stored[i]
                            add(Damage(ri, prefix + names[i], "changed" if is_reg(st.st_mode) else "not a file",
                                       _HOW.get(how, how), sizes[i], mtimes[i], st.st_size, st.st_mtime_ns,
                                       shared=how == "L" and st.st_nlink > 1))
                    i = types.find("f", i + 1)
            else:
                checked += _check_folder(res, f, ri, prefix, fd, full)
        finally:
            if fd >= 0:
                os.close(fd)
        if fkey is not None and fd >= 0:  # a folder missing here says nothing of another snapshot's
            found = res.damaged[n_before:]
            memo[fkey] = [(names.index(d.path.rpartition("/")[2]), d.problem) for d in found]  # type: ignore[index]
    res.files_checked = checked
    res.seconds = time.perf_counter() - t0
    record_damage(sdir, len(res.damaged))
    return res


def _check_objects(res: VerifyResult, man: Manifest, sdir: Path, full: bool, memo: SharedInodes | None) -> int:
    """Version 3: every file entry's object, stat'ed (and with `full`, hashed) once however
    many entries and snapshots name it (`memo`, shared by calls over one store's snapshots)."""
    root = str(objects_dir(sdir.parent.parent))
    memo = {} if memo is None else memo
    add = res.damaged.append
    checked = 0
    for (ri, rel), f in man.folders.items():
        types = f.types
        if "f" not in types:
            continue
        prefix = f"{rel}/" if rel else ""
        names, stored, sizes, mtimes = f.names, f.stored, f.sizes, f.mtimes
        try:
            shas = f.shas()
        except ManifestDamaged:
            shas = [None] * len(names)
        i = types.find("f")
        while i >= 0:
            checked += 1
            how = stored[i]
            kind = _HOW.get(how, how)
            name = names[i]
            try:
                if type(ri) is not int or (rel and not safe_rel(rel)) or type(name) is not str or "/" in name:
                    raise ValueError("a name that is not plain")
                obj = object_name(shas[i], "L" if how == "L" else "C", mtimes[i])
            except ValueError:
                add(Damage(ri, f"{prefix}{name}", "bad name", kind, sizes[i], mtimes[i]))
                i = types.find("f", i + 1)
                continue
            want_mtime = mtimes[i] if how == "L" else OBJECT_MTIME_NS
            key = ("object", obj, sizes[i], want_mtime, full)
            found = memo.get(key)  # type: ignore[call-overload]
            if found is None:
                found = memo[key] = _check_object(f"{root}/{obj}", sizes[i], want_mtime, shas[i], full)  # type: ignore[index]
            problem, fsize, fmtime, shared = found
            if full and problem in ("", "sha256 differs"):
                res.bytes_hashed += sizes[i]  # its object's bytes were read (once, for every name of it)
            if problem:
                add(Damage(ri, prefix + name, problem, kind, sizes[i], mtimes[i], fsize, fmtime,
                           shared=shared and how == "L", stored_at=f"{root}/{obj}"))
            i = types.find("f", i + 1)
    return checked


def _check_object(path: str, size: int, mtime_ns: int, sha: str, full: bool
                  ) -> tuple[str, int | None, int | None, bool]:
    """(problem or "", the size and mtime found, whether other names share its inode)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing", None, None, False
    except OSError:
        return "unreadable", None, None, False
    if not stat.S_ISREG(st.st_mode):
        return "not a file", None, None, False
    if st.st_size != size or st.st_mtime_ns != mtime_ns:
        return "changed", st.st_size, st.st_mtime_ns, st.st_nlink > 1
    if full:
        try:
            got, _ = _hash_at(os.open(os.path.dirname(path), _DIR_FLAGS), os.path.basename(path), close=True)
        except OSError:
            return "unreadable", st.st_size, st.st_mtime_ns, st.st_nlink > 1
        if got != sha:
            return "sha256 differs", st.st_size, st.st_mtime_ns, st.st_nlink > 1
    return "", st.st_size, st.st_mtime_ns, st.st_nlink > 1


def damaged_files(metas: list[SnapshotMeta]) -> dict[str, int]:
    """Snapshot id -> how many of its stored files an edit has changed (0: whole), by the
    fast check (a stat per stored file; a folder of hard links several snapshots share is
    stat'ed once)."""
    memo: SharedInodes = {}
    return {m.id: len(verify_snapshot(m, shared_inodes=memo).damaged) for m in metas}


# What the last check found, beside the snapshot: `history` lists it without a stat per
# stored file (a check costs about a bare stat walk of the environment per snapshot).
DAMAGE_MARK = "damage.json"


def record_damage(snapshot_dir: Path, files: int) -> None:
    """Remember how many stored files the last check of this snapshot found damaged (none:
    the mark goes). Best effort: without it `history` shows no damage until a check runs."""
    mark = snapshot_dir / DAMAGE_MARK
    try:
        if files:
            atomic_write(mark, json.dumps({"files": files, "checked": time.time()}))
        elif mark.exists():
            mark.unlink()
    except OSError:
        pass


def recorded_damage(meta: SnapshotMeta) -> int:
    """How many stored files the last check (`verify`, `status`, `patches`, a rollback's
    own) found damaged in this snapshot; 0 when none did or none ran since."""
    try:
        return int(json.loads((meta.path / DAMAGE_MARK).read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


@dataclass
class StoreVerify:
    """`rewheel verify`: one snapshot, or every snapshot of the environment, checked."""

    target: str
    full: bool
    results: list[VerifyResult]
    seconds: float = 0.0
    # Files a killed rewheel left inside the environment (`tree.strays`): not the environment's.
    strays: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results) and not self.strays

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "full": self.full, "ok": self.ok, "seconds": round(self.seconds, 3),
                "snapshots": [r.to_json() for r in self.results],
                **({"strays": self.strays} if self.strays else {})}


def verify_store(store: Any, ref: str | None, *, full: bool = False, target: str = "",
                 env: Environment | None = None) -> StoreVerify:
    """Check one snapshot (`ref`: an id, a unique prefix or a label) or, without `ref`,
    every snapshot of the store (`store`: a `Store`), newest first. Snapshots whose
    `meta.json` cannot be read are reported too, as damaged. With `env`, the environment is
    walked once for what a killed rewheel left inside it (`strays`: not ok either)."""
    t0 = time.perf_counter()
    memo: SharedInodes = {}
    if ref is not None:
        results = [verify_snapshot(store.get(ref), full, shared_inodes=memo)]
    else:
        results = [verify_snapshot(m, full, shared_inodes=memo) for m in store.list()]
        results += [verify_snapshot(store.snapshots_dir / bad, full) for bad in store.damaged()]
    left = strays(scope_of(env)) if env is not None else []
    return StoreVerify(target, full, results, time.perf_counter() - t0, strays=left)
