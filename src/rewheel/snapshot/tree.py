"""The tree a snapshot owns, and what its distributions' RECORDs say about it.

Owns: an environment's roots (`Root`, `scope_of`), the walk over them (`walk`: parents
first, nested environments and staging folders left out, `[snapshots] exclude` globs via
`exclusion`), the RECORD index (`record_index`; `shared_paths` and `proven_sha` for a path
several distributions ship), the one rule for a file that is provably what its wheel
installed (`provably_pristine`), the one rule for a file a person may edit by hand
(`hand_editable`: never shared by a hard link with the store or uv's cache), entry kinds
(`kind_of`), manifest path safety (`safe_rel`) and file hashing (`hash_file`). `diff` and `patches` read environments through these too.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rewheel.environment import Distribution, Environment

CHUNK = 1 << 20
TIE_HASH_MAX = 1 << 20  # files up to this size with RECORD's mtime are checked by hash
STAGING_PREFIX = ".rewheel-restore-"
# A restore's staging folder: at a root, named by 8 hex digits. Only such a folder is passed
# over by a snapshot and removed by the next restore; a file a person named so elsewhere is
# theirs, captured and restored like any other.
_STAGING = re.compile(r"\.rewheel-restore-[0-9a-f]{8}")
# Names rewheel gives files inside an environment for a moment only: a restore's staging
# folder (at a root), the copy `staging.unshare` renames over a file (`.NAME.rewheel-unshare`),
# a carried patch's new bytes (`NAME.rewheel-PID`). Left only by a process that was killed.
UNSHARE_SUFFIX = ".rewheel-unshare"
_STRAY = re.compile(r"^\.rewheel-restore-|\.rewheel-unshare$|\.rewheel-\d+$")

Progress = Callable[[str, int, int], None]  # (phase, done, total)


def staging_folder(rel: str, name: str, de: os.DirEntry[str] | None = None, *, path: str | None = None) -> bool:
    """Whether `name` in folder `rel` of a root is a restore's staging folder (see `_STAGING`):
    at the root only, a folder (not followed), named as a restore names it. With neither `de`
    nor `path` the caller has seen it is a folder."""
    if rel or not _STAGING.fullmatch(name):
        return False
    if de is None and path is None:
        return True
    if de is not None:
        return de.is_dir(follow_symlinks=False)
    try:
        return stat.S_ISDIR(os.lstat(path or name).st_mode)
    except OSError:
        return False


# --------------------------------------------------------------------------------------
# Scope: which paths of an environment a snapshot owns
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Root:
    path: str
    whole: bool  # True: every file below; False: only files some RECORD lists


def scope_of(env: Environment) -> list[Root]:
    roots = [Root(str(r), True) for r in env.roots]
    if env.kind == "system":
        roots.append(Root(str(env.scripts_dir), False))
    return roots


def shared_paths(dists: list[Distribution]) -> dict[str, list[tuple[str | None, int | None, int]]]:
    """Paths several distributions' RECORDs list -> every owner's (sha256, size, install
    time). Such a file holds the bytes of whichever wrote it last — not always the one
    whose RECORD is newest (one uv run installs in parallel) — so it is proven by any owner
    whose RECORD it matches."""
    seen: set[str] = set()
    multi: set[str] = set()
    for d in dists:
        for e in d.record:
            if e.path in seen:
                multi.add(e.path)
            else:
                seen.add(e.path)
    owners: dict[str, list[tuple[str | None, int | None, int]]] = {}
    if multi:  # a few paths: their owners in full
        for d in dists:
            t = d.install_time_ns
            for e in d.record:
                if e.path in multi:
                    owners.setdefault(e.path, []).append((e.sha256_hex, e.size, t))
    return owners


def proven_sha(src: str, st: os.stat_result, owners: list[tuple[str | None, int | None, int]]) -> str | None:
    """The sha256 a file several distributions ship provably has, or None (copy it): the
    owners it could be (size equal, not modified after that owner's RECORD) agree, else
    its bytes decide."""
    fits = {o[0] for o in owners if o[0] and o[1] == st.st_size and st.st_mtime_ns <= o[2]}
    if len(fits) == 1 and all(st.st_mtime_ns < o[2] for o in owners if o[0] in fits):
        return fits.pop()
    if fits:
        h = hash_file(src)
        return h if h in fits else None
    return None


def provably_pristine(size: int, mtime_ns: int, record_size: int | None, installed_ns: int) -> bool:
    """Whether a file (`size` bytes, modified at `mtime_ns`) is, without reading it, what
    its wheel installed: the size its RECORD lists, and last modified strictly before its distribution's install time (the RECORD
    file's mtime: an installer writes RECORD last). The one home of this rule, for
    snapshots, their estimate, `diff` and `patches`.

    Strictly before: a file whose mtime equals RECORD's was written in the same clock tick
    (a coarse filesystem clock, or INSTALLER/REQUESTED written beside RECORD), and an edit in
    that tick would read the same — so a tie proves nothing by time. A caller that can
    afford it proves a tie by the file's bytes instead (`take_snapshot` does, for small
    files)."""
    return size == record_size and mtime_ns < installed_ns


# --------------------------------------------------------------------------------------
# Hand-editable files: never one inode with the store (or uv's cache)
# --------------------------------------------------------------------------------------
# Text people open in an editor: sources, stubs, configs, scripts, docs, C/C++/CUDA sources
# and headers (JIT builds read them), certificates (a CA bundle gets a corporate CA added).
TEXT_SUFFIXES = frozenset((
    ".py", ".pyi", ".pyx", ".pxd", ".pxi", ".pth", ".typed", ".ipynb",
    ".json", ".jsonl", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".conf", ".env", ".properties", ".lock",
    ".txt", ".md", ".rst", ".csv", ".tsv", ".xml", ".html", ".htm", ".css", ".js", ".mjs", ".ts",
    ".jinja", ".jinja2", ".j2", ".tmpl", ".tpl", ".template", ".in", ".proto", ".sql",
    ".sh", ".bash", ".zsh", ".fish", ".csh", ".nu", ".xsh", ".ps1", ".bat", ".cmd",
    ".c", ".h", ".cc", ".cpp", ".cxx", ".hh", ".hpp", ".hxx", ".cu", ".cuh", ".inl", ".inc", ".ipp", ".tcc",
    ".cmake", ".mk", ".m4", ".ac", ".am", ".pem", ".crt", ".cer",
))
# Bytes nobody edits in a text editor; Python's own caches are written by rename (a new
# inode: `importlib`'s `_write_atomic`, `compileall`), so sharing them is safe too.
BINARY_SUFFIXES = frozenset((
    ".so", ".pyd", ".dll", ".dylib", ".a", ".o", ".lib", ".exe", ".bin", ".bc", ".cubin", ".fatbin", ".ptx",
    ".pyc", ".pyo", ".whl", ".zip", ".gz", ".tgz", ".bz2", ".xz", ".zst", ".7z", ".tar", ".jar", ".egg",
    ".npy", ".npz", ".pt", ".ckpt", ".safetensors", ".onnx", ".pkl", ".pickle", ".h5", ".hdf5", ".gguf",
    ".msgpack", ".db", ".sqlite", ".mo", ".png", ".jpg", ".jpeg", ".gif", ".ico", ".bmp", ".webp",
    ".woff", ".woff2", ".ttf", ".otf", ".eot", ".pdf", ".wasm",
))
SMALL_TEXT_MAX = 1 << 20  # a file with neither kind of suffix up to this size counts as text
_SO_VERSIONED = re.compile(r"\.so(?:\.[0-9][0-9A-Za-z_]*)+$")  # libfoo.so.12, libbar.so.1.2.3


def hand_editable(name: str, size: int) -> bool:
    """Whether a file (its name, without folders, and its size) is one a person may edit by
    hand, and so must never share its inode with a snapshot's store or uv's cache: an edit
    written in place (vim on a file with several links, `open(..., "r+")`, truncate and
    rewrite) would change every copy sharing it. The one home of this rule, for the
    snapshot (capture and restore copy such files, or reflink them) and for `unshare`.

    A text suffix (`TEXT_SUFFIXES`) says yes at any size, a binary one (`BINARY_SUFFIXES`,
    `.so.N`) says no; any other file (no suffix: a shebang script, LICENSE, METADATA; an
    unknown one) is text up to `SMALL_TEXT_MAX` bytes and a shared binary above it (a
    compiler such as `ptxas` in a CUDA wheel). Large binaries keep their hard links: copying
    them would cost the gigabytes the sharing saves."""
    suffix = name[name.rfind("."):].lower() if "." in name[1:] else ""
    if suffix in TEXT_SUFFIXES:
        return True
    if suffix in BINARY_SUFFIXES or (".so." in name and _SO_VERSIONED.search(name)):
        return False
    return size <= SMALL_TEXT_MAX


def record_index(dists: list[Distribution]) -> dict[str, tuple[str | None, int | None, int]]:
    """abs path -> (sha256 hex from RECORD, size from RECORD, install time of its dist)."""
    index: dict[str, tuple[str | None, int | None, int]] = {}
    for d in dists:
        t = d.install_time_ns
        for e in d.record:
            # A path two distributions ship holds the bytes of the one installed last: only
            # its RECORD can prove the file (the other's was overwritten after it was written).
            prev = index.get(e.path)
            if prev is None or prev[2] <= t:
                index[e.path] = (e.sha256_hex, e.size, t)
    return index


def nested_prefix(path: str, rel: str, root: str) -> bool:
    """A folder inside an environment that is another environment (a venv with its own
    `pyvenv.cfg`, a conda env with its own `conda-meta`), or a conda base's package cache
    (`pkgs/` beside `conda-meta/`): not this environment's files, so never captured,
    reverted or removed by its snapshots."""
    if os.path.lexists(f"{path}/pyvenv.cfg") or os.path.isdir(f"{path}/conda-meta"):
        return True
    return rel == "pkgs" and os.path.isdir(f"{root}/conda-meta")


def exclusion(globs: list[str] | tuple[str, ...]) -> Callable[[str], bool] | None:
    """`[snapshots] exclude`: a glob with a slash matches the path from the prefix (`*`
    crosses folders), one without matches a name at any depth. None when there are none."""
    if not globs:
        return None
    full = [fnmatch.translate(g.strip("/")) for g in globs if "/" in g.strip("/")]
    names = [fnmatch.translate(g) for g in globs if "/" not in g.strip("/")]
    by_path = re.compile("|".join(full)).match if full else None
    by_name = re.compile("|".join(names)).match if names else None

    def excluded(rel: str) -> bool:
        return bool((by_path and by_path(rel)) or (by_name and by_name(rel.rpartition("/")[2])))
    return excluded


def excluded_distribution_file(globs: list[str] | tuple[str, ...], prefix: str,
                               records: dict[str, Any]) -> tuple[str, str] | None:
    """(glob, path) of the first file a distribution's RECORD lists (its files, its metadata)
    that `[snapshots] exclude` would leave out of a snapshot — or a folder above one, which
    the walk skips whole — else None. Such a snapshot could not restore that distribution."""
    if not globs:
        return None
    base = prefix.rstrip("/") + "/"
    matchers = [(g, exclusion([g])) for g in globs]
    seen: set[str] = set()  # folders already judged (each is shared by many files)
    for path in records:
        if not path.startswith(base):
            continue
        parts = path[len(base):].split("/")
        for i in range(1, len(parts) + 1):
            rel = "/".join(parts[:i])
            if rel in seen:
                continue
            seen.add(rel)
            for g, excluded in matchers:
                if excluded is not None and excluded(rel):
                    return g, rel
    return None


def walk(roots: list[Root], owned: set[str] | dict[str, Any], skip: set[str],
          nested: list[str] | None = None,
          excluded: Callable[[str], bool] | None = None) -> Iterator[tuple[int, str, os.stat_result]]:
    """Yield (root index, relative path, lstat) for everything a scope holds, parents first.
    Nested environments are left out (and their paths added to `nested`)."""
    for ri, root in enumerate(roots):
        if not root.whole:
            base = root.path.rstrip("/") + "/"
            for p in sorted(owned):
                if p.startswith(base):
                    try:
                        yield ri, p[len(base):], os.lstat(p)
                    except FileNotFoundError:
                        pass
            continue
        stack = [""]
        base = root.path.rstrip("/") + "/"
        while stack:
            rel = stack.pop()
            full = base + rel if rel else root.path
            try:
                it = os.scandir(full)
            except (FileNotFoundError, NotADirectoryError):
                continue
            with it:
                children = sorted(it, key=lambda e: e.name)
            subdirs = []
            for de in children:
                if de.path in skip or staging_folder(rel, de.name, de):
                    continue
                crel = f"{rel}/{de.name}" if rel else de.name
                if excluded is not None and ri == 0 and excluded(crel):
                    continue
                st = de.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode) and nested_prefix(de.path, crel, root.path):
                    if nested is not None:
                        nested.append(de.path)
                    continue
                yield ri, crel, st
                if stat.S_ISDIR(st.st_mode):
                    subdirs.append(crel)
            stack.extend(reversed(subdirs))


def kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "f"
    if stat.S_ISDIR(mode):
        return "d"
    if stat.S_ISLNK(mode):
        return "l"
    return "o"


def safe_rel(rel: Any) -> bool:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\x00" in rel:
        return False
    if "//" in rel or rel.endswith("/"):
        return False  # an empty component
    # "." and ".." components, by substring tests (this runs once per manifest entry).
    wrapped = f"/{rel}/"
    return "/./" not in wrapped and "/../" not in wrapped


def hash_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def strays(roots: list[Root], limit: int = 20) -> list[str]:
    """Up to `limit` paths under `roots` with a name only rewheel gives, for a moment, to a
    file inside an environment (`_STRAY`): what a killed restore, unshare or patch left. One
    walk of the environment (no stat beyond what scandir returns)."""
    found: list[str] = []
    stack = [r.path for r in roots if r.whole]
    while stack and len(found) < limit:
        folder = stack.pop()
        try:
            it = os.scandir(folder)
        except OSError:
            continue
        with it:
            for de in it:
                if _STRAY.search(de.name):
                    found.append(de.path)
                elif de.is_dir(follow_symlinks=False):
                    stack.append(de.path)
    return sorted(found)[:limit]
