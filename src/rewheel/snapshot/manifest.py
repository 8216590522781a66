"""The manifest: every entry a snapshot holds, stored by folder, as columns.

Owns: `Folder` (one folder's entries as columns), `Manifest` (load, validate, save; an
entry in full is [root, path, type, mode, size, mtime_ns, sha256, stored, target, ino]),
`ManifestDamaged` and its translation into `SnapshotDamaged` (`bad_entry`), and
`match_roots` (a manifest's roots at the paths the environment is reached by now).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from rewheel.errors import SnapshotDamaged, SnapshotError
from rewheel.snapshot.store import SnapshotMeta, read_regular
from rewheel.snapshot.tree import Root, safe_rel

MANIFEST_VERSION = 2  # 2: by folder, as columns, with shared inodes; version 1 still loads


_STORED = {"link": "L", "reflink": "R", "copy": "C", None: "-"}
_STORED_BACK = {v: k for k, v in _STORED.items()}


class Entry(NamedTuple):
    """One manifest entry in full, as a restore acts on it (built by `Folder.entry` only for
    the entries a restore changes or checks: the whole-tree comparison reads the columns)."""
    root: int  # index into the manifest's roots
    path: str  # relative to its root
    kind: str  # "f" file, "d" folder, "l" symlink, "o" socket/FIFO/device
    mode: int  # permission bits
    size: int
    mtime_ns: int
    sha256: str | None  # None for a linked file's entry read with `sha=False`
    stored: str | None  # "link" | "reflink" | "copy" | None
    target: str | None  # a symlink's target
    ino: int | None  # the inode a linked file shares with the store


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

    def entry(self, ri: int, rel: str, i: int, *, sha: bool = True) -> Entry:
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
        return Entry(ri, f"{rel}/{name}" if rel else name, kind, self.modes[i], self.sizes[i], self.mtimes[i],
                     sha256, _STORED_BACK.get(self.stored[i]), target, self.inos[i])

    def entries(self, ri: int, rel: str) -> list[Entry]:
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
    def entries(self) -> list[Entry]:
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
            doc = json.loads(read_regular(path))
            version = doc.get("version", 1)
            if type(version) is not int or not 1 <= version <= MANIFEST_VERSION:
                # Written by a newer rewheel (or tampered with): its layout is not known here.
                raise ValueError(f"manifest version {version!r}; this rewheel reads versions 1 to "
                                 f"{MANIFEST_VERSION}")
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
                    raise bad_entry(snap, bad)
                man = cls.of(roots, entries, real_roots, exclude)
            entries = man.entries if validate else []
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as exc:
            raise SnapshotDamaged(f"snapshot {snap.id}: manifest {path} is unreadable ({exc})",
                                  hint="restore another snapshot (`rewheel history TARGET` lists them)") from None
        if validate:
            seen = set()
            for e in entries:
                if not safe_rel(e.path) or (e.root, e.path) in seen:
                    raise bad_entry(snap, e)
                if e.kind == "l" and not isinstance(e.target, str):
                    raise SnapshotDamaged(f"snapshot {snap.id}: symlink entry {e.path} has no target")
                seen.add((e.root, e.path))
        return man


def bad_entry(snap: SnapshotMeta, e: Any) -> SnapshotDamaged:
    return SnapshotDamaged(
        f"snapshot {snap.id}: manifest entry {str(list(e) if isinstance(e, tuple) else e)[:200]} is invalid or escapes the prefix",
        hint="the snapshot was tampered with or damaged; restore another one")


def match_roots(snap: SnapshotMeta, man: Manifest, live_roots: list[Root]) -> list[Root]:
    """The manifest's roots at the paths the environment is reached by now. The same prefix
    reached through a symlink (`/srv/env` -> `/data/env`) is the same environment: compare
    real paths, and act on the live paths (the symlink a snapshot went through may be gone)."""
    real = man.real_roots or [os.path.realpath(r.path) for r in man.roots]
    if real != [os.path.realpath(r.path) for r in live_roots]:
        raise SnapshotError(
            f"snapshot {snap.id} was taken of {', '.join(r.path for r in man.roots)}, "
            f"not of {', '.join(r.path for r in live_roots)}")
    return [Root(lr.path, mr.whole) for lr, mr in zip(live_roots, man.roots, strict=True)]
