"""Restoring a snapshot byte for byte, and verifying an environment against one.

Owns: `restore_snapshot` (compare folder by folder, check everything, stage, commit,
sync, verify; `_Restore` does one lane's share), `RestoreResult`, `verify`,
`remove_displaced` / `discard_displaced` (the store's trash), and the checks that refuse a
damaged snapshot before anything changes.
The second lane's process is `lanes`; the same-bytes proof is `proof`.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rewheel import proc
from rewheel.environment import Environment
from rewheel.errors import RestoreError, RewheelError, SnapshotDamaged
from rewheel.snapshot.capture import clone_file, copy_hashed
from rewheel.snapshot.lanes import LaneWork, Peer, auto_lanes
from rewheel.snapshot.manifest import Entry, Folder, Manifest, ManifestDamaged, bad_entry, match_roots
from rewheel.snapshot.proof import FolderProof, SameBytes
from rewheel.snapshot.store import Found, SnapshotMeta, save_aliases
from rewheel.snapshot.tree import (Progress, Root, STAGING_PREFIX, exclusion, hand_editable, kind_of, nested_prefix,
                                   safe_rel, scope_of, walk)

# Under the store's home: what restores moved out of environments, while a detached `rm`
# deletes it (`discard_displaced`); a folder older than this is left from one that was stopped.
TRASH = "trash"
TRASH_STALE_S = 3600.0


@dataclass
class RestoreResult:
    snapshot_id: str
    written: int
    deleted: int
    chmodded: int
    unchanged: int
    verified: int
    seconds: float
    cleanup_restored: int = 0
    folders_rebuilt: int = 0  # missing folders built whole from the store and renamed in
    displaced: list[str] = field(default_factory=list)  # moved out, not yet deleted
    removal_seconds: float = 0.0  # deleting what was moved out (after `seconds`, if deferred)
    phases: dict[str, float] = field(default_factory=dict)  # seconds: load, scan, stage, commit, verify, finish
    lanes: int = 1  # processes that shared the work
    # Files left in place: not the stored inode, but proven to hold its bytes (a reinstall
    # or an upgrade since unpacked the same bytes anew); counted in `unchanged`.
    proven_same: int = 0
    # Hand-editable files that held the snapshot's bytes but were its stored inode (linked by
    # a rewheel before `hand_editable`): given a copy of their own, same bytes.
    unshared: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot_id, "written": self.written, "deleted": self.deleted,
                "chmodded": self.chmodded, "unchanged": self.unchanged, "verified": self.verified,
                "seconds": round(self.seconds, 3), "cleanup_restored": self.cleanup_restored,
                "folders_rebuilt": self.folders_rebuilt, "removal_seconds": round(self.removal_seconds, 3),
                "lanes": self.lanes, "proven_same": self.proven_same, "unshared": self.unshared}


def _raise_if_problems(env: Environment, snap: SnapshotMeta, problems: list[str]) -> None:
    if problems:
        raise RestoreError(
            f"environment {env.prefix} does not match snapshot {snap.id} after restore: "
            + "; ".join(problems[:10]) + (f" (+{len(problems) - 10} more)" if len(problems) > 10 else ""),
            hint=f"run `rewheel rollback --python {env.python} {snap.id} --yes` again; if it keeps failing, "
                 "recreate the environment by hand")


def _entry_problem(e: Entry, st: os.stat_result, path: str) -> str | None:
    """How a live entry differs from its manifest entry, or None when it matches."""
    kind = kind_of(st.st_mode)
    if kind != e.kind:
        return f"type differs: {e.path}"
    if kind == "f" and not _same_file(e, st):
        return f"content differs: {e.path}"
    if kind in ("f", "d") and stat.S_IMODE(st.st_mode) != e.mode:
        return f"mode differs: {e.path} ({oct(stat.S_IMODE(st.st_mode))} vs {oct(e.mode)})"
    if kind == "l" and os.readlink(path) != e.target:
        return f"symlink target differs: {e.path}"
    return None


def _owned_now(roots: list[Root], env: Environment) -> set[str]:
    if all(r.whole for r in roots):
        return set()
    return {e.path for d in env.distributions() for e in d.record}


def _private(e: Entry) -> bool:
    """A file the restore copies (or reflinks) even when the snapshot shares it by a hard
    link (one taken before `hand_editable` was the rule): the environment's copy of a file a
    person may edit never is the stored inode."""
    return e.kind == "f" and hand_editable(e.path.rpartition("/")[2], e.size)


def _same_file(e: Entry, st: os.stat_result) -> bool:
    return (stat.S_ISREG(st.st_mode) and st.st_size == e.size and st.st_mtime_ns == e.mtime_ns)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NO_LINK = (errno.EXDEV, errno.EMLINK, errno.EPERM, errno.ENOTSUP)  # link(2) cannot: copy instead


def _check_fields(snap: SnapshotMeta, e: Entry) -> None:
    """The fields a restore acts on have the types it needs (checked for the entries it
    acts on only, before it acts)."""
    if (type(e.mode) is not int or type(e.mtime_ns) is not int or (e.kind == "f" and type(e.size) is not int)
            or (e.kind == "l" and (type(e.target) is not str or not e.target or "\x00" in e.target or len(e.target) > 4095))
            or e.kind not in ("f", "d", "l") or not 0 <= e.mode <= 0o7777):
        raise bad_entry(snap, e)
    if e.kind == "f" and e.mode & (stat.S_ISUID | stat.S_ISGID):
        # No wheel installs a set-id file: a manifest asking for one is not applied as root.
        raise SnapshotDamaged(f"snapshot {snap.id}: {e.path} would be restored set-user/group-id (mode {e.mode:o})",
                              hint="no installer makes such a file; the manifest was tampered with. "
                                   "Restore another snapshot")


def _check_stored(snap: SnapshotMeta, tree: str, e: Entry) -> os.stat_result:
    p = f"{tree}/{e.root}/{e.path}"  # hot: plain concatenation, not os.path.join
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        raise SnapshotDamaged(f"snapshot {snap.id}: stored file {e.path} is missing ({p})",
                              hint="restore another snapshot (`rewheel history TARGET` lists them)") from None
    if not stat.S_ISREG(st.st_mode) or st.st_size != e.size or st.st_mtime_ns != e.mtime_ns:
        raise SnapshotDamaged(
            f"snapshot {snap.id}: stored file {e.path} was changed after the snapshot "
            f"(size {st.st_size} vs {e.size}, mtime differs: {st.st_mtime_ns != e.mtime_ns})",
            hint="the file was edited in place or the store was tampered with; restore another snapshot")
    return st


def _remove_stale_staging(roots: list[Root]) -> None:
    """A restore killed mid-way leaves its staging folder at a root; the next restore (which
    finishes the job) removes it, so no trace of rewheel stays in the environment."""
    for r in roots:
        try:
            names = os.listdir(r.path)
        except OSError:
            continue
        for name in names:
            if name.startswith(STAGING_PREFIX):
                shutil.rmtree(os.path.join(r.path, name), ignore_errors=True)


def _check_tree(snap: SnapshotMeta, man: Manifest) -> None:
    """What a restore needs of the manifest's folders before it walks them.

    It only ever acts on paths joined from the folders' names, walking down from a root,
    so a folder is safe when its names are plain, unique names and it is itself a folder
    entry of its parent — `../../etc/evil` has no such chain. That costs a few operations
    per folder, none per entry; the fields of each entry the restore acts on are checked
    when it does (`_check_fields`)."""
    for (ri, rel), f in man.folders.items():
        prefix = f"{rel}/" if rel else ""
        try:
            if not man.roots[ri].whole:  # RECORD-listed files only: paths, checked one by one
                ok = all(safe_rel(prefix + n) for n in f.names) and not f.types.strip("fl")
            else:
                names = "\n".join(f.names)
                index = f.index
                ok = not ("/" in names or "\x00" in names or "" in index or "." in index or ".." in index
                          or len(index) != len(f.names))
                if ok and rel:
                    parent, _, name = rel.rpartition("/")
                    pf = man.folders.get((ri, parent))
                    i = pf.index.get(name) if pf is not None else None
                    ok = i is not None and pf is not None and pf.types[i] == "d"
        except TypeError:  # a name that is not a string
            ok = False
        if not ok:
            raise bad_entry(snap, f"folder {prefix or '.'} of root {ri} ({', '.join(map(str, f.names[:5]))})")


def share_folders(man: Manifest, n: int) -> list[set[tuple[int, str]]]:
    """The manifest's folders shared out between n lanes, balanced by entries: the same
    shares in every lane, since all read the same manifest."""
    shares: list[set[tuple[int, str]]] = [set() for _ in range(n)]
    load = [0] * n
    for key, f in man.folders.items():
        j = load.index(min(load))
        load[j] += 1 + len(f.names)
        shares[j].add(key)
    return shares


@dataclass(eq=False)
class _Dir:
    """One live folder compared with the manifest: what it needs."""
    ri: int
    rel: str  # "" for a root
    path: str
    entry: Entry | None  # the folder's own manifest entry (None for a root)
    st: os.stat_result | None  # its lstat (None for a root)
    writes: list[Entry] = field(default_factory=list)  # files and symlinks to (re)place
    chmods: list[Entry] = field(default_factory=list)
    # Proven files whose mode and mtime are set to the manifest's (see `scan`).
    retimes: list[Entry] = field(default_factory=list)
    extras: list[tuple[str, bool]] = field(default_factory=list)  # (path, is a folder)
    missing: list[Entry] = field(default_factory=list)  # folders to build whole

    @property
    def touched(self) -> bool:
        return bool(self.writes or self.extras or self.missing)

    @property
    def attrs_off(self) -> bool:
        e, st = self.entry, self.st
        return e is not None and st is not None and (stat.S_IMODE(st.st_mode) != e.mode or st.st_mtime_ns != e.mtime_ns)


_EMPTY = Folder([], "", [], [], [], "", [], None)


class _Restore:
    """One restore: scan (compare the live tree with the manifest), check and stage, commit,
    verify. Nothing in the environment changes before the commit, and the commit starts
    only once every stored file it will use has been checked."""

    def __init__(self, env: Environment, snap: SnapshotMeta, man: Manifest, roots: list[Root],
                 progress: Progress | None, lane: tuple[int, int] | None = None) -> None:
        self.env, self.snap, self.roots = env, snap, roots
        self.tree = str(snap.path / "tree")
        self.progress = progress
        _check_tree(snap, man)
        self.man = man
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
        self.todo = 0
        self.dirs: list[_Dir] = []  # the folders that need anything, children first
        # What the commit puts in place, by entry: the stored inode it links (checked),
        # or the staged copy / built folder it renames.
        self.links: dict[tuple[int, str], os.stat_result] = {}  # by (root, path)
        self.staged: dict[int, str] = {}

    # Scan ------------------------------------------------------------------------------
    def scan_root(self, ri: int) -> None:
        path = self.roots[ri].path
        try:
            fd = os.open(path, _DIR_FLAGS)
        except FileNotFoundError:  # the root itself is gone: everything is missing
            if self.owned is not None and (ri, "") not in self.owned:
                return  # the root's lane builds it all
            d = _Dir(ri, "", path, None, None)
            self.dirs.append(d)
            self.add_missing(d, self.folders.get((ri, "")) or _EMPTY, set())
            return
        try:
            self.scan(ri, "", path, None, None, fd)
        finally:
            os.close(fd)

    def scan(self, ri: int, rel: str, path: str, own: tuple[Folder, str, int] | None, st: os.stat_result | None,
             fd: int) -> None:
        """Compare folder `rel` (open as fd: every stat is relative to it; `own`: where its
        own entry is, in its parent's columns) with the manifest; keep it if it needs anything."""
        f = self.folders.get((ri, rel)) or _EMPTY
        if self.owned is not None and (ri, rel) not in self.owned:
            self.pass_through(ri, rel, path, f, fd)
            return
        find, types, modes, sizes, mtimes, inos = f.index.get, f.types, f.modes, f.sizes, f.mtimes, f.inos
        is_reg, mode_of = stat.S_ISREG, stat.S_IMODE
        writes: list[Entry] = []
        chmods: list[Entry] = []
        retimes: list[Entry] = []
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
                    if name == skip or (not rel and name.startswith(STAGING_PREFIX)):
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
                    ino = inos[i]
                    lst = None
                    # A hand-editable file is never the stored inode (see `_private`): its
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
                                self.remoded += mode_of(pst.st_mode) != modes[i]
                                self.same.found.retimed(proof.key + name, mtimes[i])
                            elif mode_of(pst.st_mode) != modes[i]:
                                # Its mtime is the reinstall's, not the manifest's: the check
                                # after the commit compares the mode only.
                                chmods.append(f.entry(ri, rel, i, sha=False)._replace(mtime_ns=pst.st_mtime_ns))
                            continue
                elif kind == "d":
                    if de.is_dir(follow_symlinks=False):
                        sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
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
            d = _Dir(ri, rel, path, own[0].entry(ri, own[1], own[2]) if own is not None else None, st,
                     writes, chmods, retimes, extras, missing)
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
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
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

    def add_missing(self, d: _Dir, f: Folder, present: set[str]) -> None:
        for i, name in enumerate(f.names):
            if name not in present:
                if f.types[i] == "o":
                    self.others += 1
                else:
                    e = f.entry(d.ri, d.rel, i, sha=False)
                    (d.missing if e.kind == "d" else d.writes).append(e)

    def scan_listed(self, ri: int) -> _Dir:
        """A root of which only RECORD-listed files are ours (a system interpreter's
        scripts folder): compare those files one by one."""
        root = self.roots[ri]
        d = _Dir(ri, "", root.path, None, None)
        self.dirs.append(d)
        want = {e.path: e for (r, rel), f in self.folders.items() if r == ri for e in f.entries(r, rel)}
        base = root.path.rstrip("/") + "/"
        owned = {p[len(base):] for p in _owned_now(self.roots, self.env) if p.startswith(base)}
        for rel, e in want.items():
            p = base + rel
            try:
                lst = os.lstat(p)
            except FileNotFoundError:
                d.writes.append(e)
                continue
            if e.kind == "f" and _same_file(e, lst):
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
        f = self.folders.get((ri, rel)) or _EMPTY
        n = len(f.types) - f.types.count("o")
        for i in (i for i, k in enumerate(f.types) if k == "d"):
            n += self.count(ri, f"{rel}/{f.names[i]}" if rel else f.names[i])
        return n

    def path_of(self, d: _Dir, e: Entry) -> str:
        if self.roots[d.ri].whole:
            return f"{d.path}/{e.path.rpartition('/')[2]}"
        return f"{d.path.rstrip('/')}/{e.path}"

    # Check and stage ---------------------------------------------------------------------
    def stage_path(self, ri: int) -> str:
        s = self.staging.get(ri)
        if s is None:
            root = self.roots[ri].path
            os.makedirs(root, exist_ok=True)
            s = self.staging[ri] = os.path.join(root, STAGING_PREFIX + secrets.token_hex(4))
            os.mkdir(s, 0o700)
        self.n += 1
        return f"{s}/{self.n}"

    def discard_staging(self) -> None:
        """A restore that stops: what it staged (and anything it moved out) goes."""
        for s in self.staging.values():
            shutil.rmtree(s, ignore_errors=True)

    def check_links(self, d: _Dir) -> None:
        """Before the commit: every stored inode folder d's files will be linked to exists
        and still has the manifest's size and mtime (one fstatat each, in its folder)."""
        links = [e for e in d.writes if e.kind == "f" and e.stored == "link" and not _private(e)]
        if not links:
            return
        try:
            sfd = os.open(self.stored_folder(d), _DIR_FLAGS)
        except OSError:
            _check_stored(self.snap, self.tree, links[0])  # raises, naming the file
            raise
        try:
            for e in links:
                try:
                    st = os.lstat(e.path.rpartition("/")[2], dir_fd=sfd)
                except FileNotFoundError:
                    st = None
                if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != e.size or st.st_mtime_ns != e.mtime_ns:
                    st = _check_stored(self.snap, self.tree, e)  # raises, naming the file
                self.links[(e.root, e.path)] = st
        finally:
            os.close(sfd)

    def stored_folder(self, d: _Dir) -> str:
        return f"{self.tree}/{d.ri}/{d.rel}" if d.rel else f"{self.tree}/{d.ri}"

    def place(self, e: Entry, dst: str) -> None:
        """Put entry e (a file or symlink) at dst, a path that is free: a link to the
        stored inode (checked against the manifest first) or a checked copy."""
        if e.kind == "l":
            assert e.target is not None  # a manifest symlink always has its target
            os.symlink(e.target, dst)
        else:
            sst = self.links.get((e.root, e.path))
            if e.stored == "link" and not _private(e):
                if sst is None:
                    sst = self.links[(e.root, e.path)] = _check_stored(self.snap, self.tree, e)
                try:
                    os.link(f"{self.tree}/{e.root}/{e.path}", dst)
                except OSError as exc:
                    if exc.errno not in _NO_LINK:
                        raise
                    del self.links[(e.root, e.path)]  # another filesystem now: copy instead
                    sst = None
                    self.copy(e, dst)
            else:
                self.copy(e, dst)
            # A link shares the stored inode: its mode and mtime are already right unless
            # someone changed them; only then pay for chmod and utime.
            if sst is None or stat.S_IMODE(sst.st_mode) != e.mode:
                os.chmod(dst, e.mode)
            if sst is None or sst.st_mtime_ns != e.mtime_ns:
                os.utime(dst, ns=(e.mtime_ns, e.mtime_ns))
        self.count_written()

    def count_written(self) -> None:
        self.written += 1
        if self.written == self.kill_at:  # testing hook: a power cut (or a signal) halfway through the commit
            from rewheel.journal import fault_signal

            os.kill(os.getpid(), fault_signal())
        if self.progress and self.written % 500 == 0:
            # In two lanes, this process counts its own half (the other prints nothing).
            self.progress("restore" if self.owned is None else "restore (lane 1 of 2)", self.written, self.todo)

    def copy(self, e: Entry, dst: str) -> None:
        src = f"{self.tree}/{e.root}/{e.path}"
        if e.stored == "reflink":
            # A clone of the stored clone: no byte read or written. An edit in place of the
            # live file could not reach the stored one (copy-on-write); it is checked by
            # size and mtime, as a hard-linked one is.
            _check_stored(self.snap, self.tree, e)
            if clone_file(src, dst):
                return
        if e.stored == "link":
            _check_stored(self.snap, self.tree, e)
        try:
            sha, _ = copy_hashed(src, dst)
        except FileNotFoundError:
            _check_stored(self.snap, self.tree, e)  # the stored copy is gone: raises, naming it
            raise
        if e.sha256 and sha != e.sha256:
            raise SnapshotDamaged(
                f"snapshot {self.snap.id}: stored file {e.path} does not match its recorded sha256 "
                f"(expected {e.sha256[:12]}…, found {sha[:12]}…)",
                hint="the store was tampered with or damaged; restore another snapshot")

    def build(self, ri: int, rel: str, e: Entry, dst: str) -> None:
        """Build folder `rel` whole at dst, exactly as the manifest has it."""
        os.mkdir(dst, 0o700)
        f = self.folders.get((ri, rel)) or _EMPTY
        for i, name in enumerate(f.names):
            if f.types[i] == "o":
                self.others += 1
                continue
            k = f.entry(ri, rel, i, sha=False)
            _check_fields(self.snap, k)
            if k.kind == "d":
                self.build(ri, k.path, k, f"{dst}/{name}")
            else:
                self.place(k, f"{dst}/{name}")
        os.chmod(dst, e.mode)
        os.utime(dst, ns=(e.mtime_ns, e.mtime_ns))  # last: any entry added below would change it

    def stage(self) -> None:
        for d in self.dirs:
            self.todo += len(d.writes) + sum(1 + self.count(d.ri, e.path) for e in d.missing)
        for d in self.dirs:
            for e in d.writes:
                _check_fields(self.snap, e)
            for e in d.chmods + d.retimes:
                _check_fields(self.snap, e)
            if d.entry is not None:
                _check_fields(self.snap, d.entry)
            if self.roots[d.ri].whole:
                self.check_links(d)
            for e in d.writes:
                if e.kind == "f" and (e.stored != "link" or not self.roots[d.ri].whole or _private(e)):
                    # A copy is staged (its sha256 checked on the way) and renamed in.
                    tmp = self.stage_path(d.ri)
                    self.place(e, tmp)
                    self.staged[id(e)] = tmp
            for e in d.missing:
                tmp = self.stage_path(d.ri)
                self.build(d.ri, e.path, e, tmp)
                self.staged[id(e)] = tmp

    # Commit ----------------------------------------------------------------------------
    def commit(self) -> None:
        for d in self.dirs:
            if self.roots[d.ri].whole:
                self.commit_folder(d)
            else:
                self.commit_listed(d)

    def commit_folder(self, d: _Dir) -> None:
        """Apply folder d's changes, every call relative to the open folder (and to the
        open stored folder for links): no path is resolved again per file."""
        e = d.entry
        attrs_off = d.attrs_off
        try:
            fd = os.open(d.path, _DIR_FLAGS)
        except FileNotFoundError:
            if e is not None:
                raise
            os.makedirs(d.path)  # the root itself was gone
            fd = os.open(d.path, _DIR_FLAGS)
        sfd = -1
        try:
            for p, is_dir in d.extras:
                name = p.rpartition("/")[2]
                if is_dir:
                    # One rename out of the environment; deleted once it is back.
                    try:
                        os.rename(name, self.stage_path(d.ri), src_dir_fd=fd)
                    except OSError as exc:
                        if exc.errno != errno.EXDEV:  # a mount point inside the prefix
                            raise
                        shutil.rmtree(p)
                else:
                    try:
                        os.unlink(name, dir_fd=fd)
                    except FileNotFoundError:
                        pass
            for k in d.missing:
                os.rename(self.staged[id(k)], k.path.rpartition("/")[2], dst_dir_fd=fd)
            for k in d.writes:
                name = k.path.rpartition("/")[2]
                tmp = self.staged.get(id(k))
                if tmp is not None:
                    os.replace(tmp, name, dst_dir_fd=fd)
                    continue
                # Replaced in place: an unlink and a link cost less than staging a link and
                # renaming it (the service is stopped; a restore cut short here is finished
                # by the next).
                try:
                    os.unlink(name, dir_fd=fd)
                except FileNotFoundError:
                    pass
                if k.kind == "l":
                    assert k.target is not None
                    os.symlink(k.target, name, dir_fd=fd)
                    self.count_written()
                    continue
                if sfd < 0:
                    sfd = os.open(self.stored_folder(d), _DIR_FLAGS)
                sst = self.links[(k.root, k.path)]
                try:
                    os.link(name, name, src_dir_fd=sfd, dst_dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in _NO_LINK:
                        raise
                    del self.links[(k.root, k.path)]
                    self.place(k, f"{d.path}/{name}")  # copies
                    continue
                if stat.S_IMODE(sst.st_mode) != k.mode:
                    os.chmod(name, k.mode, dir_fd=fd)
                if sst.st_mtime_ns != k.mtime_ns:
                    os.utime(name, ns=(k.mtime_ns, k.mtime_ns), dir_fd=fd)
                self.count_written()
            for k in d.chmods:
                os.chmod(k.path.rpartition("/")[2], k.mode, dir_fd=fd)
            for k in d.retimes:
                os.chmod(k.path.rpartition("/")[2], k.mode, dir_fd=fd)
                os.utime(k.path.rpartition("/")[2], ns=(k.mtime_ns, k.mtime_ns), dir_fd=fd)
            # The folder itself last: every change above altered its mtime.
            if e is not None and d.st is not None:
                if stat.S_IMODE(d.st.st_mode) != e.mode:
                    os.chmod(fd, e.mode)
                if d.touched or attrs_off:
                    os.utime(fd, ns=(e.mtime_ns, e.mtime_ns))
        finally:
            os.close(fd)
            if sfd >= 0:
                os.close(sfd)

    def commit_listed(self, d: _Dir) -> None:
        for p, is_dir in d.extras:
            if is_dir:
                os.rename(p, self.stage_path(d.ri))
            else:
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        for e in d.writes:
            p = self.path_of(d, e)
            tmp = self.staged.get(id(e))
            if tmp is None:  # a symlink
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
                os.makedirs(os.path.dirname(p), exist_ok=True)
                self.place(e, p)
                continue
            try:
                os.replace(tmp, p)
            except FileNotFoundError:  # the file's folder may be gone
                os.makedirs(os.path.dirname(p), exist_ok=True)
                os.replace(tmp, p)
        for e in d.chmods:
            os.chmod(self.path_of(d, e), e.mode)
        for e in d.retimes:
            os.chmod(self.path_of(d, e), e.mode)
            os.utime(self.path_of(d, e), ns=(e.mtime_ns, e.mtime_ns))

    # Verify ----------------------------------------------------------------------------
    def verify(self) -> list[str]:
        """What differs from the manifest in the folders this restore changed (nothing, when
        it worked): each holds exactly the manifest's names, with the manifest's mode and
        mtime (folders it built, all the way down); copies, symlinks and re-moded files are
        stat'ed again. A re-linked file needs no second look: link(2) made its name the
        stored inode whose size and mtime were checked just before, and a copy had its
        sha256 checked while it was made."""
        problems: list[str] = []
        for d in self.dirs:
            for e in d.writes + d.chmods + d.retimes:
                if (e.root, e.path) in self.links and self.roots[d.ri].whole:
                    continue
                p = self.path_of(d, e)
                try:
                    st = os.lstat(p)
                except FileNotFoundError:
                    problems.append(f"missing: {e.path}")
                    continue
                problem = _entry_problem(e, st, p)
                if problem:
                    problems.append(problem)
            if not self.roots[d.ri].whole:
                problems.extend(f"extra: {p}" for p, _ in d.extras if os.path.lexists(p))
            elif d.touched:
                self.check_folder(d.ri, d.rel, d.path, d.entry, problems, deep=False)
                for e in d.missing:
                    self.check_folder(d.ri, e.path, self.path_of(d, e), e, problems, deep=True)
            elif d.attrs_off and d.entry is not None:
                # Only its mode or mtime was reset (a reinstall touches every folder it writes
                # into): its names were compared by the scan and the commit changed none.
                try:
                    st = os.lstat(d.path)
                except FileNotFoundError:
                    problems.append(f"missing: {d.rel}")
                    continue
                if not stat.S_ISDIR(st.st_mode) or stat.S_IMODE(st.st_mode) != d.entry.mode \
                        or st.st_mtime_ns != d.entry.mtime_ns:
                    problems.append(f"folder mode or mtime differs: {d.rel}")
        return problems

    def summary(self) -> dict[str, Any]:
        """What this lane did, for the lane that reports the restore."""
        return {"written": self.written - self.unshared, "unshared": self.unshared,
                "deleted": sum(len(d.extras) for d in self.dirs),
                "chmodded": sum(len(d.chmods) for d in self.dirs) + self.remoded,
                "folders_rebuilt": sum(len(d.missing) for d in self.dirs), "others": self.others,
                "displaced": self.displaced(), "proven": self.proven}

    def displaced(self) -> list[str]:
        """The staging folders holding what the commit moved out. One left empty (it only
        staged copies, all renamed in) is removed here: it displaced nothing, and a restore
        that only gave files a copy of their own must read as one that changed no byte."""
        left = []
        for s in self.staging.values():
            try:
                os.rmdir(s)
            except OSError:  # not empty (or gone): what was moved out, for the caller to delete
                if os.path.lexists(s):
                    left.append(s)
        return left

    def proofs(self) -> tuple[list[Any], ...]:
        """The files this lane proved hold the snapshot's bytes (`Found`'s columns)."""
        return (self.same.found if self.same is not None else Found()).columns()

    def check_folder(self, ri: int, rel: str, path: str, e: Entry | None, problems: list[str],
                     deep: bool) -> None:
        if e is not None:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                problems.append(f"missing: {rel}")
                return
            if not stat.S_ISDIR(st.st_mode):
                problems.append(f"type differs: {rel}")
                return
            if stat.S_IMODE(st.st_mode) != e.mode or st.st_mtime_ns != e.mtime_ns:
                problems.append(f"folder mode or mtime differs: {rel}")
        f = self.folders.get((ri, rel)) or _EMPTY
        prefix = f"{rel}/" if rel else ""
        try:
            live = set(os.listdir(path))
        except FileNotFoundError:
            live = set()
        # Sets, compared in C: this runs for every folder the commit touched.
        if "o" in f.types:  # sockets and the like: neither required nor extra
            others = {n for n, k in zip(f.names, f.types, strict=True) if k == "o"}
            want = set(f.names) - others
            live -= others
        else:
            want = set(f.names)
        extra = live - want
        extra.discard(self.skip.get(path))
        for n in sorted(extra):  # none, normally: only a socket or FIFO, or a nested env, may stay
            kind = kind_of(os.lstat(f"{path}/{n}").st_mode)
            if (not n.startswith(STAGING_PREFIX) and kind != "o"
                    and not (kind == "d" and nested_prefix(f"{path}/{n}", prefix + n, self.roots[ri].path))
                    and not (self.excluded is not None and ri == 0 and self.excluded(prefix + n))):
                problems.append(f"extra: {prefix}{n}")
        problems.extend(f"missing: {prefix}{n}" for n in sorted(want - live))
        if deep:
            for i in (i for i, k in enumerate(f.types) if k == "d"):
                name = f.names[i]
                self.check_folder(ri, prefix + name, f"{path}/{name}", f.entry(ri, rel, i), problems, deep)


def restore_snapshot(env: Environment, snap: SnapshotMeta, *, progress: Progress | None = None,
                     full_verify: bool = False, defer_removal: bool = False,
                     lanes: int | None = None) -> RestoreResult:
    """Make the environment's files exactly the snapshot's, then verify. Offline; no uv.

    Cost: one listing of the environment, a stat of each file that may be unchanged (a
    shared file found at another inode needs none), and work in proportion to what
    changed: a link and an unlink per replaced file. Folders that must go (a failed
    build's new subpackages and dist-info) leave in one rename each and are deleted after
    the environment is back: in the background, from the store's trash (`discard_displaced`),
    or by the caller, once it has restarted the service, with `defer_removal=True`
    (`RestoreResult.displaced`, `remove_displaced`).

    With `lanes=2` (the default on two or more CPUs, for a snapshot of LANES_MIN_FILES files
    or more) the folders are shared out between this process and a forked one, which
    compare, check, commit and verify their own folders at the same time: the work is
    system calls, and a second process makes them on a second CPU (threads would queue on
    the GIL between calls). Both lanes have checked everything they will use before either
    changes anything; a lane that fails before the commit stops both.
    `full_verify=True` walks the whole environment again after the commit.
    """
    t0 = time.perf_counter()
    phases: dict[str, float] = {}

    def mark(name: str) -> None:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0 - sum(phases.values())

    n = auto_lanes(snap) if lanes is None else max(1, min(2, lanes))
    # Tens of thousands of names, numbers, entries and stat results, none of them in a
    # cycle: the cyclic collector would only walk them again and again.
    with _gc_paused():
        live_roots = scope_of(env)
        _remove_stale_staging(live_roots)
        # The other lane is forked before the manifest is read: each reads its own copy
        # (in parallel), so neither pays for copy-on-write pages of the other's objects.
        peer = Peer.start(env, snap, live_roots, LaneWork(_prepare, _failed_midway)) if n == 2 else None
        try:
            r = _prepare(env, snap, live_roots, (0, 2) if peer else None, progress, mark)
        except BaseException:
            if peer is not None:
                peer.stop()
            raise
        saver: threading.Thread | None = None
        try:
            found = Found(*r.proofs())
            if peer is not None:
                found.extend(Found(*peer.staged()))  # raises what stopped the other lane, if anything did
                mark("stage")
            if len(found):
                # Proven before the commit, true whatever it or the verification finds: written
                # while this process commits and verifies (system calls, which let it run).
                saver = threading.Thread(target=save_aliases, name="rewheel-aliases", daemon=True, args=(
                    snap, found, [x.path for x in r.roots], r.same.alias_file if r.same is not None else None))
                saver.start()
            if peer is not None:
                peer.go()
            try:
                r.commit()
            except OSError as exc:
                raise _failed_midway(env, snap, exc) from exc
            mark("commit")
        except BaseException:
            r.discard_staging()
            if peer is not None:
                peer.stop()
            if saver is not None:
                saver.join()
            raise
        # The flush runs while the verification reads the tree back and the plan is freed
        # (the kernel does the one, Python the others); it has finished before this
        # returns or raises, so a restore reported done is on disk. It starts once both
        # lanes have committed, so it covers what each wrote.
        syncer = threading.Thread(target=os.sync, name="rewheel-sync", daemon=True)
        other: dict[str, Any] = {}
        try:
            try:
                if peer is not None:
                    peer.committed()
                syncer.start()
                problems = [] if full_verify else r.verify()
                done = r.summary()
                if peer is not None:
                    other = peer.done()
                    problems += other.pop("problems")
                    done = {k: v + other[k] for k, v in done.items()}
                if full_verify:
                    verified = verify(env, snap, r.man)
                else:
                    _raise_if_problems(env, snap, problems)
                    verified = sum(len(f.names) for f in r.folders.values()) - done["others"]
            except BaseException:
                r.discard_staging()
                for p in other.get("displaced", ()):  # what the other lane moved out
                    shutil.rmtree(p, ignore_errors=True)
                raise
            mark("verify")
            res = RestoreResult(snap.id, done["written"], done["deleted"], done["chmodded"],
                                verified - done["written"] - done["chmodded"], verified, 0.0,
                                folders_rebuilt=done["folders_rebuilt"], displaced=done["displaced"],
                                phases=phases, lanes=n, proven_same=done["proven"], unshared=done["unshared"])
            del r  # freed here, so the collector has none of it to walk once back on
        finally:
            if syncer.ident is not None:
                syncer.join()
            t_back = time.perf_counter()
            if peer is not None:
                peer.reap()
            if saver is not None:
                saver.join()
        mark("finish")
    # `seconds`: until the environment is back, verified and on disk. Taking what was moved
    # out of it away is counted apart (`removal_seconds`), whenever it happens.
    res.seconds = t_back - t0
    if not defer_removal:
        discard_displaced(res, snap.home)
    return res


def _failed_midway(env: Environment, snap: SnapshotMeta, exc: OSError) -> RestoreError:
    """A commit stopped by the system (in either lane): what to do about it."""
    return RestoreError(f"restoring snapshot {snap.id} into {env.prefix} failed midway: {exc}",
                        hint=f"fix the cause (disk full? permissions?) and run `rewheel rollback --python "
                             f"{env.python} {snap.id}` again; the restore is idempotent")


def _prepare(env: Environment, snap: SnapshotMeta, live_roots: list[Root], lane: tuple[int, int] | None,
             progress: Progress | None, mark: Callable[[str], None]) -> _Restore:
    """Read the manifest, compare the lane's folders with it, check and stage what they
    need. Nothing in the environment has changed when this returns or raises."""
    man = Manifest.load(snap, validate=False)
    # Acted on by their real paths: a prefix reached through a symlink (`/srv/env` ->
    # `/data/env`) is walked with O_NOFOLLOW from a root that must be the folder itself.
    roots = [Root(os.path.realpath(r.path), r.whole) for r in match_roots(snap, man, live_roots)]
    r = _Restore(env, snap, man, roots, progress, lane)  # indexes the manifest, validating it
    mark("load")
    try:
        for ri, root in enumerate(roots):
            if root.whole:
                r.scan_root(ri)
            elif lane is None or lane[0] == 0:
                r.scan_listed(ri)
    except ManifestDamaged as exc:
        raise bad_entry(snap, exc) from None
    mark("scan")
    try:
        r.stage()  # every stored file the commit will use is checked here
    except BaseException as exc:
        r.discard_staging()
        if isinstance(exc, ManifestDamaged):
            raise bad_entry(snap, exc) from None
        if isinstance(exc, OSError):
            raise RestoreError(
                f"restoring snapshot {snap.id} into {env.prefix} stopped while staging, before anything "
                f"changed: {exc}",
                hint=f"fix the cause (disk full? permissions?) and run `rewheel rollback --python {env.python} "
                     f"{snap.id}` again") from exc
        raise
    mark("stage")
    return r


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def remove_displaced(res: RestoreResult) -> float:
    """Delete what a restore moved out of the environment (a failed build's files)."""
    t0 = time.monotonic()
    for p in res.displaced:
        shutil.rmtree(p, ignore_errors=True)
    res.displaced = []
    res.removal_seconds = time.monotonic() - t0
    return res.removal_seconds


def discard_displaced(res: RestoreResult, home: Path) -> float:
    """Take what a restore moved out of the environment away without waiting for its deletion.

    Each displaced folder leaves by one rename into a fresh folder of the store's `trash`
    (on the environment's filesystem whenever snapshots are hard links), and a detached
    `rm -rf` deletes it there after this command has exited: thousands of unlinks that
    would otherwise hold up the rollback's end. The environment is exact when this returns.
    What cannot be moved (the store on another filesystem) is deleted here, as
    `remove_displaced` does; so is everything when no `rm` can be started."""
    t0 = time.monotonic()
    left = _into_trash(res.displaced, Path(home) / TRASH) if res.displaced else []
    for p in left:
        shutil.rmtree(p, ignore_errors=True)
    res.displaced = []
    res.removal_seconds = time.monotonic() - t0
    return res.removal_seconds


def _into_trash(paths: list[str], trash: Path) -> list[str]:
    """Move `paths` into a new folder of `trash` and start its deletion; the paths not moved."""
    try:
        trash.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(trash)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            # A link (or someone else's folder) in its place: its stale entries are not the
            # store's to delete. What was displaced is deleted where it is instead.
            return list(paths)
        bin_ = tempfile.mkdtemp(prefix="restore-", dir=trash)
    except OSError:
        return list(paths)
    left = []
    for i, p in enumerate(paths):
        try:
            os.rename(p, os.path.join(bin_, str(i)))
        except OSError:  # another filesystem than the store's (EXDEV)
            left.append(p)
    if len(left) == len(paths):
        with contextlib.suppress(OSError):
            os.rmdir(bin_)
        return left
    # What a deletion stopped before its end left (the host went down): swept with this one.
    stale = []
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(trash) as it:
        for d in it:
            with contextlib.suppress(OSError):
                if d.path != bin_ and now - d.stat(follow_symlinks=False).st_mtime > TRASH_STALE_S:
                    stale.append(d.path)
    try:
        proc.detach(["rm", "-rf", "--", bin_, *stale])
    except (OSError, RewheelError):  # no `rm` to start: deleted here
        shutil.rmtree(bin_, ignore_errors=True)
    return left


def verify(env: Environment, snap: SnapshotMeta, man: Manifest | None = None) -> int:
    """Check the live environment against the manifest; raise RestoreError on any difference."""
    man = man or Manifest.load(snap)
    roots = [Root(os.path.realpath(r.path), r.whole) for r in match_roots(snap, man, scope_of(env))]
    owned = _owned_now(roots, env)
    owned.update(os.path.join(roots[e.root].path, e.path) for e in man.entries if not roots[e.root].whole)
    want = {(e.root, e.path): e for e in man.entries if e.kind != "o"}
    same = SameBytes(env, snap, man, roots)
    problems: list[str] = []
    seen = 0
    for ri, rel, st in walk(roots, owned, {os.path.realpath(snap.home)}, None,
                             exclusion(man.exclude)):
        e = want.get((ri, rel))
        if e is None:
            if kind_of(st.st_mode) != "o":
                problems.append(f"extra: {rel}")
            continue
        seen += 1
        path = os.path.join(roots[ri].path, rel)
        problem = _entry_problem(e, st, path)
        if problem and problem.startswith("content differs") and roots[ri].whole:
            folder, _, name = rel.rpartition("/")
            fp = same.folder(ri, folder, os.path.join(roots[ri].path, folder))
            if fp is None or not same.same(fp, name, e.size, lambda e=e: e.sha256, st):  # type: ignore[misc]
                problems.append(problem)
                continue
            problem = _entry_problem(e._replace(mtime_ns=st.st_mtime_ns), st, path)  # its mode, still
        if problem:
            problems.append(problem)
    if seen != len(want):
        problems.append(f"missing: {len(want) - seen} entries")
    _raise_if_problems(env, snap, problems)
    return seen
