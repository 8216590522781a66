"""uv's cache as a source of the bytes a wheel ships: `UvCache` (the unpacked wheels under
`<cache>/archive-v*/`, the cache file that *is* an installed file, the file a given build
ships), an unpacked wheel's RECORD rows (`_wheel_rows`), and `clean_uv_cache_for`, which drops
the entries a patch written in place corrupted.
"""

from __future__ import annotations

import csv
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from packaging.utils import canonicalize_name

from rewheel import proc
from rewheel.environment import Distribution
from rewheel.errors import CommandNotFound
from rewheel.patches.hashes import _digest_file, _read_small, _sha256


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
