"""Same-bytes proof: a live file the restore need not replace.

Owns: `SameBytes` — a file installed since the snapshot (reinstalled at the snapshot's
version, or unchanged by an upgrade) that holds the snapshot's bytes under another inode;
its RECORD row (size, sha256, older than RECORD) or an alias recorded by an earlier restore
proves it — and `FolderProof`, its per-folder view.
"""

from __future__ import annotations

import binascii
import csv
import os
import stat
from collections.abc import Callable
from typing import NamedTuple

from rewheel.environment import Environment
from rewheel.snapshot.manifest import Manifest
from rewheel.snapshot.store import ALIASES, Aliases, Found, SnapshotMeta, read_alias_file
from rewheel.snapshot.tree import Root, TIE_HASH_MAX, hash_file

_S_ISREG = stat.S_ISREG


class SameBytes:
    """Live files a restore may leave in place although they are not the stored inode,
    because their bytes provably equal the snapshot's — without reading them.

    A force-reinstall (`reinstall = "all"`) unpacks fresh copies of every distribution, so
    same-version files come back byte for byte under new inodes and new mtimes; an upgrade
    likewise unpacks the many files a new version did not change (a new torch keeps most of
    its headers and data). Such a file is proven identical when its distribution was
    installed since the snapshot (its `<name>-<version>.dist-info` folder is not in the
    manifest — another version — or is, with a RECORD that is not the captured one), that
    live RECORD lists it with the manifest's sha256 and size, only one such RECORD claims
    it, and it was not modified after that RECORD was written (RECORD is written last). Once proven, the file's (inode, mtime) is kept beside the snapshot
    (`aliases.bin`): after the rollback the old RECORD is back and the proof no longer
    reads off the tree, but the same inode with the same mtime still holds the same bytes,
    for the next restore and for `verify`. Anything in doubt is relinked, as before."""

    def __init__(self, env: Environment, snap: SnapshotMeta, man: Manifest, roots: list[Root]) -> None:
        self.env, self.snap, self.man, self.roots = env, snap, man, roots
        self._live: dict[str, dict[str, tuple[str, str, int]]] | None = None
        self._alias_file: tuple[list[str], Aliases] | None = None
        self.found = Found()  # proven by this restore

    @property
    def useless(self) -> bool:
        """Nothing can be proven: no distribution reinstalled at its version, no aliases."""
        return not self.live() and not self.aliases()

    def aliases(self) -> Aliases:
        if self._alias_file is None:
            self._alias_file = read_alias_file(self.snap.path / ALIASES)
        return self._alias_file[1]

    @property
    def alias_file(self) -> tuple[list[str], Aliases] | None:
        """`aliases.bin` as read (roots, files), or None when nothing read it."""
        return self._alias_file

    def live(self) -> dict[str, dict[str, tuple[str, str, int]]]:
        """Site folder ("/…/site-packages/") -> RECORD path -> (RECORD's hash field, size as
        written, install time), from the RECORDs of distributions installed since the snapshot
        (reinstalled at its version, or at another); paths two of them claim are left out. Rows are kept as RECORD
        writes them (tens of thousands: no per-row conversion); only the files looked up are
        compared."""
        if self._live is not None:
            return self._live
        live: dict[str, dict[str, tuple[str, str, int]]] = {}
        bases = [(ri, os.path.realpath(r.path).rstrip("/") + "/") for ri, r in enumerate(self.roots) if r.whole]
        for site in dict.fromkeys(os.path.realpath(p) for p in self.env.site_dirs):
            hit = next(((ri, site[len(base):].strip("/")) for ri, base in bases if site.startswith(base)), None)
            if hit is None:
                continue
            ri, site_rel = hit
            sf = self.man.folders.get((ri, site_rel))
            try:
                names = os.listdir(site) if sf is not None else []
            except OSError:
                continue
            index: dict[str, tuple[str, str, int]] = {}
            claimed: set[str] = set()
            for name in names:
                if not name.endswith(".dist-info") or sf is None:
                    continue
                i = sf.index.get(name)
                df = self.man.folders.get((ri, f"{site_rel}/{name}" if site_rel else name))
                j = df.index.get("RECORD") if df is not None else None
                # A dist-info the snapshot lacks is a distribution installed at another
                # version since: its unchanged files carry the snapshot's hash too.
                if i is not None and (sf.types[i] != "d" or df is None or j is None or df.types[j] != "f"):
                    continue
                record = f"{site}/{name}/RECORD"
                try:
                    st = os.lstat(record)
                    if (i is not None and df is not None and j is not None
                            and st.st_size == df.sizes[j] and st.st_mtime_ns == df.mtimes[j]):
                        continue  # the captured RECORD: not reinstalled
                    with open(record, encoding="utf-8", errors="replace", newline="") as fh:
                        lines = fh.read().splitlines()
                except OSError:
                    continue
                t = st.st_mtime_ns
                for line in lines:
                    # Plain rows split from the right (a path may hold commas only when quoted).
                    if '"' in line:
                        try:
                            row = next(csv.reader([line]))
                        except (csv.Error, StopIteration):
                            continue
                    else:
                        row = line.rsplit(",", 2)
                    if len(row) != 3 or not row[1].startswith("sha256="):
                        continue
                    rel = row[0]  # `../../bin/x` and other odd spellings never match a lookup
                    if rel in index:
                        claimed.add(rel)
                    index[rel] = (row[1], row[2], t)
            for rel in claimed:
                del index[rel]
            if index:
                live[site.rstrip("/") + "/"] = index
        self._live = live
        return live

    def folder(self, ri: int, rel: str, path: str) -> FolderProof | None:
        """What the files directly in folder `rel` (at `path`) are looked up by; None when
        none of them can be proven (no reinstalled RECORD covers it, no aliases). Once per
        folder, so the per-file work is two dict lookups."""
        rows: dict[str, tuple[str, str, int]] = {}
        spelled = ""
        p = path.rstrip("/") + "/"
        for site, index in self.live().items():
            if p.startswith(site):
                rows, spelled = index, p[len(site):]
                break
        aliases = self.aliases()
        if not rows and not aliases:
            return None
        return FolderProof(rows, spelled, f"{ri}/{rel}/" if rel else f"{ri}/", aliases, aliases.at(), p)

    def same(self, fp: FolderProof, name: str, size: int, sha: Callable[[], str | None],
             st: os.stat_result | None, de: os.DirEntry[str] | None = None) -> bool:
        """Whether the live file `name` in the folder `fp` describes (of `size` bytes in the
        manifest, sha256 from `sha()`; its lstat `st`, or else taken from `de` when needed)
        holds the snapshot's bytes. Cheapest first: most files a restore asks about are
        neither aliased nor reinstalled. (Hot: tens of thousands of calls after a reinstall.)"""
        # (The alias is compared in its columns: no row is built for it.)
        ai = fp.alias_at.get(fp.key + name) if fp.alias_at else None
        rec = fp.rows.get(fp.spelled + name) if fp.rows else None
        if ai is None and rec is None:
            return False
        if st is None:
            if de is None:
                return False
            st = de.stat(follow_symlinks=False)
        if not _S_ISREG(st.st_mode) or st.st_size != size:
            return False
        if ai is not None and fp.aliases.inos[ai] == st.st_ino and fp.aliases.mtimes[ai] == st.st_mtime_ns:
            return True
        if rec is None or rec[1] != str(size) or st.st_mtime_ns > rec[2]:
            return False
        want = sha()
        if not isinstance(want, str) or len(want) != 64 or rec[0] != _record_hash(want):
            return False
        # Written in the same clock tick as RECORD: not provably older, so proven by its bytes
        # where that is cheap (as a snapshot does), else relinked.
        if st.st_mtime_ns == rec[2] and (size > TIE_HASH_MAX or hash_file(fp.path + name) != want):
            return False
        self.found.add(fp.key + name, st.st_ino, st.st_mtime_ns, size, want)
        return True


class FolderProof(NamedTuple):
    """`SameBytes` for one folder: its files' RECORD rows (by the path RECORD spells, which
    starts with `spelled`), their alias keys (`key` + name), and the folder's path + "/"."""
    rows: dict[str, tuple[str, str, int]]
    spelled: str
    key: str
    aliases: Aliases
    alias_at: dict[str, int]  # aliases' row by key
    path: str


def _record_hash(sha_hex: str) -> str:
    """A sha256 as RECORD writes it: `sha256=` and urlsafe base64 without padding."""
    try:
        raw = bytes.fromhex(sha_hex)
    except ValueError:
        return ""
    b64 = binascii.b2a_base64(raw, newline=False).rstrip(b"=").replace(b"+", b"-").replace(b"/", b"_")
    return "sha256=" + b64.decode("ascii")
