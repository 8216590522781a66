"""Real virtualenvs and uv for the tests: `uv` runs the uv rewheel itself finds, `make_venv`
builds a virtualenv with the interpreter running the tests, `uv_install` installs into one,
`pip_venv` builds one the way pip users do, and `tree_state` fingerprints a folder so a restore can be checked byte for byte. `REPO` is the
repository root (where `python -m devtools...` runs from)."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

from rewheel.installer import find_uv as uv_bin

REPO = Path(__file__).resolve().parents[1]


def uv(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cp = subprocess.run([uv_bin(), *args], capture_output=True, text=True,
                        env={**os.environ, **(env or {})})
    if cp.returncode != 0:
        raise AssertionError(f"uv {' '.join(args)} failed:\n{cp.stdout}\n{cp.stderr}")
    return cp


def make_venv(path: Path) -> Path:
    """A real virtualenv made by uv, with the interpreter running these tests."""
    uv("venv", "-q", "--python", sys.executable, str(path))
    return path / "bin" / "python"


def pip_venv(path: Path, *pip_args: str) -> Path:
    """A `python -m venv` virtualenv whose distributions pip installs (`pip install *pip_args`),
    byte-compiled at install and so listed in RECORD, as pip does. The pip running the tests
    installs into it (`pip --python`): a pip of its own (ensurepip) would cost some 4 CPU-s a
    virtualenv and add nothing the tests look at."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--disable-pip-version-check", *pip_args], check=True, capture_output=True)
    return python


def uv_install(python: Path, *specs: str, find_links: Path | None = None, extra: tuple[str, ...] = ()) -> None:
    args = ["pip", "install", "-q", "--python", str(python)]
    if find_links is not None:
        args += ["--no-index", "--find-links", str(find_links)]
    uv(*args, *extra, *specs)


def tree_state(root: Path) -> dict[str, tuple]:
    """Every entry under root: sha256 and mode for files, target for symlinks, mode for dirs.
    Byte-compiled caches are included: a restore must bring back exactly what was there."""
    state: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                state[rel] = ("l", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                state[rel] = ("d", stat.S_IMODE(st.st_mode))
            else:
                state[rel] = ("f", stat.S_IMODE(st.st_mode), hashlib.sha256(p.read_bytes()).hexdigest())
    return state


def cmdlines(skip: set[int] | frozenset[int] = frozenset()) -> list[tuple[int, str]]:
    """Every process this user can see, as (pid, command line with spaces), but those in `skip`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                out.append((int(entry), f.read().replace(b"\0", b" ").decode(errors="replace")))
        except OSError:
            continue
    return out


def stored_file(snapshot_path: Path | str, rel: str | Path, root: int = 0) -> Path:
    """Where a snapshot keeps the bytes of the file at `rel` (relative to its root `root`): an
    object of the store (manifest version 3), or its own `tree/` copy (earlier versions)."""
    from rewheel.snapshot import Manifest, SnapshotMeta

    snap = SnapshotMeta.load(Path(snapshot_path), Path(snapshot_path).parent)
    found = Manifest.load(snap, validate=False).stored_at(snap, root, str(rel))
    assert found is not None, f"no file {rel} in snapshot {snap.id}"
    return Path(found)


def to_tree_layout(snapshot_path: Path | str) -> None:
    """Give a snapshot the layout rewheel wrote before its objects (manifest versions 1 and 2):
    `tree/<root>/<path>`, each file's bytes under the snapshot itself — a hard link to a
    linked object, a copy (with the file's mtime) of a private one. The manifest is left as
    it is: the caller rewrites it in the old format."""
    import shutil

    from rewheel.snapshot import Folder, Manifest, SnapshotMeta

    snap = SnapshotMeta.load(Path(snapshot_path), Path(snapshot_path).parent)
    man = Manifest.load(snap)
    doc = manifest_doc(snap.path)
    for item in doc["folders"]:
        f = Folder(*item[2:])
        ri, rel = item[0], item[1]
        base = snap.path / "tree" / str(ri) / rel
        base.mkdir(parents=True, exist_ok=True)
        for i, e in enumerate(f.entries(ri, rel)):
            if e.kind == "d":
                (snap.path / "tree" / str(ri) / e.path).mkdir(parents=True, exist_ok=True)
            elif e.kind == "f":
                src = man.stored_path(snap, e)
                dst = snap.path / "tree" / str(ri) / e.path
                if e.stored == "link":
                    os.link(src, dst)
                else:
                    shutil.copyfile(src, dst)
                    os.utime(dst, ns=(e.mtime_ns, e.mtime_ns))
            del i


def manifest_doc(snapshot_path: Path | str) -> dict:
    """A snapshot's manifest as a JSON document (the layout versions 1 and 2 were written in,
    folders as columns, with its version and, for version 3, its live ctimes): what a test
    edits to tamper with it, then writes back with `write_manifest_doc`."""
    from rewheel.snapshot import Manifest, SnapshotMeta

    snap = SnapshotMeta.load(Path(snapshot_path), Path(snapshot_path).parent)
    return Manifest.load(snap, validate=False).to_json()


def write_manifest_doc(snapshot_path: Path | str, doc: dict) -> None:
    """Write a (tampered) manifest document as the snapshot's manifest, in place of its own:
    `manifest.json`, which rewheel reads in every version (a version 3 `manifest.bin` is
    removed, or it would be read first)."""
    import json

    Path(snapshot_path, "manifest.json").write_text(json.dumps(doc))
    Path(snapshot_path, "manifest.bin").unlink(missing_ok=True)
