"""`rewheel check` resolves the recipe's packages against its index (uv's dry run), so a
misspelled package, or a version no index has, fails `check` — not only
`run --dry-run`. A real venv, a real local index, the real uv."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import tomli_w

from devtools.localindex import serve_index
from support_env import make_venv, uv
from support_index import toy_wheels
import support_cli


@pytest.fixture
def world(tmp_path: Path):
    wheels = toy_wheels(tmp_path / "wheels", toypkg=("1.0.0", "2.0.0"))
    with serve_index(wheels) as index:
        py = make_venv(tmp_path / "env")
        uv("pip", "install", "-q", "--python", str(py), "--index-url", index.url, "toypkg==1.0.0")
        yield tmp_path, py, index.url


def check(tmp: Path, py: Path, index_url: str, packages: list[str], **install: object) -> tuple[int, dict]:
    recipe = tmp / "r.toml"
    recipe.write_text(tomli_w.dumps({"environment": {"python": str(py)},
                                     "install": {"packages": packages, "index_url": index_url, **install}}))
    cp = support_cli.rewheel("check", str(recipe), "--json", stdin=subprocess.DEVNULL, timeout=180)
    assert "Traceback" not in cp.stderr
    return cp.returncode, json.loads(cp.stdout)


def resolve_check(doc: dict) -> dict:
    return next(c for c in doc["checks"] if c["name"] == "resolve")


def test_check_resolves_the_packages(world) -> None:
    tmp, py, url = world
    code, doc = check(tmp, py, url, ["toypkg"])
    assert code == 0, doc
    c = resolve_check(doc)
    assert c["ok"] and "toypkg 1.0.0 → 2.0.0" in c["detail"]


def test_a_misspelled_package_fails_check(world) -> None:
    tmp, py, url = world
    code, doc = check(tmp, py, url, ["toypgk"])
    assert code == 2 and doc["ok"] is False
    c = resolve_check(doc)
    assert not c["ok"] and "toypgk" in c["detail"]
    # The indexes themselves answer: only the resolve fails.
    assert [x["name"] for x in doc["checks"] if not x["ok"]] == ["resolve"]


def test_a_version_no_index_has_fails_check(world) -> None:
    tmp, py, url = world
    code, doc = check(tmp, py, url, ["toypkg==9.9"])
    assert code == 2 and not resolve_check(doc)["ok"] and "9.9" in resolve_check(doc)["detail"]
