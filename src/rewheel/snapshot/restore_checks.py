"""What a restore compares and refuses, shared by its lanes.

Owns: the plan of one folder (`Dir`: what it needs written, re-moded, removed, built), how a
live entry differs from its manifest entry (`entry_problem`, `same_file`), the checks that
refuse a damaged or tampered snapshot before anything changes (`check_tree`, `check_fields`,
`check_stored`), which lane owns which folders (`share_folders`), and the staging folders a
killed restore left (`remove_stale_staging`).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from dataclasses import dataclass, field

from rewheel.environment import Environment
from rewheel.errors import RestoreError, SnapshotDamaged
from rewheel.snapshot.manifest import Entry, Folder, Manifest, bad_entry
from rewheel.snapshot.store import SnapshotMeta
from rewheel.snapshot.tree import Root, hand_editable, kind_of, safe_rel, staging_folder


def raise_if_problems(env: Environment, snap: SnapshotMeta, problems: list[str]) -> None:
    if problems:
        raise RestoreError(
            f"environment {env.prefix} does not match snapshot {snap.id} after restore: "
            + "; ".join(problems[:10]) + (f" (+{len(problems) - 10} more)" if len(problems) > 10 else ""),
            hint=f"run `rewheel rollback --python {env.python} {snap.id} --yes` again; if it keeps failing, "
                 "recreate the environment by hand")


def entry_problem(e: Entry, st: os.stat_result, path: str) -> str | None:
    """How a live entry differs from its manifest entry, or None when it matches."""
    kind = kind_of(st.st_mode)
    if kind != e.kind:
        return f"type differs: {e.path}"
    if kind == "f" and not same_file(e, st):
        return f"content differs: {e.path}"
    if kind in ("f", "d") and stat.S_IMODE(st.st_mode) != e.mode:
        return f"mode differs: {e.path} ({oct(stat.S_IMODE(st.st_mode))} vs {oct(e.mode)})"
    if kind == "l" and os.readlink(path) != e.target:
        return f"symlink target differs: {e.path}"
    return None


def owned_now(roots: list[Root], env: Environment) -> set[str]:
    if all(r.whole for r in roots):
        return set()
    return {e.path for d in env.distributions() for e in d.record}


def is_private(e: Entry) -> bool:
    """A file the restore copies (or reflinks) even when the snapshot shares it by a hard
    link (one taken before `hand_editable` was the rule): the environment's copy of a file a
    person may edit never is the stored inode."""
    return e.kind == "f" and hand_editable(e.path.rpartition("/")[2], e.size)


def same_file(e: Entry, st: os.stat_result) -> bool:
    return (stat.S_ISREG(st.st_mode) and st.st_size == e.size and st.st_mtime_ns == e.mtime_ns)


DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NO_LINK = (errno.EXDEV, errno.EMLINK, errno.EPERM, errno.ENOTSUP)  # link(2) cannot: copy instead


def check_fields(snap: SnapshotMeta, e: Entry) -> None:
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


def check_stored(snap: SnapshotMeta, p: str, e: Entry, mtime_ns: int) -> os.stat_result:
    """The stored file at `p` (entry e's bytes), which must be a regular file of e's size
    with `mtime_ns` (e's own, or a private object's completion mark); SnapshotDamaged else."""
    try:
        st = os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):
        raise SnapshotDamaged(f"snapshot {snap.id}: stored file {e.path} is missing ({p})",
                              hint="restore another snapshot (`rewheel history TARGET` lists them)") from None
    if not stat.S_ISREG(st.st_mode) or st.st_size != e.size or st.st_mtime_ns != mtime_ns:
        raise SnapshotDamaged(
            f"snapshot {snap.id}: stored file {e.path} ({p}) was changed after the snapshot "
            f"(size {st.st_size} vs {e.size}, mtime differs: {st.st_mtime_ns != mtime_ns})",
            hint="the file was edited in place or the store was tampered with; restore another snapshot")
    return st


def remove_stale_staging(roots: list[Root]) -> None:
    """A restore killed mid-way leaves its staging folder at a root; the next restore (which
    finishes the job) removes it, so no trace of rewheel stays in the environment."""
    for r in roots:
        try:
            names = os.listdir(r.path)
        except OSError:
            continue
        for name in names:
            if staging_folder("", name, path=os.path.join(r.path, name)):
                shutil.rmtree(os.path.join(r.path, name), ignore_errors=True)


def check_tree(snap: SnapshotMeta, man: Manifest) -> None:
    """What a restore needs of the manifest's folders before it walks them.

    It only ever acts on paths joined from the folders' names, walking down from a root,
    so a folder is safe when its names are plain, unique names and it is itself a folder
    entry of its parent — `../../etc/evil` has no such chain. That costs a few operations
    per folder, none per entry; the fields of each entry the restore acts on are checked
    when it does (`check_fields`)."""
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
class Dir:
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
    remodes: set[str] = field(default_factory=set)  # paths of `retimes` whose mode is put back too

    @property
    def touched(self) -> bool:
        return bool(self.writes or self.extras or self.missing)

    @property
    def attrs_off(self) -> bool:
        e, st = self.entry, self.st
        return e is not None and st is not None and (stat.S_IMODE(st.st_mode) != e.mode or st.st_mtime_ns != e.mtime_ns)


EMPTY = Folder([], "", [], [], [], "", [], None)
