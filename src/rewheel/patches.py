"""Local patches: installed files whose bytes differ from what their wheel installed, what
a reinstall would throw away, and carrying them onto a new version.

Finding them is fast: a RECORD-listed file whose size equals the RECORD's and whose mtime
is older than its distribution's install time (RECORD is written last) is pristine without
being read; only the rest is hashed. What installers write at install time is understood,
not reported: byte-compiled caches, the `.dist-info` bookkeeping files (RECORD,
INSTALLER, REQUESTED, direct_url.json, uv_cache.json), and console-script wrappers, which
are regenerated with the interpreter's path in their shebang. Files inside a package's
folders that no RECORD lists are reported separately as `unlisted`.

A patch is a file whose bytes match *no* owner's RECORD and differ from the bytes its wheel
actually ships. A path several distributions list (a split or renamed package and its old
metapackage, a helper module several wheels ship) holds the bytes of whichever was
installed later: it is pristine when it matches any owner's RECORD (the fast path per
owner, then the hash). A wheel whose own RECORD disagrees with the bytes it ships leaves a
file that matches no RECORD: before a mismatch is called a patch it is compared with the
wheel's bytes (uv's cache, else the index); a file equal to them is reported apart as
`record_inconsistent`, never as a patch, and never reapplied.

The pristine content a patch is diffed against comes, in this order, from a snapshot that
holds the file with the RECORD's hash, from uv's cache (uv unpacks each wheel under
`<cache>/archive-v0/<id>/`), or from the wheel fetched again from the index by uv. Every
candidate is checked against the RECORD hash before it is used.

uv installs by hard-linking files from its cache: a patch written in place into such a
file also changed uv's cached copy, and the next "clean" reinstall would link the patched
bytes back while RECORD claims they are pristine. Such patches are flagged
(`shares_uv_cache_inode`); `clean_uv_cache_for` drops those cache entries so the run
reinstalls them from fresh bytes.
"""

from __future__ import annotations

import base64
import configparser
import csv
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from merge3 import Merge3
from packaging.utils import canonicalize_name

from rewheel import proc
from rewheel.diff import display_path
from rewheel.environment import Distribution, Environment, RecordEntry
from rewheel.errors import CommandNotFound
from rewheel.package_folders import BYTECODE, PackageFolders
from rewheel.paths import fsync_dir, write_all
from rewheel.snapshot import ManifestDamaged, Manifest, SnapshotDamaged, Store
from rewheel.snapshot.store import aliased_files
from rewheel.snapshot.tree import provably_pristine
from rewheel.texts import as_text, count_lines, is_install_artifact, unified_diff

# Patched files up to this size are kept in memory so they can be carried onto a new
# version after the reinstall has replaced them.
KEEP_LIMIT = 16 << 20


# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------
# Hashes
# --------------------------------------------------------------------------------------
def _record_digest(entry: RecordEntry) -> tuple[str, str] | None:
    """(algorithm, hex digest) of a RECORD row; None when it carries no usable hash."""
    if not entry.hash or "=" not in entry.hash:
        return None
    algo, _, b64 = entry.hash.partition("=")
    if algo not in hashlib.algorithms_guaranteed or algo in ("md5", "sha1"):
        return None
    try:
        return algo, base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    except (ValueError, TypeError):
        return None


def _digest_file(path: str, algo: str) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_small(path: str | Path, limit: int = KEEP_LIMIT) -> bytes | None:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


# --------------------------------------------------------------------------------------
# uv's cache
# --------------------------------------------------------------------------------------
class UvCache:
    """The unpacked wheels in uv's cache (`<cache>/archive-v*/<id>/<site-relative path>`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._archives: list[Path] | None = None
        self._by_dist: dict[tuple[str, str], list[Path]] | None = None
        self._rows: dict[Path, dict[str, tuple[str, str | None]]] = {}

    @classmethod
    def locate(cls, env: dict[str, str] | None = None) -> UvCache | None:
        """uv's cache as `uv cache dir` names it (honours UV_CACHE_DIR); None without uv."""
        named = (os.environ if env is None else env).get("UV_CACHE_DIR")
        if named and not (os.environ if env is None else env).get("UV_NO_CACHE"):
            # What `uv cache dir` would answer, without starting uv (the variable wins
            # over uv's config files).
            root = Path(named).expanduser().absolute()
            return cls(root) if root.is_dir() else None
        from rewheel.installer import find_uv as uv_bin

        try:
            res = proc.run([uv_bin(), "cache", "dir"], timeout=30, env=env)
        except CommandNotFound:
            return None
        if not res.ok or not res.stdout.strip():
            return None
        root = Path(res.stdout.strip().splitlines()[-1])
        return cls(root) if root.is_dir() else None

    @property
    def archives(self) -> list[Path]:
        if self._archives is None:
            found: list[Path] = []
            try:
                buckets = sorted(p for p in self.root.iterdir() if p.name.startswith("archive-v"))
            except OSError:
                buckets = []
            for b in buckets:
                try:
                    found += [b / n for n in os.listdir(b) if not n.startswith(".")]
                except OSError:
                    continue
            self._archives = found
        return self._archives

    def candidates(self, rel: str) -> Iterator[tuple[Path, os.stat_result]]:
        for a in self.archives:
            p = a / rel
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield p, st

    def same_inode(self, rel: str, st: os.stat_result) -> Path | None:
        """The cache file that *is* this file (a hard link), if any."""
        if st.st_nlink < 2:
            return None
        for p, cst in self.candidates(rel):
            if (cst.st_dev, cst.st_ino) == (st.st_dev, st.st_ino):
                return p
        return None

    def pristine(self, rel: str, sha256: str, size: int | None) -> bytes | None:
        for p, cst in self.candidates(rel):
            if size is not None and cst.st_size != size:
                continue
            data = _read_small(p)
            if data is not None and _sha256(data) == sha256:
                return data
        return None

    def archives_of(self, dist: Distribution) -> list[Path]:
        """The unpacked wheels that hold this distribution's `.dist-info` folder (the same
        name and version; builds that differ are told apart by their RECORD rows)."""
        if self._by_dist is None:
            by: dict[tuple[str, str], list[Path]] = {}
            for a in self.archives:
                try:
                    names = os.listdir(a)
                except OSError:
                    continue
                for n in names:
                    if n.endswith(".dist-info"):
                        by.setdefault(_dist_info_key(n), []).append(a)
            self._by_dist = by
        return self._by_dist.get(_dist_info_key(dist.dist_info.name), [])

    def wheel_file(self, dist: Distribution, rel: str, record_hash: str | None) -> tuple[Path | None, str]:
        """The file at `rel` (relative to site-packages) as the wheel `dist` was installed
        from ships it: (path, "") or (None, why not).

        The archive must hold the distribution's `.dist-info` and its own RECORD must give
        `rel` the very row the installed RECORD gives (the same build). Its file must not
        have been written since uv unpacked the archive (mtime not after the archive
        folder's ctime, which the rename that publishes it sets): a patch written in place
        through uv's hard link changed the cached copy too, and the same inode proves
        nothing."""
        why = ""
        for a in self.archives_of(dist):
            rows = self._rows.get(a)
            if rows is None:
                rows = self._rows[a] = _wheel_rows(a, dist.dist_info.name)
            row = rows.get(rel)
            if row is None or row[1] != record_hash:
                why = why or "uv's cache holds another build of it"
                continue
            p = a / row[0]
            try:
                st, ast = os.lstat(p), os.stat(a)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if st.st_mtime_ns > ast.st_ctime_ns:
                why = "uv's cached copy was written after uv unpacked it (patched in place?)"
                continue
            return p, ""
        return None, why or "its wheel is not in uv's cache"


def _dist_info_key(name: str) -> tuple[str, str]:
    stem = name[: -len(".dist-info")]
    dist, _, version = stem.partition("-")
    return canonicalize_name(dist), version


def _wheel_rows(folder: Path, dist_info_name: str) -> dict[str, tuple[str, str | None]]:
    """RECORD rows of an unpacked wheel (or a `--target` install) by path relative to
    site-packages: rel -> (path inside the folder, hash as the RECORD writes it).
    `<name>.data/purelib|platlib/` files are installed into site-packages."""
    out: dict[str, tuple[str, str | None]] = {}
    try:
        text = (folder / dist_info_name / "RECORD").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    data = dist_info_name[: -len(".dist-info")] + ".data/"
    for row in csv.reader(text.splitlines()):
        if not row or not row[0]:
            continue
        rel = site_rel = row[0]
        if rel.startswith(data):
            scheme, _, rest = rel[len(data):].partition("/")
            if scheme not in ("purelib", "platlib") or not rest:
                continue
            site_rel = rest
        out.setdefault(site_rel, (rel, row[1] if len(row) > 1 and row[1] else None))
    return out


def _shipped(path: Path) -> tuple[str, bytes | None] | None:
    """(sha256, bytes when small) of a file as a wheel ships it; None when unreadable."""
    data = _read_small(path)
    if data is not None:
        return _sha256(data), data
    try:
        return _digest_file(str(path), "sha256"), None
    except OSError:
        return None


def clean_uv_cache_for(names: Iterable[str], *, env: dict[str, str] | None = None,
                       timeout: float = 600) -> proc.Completed:
    """`uv cache clean NAME...`: drop the cache entries a patch written in place corrupted,
    so that the next install fetches and unpacks fresh bytes."""
    from rewheel.installer import find_uv as uv_bin

    names = sorted({canonicalize_name(n) for n in names})
    if not names:
        return proc.Completed([], 0, "")
    return proc.run([uv_bin(), "cache", "clean", *names], timeout=timeout, env=env)


# --------------------------------------------------------------------------------------
# Pristine sources
# --------------------------------------------------------------------------------------
class Fetcher(Protocol):
    """Gets a distribution's wheel contents from an index: a folder laid out like
    site-packages, or None."""

    def unpack(self, dist: Distribution) -> Path | None: ...

    def close(self) -> None:
        """Releases what it fetched (its scratch folder)."""


@dataclass
class UvIndexFetcher:
    """Fetches a distribution's wheel again with uv (its indexes, credentials and config),
    bypassing the local cache, and unpacks it into a private folder."""

    python: str
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    prerelease: bool = False
    timeout: float = 600
    workdir: Path | None = None
    notes: list[str] = field(default_factory=list)
    _done: dict[str, Path | None] = field(default_factory=dict)

    @classmethod
    def for_recipe(cls, recipe: Any) -> UvIndexFetcher:
        inst = recipe.install
        return cls(python=str(recipe.python), index_url=inst.index_url,
                   extra_index_urls=tuple(inst.extra_index_urls),
                   find_links=tuple(inst.find_links), prerelease=inst.prerelease)

    def unpack(self, dist: Distribution) -> Path | None:
        if dist.name in self._done:
            return self._done[dist.name]
        from rewheel.installer import find_uv as uv_bin

        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="rewheel-pristine-"))
        target = self.workdir / dist.name
        argv = [uv_bin(), "pip", "install", "--quiet", "--no-deps", "--no-cache",
                "--python", self.python, "--target", str(target),
                f"{dist.display_name}=={dist.version_text}"]
        from rewheel.installer import index_options

        if self.no_index:
            argv.append("--no-index")
        # Credentials go to uv in its environment, never on its command line (`ps`).
        index_args, creds, drop = index_options(self.index_url, self.extra_index_urls, self.find_links)
        argv += index_args
        if self.prerelease:
            argv += ["--prerelease", "allow"]
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(creds)
        res = proc.run(argv, timeout=self.timeout, env=env)
        if not res.ok:
            tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["timed out"]
            self.notes.append(f"index: {dist.display_name}=={dist.version_text} not fetched ({tail[0][:200]})")
            self._done[dist.name] = None
        else:
            self._done[dist.name] = target
        return self._done[dist.name]

    def close(self) -> None:
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


class _SnapshotSource:
    """Files as snapshots of this environment hold them, newest snapshot first."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._index: list[dict[str, tuple[str, str | None]]] | None = None  # path -> (stored file, sha256)

    def _load(self, wanted: set[str]) -> None:
        self._index = []
        for meta in self.store.list():
            try:
                man = Manifest.load(meta)
            except SnapshotDamaged:
                continue
            found: dict[str, tuple[str, str | None]] = {}
            for e in man.entries:
                if e[2] == "f":
                    full = os.path.join(man.roots[e[0]].path, e[1])
                    if full in wanted:
                        try:
                            found[full] = (man.stored_path(meta, e), e[6])
                        except ManifestDamaged:
                            continue
            if found:
                self._index.append(found)

    def pristine(self, abs_path: str, sha256: str, wanted: set[str]) -> bytes | None:
        if self._index is None:
            self._load(wanted)
        assert self._index is not None
        for found in self._index:
            hit = found.get(abs_path)
            if hit is None or hit[1] != sha256:
                continue
            data = _read_small(hit[0])
            if data is not None and _sha256(data) == sha256:
                return data
        return None


# --------------------------------------------------------------------------------------
# Scanning
# --------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------
# Policies the run cycle applies
# --------------------------------------------------------------------------------------
def hazard_packages(s: PatchScan) -> set[str]:
    """Distributions with a patch written into a file uv hard-linked from its cache."""
    return {p.distribution for p in s.patches if p.shares_uv_cache_inode}


def patched_distributions(s: PatchScan) -> set[str]:
    """Distributions carrying modified files (`keep-old-version` leaves these alone).
    Unlisted files do not count: a reinstall leaves files no RECORD lists in place."""
    return {p.distribution for p in s.patches if p.kind == "modified"}


def _flat(path: str) -> str:
    """A file name for a patched file's path: `/` as `__`, bytes as the file system has them
    (a non-UTF-8 name arrives surrogate-escaped and is written back as the same bytes), and
    bounded: a name longer than 200 bytes keeps its last 150 (the file's own name) behind a
    hash of the whole path, so that it fits in a file name (255 bytes) with its suffix and
    two long paths never share one."""
    raw = path.encode("utf-8", "surrogateescape").replace(b"/", b"__")
    if len(raw) > 200:
        digest = hashlib.sha256(raw).hexdigest()[:12].encode()
        tail = raw[-150:]
        while tail and 0x80 <= tail[0] < 0xC0:  # do not start inside a UTF-8 sequence
            tail = tail[1:]
        raw = digest + b"--" + tail
    return raw.decode("utf-8", "surrogateescape")


def patch_text(p: Patch) -> str:
    """A git-style patch for one file (paths relative to site-packages)."""
    if p.kind == "unlisted":
        head = f"diff --git a/{p.path} b/{p.path}\nnew file mode {0o100000 | p.mode:o}\n"
    else:
        head = f"diff --git a/{p.path} b/{p.path}\n"
    if p.diff is None:
        return head + f"# no diff: {p.pristine_note or 'no pristine copy'}\n"
    return head + p.diff


def save_patches(s: PatchScan, run_dir: Path) -> list[Path]:
    """Write one `.patch` per patched file into `<run_dir>/patches/`, plus `patches.json`.
    A file with no diff (no pristine copy, binary) is saved whole as `<name>.file` too."""
    out = run_dir / "patches"
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for p in s.patches:
        target = out / f"{_flat(p.path)}.patch"
        # surrogateescape: a non-UTF-8 file name goes into the patch as the bytes it has.
        target.write_text(patch_text(p), encoding="utf-8", errors="surrogateescape")
        written.append(target)
        if p.diff is None or p.binary:
            whole = out / f"{_flat(p.path)}.file"
            if p.patched_bytes is not None:
                whole.write_bytes(p.patched_bytes)
            else:
                try:
                    shutil.copyfile(p.abs_path, whole)
                except OSError:
                    continue
            written.append(whole)
    (out / "patches.json").write_text(json.dumps(s.to_json(), indent=1))
    return written


@dataclass
class ReapplyResult:
    path: str
    status: str  # "clean" | "conflict" | "missing" | "unchanged"
    detail: str
    distribution: str | None = None
    conflict_file: str | None = None

    @property
    def failed(self) -> bool:
        return self.status in ("conflict", "missing")

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "status": self.status, "detail": self.detail,
                "distribution": self.distribution, "conflict_file": self.conflict_file}


def reapply_failed(results: Iterable[ReapplyResult]) -> bool:
    """True when any patch could not be carried (the run must fail and revert)."""
    return any(r.failed for r in results)


def _merge(pristine: str, new: str, patched: str) -> tuple[str, bool]:
    m = Merge3(pristine.splitlines(keepends=True), new.splitlines(keepends=True),
               patched.splitlines(keepends=True))
    conflict = any(r[0] == "conflict" for r in m.merge_regions())
    merged = "".join(m.merge_lines(name_a="new version", name_b="local patch"))
    return merged, conflict


def _write_replacing(path: str, data: bytes, mode: int) -> None:
    """Write through a new inode: the installed file may be hard-linked from uv's cache,
    and writing into it would change the cache too. Durable like `atomic_write`: all the
    bytes, synced, then the rename synced in the folder (a crash after this returns keeps
    the carried patch)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.rewheel-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


def reapply(s: PatchScan, env: Environment | None = None, run_dir: Path | None = None) -> list[ReapplyResult]:
    """Carry each patch onto what is installed now (after the reinstall) with a three-way
    merge of (pristine old, patched old, new installed file).

    All or nothing: files are written only when every patch merges cleanly; on any conflict
    or missing file nothing is written and, with `run_dir`, each conflict's merge with
    markers is saved as `<run_dir>/patches/<name>.conflict`.
    """
    if env is not None and Path(s.prefix) != Path(env.prefix):
        raise ValueError(f"patch scan of {s.prefix} cannot be reapplied to {env.prefix}")
    results: list[ReapplyResult] = []
    writes: list[tuple[str, bytes, int]] = []
    conflicts: list[tuple[ReapplyResult, str]] = []
    # A file whose wheel ships exactly its bytes is no patch (its RECORD is wrong): the new
    # version's file stays as installed, whatever list it arrives in.
    inconsistent = {r["path"] for r in s.record_inconsistent}
    for p in s.patches:
        if p.path in inconsistent:
            continue
        r, write, merged = _reapply_one(p)
        results.append(r)
        if write is not None:
            writes.append(write)
        if merged is not None:
            conflicts.append((r, merged))
    if not reapply_failed(results):
        for path, data, mode in writes:
            _write_replacing(path, data, mode)
    elif run_dir is not None:
        out = run_dir / "patches"
        out.mkdir(parents=True, exist_ok=True)
        for r, merged in conflicts:
            dest = out / f"{_flat(r.path)}.conflict"
            dest.write_text(merged, encoding="utf-8")
            r.conflict_file = str(dest)
    return results


def _reapply_one(p: Patch) -> tuple[ReapplyResult, tuple[str, bytes, int] | None, str | None]:
    """The result, the write to make when clean, and the merge with conflict markers."""
    r = ReapplyResult(p.path, "clean", "", p.distribution)
    if p.patched_bytes is None:
        r.status, r.detail = "conflict", f"file larger than {KEEP_LIMIT >> 20} MiB: carry it by hand"
        return r, None, None
    try:
        st = os.lstat(p.abs_path)
        new = _read_small(p.abs_path) if stat.S_ISREG(st.st_mode) else None
    except FileNotFoundError:
        st, new = None, None
    if p.kind == "unlisted":
        if st is None:
            r.detail = "added file restored"
            return r, (p.abs_path, p.patched_bytes, p.mode), None
        if new is not None and _sha256(new) == p.sha256:
            r.status, r.detail = "unchanged", "still present (a reinstall keeps files no RECORD lists)"
            return r, None, None
        r.status, r.detail = "conflict", "the new version installs a different file at this path"
        return r, None, None
    if st is None or new is None:
        r.status, r.detail = "missing", f"the new version has no {p.path}"
        return r, None, None
    mode = stat.S_IMODE(st.st_mode)
    new_sha = _sha256(new)
    if new_sha == p.sha256:
        r.status, r.detail = "unchanged", "the installed file already has the patched bytes"
        return r, None, None
    if p.record_sha256 is not None and new_sha == p.record_sha256:
        r.detail = "file unchanged upstream: patched copy restored"
        return r, (p.abs_path, p.patched_bytes, mode), None
    if p.pristine_bytes is None:
        r.status = "conflict"
        r.detail = ("the file changed upstream and there is no pristine copy of the old version to "
                    f"merge against ({p.pristine_note or 'unknown'})")
        return r, None, None
    base, mine, theirs = as_text(p.pristine_bytes), as_text(p.patched_bytes), as_text(new)
    if base is None or mine is None or theirs is None:
        r.status, r.detail = "conflict", "binary file changed upstream: cannot be merged"
        return r, None, None
    merged, conflict = _merge(base, theirs, mine)
    if conflict:
        r.status = "conflict"
        n = merged.count("<<<<<<< new version")
        r.detail = f"{n} conflicting hunk(s) between the new version and the local patch"
        return r, None, merged
    if merged == theirs:
        r.status, r.detail = "unchanged", "the new version already contains the patch"
        return r, None, None
    r.detail = "merged cleanly"
    return r, (p.abs_path, merged.encode("utf-8"), mode), None
