"""What changed between two states of an environment: package versions and installed files.

A state is a snapshot (its `meta.json` distributions and `manifest.json` entries) or the
live environment. Package changes are classified (upgraded, downgraded, added, removed,
reinstalled with different bytes) and annotated with what nightly versions encode: the
dev-build distance, the git shas and a compare link (see `rewheel.versions`).

File changes come from hashes that are already known, never from re-reading unchanged
files: the manifest holds a sha256 for every captured file; a live file whose size and
mtime equal the manifest's is unchanged; a live file that its RECORD proves pristine
(same size, not modified since its distribution was installed) has the RECORD's hash.
Only the rest is hashed — so diffing an 8 GB vLLM environment against its snapshot reads
the handful of files that were touched by hand, plus the contents of changed text files
when line counts or unified diffs are asked for.

Line counts take linear time (`rewheel.texts.count_changed_lines`: a multiset difference of
the two versions' lines); unified diffs, which difflib builds in quadratic time at worst, are
built only for the files shown (`with_diffs`), and their counts are those of the diff shown.

A large diff shares its work with a second process (`rewheel.halves`): the live environment
is walked there while this one loads the snapshot's manifest and reads the RECORDs, then
each reads and counts half the changed files.

Byte-compiled caches (`__pycache__`, `.pyc`) and `.dist-info` folders (metadata and the
installer's bookkeeping: RECORD, INSTALLER, uv_cache.json, ...) are not source and are left
out of file diffs; the package table covers them.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import itertools
import operator
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.utils import canonicalize_name

from rewheel import versions as vers
from rewheel.environment import Distribution, Environment, RecordEntry
from rewheel.errors import SnapshotError, UsageError
from rewheel.halves import share, worth_sharing
from rewheel.snapshot import Manifest, SnapshotMeta, Store
from rewheel.snapshot.manifest import match_roots
from rewheel.snapshot.tree import (Progress, Root, exclusion, hash_file, provably_pristine, scope_of, walk)
from rewheel.texts import (TEXT_LIMIT, as_str, as_text, count_changed_lines, count_lines, countable,
                           is_install_artifact, is_noise, unified_diff)

# From this many changed files on, a diff reads and counts them in two processes (a real
# release-to-release upgrade changes about 9,000): below it, the fork costs more than it saves.
SPLIT_MIN_FILES = 1000
# How long, at least, the second process's answer is waited for once this one's half is done.
SPLIT_WAIT_MIN_S = 10.0
# From this many files in the snapshot on, the live environment is walked by a second process
# while this one loads the manifest and reads the RECORDs.
WALK_SHARE_MIN_FILES = 4000
LIVE = "live"


# --------------------------------------------------------------------------------------
# Paths as users name them
# --------------------------------------------------------------------------------------
def display_path(abs_path: str, sites: Iterable[str], prefix: str | None) -> str:
    """A path as users name it: relative to its site-packages, else to the prefix."""
    for s in sites:
        base = s.rstrip("/") + "/"
        if abs_path.startswith(base):
            return abs_path[len(base):]
    if prefix:
        base = prefix.rstrip("/") + "/"
        if abs_path.startswith(base):
            return abs_path[len(base):]
    return abs_path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------
# Package versions
# --------------------------------------------------------------------------------------
@dataclass
class PackageChange:
    name: str
    old: str | None
    new: str | None
    # upgraded | downgraded | added | removed | reinstalled (same version, other bytes) |
    # modified (same install, files edited since) | changed (not PEP 440) | unchanged
    change: str
    dev_distance: int | None = None
    old_sha: str | None = None
    new_sha: str | None = None
    old_variant: str | None = None
    new_variant: str | None = None
    compare_url: str | None = None
    files_changed: int = 0

    @property
    def variant(self) -> str | None:
        """The build variant as shown: `cu130`, or `cu128 → cu130` when it changed."""
        if self.old_variant == self.new_variant or self.old is None or self.new is None:
            return self.new_variant or self.old_variant
        return f"{self.old_variant or '-'} → {self.new_variant or '-'}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "old": self.old, "new": self.new, "change": self.change,
                "dev_distance": self.dev_distance, "old_sha": self.old_sha,
                "new_sha": self.new_sha, "variant": self.variant,
                "compare_url": self.compare_url, "files_changed": self.files_changed}


def _dist_map(dists: Iterable[Mapping[str, Any]] | Mapping[str, str]) -> dict[str, dict[str, Any]]:
    if isinstance(dists, Mapping):
        return {canonicalize_name(k): {"name": k, "version": v} for k, v in dists.items()}
    return {canonicalize_name(d["name"]): dict(d) for d in dists}


def diff_versions(old: Iterable[Mapping[str, Any]] | Mapping[str, str],
                  new: Iterable[Mapping[str, Any]] | Mapping[str, str], *,
                  changed_files: Mapping[str, int] | None = None,
                  reinstalled: set[str] | None = None,
                  include_unchanged: bool = False) -> list[PackageChange]:
    """Classify every distribution's change between two states.

    `old`/`new`: `SnapshotMeta.distributions` lists or `[d.to_json() for d in
    env.distributions()]` (dicts with name, version, project_urls, sha256), or plain
    `{name: version}` maps. `changed_files`: distribution -> number of its payload files
    whose bytes differ (from a tree diff); a same-version distribution with changed files
    is "reinstalled". Unchanged distributions are left out unless asked for.
    """
    a, b = _dist_map(old), _dist_map(new)
    changed_files = changed_files or {}
    out: list[PackageChange] = []
    for name in sorted(set(a) | set(b)):
        da, db = a.get(name), b.get(name)
        va = vers.parse(da["version"]) if da else None
        vb = vers.parse(db["version"]) if db else None
        urls = (db or {}).get("project_urls") or (da or {}).get("project_urls") or {}
        pc = PackageChange(name, va.text if va else None, vb.text if vb else None, "unchanged",
                           old_sha=va.sha if va else None, new_sha=vb.sha if vb else None,
                           old_variant=va.variant if va else None,
                           new_variant=vb.variant if vb else None,
                           files_changed=changed_files.get(name, 0))
        if va is None:
            pc.change = "added"
        elif vb is None:
            pc.change = "removed"
        elif va.public is None or vb.public is None:
            # Not PEP 440: only equality means anything.
            pc.change = "changed" if va.text != vb.text else "unchanged"
        elif vb.public > va.public:
            pc.change = "upgraded"
        elif vb.public < va.public:
            pc.change = "downgraded"
        else:
            wheel_a, wheel_b = (da or {}).get("sha256"), (db or {}).get("sha256")
            if va.version != vb.version or (wheel_a and wheel_b and wheel_a != wheel_b):
                pc.change = "reinstalled"
        if va is not None and vb is not None:
            pc.dev_distance = vers.dev_distance(va, vb)
            pc.compare_url = vers.compare_url(urls, va.sha, vb.sha)
        if pc.change == "unchanged" and pc.files_changed:
            pc.change = "reinstalled" if reinstalled is None or name in reinstalled else "modified"
        if include_unchanged or pc.change != "unchanged":
            out.append(pc)
    return out


# --------------------------------------------------------------------------------------
# Installed files
# --------------------------------------------------------------------------------------
@dataclass
class FileChange:
    path: str  # relative to its site-packages, else to the prefix
    abs_path: str
    change: str  # added | removed | changed | mode
    distribution: str | None = None
    old_sha256: str | None = None
    new_sha256: str | None = None
    old_size: int | None = None
    new_size: int | None = None
    old_mode: int | None = None
    new_mode: int | None = None
    binary: bool = False
    added_lines: int | None = None
    removed_lines: int | None = None
    diff: str | None = None
    note: str | None = None
    # Relative to the diff's patch base (`DiffResult.patch_base`): the path its unified diff
    # names and `--path` matches; None: `path`.
    patch_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "change": self.change, "added_lines": self.added_lines,
                "removed_lines": self.removed_lines, "distribution": self.distribution,
                "abs_path": self.abs_path, "binary": self.binary,
                "old_sha256": self.old_sha256, "new_sha256": self.new_sha256,
                "old_size": self.old_size, "new_size": self.new_size,
                "old_mode": oct(self.old_mode) if self.old_mode is not None else None,
                "new_mode": oct(self.new_mode) if self.new_mode is not None else None,
                "diff": self.diff, "note": self.note}


@dataclass
class DiffResult:
    old: str  # snapshot id
    new: str  # snapshot id or "live"
    packages: list[PackageChange]
    files: list[FileChange]
    unchanged_packages: int = 0
    stats: dict[str, Any] = field(default_factory=dict)
    filters: dict[str, Any] = field(default_factory=dict)
    # The one folder every unified diff's paths are relative to (the environment's prefix;
    # `/` when a file lies outside it): `cd BASE && git apply FILE` applies them.
    patch_base: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"old": self.old, "new": self.new,
                "packages": [p.to_json() for p in self.packages],
                "files": [f.to_json() for f in self.files],
                "unchanged_packages": self.unchanged_packages, "stats": self.stats,
                "filters": self.filters, "patch_base": self.patch_base}


@dataclass(slots=True)
class _Item:
    """One file or symlink of one side."""

    kind: str  # "f" | "l"
    mode: int
    size: int
    sha: str | None
    target: str | None = None


class _Owners:
    """Which distribution a path belongs to: its RECORD, else the nearest folder that holds
    files of exactly one distribution's RECORD (files added inside a package)."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.dirs: dict[str, str] = {}
        self.sites: set[str] = set()

    def add(self, dist: str, site: str, paths: Iterable[str]) -> None:
        site = site.rstrip("/")
        self.sites.add(site)
        base, files, dirs = site + "/", self.files, self.dirs
        for p in paths:  # normalised absolute paths: rpartition is os.path.dirname
            if p not in files:
                files[p] = dist
            d = p.rpartition("/")[0]
            # Only folders inside site-packages: bin/ holds every distribution's scripts.
            if d not in dirs and d.startswith(base) and not d.endswith(".dist-info"):
                dirs[d] = dist

    def owner(self, path: str) -> str | None:
        if path in self.files:
            return self.files[path]
        d = os.path.dirname(path)
        while d and d not in self.sites and d != "/":
            if d in self.dirs:
                return self.dirs[d]
            d = os.path.dirname(d)
        return None


def _owners_from_env(dists: list[Distribution], owners: _Owners) -> None:
    for dist in dists:
        owners.add(dist.name, str(dist.site), (e.path for e in dist.record))


def _owners_from_snapshot(snap: SnapshotMeta, man: Manifest, owners: _Owners) -> None:
    """RECORD files as stored in the snapshot's tree (the environment may have moved on)."""
    import csv

    for e in _record_files(man):
        stored = man.stored_at(snap, *e)  # None: the manifest names no object for it
        if stored is None:
            continue
        try:
            with open(stored, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        abs_rec = os.path.join(man.roots[e[0]].path, e[1])
        info_dir = os.path.dirname(abs_rec)
        site = os.path.dirname(info_dir)
        name = canonicalize_name(os.path.basename(info_dir)[: -len(".dist-info")].rsplit("-", 1)[0])
        base = site.rstrip("/") + "/"
        odd = os.path.normpath(site) + "/" != base
        # normpath (pure Python) only for rows with something to normalise (`../../bin/x`).
        paths = [os.path.normpath(os.path.join(site, rel))
                 if odd or rel[0] in "./" or "/." in rel or "//" in rel else base + rel
                 for rel in (row[0] for row in csv.reader(text.splitlines()) if row) if rel]
        owners.add(name, site, paths)


def _record_files(man: Manifest) -> list[tuple[int, str]]:
    """(root, path) of every `.dist-info/RECORD` file the manifest holds."""
    out = []
    for (ri, rel), f in man.folders.items():
        if rel.endswith(".dist-info"):
            i = f.index.get("RECORD")
            if i is not None and f.types[i] == "f":
                out.append((ri, f"{rel}/RECORD"))
    return out


def _root_bases(roots: list[Root]) -> list[str]:
    """Each root as a prefix to put before a relative path (os.path.join, without its cost)."""
    return [r.path if r.path.endswith("/") else r.path + "/" for r in roots]


def _manifest_items(man: Manifest, mtimes: dict[str, int] | None = None) -> dict[str, _Item]:
    """Files and symlinks by absolute path; `mtimes` (when given) gets each file's mtime.
    Read from the manifest's columns: no entry is built in full but a symlink's."""
    items: dict[str, _Item] = {}
    bases = _root_bases(man.roots)
    for (ri, rel), f in man.folders.items():
        base = bases[ri] + rel + "/" if rel else bases[ri]
        modes, sizes, times = f.modes, f.sizes, f.mtimes
        for i, (name, kind) in enumerate(zip(f.names, f.types, strict=True)):
            if kind == "f":
                full = base + name
                items[full] = _Item("f", modes[i], sizes[i], f.sha(i))
                if mtimes is not None:
                    mtimes[full] = times[i]
            elif kind == "l":
                e = f.entry(ri, rel, i)
                items[base + name] = _Item("l", e.mode, e.size, e.sha256, e.target)
    return items


class _Binary:
    """What a read returns for a file that has a NUL byte in its first 8 KiB (as `as_text`
    tells binary files): the rest is not read."""


BINARY = _Binary()


def _read_bytes(path: str, want_sha: str | None) -> bytes | _Binary | None:
    """A file's contents, once; None when it is unreadable, over TEXT_LIMIT or not the bytes
    `want_sha` names (a stored copy shared by hard link could have been edited in place)."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > TEXT_LIMIT:
                return None
            head = f.read(8192)
            if b"\0" in head:
                return BINARY
            rest = f.read()
    except OSError:
        return None
    data = head + rest if rest else head
    return data if want_sha is None or _sha(data) == want_sha else None


def _stored_bytes(snap: SnapshotMeta, man: Manifest, abs_path: str,
                  want_sha: str | None) -> bytes | _Binary | None:
    """A file's contents as the snapshot holds them, verified against the manifest hash."""
    for ri, root in enumerate(man.roots):
        base = root.path.rstrip("/") + "/"
        if abs_path.startswith(base):
            stored = man.stored_at(snap, ri, abs_path[len(base):])
            return _read_bytes(stored, want_sha) if stored is not None else None
    return None


class _Side:
    """Content access for one side of a diff."""

    def __init__(self, snap: SnapshotMeta | None, man: Manifest | None) -> None:
        self.snap, self.man = snap, man

    def read(self, abs_path: str, item: _Item) -> bytes | _Binary | None:
        if self.snap is None:
            return _read_bytes(abs_path, None)
        assert self.man is not None
        return _stored_bytes(self.snap, self.man, abs_path, item.sha)


def _record_owners(dists: list[Distribution]) -> dict[str, tuple[RecordEntry, int]]:
    """abs path -> (its RECORD row, the install time of its distribution), for each path the
    row of the distribution installed last (the one whose bytes the file holds; of two
    installed in the same tick, the later in `dists`), as `record_index` tells it. The row's
    sha256 is decoded only for the files it proves."""
    index: dict[str, tuple[RecordEntry, int]] = {}
    path_of = operator.attrgetter("path")
    for d in sorted(dists, key=lambda d: d.install_time_ns):  # (stable: ties keep their order)
        rows = d.record
        index.update(zip(map(path_of, rows), zip(rows, itertools.repeat(d.install_time_ns)), strict=True))
    return index


LiveWalk = list[tuple[str, int, int, int, str | None]]  # (path, mode, size, mtime_ns, symlink target)


def _walk_live(roots: list[Root], records: dict[str, Any], skip: set[str], exclude: list[str],
               progress: Progress | None = None) -> LiveWalk:
    """The live environment's files and symlinks, walked (`records`: the paths RECORDs list,
    for a root that holds only those), as `marshal` carries them: (path, mode, size,
    mtime_ns, None) for a file, (path, mode, 0, 0, target) for a symlink. What the snapshot
    left out (`[snapshots] exclude`) is not compared either."""
    out: LiveWalk = []
    add = out.append
    bases = _root_bases(roots)
    S_ISREG, S_ISLNK, S_IMODE = stat.S_ISREG, stat.S_ISLNK, stat.S_IMODE
    for i, (ri, rel, st) in enumerate(walk(roots, records, skip, None, exclusion(exclude))):
        mode = st.st_mode
        if S_ISREG(mode):
            add((bases[ri] + rel, S_IMODE(mode), st.st_size, st.st_mtime_ns, None))
            if progress and i % 2000 == 0:
                progress("diff: walk", i, 0)
        elif S_ISLNK(mode):
            full = bases[ri] + rel
            add((full, S_IMODE(mode), 0, 0, os.readlink(full)))
    return out


def _live_items(walked: LiveWalk, records: Mapping[str, tuple[RecordEntry, int]], old: Mapping[str, _Item],
                old_mtimes: Mapping[str, int], stats: dict[str, int]) -> dict[str, _Item]:
    """The walked live files and symlinks, each file's hash taken from the manifest (same
    size and mtime), from its RECORD (provably pristine), and only otherwise by reading it."""
    items: dict[str, _Item] = {}
    mtimes: dict[str, int] = {}
    for full, mode, size, mtime, target in walked:
        if target is None:
            items[full] = _Item("f", mode, size, None)
            mtimes[full] = mtime
        else:
            items[full] = _Item("l", mode, 0, None, target)
    for full, it in items.items():
        # RECORD files are read to tell a reinstall from a hand edit; they are small.
        if it.kind != "f" or (is_noise(full) and not full.endswith(".dist-info/RECORD")):
            continue
        o = old.get(full)
        if o is not None and o.kind == "f" and o.size == it.size and old_mtimes.get(full) == mtimes[full]:
            it.sha = o.sha
            stats["by_manifest"] += 1
            continue
        rec = records.get(full)
        if (rec is not None and provably_pristine(it.size, mtimes[full], rec[0].size, rec[1])
                and (sha := rec[0].sha256_hex) is not None):
            it.sha = sha
            stats["by_record"] += 1
            continue
        if o is None:
            # Added: it differs whatever its hash; its contents are read only if a line
            # count is asked for.
            continue
        if o.kind == "f" and o.size != it.size:
            continue  # changed, provably, without reading it
        try:
            it.sha = hash_file(full)
        except OSError:
            continue
        stats["hashed_files"] += 1
        stats["hashed_bytes"] += it.size
    return items


def _compare(old: Mapping[str, _Item], new: Mapping[str, _Item]) -> list[tuple[str, str]]:
    changes: list[tuple[str, str]] = []
    for path in sorted(set(old) | set(new)):
        if is_noise(path):
            continue
        o, n = old.get(path), new.get(path)
        if o is None:
            changes.append((path, "added"))
        elif n is None:
            changes.append((path, "removed"))
        elif o.kind != n.kind:
            changes.append((path, "changed"))
        elif o.kind == "l":
            if o.target != n.target:
                changes.append((path, "changed"))
        elif o.size != n.size or o.sha is None or n.sha is None or o.sha != n.sha:
            changes.append((path, "changed"))
        elif o.mode != n.mode:
            changes.append((path, "mode"))
    return changes


def _manifest_against_live(snap: SnapshotMeta, env: Environment) -> Manifest:
    """The snapshot's manifest, its roots at the paths the live environment has (the same
    prefix may be reached through another path now: a symlink)."""
    man = Manifest.load(snap)
    try:
        man.roots = match_roots(snap, man, scope_of(env))
    except SnapshotError:
        pass  # another environment's snapshot: compared as recorded
    return man


def diff_trees(env: Environment, old_snap: SnapshotMeta, new_snap: SnapshotMeta | None = None, *,
               package: str | None = None, path_glob: str | None = None,
               with_diffs: bool = False, line_counts: bool = True,
               skip: set[str] | None = None, progress: Progress | None = None) -> DiffResult:
    """Versions and files between a snapshot and another snapshot (`new_snap`) or the live
    environment (`new_snap=None`).

    `package`/`path_glob` narrow the file list (a glob matched against the path relative to
    the environment's prefix, the base its unified diffs name: `lib/python3.12/site-packages/
    vllm/*`, `*/vllm/*`, `bin/*`); `with_diffs` adds unified diffs of text files, all relative
    to one base (`patch_base`); `line_counts=False` (a `--stat`-less quick look) skips reading
    changed files.
    """
    t0 = time.monotonic()
    stats: dict[str, Any] = {"by_manifest": 0, "by_record": 0, "hashed_files": 0, "hashed_bytes": 0}
    owners = _Owners()
    old_mtimes: dict[str, int] = {}
    if new_snap is None:
        new_man = None
        roots, skip = scope_of(env), skip or set()
        loaded: list[Manifest] = []
        old_items: dict[str, _Item] = {}
        dists: list[Distribution] = []
        records: dict[str, tuple[RecordEntry, int]] = {}

        def read_the_rest() -> None:  # all but the walk
            loaded.append(_manifest_against_live(old_snap, env))
            old_items.update(_manifest_items(loaded[0], old_mtimes))
            dists.extend(env.distributions())
            records.update(_record_owners(dists))
            _owners_from_env(dists, owners)
            _owners_from_snapshot(old_snap, loaded[0], owners)

        def walk_there() -> tuple[Any, ...]:
            # What it needs of the manifest is what the snapshot left out: its folders are
            # neither checked nor read here (this process does that).
            return (_walk_live(roots, {}, skip, Manifest.load(old_snap, validate=False).exclude),)

        walked: LiveWalk | None = None
        if all(r.whole for r in roots) and worth_sharing(old_snap.files, WALK_SHARE_MIN_FILES):
            # A large environment is walked by a second process meanwhile (the walk needs
            # no RECORD: every root is walked whole).
            if progress:
                progress("diff: walk", 0, 0)
            got = share(read_the_rest, walk_there, wait_min=SPLIT_WAIT_MIN_S)
            walked = got[0] if got is not None else None
        else:
            read_the_rest()
        old_man = loaded[0]
        if walked is None:
            walked = _walk_live(roots, records, skip, old_man.exclude, progress)
        new_items: Mapping[str, _Item] = _live_items(walked, records, old_items, old_mtimes, stats)
        new_dists = [d.to_json() for d in dists]
    else:
        old_man = Manifest.load(old_snap)
        old_items = _manifest_items(old_man, old_mtimes)
        new_man = Manifest.load(new_snap)
        new_items = _manifest_items(new_man)
        new_dists = new_snap.distributions
        _owners_from_snapshot(new_snap, new_man, owners)
        _owners_from_snapshot(old_snap, old_man, owners)
    sites = sorted(owners.sites | {str(s) for s in env.site_dirs}, key=len, reverse=True)
    prefix = str(env.prefix)

    raw = _compare(old_items, new_items)
    per_dist: dict[str, int] = {}
    files: list[FileChange] = []
    for path, change in raw:
        o, n = old_items.get(path), new_items.get(path)
        fc = FileChange(display_path(path, sites, prefix), path, change, owners.owner(path),
                        old_sha256=o.sha if o else None, new_sha256=n.sha if n else None,
                        old_size=o.size if o else None, new_size=n.size if n else None,
                        old_mode=o.mode if o else None, new_mode=n.mode if n else None)
        if fc.distribution and change != "mode":
            per_dist[fc.distribution] = per_dist.get(fc.distribution, 0) + 1
        files.append(fc)

    reinstalled = set()
    for path in set(old_items) | set(new_items):
        if path.endswith(".dist-info/RECORD"):
            o, n = old_items.get(path), new_items.get(path)
            if o is None or n is None or o.sha is None or o.sha != n.sha:
                owner = owners.owner(path)
                if owner:
                    reinstalled.add(owner)
    packages = diff_versions(old_snap.distributions, new_dists, changed_files=per_dist,
                             reinstalled=reinstalled, include_unchanged=True)
    if package:
        # `--package` narrows the package table as it narrows the files.
        want = canonicalize_name(package)
        packages = [p for p in packages if canonicalize_name(p.name) == want]
        files = [f for f in files if f.distribution == want]
    unchanged = sum(1 for p in packages if p.change == "unchanged")
    packages = [p for p in packages if p.change != "unchanged"]

    # One base for the diffs a person applies and the globs they give: the prefix (site-packages
    # lies inside it, and so do bin/ and include/); a path outside it stays absolute.
    for f in files:
        f.patch_path = display_path(f.abs_path, (), prefix)
    if path_glob:
        files = [f for f in files if fnmatch.fnmatch(f.patch_path or f.path, path_glob)]
    base: str | None = None
    if with_diffs:
        base = prefix if all(f.patch_path != f.abs_path for f in files) else "/"
        if base == "/":
            for f in files:
                f.patch_path = f.abs_path.lstrip("/")

    if line_counts or with_diffs:
        old_side, new_side = _Side(old_snap, old_man), _Side(new_snap, new_man)

        def fill(fc: FileChange) -> None:
            _fill_text(fc, old_items.get(fc.abs_path), new_items.get(fc.abs_path), old_side, new_side,
                       with_diffs)

        if with_diffs or not worth_sharing(len(files), SPLIT_MIN_FILES):
            for fc in files:
                fill(fc)
        else:
            _fill_split(files, fill)
    stats["seconds"] = round(time.monotonic() - t0, 3)
    return DiffResult(old_snap.id, new_snap.id if new_snap else LIVE, packages, files, unchanged,
                      stats, {"package": package, "path": path_glob}, patch_base=base)


def _fill_split(files: list[FileChange], fill: Callable[[FileChange], None]) -> None:
    """`fill` every file, half of them in a forked process: reading both sides, checking the
    stored side's sha256 and counting lines is per-file work in Python, and a real upgrade
    changes thousands of files (a second CPU halves it). The other process sends back what
    `fill` set (counts, binary, note); if it fails or stays silent, its half is done here."""

    def theirs() -> tuple[Any, ...]:  # the odd files
        out = []
        for i in range(1, len(files), 2):
            fc = files[i]
            fill(fc)
            out.append((i, fc.added_lines, fc.removed_lines, fc.binary, fc.note))
        return tuple(out)

    def mine() -> None:
        for i in range(0, len(files), 2):
            fill(files[i])

    got = share(mine, theirs, wait_min=SPLIT_WAIT_MIN_S)
    if got is None:
        for i in range(1, len(files), 2):
            fill(files[i])
        return
    for i, added, removed, binary, note in got:
        fc = files[i]
        fc.added_lines, fc.removed_lines, fc.binary, fc.note = added, removed, binary, note


def _fill_text(fc: FileChange, o: _Item | None, n: _Item | None, old_side: _Side, new_side: _Side,
               with_diffs: bool) -> None:
    if fc.change == "mode":
        fc.added_lines = fc.removed_lines = 0
        return
    if (o is not None and o.kind == "l") or (n is not None and n.kind == "l"):
        fc.note = "symlink: " + " → ".join(x.target or "(file)" if x.kind == "l" else "(file)"
                                           for x in (o, n) if x is not None)
        return
    if max(o.size if o else 0, n.size if n else 0) > TEXT_LIMIT:
        fc.binary = True
        fc.note = "large file: contents not compared line by line"
        return
    sides: list[bytes | str | None] = []
    for item, side in ((o, old_side), (n, new_side)):
        if item is None:
            sides.append(None)
            continue
        # Each side is read once and decoded at most once; a binary one ends it (the other
        # side is not read).
        data = side.read(fc.abs_path, item)
        if data is None:
            fc.note = "contents unavailable (the stored copy was changed or removed)"
            return
        if not isinstance(data, bytes) or (text := countable(data)) is None:
            fc.binary = True
            if with_diffs:
                label = fc.patch_path or fc.path
                fc.diff = f"Binary files a/{label} and b/{label} differ\n"
            return
        sides.append(text)
    if with_diffs:
        # A diff that is shown: its counts are its own +/- lines.
        old_t, new_t = (as_str(x) for x in sides)
        label = fc.patch_path or fc.path
        fc.diff = unified_diff(old_t, new_t, label, label)
        fc.added_lines, fc.removed_lines = count_lines(fc.diff)
    elif all(x is None or isinstance(x, bytes) for x in sides):
        fc.added_lines, fc.removed_lines = count_changed_lines(*sides)
    else:
        fc.added_lines, fc.removed_lines = count_changed_lines(*(as_str(x) for x in sides))


# --------------------------------------------------------------------------------------
# The command: resolve snapshot references
# --------------------------------------------------------------------------------------
def diff_target(env: Environment, store: Store, a: str | None = None, b: str | None = None, *,
                package: str | None = None, path_glob: str | None = None,
                with_diffs: bool = False, progress: Progress | None = None) -> DiffResult:
    """`rewheel diff TARGET [A] [B]`: no A — the newest snapshot vs live; A — A vs live;
    A and B — A vs B. `live` may be given for either."""
    if a in (None, LIVE) and b not in (None, LIVE):
        raise UsageError("the live environment can only be the newer side: give `A live` or `A B`")
    if a is None or a == LIVE:
        metas = store.list()
        if not metas:
            raise SnapshotError(f"no snapshots exist for {env.prefix}: nothing to diff against",
                                hint="`rewheel snapshot TARGET` takes one")
        old = default_base(metas)
    else:
        old = store.get(a)
    new = None if b in (None, LIVE) else store.get(b)
    if package is not None:
        # A typo must not read as "nothing changed": the name has to exist on one side.
        wanted = canonicalize_name(package)
        names: set[str] = {canonicalize_name(str(d.get("name", ""))) for d in old.distributions}
        names |= ({canonicalize_name(str(d.get("name", ""))) for d in new.distributions} if new is not None
                  else {d.name for d in env.distributions()})
        if wanted not in names:
            close = difflib.get_close_matches(wanted, sorted(names), n=3)
            raise UsageError(f"--package {package}: no distribution of that name in either side of the diff",
                             hint=("did you mean " + ", ".join(close) + "?") if close
                             else "`rewheel history TARGET --json` lists each snapshot's versions")
    return diff_trees(env, old, new, package=package, path_glob=path_glob, with_diffs=with_diffs,
                      skip={str(store.home)}, progress=progress)



def default_base(metas: list[SnapshotMeta]) -> SnapshotMeta:
    """What `diff TARGET` compares with when no snapshot is named: the newest snapshot that is
    not a failed build (`failed-upgrade`, kept after a revert). After a revert the live
    environment is the pre-upgrade state again; compared with the failed build, everything
    would read "downgraded". Only failed builds: the failed build itself."""
    return next((m for m in metas if m.status != "failed-upgrade"), metas[0])


# --------------------------------------------------------------------------------------
# The text of a change, for the suspects of a crash (rewheel.suspects)
# --------------------------------------------------------------------------------------
def change_texts(old_snap: SnapshotMeta, new_snap: SnapshotMeta | None = None
                 ) -> Callable[[FileChange], tuple[str | None, str | None]]:
    """A reader of a file change's (old, new) text: the old side as `old_snap` holds it
    (verified against its hash), the new side from `new_snap` or the live file. A side is
    None when it is missing, binary, larger than TEXT_LIMIT or unreadable. Manifests are
    loaded once, on first use."""
    mans: dict[str, Manifest] = {}

    def stored(snap: SnapshotMeta, abs_path: str, sha: str | None) -> bytes | None:
        if snap.id not in mans:
            mans[snap.id] = Manifest.load(snap)
        data = _stored_bytes(snap, mans[snap.id], abs_path, sha)
        return data if isinstance(data, bytes) else None

    def texts(fc: FileChange) -> tuple[str | None, str | None]:
        if max(fc.old_size or 0, fc.new_size or 0) > TEXT_LIMIT:
            return None, None
        old = new = None
        try:
            if fc.change != "added":
                old = stored(old_snap, fc.abs_path, fc.old_sha256)
            if fc.change != "removed":
                if new_snap is None:
                    raw = _read_bytes(fc.abs_path, None)
                    new = raw if isinstance(raw, bytes) else None
                else:
                    new = stored(new_snap, fc.abs_path, fc.new_sha256)
        except (OSError, SnapshotError):
            return None, None
        return (as_text(old) if old is not None else None), (as_text(new) if new is not None else None)

    return texts


def env_change_texts(old_env: Environment, new_env: Environment
                     ) -> tuple[list[FileChange], Callable[[FileChange], tuple[str | None, str | None]]]:
    """The files that differ between two environments' installs of the same distributions
    (`rewheel ci`: the target environment, and the throwaway one its upgrade was built in),
    by their RECORDs — no file is read to find them — and a reader of each change's (old,
    new) text for the suspects of a crash. A file whose RECORD hash is the same on both sides
    is unchanged; paths are relative to their site-packages; `abs_path` is the new
    environment's file (the old one's for a removal)."""
    old = {d.name: d for d in old_env.distributions()}
    changes: list[FileChange] = []
    old_paths: dict[tuple[str | None, str], str] = {}  # (distribution, path) -> the old file

    def rows(d: Distribution) -> dict[str, Any]:
        site = str(d.site).rstrip("/") + "/"
        return {e.path[len(site):]: e for e in d.record if e.hash and e.path.startswith(site)}

    for d in new_env.distributions():
        o = old.get(d.name)
        new_rows, old_rows = rows(d), rows(o) if o is not None else {}
        for rel in sorted(new_rows.keys() | old_rows.keys()):
            if is_install_artifact(rel) or is_noise(rel):
                continue
            n, b = new_rows.get(rel), old_rows.get(rel)
            if n is not None and b is not None and n.hash == b.hash:
                continue
            change = "added" if b is None else "removed" if n is None else "changed"
            where = n.path if n is not None else b.path if b is not None else rel
            fc = FileChange(rel, where, change, d.name,
                            old_sha256=b.sha256_hex if b else None, new_sha256=n.sha256_hex if n else None,
                            old_size=b.size if b else None, new_size=n.size if n else None)
            if b is not None:
                old_paths[(d.name, rel)] = b.path
            changes.append(fc)

    def text_of(path: str | None) -> str | None:
        if path is None:
            return None
        raw = _read_bytes(path, None)
        return as_text(raw) if isinstance(raw, bytes) else None

    def texts(fc: FileChange) -> tuple[str | None, str | None]:
        if max(fc.old_size or 0, fc.new_size or 0) > TEXT_LIMIT:
            return None, None
        try:
            return (text_of(old_paths.get((fc.distribution, fc.path))),
                    text_of(fc.abs_path) if fc.change != "removed" else None)
        except OSError:
            return None, None

    return changes, texts
