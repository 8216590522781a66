"""`rewheel ci` starts its throwaway environment from the target environment's pinned set and
applies the recipe's upgrade on top, so the smoke test sees the host's neighbours: a package
the recipe does not name is there, at the host's version, and a dependency keeps the host's
version although the index has a newer one. `--packages-only` is the recipe's packages alone.
A real target venv, real wheels on a real local index, real uv, a real smoke test."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import tomli_w

from devtools.localindex import serve_index
from devtools.wheelbuild import build_wheel
from support_env import make_venv, uv
from support_nightly import build_toypkg, fake_sha, json_of, nightly_version, rewheel

# The smoke test fails unless the host's neighbour is importable, at the host's version.
NEEDS_NEIGHBOUR = """
import sys, toyextra, toyhelper
sys.exit(0 if (toyextra.V, toyhelper.HELP) == ("1.0.0", "1.0.0") else 3)
"""


@pytest.fixture
def world(tmp_path: Path):
    wheels = tmp_path / "wheels"
    old, new = nightly_version(300, fake_sha(0)), nightly_version(301, fake_sha(1))
    build_toypkg(wheels, old, bad=False, helper=True)
    build_toypkg(wheels, new, bad=False, helper=True)
    for v in ("1.0.0", "1.1.0"):
        build_wheel(wheels, "toyhelper", v, {"toyhelper/__init__.py": f'HELP = "{v}"\n'})
    for v in ("1.0.0", "2.0.0"):
        build_wheel(wheels, "toyextra", v, {"toyextra/__init__.py": f'V = "{v}"\n'})
    with serve_index(wheels) as index:
        target = make_venv(tmp_path / "host-env")
        uv("pip", "install", "-q", "--python", str(target), "--index-url", index.url, "--prerelease", "allow",
           f"toypkg=={old}", "toyhelper==1.0.0", "toyextra==1.0.0")
        script = tmp_path / "smoke_neighbours.py"
        script.write_text(NEEDS_NEIGHBOUR)
        recipe = tmp_path / "toy.toml"
        recipe.write_text(tomli_w.dumps({
            "name": "toy", "environment": {"python": str(target)},
            "install": {"packages": ["toypkg"], "index_url": index.url, "prerelease": True},
            "smoke": {"command": ["{python}", str(script)], "timeout_s": 60}}))
        yield recipe, target, old, new


def locked(doc: dict) -> dict[str, str]:
    data = tomllib.loads(Path(doc["lock"]).read_text())
    return {p["name"]: p["version"] for p in data["packages"]}


def test_ci_starts_from_the_target_environment(world, tmp_path: Path) -> None:
    recipe, target, old, new = world
    before = sorted(p.name for p in target.parent.parent.rglob("*"))
    cp = rewheel("ci", str(recipe), "--json", "-q", "--lockfiles", str(tmp_path / "locks"))
    doc = json_of(cp)
    assert cp.returncode == 0, (doc.get("failure"), cp.stderr)
    assert doc["status"] == "qualified" and doc["version"] == new  # the recipe's upgrade applied
    assert doc["base"]["from"] == str(target.parent.parent) and doc["base"]["pinned"] == 2
    assert Path(doc["base"]["pins"]).read_text() == "toyextra==1.0.0\ntoyhelper==1.0.0\n"
    # The neighbours as on the host: toyextra (which nothing requires) at 1.0.0, toyhelper at
    # 1.0.0 although 1.1.0 is newer; the smoke test checked both.
    assert locked(doc) == {"toypkg": new, "toyhelper": "1.0.0", "toyextra": "1.0.0"}
    assert doc["versions"]["toyextra"] == "1.0.0"
    assert sorted(p.name for p in target.parent.parent.rglob("*")) == before  # the host untouched
    human = rewheel("ci", str(recipe), "-q", "--lockfiles", str(tmp_path / "locks"))
    assert human.returncode == 0 and "started from" in " ".join(human.stdout.split())


def test_packages_only_is_the_recipe_alone(world, tmp_path: Path) -> None:
    recipe, target, old, new = world
    cp = rewheel("ci", str(recipe), "--packages-only", "--json", "-q", "--lockfiles", str(tmp_path / "locks"))
    doc = json_of(cp)
    # Without the host's neighbour the smoke test fails: exactly what `ci` used to miss.
    assert cp.returncode == 1 and doc["failure"]["step"] == "smoke"
    assert locked(doc) == {"toypkg": new, "toyhelper": "1.1.0"}
    assert doc["base"] == {"from": None, "reason": "--packages-only: the recipe's packages alone"}


def test_a_failing_upgrade_names_its_suspects_against_the_target(tmp_path: Path) -> None:
    """The nightly breaks `init_model`: the root cause's frame is in the file the upgrade
    changed, so that file is the first suspect, with the hunk around the failing line; the
    target environment (the old side) is compared by RECORD and left untouched."""
    wheels = tmp_path / "wheels"
    old, new = nightly_version(300, fake_sha(0)), nightly_version(301, fake_sha(1))
    build_toypkg(wheels, old, bad=False)
    build_toypkg(wheels, new, bad=True)
    with serve_index(wheels) as index:
        target = make_venv(tmp_path / "host-env")
        uv("pip", "install", "-q", "--python", str(target), "--index-url", index.url, "--prerelease", "allow",
           f"toypkg=={old}")
        script = tmp_path / "smoke_init.py"
        script.write_text("from toypkg.core import init_model\ninit_model()\n")
        recipe = tmp_path / "toy.toml"
        recipe.write_text(tomli_w.dumps({
            "name": "toy", "environment": {"python": str(target)},
            "install": {"packages": ["toypkg"], "index_url": index.url, "prerelease": True},
            "smoke": {"command": ["{python}", str(script)], "timeout_s": 60}}))
        cp = rewheel("ci", str(recipe), "--json", "-q", "--lockfiles", str(tmp_path / "locks"))
        human = rewheel("ci", str(recipe), "-q", "--lockfiles", str(tmp_path / "locks"))
    doc = json_of(cp)
    assert cp.returncode == 1 and doc["failure"]["step"] == "smoke" and doc["version"] == new
    rc = doc["root_cause"]
    assert rc["type"] == "ValueError"
    top = rc["suspects"][0]
    assert (top["path"], top["package"], top["change"]) == ("toypkg/core.py", "toypkg", "changed")
    assert top["distance_lines"] == 0  # the raise itself is in the new version's hunk
    assert any("q_lora_rank" in h["text"] for h in top["hunks"])
    assert "suspects" in human.stdout and "toypkg/core.py" in human.stdout
