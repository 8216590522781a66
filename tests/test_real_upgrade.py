"""The upgrade on real wheels from the package index (tests/support_realwheels.py), served on a
loopback index, through the CLI: the plan is the lock and the lock is what gets installed —
staged and not, `reinstall = "named"` and `"all"` — with what toy wheels never have: a
neighbour pinned by the upgraded package that must move (boto3 pins botocore), bundled-library
folders (`numpy.libs`), a real binary break (pandas 2.0 on numpy 2), a namespace package, a
`.pth` file, a newest release that needs a newer Python, and uv's cache entries a patch
written in place corrupted."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from devtools.localindex import serve_index
from devtools.wheelbuild import build_wheel
from rewheel.environment import Environment
from support_env import make_venv, tree_state, uv
from support_realwheels import real_wheels
import support_cli

BOTO_134 = ("boto3==1.34.0", "botocore==1.34.0", "s3transfer==0.9.0", "jmespath==1.0.1", "urllib3==2.0.7",
            "python-dateutil==2.9.0.post0", "six==1.16.0")


@pytest.fixture(scope="module")
def index() -> Iterator[str]:
    with serve_index(real_wheels()) as server:
        yield server.url


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    cp = support_cli.rewheel(*args, "--json", stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}, timeout=600)
    try:
        doc = json.loads(cp.stdout) if cp.stdout.strip() else {}
    except ValueError:
        raise AssertionError(f"not JSON:\n{cp.stdout}\n{cp.stderr}") from None
    return cp.returncode, doc, cp.stderr


def venv(tmp_path: Path, index: str, *specs: str, link_mode: str = "copy") -> Path:
    python = make_venv(tmp_path / "env")
    uv("pip", "install", "-q", "--python", str(python), "--index-url", index, "--link-mode", link_mode, *specs)
    return python


def recipe(tmp_path: Path, python: Path, index: str, packages: list[str], *, staged: bool = True,
           reinstall: str = "named", smoke: list[str] | None = None, precheck: list[str] | None = None) -> Path:
    doc: dict[str, Any] = {"name": "real", "environment": {"python": str(python)},
                           "install": {"packages": packages, "index_url": index, "staged": staged,
                                       "reinstall": reinstall}}
    if smoke or precheck:
        doc["smoke"] = {"command": smoke or ["{python}", "-c", "pass"], "timeout_s": 300, "gpus": 0,
                        **({"precheck": precheck} if precheck else {})}
    path = tmp_path / "real.toml"
    path.write_text(tomli_w.dumps(doc), encoding="utf-8")
    return path


def freeze(python: Path) -> dict[str, str]:
    out = uv("pip", "freeze", "--python", str(python)).stdout
    return dict(line.split("==", 1) for line in out.splitlines() if "==" in line)


def planned(doc: dict[str, Any]) -> dict[str, tuple[str | None, str | None]]:
    return {c["name"]: (c["old"], c["new"]) for c in doc["plan"]["changes"] if c["old"] != c["new"]}


# -- the plan is the lock, and the lock is what is installed ----------------------------------------
@pytest.mark.parametrize("staged", [True, False], ids=["staged", "unstaged"])
@pytest.mark.parametrize("reinstall", ["named", "all"])
def test_a_pinned_neighbour_moves_and_nothing_else_does(tmp_path: Path, index: str, staged: bool,
                                                        reinstall: str) -> None:
    """boto3 1.34 pins botocore <1.35: upgrading boto3 must move botocore and s3transfer with it
    (the staged prepare once kept every neighbour pinned and so kept boto3 too), and must leave
    numpy at 1.26.4 although the index offers 2.2.6 (`reinstall = "all"` once upgraded it)."""
    python = venv(tmp_path, index, *BOTO_134, "numpy==1.26.4")
    before_tree = tree_state(tmp_path / "env")
    before = freeze(python)
    r = recipe(tmp_path, python, index, ["boto3"], staged=staged, reinstall=reinstall,
               smoke=["{python}", "-c", "import boto3, botocore, numpy; print(boto3.__version__)"])

    rc, plan, err = cli("run", str(r), "--dry-run")
    assert rc == 0, err
    want = {"boto3": ("1.34.0", "1.35.0"), "botocore": ("1.34.0", "1.35.0"), "s3transfer": ("0.9.0", "0.10.0")}
    assert planned(plan) == want
    again = {c["name"] for c in plan["plan"]["changes"] if c["change"] == "reinstall"}
    assert again == (set(before) - set(want) if reinstall == "all" else set())
    assert Path(plan["plan"]["lock"]).is_file()
    assert freeze(python) == before and tree_state(tmp_path / "env") == before_tree  # a dry run changes nothing

    rc, run, err = cli("run", str(r), "--yes")
    assert (rc, run["status"]) == (0, "upgraded"), err
    after = freeze(python)
    # Installed = planned: every planned version, and every other distribution as it was.
    assert after == {**before, **{n: new for n, (_old, new) in want.items()}}
    assert run["after"] == after and after["numpy"] == "1.26.4"
    if staged:
        assert run["fetched_after_stop"] == []

    rc, back, err = cli("rollback", str(r), "--yes")
    assert rc == 0, err
    assert freeze(python) == before and tree_state(tmp_path / "env") == before_tree


def test_numpy_is_imported_by_its_module_not_its_libs_folder(tmp_path: Path, index: str) -> None:
    """numpy's wheel ships `numpy.libs/` (bundled shared libraries), which sorts before
    `numpy/`: the staged pre-check imports `numpy`, and the run upgrades it."""
    python = venv(tmp_path, index, "numpy==1.26.4")
    env = Environment.inspect(python)
    numpy = next(d for d in env.distributions() if d.name == "numpy")
    assert any("/numpy.libs/" in e.path for e in numpy.record)  # the real wheel's shape
    assert numpy.import_names == ["numpy"]
    rc, run, err = cli("run", str(recipe(tmp_path, python, index, ["numpy"])), "--yes")
    assert (rc, run["status"]) == (0, "upgraded"), err
    imports = next(c for c in run["prepared"]["checks"] if c["name"] == "imports")
    assert imports["ok"] and imports["detail"] == "imported numpy"
    assert freeze(python)["numpy"] == "2.2.6"


def test_namespace_packages_and_pth_files_give_their_import_names(tmp_path: Path, index: str) -> None:
    """jaraco.functools lives in the namespace package `jaraco/` (no `__init__.py`); setuptools
    ships `distutils-precedence.pth` and `_distutils_hack/` beside `setuptools/`. The staged
    pre-check imports `jaraco.functools` and `setuptools`."""
    python = venv(tmp_path, index, "jaraco.functools==4.0.0", "setuptools==69.5.1")
    dists = {d.name: d for d in Environment.inspect(python).distributions()}
    assert dists["jaraco-functools"].import_names == ["jaraco.functools"]
    names = dists["setuptools"].import_names
    assert names[0] == "setuptools" and "_distutils_hack" in names
    assert not any(n.endswith(".pth") or "-" in n for n in names)
    rc, run, err = cli("run", str(recipe(tmp_path, python, index, ["jaraco.functools", "setuptools"])), "--yes")
    assert (rc, run["status"]) == (0, "upgraded"), err
    imports = next(c for c in run["prepared"]["checks"] if c["name"] == "imports")
    assert imports["detail"] == "imported jaraco.functools, setuptools"
    assert {k: freeze(python)[k] for k in ("jaraco-functools", "setuptools")} == \
        {"jaraco-functools": "4.0.1", "setuptools": "70.0.0"}


# -- a real binary break ---------------------------------------------------------------------------
def test_numpy_2_under_pandas_2_0_is_rejected_before_the_stop(tmp_path: Path, index: str) -> None:
    """pandas 2.0.3 was built against numpy 1.x and declares no upper bound: the upgrade of
    numpy resolves to 2.2.6, and importing pandas then fails. Staged, the precheck finds it in
    the throwaway environment: rejected, the live environment untouched."""
    python = venv(tmp_path, index, "pandas==2.0.3", "numpy==1.26.4")
    before = tree_state(tmp_path / "env")
    r = recipe(tmp_path, python, index, ["numpy"], precheck=["{python}", "-c", "import pandas"])
    rc, run, err = cli("run", str(r), "--yes")
    assert (rc, run["status"]) == (1, "rejected"), err
    assert run["attempted"]["numpy"] == "2.2.6"
    assert "numpy.dtype size changed" in (run["root_cause"] or {}).get("message", "") + err
    assert tree_state(tmp_path / "env") == before


def test_numpy_2_under_pandas_2_0_is_reverted_unstaged(tmp_path: Path, index: str) -> None:
    python = venv(tmp_path, index, "pandas==2.0.3", "numpy==1.26.4")
    before = tree_state(tmp_path / "env")
    r = recipe(tmp_path, python, index, ["numpy"], staged=False, smoke=["{python}", "-c", "import pandas"])
    rc, run, err = cli("run", str(r), "--yes")
    assert (rc, run["status"]) == (1, "reverted"), err
    assert run["attempted"]["numpy"] == "2.2.6" and run["root_cause"]["type"] == "ValueError"
    assert tree_state(tmp_path / "env") == before


# -- guards ------------------------------------------------------------------------------------------
def test_a_newer_release_that_needs_a_newer_python_is_reported_as_held_back(tmp_path: Path, index: str) -> None:
    """Django 6.0 needs Python 3.12: the upgrade takes 5.2.8, and says why not 6.0."""
    python = venv(tmp_path, index, "django==5.1.4")
    rc, plan, err = cli("run", str(recipe(tmp_path, python, index, ["django"])), "--dry-run")
    assert rc == 0, err
    assert planned(plan)["django"] == ("5.1.4", "5.2.8")
    held, = plan["plan"]["held_back"]
    assert (held["name"], held["resolved"], held["newest"]) == ("django", "5.2.8", "6.0")
    assert "Python" in " ".join(held["why"]) and "held back: django stays at 5.2.8" in err


def test_a_resolution_that_downgrades_a_recipe_package_is_refused(tmp_path: Path, index: str) -> None:
    """boto3 1.35 with the recipe also asking for botocore<1.35: uv would go back to boto3 1.34.
    Refused before anything is built, naming both versions and the package that forced it."""
    python = venv(tmp_path, index, "boto3==1.35.0")
    before = tree_state(tmp_path / "env")
    r = recipe(tmp_path, python, index, ["boto3", "botocore<1.35"])
    rc, doc, err = cli("run", str(r), "--yes")
    assert rc == 2 and doc["error"] == "ResolutionRefused", err
    assert "downgrade boto3 1.35.0 → 1.34.0" in doc["message"] and "botocore" in doc["message"]
    assert tree_state(tmp_path / "env") == before
    assert not list((Path(os.environ["REWHEEL_HOME"])).glob("envs/*/runs/*"))


def test_a_recipe_package_is_never_built_from_an_sdist(tmp_path: Path, index: str) -> None:
    """The newest toysdist is an sdist only (its build would fail loudly): the resolution keeps
    the wheel, builds nothing, and says the newer release was held back."""
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "toysdist", "1.0.0", {"toysdist/__init__.py": "V = 1\n"})
    _sdist(wheels, "toysdist", "2.0.0")
    with serve_index(wheels) as own:
        python = make_venv(tmp_path / "env")
        uv("pip", "install", "-q", "--python", str(python), "--index-url", own.url, "toysdist==1.0.0")
        rc, plan, err = cli("run", str(recipe(tmp_path, python, own.url, ["toysdist"])), "--dry-run")
    assert rc == 0, err
    assert planned(plan) == {}
    held, = plan["plan"]["held_back"]
    assert held["name"] == "toysdist" and held["resolved"] == "1.0.0" and held["why"]
    assert not (tmp_path / "built").exists()


def _sdist(folder: Path, name: str, version: str) -> None:
    """An sdist whose build would leave a mark (and fail): proof that nothing built it."""
    import io
    import tarfile

    base = f"{name}-{version}"
    setup = (f"import pathlib; pathlib.Path({str(folder.parent / 'built')!r}).write_text('built')\n"
             "raise SystemExit('this sdist must never be built')\n")
    files = {f"{base}/setup.py": setup,
             f"{base}/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"}
    with tarfile.open(folder / f"{base}.tar.gz", "w:gz") as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


# -- nothing fetched in the window -----------------------------------------------------------------
@pytest.mark.parametrize("staged", [True, False], ids=["staged", "unstaged"])
def test_a_patched_packages_clean_wheel_is_fetched_before_the_stop(tmp_path: Path, index: str,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   staged: bool) -> None:
    """numpy installed by uv's hard links, then patched in place: the patch changed uv's cached
    copy too, so its cache entry is cleaned and the clean wheel fetched again. Staged, that
    happens before the stop (the swap installs offline; nothing fetched after the stop); the
    unstaged cycle fetches it in the window, and says so."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))  # patched through its links
    python = venv(tmp_path, index, "numpy==1.26.4", "six==1.16.0", link_mode="hardlink")
    site = next((tmp_path / "env" / "lib").glob("python3*/site-packages"))
    target = site / "numpy" / "version.py"
    assert target.stat().st_nlink > 1
    with open(target, "a") as f:  # in place, through the link into uv's cache
        f.write("# local patch\n")
    r = recipe(tmp_path, python, index, ["six"], staged=staged, reinstall="all")
    rc, run, err = cli("run", str(r), "--yes")
    assert rc == 0, err
    assert run["status"] == "reinstalled"  # no version changed
    assert run["hazards"] == ["numpy"]
    fetched = [f.split(" ", 1)[0] for f in run["fetched_after_stop"]]
    assert fetched == ([] if staged else ["numpy"])
    if staged:
        assert any(s["name"] == "rewarm" for s in run["steps"])
    assert "# local patch" not in target.read_text()


# -- recovery from uv's default index ---------------------------------------------------------------
def test_an_edit_in_place_is_recovered_from_uvs_default_index_when_the_recipe_names_none(
        tmp_path: Path, index: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot shares a binary's inode with the environment (setuptools' `cli-64.exe`:
    sources are copied, never shared, but binaries keep their links); a write in place through
    it damages the snapshot too, and uv's cache does not have the wheel. The recipe names no
    index: the rollback fetches setuptools 69.5.1 from uv's default index, as the recipe's
    installs would, checks it against RECORD, and restores byte for byte."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    python = venv(tmp_path, index, "setuptools==69.5.1")
    site = next((tmp_path / "env" / "lib").glob("python3*/site-packages"))
    exe = site / "setuptools" / "cli-64.exe"
    r = tmp_path / "plain.toml"
    r.write_text(tomli_w.dumps({"name": "plain", "environment": {"python": str(python)},
                                "install": {"packages": ["setuptools"]}}))
    rc, snap, err = cli("snapshot", str(r))
    assert rc == 0, err
    # After the snapshot: setuptools' .pth runs `_distutils_hack` in every interpreter that
    # starts, and the first one wrote its byte-code (which the snapshot holds).
    before = tree_state(tmp_path / "env")
    assert exe.stat().st_nlink >= 2  # shared with the snapshot: what makes the write reach it
    with open(exe, "r+b") as f:  # in place: through the link into the snapshot
        f.seek(0)
        f.write(b"#")
    uv("cache", "clean")
    rc, doc, err = cli("rollback", str(r), snap["id"], "--yes")
    assert rc == 0, err
    assert [(x["path"].rsplit("/", 1)[1], x["source"]) for x in doc["recovered"]["recovered"]] == [
        ("cli-64.exe", "index")]
    assert tree_state(tmp_path / "env") == before
