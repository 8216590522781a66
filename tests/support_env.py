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
