"""A snapshot's walk: every folder of the environment compared with the last snapshot's.

Owns: `CaptureWalk` — folder by folder, a folder in which nothing changed keeps the last
snapshot's columns as they are (one stat per entry, nothing read, linked or copied); in the
others, each changed file goes to `ingest.Ingest`; and the walk shared between two processes
for a large environment (the packages of site-packages split by the last snapshot's counts, or
RECORD's), the second sending its folders back through a pipe.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from typing import Any

from rewheel.environment import Environment
from rewheel.errors import SnapshotError, UsageError
from rewheel.snapshot.ingest import Aliased, Dists, Ingest, Previous
from rewheel.snapshot.lanes import fork_child, recv_msg, send_msg
from rewheel.snapshot.manifest import Folder
from rewheel.snapshot.objects import Objects
from rewheel.snapshot.store import SnapshotMeta, Store
from rewheel.snapshot.tree import Progress, exclusion, nested_prefix, scope_of, staging_folder, walk

_HOW = {"L": "link", "C": "copy", "R": "reflink"}
_ZERO32 = bytes(32)
# Below this many entries in the packages to share, one process walks them all (a fork costs more).
_LANES_MIN_ENTRIES = 4000
# What each lane counts, added up once the second has reported.
_WALK_COUNTS = ("files", "bytes_total", "unchanged", "entries", "bytes_linked", "n_linked")
_INGEST_COUNTS = ("n_copied", "bytes_copied", "n_reused", "bytes_reused", "n_private", "bytes_private", "n_taken",
                  "bytes_taken")


def _by_name(de: os.DirEntry[str]) -> str:
    return de.name


class CaptureWalk:
    """One pass over the environment that names each entry's bytes, folder by folder: the
    stat cache for files the last snapshot recorded as they are now, `Ingest` for the rest.
    A folder in which nothing changed keeps the last snapshot's columns as they are."""

    def __init__(self, env: Environment, store: Store, dists: Dists, exclude: tuple[str, ...],
                 objects: Objects | None, *, dry: bool = False, prev: SnapshotMeta | None = None,
                 take_over: bool = False) -> None:
        self.env, self.store, self.dists, self.exclude = env, store, dists, exclude
        self.roots = scope_of(env)
        self.prev = Previous(store, self.roots, prev)
        self.ingest = Ingest(objects, dists, Aliased(store, self.roots), dry=dry, take_over=take_over)
        self.folders: dict[tuple[int, str], Folder] = {}
        self.nested: list[str] = []
        self.files = self.bytes_total = self.unchanged = self.entries = 0
        self.bytes_linked = self.n_linked = 0
        self.codes: set[str] = set()
        self.dist_info_changed = self.prev.man is None
        self.dist_infos: set[tuple[int, str]] = set()
        self.excluded = exclusion(exclude)
        self.skip = str(store.home)
        self.progress: Progress | None = None

    def run(self, progress: Progress | None = None, *, lanes: int = 1) -> None:
        """The whole walk. `lanes=2`: the packages of site-packages are shared out between this
        process and a forked one (balanced by the last snapshot's entries, or by RECORD's),
        each walking and storing its own; the other sends its folders back. The work is system
        calls (stats, links, copies), which a second process makes on a second CPU."""
        self.progress = progress
        split = self._split() if lanes == 2 else None
        if split is None:
            self._lane(None)
        else:
            self._two_lanes(split)
        if self.dist_infos != set(self.prev.dist_infos()):  # a .dist-info folder came or went
            self.dist_info_changed = True

    def _lane(self, split: tuple[int, str, frozenset[str]] | None, lane: int = 0) -> None:
        """Walk what lane `lane` owns: with `split` (root, site-packages, the names of its
        packages lane 1 owns), lane 1 takes those packages' folders, lane 0 everything else."""
        for ri, root in enumerate(self.roots):
            if lane == 1:
                if split is not None and ri == split[0]:
                    base = f"{root.path.rstrip('/')}/{split[1]}" if split[1] else root.path.rstrip("/")
                    prefix = f"{split[1]}/" if split[1] else ""
                    stack = [(prefix + n, f"{base}/{n}") for n in sorted(split[2], reverse=True)]
                    while stack:
                        rel, path = stack.pop()
                        stack.extend(reversed(self._folder(ri, rel, path)))
                continue
            if not root.whole:
                self._listed(ri)
                continue
            stack = [("", root.path)]
            while stack:
                rel, path = stack.pop()
                subdirs = self._folder(ri, rel, path)
                if split is not None and (ri, rel) == split[:2]:
                    mine = len(split[1]) + 1 if split[1] else 0
                    subdirs = [d for d in subdirs if d[0][mine:] not in split[2]]
                stack.extend(reversed(subdirs))

    def _split(self) -> tuple[int, str, frozenset[str]] | None:
        """Where the second lane's share is: packages (folders) of the environment's
        site-packages making about half its entries, by the last snapshot's count (else by
        RECORD's); None when there is nothing worth sharing."""
        if not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2:
            return None
        best: tuple[int, str] | None = None
        for site in self.env.site_dirs:
            real = os.path.realpath(site)
            for ri, r in enumerate(self.roots):
                base = os.path.realpath(r.path).rstrip("/")
                if r.whole and (real == base or real.startswith(base + "/")):
                    best = best or (ri, real[len(base) + 1:] if real != base else "")
                    break
        if best is None:
            return None
        ri, site_rel = best
        site_path = f"{self.roots[ri].path.rstrip('/')}/{site_rel}" if site_rel else self.roots[ri].path
        weight: dict[str, int] = {}
        if self.prev.man is not None:
            prefix = f"{site_rel}/" if site_rel else ""
            for (fri, rel), f in self.prev.man.folders.items():
                if fri == ri and rel.startswith(prefix) and len(rel) > len(prefix):
                    top = rel[len(prefix):].partition("/")[0]
                    weight[top] = weight.get(top, 0) + len(f.names)
        else:
            real_site = os.path.realpath(site_path).rstrip("/") + "/"
            for path in self.dists.records:
                if path.startswith(real_site):
                    top, _, below = path[len(real_site):].partition("/")
                    if below:
                        weight[top] = weight.get(top, 0) + 1
        try:
            with os.scandir(site_path) as it:
                dirs = [de.name for de in it if de.is_dir(follow_symlinks=False) and de.path != self.skip]
        except OSError:
            return None
        total = sum(weight.get(d, 0) for d in dirs)
        if total < _LANES_MIN_ENTRIES:
            return None
        share: list[str] = []
        load = 0
        for d in sorted(dirs, key=lambda n: -weight.get(n, 0)):
            if load + weight.get(d, 0) <= total // 2:
                share.append(d)
                load += weight.get(d, 0)
        # A name `exclude` or another environment takes out is the first lane's to leave out.
        prefix = f"{site_rel}/" if site_rel else ""
        share = [d for d in share if not (self.excluded is not None and ri == 0 and self.excluded(prefix + d))
                 and not nested_prefix(f"{site_path}/{d}", prefix + d, self.roots[ri].path)]
        return (ri, site_rel, frozenset(share)) if share else None

    def _two_lanes(self, split: tuple[int, str, frozenset[str]]) -> None:
        rfd, wfd = os.pipe()

        def body() -> None:
            os.close(rfd)
            try:
                self._lane(split, 1)
                msg: tuple[Any, ...] = ("done", self._export())
            except BaseException as exc:  # noqa: BLE001 - reported to the first lane, which raises it
                msg = ("failed", type(exc).__name__, getattr(exc, "message", str(exc)), getattr(exc, "hint", None),
                       getattr(exc, "errno", None), getattr(exc, "filename", None))
            send_msg(wfd, msg)

        pid = fork_child(body)
        os.close(wfd)
        try:
            try:
                self._lane(split, 0)
            finally:
                try:
                    msg = recv_msg(rfd)
                except (EOFError, OSError, ValueError) as exc:
                    msg = ("failed", "RuntimeError", f"the snapshot's second process ended without reporting ({exc})",
                           None, None, None)
        finally:
            os.close(rfd)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        if msg[0] != "done":
            _, name, message, hint, err, filename = msg
            if err is not None:
                raise OSError(err, message, filename)
            if name == "UsageError":
                raise UsageError(message, hint=hint)
            raise SnapshotError(f"the snapshot's second process failed: {name}: {message}", hint=hint or "")
        self._merge(msg[1])

    def _export(self) -> dict[str, Any]:
        """This lane's result, for the pipe: a folder the last snapshot holds as it is goes
        by its name alone."""
        prev = self.prev.man.folders if self.prev.man is not None else {}
        folders: list[tuple[int, str, Any]] = []
        for (ri, rel), f in self.folders.items():
            if prev.get((ri, rel)) is f:
                folders.append((ri, rel, None))
            else:
                folders.append((ri, rel, (list(f.names), f.types, list(f.modes), list(f.sizes), list(f.mtimes),
                                          f.stored, list(f.inos), list(f.ctimes or ()), f.sha_bytes(), f.targets)))
        ing = self.ingest
        return {"folders": folders, "nested": self.nested, "dist_infos": sorted(self.dist_infos),
                "can_link": self.ingest.can_link, "taken": ing.taken,
                "dist_info_changed": self.dist_info_changed, "codes": sorted(self.codes),
                "walk": [getattr(self, k) for k in _WALK_COUNTS],
                "ingest": [getattr(ing, k) for k in _INGEST_COUNTS]}

    def _merge(self, got: dict[str, Any]) -> None:
        prev = self.prev.man.folders if self.prev.man is not None else {}
        for ri, rel, cols in got["folders"]:
            if cols is None:
                self.folders[(ri, rel)] = prev[(ri, rel)]
            else:
                names, types, modes, sizes, mtimes, stored, inos, ctimes, shab, targets = cols
                self.folders[(ri, rel)] = Folder(names, types, modes, sizes, mtimes, stored, inos, None, ctimes, shab,
                                                 targets)
        self.nested += got["nested"]
        self.dist_infos.update(tuple(k) for k in got["dist_infos"])
        self.dist_info_changed = self.dist_info_changed or got["dist_info_changed"]
        self.codes.update(got["codes"])
        ing = self.ingest
        ing.can_link = ing.can_link and got["can_link"]
        ing.taken.extend(tuple(t) for t in got["taken"])
        for k, n in zip(_WALK_COUNTS, got["walk"], strict=True):
            setattr(self, k, getattr(self, k) + n)
        for k, n in zip(_INGEST_COUNTS, got["ingest"], strict=True):
            setattr(ing, k, getattr(ing, k) + n)

    def _folder(self, ri: int, rel: str, path: str) -> list[tuple[str, str]]:
        """Take folder `rel` (at `path`); returns its subfolders to take next, (rel, path)."""
        try:
            with os.scandir(path) as it:
                listing = {de.name: de for de in it}
        except (FileNotFoundError, NotADirectoryError):
            return []
        pf = self.prev.folder(ri, rel)
        if pf is not None and pf.ctimes is not None and pf.shab is not None:
            subdirs = self._unchanged(ri, rel, pf, listing)
            if subdirs is not None:
                return subdirs
        return self._changed(ri, rel, path, pf, sorted(listing.values(), key=_by_name))

    def _unchanged(self, ri: int, rel: str, pf: Folder, listing: dict[str, os.DirEntry[str]]
                   ) -> list[tuple[str, str]] | None:
        """When every entry of the folder is as the last snapshot recorded it (files: inode,
        size, mtime, ctime, mode; folders: mtime, mode; symlinks: target), its columns are
        taken as they are: its subfolders, to take next. None at the first difference."""
        names, types = pf.names, pf.types
        extra = len(listing) - len(names)
        if extra < 0:
            return None
        if extra:  # only names no snapshot holds may be left over (a staging folder, the store)
            prefix = f"{rel}/" if rel else ""
            root_path = self.roots[ri].path
            left = [n for n in listing.keys() - pf.index.keys()
                    if not (staging_folder(rel, n, listing[n]) or listing[n].path == self.skip
                            or (self.excluded is not None and ri == 0 and self.excluded(prefix + n))
                            or (listing[n].is_dir(follow_symlinks=False)
                                and nested_prefix(listing[n].path, prefix + n, root_path)))]
            if left:
                return None
        modes, sizes, mtimes, inos, ctimes, stored = pf.modes, pf.sizes, pf.mtimes, pf.inos, pf.ctimes, pf.stored
        assert ctimes is not None
        subdirs: list[tuple[str, str]] = []
        prefix = f"{rel}/" if rel else ""
        files = total = linked = linked_bytes = 0
        for k, name in enumerate(names):
            de = listing.get(name)
            if de is None:
                return None
            st = de.stat(follow_symlinks=False)
            m = st.st_mode
            kind = types[k]
            if kind == "f":
                if not (ctimes[k] == st.st_ctime_ns and inos[k] == st.st_ino and sizes[k] == st.st_size
                        and mtimes[k] == st.st_mtime_ns and m & 0o170000 == 0o100000 and modes[k] == m & 0o7777):
                    return None
                files += 1
                total += sizes[k]
                if stored[k] == "L":
                    linked += 1
                    linked_bytes += sizes[k]
            elif kind == "d":
                # A folder whose mtime is the same has had no entry added since: it cannot have
                # become another environment (a pyvenv.cfg or conda-meta in it) meanwhile.
                if not (m & 0o170000 == 0o040000 and mtimes[k] == st.st_mtime_ns and modes[k] == m & 0o7777):
                    return None
                subdirs.append((prefix + name, de.path))
            elif kind == "l":
                if not (m & 0o170000 == 0o120000 and modes[k] == m & 0o7777
                        and pf.link_targets()[k] == os.readlink(de.path)):
                    return None
            elif m & 0o170000 in (0o100000, 0o040000, 0o120000) or modes[k] != m & 0o7777:
                return None
        self.files += files
        self.bytes_total += total
        self.unchanged += files
        self.n_linked += linked
        self.bytes_linked += linked_bytes
        self.codes.update(c for c in set(stored) if c != "-")
        self.entries += len(names)
        if self.progress is not None:
            self.progress("snapshot", self.entries, 0)
        if rel.endswith(".dist-info"):
            self.dist_infos.add((ri, rel))
        self.folders[(ri, rel)] = pf
        return subdirs

    def _changed(self, ri: int, rel: str, path: str, pf: Folder | None, ents: list[os.DirEntry[str]]
                 ) -> list[tuple[str, str]]:
        """A folder in which something changed (or that the last snapshot lacks): entry by
        entry, unchanged files still taken from the last snapshot."""
        prefix = f"{rel}/" if rel else ""
        p_names = pf.names if pf is not None else []
        p_shab = pf.sha_bytes() if pf is not None and pf.ctimes is not None else b""
        same = pf is not None and pf.ctimes is not None
        names: list[str] = []
        types: list[str] = []
        modes: list[int] = []
        sizes: list[int] = []
        mtimes: list[int] = []
        stored: list[str] = []
        inos: list[int | None] = []
        ctimes: list[int] = []
        shab: list[bytes] = []
        targets: list[str | None] | None = None
        subdirs: list[tuple[str, str]] = []
        ingest, excluded, mode_of = self.ingest, self.excluded, stat.S_IMODE
        root_path = self.roots[ri].path
        for de in ents:
            name = de.name
            if de.path == self.skip or staging_folder(rel, name, de):
                continue
            if excluded is not None and ri == 0 and excluded(prefix + name):
                continue
            st = de.stat(follow_symlinks=False)
            m = st.st_mode
            mode = mode_of(m)
            i = len(names)
            j: int | None = i if same and i < len(p_names) and p_names[i] == name else None
            if j is None and pf is not None:
                same = False
                j = pf.index.get(name)
            if stat.S_ISREG(m):
                size = st.st_size
                self.files += 1
                self.bytes_total += size
                if (j is not None and pf is not None and pf.ctimes is not None and pf.types[j] == "f"
                        and pf.ctimes[j] == st.st_ctime_ns and pf.inos[j] == st.st_ino and pf.sizes[j] == size
                        and pf.mtimes[j] == st.st_mtime_ns and pf.modes[j] == mode and pf.stored[j] != "-"
                        and p_shab[32 * j:32 * j + 32] != _ZERO32):
                    code, digest, ino, ctime = pf.stored[j], p_shab[32 * j:32 * j + 32], st.st_ino, st.st_ctime_ns
                    self.unchanged += 1
                else:
                    same = False
                    sha, code, ino, ctime = ingest.store(ri, prefix + name, de.path, st)
                    digest = bytes.fromhex(sha) if sha else _ZERO32
                if code == "L":
                    self.n_linked += 1
                    self.bytes_linked += size
                self.codes.add(code)
                kind, target = "f", None
            else:
                size = 0
                code, digest, ino, ctime, target = "-", _ZERO32, None, 0, None
                if stat.S_ISDIR(m):
                    if nested_prefix(de.path, prefix + name, root_path):
                        self.nested.append(de.path)
                        same = False
                        continue
                    kind = "d"
                    subdirs.append((prefix + name, de.path))
                    if same and j is not None and pf is not None and (pf.types[j] != "d" or pf.mtimes[j] != st.st_mtime_ns):
                        same = False
                elif stat.S_ISLNK(m):
                    kind, target = "l", os.readlink(de.path)
                    if targets is None:
                        targets = [None] * i
                    if same and j is not None and pf is not None and (
                            pf.types[j] != "l" or pf.link_targets()[j] != target):
                        same = False
                else:
                    kind = "o"
                    if same and j is not None and pf is not None and pf.types[j] != "o":
                        same = False
                if same and j is not None and pf is not None and pf.modes[j] != mode:
                    same = False
            names.append(name)
            types.append(kind)
            modes.append(mode)
            sizes.append(size)
            mtimes.append(st.st_mtime_ns if kind in "fd" else 0)
            stored.append(code)
            inos.append(ino)
            ctimes.append(ctime)
            shab.append(digest)
            if targets is not None:
                targets.append(target)
        self.entries += len(names)
        if self.progress is not None:
            self.progress("snapshot", self.entries, 0)
        key = (ri, rel)
        in_dist_info = ".dist-info" in rel
        if rel.endswith(".dist-info"):
            self.dist_infos.add(key)
        if same and pf is not None and len(names) == len(p_names):
            self.folders[key] = pf  # nothing in it changed: the last snapshot's columns, as they are
        else:
            self.dist_info_changed = self.dist_info_changed or in_dist_info
            self.folders[key] = Folder(names, "".join(types), modes, sizes, mtimes, "".join(stored), inos, None,
                                       ctimes, b"".join(shab), targets)
        return subdirs

    def _listed(self, ri: int) -> None:
        """A root of which only RECORD-listed files are the environment's (a system
        interpreter's scripts folder): those files, one by one."""
        entries: list[list[Any]] = []
        base = self.roots[ri].path.rstrip("/") + "/"
        for _, rel, st in walk([self.roots[ri]], self.dists.records, {self.skip}, None, None):
            if not stat.S_ISREG(st.st_mode):
                continue
            self.files += 1
            self.bytes_total += st.st_size
            self.dist_info_changed = True
            sha, code, ino, ctime = self.ingest.store(ri, rel, base + rel, st)
            if code == "L":
                self.n_linked += 1
                self.bytes_linked += st.st_size
            self.codes.add(code)
            entries.append([ri, rel, "f", stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, sha, _HOW[code], None,
                            ino, ctime])
        by: dict[str, list[list[Any]]] = {}
        for e in entries:
            by.setdefault(e[1].rpartition("/")[0], []).append(e)
        for folder, es in by.items():
            self.folders[(ri, folder)] = Folder.of(es)
        self.entries += len(entries)

    def distributions(self) -> tuple[dict[str, str], list[dict[str, Any]]]:
        """(versions, distributions) for meta.json: the previous snapshot's when no
        `.dist-info` folder changed since (each file in them unchanged), else read now."""
        prev = self.prev.meta
        if prev is not None and not self.dist_info_changed and not self.dists.given:
            return dict(prev.versions), list(prev.distributions)
        dists = self.dists.dists
        return {d.name: d.version_text for d in dists}, [d.to_json() for d in dists]

    @property
    def link_mode(self) -> str:
        return "+".join(sorted({"L": "hardlink", "C": "copy", "R": "reflink"}[c] for c in self.codes)) or "none"


def unchanged_since(env: Environment, store: Store, snap: SnapshotMeta) -> bool | None:
    """Whether every entry of the environment is as snapshot `snap` recorded it — each file's
    inode, size, mtime, ctime and mode, each folder's names, mtime and mode, each symlink's
    target: one stat walk, which stops at the first difference. What a command that took a
    snapshot while its service served checks once the service is stopped. None when the
    snapshot records no live ctimes (taken by an older rewheel): the caller compares as
    `verify` does instead."""
    w = CaptureWalk(env, store, Dists(env, None), (), None, dry=True, prev=snap)
    man = w.prev.man
    if man is None or any(f.ctimes is None for f in man.folders.values() if "f" in f.types):
        return None
    w.excluded = exclusion(man.exclude)  # what it left out, and the store's home, are no difference
    if not all(r.whole for r in w.roots):
        return None
    seen = 0
    for ri, root in enumerate(w.roots):
        stack = [("", root.path)]
        while stack:
            rel, path = stack.pop()
            pf = man.folders.get((ri, rel))
            try:
                with os.scandir(path) as it:
                    listing = {de.name: de for de in it}
            except OSError:
                return False
            if pf is None:
                return False
            subdirs = w._unchanged(ri, rel, pf, listing)
            if subdirs is None:
                return False
            seen += 1
            stack.extend(reversed(subdirs))
    return seen == len(man.folders)
