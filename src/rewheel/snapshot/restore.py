"""Restoring a snapshot byte for byte, and verifying an environment against one.

Owns: `restore_snapshot` and its two halves for a caller that prepares before it stops a
service (`prepare_restore` → `PreparedRestore.commit`), `RestoreResult`, and `verify`. A
restore runs in one or two lanes (`lanes`: a forked peer), each a
`restore_apply.LaneRestore` over its share of the folders: compare (`restore_scan`), check
and stage, commit, verify. What it moved out goes to the store's trash (`trash`).
"""

from __future__ import annotations

import gc
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rewheel.environment import Environment
from rewheel.errors import RestoreError
from rewheel.snapshot.lanes import LaneWork, Peer, auto_lanes
from rewheel.snapshot.manifest import Manifest, ManifestDamaged, bad_entry, match_roots
from rewheel.snapshot.proof import SameBytes
from rewheel.snapshot.restore_apply import LaneRestore
from rewheel.snapshot.restore_checks import entry_problem, owned_now, raise_if_problems, remove_stale_staging
from rewheel.snapshot.store import Found, SnapshotMeta, save_aliases
from rewheel.snapshot import privatize
from rewheel.snapshot.trash import TRASH, TRASH_STALE_S, discard_displaced, remove_displaced
from rewheel.snapshot.tree import Progress, Root, exclusion, kind_of, scope_of, walk

__all__ = ["TRASH", "TRASH_STALE_S", "PreparedRestore", "RestoreResult", "discard_displaced", "prepare_restore",
           "remove_displaced", "restore_snapshot", "verify"]


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
    # Of `written`: files put back as the very inode the environment had, from uv's cache
    # (`cachelinks`), instead of a copy of the snapshot's bytes.
    from_cache: int = 0
    # Of `seconds`: the commit, sync and verification alone (a caller that prepared the
    # restore before it stopped a service has only this in its downtime).
    commit_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot_id, "written": self.written, "deleted": self.deleted,
                "chmodded": self.chmodded, "unchanged": self.unchanged, "verified": self.verified,
                "seconds": round(self.seconds, 3), "cleanup_restored": self.cleanup_restored,
                "folders_rebuilt": self.folders_rebuilt, "removal_seconds": round(self.removal_seconds, 3),
                "lanes": self.lanes, "proven_same": self.proven_same, "unshared": self.unshared,
                "from_cache": self.from_cache, "commit_seconds": round(self.commit_seconds, 3)}


def restore_snapshot(env: Environment, snap: SnapshotMeta, *, progress: Progress | None = None,
                     full_verify: bool = False, defer_removal: bool = False,
                     lanes: int | None = None) -> RestoreResult:
    """Make the environment's files exactly the snapshot's, then verify. Offline; no uv.

    Cost: one listing of the environment, a stat of each file that may be unchanged (a
    shared file found at another inode needs none), and work in proportion to what
    changed: a link and an unlink per replaced file (a copy for a file people may edit,
    unless uv's cache still holds the very inode it was). Folders that must go (a failed
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
    return prepare_restore(env, snap, progress=progress, lanes=lanes).commit(full_verify=full_verify,
                                                                              defer_removal=defer_removal)


def prepare_restore(env: Environment, snap: SnapshotMeta, *, progress: Progress | None = None,
                    lanes: int | None = None) -> PreparedRestore:
    """The first half of `restore_snapshot`: compare, check every stored file it will use,
    stage the copies and the folders to build — in each lane — and stop there. Nothing in the
    environment has changed when this returns (the staging folders at its roots are hidden,
    `.rewheel-restore-*`). A service may keep serving meanwhile: `PreparedRestore.commit`
    then changes what the comparison found, which holds as long as the environment is what it
    was compared as (a caller that stops a service checks that first, with a stat walk);
    `discard` gives it up."""
    return PreparedRestore(env, snap, progress, lanes)


class PreparedRestore:
    """A restore compared, checked and staged in every lane (see `prepare_restore`), its
    second lane waiting for the commit."""

    def __init__(self, env: Environment, snap: SnapshotMeta, progress: Progress | None, lanes: int | None) -> None:
        self.env, self.snap = env, snap
        self.t0 = time.perf_counter()
        self.phases: dict[str, float] = {}
        self.n = auto_lanes(snap) if lanes is None else max(1, min(2, lanes))
        # Tens of thousands of names, numbers, entries and stat results, none of them in a
        # cycle: the cyclic collector would only walk them again and again.
        self._gc = gc.isenabled()
        gc.disable()
        self.peer: Peer | None = None
        self.done_ = False
        try:
            live_roots = scope_of(env)
            remove_stale_staging(live_roots)
            # What an undo snapshot left to settle (a rollback killed before its restore):
            # first, while the environment still is what that snapshot took over.
            privatize.settle(snap.path.parent.parent)
            # The other lane is forked before the manifest is read: each reads its own copy
            # (in parallel), so neither pays for copy-on-write pages of the other's objects.
            self.peer = Peer.start(env, snap, live_roots, LaneWork(_prepare, _failed_midway)) if self.n == 2 else None
            try:
                self.r = _prepare(env, snap, live_roots, (0, 2) if self.peer else None, progress, self.mark)
            except BaseException:
                if self.peer is not None:
                    self.peer.stop()
                raise
            try:
                self.found = Found(*self.r.proofs())
                self.changes = self.r.touched  # whether the commit would change anything
                if self.peer is not None:
                    proofs, touched = self.peer.staged()  # raises what stopped the other lane, if anything did
                    self.found.extend(Found(*proofs))
                    self.changes = self.changes or touched
                    self.mark("stage")
            except BaseException:
                self.r.discard_staging()
                if self.peer is not None:
                    self.peer.stop()
                raise
        except BaseException:
            self._end()
            raise
        self.prepared_s = time.perf_counter() - self.t0

    def mark(self, name: str) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - self.t0 - sum(self.phases.values())

    def _end(self) -> None:
        self.done_ = True
        if self._gc:
            gc.enable()

    def discard(self) -> None:
        """Give the prepared restore up: what it staged is removed, the second lane stopped.
        Nothing in the environment was changed."""
        if self.done_:
            return
        try:
            self.r.discard_staging()
            if self.peer is not None:
                self.peer.stop()
        finally:
            self._end()

    def commit(self, *, full_verify: bool = False, defer_removal: bool = False) -> RestoreResult:
        """The second half: commit in every lane, sync, verify. `seconds` counts from here."""
        assert not self.done_, "a prepared restore commits once"
        env, snap, peer, r = self.env, self.snap, self.peer, self.r
        t_commit = time.perf_counter()
        saver: threading.Thread | None = None
        try:
            try:
                if len(self.found):
                    # Proven before the commit, true whatever it or the verification finds: written
                    # while this process commits and verifies (system calls, which let it run).
                    saver = threading.Thread(target=save_aliases, name="rewheel-aliases", daemon=True, args=(
                        snap, self.found, [x.path for x in r.roots], r.same.alias_file if r.same is not None else None))
                    saver.start()
                if peer is not None:
                    peer.go()
                try:
                    r.commit()
                except OSError as exc:
                    raise _failed_midway(env, snap, exc) from exc
                self.mark("commit")
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
                        raise_if_problems(env, snap, problems)
                        verified = sum(len(f.names) for f in r.folders.values()) - done["others"]
                except BaseException:
                    r.discard_staging()
                    for p in other.get("displaced", ()):  # what the other lane moved out
                        shutil.rmtree(p, ignore_errors=True)
                    raise
                self.mark("verify")
                res = RestoreResult(snap.id, done["written"], done["deleted"], done["chmodded"],
                                    verified - done["written"] - done["chmodded"], verified, 0.0,
                                    folders_rebuilt=done["folders_rebuilt"], displaced=done["displaced"],
                                    phases=self.phases, lanes=self.n, proven_same=done["proven"],
                                    unshared=done["unshared"], from_cache=done["from_cache"])
                del self.r, r  # freed here, so the collector has none of it to walk once back on
            finally:
                if syncer.ident is not None:
                    syncer.join()
                t_back = time.perf_counter()
                if peer is not None:
                    peer.reap()
                if saver is not None:
                    saver.join()
            self.mark("finish")
        finally:
            self._end()
        # `seconds`: until the environment is back, verified and on disk — the preparation (done
        # before, while a service may still have served) and this commit; taking what was moved
        # out away is counted apart (`removal_seconds`), whenever it happens.
        res.seconds = self.prepared_s + (t_back - t_commit)
        res.commit_seconds = t_back - t_commit
        if not defer_removal:
            discard_displaced(res, snap.home)
        return res


def _failed_midway(env: Environment, snap: SnapshotMeta, exc: OSError) -> RestoreError:
    """A commit stopped by the system (in either lane): what to do about it."""
    return RestoreError(f"restoring snapshot {snap.id} into {env.prefix} failed midway: {exc}",
                        hint=f"fix the cause (disk full? permissions?) and run `rewheel rollback --python "
                             f"{env.python} {snap.id}` again; the restore is idempotent")


def _prepare(env: Environment, snap: SnapshotMeta, live_roots: list[Root], lane: tuple[int, int] | None,
             progress: Progress | None, mark: Callable[[str], None]) -> LaneRestore:
    """Read the manifest, compare the lane's folders with it, check and stage what they
    need. Nothing in the environment has changed when this returns or raises."""
    man = Manifest.load(snap, validate=False)
    # Acted on by their real paths: a prefix reached through a symlink (`/srv/env` ->
    # `/data/env`) is walked with O_NOFOLLOW from a root that must be the folder itself.
    roots = [Root(os.path.realpath(r.path), r.whole) for r in match_roots(snap, man, live_roots)]
    r = LaneRestore(env, snap, man, roots, progress, lane)  # indexes the manifest, validating it
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


def verify(env: Environment, snap: SnapshotMeta, man: Manifest | None = None) -> int:
    """Check the live environment against the manifest; raise RestoreError on any difference."""
    man = man or Manifest.load(snap)
    roots = [Root(os.path.realpath(r.path), r.whole) for r in match_roots(snap, man, scope_of(env))]
    owned = owned_now(roots, env)
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
        problem = entry_problem(e, st, path)
        if problem and problem.startswith("content differs") and roots[ri].whole:
            folder, _, name = rel.rpartition("/")
            fp = same.folder(ri, folder, os.path.join(roots[ri].path, folder))
            if fp is None or not same.same(fp, name, e.size, lambda e=e: e.sha256, st):  # type: ignore[misc]
                problems.append(problem)
                continue
            problem = entry_problem(e._replace(mtime_ns=st.st_mtime_ns), st, path)  # its mode, still
        if problem:
            problems.append(problem)
    if seen != len(want):
        problems.append(f"missing: {len(want) - seen} entries")
    raise_if_problems(env, snap, problems)
    return seen
