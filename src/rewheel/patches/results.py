"""What a patch scan finds — `Patch`, `PatchScan` and their JSON — and the policies the run cycle
reads off it (`hazard_packages`, `patched_distributions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Patch:
    path: str  # relative to its site-packages (else to the prefix), as users name it
    abs_path: str
    distribution: str
    version: str
    kind: str  # "modified" | "unlisted"
    sha256: str
    size: int
    mode: int
    record_sha256: str | None = None  # what the wheel installed (modified files)
    record_size: int | None = None
    diff: str | None = None
    added_lines: int | None = None
    removed_lines: int | None = None
    binary: bool = False
    pristine_source: str | None = None  # "snapshot" | "uv-cache" | "index" | None
    pristine_note: str | None = None  # why there is no pristine copy / where it came from
    shares_uv_cache_inode: bool = False
    uv_cache_path: str | None = None
    # Snapshots whose stored copy is this very inode (a hard link): the patch, written in
    # place, changed them too (`rewheel verify` flags them; a rollback recovers the bytes).
    shares_snapshot_inode: list[str] = field(default_factory=list)
    # Bytes kept for reapplying after the reinstall (not serialised).
    patched_bytes: bytes | None = field(default=None, repr=False)
    pristine_bytes: bytes | None = field(default=None, repr=False)
    # The bytes its wheel ships where they could be had (uv's cache, the index), and why
    # not for the owners whose wheel could not be consulted (not serialised).
    wheel_bytes: bytes | None = field(default=None, repr=False)
    wheel_source: str | None = field(default=None, repr=False)
    not_cross_checked: str | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "distribution": self.distribution, "diff": self.diff,
                "version": self.version, "kind": self.kind, "abs_path": self.abs_path,
                "sha256": self.sha256, "record_sha256": self.record_sha256, "size": self.size,
                "added_lines": self.added_lines, "removed_lines": self.removed_lines,
                "binary": self.binary, "pristine_source": self.pristine_source,
                "pristine_note": self.pristine_note,
                "shares_uv_cache_inode": self.shares_uv_cache_inode,
                "uv_cache_path": self.uv_cache_path, "shares_snapshot_inode": self.shares_snapshot_inode}


@dataclass
class PatchScan:
    prefix: str
    patches: list[Patch]
    missing: list[dict[str, str]] = field(default_factory=list)  # RECORD-listed, gone
    skipped: list[dict[str, str]] = field(default_factory=list)  # distributions not checked
    stats: dict[str, Any] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # pristine sources consulted, or why not
    # Files whose bytes match no RECORD but are exactly what their wheel ships (the wheel's
    # RECORD is wrong): {"path", "distribution", "reason"}. Not patches, never reapplied.
    record_inconsistent: list[dict[str, str]] = field(default_factory=list)
    # Snapshots an edit in place has damaged: {"id", "files"} (the fast check, `patches` only).
    damaged_snapshots: list[dict[str, Any]] = field(default_factory=list)

    @property
    def modified(self) -> list[Patch]:
        return [p for p in self.patches if p.kind == "modified"]

    @property
    def unlisted(self) -> list[Patch]:
        return [p for p in self.patches if p.kind == "unlisted"]

    def to_json(self) -> dict[str, Any]:
        return {"patches": [p.to_json() for p in self.patches], "missing": self.missing,
                "skipped": self.skipped, "hazard_packages": sorted(hazard_packages(self)),
                "record_inconsistent": self.record_inconsistent,
                "sources": self.sources, "stats": self.stats, "prefix": self.prefix,
                "damaged_snapshots": self.damaged_snapshots}


def hazard_packages(s: PatchScan) -> set[str]:
    """Distributions with a patch written into a file uv hard-linked from its cache."""
    return {p.distribution for p in s.patches if p.shares_uv_cache_inode}


def patched_distributions(s: PatchScan) -> set[str]:
    """Distributions carrying modified files (`keep-old-version` leaves these alone).
    Unlisted files do not count: a reinstall leaves files no RECORD lists in place."""
    return {p.distribution for p in s.patches if p.kind == "modified"}
