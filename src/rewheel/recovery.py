"""Bringing back the bytes of a snapshot's damaged stored files, before a rollback acts.

Owns: `recover_snapshot` (find, for every stored file an edit damaged, a source that still
holds its bytes; refuse when a file the restore needs has none), `Recovery` and its
`apply` (put the recovered bytes into the snapshot), and `recover_before_restore`, the one
call `rollback` makes before it stops the service.

A file a snapshot shares with the environment by a hard link is one inode: an edit written
in place into the live file rewrote the snapshot's copy too (`snapshot.integrity` finds it
with one stat per stored file). Its bytes are those its wheel installed — the manifest
holds their sha256, taken from RECORD — so they can still be had, in this order, from:

1. the live file at that path, when it is another inode that holds them (a reinstall of
   the same version unpacked them anew);
2. uv's cache (`<cache>/archive-v0/<id>/`, the unpacked wheel the distribution was
   installed from), when its copy is intact — uv installs by hard-linking from its cache,
   so the same edit often reached the cache too, and its hash says so;
3. the index the recipe names: the wheel of that very version fetched again with uv.

Every candidate is hashed and must equal the manifest's sha256. All of it happens before
the service is stopped or a file of the environment changes (`rollback` runs the fast check
before the stop; without a service, the restore's own check of the stored files it needs
finds the damage before it changes anything, and it runs again after the recovery); only
the snapshot's damaged copies are replaced (each by one rename of a checked file). When a file the restore needs
has no source, the rollback refuses (exit 3), naming the files and what would bring them
back. Damage to a stored file the restore does not need (its live twin is intact) is
reported, never a reason to refuse.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewheel.environment import Distribution, Environment, read_distribution
from rewheel.errors import RestoreError, SnapshotDamaged
from rewheel.paths import atomic_write, fsync_dir
from rewheel.snapshot import (Damage, Manifest, ManifestDamaged, SnapshotMeta, VerifyResult, copy_hashed, hash_file,
                              verify_snapshot)
from rewheel.snapshot.integrity import record_damage
from rewheel.snapshot.objects import OBJECT_MODE, OBJECT_MTIME_NS

if TYPE_CHECKING:
    from rewheel.patches import Fetcher, UvCache


@dataclass
class _Owner:
    dist: Distribution  # read from the snapshot's own `.dist-info` (the version it holds)
    site_rel: str  # the file's path relative to site-packages, as the wheel names it
    record_hash: str | None  # its RECORD row's hash, as written ("sha256=...")


@dataclass
class RecoveredFile:
    path: str  # in the environment
    source: str  # "environment" | "uv-cache" | "index"
    source_path: str
    distribution: str | None = None
    version: str | None = None
    # Filled in by `apply`:
    stored: str = ""  # the snapshot's stored path that was replaced
    sha256: str = ""
    mode: int = 0
    mtime_ns: int = 0
    key: tuple[int, str, int] = (0, "", 0)  # (root, folder, index in the folder's columns)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "source": self.source, "source_path": self.source_path,
                "distribution": self.distribution, "version": self.version}


@dataclass
class Recovery:
    snapshot_id: str
    check: VerifyResult
    recovered: list[RecoveredFile] = field(default_factory=list)
    # {"path", "distribution", "version", "why", "needed"}: no source holds these bytes.
    unrecoverable: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    applied: bool = False

    @property
    def needed_missing(self) -> list[dict[str, Any]]:
        return [u for u in self.unrecoverable if u["needed"]]

    def to_json(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot_id, "damaged": len(self.check.damaged),
                "recovered": [r.to_json() for r in self.recovered], "unrecoverable": self.unrecoverable,
                "applied": self.applied, "seconds": round(self.seconds, 3)}


def _snapshot_owners(env: Environment, snap: SnapshotMeta, man: Manifest, scratch: Path
                     ) -> dict[tuple[int, str], _Owner]:
    """(root, path) -> the distribution (as the snapshot holds it) whose RECORD lists it.
    The snapshot's own `.dist-info` folders are read from the store (after an upgrade the live
    environment holds other versions): from its tree (versions 1 and 2), or from its objects,
    linked by name into `scratch` (version 3)."""
    real_roots = man.real_roots or [os.path.realpath(r.path) for r in man.roots]
    owners: dict[tuple[int, str], _Owner] = {}
    for site in env.site_dirs:
        real_site = os.path.realpath(site)
        where = next(((i, "" if real_site == root else real_site[len(root.rstrip("/")) + 1:])
                      for i, root in enumerate(real_roots)
                      if real_site == root or real_site.startswith(root.rstrip("/") + "/")), None)
        if where is None:
            continue
        ri, site_rel = where
        sf = man.folders.get((ri, site_rel))
        if sf is None:
            continue
        for n in sorted(n for n, k in zip(sf.names, sf.types, strict=False) if k == "d" and n.endswith(".dist-info")):
            if man.uses_objects:
                stored_site = scratch / f"{ri}-{len(owners)}"
                _link_stored_folder(snap, man, ri, f"{site_rel}/{n}" if site_rel else n, stored_site / n)
            else:
                stored_site = snap.path / "tree" / str(ri) / site_rel if site_rel else snap.path / "tree" / str(ri)
            d = read_distribution(stored_site / n, stored_site)
            if d is None:
                continue
            _ = d.record  # read now: the scratch folder goes when the recovery is done
            for e in d.record:
                in_site = os.path.relpath(e.path, stored_site)  # `../../bin/x` for a script
                rel = os.path.normpath(os.path.join(site_rel, in_site)) if site_rel else os.path.normpath(in_site)
                owners.setdefault((ri, rel), _Owner(d, in_site, e.hash))
    return owners


def _link_stored_folder(snap: SnapshotMeta, man: Manifest, ri: int, rel: str, dst: Path) -> None:
    """Symlinks in `dst` to the stored bytes of the files of manifest folder `rel`, so that a
    reader of folders (`read_distribution`) reads a version 3 snapshot's `.dist-info`."""
    f = man.folders.get((ri, rel))
    dst.mkdir(parents=True, exist_ok=True)
    if f is None:
        return
    for i, (name, kind) in enumerate(zip(f.names, f.types, strict=False)):
        if kind != "f" or "/" in name or name in (".", ".."):
            continue
        try:
            os.symlink(man.stored_path(snap, f.entry(ri, rel, i)), dst / name)
        except (ManifestDamaged, OSError):
            continue


def _same_inode(a: os.stat_result | None, path: str) -> bool:
    if a is None:
        return False
    try:
        b = os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _holds(path: str, sha256: str, size: int, stored: os.stat_result | None) -> bool:
    """Whether `path` is a regular file of `size` bytes whose sha256 is `sha256`, and not
    the damaged stored inode itself."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        return False
    if stored is not None and (st.st_dev, st.st_ino) == (stored.st_dev, stored.st_ino):
        return False
    try:
        return hash_file(path) == sha256
    except OSError:
        return False


def recover_snapshot(env: Environment, snap: SnapshotMeta, *, check: VerifyResult | None = None,
                     fetcher: Callable[[], Fetcher | None] | None = None,
                     uv_cache: UvCache | None | bool = True) -> Recovery:
    """Find a source for every damaged stored file of `snap` (see the module's doc). Changes
    nothing. `fetcher`: makes the index fetcher, called only when neither the environment
    nor uv's cache has the bytes; `uv_cache`: True = locate it with `uv cache dir`."""
    t0 = time.perf_counter()
    check = check if check is not None else verify_snapshot(snap)
    rec = Recovery(snap.id, check)
    if check.ok or check.manifest_error is not None:
        rec.seconds = time.perf_counter() - t0
        return rec
    man = Manifest.load(snap, validate=False)
    scratch = tempfile.TemporaryDirectory(prefix="rewheel-recover-")
    try:
        owners = _snapshot_owners(env, snap, man, Path(scratch.name))
    finally:
        scratch.cleanup()
    cache_box: list[UvCache | None] = []
    fetch_box: list[Fetcher | None] = []

    def cache() -> UvCache | None:
        if not cache_box:
            from rewheel.patches import UvCache

            cache_box.append(UvCache.locate() if uv_cache is True else (uv_cache or None))
        return cache_box[0]

    def index() -> Fetcher | None:
        if not fetch_box:
            fetch_box.append(fetcher() if fetcher is not None else None)
        return fetch_box[0]

    for d in check.damaged:
        live = check.display(d)
        folder, _, name = d.path.rpartition("/")
        f = man.folders.get((d.root, folder))
        i = f.index.get(name) if f is not None else None
        try:
            want = f.sha(i) if f is not None and i is not None else None
            stored_path = (d.stored_at or man.stored_path(snap, f.entry(d.root, folder, i))
                           if f is not None and i is not None else "")
        except ManifestDamaged:
            want, stored_path = None, ""
        owner = owners.get((d.root, d.path))
        info = {"distribution": owner.dist.name if owner else None,
                "version": owner.dist.version_text if owner else None}
        if f is None or i is None or want is None or d.problem == "bad name":
            rec.unrecoverable.append({"path": live, **info, "needed": True,
                                      "why": "the manifest records no sha256 for it"})
            continue
        try:
            sst: os.stat_result | None = os.lstat(stored_path)
        except OSError:
            sst = None
        found: tuple[str, str] | None = None
        whys: list[str] = []
        # 1. The live file, when it is another inode with these bytes.
        if _holds(live, want, d.size, sst):
            found = ("environment", live)
        else:
            whys.append("the live file differs" if not _same_inode(sst, live)
                        else "the live file is the same edited inode")
        # 2. uv's cache, when its copy is intact.
        if found is None and owner is not None and not owner.site_rel.startswith(".."):
            c = cache()
            if c is None:
                whys.append("no uv cache")
            else:
                p, why = c.wheel_file(owner.dist, owner.site_rel, owner.record_hash)
                if p is not None and _holds(str(p), want, d.size, sst):
                    found = ("uv-cache", str(p))
                else:
                    whys.append(f"uv's cache: {why or 'its copy was edited too (sha256 differs)'}")
        # 3. The index the recipe names: the wheel of that very version, fetched again.
        if found is None and owner is not None and not owner.site_rel.startswith(".."):
            fx = index()
            folder_got = fx.unpack(owner.dist) if fx is not None else None
            if folder_got is None:
                notes = getattr(fx, "notes", None) or []
                whys.append(f"index: {notes[-1]}" if notes else
                            "no index: a bare --python target names none (a recipe's rollback asks its index, "
                            "or uv's default index)")
            else:
                p = _in_unpacked(Path(folder_got), owner)
                if p is not None and _holds(str(p), want, d.size, sst):
                    found = ("index", str(p))
                else:
                    whys.append("index: its wheel does not hold these bytes")
        if owner is None:
            whys.append("no distribution's RECORD lists it (not from a wheel)")
        elif owner.site_rel.startswith(".."):
            whys.append("installed outside site-packages (a script): its wheel holds other bytes")
        if found is not None:
            private = man.uses_objects and f.stored[i] != "L"  # an object of its own: its marks, not the file's
            rec.recovered.append(RecoveredFile(
                live, found[0], found[1], info["distribution"], info["version"], stored_path, want,
                OBJECT_MODE if private else f.modes[i], OBJECT_MTIME_NS if private else f.mtimes[i],
                (d.root, folder, i)))
        else:
            rec.unrecoverable.append({"path": live, **info, "needed": _needed(live, d, sst),
                                      "why": "; ".join(whys)})
    rec.seconds = time.perf_counter() - t0
    return rec


def _in_unpacked(folder: Path, owner: _Owner) -> Path | None:
    """The file in a wheel fetched and unpacked like site-packages (`uv pip install --target`)."""
    from rewheel.patches.uvcache import _wheel_rows

    row = _wheel_rows(folder, owner.dist.dist_info.name).get(owner.site_rel)
    p = folder / (row[0] if row is not None else owner.site_rel)
    return p if p.is_file() else None


def _needed(live: str, d: Damage, stored: os.stat_result | None) -> bool:
    """Whether the restore will put this file back (so it needs its stored bytes): the live
    file is missing, differs from the manifest, or is the damaged inode itself."""
    try:
        st = os.lstat(live)
    except OSError:
        return True
    if stored is not None and (st.st_dev, st.st_ino) == (stored.st_dev, stored.st_ino):
        return True
    return not (stat.S_ISREG(st.st_mode) and st.st_size == d.size and st.st_mtime_ns == d.mtime_ns)


def apply(rec: Recovery, snap: SnapshotMeta) -> None:
    """Put the recovered bytes into the snapshot: each is copied next to the damaged stored
    file, checked against the manifest's sha256 while it is copied, given the manifest's mode
    and mtime, synced and renamed over it. The manifest then records the new inode of a
    hard-linked entry (the restore links it back). The environment is not touched."""
    if not rec.recovered:
        return
    man = Manifest.load(snap, validate=False)
    folders: set[str] = set()
    for r in rec.recovered:
        tmp = f"{r.stored}.rewheel-recover-{secrets.token_hex(4)}"
        try:
            os.makedirs(os.path.dirname(r.stored), exist_ok=True)  # a stored folder that was deleted
            sha, _ = copy_hashed(r.source_path, tmp)
            if sha != r.sha256:
                raise SnapshotDamaged(
                    f"snapshot {snap.id}: the bytes recovered for {r.path} from {r.source_path} changed while "
                    f"they were copied (sha256 {sha[:12]}…, expected {r.sha256[:12]}…)",
                    hint="run the rollback again; nothing in the environment was changed")
            os.chmod(tmp, r.mode)
            os.utime(tmp, ns=(r.mtime_ns, r.mtime_ns))
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, r.stored)
        except BaseException as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise RestoreError(
                    f"snapshot {snap.id}: cannot write the bytes recovered for {r.path} into {r.stored}: "
                    f"{exc.strerror or exc}",
                    hint="free disk or fix the permissions of the store, then run the rollback again; "
                         "nothing in the environment was stopped or changed") from None
            raise
        folders.add(os.path.dirname(r.stored))
        ri, folder, i = r.key
        f = man.folders.get((ri, folder))
        if f is not None and f.stored[i] == "L":
            f.inos[i] = os.lstat(r.stored).st_ino
    for d in folders:
        fsync_dir(Path(d))
    if man.uses_objects:
        man.save(snap.path)
    else:
        atomic_write(snap.path / "manifest.json", json.dumps(man.to_json(), separators=(",", ":")))
    rec.applied = True
    record_damage(snap.path, max(0, len(rec.check.damaged) - len(rec.recovered)))


def refusal(rec: Recovery, snap: SnapshotMeta, cli_ref: str) -> SnapshotDamaged:
    """Exit 3, before anything was stopped or changed: the files no source holds, and what
    would bring them back."""
    missing = rec.needed_missing
    shown = "; ".join(f"{u['path']} ({u['distribution'] or 'no distribution'} {u['version'] or ''}".rstrip()
                      + f": {u['why']})" for u in missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
    wheels = sorted({f"{u['distribution']}=={u['version']}" for u in missing if u["distribution"]})
    bring = (f"the wheel{'s' if len(wheels) > 1 else ''} {', '.join(wheels)} on the recipe's index "
             f"([install] index_url, else uv's default index) or in uv's cache (any `uv pip install` of {'them' if len(wheels) > 1 else 'it'} "
             "puts it there)" if wheels else "no wheel holds them")
    return SnapshotDamaged(
        f"snapshot {snap.id}: {len(missing)} stored file(s) were changed after the snapshot (an edit written in "
        f"place through the hard link it shares with the environment), and neither the environment, uv's cache "
        f"nor the index holds their bytes: {shown}",
        hint=f"nothing was stopped or changed. What would bring them back: {bring}; then run the rollback again. "
             f"Or restore another snapshot: `rewheel verify {cli_ref}` says which are whole")


def recover_before_restore(env: Environment, snap: SnapshotMeta, *, cli_ref: str,
                           fetcher: Callable[[], Fetcher | None] | None = None,
                           say: Callable[[str], None] | None = None) -> Recovery | None:
    """What `rollback` calls before it stops the service (or, without one, once the restore
    refused a damaged stored file before changing anything): the fast check of the snapshot's
    stored files (one stat each); when an edit damaged some, their bytes are found (or the
    rollback is refused, exit 3) and put back into the snapshot. None when nothing was
    damaged (or the manifest itself is unreadable: the restore reports that)."""
    check = verify_snapshot(snap)
    if check.ok or check.manifest_error is not None:
        return None
    # A manifest tampered with (a name that climbs, a folder outside the prefix) is refused
    # as the restore refuses it, naming the entry: no bytes are looked for on its behalf.
    from rewheel.snapshot.restore_checks import check_tree

    check_tree(snap, Manifest.load(snap, validate=False))
    if any(d.problem == "bad name" for d in check.damaged):
        return None
    fx_made: list[Any] = []

    def make_fetcher() -> Fetcher | None:
        fx = fetcher() if fetcher is not None else None
        fx_made.append(fx)
        return fx

    try:
        rec = recover_snapshot(env, snap, check=check, fetcher=make_fetcher)
        if rec.needed_missing:
            raise refusal(rec, snap, cli_ref)
        apply(rec, snap)
    finally:
        for fx in fx_made:
            close = getattr(fx, "close", None)
            if close is not None:
                close()
    if say is not None:
        by: dict[str, int] = {}
        for r in rec.recovered:
            by[r.source] = by.get(r.source, 0) + 1
        say(f"snapshot {snap.id}: {len(check.damaged)} stored file(s) were changed after the snapshot (edited in "
            f"place); their bytes were recovered ({', '.join(f'{n} from {s}' for s, n in sorted(by.items()))}) "
            "and checked against the RECORD hash")
        for u in rec.unrecoverable:
            say(f"  not recovered (the restore does not need it): {u['path']}: {u['why']}")
    return rec
