"""`rewheel diff --patch` has one path base a person can apply from: the environment's prefix,
named on the patch's `# patch:` line (and in `diff --help`); `--path` globs match paths
relative to that same base. Written to a file, the patch applies with real `git apply` from
there — a console script in bin/ and files in site-packages alike."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import support_cli
from devtools.wheelbuild import build_wheel
from support_diff import edit_by_replace, site_packages
from support_env import make_venv, uv_install

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

HEADER = re.compile(r"^# patch: paths relative to (?P<base>.+); apply there: cd (?P<cd>\S+) && git apply FILE$", re.M)


def _git(*args: str, cwd: Path, ceiling: Path) -> subprocess.CompletedProcess[str]:
    # (GIT_CEILING_DIRECTORIES: never a repository above the temporary folder)
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "GIT_CEILING_DIRECTORIES": str(ceiling)})


def _files(root: Path, rels: list[str]) -> dict[str, bytes | None]:
    return {r: (root / r).read_bytes() if (root / r).exists() else None for r in rels}


def test_a_patch_has_one_base_and_applies_from_it(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "toyscript", "1.0", {"toyscript/__init__.py": "", "toyscript/cli.py": "def main():\n    return 0\n",
                                             "toyscript/old.py": "OLD = 1\n"},
                console_scripts={"toyscript": "toyscript.cli:main"})
    py = make_venv(tmp_path / "env")
    uv_install(py, "toyscript==1.0", find_links=wheels)
    prefix = py.parent.parent
    site = site_packages(py)
    sp = str(site.relative_to(prefix))
    cp = support_cli.rewheel("snapshot", "--python", str(py), "--json")
    assert cp.returncode == 0, cp.stderr
    snap = json.loads(cp.stdout)["id"]

    # Hand edits on both sides of the old split: a console script in bin/, sources in site-packages.
    rels = ["bin/toyscript", f"{sp}/toyscript/cli.py", f"{sp}/toyscript/old.py", f"{sp}/toyscript/new.py"]
    before = _files(prefix, rels)
    edit_by_replace(prefix / "bin" / "toyscript", "import sys", "import sys  # hand-edited")
    edit_by_replace(site / "toyscript" / "cli.py", "return 0", "return 1")
    (site / "toyscript" / "old.py").unlink()
    (site / "toyscript" / "new.py").write_text("NEW = 2\n")
    after = _files(prefix, rels)

    cp = support_cli.rewheel("diff", "--python", str(py), snap, "--patch")
    assert cp.returncode == 0, cp.stderr
    patch = tmp_path / "x.patch"
    patch.write_text(cp.stdout)
    [m] = HEADER.finditer(cp.stdout)
    assert m["base"] == m["cd"] == str(prefix), cp.stdout
    labels = sorted(set(re.findall(r"^(?:---|\+\+\+) [ab]/(\S+)$", cp.stdout, re.M)))
    assert labels == sorted(rels), cp.stdout  # every path from the one base, bin/ included
    # The listing above the diffs (which git apply skips) keeps its short names.
    assert " M toyscript/cli.py" in cp.stdout and " M bin/toyscript" in cp.stdout

    # Applied from the base the header names, with real git: backwards to the snapshot, then
    # forwards to the edits again, byte for byte.
    rev = _git("apply", "-R", "-v", str(patch), cwd=Path(m["base"]), ceiling=tmp_path)
    assert rev.returncode == 0, rev.stderr + cp.stdout
    assert _files(prefix, rels) == before
    fwd = _git("apply", "-v", str(patch), cwd=Path(m["base"]), ceiling=tmp_path)
    assert fwd.returncode == 0, fwd.stderr + cp.stdout
    assert _files(prefix, rels) == after
    # From site-packages (the old base for most of it) the same patch does not apply.
    assert _git("apply", "--check", "-R", str(patch), cwd=site, ceiling=tmp_path).returncode != 0

    # `--path` matches that same base: bin/* is the script alone; a glob relative to
    # site-packages matches nothing; `*/toyscript/*` every source.
    doc = json.loads(support_cli.rewheel("diff", "--python", str(py), snap, "--path", "bin/*", "--json").stdout)
    assert [f["path"] for f in doc["files"]] == ["bin/toyscript"] and doc["patch_base"] == str(prefix)
    assert doc["files"][0]["diff"].startswith("--- a/bin/toyscript\n+++ b/bin/toyscript\n")
    doc = json.loads(support_cli.rewheel("diff", "--python", str(py), snap, "--path", "toyscript/*", "--json").stdout)
    assert doc["files"] == []
    doc = json.loads(support_cli.rewheel("diff", "--python", str(py), snap, "--path", "*/toyscript/*", "--json").stdout)
    assert sorted(f["path"] for f in doc["files"]) == ["toyscript/cli.py", "toyscript/new.py", "toyscript/old.py"]
    # A diff that shows no unified diff (the counts only) names no base.
    doc = json.loads(support_cli.rewheel("diff", "--python", str(py), snap, "--json").stdout)
    assert doc["patch_base"] is None and all(f["diff"] is None for f in doc["files"])


def test_the_help_says_which_base() -> None:
    cp = support_cli.rewheel("diff", "--help", env={**os.environ, "COLUMNS": "200"})
    assert cp.returncode == 0
    text = " ".join(cp.stdout.split())
    assert "--path GLOB Only files whose path relative to the environment's prefix matches this glob" in text
    assert "--patch Unified diffs of every changed text file, with paths relative to the environment's prefix" in text
    assert "site-packages" not in text
