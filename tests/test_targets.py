"""What `--python` (and a recipe's `python`) accepts, and what a bug looks like to a user.

- An environment's folder stands for its interpreter; a folder that is no environment, a
  text file, a program that is not Python: exit 2 with a message naming it, no traceback.
- An exception no error class describes is an internal error: exit 5, one line saying so,
  the traceback in a private file under the state home that the message names.
All through the real CLI on a real venv made by uv.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from support_env import make_venv
import support_cli


def rewheel(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return support_cli.rewheel(*args, stdin=subprocess.DEVNULL, env=dict(os.environ), cwd=cwd, timeout=120)


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    return make_venv(tmp_path / "env")


def test_an_environment_folder_is_its_interpreter(venv: Path, tmp_path: Path) -> None:
    folder = venv.parent.parent
    cp = rewheel("snapshot", "--python", str(folder), "--json")
    assert cp.returncode == 0, cp.stderr
    snap = json.loads(cp.stdout)
    # The same environment, whichever way it is named: one store, one snapshot.
    hist = json.loads(rewheel("history", "--python", str(venv), "--json").stdout)
    assert [s["id"] for s in hist["snapshots"]] == [snap["id"]]
    assert hist["target"] == f"--python {venv}"
    # A relative folder too.
    rel = rewheel("history", "--python", "env", "--json", cwd=tmp_path)
    assert rel.returncode == 0 and json.loads(rel.stdout)["target"] == f"--python {venv}"
    # And a recipe's `python` naming the folder.
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[environment]\npython = "{folder}"\n')
    hist = json.loads(rewheel("history", str(recipe), "--json").stdout)
    assert [s["id"] for s in hist["snapshots"]] == [snap["id"]]


@pytest.mark.parametrize("what", ["empty folder", "text file", "not python", "missing"])
def test_anything_else_that_is_not_an_interpreter_is_exit_2(what: str, tmp_path: Path) -> None:
    path = tmp_path / what.replace(" ", "-")
    if what == "empty folder":
        path.mkdir()
    elif what == "text file":
        path.write_text("print('hi')\n")
    elif what == "not python":
        path.write_text("#!/bin/sh\necho not a python\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    for args in (["history", "--python", str(path)], ["status", "--python", str(path)]):
        cp = rewheel(*args, "--json")
        assert cp.returncode == 2, (cp.stdout, cp.stderr)
        assert "Traceback" not in cp.stderr
        doc = json.loads(cp.stdout)
        assert str(path) in doc["message"] and doc["exit_code"] == 2
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[environment]\npython = "{path}"\n')
    cp = rewheel("history", str(recipe), "--json")
    assert cp.returncode == 2 and "Traceback" not in cp.stderr
    assert str(path) in json.loads(cp.stdout)["message"]


def test_an_internal_error_names_its_traceback_file_and_exits_5(venv: Path, rewheel_home: Path,
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cp = rewheel("snapshot", "--python", str(venv), "--json")
    assert cp.returncode == 0, cp.stderr
    # A bug planted in the rewheel process (every bad input a user can give is a sentence and
    # exit 2 now): listing the snapshots fails deep inside with a TypeError.
    bug = tmp_path / "bug"
    bug.mkdir()
    (bug / "sitecustomize.py").write_text(
        "from rewheel.snapshot import store\n"
        "def broken(self, *a, **k):\n"
        "    return sorted([1, 'yesterday'])\n"
        "store.Store.list = broken\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(bug), os.environ.get("PYTHONPATH")) if p))
    for args in (["history", "--python", str(venv), "--json"], ["history", "--python", str(venv)]):
        cp = rewheel(*args)
        assert cp.returncode == 5, (cp.stdout, cp.stderr)
        assert "Traceback" not in cp.stdout + cp.stderr
        assert "internal error (a bug in rewheel): TypeError" in " ".join(cp.stderr.split())
    doc = json.loads(rewheel("history", "--python", str(venv), "--json").stdout)
    assert doc["error"] == "InternalError" and doc["exit_code"] == 5
    tb = Path(doc["traceback_file"])
    assert tb.parent == rewheel_home / "crashes" and doc["traceback_file"] in doc["hint"]
    assert stat.S_IMODE(tb.stat().st_mode) == 0o600
    text = tb.read_text()
    assert text.startswith(f"rewheel history --python {venv} --json\n")
    assert "Traceback (most recent call last):" in text and "TypeError" in text


def test_an_early_probe_answers_as_inspect_does(venv: Path, tmp_path: Path) -> None:
    """The CLI starts the interpreter probe before it imports the commands: `inspect` then
    collects that answer, with the same result, and the same error for what is no
    interpreter, as a probe it starts itself."""
    from rewheel import environment
    from rewheel.errors import TargetError

    plain = environment.Environment.inspect(venv)
    environment.probe_early(venv)
    assert str(venv) in environment._early_probes
    assert environment.Environment.inspect(venv) == plain
    assert not environment._early_probes  # collected, not left behind
    text = tmp_path / "notes.txt"
    text.write_text("print('hi')\n")  # a file, not executable: the start itself fails
    with pytest.raises(TargetError) as alone:
        environment.Environment.inspect(text)
    environment.probe_early(text)
    with pytest.raises(TargetError) as early:
        environment.Environment.inspect(text)
    assert early.value.message == alone.value.message and "cannot be run" in early.value.message
    environment.probe_early(tmp_path / "missing")  # left to inspect, which names it
    assert not environment._early_probes
