"""The package folders a patch scan walks (`rewheel.patches`): the top-level folders under
site-packages that hold the target distributions' files, walked once. Every RECORD-listed
file met is lstat'ed and, where size and mtime prove it is what its wheel installed, proven
on the spot; every other file is a candidate `unlisted` patch.

A large walk is shared with a forked second process (`rewheel.halves`): the folders are
split in two by how many files their RECORDs list, and the other process sends back what it
proved and met. The result is the one a single walk finds, whatever the other process does.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from typing import Any, cast

from rewheel.environment import Distribution, RecordEntry
from rewheel.halves import share, worth_sharing
from rewheel.texts import INSTALLER_FILES

# Listing a folder through an open descriptor lets each file be stat'ed relative to it
# (fstatat): no path lookup from the root per file, which is most of what an lstat costs.
_FD_WALK = os.scandir in os.supports_fd and hasattr(os, "O_DIRECTORY")
BYTECODE = (".pyc", ".pyo")
# From this many listed files on, half the folders are walked by a second process (a vLLM
# environment lists ~57,000); below it, the fork costs more than it saves.
SHARE_MIN_FILES = 4000
# How long, at least, the second process's answer is waited for once this one's half is done.
SHARE_WAIT_MIN_S = 10.0

Walked = tuple[int, list[tuple[str, os.stat_result, str]]]


class PackageFolders:
    """The target distributions' top-level package folders (`tops`: folder -> the first
    distribution listing a file in it) and how many files their RECORDs list in each."""

    def __init__(self, targets: list[Distribution]) -> None:
        self.tops: dict[str, Distribution] = {}
        self.listed_in: Counter[str] = Counter()
        self.packaged: list[Distribution] = []
        for dist in targets:
            if not dist.record or (dist.direct_url or {}).get("dir_info", {}).get("editable"):
                continue
            self.packaged.append(dist)
            site = str(dist.site).rstrip("/") + "/"
            n = len(site)
            names = Counter(p[n:p.find("/", n)] for e in dist.record
                            if (p := e.path).startswith(site) and p.find("/", n) > n)
            for top, count in names.items():
                if top.endswith((".dist-info", ".data")) or top == "__pycache__":
                    continue
                self.tops.setdefault(site + top, dist)
                self.listed_in[site + top] += count
        self._dir_owner: dict[str, Distribution] | None = None

    def walk(self, listed: dict[str, RecordEntry], owner: dict[str, Distribution],
             seen: dict[str, os.stat_result], proven: set[str] | None) -> Walked:
        """(files walked, [(path, lstat, top) of regular files no RECORD lists]).

        A listed file the fast path proves (a regular file, its RECORD's size, older than
        its distribution's install; nothing `is_install_artifact` could skip) goes into
        `proven` (None: prove nothing), any other into `seen` with its lstat."""
        tops = sorted(self.tops)
        mine, theirs = self.halves(tops)
        if proven is None or not theirs or not worth_sharing(sum(self.listed_in.values()), SHARE_MIN_FILES):
            return _walk(tops, listed, owner, seen, proven)
        done: list[Walked] = []

        def other_half() -> tuple[Any, ...]:
            their_seen: dict[str, os.stat_result] = {}
            their_proven: set[str] = set()
            walked, extra = _walk(theirs, listed, owner, their_seen, their_proven)
            return (walked, [(p, _portable(st), top) for p, st, top in extra],
                    [(p, _portable(st)) for p, st in their_seen.items()], list(their_proven))

        got = share(lambda: done.append(_walk(mine, listed, owner, seen, proven)), other_half,
                    wait_min=SHARE_WAIT_MIN_S)
        walked, extra = done[0]
        if got is None:  # the other process did not deliver: its half is walked here
            more = _walk(theirs, listed, owner, seen, proven)
            return walked + more[0], extra + more[1]
        their_walked, their_extra, their_seen, their_proven = got
        seen.update((p, os.stat_result(*st)) for p, st in their_seen)
        proven.update(their_proven)
        return walked + their_walked, extra + [(p, os.stat_result(*st), top) for p, st, top in their_extra]

    def halves(self, tops: list[str]) -> tuple[list[str], list[str]]:
        """The folders in two groups that list about as many files each (the largest first,
        each into the lighter group), each group in `tops` order."""
        load = [0, 0]
        side: dict[str, int] = {}
        for top in sorted(tops, key=lambda t: -self.listed_in[t]):
            i = 0 if load[0] <= load[1] else 1
            side[top] = i
            load[i] += self.listed_in[top]
        return [t for t in tops if side[t] == 0], [t for t in tops if side[t] == 1]

    def owner_of(self, path: str, top: str) -> Distribution:
        """The distribution a file no RECORD lists belongs with: the nearest folder above it
        that holds a RECORD-listed file, else its top-level folder's."""
        if self._dir_owner is None:  # only once such a file turns up
            self._dir_owner = {}
            for dist in self.packaged:
                for e in dist.record:
                    self._dir_owner.setdefault(os.path.dirname(e.path), dist)
        up = os.path.dirname(path)
        while len(up) >= len(top):
            if up in self._dir_owner:
                return self._dir_owner[up]
            up = os.path.dirname(up)
        return self.tops[top]


def _portable(st: os.stat_result) -> tuple[Any, ...]:
    """An lstat as `marshal` carries it (`os.stat_result(*_portable(st)) == st`)."""
    return cast(tuple[Any, ...], st.__reduce__())[1]


def _walk(tops: list[str], listed: dict[str, RecordEntry], owner: dict[str, Distribution],
          seen: dict[str, os.stat_result], proven: set[str] | None) -> Walked:
    """`PackageFolders.walk` of these folders, in this process."""
    walked = 0
    extra: list[tuple[str, os.stat_result, str]] = []
    get = listed.get
    S_ISREG = stat.S_ISREG
    prove = proven.add if proven is not None else None
    for top in tops:
        stack = [top]
        while stack:
            d = stack.pop()
            base = d + "/"
            fd = None
            try:
                if _FD_WALK:
                    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
                it = os.scandir(d if fd is None else fd)
            except OSError:
                if fd is not None:
                    os.close(fd)
                continue
            try:
                with it:
                    entries = list(it)
                walked += len(entries)
                for de in entries:
                    name = de.name
                    full = base + name
                    e = get(full)
                    if e is not None:
                        try:
                            st = de.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        if (prove is not None and e.size == st.st_size and e.hash
                                and S_ISREG(st.st_mode)
                                and st.st_mtime_ns < owner[full].install_time_ns
                                and not name.endswith(BYTECODE) and name not in INSTALLER_FILES):
                            prove(full)
                        else:
                            seen[full] = st
                        continue
                    if de.is_dir(follow_symlinks=False):
                        walked -= 1
                        if name != "__pycache__":
                            stack.append(full)
                        continue
                    if name.endswith(BYTECODE):
                        continue
                    try:
                        st = de.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if S_ISREG(st.st_mode):
                        extra.append((full, st, top))
            finally:
                if fd is not None:
                    os.close(fd)
    return walked, extra
