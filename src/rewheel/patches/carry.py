"""Keeping and carrying patches: the `.patch` files saved into a run's folder (`save_patches`)
and the three-way merge that carries them onto the new version, all or nothing (`reapply`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from merge3 import Merge3

from rewheel.environment import Environment
from rewheel.patches.hashes import KEEP_LIMIT, _read_small, _sha256
from rewheel.patches.results import Patch, PatchScan
from rewheel.paths import fsync_dir, write_all
from rewheel.texts import as_text


def _flat(path: str) -> str:
    """A file name for a patched file's path: `/` as `__`, bytes as the file system has them
    (a non-UTF-8 name arrives surrogate-escaped and is written back as the same bytes), and
    bounded: a name longer than 200 bytes keeps its last 150 (the file's own name) behind a
    hash of the whole path, so that it fits in a file name (255 bytes) with its suffix and
    two long paths never share one."""
    raw = path.encode("utf-8", "surrogateescape").replace(b"/", b"__")
    if len(raw) > 200:
        digest = hashlib.sha256(raw).hexdigest()[:12].encode()
        tail = raw[-150:]
        while tail and 0x80 <= tail[0] < 0xC0:  # do not start inside a UTF-8 sequence
            tail = tail[1:]
        raw = digest + b"--" + tail
    return raw.decode("utf-8", "surrogateescape")


def patch_text(p: Patch) -> str:
    """A git-style patch for one file (paths relative to site-packages)."""
    if p.kind == "unlisted":
        head = f"diff --git a/{p.path} b/{p.path}\nnew file mode {0o100000 | p.mode:o}\n"
    else:
        head = f"diff --git a/{p.path} b/{p.path}\n"
    if p.diff is None:
        return head + f"# no diff: {p.pristine_note or 'no pristine copy'}\n"
    return head + p.diff


def save_patches(s: PatchScan, run_dir: Path) -> list[Path]:
    """Write one `.patch` per patched file into `<run_dir>/patches/`, plus `patches.json`.
    A file with no diff (no pristine copy, binary) is saved whole as `<name>.file` too."""
    out = run_dir / "patches"
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for p in s.patches:
        target = out / f"{_flat(p.path)}.patch"
        # surrogateescape: a non-UTF-8 file name goes into the patch as the bytes it has.
        target.write_text(patch_text(p), encoding="utf-8", errors="surrogateescape")
        written.append(target)
        if p.diff is None or p.binary:
            whole = out / f"{_flat(p.path)}.file"
            if p.patched_bytes is not None:
                whole.write_bytes(p.patched_bytes)
            else:
                try:
                    shutil.copyfile(p.abs_path, whole)
                except OSError:
                    continue
            written.append(whole)
    (out / "patches.json").write_text(json.dumps(s.to_json(), indent=1))
    return written


@dataclass
class ReapplyResult:
    path: str
    status: str  # "clean" | "conflict" | "missing" | "unchanged"
    detail: str
    distribution: str | None = None
    conflict_file: str | None = None

    @property
    def failed(self) -> bool:
        return self.status in ("conflict", "missing")

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "status": self.status, "detail": self.detail,
                "distribution": self.distribution, "conflict_file": self.conflict_file}


def reapply_failed(results: Iterable[ReapplyResult]) -> bool:
    """True when any patch could not be carried (the run must fail and revert)."""
    return any(r.failed for r in results)


def _merge(pristine: str, new: str, patched: str) -> tuple[str, bool]:
    m = Merge3(pristine.splitlines(keepends=True), new.splitlines(keepends=True),
               patched.splitlines(keepends=True))
    conflict = any(r[0] == "conflict" for r in m.merge_regions())
    merged = "".join(m.merge_lines(name_a="new version", name_b="local patch"))
    return merged, conflict


def _write_replacing(path: str, data: bytes, mode: int) -> None:
    """Write through a new inode: the installed file may be hard-linked from uv's cache,
    and writing into it would change the cache too. Durable like `atomic_write`: all the
    bytes, synced, then the rename synced in the folder (a crash after this returns keeps
    the carried patch)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.rewheel-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


def reapply(s: PatchScan, env: Environment | None = None, run_dir: Path | None = None) -> list[ReapplyResult]:
    """Carry each patch onto what is installed now (after the reinstall) with a three-way
    merge of (pristine old, patched old, new installed file).

    All or nothing: files are written only when every patch merges cleanly; on any conflict
    or missing file nothing is written and, with `run_dir`, each conflict's merge with
    markers is saved as `<run_dir>/patches/<name>.conflict`.
    """
    if env is not None and Path(s.prefix) != Path(env.prefix):
        raise ValueError(f"patch scan of {s.prefix} cannot be reapplied to {env.prefix}")
    results: list[ReapplyResult] = []
    writes: list[tuple[str, bytes, int]] = []
    conflicts: list[tuple[ReapplyResult, str]] = []
    # A file whose wheel ships exactly its bytes is no patch (its RECORD is wrong): the new
    # version's file stays as installed, whatever list it arrives in.
    inconsistent = {r["path"] for r in s.record_inconsistent}
    for p in s.patches:
        if p.path in inconsistent:
            continue
        r, write, merged = _reapply_one(p)
        results.append(r)
        if write is not None:
            writes.append(write)
        if merged is not None:
            conflicts.append((r, merged))
    if not reapply_failed(results):
        for path, data, mode in writes:
            _write_replacing(path, data, mode)
    elif run_dir is not None:
        out = run_dir / "patches"
        out.mkdir(parents=True, exist_ok=True)
        for r, merged in conflicts:
            dest = out / f"{_flat(r.path)}.conflict"
            dest.write_text(merged, encoding="utf-8")
            r.conflict_file = str(dest)
    return results


def _reapply_one(p: Patch) -> tuple[ReapplyResult, tuple[str, bytes, int] | None, str | None]:
    """The result, the write to make when clean, and the merge with conflict markers."""
    r = ReapplyResult(p.path, "clean", "", p.distribution)
    if p.patched_bytes is None:
        r.status, r.detail = "conflict", f"file larger than {KEEP_LIMIT >> 20} MiB: carry it by hand"
        return r, None, None
    try:
        st = os.lstat(p.abs_path)
        new = _read_small(p.abs_path) if stat.S_ISREG(st.st_mode) else None
    except FileNotFoundError:
        st, new = None, None
    if p.kind == "unlisted":
        if st is None:
            r.detail = "added file restored"
            return r, (p.abs_path, p.patched_bytes, p.mode), None
        if new is not None and _sha256(new) == p.sha256:
            r.status, r.detail = "unchanged", "still present (a reinstall keeps files no RECORD lists)"
            return r, None, None
        r.status, r.detail = "conflict", "the new version installs a different file at this path"
        return r, None, None
    if st is None or new is None:
        r.status, r.detail = "missing", f"the new version has no {p.path}"
        return r, None, None
    mode = stat.S_IMODE(st.st_mode)
    new_sha = _sha256(new)
    if new_sha == p.sha256:
        r.status, r.detail = "unchanged", "the installed file already has the patched bytes"
        return r, None, None
    if p.record_sha256 is not None and new_sha == p.record_sha256:
        r.detail = "file unchanged upstream: patched copy restored"
        return r, (p.abs_path, p.patched_bytes, mode), None
    if p.pristine_bytes is None:
        r.status = "conflict"
        r.detail = ("the file changed upstream and there is no pristine copy of the old version to "
                    f"merge against ({p.pristine_note or 'unknown'})")
        return r, None, None
    base, mine, theirs = as_text(p.pristine_bytes), as_text(p.patched_bytes), as_text(new)
    if base is None or mine is None or theirs is None:
        r.status, r.detail = "conflict", "binary file changed upstream: cannot be merged"
        return r, None, None
    merged, conflict = _merge(base, theirs, mine)
    if conflict:
        r.status = "conflict"
        n = merged.count("<<<<<<< new version")
        r.detail = f"{n} conflicting hunk(s) between the new version and the local patch"
        return r, None, merged
    if merged == theirs:
        r.status, r.detail = "unchanged", "the new version already contains the patch"
        return r, None, None
    r.detail = "merged cleanly"
    return r, (p.abs_path, merged.encode("utf-8"), mode), None
