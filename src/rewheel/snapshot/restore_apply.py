"""A restore's changes: check and stage, commit, verify — one lane's share.

Owns: `LaneRestore` (a `restore_scan.LaneScan` that has compared its folders): every stored
file it will use checked before anything changes (`check_links`, `check_stored`), copies
staged (sha256 checked on the way) or files linked from uv's cache where they are the very
inode the environment had (`cachelinks`), folders the snapshot has and the environment lacks
built whole; then the commit (unlink and link, rename in, move out, modes and mtimes), and
the verification of every folder it changed.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
from typing import Any

from rewheel.errors import SnapshotDamaged
from rewheel.snapshot.capture import clone_file, copy_hashed
from rewheel.snapshot.manifest import Entry, bad_entry
from rewheel.snapshot.objects import OBJECT_MTIME_NS
from rewheel.snapshot.restore_checks import (DIR_FLAGS, EMPTY, NO_LINK, Dir, check_fields, check_stored,
                                             entry_problem, is_private)
from rewheel.snapshot.restore_scan import LaneScan
from rewheel.snapshot.store import Found
from rewheel.snapshot.tree import STAGING_PREFIX, kind_of, nested_prefix, staging_folder


class LaneRestore(LaneScan):
    """One lane of a restore: scan (`LaneScan`), check and stage, commit, verify. Nothing in
    the environment changes before the commit, and the commit starts only once every stored
    file it will use has been checked."""

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

    def check_links(self, d: Dir) -> None:
        """Before the commit: every stored inode folder d's files will be linked to exists
        and still has the manifest's size and mtime (one fstatat each, in its folder)."""
        links = [e for e in d.writes if e.kind == "f" and e.stored == "link" and not is_private(e)]
        if not links:
            return
        if self.objects:
            for e in links:
                self.links[(e.root, e.path)] = self.check_stored(e)
            return
        try:
            sfd = os.open(self.stored_folder(d), DIR_FLAGS)
        except OSError:
            self.check_stored(links[0])  # raises, naming the file
            raise
        try:
            for e in links:
                try:
                    st = os.lstat(e.path.rpartition("/")[2], dir_fd=sfd)
                except FileNotFoundError:
                    st = None
                if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != e.size or st.st_mtime_ns != e.mtime_ns:
                    st = self.check_stored(e)  # raises, naming the file
                self.links[(e.root, e.path)] = st
        finally:
            os.close(sfd)

    def stored_folder(self, d: Dir) -> str:
        """(Versions 1 and 2) where folder d's stored copies are."""
        return f"{self.tree}/{d.ri}/{d.rel}" if d.rel else f"{self.tree}/{d.ri}"

    def stored(self, e: Entry) -> str:
        """Where entry e's bytes are: its object, or (versions 1 and 2) its copy in the tree."""
        if not self.objects:
            return f"{self.tree}/{e.root}/{e.path}"  # hot: plain concatenation, not os.path.join
        if e.sha256 is None:
            raise bad_entry(self.snap, e)
        return self.man.stored_path(self.snap, e)

    def cache_hit(self, ri: int, folder: str, e: Entry) -> str | None:
        """The file of uv's cache that is the inode e had when the snapshot was taken (see
        `cachelinks`), else None. Its own stored bytes are checked as well: should the cache
        change before the commit links it, the commit copies them instead."""
        if self.cache is None or e.kind != "f" or e.stored == "link":
            # (A linked object is that very inode: linked into the environment, an edit there
            # would reach the store.)
            return None
        hit = self.cache.find(ri, folder, e.path.rpartition("/")[2], e.ino, e.size, e.mtime_ns, e.mode)
        if hit is not None:
            self.check_stored(e)
        return hit

    def check_stored(self, e: Entry) -> os.stat_result:
        """Entry e's stored bytes are whole: their lstat, or SnapshotDamaged naming them."""
        private = self.objects and e.stored != "link"
        return check_stored(self.snap, self.stored(e), e, OBJECT_MTIME_NS if private else e.mtime_ns)

    def place(self, e: Entry, dst: str) -> None:
        """Put entry e (a file or symlink) at dst, a path that is free: a link to the
        stored inode (checked against the manifest first) or a checked copy."""
        if e.kind == "l":
            assert e.target is not None  # a manifest symlink always has its target
            os.symlink(e.target, dst)
        else:
            sst = self.links.get((e.root, e.path))
            if e.stored == "link" and not is_private(e):
                if sst is None:
                    sst = self.links[(e.root, e.path)] = self.check_stored(e)
                try:
                    os.link(self.stored(e), dst)
                except OSError as exc:
                    if exc.errno not in NO_LINK:
                        raise
                    del self.links[(e.root, e.path)]  # another filesystem now: copy instead
                    sst = None
                    self.copy(e, dst)
            else:
                hit = self.cache_hit(int(e.root), e.path.rpartition("/")[0], e) if self.roots[e.root].whole else None
                if hit is not None and self.link_cached(hit, dst):
                    self.count_written(cached=True)
                    return
                self.copy(e, dst)
            # A link shares the stored inode: its mode and mtime are already right unless
            # someone changed them; only then pay for chmod and utime.
            if sst is None or stat.S_IMODE(sst.st_mode) != e.mode:
                os.chmod(dst, e.mode)
            if sst is None or sst.st_mtime_ns != e.mtime_ns:
                os.utime(dst, ns=(e.mtime_ns, e.mtime_ns))
        self.count_written()

    def link_cached(self, hit: str, dst: str, dst_dir_fd: int | None = None) -> bool:
        """Link uv's cache file `hit` at dst; False where it cannot (another filesystem, gone
        since): the caller copies the snapshot's bytes instead, and looks in the cache no more."""
        try:
            os.link(hit, dst, dst_dir_fd=dst_dir_fd)
            return True
        except OSError as exc:
            if exc.errno not in (*NO_LINK, errno.ENOENT, errno.EACCES):
                raise
            self.cache = None
            return False

    def count_written(self, *, cached: bool = False) -> None:
        self.cached += cached
        self.written += 1
        if self.written == self.kill_at:  # testing hook: a power cut (or a signal) halfway through the commit
            from rewheel.journal import fault_signal

            os.kill(os.getpid(), fault_signal())
        if self.progress and self.written % 500 == 0:
            # In two lanes, this process counts its own half (the other prints nothing).
            self.progress("restore" if self.owned is None else "restore (lane 1 of 2)", self.written, self.todo)

    def copy(self, e: Entry, dst: str) -> None:
        src = self.stored(e)
        if e.stored == "reflink":
            # A clone of the stored clone: no byte read or written. An edit in place of the
            # live file could not reach the stored one (copy-on-write); it is checked by
            # size and mtime, as a hard-linked one is.
            self.check_stored(e)
            if clone_file(src, dst):
                return
        if e.stored == "link" or self.objects:
            self.check_stored(e)
        try:
            sha, _ = copy_hashed(src, dst)
        except FileNotFoundError:
            self.check_stored(e)  # the stored copy is gone: raises, naming it
            raise
        if e.sha256 and sha != e.sha256:
            raise SnapshotDamaged(
                f"snapshot {self.snap.id}: stored file {e.path} does not match its recorded sha256 "
                f"(expected {e.sha256[:12]}…, found {sha[:12]}…)",
                hint="the store was tampered with or damaged; restore another snapshot")

    def build(self, ri: int, rel: str, e: Entry, dst: str) -> None:
        """Build folder `rel` whole at dst, exactly as the manifest has it."""
        os.mkdir(dst, 0o700)
        f = self.folders.get((ri, rel)) or EMPTY
        for i, name in enumerate(f.names):
            if f.types[i] == "o":
                self.others += 1
                continue
            k = f.entry(ri, rel, i, sha=False)
            check_fields(self.snap, k)
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
                check_fields(self.snap, e)
            for e in d.chmods + d.retimes:
                check_fields(self.snap, e)
            if d.entry is not None:
                check_fields(self.snap, d.entry)
            if self.roots[d.ri].whole:
                self.check_links(d)
            for e in d.writes:
                if e.kind == "f" and (e.stored != "link" or not self.roots[d.ri].whole or is_private(e)):
                    if self.roots[d.ri].whole:
                        hit = self.cache_hit(d.ri, d.rel, e)
                        if hit is not None:
                            self.from_cache[id(e)] = hit  # linked by the commit
                            continue
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

    def commit_folder(self, d: Dir) -> None:
        """Apply folder d's changes, every call relative to the open folder (and to the
        open stored folder for links): no path is resolved again per file."""
        e = d.entry
        attrs_off = d.attrs_off
        try:
            fd = os.open(d.path, DIR_FLAGS)
        except FileNotFoundError:
            if e is not None:
                raise
            os.makedirs(d.path)  # the root itself was gone
            fd = os.open(d.path, DIR_FLAGS)
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
                cached = self.from_cache.get(id(k))
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
                if cached is not None:
                    if self.link_cached(cached, name, fd):
                        self.count_written(cached=True)
                        self.cache_linked.add(id(k))
                    else:
                        self.place(k, f"{d.path}/{name}")  # copies the snapshot's bytes (checked by the stage)
                    continue
                if sfd < 0 and not self.objects:
                    sfd = os.open(self.stored_folder(d), DIR_FLAGS)
                sst = self.links[(k.root, k.path)]
                try:
                    if self.objects:
                        os.link(self.stored(k), name, dst_dir_fd=fd)
                    else:
                        os.link(name, name, src_dir_fd=sfd, dst_dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in NO_LINK:
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
                if k.path in d.remodes:
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

    def commit_listed(self, d: Dir) -> None:
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
        stored inode whose size and mtime were checked just before (or uv's cache file whose
        inode, size, mtime and mode were), and a copy had its sha256 checked while it was made."""
        problems: list[str] = []
        for d in self.dirs:
            for e in d.writes + d.chmods + d.retimes:
                if ((e.root, e.path) in self.links or id(e) in self.cache_linked) and self.roots[d.ri].whole:
                    continue
                p = self.path_of(d, e)
                try:
                    st = os.lstat(p)
                except FileNotFoundError:
                    problems.append(f"missing: {e.path}")
                    continue
                problem = entry_problem(e, st, p)
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

    @property
    def touched(self) -> bool:
        """Whether the commit would change anything in this lane's folders."""
        return bool(self.dirs)

    def summary(self) -> dict[str, Any]:
        """What this lane did, for the lane that reports the restore."""
        return {"written": self.written - self.unshared, "unshared": self.unshared, "from_cache": self.cached,
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
        f = self.folders.get((ri, rel)) or EMPTY
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
            if (not (kind == "d" and staging_folder(rel, n)) and kind != "o"
                    and not (kind == "d" and nested_prefix(f"{path}/{n}", prefix + n, self.roots[ri].path))
                    and not (self.excluded is not None and ri == 0 and self.excluded(prefix + n))):
                problems.append(f"extra: {prefix}{n}")
        problems.extend(f"missing: {prefix}{n}" for n in sorted(want - live))
        if deep:
            for i in (i for i, k in enumerate(f.types) if k == "d"):
                name = f.names[i]
                self.check_folder(ri, prefix + name, f"{path}/{name}", f.entry(ri, rel, i), problems, deep)
