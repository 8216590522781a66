"""The scan: `scan` (every RECORD indexed, the listed files checked — the package folders'
walk, the fast path, the hash — the mismatches cross-checked against their wheels, the
patches and the unlisted files named and diffed) and `scan_target` (`rewheel patches
TARGET`).
"""

from __future__ import annotations

import configparser
import os
import stat
import time
from collections.abc import Iterable
from typing import Any

from packaging.utils import canonicalize_name

from rewheel.diff import display_path
from rewheel.environment import Distribution, Environment, RecordEntry
from rewheel.package_folders import BYTECODE, PackageFolders
from rewheel.patches.hashes import _digest_file, _read_small, _record_digest, _sha256
from rewheel.patches.pristine import _attach_diffs, _cross_check, _Mismatch, flag_snapshot_sharing
from rewheel.patches.results import Patch, PatchScan
from rewheel.patches.sources import Fetcher, UvIndexFetcher, _SnapshotSource
from rewheel.patches.uvcache import UvCache
from rewheel.snapshot import Store
from rewheel.snapshot.store import aliased_files
from rewheel.snapshot.tree import provably_pristine
from rewheel.texts import is_install_artifact


def _entry_point_scripts(dist: Distribution) -> dict[str, tuple[str, str]]:
    """Script name -> (module, attribute) for console and GUI scripts."""
    path = dist.dist_info / "entry_points.txt"
    if not path.exists():
        return {}
    cp = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        cp.read_string(path.read_text(errors="replace"))
    except configparser.Error:
        return {}
    out: dict[str, tuple[str, str]] = {}
    for section in ("console_scripts", "gui_scripts"):
        if cp.has_section(section):
            for name, target in cp.items(section):
                mod, _, attr = target.split("[")[0].strip().partition(":")
                out[name] = (mod.strip(), attr.strip())
    return out


def _is_generated_script(path: str, scripts: dict[str, tuple[str, str]]) -> bool:
    """A console-script wrapper as installers generate it (the shebang names the interpreter,
    so it legitimately differs when an environment is moved or rewritten)."""
    ep = scripts.get(os.path.basename(path))
    if ep is None:
        return False
    data = _read_small(path, 64 << 10)
    if data is None or not data.startswith(b"#!"):
        return False
    text = data.decode("utf-8", errors="replace")
    mod, attr = ep
    return f"from {mod} import {attr.split('.')[0]}" in text


def scan(env: Environment, *, dists: Iterable[str] | None = None, store: Store | None = None,
         uv_cache: UvCache | None | bool = True, fetcher: Fetcher | None = None,
         with_diffs: bool = True, thorough: bool = False) -> PatchScan:
    """Find locally patched and unlisted files.

    `dists`: only these distributions (names); `store`: snapshots to take pristine copies
    from; `uv_cache`: True = locate it with `uv cache dir`, None/False = don't use it;
    `fetcher`: fetch wheels from an index (e.g. `UvIndexFetcher`) to cross-check RECORDs and
    for pristine copies found nowhere else; `with_diffs=False` only detects; `thorough`
    hashes every file instead of trusting size + mtime.

    The steps, in order: index every RECORD (who lists what), check the listed files
    (walking the package folders, fast path, hash), cross-check the mismatches against the
    bytes their wheels ship, then name the patches and the unlisted files, and diff them.
    """
    t0 = time.monotonic()
    s = _Scan(env, dists, store, uv_cache, thorough)
    result = PatchScan(s.prefix, [])
    s.check_listed(result)
    found = s.patches_from_mismatches(result, fetcher) + s.unlisted_patches()
    result.patches = [p for p, _ in found]
    if with_diffs and result.patches:
        _attach_diffs(found, result, store, s.snaps, s.cache(), fetcher)
    elif not with_diffs:
        result.sources.append("diffs not asked for")
    s.stats["seconds"] = round(time.monotonic() - t0, 3)
    result.stats = s.stats
    result.patches.sort(key=lambda p: (p.distribution, p.kind, p.path))
    return result


def _index_records(all_dists: list[Distribution], target_names: set[str]) -> tuple[
        dict[str, RecordEntry], dict[str, Distribution], dict[str, list[tuple[Distribution, RecordEntry]]]]:
    """Every RECORD-listed path with its entry and owner; and, for a path several
    distributions list, all its owners, the one a patch is attributed to first."""
    listed: dict[str, RecordEntry] = {}
    owner: dict[str, Distribution] = {}
    shared: dict[str, list[tuple[Distribution, RecordEntry]]] = {}
    for d in all_dists:
        rows = {e.path: e for e in d.record}
        for path in rows.keys() & listed.keys():
            if path in shared:
                shared[path].append((d, rows[path]))
            else:
                shared[path] = [(owner[path], listed[path]), (d, rows[path])]
        listed.update(rows)
        owner.update(dict.fromkeys(rows, d))
    for owners in shared.values():
        # The owner a patch is attributed to: the one installed last (its bytes won) among
        # the distributions asked about.
        owners.sort(key=lambda o: (o[0].name in target_names, o[0].install_time_ns), reverse=True)
    return listed, owner, shared


class _Scan:
    """One scan's state between its steps: the RECORD index, the counters, the files that
    match no RECORD (`mismatches`) and the unlisted files the folder walk met."""

    def __init__(self, env: Environment, dists: Iterable[str] | None, store: Store | None,
                 uv_cache: UvCache | None | bool, thorough: bool) -> None:
        self.all_dists = env.distributions()
        wanted = {canonicalize_name(n) for n in dists} if dists is not None else None
        self.targets = [d for d in self.all_dists if wanted is None or d.name in wanted]
        self.sites = sorted({str(d.site) for d in self.all_dists} | {str(s) for s in env.site_dirs},
                            key=len, reverse=True)
        self.prefix = str(env.prefix)
        self.scripts_dir = str(env.scripts_dir).rstrip("/")
        self.store, self.uv_cache, self.thorough = store, uv_cache, thorough
        self.snaps = _SnapshotSource(store) if store is not None else None
        self._located: list[UvCache | None] = []
        self._aliases: dict[str, list[Any]] | None = None
        self.listed, self.owner, self.shared = _index_records(self.all_dists, {d.name for d in self.targets})
        self.stats: dict[str, Any] = {
            "distributions": 0, "files_checked": 0, "files_hashed": 0, "bytes_hashed": 0, "fast_path": 0,
            "unverifiable": 0, "regenerated_scripts": 0, "unlisted_walked": 0, "shared_paths": len(self.shared),
            "record_inconsistent": 0}
        self.mismatches: list[_Mismatch] = []
        self.extra: list[tuple[str, os.stat_result, str]] = []
        self._scripts_of: dict[str, dict[str, tuple[str, str]]] = {}
        self.folders = PackageFolders(self.targets)

    def cache(self) -> UvCache | None:
        # `uv cache dir` costs a subprocess: only asked once a patch needs it.
        if not self._located:
            self._located.append(UvCache.locate() if self.uv_cache is True else (self.uv_cache or None))
        return self._located[0]

    def aliases(self) -> dict[str, list[Any]]:
        """Files a rollback proved to hold a snapshot's bytes (see `aliased_files`), by the
        paths this scan spells; read once, and only when a file is not proven otherwise."""
        if self._aliases is None:
            by = aliased_files(self.store) if self.store is not None else {}
            prefix = self.prefix
            real = os.path.realpath(prefix)
            if by and real != prefix:
                by = {prefix + k[len(real):] if k.startswith(real + "/") else k: v for k, v in by.items()}
            self._aliases = by
        return self._aliases

    def check_listed(self, result: PatchScan) -> None:
        """Every RECORD-listed file of the targets: pristine by size + mtime (most of them,
        met by one walk of the package folders), else hashed; what matches no RECORD
        becomes a mismatch, what is gone is `missing`."""
        stats, thorough, shared, sites, prefix = self.stats, self.thorough, self.shared, self.sites, self.prefix
        # The package folders first: one walk lstats the listed files in them (relative to
        # the open folder), proves most by the fast path on the spot, and finds the files no
        # RECORD lists. A path several distributions list takes the long way below.
        folders = self.folders
        seen: dict[str, os.stat_result] = {}
        proven: set[str] = set()
        stats["unlisted_walked"], self.extra = folders.walk(self.listed, self.owner, seen,
                                                            None if thorough else proven)
        proven.difference_update(shared)
        seen_get = seen.get

        # This loop runs once per installed file: names bound locally, is_install_artifact
        # inlined where it is cheap.
        lstat, S_ISREG, judge = os.lstat, stat.S_ISREG, self.judge
        done: set[str] = set()
        checked = fast = walked_fast = unverifiable = 0
        for dist in self.targets:
            if (dist.direct_url or {}).get("dir_info", {}).get("editable"):
                result.skipped.append({"distribution": dist.name,
                                       "reason": "editable install: its source is your checkout"})
                continue
            if not dist.record:
                result.skipped.append({"distribution": dist.name, "reason": "no RECORD (not installed from a wheel)"})
                continue
            stats["distributions"] += 1
            installed = dist.install_time_ns
            for entry in dist.record:
                path = entry.path
                if path in proven:
                    walked_fast += 1
                    continue
                if (path.endswith(BYTECODE) or "/__pycache__/" in path
                        or (".dist-info/" in path and is_install_artifact(path))):
                    continue
                owners = shared.get(path) if shared else None
                if owners is not None:
                    if path in done:
                        continue
                    done.add(path)
                elif not entry.hash:
                    unverifiable += 1
                    continue
                st = seen_get(path)
                if st is None:  # not in a package folder (a top-level module, a script), or gone
                    try:
                        st = lstat(path)
                    except FileNotFoundError:
                        who = owners[0][0] if owners else dist
                        result.missing.append({"path": display_path(path, sites, prefix),
                                               "distribution": who.name})
                        continue
                    except OSError:
                        continue
                if not S_ISREG(st.st_mode):
                    continue
                checked += 1
                if owners is None:
                    if not thorough and provably_pristine(st.st_size, st.st_mtime_ns, entry.size, installed):
                        fast += 1
                        continue
                    owners = [(dist, entry)]
                judge(path, st, owners)
        stats["files_checked"] = checked + walked_fast
        stats["fast_path"] += fast + walked_fast
        stats["unverifiable"] += unverifiable

    def judge(self, path: str, st: os.stat_result, owners: list[tuple[Distribution, RecordEntry]]) -> None:
        """Past the single-owner fast path: any owner's fast path, a rollback's proof, then
        any owner's hash; a file that matches none is a mismatch."""
        stats = self.stats
        if not self.thorough:
            for d, e in owners:
                if provably_pristine(st.st_size, st.st_mtime_ns, e.size, d.install_time_ns):
                    stats["fast_path"] += 1
                    return
            # A rollback left this file in place (newer than the RECORD it put back) after
            # proving its bytes: pristine when those bytes are what an owner's RECORD lists.
            v = self.aliases().get(path)
            if (v is not None and v[0] == st.st_ino and v[1] == st.st_mtime_ns and v[2] == st.st_size
                    and any(_record_digest(e) == ("sha256", v[3]) for _d, e in owners)):
                stats["fast_path"] += 1
                return
        now: dict[str, str] = {}
        verifiable = True
        for _d, e in owners:
            digest = _record_digest(e)
            if digest is None:
                verifiable = False
                continue
            algo, want = digest
            if e.size is not None and e.size != st.st_size:
                continue
            if algo not in now:
                try:
                    now[algo] = _digest_file(path, algo)
                except OSError:
                    return
                stats["files_hashed"] += 1
                stats["bytes_hashed"] += st.st_size
            if now[algo] == want:
                return
        if not verifiable:
            stats["unverifiable"] += 1
            return
        if os.path.dirname(path) == self.scripts_dir and self._regenerated_script(path, owners):
            stats["regenerated_scripts"] += 1
            return
        data = _read_small(path)
        try:
            sha = now.get("sha256") or (_sha256(data) if data is not None else _digest_file(path, "sha256"))
        except OSError:
            return
        self.mismatches.append(_Mismatch(path, st, owners, sha, data))

    def _regenerated_script(self, path: str, owners: list[tuple[Distribution, RecordEntry]]) -> bool:
        for d, _e in owners:
            if d.name not in self._scripts_of:
                self._scripts_of[d.name] = _entry_point_scripts(d)
            if _is_generated_script(path, self._scripts_of[d.name]):
                return True
        return False

    def patches_from_mismatches(self, result: PatchScan, fetcher: Fetcher | None) -> list[tuple[Patch, Distribution]]:
        """The mismatches checked against the bytes their wheels ship: equal ones are
        `record_inconsistent`, the rest are patches."""
        found: list[tuple[Patch, Distribution]] = []
        if self.mismatches:
            _cross_check(self.mismatches, self.cache(), self.snaps, fetcher)
        for m in self.mismatches:
            same = next((name for name, w in m.shipped.items() if w[1] == m.sha256), None)
            if same is not None:
                result.record_inconsistent.append(self._inconsistent(m, same))
                continue
            found.append(self._patch(m))
        result.record_inconsistent.sort(key=lambda r: (r["distribution"], r["path"]))
        self.stats["record_inconsistent"] = len(result.record_inconsistent)
        return found

    def _inconsistent(self, m: _Mismatch, same: str) -> dict[str, str]:
        d, e = next(o for o in m.owners if o[0].name == same)
        source = {"uv-cache": "uv's cache", "index": "the index"}.get(m.shipped[same][0], m.shipped[same][0])
        told = (f"its RECORD lists size {e.size}, the wheel ships {m.st.st_size} bytes"
                if e.size is not None and e.size != m.st.st_size
                else "its RECORD lists another hash for the bytes the wheel ships")
        return {"path": display_path(m.path, self.sites, self.prefix), "distribution": d.name,
                "reason": f"RECORD inconsistent, matches its wheel ({source}): {told}"}

    def _patch(self, m: _Mismatch) -> tuple[Patch, Distribution]:
        dist, entry = m.owners[0]
        digest = _record_digest(entry)
        algo, want = digest if digest is not None else ("", None)
        st = m.st
        p = Patch(display_path(m.path, self.sites, self.prefix), m.path, dist.name, dist.version_text,
                  "modified", m.sha256, st.st_size, stat.S_IMODE(st.st_mode),
                  record_sha256=want if algo == "sha256" else None, record_size=entry.size,
                  patched_bytes=m.data)
        own = m.shipped.get(dist.name)
        if own is not None and own[0] != "snapshot" and own[2] is not None:
            p.wheel_bytes, p.wheel_source = own[2], own[0]
        if m.unchecked:
            p.not_cross_checked = "; ".join(f"{n}: {why}" for n, why in m.unchecked.items())
            p.pristine_note = ("its RECORD could not be cross-checked against the bytes its wheel "
                               f"ships ({p.not_cross_checked})")
        cache = self.cache() if st.st_nlink > 1 else None
        if cache is not None:
            hit = cache.same_inode(p.path, st)
            if hit is not None:
                p.shares_uv_cache_inode = True
                p.uv_cache_path = str(hit)
        return p, dist

    def unlisted_patches(self) -> list[tuple[Patch, Distribution]]:
        """Files inside a package's folders that no RECORD lists."""
        found: list[tuple[Patch, Distribution]] = []
        for path, st, top in self.extra:
            dist = self.folders.owner_of(path, top)
            data = _read_small(path)
            try:
                sha = _sha256(data) if data is not None else _digest_file(path, "sha256")
            except OSError:
                continue
            found.append((Patch(display_path(path, self.sites, self.prefix), path, dist.name, dist.version_text,
                                "unlisted", sha, st.st_size, stat.S_IMODE(st.st_mode), patched_bytes=data), dist))
        return found


def scan_target(t: Any, *, dists: Iterable[str] | None = None, offline: bool = False,
                thorough: bool = False) -> PatchScan:
    """`rewheel patches TARGET`: scan with every pristine source the target offers — its
    snapshots, uv's cache, and (unless offline) its recipe's indexes through uv."""
    fetcher = None if offline else UvIndexFetcher.for_recipe(t.recipe)
    try:
        result = scan(t.env, dists=dists, store=t.store, fetcher=fetcher, thorough=thorough)
    finally:
        if fetcher is not None:
            fetcher.close()
    flag_snapshot_sharing(result, t.store)
    return result
