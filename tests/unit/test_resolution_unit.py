"""The resolution's pure parts, without uv: reading uv's explanations (as uv 0.13 and older
uv versions print them), telling "nothing newer" from "held back", the kept run's status, the
install-against-plan check, the modules a distribution provides, and what uv says it fetched."""

from __future__ import annotations

from pathlib import Path

import pytest

from rewheel.environment import read_distribution
from rewheel.installer import fetched_lines
from rewheel.resolution import _REASON, _explanation, _named_version, _with, installed_as_planned
from rewheel.commands.results import kept_status

UV_013 = """Using Python 3.11.7 environment at: base
error: No solution found when resolving dependencies
  cause: Because there is no version of flashinfer-python==0.7.3 and vllm>=0.34.0 depends on flashinfer-python==0.7.3, we can conclude that vllm>=0.34.0 cannot be used.
         And because only the following versions of vllm are available:
             vllm<=0.33.0
             vllm>=0.34.0
         and you require vllm>0.33.0, we can conclude that your requirements are unsatisfiable.""".splitlines()

UV_OLD = """  × No solution found when resolving dependencies:
  ╰─▶ Because the current Python version (3.11.7) does not satisfy Python>=3.12 and django>=6.0 depends on Python>=3.12, we can conclude that django>=6.0 cannot be used.
      And because you require django>5.2.8, we can conclude that your requirements are unsatisfiable.""".splitlines()

NOTHING_NEWER = """error: No solution found when resolving dependencies
  cause: Because only toypkg<=3.0.0 is available and you require toypkg>3.0.0, we can conclude that your requirements are unsatisfiable.""".splitlines()


def test_uv_explanations_become_sentences_without_prefixes() -> None:
    why = _explanation(UV_013)
    assert why[0].startswith("Because there is no version of flashinfer-python==0.7.3")
    assert why[0].endswith("cannot be used.")
    assert not any(s.startswith(("error", "cause", "No solution", "Using Python")) for s in why)
    old = _explanation(UV_OLD)
    assert old[0].startswith("Because the current Python version (3.11.7)") and "╰─▶" not in " ".join(old)


def test_a_reason_is_told_apart_from_nothing_newer() -> None:
    assert _REASON.search(" ".join(_explanation(UV_013)))
    assert _REASON.search(" ".join(_explanation(UV_OLD)))
    assert not _REASON.search(" ".join(_explanation(NOTHING_NEWER)))


def test_the_newest_version_named_in_an_explanation() -> None:
    from packaging.version import Version

    assert _named_version("vllm", UV_013, Version("0.33.0")) == "0.34.0"
    assert _named_version("django", UV_OLD, Version("5.2.8")) == "6.0"
    assert _named_version("toypkg", NOTHING_NEWER, Version("3.0.0")) is None


def test_an_extra_specifier_joins_the_recipe_package_only() -> None:
    assert _with(["vllm[audio]>=0.16; python_version>='3.10'", "torch"], "vllm", ">0.33.0") == \
        ['vllm[audio]>=0.16,>0.33.0; python_version >= "3.10"', "torch"]
    assert _with(["boto3"], "boto3", ">=1.35.0") == ["boto3>=1.35.0"]


def test_held_back_asks_for_newer_than_the_public_version_of_a_nightly(tmp_path: Path) -> None:
    """vLLM nightlies carry local labels (`+g5719a4e4e`), which no ordered comparison may hold."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    asked = _with(["vllm"], "vllm", f">{Version('0.16.0rc2.dev344+g5719a4e4e').public}")
    req = Requirement(asked[0])
    assert str(req.specifier) == ">0.16.0rc2.dev344"
    assert not req.specifier.contains("0.16.0rc2.dev344+g5719a4e4e", prereleases=True)
    assert req.specifier.contains("0.16.0rc2.dev345+g0000000", prereleases=True)


@pytest.mark.parametrize("before, after, reinstalled, status", [
    ({"a": "1"}, {"a": "2"}, True, "upgraded"),
    ({"a": "1"}, {"a": "1", "b": "1"}, False, "upgraded"),  # a distribution added
    ({"a": "1"}, {"a": "1"}, True, "reinstalled"),
    ({"a": "1"}, {"a": "1"}, False, "unchanged"),
])
def test_a_kept_run_says_upgraded_only_when_a_version_changed(before, after, reinstalled, status) -> None:
    assert kept_status(before, after, reinstalled) == status


def test_the_install_is_checked_against_the_plan() -> None:
    assert installed_as_planned({"vllm": "0.33.0", "torch": "2.14.0"}, {"vllm": "0.33.0", "torch": "2.14.0"}) == []
    assert installed_as_planned({"vllm": "0.33.0"}, {"vllm": "0.32.0"}) == ["vllm: planned 0.33.0, installed 0.32.0"]
    assert installed_as_planned({"x": "1.0"}, {}) == ["x: planned 1.0, installed nothing"]
    assert installed_as_planned({"x": "1.0"}, {"x": "1.0.0"}) == []  # the same version, spelled otherwise


def _dist(site: Path, name: str, rows: list[str]) -> list[str]:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "RECORD").write_text("".join(f"{r},,\n" for r in rows + [f"{info.name}/RECORD"]))
    dist = read_distribution(info, site)
    assert dist is not None
    return dist.import_names


def test_import_names_are_modules_python_can_import(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    # numpy.libs sorts before numpy; .data and .dist-info are never modules; a script is outside.
    assert _dist(site, "numpy", ["numpy.libs/libopenblas.so", "numpy/__init__.py", "numpy/core/x.py",
                                 "numpy-1.0.data/scripts/f2py", "../../bin/f2py"]) == ["numpy"]
    # A namespace package: what the distribution put inside it.
    assert _dist(site, "jaraco.functools", ["jaraco/functools/__init__.py", "jaraco/functools/py.typed"]) == \
        ["jaraco.functools"]
    # The module named like the distribution first; a .pth file is not a module.
    assert _dist(site, "setuptools", ["_distutils_hack/__init__.py", "distutils-precedence.pth",
                                      "pkg_resources/__init__.py", "setuptools/__init__.py"]) == \
        ["setuptools", "_distutils_hack", "pkg_resources"]
    # Single-file modules and extension modules; no __pycache__, no data files at the top.
    assert _dist(site, "six", ["six.py", "__pycache__/six.cpython-311.pyc", "LICENSE"]) == ["six"]
    assert _dist(site, "fastext", ["_fastext.cpython-311-x86_64-linux-gnu.so", "fastext.pyi"]) == \
        ["fastext", "_fastext"]


def test_what_uv_says_it_fetched() -> None:
    lines = ["Resolved 3 packages in 10ms", "Downloading numpy (16.1MiB)", " Downloaded numpy",
             "Downloading torch (528.9MiB)", "Prepared 2 packages in 3.1s", " + numpy==2.2.6"]
    assert fetched_lines(lines) == ["numpy (16.1MiB)", "torch (528.9MiB)"]
    assert fetched_lines(["Prepared 10 packages in 1ms", "Installed 10 packages in 205ms"]) == []
