"""Cleanup stashing: `[cleanup]` globs moved out before an upgrade and back on rollback.

Owns: which paths a cleanup glob may never touch (`SYSTEM_FOLDERS`, `SYSTEM_TREES`,
`cleanup_glob_refusal`, `cleanup_refusal`), what the globs match (`cleanup_matches`), and
stashing them into a snapshot's folder and back through the same real folders
(`stash_cleanup`, `check_cleanup_entries`, `unstash_cleanup`, `pending_cleanup`).
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import functools
import glob
import os
import shutil
from typing import Any

from rewheel.errors import SnapshotDamaged, UnsafeCleanupPath, UsageError
from rewheel.snapshot.store import SnapshotMeta

# --------------------------------------------------------------------------------------
# Cleanup paths: moved into a snapshot, moved back on rollback
# --------------------------------------------------------------------------------------
# Folders a cleanup glob may never move (as root), nor anything above or inside the
# environment or rewheel's own state.
SYSTEM_FOLDERS = ("/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/opt", "/proc",
                  "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/tmp", "/usr/local",
                  "/usr/lib", "/usr/bin", "/var/lib", "/var/log", "/mnt", "/media", "/dev/shm")
# Nothing inside these either: the system's own files (a match of "/etc/*" would move
# /etc/passwd into a snapshot), and the users' homes but their caches.
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/proc",
                "/root", "/run", "/sbin", "/snap", "/sys", "/usr", "/var")
# Where debris lives, inside those trees: the temporary folders and a home's `.cache`.
DEBRIS_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm")
_MAGIC = frozenset("*?[")
_GLOB_HINT = ("cleanup globs name debris: files in /tmp, /var/tmp, /dev/shm, a user's ~/.cache, or a data "
              'folder of your own, e.g. "/tmp/*.pt"')


def _under(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip("/") + "/")


def _is_debris_place(path: str) -> bool:
    """Strictly inside a temporary folder or a home's `.cache` (never the folder itself)."""
    if any(_under(path, d) for d in DEBRIS_FOLDERS):
        return True
    parts = path.split("/")  # "", "root", ".cache", ... or "", "home", USER, ".cache", ...
    if len(parts) > 3 and parts[1] == "root" and parts[2] == ".cache":
        return True
    if len(parts) > 4 and parts[1] == "home" and parts[3] == ".cache":
        return True
    return any(_under(path, os.path.join(home, ".cache")) for home in _homes())


@functools.lru_cache(maxsize=1)
def _homes() -> tuple[str, ...]:
    """Every user's home (a service user's too, e.g. /var/lib/vllm), and this process's."""
    import pwd

    homes = {os.path.normpath(os.path.expanduser("~"))}
    with contextlib.suppress(OSError, KeyError):
        homes.update(os.path.normpath(p.pw_dir) for p in pwd.getpwall() if p.pw_dir.startswith("/"))
    return tuple(sorted(h for h in homes if h != "/"))


def _system_refusal(path: str) -> str | None:
    """Why an absolute, normalized path is a system folder or inside one, or None."""
    if path in SYSTEM_FOLDERS:
        return "a system folder"
    if _is_debris_place(path):
        return None
    tree = next((t for t in SYSTEM_TREES if _under(path, t)), None)
    return f"a path inside the system folder {tree}" if tree else None


def cleanup_glob_refusal(pattern: str) -> str | None:
    """Why a `[cleanup] paths` glob (absolute, normalized) could only match system files, or
    None: a glob over the top-level folders, a system folder itself, or one inside a system
    folder that is not a temporary folder or a home's cache. What it matches is checked
    again, through symlinks, by `cleanup_matches`."""
    if not pattern.startswith("/") or os.path.normpath(pattern) != (pattern.rstrip("/") or "/"):
        return "not an absolute, normalized path"
    parts = pattern.strip("/").split("/") if pattern != "/" else []
    fixed: list[str] = []
    for part in parts:
        if _MAGIC & set(part):
            break
        fixed.append(part)
    literal = "/" + "/".join(fixed)
    if len(fixed) == len(parts):  # no wildcard: the path itself
        why = _system_refusal(literal)
        return f"names {why}" if why else None
    if not fixed:
        return "matches the top-level folders"
    if _is_debris_place(literal + "/x"):
        return None
    tree = next((t for t in SYSTEM_TREES if literal == t or _under(literal, t)), None)
    return f"matches inside the system folder {tree}" if tree else None


def cleanup_refusal(path: str, protected: list[str]) -> str | None:
    """Why a path a cleanup glob matched must not be moved, or None: a system folder or a
    file inside one (read as written, through its real folder, and as its real path), or
    `protected` — the environment's prefix and rewheel's state folder (nothing inside, at or
    above them)."""
    lexical = os.path.normpath(os.path.abspath(path))
    real = os.path.realpath(path)
    via_real_folder = os.path.join(os.path.realpath(os.path.dirname(lexical)), os.path.basename(lexical))
    for form in dict.fromkeys((lexical, via_real_folder, real)):
        why = _system_refusal(form)
        if why is not None:
            return f"{path} is {why}" + (f" (through symlinks: {form})" if form != lexical else "")
    if os.path.ismount(path):
        return f"{path} is a mount point"
    for p in protected:
        rp = os.path.realpath(p)
        if real == rp or real.startswith(rp.rstrip("/") + "/") or rp.startswith(real.rstrip("/") + "/"):
            return f"{path} is {'inside' if real.startswith(rp.rstrip('/') + '/') else 'or holds'} {p}"
    return None


def _uv_caches() -> list[str]:
    """Where uv's cache may be (UV_CACHE_DIR, XDG_CACHE_HOME/uv, every home's .cache/uv): one
    of rewheel's recovery sources, never debris, though it lies in a cache folder."""
    places = [os.path.join(h, ".cache", "uv") for h in _homes()]
    for var, sub in (("UV_CACHE_DIR", ""), ("XDG_CACHE_HOME", "uv")):
        value = os.environ.get(var)
        if value and os.path.isabs(os.path.expanduser(value)):
            places.append(os.path.join(os.path.expanduser(value), sub) if sub else os.path.expanduser(value))
    return [p for p in places if os.path.isdir(p)]


def lock_folders() -> list[str]:
    """rewheel's lock folders (`paths.lock_dir`): this user's under the base in use
    (REWHEEL_LOCK_DIR, /run/lock, else the /tmp fallback) whether or not it exists yet, and
    every `rewheel-locks-*` folder in any of those bases. Never debris: a run whose lock
    folder its own cleanup moved would share the environment with the next command."""
    from rewheel.paths import LOCK_BASES, lock_base

    bases = list(dict.fromkeys([str(lock_base()), *LOCK_BASES, "/tmp"]))
    found = [os.path.join(bases[0], f"rewheel-locks-{os.geteuid()}")]
    for base in bases:
        found += glob.glob(os.path.join(glob.escape(base), "rewheel-locks-*"))
    return list(dict.fromkeys(found))


def cleanup_matches(globs: list[str] | tuple[str, ...], protected: list[str]) -> list[str]:
    """What `[cleanup] paths` would move now; raises UsageError naming the glob and the path
    when a glob could only match system files (`cleanup_glob_refusal`) or any match is a
    system folder or inside one, the environment, rewheel's state or lock folder, uv's
    cache, or holds one."""
    found: list[str] = []
    locks = lock_folders()
    protected = [*protected, *_uv_caches(), *locks]
    for pattern in globs:
        why = cleanup_glob_refusal(pattern)
        if why is not None:
            raise UsageError(f"[cleanup] paths: {pattern!r} {why}; refusing to move it", hint=_GLOB_HINT)
        # A lock folder made later (by the run's own lock, after `check`) would match too.
        held = next((f"{a} (rewheel's lock folder {lk})" if a == lk else f"{a}, which holds rewheel's lock folder {lk}"
                     for lk in locks for a in _and_above(lk) if glob_matches(a, pattern)), None)
        if held is not None:
            raise UsageError(f"[cleanup] paths: {pattern!r} matches {held}; refusing to move it", hint=_GLOB_HINT)
        for src in sorted(glob.glob(pattern)):
            why = cleanup_refusal(src, protected)
            if why is not None:
                raise UsageError(f"[cleanup] paths: {pattern!r} matches {why}; refusing to move it",
                                 hint=_GLOB_HINT)
            if os.path.lexists(src) and src not in found:
                found.append(src)
    return found


def _and_above(path: str) -> list[str]:
    """`path` and every folder above it but the root."""
    parts = path.rstrip("/").split("/")
    return ["/".join(parts[:i]) for i in range(len(parts), 1, -1)]


def glob_matches(path: str, pattern: str) -> bool:
    """Whether `glob.glob(pattern)` could have returned `path`: component by component, so a
    `*` never crosses a `/`, and a leading dot is matched only by a leading dot."""
    got, want = path.split("/"), pattern.rstrip("/").split("/")
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if g.startswith(".") and not w.startswith(".") and _MAGIC & set(w):
            return False
        if not fnmatch.fnmatchcase(g, w):
            return False
    return True


def _links_above(path: str) -> dict[str, str]:
    """The symlinked folders above `path` now, with their targets (normally none)."""
    links: dict[str, str] = {}
    parts = path.split("/")[1:-1]
    for i in range(1, len(parts) + 1):
        folder = "/" + "/".join(parts[:i])
        if os.path.islink(folder):
            links[folder] = os.readlink(folder)
    return links


def stash_cleanup(snap: SnapshotMeta, globs: list[str] | tuple[str, ...],
                  protected: list[str] | None = None) -> list[dict[str, Any]]:
    """Move files matching the globs into the snapshot (recorded in meta before each move).
    Every match is checked before the first is moved (`cleanup_matches`). Each entry records
    the symlinked folders above it (normally none): it is moved back through those only."""
    dest = snap.path / "cleanup"
    moved: list[dict[str, Any]] = []
    for src in cleanup_matches(globs, [snap.prefix, str(snap.home), *(protected or [])]):
        if not os.path.lexists(src):
            continue
        dest.mkdir(exist_ok=True, mode=0o700)
        item: dict[str, Any] = {"path": src, "stored": str(len(snap.cleanup)), "bytes": os.lstat(src).st_size}
        links = _links_above(src)
        if links:
            item["links"] = links
        snap.cleanup.append(item)
        snap.save()
        shutil.move(src, dest / item["stored"])
        moved.append(item)
    return moved


def _cleanup_item_ok(item: Any, n: int, globs: list[str] | tuple[str, ...], protected: list[str]) -> bool:
    """A stashed cleanup entry that may be moved back: its own slot, an absolute plain path
    that one of the recipe's cleanup globs matches (a `*` never crossing a `/`), not a system
    folder or inside one, and not at, inside or above a protected place (all as written: the
    folders it goes through are checked when it moves, `_open_folder`)."""
    if not (isinstance(item, dict) and isinstance(item.get("path"), str) and item.get("stored") == str(n)):
        return False
    links = item.get("links", {})
    if not (isinstance(links, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in links.items())):
        return False
    path = item["path"]
    if not path.startswith("/") or "\x00" in path or os.path.normpath(path) != path or path == "/":
        return False
    if _system_refusal(path) is not None or not any(glob_matches(path, g) for g in globs):
        return False
    for p in protected:
        for form in {os.path.normpath(p), os.path.realpath(p)}:
            if path == form or _under(path, form) or _under(form, path):
                return False
    return True


def _open_folder(path: str, links: dict[str, str], *, create: bool) -> int | None:
    """A descriptor on the folder `path` goes into, reached from / one folder at a time
    without following a symlink unless the entry recorded that very link when it was stashed
    (missing folders are made, 0755, when `create`); None when one is missing and not
    `create`. Raises UnsafeCleanupPath naming the folder that changed into a link."""
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    parts = path.split("/")[1:-1]
    try:
        for i, part in enumerate(parts):
            folder = "/" + "/".join(parts[:i + 1])
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
            try:
                nfd = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    return None
                os.mkdir(part, 0o755, dir_fd=fd)
                nfd = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                try:
                    target = os.readlink(part, dir_fd=fd)
                except OSError:
                    target = None
                if target is None or links.get(folder) != target:
                    raise UnsafeCleanupPath(
                        f"cannot move {path} back: {folder} is "
                        + (f"now a symlink to {target}" if target is not None else "no longer a folder")
                        + " (it was a folder when the file was moved into the snapshot)",
                        hint=f"put the folder {folder} back (or remove the link); the file stays in the "
                             "snapshot until then") from None
                nfd = os.open(part, flags, dir_fd=fd)  # the same link as when it was stashed
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def check_cleanup_entries(snap: SnapshotMeta, globs: list[str] | tuple[str, ...]) -> None:
    """Refuse, before anything is restored or moved, a snapshot whose cleanup entries the
    recipe's globs do not allow (SnapshotDamaged) or whose folders changed into symlinks since
    they were stashed (UnsafeCleanupPath). Without globs nothing is moved back: nothing to check."""
    if not globs:
        return
    protected = [snap.prefix, str(snap.home)]
    bad = [item for n, item in enumerate(snap.cleanup) if not _cleanup_item_ok(item, n, globs, protected)]
    if bad:
        raise SnapshotDamaged(
            f"snapshot {snap.id}: cleanup entr{'y' if len(bad) == 1 else 'ies'} "
            + ", ".join(repr(str(b.get("path") if isinstance(b, dict) else b)[:200]) for b in bad[:3])
            + " in its meta.json match no [cleanup] paths glob of the recipe (or name a protected folder)",
            hint=f"nothing was moved back; inspect {snap.path / 'meta.json'} (the store may have been tampered with)")
    for item in snap.cleanup:
        if _stored(snap, item) is not None:
            fd = _open_folder(item["path"], item.get("links", {}), create=False)
            if fd is not None:
                os.close(fd)


def _stored(snap: SnapshotMeta, item: dict[str, Any]) -> str | None:
    stored = snap.path / "cleanup" / item["stored"]
    return str(stored) if os.path.lexists(stored) else None


def unstash_cleanup(snap: SnapshotMeta, globs: list[str] | tuple[str, ...] = ()) -> int:
    """Move stashed cleanup paths back where they were (idempotent). The snapshot's metadata
    is not trusted to say where: each path must still be one the recipe's `[cleanup] paths`
    globs match (a rollback given `--python` alone moves nothing back: `pending_cleanup`)
    and none may be a system folder or the environment; a metadata entry that is not is
    refused (SnapshotDamaged) before anything is moved. Each goes back through the same real
    folders it was taken from: a folder above it that became a symlink is refused
    (UnsafeCleanupPath), also before anything is moved."""
    if not globs:
        return 0
    check_cleanup_entries(snap, globs)
    n = 0
    for item in snap.cleanup:
        stored = _stored(snap, item)
        if stored is None:
            continue
        fd = _open_folder(item["path"], item.get("links", {}), create=True)
        assert fd is not None
        try:
            name = os.path.basename(item["path"])
            try:
                os.lstat(name, dir_fd=fd)
                continue  # something is there again: never replaced
            except FileNotFoundError:
                pass
            # Through the descriptor of the folder just opened: no path lookup can be redirected.
            shutil.move(stored, f"/proc/self/fd/{fd}/{name}")
            n += 1
        finally:
            os.close(fd)
    return n


def pending_cleanup(snap: SnapshotMeta) -> int:
    """Stashed cleanup paths still in the snapshot (not moved back)."""
    return sum(1 for item in snap.cleanup if isinstance(item, dict)
               and (snap.path / "cleanup" / str(item.get("stored"))).exists())
