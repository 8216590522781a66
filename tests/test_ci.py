"""`rewheel ci` against a real local index of real nightly wheels: JUnit XML (parsed), a Markdown
summary, a promoted PEP 751 lock that `uv pip sync` and `rewheel run --lock` install to the same
versions, and a failing nightly that is reported with its root cause and never promoted."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from support_env import make_venv, uv
from devtools.localindex import serve_index
from devtools.wheelbuild import build_wheel
from support_index import installed_version
from support_nightly import (build_toypkg, fake_sha, json_of, nightly_version, rewheel,
                             smoke_script, write_recipe)

GOOD = nightly_version(313, fake_sha(313))
BAD = nightly_version(344, fake_sha(344))


@pytest.fixture
def ci_index(tmp_path: Path):
    wheels = tmp_path / "wheels"
    build_toypkg(wheels, nightly_version(300, fake_sha(300)), bad=False, helper=True)
    build_toypkg(wheels, GOOD, bad=False, helper=True)
    build_wheel(wheels, "toyhelper", "1.0.0", {"toyhelper/__init__.py": "HELP = 1\n"})
    script, count = smoke_script(tmp_path)
    with serve_index(wheels) as index:
        recipe = write_recipe(tmp_path / "toy.toml", install={"index_url": index.url},
                              script=script, count=count)
        yield recipe, wheels, tmp_path


def cases(junit: Path) -> dict[str, ET.Element]:
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites"
    suite = root.find("testsuite")
    assert suite is not None
    return {c.get("name"): c for c in suite.findall("testcase")}


def test_qualifies_reports_and_promotes_a_lock_that_installs_the_same(ci_index) -> None:
    recipe, wheels, tmp = ci_index
    cp = rewheel("ci", str(recipe), "--packages-only", "--promote", "--junit", str(tmp / "junit.xml"),
                 "--summary", str(tmp / "summary.md"), "--lockfiles", str(tmp / "lockfiles"),
                 "--json", "-q")
    doc = json_of(cp)
    assert cp.returncode == 0, cp.stderr
    assert doc["status"] == "qualified"
    assert doc["version"] == GOOD
    assert doc["python_version"].startswith("%d.%d." % sys.version_info[:2])
    tc = cases(tmp / "junit.xml")
    assert list(tc) == ["environment", "resolve", "install", "diff", "smoke", "promote"]
    assert all(c.find("failure") is None and c.find("skipped") is None for c in tc.values())
    summary = (tmp / "summary.md").read_text()
    assert "qualified" in summary and GOOD in summary and "| smoke |" in summary

    lock = tmp / "lockfiles" / "pylock.toy.toml"
    assert doc["promoted"] == str(lock)
    data = tomllib.loads(lock.read_text())
    pkgs = {p["name"]: p for p in data["packages"]}
    assert pkgs["toypkg"]["version"] == GOOD and pkgs["toyhelper"]["version"] == "1.0.0"
    for p in pkgs.values():
        (wheel,) = p["wheels"]
        assert wheel["url"].startswith("http://127.0.0.1:") and wheel["url"].endswith(".whl")
        assert len(wheel["hashes"]["sha256"]) == 64

    # A newer nightly appears; the promoted lock still pins what CI proved.
    build_toypkg(wheels, nightly_version(350, fake_sha(350)), bad=False, helper=True)
    fresh = make_venv(tmp / "fresh")
    uv("pip", "sync", "--python", str(fresh), str(lock), env={"UV_PREVIEW_FEATURES": "pylock"})
    assert installed_version(fresh, "toypkg") == GOOD
    assert installed_version(fresh, "toyhelper") == "1.0.0"

    # `rewheel run RECIPE --lock` on a host environment installs exactly the same set.
    host = make_venv(tmp / "host")
    uv("pip", "install", "-q", "--python", str(host), "--no-index", "--find-links", str(wheels),
       "toyhelper==1.0.0", f"toypkg=={nightly_version(300, fake_sha(300))}")
    host_recipe = tmp / "host.toml"
    host_recipe.write_text(recipe.read_text().replace(sys.executable, str(host)))
    run = rewheel("run", str(host_recipe), "--lock", str(lock), "--yes", "--json", "-q")
    assert run.returncode == 0, run.stderr
    assert json_of(run)["after"]["toypkg"] == GOOD


def test_a_breaking_nightly_fails_with_its_root_cause_and_is_not_promoted(ci_index) -> None:
    recipe, wheels, tmp = ci_index
    lockdir = tmp / "lockfiles"
    first = rewheel("ci", str(recipe), "--packages-only", "--promote", "--lockfiles", str(lockdir), "--json", "-q")
    assert first.returncode == 0, first.stderr
    promoted = (lockdir / "pylock.toy.toml").read_text()

    build_toypkg(wheels, BAD, bad=True, helper=True)  # tonight's nightly breaks model init
    cp = rewheel("ci", str(recipe), "--packages-only", "--promote", "--lockfiles", str(lockdir),
                 "--junit", str(tmp / "junit.xml"), "--summary", str(tmp / "summary.md"),
                 "--board", str(tmp / "board"), "--json", "-q")
    doc = json_of(cp)
    assert cp.returncode == 1, cp.stderr
    assert doc["status"] == "failed" and doc["version"] == BAD
    assert doc["failure"]["step"] == "smoke"
    rc = doc["root_cause"]
    assert rc["type"] == "ValueError" and "must divide num_heads 7" in rc["message"]
    # the diff against the last qualified lock: dev313 -> dev344, 31 builds
    (change,) = [c for c in doc["changes"] if c["name"] == "toypkg"]
    assert (change["old"], change["new"], change["change"]) == (GOOD, BAD, "upgraded")
    assert change["dev_distance"] == 31
    assert change["compare_url"] == (f"https://github.com/example/toypkg/compare/"
                                     f"{fake_sha(313)[:9]}...{fake_sha(344)[:9]}")
    tc = cases(tmp / "junit.xml")
    failure = tc["smoke"].find("failure")
    assert failure is not None and "must divide num_heads 7" in (failure.text or "")
    assert tc["promote"].find("skipped") is not None
    assert tc["install"].find("failure") is None and tc["diff"].find("failure") is None
    root = ET.parse(tmp / "junit.xml").getroot()
    assert root.get("failures") == "1" and root.get("skipped") == "1"
    summary = (tmp / "summary.md").read_text()
    assert "failed" in summary and "ValueError" in summary
    assert (lockdir / "pylock.toy.toml").read_text() == promoted  # never overwritten
    # `--board`: the board, written in the same step, shows both verdicts the state now keeps.
    assert f"board: {tmp / 'board' / 'index.html'}" in cp.stderr
    nightlies = (tmp / "board" / "nightlies.html").read_text()
    assert nightlies.count('class="badge s-qualified"') >= 1 and nightlies.count('class="badge s-failed"') >= 1
    assert BAD in nightlies and GOOD in nightlies and "must divide num_heads 7" in nightlies
    assert change["compare_url"] in nightlies


def test_recipe_without_smoke_is_a_usage_error(ci_index) -> None:
    recipe, _, tmp = ci_index
    text = recipe.read_text()
    recipe.write_text(text[: text.index("[smoke]")])
    cp = rewheel("ci", str(recipe), "--packages-only", "--json")
    assert cp.returncode == 2
    assert "[smoke]" in json_of(cp)["message"]


def test_throwaway_environment_is_removed_and_live_python_untouched(ci_index) -> None:
    recipe, _, tmp = ci_index
    cp = rewheel("ci", str(recipe), "--packages-only", "--json", "-q")
    doc = json_of(cp)
    assert cp.returncode == 0, cp.stderr
    assert not (Path(doc["run_dir"]) / "env").exists()
    assert Path(doc["logs"]["smoke"]).is_file()
    assert doc["promoted"] is None  # only --promote writes a lock
    assert [s["name"] for s in doc["steps"]] == ["environment", "resolve", "install", "diff", "smoke"]
    # the recipe's own interpreter (the test runner's) did not get toypkg installed
    probe = subprocess.run([sys.executable, "-c", "import toypkg"], capture_output=True)
    assert probe.returncode != 0
