"""The snapshot store: where snapshots live and what describes each.

Owns: `Store` (`<home>/envs/<env>/snapshots/<id>/`: listing, lookup by id or alias,
deletion, pruning), `SnapshotMeta` (`meta.json`: label, status, versions, distributions,
and the store home it belongs to) and the aliases file beside a snapshot (`ALIASES`: live
files proven to hold a snapshot's bytes, so a later restore need not prove them again).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewheel.errors import SnapshotDamaged, SnapshotError
from rewheel.paths import atomic_write, ensure_private_dir, env_dir, state_home

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
        try:
            doc = json.loads((path / "meta.json").read_text())
            return cls(path=path, home=home, **doc)
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
        # What `prune` removed, by id: so that a report can say what each one was.
        self.pruned_meta: dict[str, SnapshotMeta] = {}

    def list(self) -> list[SnapshotMeta]:
        metas = []
        for d in self.snapshots_dir.iterdir():
            if d.is_dir() and not d.name.startswith(".") and (d / "meta.json").exists():
                try:
                    metas.append(SnapshotMeta.load(d, self.home))
                except SnapshotDamaged:
                    continue
        return sorted(metas, key=lambda m: m.created, reverse=True)

    def damaged(self) -> list[str]:
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
            raise SnapshotError(f"no snapshot {shown} for {self.env_dir.name}",
                                hint="`rewheel history TARGET` lists the snapshots")
        raise SnapshotError(f"snapshot reference {ref!r} is ambiguous: "
                            + ", ".join(m.id for m in matches))

    def delete(self, snap_id: str) -> None:
        if not snap_id or snap_id in (".", "..") or "/" in snap_id or snap_id.startswith("."):
            # Never the store itself (an empty id) or anything outside it.
            raise SnapshotError(f"not a snapshot id: {snap_id!r}")
        path = self.snapshots_dir / snap_id
        trash = self.snapshots_dir / f".deleting-{snap_id}"
        os.rename(path, trash)  # atomic: a half-deleted snapshot is never listed
        shutil.rmtree(trash, ignore_errors=True)

    def prune(self, keep: int, protect: set[str] = frozenset()) -> list[str]:
        """Keep the newest `keep` snapshots; never delete a protected or a pinned one
        (pinned ones do not count towards `keep` either). Oldest go first, and failed builds
        (kept to be inspected) only once no other snapshot can go. Returns the ids removed,
        which every caller reports. Called under the environment's lock, it also clears
        what killed snapshots and deletions left behind (`.tmp-*`, `.deleting-*`)."""
        for leftover in self.snapshots_dir.iterdir():
            if leftover.name.startswith((".tmp-", ".deleting-")):
                shutil.rmtree(leftover, ignore_errors=True)
        removed = []
        metas = [m for m in self.list() if not m.pinned]
        surplus = len(metas) - keep
        oldest_first = list(reversed(metas))
        order = [m for m in oldest_first if not m.failed_build] + [m for m in oldest_first if m.failed_build]
        for m in order:
            if surplus <= 0:
                break
            if m.id in protect:
                continue
            self.delete(m.id)
            removed.append(m.id)
            self.pruned_meta[m.id] = m
            surplus -= 1
        return removed


ALIASES = "aliases.json"  # in a snapshot's folder: live files proven to hold its bytes


def read_alias_file(path: Path) -> tuple[list[str], dict[str, list[Any]]]:
    """`aliases.json`: the roots its keys index (real paths; empty in version 2) and, by
    "root/path", [inode, mtime_ns, size, sha256] (size and sha256 None in version 2). None
    yet, or a damaged one, is empty: it only costs relinks and copies."""
    try:
        doc = json.loads(path.read_text())
        keys, inos, mtimes = doc["paths"], doc["inos"], doc["mtimes"]
        sizes, shas = doc.get("sizes") or [None] * len(keys), doc.get("shas") or [None] * len(keys)
        roots = doc.get("roots") or []
        if not (len(keys) == len(inos) == len(mtimes) == len(sizes) == len(shas)) or not isinstance(roots, list):
            return [], {}
        return ([r for r in roots if type(r) is str],
                {k: [i, m, z if type(z) is int else None, h if type(h) is str and len(h) == 64 else None]
                 for k, i, m, z, h in zip(keys, inos, mtimes, sizes, shas, strict=True)
                 if type(k) is str and type(i) is int and type(m) is int})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [], {}


def aliased_files(store: Store) -> dict[str, list[Any]]:
    """Every file a restore into this store's environment proved to hold a snapshot's bytes
    (`aliases.json` of each snapshot), by real absolute path: [inode, mtime_ns, size,
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


def save_aliases(snap: SnapshotMeta, found: dict[str, list[Any]], roots: list[str],
                 known: tuple[list[str], dict[str, list[Any]]] | None = None) -> None:
    """Remember the files a restore proved identical (see `SameBytes`), with their size and
    sha256: the next restore and `verify` accept them, and the next snapshot links them
    instead of copying them (their mtimes are newer than the RECORD put back, so RECORD no
    longer proves them). Best effort: without it those relink and copy, which is also right.
    `known`: the file as the restore already read it (merged into, not read again).

    Not fsynced: it is a cache of proofs, each still checked against the inode and mtime it
    names, so a crash that loses the newest one costs relinks, and a torn one reads as none.
    (A reinstall-all rollback proves ~52,000 files: a 10 MB write whose fsync, racing the
    restore's own flush, cost a fifth of the rollback.)"""
    if not found:
        return
    path = snap.path / ALIASES
    try:
        old_roots, files = known if known is not None else read_alias_file(path)
        if old_roots and old_roots != roots:
            files = {}  # keyed by other roots: start again
        files.update(found)
        # Columns: several times cheaper to write and read than one small list per file.
        keys = list(files)
        atomic_write(path, json.dumps({
            "version": 3, "roots": roots, "paths": keys, "inos": [files[k][0] for k in keys],
            "mtimes": [files[k][1] for k in keys], "sizes": [files[k][2] for k in keys],
            "shas": [files[k][3] for k in keys]}, separators=(",", ":")), durable=False)
    except OSError:
        pass
