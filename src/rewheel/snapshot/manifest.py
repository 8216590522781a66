"""The manifest: every entry a snapshot holds, stored by folder, as columns.

Owns: `Folder` (one folder's entries as columns), `Manifest` (load, validate, save; an
entry in full is [root, path, type, mode, size, mtime_ns, sha256, stored, target, ino,
ctime_ns]), where an entry's bytes are (`Manifest.stored_path`: an object of the store,
or a file of an older snapshot's `tree/`), `ManifestDamaged` and its translation into
`SnapshotDamaged` (`bad_entry`), and `match_roots` (a manifest's roots at the paths the
environment is reached by now).

Version 3 names objects (`snapshot.objects`) and records, for every file, the live inode and
ctime it had when it was taken: the next snapshot of the environment compares them with
each live file (as git's index does) and takes an unchanged file's object without reading
it. Versions 1 and 2 kept their files in the snapshot's own `tree/`, and still restore.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rewheel.errors import SnapshotDamaged, SnapshotError
from rewheel.paths import atomic_write
from rewheel.snapshot import manifest_codec
from rewheel.snapshot.objects import object_name, objects_dir
from rewheel.snapshot.store import SnapshotMeta, read_regular, read_regular_bytes
from rewheel.snapshot.tree import Root, safe_rel

MANIFEST = "manifest.bin"  # version 3 (manifest_codec)
MANIFEST_JSON = "manifest.json"  # versions 1 and 2

MANIFEST_VERSION = 3  # 3: objects and live ctimes; 2: by folder, as columns, in tree/; 1: a flat list


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
    ino: int | None  # the inode a linked file shares with the store (v3: every file's live inode)


class ManifestDamaged(ValueError):
    """Raised by Folder while it reads an entry; the restore reports it as SnapshotDamaged."""


class Folder:
    """One folder of a manifest, as columns with one item per entry, in `names` order:
    `types` ("f" file, "d" folder, "l" symlink, "o" socket/FIFO/device: one character
    each), `modes`, `sizes`, `mtimes` (ns), `stored` ("L" hard link, "R" reflink, "C" copy,
    "-" nothing stored: one character each), `inos` (the inode a linked file shares with
    the store, else None; version 3: every file's live inode), `ctimes` (version 3: every
    file's live ctime when taken, 0 for other entries), and the sha256s and symlink targets:
    `shab` (version 3: 32 bytes an entry, zeros for none) and `targets`, or `cold` (JSON text
    {"sha256": [...], "target": [...]}, versions 1 and 2), decoded only for the folders a
    command acts on. Columns load several times faster than one list per entry, and a
    restore compares the whole tree with them."""

    __slots__ = ("names", "types", "modes", "sizes", "mtimes", "stored", "inos", "cold", "ctimes", "shab", "targets",
                 "_index", "_cold", "_shas")

    def __init__(self, names: list[str], types: str, modes: list[int], sizes: list[int], mtimes: list[int],
                 stored: str, inos: list[int | None], cold: str | None, ctimes: list[int] | None = None,
                 shab: bytes | None = None, targets: list[str | None] | None = None) -> None:
        self.names, self.types, self.modes, self.sizes, self.mtimes = names, types, modes, sizes, mtimes
        self.stored, self.inos, self.cold, self.ctimes = stored, inos, cold, ctimes
        self.shab, self.targets = shab, targets
        self._index: dict[str, int] | None = None
        self._cold: dict[str, list[Any]] | None = None
        self._shas: list[str | None] | None = None

    @classmethod
    def of(cls, entries: list[list[Any]]) -> Folder:
        """From full entries [root, path, type, mode, size, mtime_ns, sha256, stored, target,
        ino, ctime_ns] (version 1 entries have no ino, version 2 ones no ctime), as version 3
        columns."""
        cols = list(zip(*(e if len(e) > 10 else [*e, None] if len(e) > 9 else [*e, None, None] for e in entries),
                        strict=True))
        _, paths, types, modes, sizes, mtimes, sha, stored, target, inos, ctimes = cols
        return cls([p.rpartition("/")[2] for p in paths], "".join(types), list(modes), list(sizes), list(mtimes),
                   "".join(_STORED.get(h, "-") for h in stored), list(inos), None,
                   [c or 0 for c in ctimes], shab_of(sha), list(target) if "l" in types else None)

    def to_json(self, ri: int, rel: str) -> list[Any]:
        """The folder as a version 2 manifest holds it (JSON columns, `cold` text)."""
        cold = self.cold
        if cold is None:
            shas, targets = self.shas(), self.link_targets()
            cold = (json.dumps({"sha256": shas, "target": targets}, separators=(",", ":"))
                    if any(shas) or any(targets) else None)
        return [ri, rel, list(self.names), self.types, list(self.modes), list(self.sizes), list(self.mtimes),
                self.stored, list(self.inos), cold, list(self.ctimes) if self.ctimes is not None else None]

    @property
    def index(self) -> dict[str, int]:
        if self._index is None:
            self._index = dict(zip(self.names, range(len(self.names)), strict=True))
        return self._index

    def _load_cold(self) -> dict[str, list[Any]]:
        if self._cold is None:
            try:
                doc = json.loads(self.cold or "null") or {"sha256": [None] * len(self.names),
                                                          "target": [None] * len(self.names)}
                if not (isinstance(doc, dict) and isinstance(doc.get("sha256"), list)
                        and isinstance(doc.get("target"), list) and len(doc["sha256"]) == len(self.names)
                        and len(doc["target"]) == len(self.names)):
                    raise TypeError("columns that do not line up")
            except (ValueError, TypeError, RecursionError) as exc:
                raise ManifestDamaged(f"sha256 and target columns do not load ({exc})") from None
            self._cold = doc
        return self._cold

    def shas(self) -> list[Any]:
        """Every entry's sha256 as hex (None for folders, symlinks, and files without one),
        decoded once."""
        if self._shas is None:
            if self.shab is not None:
                b = self.shab
                self._shas = [None if b[k:k + 32] == _ZERO32 else b[k:k + 32].hex() for k in range(0, len(b), 32)]
            else:
                self._shas = self._load_cold()["sha256"]
        return self._shas

    def link_targets(self) -> list[str | None]:
        if self.shab is not None:
            return self.targets if self.targets is not None else [None] * len(self.names)
        return self._load_cold()["target"]

    def sha_bytes(self) -> bytes:
        """The sha256s as `shab` holds them (for a version 3 manifest)."""
        return self.shab if self.shab is not None else shab_of(self.shas())

    def entry(self, ri: int, rel: str, i: int, *, sha: bool = True) -> Entry:
        """Entry i in full: [root, path, type, mode, size, mtime_ns, sha256, stored, target, ino].
        `sha=False`: a linked file's sha256 is left out (None) where the snapshot keeps its own
        tree (versions 1 and 2) — a restore links the stored inode, checked by size and mtime,
        and needs no hash to do it; a version 3 entry names its object by it."""
        kind = self.types[i]
        sha256 = target = None
        try:
            if kind == "l":
                target = self.link_targets()[i]
            elif kind == "f" and (sha or self.stored[i] != "L" or self.shab is not None):
                sha256 = self.shas()[i]
        except (IndexError, TypeError) as exc:
            raise ManifestDamaged(f"{self.names[i]}: sha256 and target do not load ({exc})") from None
        name = self.names[i]
        return Entry(ri, f"{rel}/{name}" if rel else name, kind, self.modes[i], self.sizes[i], self.mtimes[i],
                     sha256, _STORED_BACK.get(self.stored[i]), target, self.inos[i] or None)

    def entries(self, ri: int, rel: str) -> list[Entry]:
        return [self.entry(ri, rel, i) for i in range(len(self.names))]

    def sha(self, i: int) -> str | None:
        """Entry i's sha256 alone (decoded once per folder)."""
        try:
            return self.shas()[i]
        except (IndexError, TypeError) as exc:
            raise ManifestDamaged(f"{self.names[i]}: sha256 does not load ({exc})") from None

    def shape_ok(self) -> bool:
        """Columns of the right types and lengths, types and stored codes known."""
        names, types, modes, sizes, mtimes, stored, inos, cold, ctimes = (
            self.names, self.types, self.modes, self.sizes, self.mtimes, self.stored, self.inos, self.cold,
            self.ctimes)
        return (type(names) is list and type(types) is str and type(stored) is str and type(modes) is list
                and type(sizes) is list and type(mtimes) is list and type(inos) is list
                and (cold is None or type(cold) is str)
                and (ctimes is None or (type(ctimes) is list and len(ctimes) == len(names)))
                and len(names) == len(types) == len(modes) == len(sizes) == len(mtimes) == len(stored) == len(inos)
                and not types.strip("fdlo") and not stored.strip("LRC-"))


_ZERO32 = bytes(32)
_ZERO_HEX = "0" * 64


def shab_of(shas: Any) -> bytes:
    """sha256s (hex, or None) as 32 bytes each, zeros for none; a value that is not one is
    stored as none (the entry then names no object, which is refused where it is used)."""
    out = []
    for h in shas:
        try:
            out.append(bytes.fromhex(h) if isinstance(h, str) and len(h) == 64 else _ZERO32)
        except ValueError:
            out.append(_ZERO32)
    return b"".join(out)


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
    version: int = MANIFEST_VERSION
    raw: bytes | None = field(default=None, repr=False)  # `manifest.bin` as read (version 3)
    _objects: tuple[SnapshotMeta, str] | None = field(default=None, repr=False, compare=False)

    @property
    def uses_objects(self) -> bool:
        """Version 3: files are objects of the store; before, the snapshot's own `tree/`."""
        return self.version >= 3

    @property
    def entries(self) -> list[Entry]:
        return [e for (ri, rel), f in self.folders.items() for e in f.entries(ri, rel)]

    def to_json(self) -> dict[str, Any]:
        """The manifest as versions 1 and 2 were written (JSON, folders as columns), with its
        own version: how an older snapshot's manifest is written back (`recovery.apply`)."""
        return {"version": self.version, "roots": [r.__dict__ for r in self.roots],
                # Where the roots really were (a prefix reached through a symlink is the same
                # environment by its real path, even once the symlink is gone).
                "real_roots": self.real_roots, "exclude": self.exclude,
                "folder_fields": ["root", "path", "names", "types", "modes", "sizes", "mtimes_ns", "stored",
                                  "inos", "cold", "ctimes_ns"],
                "folders": [f.to_json(ri, rel) for (ri, rel), f in self.folders.items()]}

    def save(self, folder: Path, *, same_as: Manifest | None = None) -> None:
        """Write this manifest into a snapshot's folder: version 3, `manifest.bin` (durably;
        a version 1 or 2 `manifest.json` there is replaced by it). `same_as`: a manifest read
        from disk whose folders — the very objects — this one holds, all of them and no other:
        its bytes are written as they were read, not encoded again (in the order they were read:
        a walk's order either way: two lanes may have merged them in another)."""
        header = {"roots": [r.__dict__ for r in self.roots], "real_roots": self.real_roots, "exclude": self.exclude}
        if (same_as is not None and same_as.raw is not None and same_as.roots == self.roots
                and same_as.real_roots == self.real_roots and same_as.exclude == self.exclude
                and len(same_as.folders) == len(self.folders)
                and all(same_as.folders.get(k) is f for k, f in self.folders.items())):
            data = same_as.raw
        else:
            data = manifest_codec.encode(header, [(ri, rel, f) for (ri, rel), f in self.folders.items()])
        atomic_write(folder / MANIFEST, data)
        (folder / MANIFEST_JSON).unlink(missing_ok=True)
        self.version = MANIFEST_VERSION

    @classmethod
    def of(cls, roots: list[Root], entries: list[list[Any]], real_roots: list[str] | None,
           exclude: list[str] | None = None, version: int = MANIFEST_VERSION) -> Manifest:
        by_folder: dict[tuple[int, str], list[list[Any]]] = {}
        for e in entries:
            key = (e[0], e[1].rpartition("/")[0])
            kids = by_folder.get(key)
            if kids is None:
                kids = by_folder[key] = []
            kids.append(e)
        return cls(roots, {k: Folder.of(v) for k, v in by_folder.items()}, real_roots, exclude or [], version)

    def stored_path(self, snap: SnapshotMeta, e: Entry) -> str:
        """Where entry e's bytes are: its object (version 3), or the snapshot's own copy in
        `tree/` (earlier versions). ManifestDamaged for an entry that names no object."""
        if not self.uses_objects:
            return f"{snap.path}/tree/{e.root}/{e.path}"
        if self._objects is None or self._objects[0] is not snap:
            self._objects = (snap, str(objects_dir(snap.path.parent.parent)))
        return f"{self._objects[1]}/{self.object_of(e)}"

    def stored_at(self, snap: SnapshotMeta, ri: int, rel: str) -> str | None:
        """Where the file at `rel` (under root `ri`) is stored, or None when the manifest has
        no such file (or names no object for it)."""
        folder, _, name = rel.rpartition("/")
        f = self.folders.get((ri, folder))
        i = f.index.get(name) if f is not None else None
        if f is None or i is None or f.types[i] != "f":
            return None
        try:
            return self.stored_path(snap, f.entry(ri, folder, i))
        except ManifestDamaged:
            return None

    @staticmethod
    def object_of(e: Entry) -> str:
        """The object a version 3 file entry names (see `objects.object_name`)."""
        try:
            return object_name(e.sha256 or "", "L" if e.stored == "link" else "C", e.mtime_ns)
        except ValueError as exc:
            raise ManifestDamaged(f"{e.path}: {exc}") from None

    def objects(self) -> set[str]:
        """Every object this manifest names (version 3; none before). ManifestDamaged for a
        file entry that names none."""
        names: set[str] = set()
        if not self.uses_objects:
            return names
        add = names.add
        for f in self.folders.values():
            types = f.types
            if "f" not in types:
                continue
            if f.shab is None:  # (a version 3 manifest written as JSON: checked one by one)
                shas = f.shas()
                for i, kind in enumerate(types):
                    if kind == "f":
                        try:
                            add(object_name(shas[i], "L" if f.stored[i] == "L" else "C", f.mtimes[i]))
                        except ValueError as exc:
                            raise ManifestDamaged(f"{f.names[i]}: {exc}") from None
                continue
            hexes, stored, mtimes = f.shab.hex(), f.stored, f.mtimes
            i = types.find("f")
            while i >= 0:
                h = hexes[64 * i:64 * i + 64]
                if h == _ZERO_HEX:
                    raise ManifestDamaged(f"{f.names[i]}: names no object (no sha256)")
                add(f"{h[:2]}/{h[2:]}-{mtimes[i]}" if stored[i] == "L" else f"{h[:2]}/{h[2:]}")
                i = types.find("f", i + 1)
        return names

    @classmethod
    def load(cls, snap: SnapshotMeta, *, validate: bool = True, raw: bytes | None = None) -> Manifest:
        """Read a snapshot's manifest. `validate=False` checks only its shape, for the
        restore, which checks the folders as it walks them and each entry it acts on.
        `raw`: the bytes of its `manifest.bin`, read already by the caller."""
        path = snap.path / MANIFEST
        if raw is not None or os.path.lexists(path):
            try:
                man = cls._from_binary(raw if raw is not None else read_regular_bytes(path))
            except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError,
                    OverflowError) as exc:
                raise SnapshotDamaged(f"snapshot {snap.id}: manifest {path} is unreadable ({exc})",
                                      hint="restore another snapshot (`rewheel history TARGET` lists them)") from None
            if validate:
                man._validate(snap)
            return man
        path = snap.path / MANIFEST_JSON
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
                man = cls(roots, folders, real_roots, exclude, version)
            else:  # version 1: one flat list
                entries = doc["entries"]
                bad = next((e for e in entries if not (
                    isinstance(e, list) and len(e) == 9 and type(e[0]) is int and 0 <= e[0] < len(roots)
                    and type(e[1]) is str and e[2] in ("f", "d", "l", "o"))), None)
                if bad is not None:
                    raise bad_entry(snap, bad)
                man = cls.of(roots, entries, real_roots, exclude, version=1)
            entries = man.entries if validate else []
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as exc:
            raise SnapshotDamaged(f"snapshot {snap.id}: manifest {path} is unreadable ({exc})",
                                  hint="restore another snapshot (`rewheel history TARGET` lists them)") from None
        if validate:
            man._validate(snap, entries)
        return man

    def _validate(self, snap: SnapshotMeta, entries: list[Entry] | None = None) -> None:
        seen = set()
        try:
            listed = self.entries if entries is None else entries
        except ManifestDamaged as exc:
            raise bad_entry(snap, exc) from None
        for e in listed:
            if not safe_rel(e.path) or (e.root, e.path) in seen:
                raise bad_entry(snap, e)
            if e.kind == "l" and not isinstance(e.target, str):
                raise SnapshotDamaged(f"snapshot {snap.id}: symlink entry {e.path} has no target")
            seen.add((e.root, e.path))

    @classmethod
    def _from_binary(cls, data: bytes) -> Manifest:
        head, items = manifest_codec.decode(data)
        roots = [Root(str(r["path"]), bool(r["whole"])) for r in head["roots"]]
        real = head.get("real_roots")
        real_roots = [str(r) for r in real] if isinstance(real, list) else None
        exclude = head.get("exclude") or []
        if not (isinstance(exclude, list) and all(type(g) is str for g in exclude)):
            raise TypeError("exclude is not a list of globs")
        folders: dict[tuple[int, str], Folder] = {}
        for ri, rel, c in items:
            if not 0 <= ri < len(roots) or (ri, rel) in folders:
                raise ValueError(f"folder {rel!r} of root {ri}: no such root, or listed twice")
            folders[(ri, rel)] = Folder(c["names"], c["types"], c["modes"], c["sizes"], c["mtimes"], c["stored"],
                                        c["inos"], None, c["ctimes"], c["shab"], c["targets"])
        return cls(roots, folders, real_roots, exclude, MANIFEST_VERSION, data)


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
