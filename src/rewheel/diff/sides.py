"""The two sides' files and their bytes: a manifest's items, the live walk and each live file's
hash by the cheapest proof (`_live_items`), the comparison (`_compare`), and each side's
contents read once (`_Side`, `_read_bytes`, `_stored_bytes`).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rewheel.environment import Environment, RecordEntry
from rewheel.errors import SnapshotError
from rewheel.snapshot import Manifest, SnapshotMeta
from rewheel.snapshot.manifest import match_roots
from rewheel.snapshot.tree import Progress, Root, exclusion, hash_file, provably_pristine, scope_of, walk
from rewheel.texts import TEXT_LIMIT, is_noise


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(slots=True)
class _Item:
    """One file or symlink of one side."""

    kind: str  # "f" | "l"
    mode: int
    size: int
    sha: str | None
    target: str | None = None


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
