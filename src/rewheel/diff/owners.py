"""Which distribution a path belongs to (`_Owners`: its RECORD, else the folder only that
distribution's files are in), from the live RECORDs or a snapshot's stored ones; and the live
RECORD rows by path (`_record_owners`).
"""

from __future__ import annotations

import itertools
import operator
import os
from collections.abc import Iterable

from packaging.utils import canonicalize_name

from rewheel.environment import Distribution, RecordEntry
from rewheel.snapshot import Manifest, SnapshotMeta


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
