"""The snapshot store: where snapshots live and what describes each.

Owns: `Store` (`<home>/envs/<env>/snapshots/<id>/`: listing, lookup by id or alias,
deletion, pruning, and the sweep of objects no snapshot names any more), `SnapshotMeta` (`meta.json`: label, status, versions, distributions,
and the store home it belongs to) and the aliases file beside a snapshot (`ALIASES`: live
files proven to hold a snapshot's bytes, so a later restore need not prove them again).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import math
import os
import shutil
import stat
import sys
import time
from array import array
from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewheel.errors import SnapshotDamaged, SnapshotError
from rewheel.paths import atomic_write, ensure_private_dir, env_dir, env_key, state_home

# --------------------------------------------------------------------------------------
# Metadata
# --------------------------------------------------------------------------------------
@dataclass
class SnapshotMeta:
    id: str
    path: Path  # <home>/envs/<env>/snapshots/<id>
    # The store's home: never captured, reverted or stashed by a snapshot even when it lies
    # inside the prefix. Known to whoever loads the snapshot (its Store), not kept in meta.json.
    home: Path
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
    def pinned(self) -> bool:
        """Pinned by `rewheel pin`: never pruned by `[snapshots] keep`, never forgotten
        until unpinned."""
        return bool(self.extra.get("pinned"))

    @property
    def failed_build(self) -> bool:
        """A build that failed (or never passed) its checks: the failed state a revert kept,
        or a rollback's snapshot of such a state. Pruned last; restored only with --force."""
        return self.status == "failed-upgrade" or bool(self.extra.get("failed_build"))

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
        doc = {k: v for k, v in self.__dict__.items() if k not in ("path", "home")}
        atomic_write(self.path / "meta.json", json.dumps(doc, indent=1, default=str))

    @classmethod
    def load(cls, path: Path, home: Path) -> SnapshotMeta:
        """A snapshot's meta.json, refused (SnapshotDamaged) when it is not a regular file (a
        FIFO would hang the read), not JSON, or has a field of the wrong type — which would
        otherwise fail later, far from the file, as an internal error."""
        try:
            doc = json.loads(read_regular(path / "meta.json"))
            if not isinstance(doc, dict):
                raise TypeError("not a JSON object")
            for key, want in _META_TYPES.items():
                if key in doc and not _is(doc[key], want):
                    raise TypeError(f"{key} is {type(doc[key]).__name__}, expected {want}")
            created = doc.get("created", 0)
            if not (math.isfinite(created) and 0 <= created < _CLOCK_END):
                raise ValueError(f"created is {created!r}, not a time a clock has")
            return cls(path=path, home=home, **doc)
        except (OSError, ValueError, TypeError, RecursionError) as exc:
            raise SnapshotDamaged(f"snapshot {path.name}: unreadable meta.json ({exc})",
                                  hint=f"inspect or delete {path}") from None


# The last second a snapshot's `created` may say (the year 5138): what `time.localtime` and
# every date shown can take; beyond it (1e300, NaN, inf) the field is damaged.
_CLOCK_END = 1e11
# What each meta.json field must be ("number": int or float, never bool; "?": or null).
_META_TYPES = {"id": "str", "label": "str", "status": "str", "created": "number", "prefix": "str",
               "python": "str", "kind": "str", "versions": "dict", "distributions": "list", "files": "int",
               "bytes_total": "int", "bytes_copied": "int", "bytes_linked": "int", "link_mode": "str",
               "run_id": "str?", "cleanup": "list", "extra": "dict"}
_PY_TYPES: dict[str, type | tuple[type, ...]] = {"str": str, "int": int, "number": (int, float), "dict": dict,
                                                  "list": list}


def _is(value: Any, want: str) -> bool:
    if want.endswith("?"):
        return value is None or _is(value, want[:-1])
    return isinstance(value, _PY_TYPES[want]) and not isinstance(value, bool)


def read_regular(path: Path, limit: int = 1 << 30) -> str:
    """A state file's text, read only when it is a regular file: opened without blocking and
    without following a last symlink, so a FIFO or device put in its place cannot hang or
    feed a command (OSError otherwise)."""
    return read_regular_bytes(path, limit).decode("utf-8")


def read_regular_bytes(path: Path, limit: int = 1 << 30) -> bytes:
    """`read_regular`'s bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------
class Store:
    """Snapshots and runs of one environment."""

    def __init__(self, prefix: Path, home: Path | None = None) -> None:
        from rewheel.owned import check_state

        self.home = ensure_private_dir(home or state_home())
        # No symlink in rewheel's own folders, before the first write (LinkInState, exit 3).
        check_state(self.home, self.home / "envs" / env_key(prefix))
        self.env_dir = env_dir(self.home, prefix)
        self.prefix = Path(prefix)  # what messages name: the environment, not its folder's key
        self.snapshots_dir = self.env_dir / "snapshots"
        self.snapshots_dir.mkdir(exist_ok=True, mode=0o700)
        # What `prune` removed, by id: so that a report can say what each one was.
        self.pruned_meta: dict[str, SnapshotMeta] = {}

    @classmethod
    def of_folder(cls, env_dir: Path, prefix: Path, home: Path) -> Store:
        """The store of an environment's state folder as it is (`rewheel board` reads every
        environment under a home): nothing is created or written."""
        store = cls.__new__(cls)
        store.home, store.env_dir, store.prefix = home, env_dir, Path(prefix)
        store.snapshots_dir = env_dir / "snapshots"
        store.pruned_meta = {}
        return store

    def list(self) -> list[SnapshotMeta]:
        metas: builtins.list[SnapshotMeta] = []
        if not self.snapshots_dir.is_dir():
            return metas
        for d in self.snapshots_dir.iterdir():
            if d.is_dir() and not d.name.startswith(".") and (d / "meta.json").exists():
                try:
                    metas.append(SnapshotMeta.load(d, self.home))
                except SnapshotDamaged:
                    continue
        return sorted(metas, key=lambda m: m.created, reverse=True)

    def damaged(self) -> builtins.list[str]:
        """Snapshot folders that `list` leaves out because their metadata cannot be read."""
        bad = []
        for d in sorted(self.snapshots_dir.iterdir()):
            if d.is_dir() and not d.name.startswith("."):
                try:
                    SnapshotMeta.load(d, self.home)
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
                return SnapshotMeta.load(exact, self.home)
        matches = [m for m in self.list() if m.id.startswith(ref) or m.label == ref]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise SnapshotError(f"no snapshot {shown} of {self.prefix}",
                                hint="`rewheel history TARGET` lists the snapshots")
        raise SnapshotError(f"snapshot reference {ref!r} is ambiguous: "
                            + ", ".join(m.id for m in matches))

    def delete(self, snap_id: str, *, collect: bool = True) -> None:
        """Remove one snapshot (an atomic rename, then the delete), and then the objects no
        other snapshot names (`collect=False`: the caller sweeps once, after several)."""
        if not snap_id or snap_id in (".", "..") or "/" in snap_id or snap_id.startswith("."):
            # Never the store itself (an empty id) or anything outside it.
            raise SnapshotError(f"not a snapshot id: {snap_id!r}")
        path = self.snapshots_dir / snap_id
        trash = self.snapshots_dir / f".deleting-{snap_id}"
        os.rename(path, trash)  # atomic: a half-deleted snapshot is never listed
        shutil.rmtree(trash, ignore_errors=True)
        if collect:
            self.collect()

    def collect(self) -> tuple[int, int]:
        """Remove the objects no snapshot names (what deleted snapshots, and captures that
        were killed, left). Under the environment's lock only. An object is removed only
        when every manifest of the store was read: one that cannot be read (damaged) might
        name any, so then nothing is removed. Returns (objects, bytes freed).

        A manifest with the same bytes as one read already names the same objects: read once.
        (Snapshots of an environment unchanged between them are such copies, and a store that
        has reached `keep` prunes on every snapshot.)"""
        import hashlib

        from rewheel.snapshot.manifest import MANIFEST, MANIFEST_JSON, Manifest, ManifestDamaged
        from rewheel.snapshot.objects import Objects, objects_dir

        if not objects_dir(self.env_dir).is_dir():
            return 0, 0
        names: set[str] = set()
        read: set[bytes] = set()
        for d in self.snapshots_dir.iterdir():
            if d.name.startswith(".deleting-") or not any(
                    os.path.lexists(d / m) for m in (MANIFEST, MANIFEST_JSON)):
                continue
            raw: bytes | None = None
            if os.path.lexists(d / MANIFEST):
                try:
                    raw = read_regular_bytes(d / MANIFEST)
                except OSError:
                    return 0, 0  # unreadable: it might name any object
                digest = hashlib.sha256(raw).digest()
                if digest in read:
                    continue
                read.add(digest)
            stub = SnapshotMeta(id=d.name, path=d, home=self.home, label="", status="", created=0.0, prefix="",
                                python="", kind="", versions={}, distributions=[], files=0, bytes_total=0,
                                bytes_copied=0, bytes_linked=0, link_mode="")
            try:
                names |= Manifest.load(stub, validate=False, raw=raw).objects()
            except (SnapshotDamaged, ManifestDamaged):
                return 0, 0
        with Objects(self.env_dir, create=False) as objs:
            return objs.collect(names)

    def prune(self, keep: int, protect: Set[str] = frozenset()) -> builtins.list[str]:
        """One rule (docs/snapshots.md#retention): the newest `keep` snapshots stay, and besides
        them every pinned one (which does not count towards `keep`) and every protected one
        (what a pending rollback or resume needs, what a recent command's report named:
        `commands.snapshots.protected_snapshots`). Everything else goes, oldest first. Returns the ids
        removed, which every caller reports. Called under the environment's lock, it also
        clears what killed snapshots and deletions left behind (`.tmp-*`, `.deleting-*`)."""
        killed = False  # a capture was killed: the objects it stored are named by no snapshot
        for leftover in self.snapshots_dir.iterdir():
            if leftover.name.startswith((".tmp-", ".deleting-")):
                killed = True
                shutil.rmtree(leftover, ignore_errors=True)
        removed = []
        metas = [m for m in self.list() if not m.pinned]  # newest first: the newest `keep` stay
        for m in reversed(metas[max(keep, 0):]):
            if m.id in protect:
                continue
            self.delete(m.id, collect=False)
            removed.append(m.id)
            self.pruned_meta[m.id] = m
        if removed or killed:
            self.collect()
        return removed


ALIASES = "aliases.bin"  # in a snapshot's folder: live files proven to hold its bytes
_ALIASES_V3 = "aliases.json"  # what rewheel wrote before (read when there is no ALIASES)
_MAGIC = b"rewheel aliases 4\n"
_NO_SHA = bytes(32)


class Found:
    """Files one restore proved (see `SameBytes`), as columns: "root/path", inode, mtime_ns,
    size, sha256 (hex). Columns, not a row per file, because the second lane sends its own
    back through a pipe and the aliases file is written from them (tens of thousands each)."""

    def __init__(self, keys: list[str] | None = None, inos: list[int] | None = None,
                 mtimes: list[int] | None = None, sizes: list[int] | None = None,
                 shas: list[str] | None = None) -> None:
        self.keys, self.inos, self.mtimes = keys or [], inos or [], mtimes or []
        self.sizes, self.shas = sizes or [], shas or []

    def add(self, key: str, ino: int, mtime_ns: int, size: int, sha: str) -> None:
        self.keys.append(key)
        self.inos.append(ino)
        self.mtimes.append(mtime_ns)
        self.sizes.append(size)
        self.shas.append(sha)

    def retimed(self, key: str, mtime_ns: int) -> None:
        """The file just added under `key` had its mtime set (to the manifest's)."""
        if self.keys and self.keys[-1] == key:
            self.mtimes[-1] = mtime_ns

    def columns(self) -> tuple[list[str], list[int], list[int], list[int], list[str]]:
        return self.keys, self.inos, self.mtimes, self.sizes, self.shas

    def extend(self, other: Found) -> None:
        self.keys += other.keys
        self.inos += other.inos
        self.mtimes += other.mtimes
        self.sizes += other.sizes
        self.shas += other.shas

    def __len__(self) -> int:
        return len(self.keys)


class Aliases(Mapping[str, list[Any]]):
    """The aliases file as columns: by "root/path", [inode, mtime_ns, size, sha256] (size
    and sha256 None where unknown). Kept as the columns it was read as, so reading tens of
    thousands of entries costs a few array copies, not an object per entry; a row is built
    when it is looked up."""

    def __init__(self, roots: list[str], keys: list[str], inos: array[int], mtimes: array[int],
                 sizes: array[int], shas: bytes) -> None:
        self.roots, self.keys_, self.inos, self.mtimes, self.sizes, self.shas = roots, keys, inos, mtimes, sizes, shas
        self._index: dict[str, int] | None = None

    @classmethod
    def empty(cls) -> Aliases:
        return cls([], [], array("Q"), array("q"), array("q"), b"")

    def at(self) -> dict[str, int]:
        """Each key's row."""
        if self._index is None:
            self._index = dict(zip(self.keys_, range(len(self.keys_)), strict=True))
        return self._index

    def row(self, i: int) -> list[Any]:
        sha = self.shas[32 * i:32 * i + 32]
        size = self.sizes[i]
        return [self.inos[i], self.mtimes[i], size if size >= 0 else None, None if sha == _NO_SHA else sha.hex()]

    def __getitem__(self, key: str) -> list[Any]:
        return self.row(self.at()[key])

    def get(self, key: str, default: Any = None) -> Any:  # the hot lookup: one dict probe
        i = self.at().get(key)
        return default if i is None else self.row(i)

    def __contains__(self, key: object) -> bool:
        return key in self.at()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys_)

    def __len__(self) -> int:
        return len(self.keys_)

    def merged(self, found: Found) -> Aliases:
        """These entries, with `found`'s added or replacing them."""
        new = set(found.keys)
        keep = [i for i, k in enumerate(self.keys_) if k not in new]
        inos, mtimes, sizes = (array(c.typecode, [c[i] for i in keep]) for c in (self.inos, self.mtimes, self.sizes))
        inos.extend(found.inos)
        mtimes.extend(found.mtimes)
        sizes.extend(found.sizes)
        return Aliases(self.roots, [self.keys_[i] for i in keep] + found.keys, inos, mtimes, sizes,
                       b"".join([self.shas[32 * i:32 * i + 32] for i in keep]) + bytes.fromhex("".join(found.shas)))

    def to_bytes(self) -> bytes:
        keys = "\0".join(self.keys_).encode("utf-8", "surrogateescape")
        # The keys' length is in the header: a file cut short anywhere reads as damaged.
        head = json.dumps({"roots": self.roots, "n": len(self.keys_), "keys_bytes": len(keys)}).encode()
        cols = [self.inos, self.mtimes, self.sizes]
        if sys.byteorder != "little":
            cols = [array(c.typecode, c) for c in cols]
            for c in cols:
                c.byteswap()
        return b"".join([_MAGIC, len(head).to_bytes(4, "little"), head, *(c.tobytes() for c in cols), self.shas,
                         keys])

    @classmethod
    def from_bytes(cls, raw: bytes) -> Aliases:
        """Raises ValueError (or KeyError, TypeError) when the bytes are not a whole file."""
        if not raw.startswith(_MAGIC):
            raise ValueError("not an aliases file")
        at = len(_MAGIC)
        hl = int.from_bytes(raw[at:at + 4], "little")
        head = json.loads(raw[at + 4:at + 4 + hl])
        n, roots = head["n"], head["roots"]
        if type(n) is not int or n < 0 or not isinstance(roots, list) or not all(type(r) is str for r in roots):
            raise ValueError("a malformed header")
        at += 4 + hl
        cols = []
        for code in "Qqq":
            c = array(code)
            c.frombytes(raw[at:at + 8 * n])
            if len(c) != n:
                raise ValueError("a short column")
            if sys.byteorder != "little":
                c.byteswap()
            cols.append(c)
            at += 8 * n
        shas = raw[at:at + 32 * n]
        at += 32 * n
        blob = raw[at:]
        keys = blob.decode("utf-8", "surrogateescape").split("\0") if n else []
        if len(shas) != 32 * n or len(keys) != n or len(blob) != head["keys_bytes"]:
            raise ValueError("a short file")
        inos, mtimes, sizes = cols
        return cls(roots, keys, inos, mtimes, sizes, shas)


def _sha_hex(sha: Any) -> str:
    """A sha256 as 64 hex digits; an unknown one as zeros (read back as None)."""
    if isinstance(sha, str) and len(sha) == 64:
        try:
            bytes.fromhex(sha)
            return sha
        except ValueError:
            pass
    return "0" * 64


def read_alias_file(path: Path) -> tuple[list[str], Aliases]:
    """A snapshot's aliases file (`path`: its ALIASES): the roots its keys index (real
    paths) and its entries (see `Aliases`). None yet, or a damaged one, is empty: it only
    costs relinks and copies. One written by an earlier rewheel (JSON) is read as well."""
    try:
        files = Aliases.from_bytes(path.read_bytes())
        return files.roots, files
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError):
        return [], Aliases.empty()
    return _read_v3(path.with_name(_ALIASES_V3))


def _read_v3(path: Path) -> tuple[list[str], Aliases]:
    try:
        doc = json.loads(path.read_text())
        keys, inos, mtimes = doc["paths"], doc["inos"], doc["mtimes"]
        sizes, shas = doc.get("sizes") or [None] * len(keys), doc.get("shas") or [None] * len(keys)
        roots = doc.get("roots") or []
        if not (len(keys) == len(inos) == len(mtimes) == len(sizes) == len(shas)) or not isinstance(roots, list):
            return [], Aliases.empty()
        found = Found()
        for k, i, m, z, h in zip(keys, inos, mtimes, sizes, shas, strict=True):
            if type(k) is str and type(i) is int and type(m) is int:
                found.add(k, i, m, z if type(z) is int else -1, _sha_hex(h))
        roots = [r for r in roots if type(r) is str]
        return roots, Aliases(roots, [], array("Q"), array("q"), array("q"), b"").merged(found)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError):
        return [], Aliases.empty()


def aliased_files(store: Store) -> dict[str, list[Any]]:
    """Every file a restore into this store's environment proved to hold a snapshot's bytes
    (`aliases.bin` of each snapshot), by real absolute path: [inode, mtime_ns, size,
    sha256]. Newer snapshots' proofs win. Such a file's mtime is newer than the RECORD a
    rollback put back, so RECORD no longer proves it pristine; the same inode with the same
    mtime and size still holds the recorded bytes."""
    by: dict[str, list[Any]] = {}
    try:
        metas = store.list()
    except OSError:
        return by
    for meta in reversed(metas):  # oldest first: newer proofs win
        af = meta.path / ALIASES
        if not af.exists():
            continue
        roots, files = read_alias_file(af)
        for key, v in files.items():
            k, _, rel = key.partition("/")
            if v[3] is None or not k.isdigit() or int(k) >= len(roots):
                continue
            by[f"{roots[int(k)].rstrip('/')}/{rel}" if rel else roots[int(k)]] = v
    return by


def save_aliases(snap: SnapshotMeta, found: Found, roots: list[str],
                 known: tuple[list[str], Aliases] | None = None) -> None:
    """Remember the files a restore proved identical (see `SameBytes`), with their size and
    sha256: the next restore and `verify` accept them, and the next snapshot links them
    instead of copying them (their mtimes are newer than the RECORD put back, so RECORD no
    longer proves them). Best effort: without it those relink and copy, which is also right.
    `known`: the file as the restore already read it (merged into, not read again).

    Columns of fixed-size numbers and digests (see `Aliases`): a reinstall-all rollback proves
    ~52,000 files, and this file is written by every such restore and read by the next, in each
    of its lanes (as JSON, a tenth of a second each way). Not fsynced: it is a cache of proofs,
    each still checked against the inode and mtime it names, so a crash that loses the newest
    one costs relinks, and a torn one reads as none."""
    if not found:
        return
    path = snap.path / ALIASES
    try:
        old_roots, files = known if known is not None else read_alias_file(path)
        if old_roots and old_roots != roots:
            files = Aliases.empty()  # keyed by other roots: start again
        merged = files.merged(found)
        merged.roots = roots
        atomic_write(path, merged.to_bytes(), durable=False)
        with contextlib.suppress(FileNotFoundError):
            (snap.path / _ALIASES_V3).unlink()  # merged into the new one
    except (OSError, OverflowError, ValueError):
        pass
