"""Package versions between two states: `PackageChange` and `diff_versions` (upgraded,
downgraded, added, removed, reinstalled …, with what nightly versions encode).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packaging.utils import canonicalize_name

from rewheel import versions as vers


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
