"""What a command asks another process once: the environment probe per interpreter (asked again
when the environment at that path is new) and uv's version per uv binary."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rewheel import environment, installer, proc
from rewheel.environment import Environment


def _venv(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    py = root / "bin" / "python"
    py.write_text("#!/bin/sh\n")
    py.chmod(0o755)
    return py


def _answer(prefix: Path) -> str:
    site = str(prefix / "lib" / "python3.11" / "site-packages")
    return json.dumps({"prefix": str(prefix), "base_prefix": "/usr", "executable": str(prefix / "bin" / "python"),
                       "version": "3.11.7", "implementation": "cpython", "purelib": site, "platlib": site,
                       "scripts": str(prefix / "bin"), "sitepackages": [site]}) + "\n"


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []

    def run(argv, **kw):  # noqa: ANN001, ANN003
        calls.append([str(a) for a in argv])
        if argv[-1] == "--version":
            return proc.Completed(list(argv), 0, "uv 0.13.9 (x86_64-unknown-linux-gnu)\n", "")
        prefix = Path(argv[0]).parent.parent
        return proc.Completed(list(argv), 0, _answer(prefix), "")

    monkeypatch.setattr(proc, "run", run)
    monkeypatch.setattr(environment, "_answers", {})
    monkeypatch.setattr(installer, "_versions", {})
    return calls


def test_an_environment_inspected_twice_is_probed_once(tmp_path: Path, asked: list[list[str]]) -> None:
    py = _venv(tmp_path / "env")
    first, second = Environment.inspect(py), Environment.inspect(py)
    assert first == second and first.prefix == tmp_path / "env"
    assert len(asked) == 1


def test_a_recreated_environment_at_the_same_path_is_probed_again(tmp_path: Path, asked: list[list[str]]) -> None:
    py = _venv(tmp_path / "env")
    Environment.inspect(py)
    # A staged swap or `uv venv --clear`: new files at the same paths.
    (tmp_path / "env").rename(tmp_path / "old")
    _venv(tmp_path / "env")
    Environment.inspect(py)
    assert len(asked) == 2
    # Another environment is its own question.
    Environment.inspect(_venv(tmp_path / "other"))
    assert len(asked) == 3


def test_a_failed_probe_is_not_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          asked: list[list[str]]) -> None:
    py = _venv(tmp_path / "env")
    real_run = proc.run
    monkeypatch.setattr(proc, "run", lambda argv, **kw: proc.Completed(list(argv), 1, "", "broken"))
    with pytest.raises(Exception, match="failed to start"):
        Environment.inspect(py)
    monkeypatch.setattr(proc, "run", real_run)
    Environment.inspect(py)
    assert len(asked) == 1


def test_uv_is_asked_its_version_once_per_binary(tmp_path: Path, asked: list[list[str]]) -> None:
    uv = tmp_path / "uv"
    uv.write_text("#!/bin/sh\n")
    assert installer.uv_version(str(uv)) == installer.uv_version(str(uv)) == "0.13.9"
    assert len(asked) == 1
    os.utime(uv, ns=(1, 1))  # replaced (an upgrade of uv): asked again
    installer.uv_version(str(uv))
    assert len(asked) == 2
