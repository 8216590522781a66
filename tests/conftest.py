"""Shared fixtures only: real wheels, a private uv cache, a private REWHEEL_HOME per test.
Helpers live in tests/support_*.py (virtualenvs and uv in support_env.py), imported by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
# The repository root, for `devtools` (the wheel builder, the local index, the demo, the
# benchmarks): not installed with rewheel, and not on sys.path when pytest runs as a script.
if str(TESTS.parent) not in sys.path:
    sys.path.insert(0, str(TESTS.parent))

from devtools.wheelbuild import build_wheel  # noqa: E402


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
