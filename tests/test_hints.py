"""Hints a person can paste as given. Every command the suite runs through `support_cli.rewheel`
has each `rewheel …` it prints run as typed (tests/support_hints.py); here, that checker
itself — what it refuses, that its guard changes nothing — and the hints issue 48 found that
could not be pasted, each now pasted and accepted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import support_cli
import support_hints
from support_env import make_venv


def test_what_cannot_be_pasted_is_told_apart_from_templates() -> None:
    v = support_hints.static_verdict
    assert v("rewheel history --python /e/bin/python") is None
    assert v("run lab.toml --dry-run")[0] == "defect"  # no program name: no shell finds `run`
    assert v("python -m rewheel history x")[0] == "defect"
    assert v("rewheel history 'x")[0] == "defect"  # a quote left open
    assert v("rewheel resume TARGET", known={"TARGET"})[0] == "defect"  # the CLI knew what was typed
    assert v("rewheel resume TARGET", known=set())[0] == "template"
    assert v("rewheel run RECIPE --json", known={"TARGET"})[0] == "template"  # given --python: no recipe
    assert support_hints.known_placeholders(["status", "--python", "/e/bin/python"]) == {"TARGET"}
    assert support_hints.known_placeholders(["fleet-report", __file__]) == set()  # a report, not a recipe
    assert support_hints.known_placeholders(["status", __file__]) == {"TARGET", "RECIPE"}
    assert v("rewheel why LOGFILE")[0] == "template"
    assert v("rewheel diff … > x.patch")[0] == "template"
    assert support_hints.hints_in('{"hint": "`rewheel history x` lists; `run x --dry-run` plans"}', "") == [
        "rewheel history x", "run x --dry-run"]
    assert support_hints.hints_in("", "  hint: `uv cache clean vllm` then `rewheel run r.toml`") == ["rewheel run r.toml"]
    assert support_hints.usage_problems("", "Usage: python -m rewheel ci [OPTIONS] RECIPE\nTry 'python -m rewheel "
                                        "ci --help' for help.\n") == [
        "Usage: python", "Try 'python -m rewheel ci --help' for help."]
    assert support_hints.usage_problems("", "Usage: rewheel ci [OPTIONS] RECIPE\nTry 'rewheel ci --help' for help.\n") == []


def _done(rc: int, stderr: str) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], rc, "", stderr)


def test_a_retry_keeps_the_yes_a_new_action_asks() -> None:
    asked = _done(2, "error: no terminal to ask on, so nothing was changed: Restore …\n")
    hint = "rewheel rollback r.toml abc12345 --force"
    # The refused command had --yes and the hint retries it: pasted into a script, refused again.
    assert support_hints.verdict(hint, ["rollback", "r.toml", "abc12345", "--yes"], asked)[0] == "defect"
    # A person at a terminal is asked, as they were.
    assert support_hints.verdict(hint, ["rollback", "r.toml", "abc12345"], asked)[0] == "asks"
    # Another snapshot, another command: a new action, which asks anew.
    assert support_hints.verdict(hint, ["rollback", "r.toml", "--yes"], asked)[0] == "asks"
    assert support_hints.verdict("rewheel resume r.toml", ["run", "r.toml", "--yes"], asked)[0] == "asks"
    assert support_hints.verdict(hint, ["rollback"], _done(support_hints.GUARD_EXIT, "[guard] …\n"))[0] == "stopped"
    assert support_hints.verdict("rewheel history r.toml", ["run"], _done(4, ""))[0] == "ran"
    usage = _done(2, "Usage: rewheel history [OPTIONS] [TARGET]\nError: No such option: --bogus\n")
    assert support_hints.verdict("rewheel history --bogus", ["run"], usage)[0] == "defect"
    assert support_hints.verdict("rewheel check r.toml", ["run"], _done(2, "  ✗ uv: missing\n"))[0] == "ran"
    assert support_hints.verdict("rewheel history r.toml", ["run"], _done(5, "error: internal error\n"))[0] == "defect"


@pytest.fixture
def env(tmp_path: Path) -> Path:
    return make_venv(tmp_path / "env")


def _history(py: Path) -> list:
    cp = support_cli.rewheel("history", "--python", str(py), "--json")
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)["snapshots"]


def test_the_guard_stops_a_command_before_its_first_change(env: Path) -> None:
    """A hint is run as typed up to the first thing it would change: a snapshot, run so, takes
    none; a read-only command runs to its end."""
    run = support_cli.run_guarded(["snapshot", "--python", str(env)], env=dict(os.environ), cwd=None, umask=-1,
                                  prefix=None)
    assert run.returncode == support_hints.GUARD_EXIT, run.stderr
    # (Its first change here: the state's folder, which nothing has made yet.)
    home = Path(os.environ["REWHEEL_HOME"])
    assert run.stderr == f"[guard] stopped before its first change: os.mkdir {home}\n"
    assert not home.exists()
    # The same in a real interpreter (what a command started under a wrapper gets).
    real = subprocess.run([sys.executable, str(support_cli.ZYGOTE), "--guarded", "snapshot", "--python", str(env)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert real.returncode == support_hints.GUARD_EXIT, real.stderr
    assert not home.exists()
    # Where the state's folder is there, a snapshot's first change is its lock.
    assert _history(env) == [] and home.is_dir()
    run = support_cli.run_guarded(["snapshot", "--python", str(env)], env=dict(os.environ), cwd=None, umask=-1,
                                  prefix=None)
    assert run.returncode == support_hints.GUARD_EXIT and ".lock for writing" in run.stderr, run.stderr
    assert _history(env) == []
    ran = support_cli.run_guarded(["history", "--python", str(env)], env=dict(os.environ), cwd=None, umask=-1,
                                  prefix=None)
    assert ran.returncode == 0 and "no snapshots" in (ran.stdout + ran.stderr).lower(), ran.stdout + ran.stderr


def test_the_hints_issue_48_found_paste_as_given(env: Path, tmp_path: Path) -> None:
    """Each runs through `support_cli.rewheel`, whose checker runs every hint printed as typed;
    here each hint is also named."""
    from rewheel.commands import open_target
    from rewheel.recipe import Recipe
    from rewheel.snapshot import take_snapshot

    recipe = tmp_path / "lab.toml"
    recipe.write_text(f'name = "lab"\n[environment]\npython = "{env}"\n[install]\npackages = ["toypkg"]\n')
    # `run --prepared --dry-run`: both commands, each whole, with the program's name and the flags kept.
    cp = support_cli.rewheel("run", str(recipe), "--prepared", "--dry-run", "--yes", "--json")
    assert cp.returncode == 2, cp.stderr
    hint = json.loads(cp.stdout)["hint"]
    assert f"`rewheel run {recipe} --dry-run --yes --json` shows the plan" in hint, hint
    assert f"then `rewheel run {recipe} --prepared --yes --json` swaps in what was prepared" in hint, hint

    # A refused rollback of a failed build keeps the --yes (and every other word) it was given.
    t = open_target(Recipe.for_python(env))
    failed = take_snapshot(t.env, t.store, label="failed upgrade", status="failed-upgrade").meta
    cp = support_cli.rewheel("rollback", "--python", str(env), failed.id, "--yes", "--no-undo")
    assert cp.returncode == 2, cp.stderr
    assert f"add --force: `rewheel rollback --python {env} {failed.id} --yes --no-undo --force`" in cp.stderr, cp.stderr
    # The history names the same: a command, not `rollback --force`.
    cp = support_cli.rewheel("history", "--python", str(env))
    assert f"`rewheel rollback --python {env} {failed.id} --force`" in cp.stdout, cp.stdout

    # `--json` before the command: the hint is the command line with it where it goes.
    cp = support_cli.rewheel("--json", "history", "--python", str(env))
    assert cp.returncode == 2
    assert json.loads(cp.stdout)["hint"] == f"--json goes after the command: `rewheel history --python {env} --json`"

    # A path a shell would split is quoted in every hint that names it.
    spaced = tmp_path / "my lab.toml"
    spaced.write_text(recipe.read_text())
    cp = support_cli.rewheel("run", str(spaced), "--prepared", "--dry-run")
    assert f"`rewheel run '{spaced}' --dry-run` shows the plan" in cp.stderr, cp.stderr
    cp = support_cli.rewheel("rollback", str(spaced), failed.id)
    assert f"`rewheel history '{spaced}'` lists them" in cp.stderr, cp.stderr


def test_usage_errors_name_the_program_a_person_types(tmp_path: Path) -> None:
    """Started as `python -m rewheel` (what a wrapper such as `.demo/rewheel` runs), a usage
    error still says `rewheel`."""
    cp = subprocess.run([sys.executable, "-m", "rewheel", "ci"], capture_output=True, text=True,
                        stdin=subprocess.DEVNULL, timeout=120)
    assert cp.returncode == 2
    assert cp.stderr.startswith("Usage: rewheel ci [OPTIONS] RECIPE\nTry 'rewheel ci --help' for help.\n"), cp.stderr
