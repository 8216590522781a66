"""The object store: each content a snapshot holds, stored once per environment.

Owns: `Objects` (`<env dir>/objects/<aa>/<rest>`): an object's name (`object_name`), putting
a file in — a private copy or clone named by its sha256, or a hard link of a live binary —
checking one (`private_ok`, `linked_ok`), and the sweep of objects no manifest names
(`Objects.collect`).

A snapshot is a manifest that names objects (as OSTree and restic store content): a file
that did not change since the last snapshot costs that snapshot one stat of the live file
and no write at all, and a content several snapshots hold is on disk once.

Two kinds of object:
- **private** (`C` copied, `R` reflinked): its own inode, named by the sha256 alone. The
  environment never holds that inode, so no edit of the environment can reach it. Its mtime
  is `OBJECT_MTIME_NS`, set when its bytes are complete: a copy cut short, or a write into
  the object, leaves another mtime and reads as absent (capture) or damaged (restore).
- **linked** (`L`): the live file's own inode, hard-linked into the store — only for large
  binaries (`tree.hand_editable` says no), whose copies would cost the gigabytes sharing
  saves. Named `<sha256>-<mtime_ns>`: two live inodes with the same bytes and mtimes can
  share one object; an mtime is an inode's, so different mtimes need different objects.

Every object is created under a temporary name and renamed into place, so a name always
holds whole bytes; everything is opened relative to folders opened without following a
symlink, so a link planted where a folder of the store is expected is refused, never
followed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from rewheel.errors import SnapshotError

OBJECTS = "objects"
OBJECT_MTIME_NS = 0  # a private object's mtime once its bytes are complete
OBJECT_MODE = 0o400
CHUNK = 1 << 20
_FICLONE = 0x40049409
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TMP = ".tmp-"
T = TypeVar("T")


def valid_sha(sha: object) -> bool:
    """A sha256 as 64 lowercase hex digits: the only text an object's name is made of (a
    manifest tampered with cannot name `../../etc/x`)."""
    return type(sha) is str and len(sha) == 64 and not sha.strip("0123456789abcdef")


def object_name(sha: str, code: str, mtime_ns: int) -> str:
    """The object a manifest entry names: `<aa>/<rest>` for a private one (`C`, `R`),
    `<aa>/<rest>-<mtime_ns>` for a linked one (`L`). ValueError for a sha256 that is not one."""
    if not valid_sha(sha):
        raise ValueError(f"not a sha256: {str(sha)[:80]!r}")
    if code == "L":
        if type(mtime_ns) is not int:
            raise ValueError(f"not an mtime: {mtime_ns!r}")
        return f"{sha[:2]}/{sha[2:]}-{mtime_ns}"
    return f"{sha[:2]}/{sha[2:]}"


def private_ok(st: os.stat_result | None, size: int) -> bool:
    return st is not None and stat.S_ISREG(st.st_mode) and st.st_size == size and st.st_mtime_ns == OBJECT_MTIME_NS


def linked_ok(st: os.stat_result | None, size: int, mtime_ns: int) -> bool:
    return st is not None and stat.S_ISREG(st.st_mode) and st.st_size == size and st.st_mtime_ns == mtime_ns


def objects_dir(env_dir: Path | str) -> Path:
    return Path(env_dir) / OBJECTS


class Objects:
    """One environment's objects. Use as a context manager (it holds folder descriptors)."""

    def __init__(self, env_dir: Path | str, *, create: bool = True) -> None:
        self.root = objects_dir(env_dir)
        self._create = create
        self._root_fd = -1
        self._fds: dict[str, int] = {}
        self._n = 0
        self.known: set[str] = set()  # private names checked whole by this instance

    # Folders ---------------------------------------------------------------------------
    def __enter__(self) -> Objects:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1

    def _root(self) -> int:
        if self._root_fd < 0:
            if self._create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(self.root, 0o700)
            try:
                self._root_fd = os.open(self.root, _DIR_FLAGS)
            except OSError as exc:
                if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and os.path.islink(self.root)):
                    raise _not_a_folder(self.root) from None
                raise
        return self._root_fd

    def _dir(self, aa: str) -> int:
        fd = self._fds.get(aa)
        if fd is None:
            root = self._root()
            if self._create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(aa, 0o700, dir_fd=root)
            try:
                fd = os.open(aa, _DIR_FLAGS, dir_fd=root)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _not_a_folder(self.root / aa) from None
                raise
            self._fds[aa] = fd
        return fd

    # Looking ---------------------------------------------------------------------------
    def lstat(self, name: str) -> os.stat_result | None:
        aa, _, rest = name.partition("/")
        try:
            fd = self._dir(aa)
        except FileNotFoundError:  # (create=False) no such folder yet
            return None
        try:
            return os.stat(rest, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            raise

    def has_private(self, sha: str, size: int) -> bool:
        """Whether the private object of `sha` is whole (`size` bytes, its completion mtime)."""
        name = f"{sha[:2]}/{sha[2:]}"
        if name in self.known:
            return True
        if private_ok(self.lstat(name), size):
            self.known.add(name)
            return True
        return False

    # Putting in ------------------------------------------------------------------------
    def _tmp(self) -> str:
        self._n += 1
        return f"{_TMP}{os.getpid()}-{self._n}"

    def _write(self, fd_dir: int, name: str, src: str, fill: Callable[[int, int], T]) -> T:
        """A new file `name` in folder fd_dir, created exclusively (mode 0400), holding what
        `fill(source fd, new fd)` writes from `src`, then given its completion mark (its
        mtime): what `fill` returns. Removed again when anything fails."""
        # The new file first: where the object exists already, that is the one call made.
        fo = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, OBJECT_MODE,
                     dir_fd=fd_dir)
        try:
            fi = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                got = fill(fi, fo)
            finally:
                os.close(fi)
            os.utime(fo, ns=(OBJECT_MTIME_NS, OBJECT_MTIME_NS))
        except BaseException:
            with contextlib.suppress(OSError):
                if os.stat(name, dir_fd=fd_dir, follow_symlinks=False).st_ino == os.fstat(fo).st_ino:
                    os.unlink(name, dir_fd=fd_dir)  # never whole: not left under its name
            raise
        finally:
            os.close(fo)
        return got

    def _write_renamed(self, fd_dir: int, rest: str, src: str, fill: Callable[[int, int], T], *,
                       from_dir: int | None = None) -> T:
        """`_write` under a temporary name (in `from_dir`, else fd_dir), then renamed over
        `rest`: the object is whole or absent, whatever was under its name before."""
        tmp_dir = fd_dir if from_dir is None else from_dir
        tmp = self._tmp()
        got = self._write(tmp_dir, tmp, src, fill)
        _rename_over(tmp, tmp_dir, rest, fd_dir)
        return got

    def copy_in(self, src: str, sha: str, size: int) -> bool:
        """Copy `src` (whose sha256 is known: RECORD's) into the private object `sha`, unless
        the store holds it whole already. Whether it copied.

        Made under its own name, created exclusively (no rename: a copy's cost is its inode,
        and a rename is a quarter more): the completion mark set last (its mtime) tells a whole
        object from one a killed copy left, which is replaced by a copy renamed over it."""
        aa, rest = sha[:2], sha[2:]
        name = f"{aa}/{rest}"
        if name in self.known:
            return False
        fd_dir = self._dir(aa)
        try:
            self._write(fd_dir, rest, src, lambda fi, fo: copy_fd(fi, fo, size))
        except FileExistsError:
            if private_ok(self.lstat(name), size):
                self.known.add(name)
                return False
            # Left by a killed copy (or another lane's, half done): replaced whole.
            self._write_renamed(fd_dir, rest, src, lambda fi, fo: copy_fd(fi, fo, size))
        self.known.add(name)
        return True

    def copy_hashed_in(self, src: str) -> tuple[str, int, bool]:
        """Copy `src`, whose bytes no RECORD proves, hashing it on the way; the private
        object is named by that hash. Returns (sha256, size, whether the store lacked it). A
        sparse file stays sparse."""
        root = self._root()
        tmp = self._tmp()
        sha, size = self._write(root, tmp, src, copy_fd_hashed)
        return self._named(root, tmp, sha, size)

    def clone_hashed_in(self, src: str) -> tuple[str, int, bool] | None:
        """`copy_hashed_in` by a copy-on-write clone: the clone is hashed (what it holds is
        what the object is named by, whatever `src` becomes meanwhile). None where the
        filesystem has no clones (nothing is left behind)."""
        root = self._root()
        tmp = self._tmp()
        try:
            self._write(root, tmp, src, _clone)
        except OSError:
            return None
        try:
            fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
            try:
                h = hashlib.sha256()
                size = 0
                while chunk := os.read(fd, CHUNK):
                    h.update(chunk)
                    size += len(chunk)
            finally:
                os.close(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=root)
            raise
        return self._named(root, tmp, h.hexdigest(), size)

    def _named(self, root: int, tmp: str, sha: str, size: int) -> tuple[str, int, bool]:
        """The whole object `tmp` renamed to its name `sha` where the store lacks that
        content, else removed: (sha256, size, whether it was new)."""
        try:
            aa, rest = sha[:2], sha[2:]
            new = not self.has_private(sha, size)
            if new:
                os.rename(tmp, rest, src_dir_fd=root, dst_dir_fd=self._dir(aa))
                self.known.add(f"{aa}/{rest}")
            else:
                os.unlink(tmp, dir_fd=root)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=root)
            raise
        return sha, size, new

    def can_clone(self, src: str) -> bool:
        """Whether `src` can be cloned into the store (copy-on-write: XFS, btrfs, bcachefs).
        One ioctl that fails at once where it cannot (ext4); nothing is left behind."""
        root = self._root()
        tmp = self._tmp()
        try:
            self._write(root, tmp, src, _clone)
        except OSError:
            return False
        os.unlink(tmp, dir_fd=root)
        return True

    def clone_in(self, src: str, sha: str) -> bool:
        """A copy-on-write clone of `src` as the private object `sha`; False where the
        filesystem has none (nothing is left behind then)."""
        aa, rest = sha[:2], sha[2:]
        try:
            self._write_renamed(self._dir(aa), rest, src, _clone)
        except OSError:
            return False
        self.known.add(f"{aa}/{rest}")
        return True

    def link_in(self, src: str, sha: str, st: os.stat_result) -> os.stat_result | None:
        """Hard-link the live file `src` (its lstat `st`) into the store as the linked object
        of (`sha`, its mtime). Returns the object's lstat — the live inode, or an existing
        object with the same bytes and mtime — or None where no link can be made (the store
        on another filesystem: the caller copies instead)."""
        name = object_name(sha, "L", st.st_mtime_ns)
        aa, _, rest = name.partition("/")
        fd_dir = self._dir(aa)
        try:
            os.link(src, rest, dst_dir_fd=fd_dir, follow_symlinks=False)
        except FileExistsError:
            have = self.lstat(name)
            if have is not None and (have.st_dev, have.st_ino) == (st.st_dev, st.st_ino):
                return have
            if linked_ok(have, st.st_size, st.st_mtime_ns):
                return have  # the same bytes and mtime under another inode
            # Left by a damaged or tampered store: replaced, by one rename.
            tmp = self._tmp()
            try:
                os.link(src, tmp, dst_dir_fd=fd_dir, follow_symlinks=False)
                os.rename(tmp, rest, src_dir_fd=fd_dir, dst_dir_fd=fd_dir)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=fd_dir)
                if exc.errno in _NO_LINK:
                    return None
                raise
        except OSError as exc:
            if exc.errno in _NO_LINK:
                return None
            raise
        return self.lstat(name)

    def privatize(self, name: str, ino: int) -> str:
        """A linked object a snapshot took over from the environment (see `privatize`), made
        the store's own. Returns "gone" (not there, or no longer inode `ino`), "alone" (the
        store holds its only link: nothing to do), "copied" (replaced, by one rename, with a
        copy of its bytes under the same name and mtime), or "changed" (its bytes are no
        longer those its name says — edited while another link reached it: removed, so that
        no snapshot keeps an edit; the snapshot then says that file is missing)."""
        aa, _, rest = name.partition("/")
        try:
            fd_dir = self._dir(aa)
            st = os.stat(rest, dir_fd=fd_dir, follow_symlinks=False)
        except FileNotFoundError:
            return "gone"
        if st.st_ino != ino or not stat.S_ISREG(st.st_mode):
            return "gone"
        if st.st_nlink == 1:
            return "alone"
        tmp = self._tmp()
        fi = os.open(rest, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd_dir)
        try:
            fo = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, OBJECT_MODE,
                         dir_fd=fd_dir)
            try:
                sha, _ = copy_fd_hashed(fi, fo)
                os.utime(fo, ns=(st.st_atime_ns, st.st_mtime_ns))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=fd_dir)
                raise
            finally:
                os.close(fo)
        finally:
            os.close(fi)
        if sha != aa + rest.partition("-")[0]:
            os.unlink(tmp, dir_fd=fd_dir)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(rest, dir_fd=fd_dir, follow_symlinks=False).st_ino == ino:
                    os.unlink(rest, dir_fd=fd_dir)
            return "changed"
        _rename_over(tmp, fd_dir, rest, fd_dir)
        return "copied"

    # Sweeping --------------------------------------------------------------------------
    def collect(self, referenced: Iterable[str]) -> tuple[int, int]:
        """Remove every object no name in `referenced` keeps, and what a killed copy left
        (`.tmp-*`). Only under the environment's lock, with every manifest read: an object
        is unlinked only when no committed snapshot names it. Returns (objects, bytes)."""
        keep = set(referenced)
        try:
            root = self._root()
        except FileNotFoundError:
            return 0, 0
        n = size = 0
        with os.scandir(root) as it:
            top = [(de.name, de.is_dir(follow_symlinks=False)) for de in it]
        for aa, is_dir in top:
            if not is_dir:
                if aa.startswith(_TMP) and not _being_written(aa):
                    with contextlib.suppress(OSError):
                        os.unlink(aa, dir_fd=root)
                continue
            try:
                fd = self._dir(aa)
            except SnapshotError:
                continue
            gone = [rest for rest in os.listdir(fd) if f"{aa}/{rest}" not in keep and not _being_written(rest)]
            for rest in gone:
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(rest, dir_fd=fd, follow_symlinks=False)
                    os.unlink(rest, dir_fd=fd)
                    n += not rest.startswith(_TMP)
                    size += st.st_size if st.st_nlink <= 1 else 0
                self.known.discard(f"{aa}/{rest}")
        return n, size


_NO_LINK = (errno.EXDEV, errno.EMLINK, errno.EPERM, errno.ENOTSUP, errno.EACCES)


def _being_written(name: str) -> bool:
    """A temporary file of another process that is still running (the detached settling of
    a rollback's undo snapshot, which needs no lock): not a leftover to sweep."""
    if not name.startswith(_TMP):
        return False
    pid = name[len(_TMP):].partition("-")[0]
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _not_a_folder(path: Path) -> SnapshotError:
    return SnapshotError(f"{path} is not a folder of the store (a symlink or a file in its place)",
                         hint="move it out of the way; rewheel writes only into folders of its own and never "
                              "through a link it did not make")


def _rename_over(tmp: str, tmp_dir: int, rest: str, fd_dir: int) -> None:
    """A whole temporary object renamed over its name (whatever was there); removed when the
    rename fails, so that no `.tmp-*` outlives the call."""
    try:
        os.rename(tmp, rest, src_dir_fd=tmp_dir, dst_dir_fd=fd_dir)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=tmp_dir)
        raise


def _clone(fi: int, fo: int) -> None:
    fcntl.ioctl(fo, _FICLONE, fi)


def copy_fd(fi: int, fo: int, size: int) -> None:
    """Copy `size` bytes from fi to fo in the kernel where it can (copy_file_range: no byte
    passes through this process), else by reads and writes."""
    try:
        left = size
        while left > 0:
            n = os.copy_file_range(fi, fo, left)
            if not n:
                break
            left -= n
        return
    except OSError as exc:  # no in-kernel copy between these two (an older kernel, EXDEV)
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
            raise
    os.lseek(fi, 0, os.SEEK_SET)
    os.ftruncate(fo, 0)
    os.lseek(fo, 0, os.SEEK_SET)
    while chunk := os.read(fi, CHUNK):
        view = memoryview(chunk)
        while view:
            view = view[os.write(fo, view):]


_ZEROS = bytes(CHUNK)


def copy_fd_hashed(fi: int, fo: int) -> tuple[str, int]:
    """Copy fi to fo, returning (sha256 hex, size) of the bytes copied, in one pass. A sparse
    file stays sparse: its holes are hashed as the zeros they read as, not written."""
    st = os.fstat(fi)
    h = hashlib.sha256()
    if st.st_blocks * 512 < st.st_size and hasattr(os, "SEEK_DATA"):
        return _copy_sparse(fi, fo, st.st_size)
    n = 0
    while chunk := os.read(fi, CHUNK):
        h.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(fo, view):]
        n += len(chunk)
    return h.hexdigest(), n


def _copy_sparse(fi: int, fo: int, size: int) -> tuple[str, int]:
    """Copy the data extents of a sparse file (SEEK_DATA / SEEK_HOLE) and leave the holes."""
    h = hashlib.sha256()
    pos = 0
    while pos < size:
        try:
            data = os.lseek(fi, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no data after pos, only a hole to the end
                raise
            data = size
        for at in range(0, data - pos, CHUNK):  # the hole reads as zeros
            h.update(_ZEROS[:min(CHUNK, data - pos - at)])
        if data >= size:
            break
        hole = os.lseek(fi, data, os.SEEK_HOLE)
        os.lseek(fi, data, os.SEEK_SET)
        os.lseek(fo, data, os.SEEK_SET)
        left = hole - data
        while left > 0:
            chunk = os.read(fi, min(CHUNK, left))
            if not chunk:
                break
            h.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fo, view):]
            left -= len(chunk)
        pos = hole
    os.ftruncate(fo, size)
    return h.hexdigest(), size
