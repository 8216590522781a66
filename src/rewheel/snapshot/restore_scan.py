"""A restore's comparison of the live environment with a snapshot's manifest.

Owns: `LaneScan` — one lane's state and its walk over the folders it owns (every stat
relative to an open folder; a file the snapshot hard-links found at another inode is known
replaced from the listing alone), the same-bytes proof of files a reinstall or an upgrade
left identical (`proof.SameBytes`), and the folders to build whole. What it finds, folder by
folder, is a `restore_checks.Dir`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Literal

from rewheel.environment import Environment
from rewheel.snapshot.cachelinks import cache_inodes
from rewheel.snapshot.manifest import Entry, Folder, Manifest
from rewheel.snapshot.proof import FolderProof, SameBytes
from rewheel.snapshot.restore_checks import (DIR_FLAGS, EMPTY, Dir, check_tree, owned_now, same_file,
                                             share_folders)
from rewheel.snapshot.store import SnapshotMeta
from rewheel.snapshot.tree import Progress, Root, exclusion, hand_editable, nested_prefix, staging_folder


class LaneScan:
    """One lane of a restore, its first half: the comparison of the live tree with the
    manifest (`scan`), which leaves, per folder that needs anything, a `Dir` saying what.
    Nothing is changed here; `restore_apply.LaneRestore` checks, stages, commits and
    verifies what the scan found."""

    def __init__(self, env: Environment, snap: SnapshotMeta, man: Manifest, roots: list[Root],
                 progress: Progress | None, lane: tuple[int, int] | None = None) -> None:
        self.env, self.snap, self.roots = env, snap, roots
        self.tree = str(snap.path / "tree")  # versions 1 and 2: the snapshot's own copies
        self.progress = progress
        check_tree(snap, man)
        self.man = man
        self.objects = man.uses_objects  # version 3: the store's objects
        # Version 3 records every file's live inode: one uv's cache still holds is put back
        # as it was (see `cachelinks`); None: nothing to look for.
        self.cache = cache_inodes(env, roots) if self.objects else None
        self.from_cache: dict[int, str] = {}  # by id(entry): the cache file the commit links
        self.cache_linked: set[int] = set()  # by id(entry): linked from uv's cache by the commit
        self.folders = man.folders
        # Lane k of n owns its share of the folders; None: this restore owns every folder.
        self.owned = share_folders(man, lane[1])[lane[0]] if lane is not None else None
        home = Path(os.path.realpath(snap.home))  # the store's home, when inside the prefix
        self.skip = {str(home.parent): home.name}
        self.staging: dict[int, str] = {}
        self.n = 0  # staged names
        self.written = 0
        self.others = 0  # sockets, FIFOs, devices in the manifest: not content, not verified
        # Files left in place because their bytes are proven the snapshot's (a reinstall or
        # an upgrade since); None once nothing can be proven here.
        self.same: SameBytes | None = SameBytes(env, snap, man, roots)
        self.same_checked = False
        # `REWHEEL_FAULT_AT=restore-commit:N`: SIGKILL this process once it has put N files in
        # place (crash-safety tests kill at a real point inside the commit).
        fault = os.environ.get("REWHEEL_FAULT_AT", "")
        self.kill_at = int(fault.partition(":")[2]) if fault.startswith("restore-commit:") else -1
        self.excluded = exclusion(man.exclude)
        self.proven = 0
        self.remoded = 0  # proven files of `retimes` whose mode is put back too
        self.unshared = 0  # writes of the same bytes, to break an inode shared with the store (see `scan`)
        self.cached = 0  # writes linked from uv's cache (see `cache_hit`)
        self.todo = 0
        self.dirs: list[Dir] = []  # the folders that need anything, children first
        # What the commit puts in place, by entry: the stored inode it links (checked),
        # or the staged copy / built folder it renames.
        self.links: dict[tuple[int, str], os.stat_result] = {}  # by (root, path)
        self.staged: dict[int, str] = {}

    # Scan ------------------------------------------------------------------------------
    def scan_root(self, ri: int) -> None:
        path = self.roots[ri].path
        try:
            fd = os.open(path, DIR_FLAGS)
        except FileNotFoundError:  # the root itself is gone: everything is missing
            if self.owned is not None and (ri, "") not in self.owned:
                return  # the root's lane builds it all
            d = Dir(ri, "", path, None, None)
            self.dirs.append(d)
            self.add_missing(d, self.folders.get((ri, "")) or EMPTY, set())
            return
        try:
            self.scan(ri, "", path, None, None, fd)
        finally:
            os.close(fd)

    def scan(self, ri: int, rel: str, path: str, own: tuple[Folder, str, int] | None, st: os.stat_result | None,
             fd: int) -> None:
        """Compare folder `rel` (open as fd: every stat is relative to it; `own`: where its
        own entry is, in its parent's columns) with the manifest; keep it if it needs anything."""
        f = self.folders.get((ri, rel)) or EMPTY
        if self.owned is not None and (ri, rel) not in self.owned:
            self.pass_through(ri, rel, path, f, fd)
            return
        find, types, modes, sizes, mtimes, inos, stored = (f.index.get, f.types, f.modes, f.sizes, f.mtimes, f.inos,
                                                           f.stored)
        is_reg, mode_of = stat.S_ISREG, stat.S_IMODE
        writes: list[Entry] = []
        chmods: list[Entry] = []
        retimes: list[Entry] = []
        remodes: set[str] = set()  # paths of retimes whose mode differs too
        extras: list[tuple[str, bool]] = []
        missing: list[Entry] = []
        unshare: list[Entry] = []  # also in writes
        prefix = f"{rel}/" if rel else ""
        skip = self.skip.get(path)
        matched = 0
        proof: FolderProof | None | Literal[False] = None  # None: not looked up yet; False: nothing to prove here
        with os.scandir(fd) as it:
            for de in it:
                name = de.name
                i = find(name)
                if i is None:
                    if name == skip or staging_folder(rel, name, de):
                        continue
                    if self.excluded is not None and ri == 0 and self.excluded(prefix + name):
                        continue  # `[snapshots] exclude`: neither captured nor removed
                    if de.is_dir(follow_symlinks=False):
                        if not nested_prefix(f"{path}/{name}", prefix + name, self.roots[ri].path):
                            extras.append((f"{path}/{name}", True))
                    elif de.is_file(follow_symlinks=False) or de.is_symlink():
                        extras.append((f"{path}/{name}", False))
                    # sockets, FIFOs, devices are not content: neither captured nor removed
                    continue
                matched += 1
                kind = types[i]
                if kind == "f":
                    # A shared file at another inode was replaced: no stat needed to know.
                    ino = inos[i] if stored[i] == "L" else None
                    lst = None
                    # A hand-editable file is never the stored inode (see `is_private`): its
                    # size and mtime say whether it changed, as for a copy.
                    if ino is None or de.inode() == ino or hand_editable(name, sizes[i]):
                        lst = de.stat(follow_symlinks=False)
                        if lst.st_mtime_ns == mtimes[i] and lst.st_size == sizes[i] and is_reg(lst.st_mode):
                            if ino is not None and lst.st_ino == ino and hand_editable(name, sizes[i]):
                                # The snapshot's bytes, but its stored inode (a snapshot taken,
                                # or restored, before `hand_editable` was the rule): an edit in
                                # place would reach the store. A copy of its own instead. (Links
                                # into uv's cache are uv's: a restore in the window leaves them.)
                                unshare.append(f.entry(ri, rel, i, sha=False))
                                writes.append(unshare[-1])
                                continue
                            if mode_of(lst.st_mode) != modes[i]:
                                chmods.append(f.entry(ri, rel, i, sha=False))
                            continue
                    # Only an inode the environment alone holds is left in place: one a staged
                    # swap linked from uv's cache (or any other link) is relinked to the stored
                    # inode, so no restore leaves the environment sharing bytes with uv's cache.
                    if self.same is not None and proof is not False and de.stat(follow_symlinks=False).st_nlink == 1:
                        if proof is None:  # the folder's proof, once, at its first such file
                            proof = self.folder_proof(ri, rel, path)
                        if proof is not False and self.same is not None and self.same.same(
                                proof, name, sizes[i], lambda i=i: f.sha(i), lst, de):  # type: ignore[misc]
                            self.proven += 1
                            pst = de.stat(follow_symlinks=False)  # (cached by the DirEntry)
                            if pst.st_mtime_ns != mtimes[i] and hand_editable(name, sizes[i]):
                                # The snapshot's bytes with the upgrade's mtime: a source whose
                                # restored byte-code records the snapshot's mtime would read as
                                # stale, and the restarted service recompile it in the downtime.
                                # The inode is the environment's alone (one link): its mode and
                                # mtime are put back, and it compares by size and mtime again.
                                retimes.append(f.entry(ri, rel, i, sha=False))
                                if mode_of(pst.st_mode) != modes[i]:
                                    self.remoded += 1
                                    remodes.add(retimes[-1].path)
                                self.same.found.retimed(proof.key + name, mtimes[i])
                            elif mode_of(pst.st_mode) != modes[i]:
                                # Its mtime is the reinstall's, not the manifest's: the check
                                # after the commit compares the mode only.
                                chmods.append(f.entry(ri, rel, i, sha=False)._replace(mtime_ns=pst.st_mtime_ns))
                            continue
                elif kind == "d":
                    if de.is_dir(follow_symlinks=False):
                        sub = os.open(name, DIR_FLAGS, dir_fd=fd)
                        try:
                            self.scan(ri, prefix + name, f"{path}/{name}", (f, rel, i), os.fstat(sub), sub)
                        finally:
                            os.close(sub)
                        continue
                    extras.append((f"{path}/{name}", False))
                    missing.append(f.entry(ri, rel, i))
                    continue
                elif kind == "l":
                    e = f.entry(ri, rel, i)
                    if de.is_symlink() and os.readlink(name, dir_fd=fd) == e.target:
                        continue
                    writes.append(e)
                    continue
                else:
                    self.others += 1
                    continue  # "o": whatever is there now stays
                if de.is_dir(follow_symlinks=False):
                    extras.append((f"{path}/{name}", True))
                writes.append(f.entry(ri, rel, i, sha=False))
        attrs_off = own is not None and st is not None and (
            mode_of(st.st_mode) != own[0].modes[own[2]] or st.st_mtime_ns != own[0].mtimes[own[2]])
        if matched < len(f.names) or writes or chmods or retimes or extras or missing or attrs_off:
            d = Dir(ri, rel, path, own[0].entry(ri, own[1], own[2]) if own is not None else None, st,
                     writes, chmods, retimes, extras, missing, remodes)
            if matched < len(f.names):
                self.add_missing(d, f, set(os.listdir(fd)) if matched else set())
            if d.touched or d.chmods or d.retimes or d.attrs_off:
                self.dirs.append(d)
        self.unshared += len(unshare)

    def folder_proof(self, ri: int, rel: str, path: str) -> FolderProof | Literal[False]:
        """What proves files of folder `rel` the snapshot's (see `SameBytes`), or False when
        nothing can here (and, once nothing can in this tree, no further work for it)."""
        same = self.same
        assert same is not None
        if not self.same_checked:
            self.same_checked = True
            if same.useless:
                self.same = None
                return False
        fp = same.folder(ri, rel, path)
        return False if fp is None else fp

    def pass_through(self, ri: int, rel: str, path: str, f: Folder, fd: int) -> None:
        """A folder another lane compares: only go down to the folders below it (known from
        the manifest). One that is no longer a folder is left to the owner of this one."""
        prefix = f"{rel}/" if rel else ""
        owned = self.owned or set()
        i = f.types.find("d")
        while i >= 0:
            name = f.names[i]
            i_next = f.types.find("d", i + 1)
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError:
                i = i_next
                continue
            try:
                child = prefix + name
                self.scan(ri, child, f"{path}/{name}", (f, rel, i),
                          os.fstat(sub) if (ri, child) in owned else None, sub)
            finally:
                os.close(sub)
            i = i_next

    def add_missing(self, d: Dir, f: Folder, present: set[str]) -> None:
        for i, name in enumerate(f.names):
            if name not in present:
                if f.types[i] == "o":
                    self.others += 1
                else:
                    e = f.entry(d.ri, d.rel, i, sha=False)
                    (d.missing if e.kind == "d" else d.writes).append(e)

    def scan_listed(self, ri: int) -> Dir:
        """A root of which only RECORD-listed files are ours (a system interpreter's
        scripts folder): compare those files one by one."""
        root = self.roots[ri]
        d = Dir(ri, "", root.path, None, None)
        self.dirs.append(d)
        want = {e.path: e for (r, rel), f in self.folders.items() if r == ri for e in f.entries(r, rel)}
        base = root.path.rstrip("/") + "/"
        owned = {p[len(base):] for p in owned_now(self.roots, self.env) if p.startswith(base)}
        for rel, e in want.items():
            p = base + rel
            try:
                lst = os.lstat(p)
            except FileNotFoundError:
                d.writes.append(e)
                continue
            if e.kind == "f" and same_file(e, lst):
                if stat.S_IMODE(lst.st_mode) != e.mode:
                    d.chmods.append(e)
                continue
            if e.kind == "l" and stat.S_ISLNK(lst.st_mode) and os.readlink(p) == e.target:
                continue
            if stat.S_ISDIR(lst.st_mode):
                d.extras.append((p, True))
            d.writes.append(e)
        d.extras.extend((base + rel, False) for rel in owned - want.keys() if os.path.lexists(base + rel))
        return d

    def count(self, ri: int, rel: str) -> int:
        f = self.folders.get((ri, rel)) or EMPTY
        n = len(f.types) - f.types.count("o")
        for i in (i for i, k in enumerate(f.types) if k == "d"):
            n += self.count(ri, f"{rel}/{f.names[i]}" if rel else f.names[i])
        return n

    def path_of(self, d: Dir, e: Entry) -> str:
        if self.roots[d.ri].whole:
            return f"{d.path}/{e.path.rpartition('/')[2]}"
        return f"{d.path.rstrip('/')}/{e.path}"
