"""What a diff returns — `FileChange`, `DiffResult` and their JSON; `LIVE`, the live side's
name — and paths as users name them (`display_path`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rewheel.diff.packages import PackageChange

LIVE = "live"


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
