"""Where rewheel keeps its state: `$REWHEEL_HOME` (default `~/.local/state/rewheel`).

Layout, per environment (keyed by the prefix's real path):
  <home>/envs/<slug>-<hash>/{env.json, snapshots/<id>/, runs/<id>/}
The home is created private to its owner (0700): snapshots hold copies of files that may
carry credentials or proprietary patches.

The environment's lock is not in the home — two homes must not both act on one environment —
but machine-wide, keyed by the prefix's device and inode (`lock_dir`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from pathlib import Path

# Machine-wide places for locks, the first that is a sticky world-writable folder wins (the
# same answer for every user of the machine). /run/lock is not private per service
# (systemd's PrivateTmp= gives a service its own /tmp) and is emptied at boot.
LOCK_BASES = ("/run/lock", "/tmp")


def state_home(override: str | os.PathLike[str] | None = None) -> Path:
    if override:
        return Path(override).expanduser()
    env = os.environ.get("REWHEEL_HOME")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".local" / "state" / "rewheel"


# Pseudo-filesystems: nothing rewheel writes there would be kept (or writable at all).
_PSEUDO_FS = ("/proc", "/sys")


def pseudo_fs_of(path: str | os.PathLike[str]) -> str | None:
    """The pseudo-filesystem (/proc, /sys) a path lies on, through symlinks, or None."""
    real = os.path.realpath(path)
    return next((p for p in _PSEUDO_FS if real == p or real.startswith(p + "/")), None)


def ensure_private_dir(path: Path, *, what: str | None = None) -> Path:
    """A folder for rewheel's state. When rewheel creates it, it is private to its owner
    (0700). A folder that already exists keeps its mode — it may be shared, like a 1777 /tmp —
    and is refused (UsageError, exit 2, naming `what`, e.g. "REWHEEL_HOME", and the folder)
    when it is not a folder, sits on a pseudo-filesystem (/proc, /sys), is
    world-writable without the sticky bit (anyone could replace what rewheel keeps there),
    or sits in a sticky world-writable folder but belongs to another user."""
    from rewheel.errors import UsageError

    path = Path(path)
    name = f"{what} {path}" if what else f"state folder {path}"
    hint = "give a folder of your own, or one that does not exist yet (rewheel creates it, mode 0700)"
    pseudo = pseudo_fs_of(path)
    if pseudo is not None:
        raise UsageError(f"{name}: is under {pseudo}, a pseudo-filesystem, not a place to keep "
                         "snapshots", hint=hint)
    try:
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UsageError(f"{name}: cannot be used: {exc.strerror or exc}", hint=hint) from None
    if st is None and os.path.islink(path):
        raise UsageError(f"{name}: is a symlink to {os.readlink(path)}, which does not exist",
                         hint="create the folder it points to, remove the link, or give another folder")
    if st is None:
        try:
            path.mkdir(parents=True, mode=0o700)
            return path
        except FileExistsError:
            try:
                st = os.stat(path)  # made meanwhile by another rewheel: check it as any other
            except OSError as exc:
                raise UsageError(f"{name}: cannot be used: {exc.strerror or exc}", hint=hint) from None
        except OSError as exc:
            raise UsageError(f"{name}: cannot be created: {exc.strerror or exc}", hint=hint) from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{name}: is a file, not a folder", hint=hint)
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UsageError(f"{name}: is world-writable without the sticky bit (mode "
                         f"{stat.S_IMODE(st.st_mode):o}): any user could replace what rewheel "
                         "keeps there", hint="remove its write permission for others (chmod o-w) or "
                         "give a folder of your own; rewheel never changes the mode of a folder it "
                         "did not create")
    try:
        parent = os.stat(path.parent)
    except OSError:
        parent = None
    shared = parent is not None and parent.st_mode & (stat.S_IWOTH | stat.S_ISVTX) == stat.S_IWOTH | stat.S_ISVTX
    if shared and st.st_uid not in (os.geteuid(), 0):
        raise UsageError(f"{name}: belongs to uid {st.st_uid} and sits in {path.parent}, a folder "
                         "every user can write to: refusing to keep state there", hint=hint)
    return path


def refuse_home_inside(home: Path, prefix: Path, *, what: str) -> None:
    """The state folder never lies inside the environment it keeps snapshots of (nor is it
    the prefix): a snapshot's files would be written into the environment, and a restore
    or an upgrade would meet them there. Checked through symlinks, before anything is made
    (UsageError, exit 2, naming `what` and both folders)."""
    from rewheel.errors import UsageError

    real_prefix = os.path.realpath(prefix)
    # The folder as it will be: its deepest existing part resolved, the rest as written.
    real_home = os.path.realpath(home)
    for where in {os.path.normpath(os.path.abspath(home)), real_home}:
        if where == real_prefix or where.startswith(real_prefix.rstrip("/") + "/"):
            raise UsageError(f"{what} {home}: is inside the environment {prefix}: snapshots and run journals "
                             "would be written into the environment they protect",
                             hint="keep the state outside the environment (the default is "
                                  "~/.local/state/rewheel); nothing was changed")


def env_key(prefix: Path) -> str:
    real = str(Path(prefix).resolve())
    slug = re.sub(r"[^A-Za-z0-9]+", "-", real).strip("-")[-40:] or "root"
    return f"{slug}-{hashlib.sha256(real.encode()).hexdigest()[:10]}"


def env_dir(home: Path, prefix: Path) -> Path:
    """The environment's state folder, made (0700) where missing, never through a symlink
    (`owned.own_dir`: LinkInState, exit 3)."""
    from rewheel.owned import own_dir

    ensure_private_dir(home)
    d = own_dir(home, home / "envs" / env_key(prefix))
    info = d / "env.json"
    if not os.path.lexists(info):
        atomic_write(info, json.dumps({"prefix": str(Path(prefix).resolve())}) + "\n", durable=False)
    return d


def known_environments(home: Path) -> list[tuple[Path, Path]]:
    """(state folder, prefix) of every environment the home keeps state for, by folder name:
    the prefix its env.json names (a folder without a readable one is left out)."""
    out: list[tuple[Path, Path]] = []
    envs = home / "envs"
    if not envs.is_dir():
        return out
    for d in sorted(envs.iterdir()):
        try:
            prefix = json.loads((d / "env.json").read_text(encoding="utf-8"))["prefix"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(prefix, str) and prefix:
            out.append((d, Path(prefix)))
    return out


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data`: `os.write` may write less than asked (a signal, a full pipe, a
    quota, some filesystems at large sizes) and says how much in its return value."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def atomic_write(path: Path, data: str | bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Write a file so that a crash leaves either the old or the new content, durably
    (`durable=False`: no fsync — for a cache, where a crash may leave the old content, or on
    some filesystems an empty file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    raw = data.encode() if isinstance(data, str) else data
    # Never through a link at the temporary name; the rename replaces a link at `path`.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        try:
            write_all(fd, raw)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        # A full disk: the old content stays, and no half-written temporary file is left.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_base() -> Path:
    """Where the per-user lock folders live: `$REWHEEL_LOCK_DIR` (tests, containers; it must be
    the same for every rewheel on the machine), else the first of LOCK_BASES that is a sticky
    world-writable folder."""
    override = os.environ.get("REWHEEL_LOCK_DIR")
    if override:
        return Path(override).expanduser()
    for base in LOCK_BASES:
        try:
            st = os.stat(base)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_mode & (stat.S_ISVTX | stat.S_IWOTH) == stat.S_ISVTX | stat.S_IWOTH:
            return Path(base)
    return Path("/tmp")


def lock_owner(owner: int) -> int:
    """Whose lock folder a user takes the lock of an environment owned by `owner` in: the
    owner's for the owner and root, their own for anyone else."""
    me = os.geteuid()
    return owner if me in (0, owner) else me


def lock_file_of(prefix: Path) -> tuple[Path, Path]:
    """(the lock base, the environment's lock file below it), as `journal.EnvLock` names it;
    nothing is made. OSError when the prefix cannot be stat'ed."""
    st = os.stat(prefix)
    return lock_base(), lock_base() / f"rewheel-locks-{lock_owner(st.st_uid)}" / lock_name(st)


def lock_name(st: os.stat_result) -> str:
    """An environment's lock file, by its prefix's device and inode."""
    return f"env-{st.st_dev:x}-{st.st_ino}.lock"


def lock_dir(owner: int) -> Path:
    """`<base>/rewheel-locks-<uid>` for the environment's owner `owner`, so its owner and root
    share one lock: a folder (never a symlink) owned by that user, mode 0700, made so when
    missing. A user who is neither the owner nor root uses their own folder. A symlink there
    is LinkInState (exit 3, `owned`). Raises PermissionError naming the folder when it is not what it must be (someone else made it)."""
    me = os.geteuid()
    owner = lock_owner(owner)
    d = lock_base() / f"rewheel-locks-{owner}"
    try:
        os.mkdir(d, 0o700)
        if me != owner:
            os.chown(d, owner, -1)  # root, making it for the environment's owner
    except FileExistsError:
        pass
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode):
        from rewheel.owned import linked

        raise linked(d)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"lock folder {d} is not a folder: refusing to use it")
    if st.st_uid != owner:
        raise PermissionError(f"lock folder {d} belongs to uid {st.st_uid}, not {owner}: refusing to use it")
    if st.st_mode & 0o077:
        if me != owner:
            raise PermissionError(f"lock folder {d} is open to other users (mode "
                                  f"{stat.S_IMODE(st.st_mode):o}): refusing to use it")
        os.chmod(d, 0o700)
    return d
