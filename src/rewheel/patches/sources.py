"""The other pristine sources: the index (`Fetcher`; `UvIndexFetcher`, a wheel fetched again with
uv and unpacked) and this environment's snapshots (`_SnapshotSource`). uv's cache is `uvcache`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rewheel import proc
from rewheel.environment import Distribution
from rewheel.patches.hashes import _read_small, _sha256
from rewheel.snapshot import Manifest, ManifestDamaged, SnapshotDamaged, Store


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
