"""The very inode a file had: uv's cache as a place a restore may take a file back from.

Owns: `CacheInodes` — for a file a restore must write, the file in uv's cache that *is* the
inode the environment held at that path when the snapshot was taken (its manifest records
every file's live inode), unchanged since (same size and mtime), if uv's cache still holds it.

An environment installed by uv the usual way (`uv pip install`, hard links) shares every
file's inode with uv's cache; an upgrade replaces them with the new release's, and the old
release's stay in the cache. `uv pip sync` back to the old set links them again. The restore
does the same for the files it can prove are those inodes — the environment gets back the
very inodes it had, links and all — and copies the snapshot's own bytes for every other
file. The snapshot never depends on it: a pruned cache, a cache on another filesystem or no
uv at all only means copies. Nothing in uv's cache is written: a file whose mode or mtime
would have to change is copied instead.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rewheel.environment import Environment
    from rewheel.snapshot.tree import Root

def uv_cache_dir(env: dict[str, str] | None = None) -> Path | None:
    """Where uv keeps its cache, without starting uv (a restore starts no program):
    `UV_CACHE_DIR`, else uv's default on this system (`$XDG_CACHE_HOME/uv`, `~/.cache/uv`).
    A cache uv's configuration moved elsewhere is not found: the restore then copies, which
    is always right. None with `UV_NO_CACHE`, or when there is no such folder."""
    e = os.environ if env is None else env
    if e.get("UV_NO_CACHE"):
        return None
    named = e.get("UV_CACHE_DIR")
    if named:
        root = Path(named).expanduser().absolute()
    elif e.get("XDG_CACHE_HOME"):
        root = Path(e["XDG_CACHE_HOME"]) / "uv"
    else:
        root = Path(e.get("HOME") or os.path.expanduser("~")) / ".cache" / "uv"
    return root if root.is_dir() else None


class CacheInodes:
    """Files of uv's cache (`<cache>/archive-v*/<id>/<path in site-packages>`) that are the
    inodes a snapshot recorded. `sites`: per root, the site-packages folders below it
    (relative to the root); only files under them are looked up."""

    def __init__(self, cache: Path, sites: dict[int, list[str]]) -> None:
        self.cache = cache
        self.sites = {ri: sorted(rels, key=len, reverse=True) for ri, rels in sites.items()}
        self._by_top: dict[str, list[str]] | None = None  # top-level name -> archive folders holding it
        self._folder: dict[tuple[int, str], str | None] = {}  # a folder's archive (None: none found yet)
        self.found = 0

    def _archives(self) -> dict[str, list[str]]:
        if self._by_top is None:
            by: dict[str, list[str]] = {}
            try:
                buckets = [b for b in os.listdir(self.cache) if b.startswith("archive-v")]
            except OSError:
                buckets = []
            for b in sorted(buckets):
                base = f"{self.cache}/{b}"
                try:
                    ids = os.listdir(base)
                except OSError:
                    continue
                for a in ids:
                    if a.startswith("."):
                        continue
                    try:
                        tops = os.listdir(f"{base}/{a}")
                    except OSError:
                        continue
                    for t in tops:
                        by.setdefault(t, []).append(f"{base}/{a}")
            self._by_top = by
        return self._by_top

    def _site_rel(self, ri: int, folder: str) -> str | None:
        """`folder` (relative to root ri) relative to its site-packages, or None."""
        for site in self.sites.get(ri, ()):
            if folder == site:
                return ""
            if not site:  # the root is site-packages itself (a system interpreter's)
                return folder
            if folder.startswith(site + "/"):
                return folder[len(site) + 1:]
        return None

    def find(self, ri: int, folder: str, name: str, ino: int | None, size: int, mtime_ns: int,
             mode: int) -> str | None:
        """The cache file that is inode `ino`, with this size, mtime and mode, at this place
        of the wheel the file came from; None when uv's cache holds no such file."""
        rel = self._site_rel(ri, folder) if ino else None
        if rel is None or ino is None:  # not under site-packages (a script): uv writes those, links none
            return None
        key = (ri, folder)
        known = self._folder.get(key)
        if known is not None:
            hit = _probe(f"{known}/{name}", ino, size, mtime_ns, mode)
            if hit:
                self.found += 1
                return hit
        top = (rel or name).partition("/")[0]
        for archive in self._archives().get(top, ()):
            if archive == known:
                continue
            path = f"{archive}/{rel}/{name}" if rel else f"{archive}/{name}"
            hit = _probe(path, ino, size, mtime_ns, mode)
            if hit:
                self._folder[key] = f"{archive}/{rel}" if rel else archive
                self.found += 1
                return hit
        return None


def _probe(path: str, ino: int, size: int, mtime_ns: int, mode: int) -> str | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if (st.st_ino == ino and stat.S_ISREG(st.st_mode) and st.st_size == size and st.st_mtime_ns == mtime_ns
            and stat.S_IMODE(st.st_mode) == mode):
        return path
    return None


def cache_inodes(env: Environment, roots: list[Root]) -> CacheInodes | None:
    """uv's cache as a place to take files back from (see `cachelinks`), when there is one;
    `REWHEEL_RESTORE_FROM_UV_CACHE=0` turns it off (the snapshot's own bytes only)."""
    if os.environ.get("REWHEEL_RESTORE_FROM_UV_CACHE", "1") == "0":
        return None
    cache = uv_cache_dir()
    if cache is None:
        return None
    sites: dict[int, list[str]] = {}
    for site in env.site_dirs:
        real = os.path.realpath(site)
        for ri, r in enumerate(roots):
            base = r.path.rstrip("/")
            if r.whole and (real == base or real.startswith(base + "/")):
                sites.setdefault(ri, []).append(real[len(base) + 1:] if real != base else "")
                break
    return CacheInodes(cache, sites) if sites else None
