"""What a patched file is compared with: the bytes each owner's wheel ships (`_cross_check`,
before a mismatch is called a patch), the pristine copy each patch's diff is made against
(`_attach_diffs`), and the snapshots whose stored copy is the patched inode itself
(`flag_snapshot_sharing`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from rewheel.environment import Distribution, RecordEntry
from rewheel.patches.hashes import _read_small, _sha256
from rewheel.patches.results import Patch, PatchScan
from rewheel.patches.sources import Fetcher, _SnapshotSource
from rewheel.patches.uvcache import UvCache, _shipped, _wheel_rows
from rewheel.snapshot import Manifest, SnapshotDamaged, Store
from rewheel.texts import as_text, count_lines, unified_diff


@dataclass
class _Mismatch:
    """A RECORD-listed file that matches none of its owners' RECORDs, awaiting the check
    against the bytes its wheel(s) ship."""

    path: str
    st: os.stat_result
    owners: list[tuple[Distribution, RecordEntry]]  # the one it is attributed to first
    sha256: str
    data: bytes | None
    shipped: dict[str, tuple[str, str, bytes | None]] = field(default_factory=dict)  # name -> (source, sha256, bytes)
    unchecked: dict[str, str] = field(default_factory=dict)  # name -> why its wheel was not consulted


def _site_rel(path: str, dist: Distribution) -> str | None:
    site = str(dist.site).rstrip("/") + "/"
    return path[len(site):] if path.startswith(site) else None


def _cross_check(mismatches: list[_Mismatch], cache: UvCache | None, snaps: _SnapshotSource | None,
                 fetcher: Fetcher | None) -> None:
    """What each owner's wheel ships at each mismatched path: from uv's cache (the archive
    of that very build, unwritten since unpacked), else proven by a snapshot that holds the
    RECORD's bytes there (then the wheel ships them), else from the index. Stops at the
    first owner whose wheel ships the live bytes."""

    def settle(m: _Mismatch) -> bool:
        return any(w[1] == m.sha256 for w in m.shipped.values())

    for m in mismatches:
        for d, e in m.owners:
            rel = _site_rel(m.path, d)
            if rel is None:
                m.unchecked[d.name] = "outside site-packages"
                continue
            if cache is None:
                m.unchecked[d.name] = "no uv cache"
                continue
            f, why = cache.wheel_file(d, rel, e.hash)
            if f is not None and m.st.st_nlink > 1 and m.st.st_mtime_ns >= d.install_time_ns:
                # The installed file written after its install: if it is uv's cached copy
                # itself (a hard link), that copy says nothing about the wheel, whatever
                # has touched the archive's folder since.
                try:
                    fst = os.lstat(f)
                except OSError:
                    fst = None
                if fst is None or (fst.st_dev, fst.st_ino) == (m.st.st_dev, m.st.st_ino):
                    f, why = None, "uv's cached copy is this very file, written after the install"
            got = _shipped(f) if f is not None else None
            if got is None:
                m.unchecked[d.name] = why or "unreadable in uv's cache"
                continue
            m.shipped[d.name] = ("uv-cache", *got)
            if got[0] == m.sha256:
                break
    todo = [m for m in mismatches if m.unchecked and not settle(m)]
    if snaps is not None and todo:
        wanted = {m.path for m in mismatches}  # loaded once: the diffs want the same paths
        for m in todo:
            for d, e in m.owners:
                sha = e.sha256_hex
                if d.name in m.unchecked and sha and snaps.pristine(m.path, sha, wanted) is not None:
                    m.shipped[d.name] = ("snapshot", sha, None)
                    del m.unchecked[d.name]
    if fetcher is None:
        for m in todo:
            for name in m.unchecked:
                m.unchecked[name] += ", the index was not consulted"
        return
    rows: dict[str, dict[str, tuple[str, str | None]]] = {}
    for m in todo:
        for d, e in m.owners:
            if d.name not in m.unchecked or m.unchecked[d.name] == "outside site-packages":
                continue
            rel = _site_rel(m.path, d)
            folder = fetcher.unpack(d)
            if folder is not None and d.name not in rows:
                rows[d.name] = _wheel_rows(folder, d.dist_info.name)
            row = rows[d.name].get(rel or "") if folder is not None else None
            if folder is None or row is None or row[1] != e.hash:
                m.unchecked[d.name] += (", the index did not provide it" if folder is None or row is None
                                        else ", the index serves another build")
                continue
            got = _shipped(folder / row[0])
            if got is None:
                continue
            m.shipped[d.name] = ("index", *got)
            del m.unchecked[d.name]
            if got[0] == m.sha256:
                break


def _attach_diffs(found: list[tuple[Patch, Distribution]], result: PatchScan, store: Store | None,
                  snaps: _SnapshotSource | None, cache: UvCache | None, fetcher: Fetcher | None) -> None:
    wanted = {p.abs_path for p, _ in found if p.kind == "modified"}
    result.sources = [f"snapshots in {store.snapshots_dir}" if store else "snapshots: no store given",
                      f"uv cache {cache.root}" if cache else "uv cache: not found",
                      "index (fetched with uv)" if fetcher else "index: not consulted"]
    for p, dist in found:
        if p.kind == "unlisted":
            text = as_text(p.patched_bytes)
            if text is None:
                p.binary = True
                p.diff = f"Binary file b/{p.path} added (not listed in any RECORD)\n"
            else:
                p.diff = unified_diff(None, text, None, p.path)
                p.added_lines, p.removed_lines = count_lines(p.diff)
            continue
        pristine: bytes | None = None
        if p.record_sha256 is not None:
            if snaps is not None:
                pristine = snaps.pristine(p.abs_path, p.record_sha256, wanted)
                p.pristine_source = "snapshot" if pristine is not None else None
            if pristine is None and cache is not None:
                pristine = cache.pristine(p.path, p.record_sha256, p.record_size)
                p.pristine_source = "uv-cache" if pristine is not None else None
            if pristine is None and fetcher is not None:
                folder = fetcher.unpack(dist)
                if folder is not None:
                    data = _read_small(folder / p.path)
                    if data is not None and _sha256(data) == p.record_sha256:
                        pristine = data
                        p.pristine_source = "index"
            if pristine is not None:
                p.pristine_note = None  # bytes with the RECORD's hash exist: it is consistent
        if pristine is None and p.wheel_bytes is not None:
            # The wheel's own RECORD is wrong about this file: diff against what it ships.
            pristine, p.pristine_source = p.wheel_bytes, p.wheel_source
            p.pristine_note = "diffed against the bytes its wheel ships (its RECORD's hash does not match them)"
        if pristine is None:
            if p.record_sha256 is None:
                p.pristine_note = "its RECORD hash is not sha256: no pristine copy can be verified"
                continue
            why = ["no snapshot holds it", "not in uv's cache" if cache else "no uv cache",
                   "the index was not consulted" if fetcher is None
                   else "the index did not provide it"]
            if p.shares_uv_cache_inode:
                why[1] = "uv's cached copy was patched too (shared inode)"
            p.pristine_note = "no pristine copy: " + ", ".join(why)
            if p.not_cross_checked:
                p.pristine_note += "; its RECORD could not be cross-checked against the bytes its wheel ships"
            p.binary = p.patched_bytes is not None and as_text(p.patched_bytes) is None
            continue
        p.pristine_bytes = pristine
        old_t, new_t = as_text(pristine), as_text(p.patched_bytes)
        if old_t is None or new_t is None:
            p.binary = True
            p.diff = f"Binary files a/{p.path} and b/{p.path} differ\n"
            continue
        p.diff = unified_diff(old_t, new_t, p.path, p.path)
        p.added_lines, p.removed_lines = count_lines(p.diff)
    if fetcher is not None and hasattr(fetcher, "notes"):
        result.sources += list(fetcher.notes)


def flag_snapshot_sharing(result: PatchScan, store: Store) -> None:
    """Which snapshots each patched file shares its inode with (a hard link: the patch,
    written in place, changed the snapshot's copy too), and which snapshots an edit has
    damaged (the fast check of `rewheel verify`: a stat per stored file)."""
    from rewheel.snapshot import damaged_files

    metas = store.list()
    edited = damaged_files(metas)
    result.damaged_snapshots += [{"id": m.id, "files": edited[m.id], "label": m.label} for m in metas if edited[m.id]]
    linked: dict[str, tuple[Patch, os.stat_result]] = {}
    for p in result.patches:
        try:
            st = os.lstat(p.abs_path)
        except OSError:
            continue
        if st.st_nlink > 1:
            linked[os.path.realpath(p.abs_path)] = (p, st)
    if not linked:
        return
    for m in metas:
        try:
            man = Manifest.load(m, validate=False)
        except SnapshotDamaged:
            continue
        real = man.real_roots or [os.path.realpath(r.path) for r in man.roots]
        for path, (p, st) in linked.items():
            for ri, root in enumerate(real):
                base = root.rstrip("/") + "/"
                if not path.startswith(base):
                    continue
                folder, _, name = path[len(base):].rpartition("/")
                f = man.folders.get((ri, folder))
                i = f.index.get(name) if f is not None else None
                if f is None or i is None or f.stored[i] != "L":
                    continue
                stored = man.stored_at(m, ri, path[len(base):])
                try:
                    sst = os.lstat(stored) if stored is not None else None
                except OSError:
                    continue
                if sst is None:
                    continue
                if (sst.st_dev, sst.st_ino) == (st.st_dev, st.st_ino) and m.id not in p.shares_snapshot_inode:
                    p.shares_snapshot_inode.append(m.id)
