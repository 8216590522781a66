"""rewheel's own folders: nothing it writes under a base it trusts ever leaves through a link.

The bases are the places a person names: the state home (`REWHEEL_HOME`, a recipe's
`[snapshots] store`) and the lock folders' base (`REWHEEL_LOCK_DIR`, else /run/lock or /tmp).
A base is trusted as given — a home that is a symlink to a bigger disk is the person's choice
— but below it every folder and file is rewheel's own, and rewheel never makes a link there
(but the `pythonpath/rewheel` link of a smoke test, which it replaces when it points elsewhere).
A symlink where one of them is expected — made by hand, by a tool, by a backup restored over
the store — is refused (`LinkInState`, exit 3, naming the link) before the command writes
anything; a link where a file is about to be replaced by a rename is replaced, never followed.

Owns: `refuse_links` (each component below a base, by lstat), `own_dir` (make a folder below
a base, component by component, never through a link), `private_dir` (a folder of the home's,
`ci/`, `bisect/`, `throwaway/`), and the checks every command on an environment makes where
it opens its target (`commands.open_target`, the store's opening): `check_state` (its state
folder, to every depth but the environment's own entries a snapshot keeps and older runs,
and the home's folders) and `check_lock` (its lock folder and lock file).

Checked by lstat from the base down rather than by descriptors (openat with O_NOFOLLOW, as
`snapshot.objects` does for the objects): what rewheel writes there is mostly written by
path — by uv (`--output-file`, its logs), by a smoke test's log, by `shutil` — which no
descriptor can be handed to, and a check before the first write lets a command refuse
having changed nothing, where a descriptor walk would meet the link at its write, midway.
The folders are private to their owner (0700): a link there is one left in place, not one
raced in by another user between the check and the write.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rewheel.errors import LinkInState

# Below an environment's state folder, folders whose entries are not rewheel's own but the
# environment's (a snapshot's `tree/` of an older layout, its stashed `[cleanup]` paths: an
# environment holds symlinks), a throwaway environment's (`work/` of a prepare), or the
# smoke test's link to rewheel (`pythonpath/`); and the objects' folders, whose files are
# opened relative to a folder opened without following a link (`snapshot.objects`) and read
# by lstat. Each of these folders is checked itself (a link there is refused); what is inside
# is not walked.
_NOT_WALKED = {("snapshots", "*", "tree"), ("snapshots", "*", "cleanup"), ("objects", "*"),
               ("prepared.new", "work"), ("prepared", "work"), ("*", "*", "pythonpath"), ("smoke", "pythonpath")}
# Runs: every run's folder is checked itself, but only the newest few are walked. A run writes
# in its own folder, made anew; after it only an interrupted run's folder is written in (by
# `resume`, `rollback`), and that is the newest run: every command refuses to start another
# while it waits. A home keeps hundreds of finished runs, read only (their journals opened
# without following a link), and walking each would cost every command tens of milliseconds.
RECENT_RUNS = 3
# The home's folders besides `envs/`: checked themselves (and `trash/`'s entries, which a
# restore sweeps); their contents belong to the command that writes them (`own_dir`).
HOME_FOLDERS = ("envs", "trash", "crashes", "ci", "bisect", "throwaway")


def linked(path: Path) -> LinkInState:
    try:
        to = os.readlink(path)
    except OSError:
        to = "?"
    return LinkInState(path, to)


def refuse_links(base: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """`path`, once no component of it below `base` is a symlink (LinkInState, exit 3,
    naming the first that is). A component that does not exist ends the check: what is
    below it does not exist either, and is made by the caller (`own_dir`). `base` itself is
    not checked: the person chose it. ValueError when `path` is not below `base`."""
    base, path = Path(base), Path(path)
    rel = path.relative_to(base)  # ValueError: not below the base
    at = base
    for part in rel.parts:
        at = at / part
        try:
            st = os.lstat(at)
        except FileNotFoundError:
            return path
        except NotADirectoryError:  # a file where a folder is expected: the write fails itself
            return path
        if stat.S_ISLNK(st.st_mode):
            raise linked(at)
    return path


def own_dir(base: str | os.PathLike[str], path: str | os.PathLike[str], *, mode: int = 0o700) -> Path:
    """The folder `path` below `base`, made (each missing component, `mode`) where it is
    missing — never through a symlink: a link at any component below `base` is refused
    (LinkInState, exit 3) before anything is made. mkdir(2) does not follow a link where it
    makes a name, so a link planted between the check and the mkdir fails it (FileExistsError)."""
    base, path = Path(base), Path(path)
    refuse_links(base, path)
    at = base
    for part in path.relative_to(base).parts:
        at = at / part
        try:
            os.mkdir(at, mode)
        except FileExistsError:
            if os.path.islink(at):
                raise linked(at) from None
    return path


def private_dir(path: str | os.PathLike[str]) -> Path:
    """`paths.ensure_private_dir(path)` — and where `path` lies below the state home (`ci/`,
    `bisect/`, `throwaway/`), made component by component, never through a link (`own_dir`)."""
    from rewheel.paths import ensure_private_dir, state_home

    path, home = Path(path), state_home()
    if home in path.parents:
        own_dir(ensure_private_dir(home), path)
    return ensure_private_dir(path)  # and what it refuses of a folder that exists


def check_state(home: str | os.PathLike[str], env_dir: str | os.PathLike[str] | None = None) -> None:
    """What every command on an environment checks before it writes anything: no symlink in
    the home's own folders (`HOME_FOLDERS`, and the entries of `trash/`) nor anywhere in the
    environment's state folder `env_dir` (snapshots and their files, runs (the newest
    `RECENT_RUNS` walked) and their journals and logs, objects' folders, the resolution, a prepared upgrade, the service's records), but
    inside the folders that keep the environment's own entries (`_NOT_WALKED`). LinkInState
    (exit 3) naming the first link found. Folders that do not exist yet are fine. One
    `scandir` per folder: the kind of each entry comes with the listing, no stat per entry."""
    home = Path(home)
    for name in HOME_FOLDERS:
        refuse_links(home, home / name)
    _entries(home / "trash")
    if env_dir is not None:
        refuse_links(home, env_dir)
        _walk(Path(env_dir), ())


def check_lock(prefix: str | os.PathLike[str]) -> None:
    """The environment's lock folder and lock file below the lock base (`paths.lock_file_of`):
    no symlink (LinkInState, exit 3) — checked when a command opens its target, so that a
    read-only command refuses before it reports rather than where it reads the lock's holder."""
    from rewheel.paths import lock_file_of

    try:
        base, path = lock_file_of(Path(prefix))
    except OSError:  # no prefix: the command refuses it itself
        return
    refuse_links(base, path)


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    """The entries of `folder` (none when it does not exist), a symlink among them refused."""
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []
    for e in entries:
        if e.is_symlink():
            raise linked(Path(e.path))
    return entries


def _walked(rel: tuple[str, ...]) -> bool:
    if rel[-1] == "pythonpath":  # a smoke test's link to rewheel, wherever its log folder is
        return False
    return not any(len(rel) == len(p) and all(a == b or b == "*" for a, b in zip(rel, p, strict=True))
                   for p in _NOT_WALKED)


def _walk(folder: Path, rel: tuple[str, ...]) -> None:
    entries = _entries(folder)
    if rel == ("runs",):  # run ids sort by their start time
        entries = sorted(entries, key=lambda e: e.name)[-RECENT_RUNS:]
    for e in entries:
        if e.is_dir(follow_symlinks=False) and _walked((*rel, e.name)):
            _walk(Path(e.path), (*rel, e.name))
