"""The installer's temporary folder: made only for a file it holds (the kept versions'
constraints), so that a rewheel killed mid-uv leaves nothing in the temporary folder when it
kept nothing, and removed when the install ends."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest

from rewheel import installer
from rewheel.recipe import InstallSpec, Recipe


@pytest.fixture
def tmpdir_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def recipe(tmp_path: Path) -> Recipe:
    return Recipe(name="env", python=Path(sys.executable), path=tmp_path / "recipe.toml",
                  install=InstallSpec(packages=("vllm",), reinstall="named"))


def test_nothing_kept_makes_no_temporary_folder(tmp_path: Path, tmpdir_root: Path) -> None:
    with installer._prepared(recipe(tmp_path), None, None, None, (), True, None) as (argv, lock):
        assert list(tmpdir_root.iterdir()) == []
        assert "--constraints" not in argv and lock is None
    assert list(tmpdir_root.iterdir()) == []


def test_kept_versions_are_a_constraint_file_removed_afterwards(tmp_path: Path, tmpdir_root: Path) -> None:
    keep = {"Foo_Bar": "1.0", "aaa": "2"}
    with installer._prepared(recipe(tmp_path), None, None, keep, (), True, None) as (argv, _):
        made = list(tmpdir_root.iterdir())
        assert [p.name.startswith("rewheel-uv-") for p in made] == [True]
        constraints = made[0] / "keep-constraints.txt"
        assert argv[argv.index("--constraints") + 1] == str(constraints)
        assert constraints.read_text() == "aaa==2\nfoo-bar==1.0\n"
    assert list(tmpdir_root.iterdir()) == []
