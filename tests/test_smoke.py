"""The smoke runner: `{python}` expansion, its own process group, the timeout that kills the whole
group (grandchildren included), the log kept in the run's folder; a failing smoke is a result,
a missing executable an error."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from rewheel.errors import CommandNotFound, PreflightError
from rewheel.smoke import SmokeResult, check_smoke, run_smoke
from support_index import alive, live_group_members, write_recipe

from support_env import make_venv

# A smoke command that forks a worker (like vLLM's per-rank workers), records both pids, prints
# and then hangs; the worker hangs too and ignores SIGTERM, as a stuck CUDA worker may.
HANG = r"""
import os, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('worker up', flush=True); time.sleep(600)"])
open(sys.argv[1], "w").write(f"{os.getpid()} {worker.pid}")
print("loading model", flush=True)
time.sleep(600)
"""


def test_success_expands_python_and_keeps_the_log(tmp_path: Path) -> None:
    python = make_venv(tmp_path / "env")
    r = write_recipe(tmp_path, python, smoke={
        "command": ["{python}", "-c", "import sys; print('prefix', sys.prefix); print('ok')"],
        "timeout_s": 60})
    lines: list[str] = []
    log = tmp_path / "run" / "smoke.log"
    res = run_smoke(r, log_path=log, on_line=lines.append)
    assert isinstance(res, SmokeResult)
    assert (res.ok, res.returncode, res.timed_out) == (True, 0, False)
    assert lines == [f"prefix {python.parent.parent}", "ok"]  # the environment's own interpreter
    assert res.argv[0] == str(python) and res.log_path == str(log)
    text = log.read_text()
    assert text.startswith(f"[rewheel] $ {python} -c") and "\nok\n" in text
    assert "[rewheel] smoke passed" in text
    doc = res.to_json()
    assert doc["ok"] is True and doc["log_path"] == str(log) and doc["timeout_s"] == 60


def test_failure_is_a_result_not_an_exception(tmp_path: Path) -> None:
    r = write_recipe(tmp_path, sys.executable, smoke={
        "command": ["{python}", "-c",
                    "import sys; print('Traceback (most recent call last):'); "
                    "print('RuntimeError: CUDA error', file=sys.stderr); sys.exit(3)"]})
    res = run_smoke(r, log_path=tmp_path / "smoke.log")
    assert (res.ok, res.returncode, res.timed_out) == (False, 3, False)
    assert "RuntimeError: CUDA error" in (tmp_path / "smoke.log").read_text()  # stderr kept too
    assert "exited with status 3" in res.summary


def test_a_hang_is_killed_with_its_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    r = write_recipe(tmp_path, sys.executable, smoke={
        "command": ["{python}", "-c", HANG, str(pids)], "timeout_s": 2})
    lines: list[str] = []
    res = run_smoke(r, log_path=tmp_path / "smoke.log", on_line=lines.append)
    assert res.timed_out and not res.ok and res.returncode == -9
    assert "loading model" in lines and "worker up" in lines
    child, grandchild = map(int, pids.read_text().split())
    # Nothing of the group is left: not the command, not the worker that ignored SIGTERM.
    deadline = time.monotonic() + 10
    while (alive(child) or alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child) and not alive(grandchild)
    assert live_group_members(child) == []  # the group is gone (zombies aside, unreaped by init)
    assert "killed process group" in (tmp_path / "smoke.log").read_text()
    assert "did not finish within 2s" in res.summary


def test_the_command_runs_in_the_recipe_folder(tmp_path: Path) -> None:
    # A stray package in the caller's working directory must not shadow the installed one.
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "probe.py").write_text("import os; print('cwd', os.getcwd())\n")
    r = write_recipe(tmp_path / "recipes", sys.executable,
                     smoke={"command": ["{python}", "probe.py"]})
    res = run_smoke(r, log_path=tmp_path / "run" / "smoke.log")
    assert res.ok and f"cwd {tmp_path / 'recipes'}" in res.tail


@pytest.mark.parametrize("command, error, words", [
    (["/nonexistent/bin/smoke-tool", "--x"], CommandNotFound, "does not exist"),
    (["no-such-smoke-tool-xyz"], CommandNotFound, "command not found"),
])
def test_a_missing_executable_raises(tmp_path: Path, command: list[str], error: type,
                                     words: str) -> None:
    r = write_recipe(tmp_path, sys.executable, smoke={"command": command})
    with pytest.raises(error) as exc:
        check_smoke(r)
    assert words in exc.value.message and "smoke.command" in exc.value.message
    assert str(r.path) in exc.value.message
    with pytest.raises(error):
        run_smoke(r, log_path=tmp_path / "smoke.log")


def test_a_file_that_is_not_executable_is_a_preflight_error(tmp_path: Path) -> None:
    script = tmp_path / "smoke.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    r = write_recipe(tmp_path, sys.executable, smoke={"command": ["./smoke.sh"]})
    with pytest.raises(PreflightError, match="not an executable"):
        check_smoke(r)
    script.chmod(0o755)
    assert check_smoke(r) == [str(script)]  # relative to the recipe's folder
    assert run_smoke(r, log_path=tmp_path / "run" / "smoke.log").tail == ["hi"]


def test_no_smoke_section_is_skipped(tmp_path: Path) -> None:
    r = write_recipe(tmp_path, sys.executable)
    res = run_smoke(r, log_path=tmp_path / "smoke.log")
    assert res.skipped and res.ok and res.returncode is None and res.to_json()["skipped"] is True
