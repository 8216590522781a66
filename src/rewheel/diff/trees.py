"""`diff_trees`: versions and files between a snapshot and another snapshot or the live
environment — the live walk shared with a second process for a large environment — and the
line counts and unified diffs (`_fill_text`), split between two processes for many files.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Mapping
from typing import Any

from packaging.utils import canonicalize_name

from rewheel.diff.owners import _Owners, _owners_from_env, _owners_from_snapshot, _record_owners
from rewheel.diff.packages import diff_versions
from rewheel.diff.results import LIVE, DiffResult, FileChange, display_path
from rewheel.diff.sides import (
    LiveWalk,
    _compare,
    _Item,
    _live_items,
    _manifest_against_live,
    _manifest_items,
    _Side,
    _walk_live,
)
from rewheel.environment import Distribution, Environment, RecordEntry
from rewheel.halves import share, worth_sharing
from rewheel.snapshot import Manifest, SnapshotMeta
from rewheel.snapshot.tree import Progress, scope_of
from rewheel.texts import TEXT_LIMIT, as_str, count_changed_lines, count_lines, countable, unified_diff

# From this many changed files on, a diff reads and counts them in two processes (a real
# release-to-release upgrade changes about 9,000): below it, the fork costs more than it saves.
SPLIT_MIN_FILES = 1000
# How long, at least, the second process's answer is waited for once this one's half is done.
SPLIT_WAIT_MIN_S = 10.0
# From this many files in the snapshot on, the live environment is walked by a second process
# while this one loads the manifest and reads the RECORDs.
WALK_SHARE_MIN_FILES = 4000


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
