"""Shared fixtures: real uv-built virtualenvs, real wheels, a private uv cache, a private
REWHEEL_HOME per test. Helpers for specific areas live in tests/support_*.py."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rewheel.installer import find_uv as uv_bin
from rewheel.wheelbuild import build_wheel

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def rewheel_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "rewheel-home"
    monkeypatch.setenv("REWHEEL_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def uv_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A uv cache private to this test session: tests neither use nor pollute the user's."""
    return tmp_path_factory.mktemp("uv-cache")


@pytest.fixture(autouse=True)
def _uv_env(uv_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))
    monkeypatch.setenv("UV_NO_PROGRESS", "1")
    monkeypatch.delenv("UV_INDEX_URL", raising=False)
    monkeypatch.delenv("UV_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)


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


def toy_files(version: str, *, body: str = "", extra: dict[str, str] | None = None) -> dict[str, str]:
    files = {
        "toypkg/__init__.py": f'__version__ = "{version}"\n',
        "toypkg/core.py": f"def answer():\n    return 42\n{body}",
        "toypkg/data/config.json": '{"layers": 2}\n',
    }
    files.update(extra or {})
    return files


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real wheels: two versions of toypkg and a helper package, as a find-links folder."""
    d = tmp_path_factory.mktemp("wheelhouse")
    build_wheel(d, "toypkg", "1.0.0", toy_files("1.0.0"), requires=["toyhelper>=1"],
                project_urls={"Source": "https://example.invalid/toy/toypkg"},
                console_scripts={"toypkg-serve": "toypkg.core:answer"})
    build_wheel(d, "toypkg", "2.0.0", toy_files("2.0.0", body="def new():\n    return 2\n",
                                                extra={"toypkg/added.py": "ADDED = True\n"}),
                requires=["toyhelper>=1"], project_urls={"Source": "https://example.invalid/toy/toypkg"},
                console_scripts={"toypkg-serve": "toypkg.core:answer"})
    build_wheel(d, "toyhelper", "1.0.0", {"toyhelper/__init__.py": "HELP = 1\n"})
    build_wheel(d, "toyhelper", "1.1.0", {"toyhelper/__init__.py": "HELP = 2\n"})
    return d


# Stand-in systemctl / journalctl / nvidia-smi on PATH (see tests/support_standins.py).
from support_standins import fake_host  # noqa: E402,F401
