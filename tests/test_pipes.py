"""What rewheel writes to a pipe or a file: every command's human output (stdout and stderr
into one file, as `cmd > log 2>&1` makes it) is never wrapped, whatever COLUMNS says — the
same at 60, 80 and 200 columns, every path whole — a diff written to a file applies with
`git apply --check` and `patch`, and no hint holds a placeholder (TARGET, RECIPE, COMMAND) or
the store's key for the environment where the person gave a path.

One real host for the module: a venv on toypkg 1.0.0 from a local index, a recipe (no
service) whose smoke test fails on toypkg 2.0.0, one reverted run and its two snapshots,
all under a folder whose name alone is longer than 60 columns.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import support_cli
from support_run import Host, make_host

WIDTHS = ("60", "80", "200")
LONG = "a-folder-whose-name-alone-is-longer-than-sixty-columns-of-a-terminal"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("pipes") / LONG
    tmp.mkdir()
    h = make_host(tmp, "2.0.0", "smoke-fails")
    h.write_recipe(service=None, snapshots={"keep": 50})  # every snapshot stays for the tests
    env = {"REWHEEL_HOME": str(tmp / "state")}
    code, doc = h.run_json(env=env)
    assert code == 1 and doc["status"] == "reverted", doc
    hist = json.loads(h.rewheel("history", str(h.recipe), "--json", env=env).stdout)
    by = {s["status"]: s["id"] for s in hist["snapshots"]}
    reports = tmp / "reports"
    reports.mkdir()
    # A root cause holding backticks, as fleet-report --markdown must render it.
    doc.pop("_stderr", None)
    (reports / "gpu-01.json").write_text(json.dumps(doc))
    doc2 = json.loads(json.dumps(doc))
    doc2["root_cause"]["message"] = "name `x` is not defined in ``weird`` code"
    (reports / "gpu-02.json").write_text(json.dumps(doc2))
    yield h, env, by["pre-upgrade"], by["failed-upgrade"], doc, reports
    h._index.stop()  # type: ignore[attr-defined]


def piped(h: Host, env: dict[str, str], columns: str, *args: str, cwd: Path | None = None) -> tuple[int, str]:
    """The CLI with stdout and stderr into one file, as `rewheel ... > out 2>&1` runs it
    (forked warm: tests/support_cli.py; its streams into a file are what a new interpreter's
    are, which test_support_cli compares, and the diffs below run on new interpreters)."""
    out = h.tmp / f"out-{columns}.txt"
    with open(out, "w") as f:
        cmd = support_cli.start(*args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                env={**os.environ, **env, "COLUMNS": columns, "LINES": "40"})
        try:
            rc = cmd.wait(timeout=180)
        except subprocess.TimeoutExpired:
            cmd.kill()
            raise
    return rc, out.read_text()


def normalized(text: str) -> str:
    """Run ids, snapshot ids, timestamps, timings, pids and sizes vary from run to run."""
    text = re.sub(r"\b\d{8}-\d{6}-[0-9a-f]{4}\b", "RUN", text)
    text = re.sub(r"\b[0-9a-f]{8}\b", "ID", text)
    return re.sub(r"\d+(\.\d+)?", "0", text)


def env_keys(env: dict[str, str]) -> list[str]:
    return [d.name for d in (Path(env["REWHEEL_HOME"]) / "envs").iterdir()]


def check_words(text: str, h: Host, env: dict[str, str]) -> None:
    """Every path under the test's folder is whole (it exists: a path cut at a line's end
    does not), no placeholder and no store key is in a message."""
    root = str(h.tmp)
    for token in re.findall(r"/\S+", text):
        token = re.sub(r"(:\d+)?[),:;'\"`.]*$", "", token)
        # (A run's staging folders are gone once it ends: those are checked only by the
        # comparison across widths.)
        if token.startswith(root) and "/prepared" not in token:
            assert os.path.exists(token), f"{token!r} is not a whole path:\n{text}"
    for word in ("TARGET", "RECIPE", "COMMAND"):
        assert word not in text, f"{word!r} in:\n{text}"
    for key in env_keys(env):  # the store's folder for the environment: only inside a path
        assert not re.search(rf"(?<!/){re.escape(key)}", text), f"{key!r} named alone in:\n{text}"


def commands(h: Host, a: str, b: str, reports: Path) -> dict[str, list[str]]:
    r = str(h.recipe)
    log = next(Path(h.tmp / "state").glob("envs/*/runs/*/smoke.log"))
    return {
        "history": ["history", r], "status": ["status", r], "check": ["check", r],
        "verify": ["verify", r], "patches": ["patches", r, "--offline"],
        "diff": ["diff", r, a, b], "diff-stat": ["diff", r, a, b, "--stat"],
        "diff-plain": ["diff", r, a, b, "--plain"],
        "why": ["why", str(log)], "why-run": ["why", str(log), "--snapshot", a],
        "fleet": ["fleet-report", str(reports / "gpu-01.json"), str(reports / "gpu-02.json")],
        # Refusals and mistakes: their hints are commands to paste.
        "no-snapshot": ["rollback", r, "nosuch", "--yes"],
        "no-snapshot-python": ["diff", "--python", str(h.python), "nosuch"],
        "no-terminal": ["rollback", r],
        "run-no-terminal": ["run", r],
        "usage-json": ["diff", r, "--bogus", "--json"],
        "why-no-run": ["why", str(log), "--run", "20000101-000000-dead"],
    }


def test_every_command_in_a_pipe_is_never_wrapped(host) -> None:
    h, env, a, b, _doc, reports = host
    for name, args in commands(h, a, b, reports).items():
        seen = {}
        for columns in WIDTHS:
            rc, text = piped(h, env, columns, *args)
            check_words(text, h, env)
            seen[columns] = (rc, normalized(text))
        assert seen["60"] == seen["80"] == seen["200"], f"{name}: output depends on COLUMNS:\n{seen}"
    # The folder's name alone passes 60 columns: had anything been wrapped, it would show.
    _, text = piped(h, env, "60", "status", str(h.recipe))
    assert any(len(line) > 60 and str(h.recipe) in line for line in text.splitlines()), text


def test_a_run_and_a_rollback_in_a_pipe_are_never_wrapped(host) -> None:
    """Commands that change things: each report is checked word for word, and the reverted
    run leaves the same environment, so its report reads the same at every width."""
    h, env, a, _b, _doc, _reports = host
    runs = {}
    # One round first, so every compared round finds the same store: a snapshot taken by an
    # earlier round (the rollback's, the labelled one) to share unchanged bytes with.
    for columns in ("warm-up", *WIDTHS):
        rc, text = piped(h, env, "80" if columns == "warm-up" else columns, "run", str(h.recipe), "--yes")
        assert rc == 1, text
        check_words(text, h, env)
        runs[columns] = normalized(text)
        for args in (["snapshot", str(h.recipe), "--label", "x"], ["pin", str(h.recipe), a],
                     ["unpin", str(h.recipe), a], ["rollback", str(h.recipe), a, "--yes"]):
            rc, text = piped(h, env, "80" if columns == "warm-up" else columns, *args)
            assert rc == 0, text
            check_words(text, h, env)
    assert runs["60"] == runs["80"] == runs["200"], runs


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("patch") is None, reason="needs git and patch")
@pytest.mark.parametrize("columns", WIDTHS)
def test_a_diff_written_to_a_file_applies(host, columns: str) -> None:
    """`rewheel diff R A B --patch > x.patch`: applies to A's files (the live environment, which
    the revert brought back to A) with `git apply --check` and `patch -p1 --dry-run`; so do a
    diff of one file (`--path`) and of one distribution (`-p`), and one holding a long line."""
    h, env, a, b, _doc, _reports = host
    site = next((h.prefix / "lib").glob("python3*/site-packages"))
    for extra in (["--patch"], ["--path", "*/toypkg/*.py"], ["-p", "toypkg"]):
        patch = h.tmp / f"x-{columns}.patch"
        with open(patch, "w") as f:
            rc = subprocess.run([sys.executable, "-m", "rewheel", "diff", str(h.recipe), a, b, *extra],
                                stdout=f, stdin=subprocess.DEVNULL, timeout=120,
                                env={**os.environ, **env, "COLUMNS": columns}).returncode
        assert rc == 0
        text = patch.read_text()
        # One base, the environment's prefix, named in the patch's header line.
        assert f"+++ b/{site.relative_to(h.prefix)}/toypkg/" in text, text
        assert f"\n# patch: paths relative to {h.prefix}; apply there: cd {h.prefix} && git apply FILE\n" in text, text
        git = subprocess.run(["git", "apply", "--check", "-v", str(patch)], cwd=h.prefix, capture_output=True,
                             text=True, env={**os.environ, "GIT_CEILING_DIRECTORIES": str(h.tmp)})
        assert git.returncode == 0, git.stderr + text
        gnu = subprocess.run(["patch", "-p1", "--dry-run", "-i", str(patch)], cwd=h.prefix, capture_output=True, text=True)
        assert gnu.returncode == 0, gnu.stdout + gnu.stderr + text
    # A line longer than any terminal, edited into the live environment: the diff of the
    # snapshot against it, written to a file, takes it back (-R) — one line, never folded.
    core = site / "toypkg" / "core.py"
    before = core.read_text()
    long_line = "# kept for backwards compatibility with loaders " * 6
    # Written as a new file renamed over the old (as editors do): the snapshot shares the old
    # file's inode, which an in-place write would change too.
    replace(core, before + long_line + "\n")
    try:
        patch = h.tmp / f"long-{columns}.patch"
        with open(patch, "w") as f:
            rc = subprocess.run([sys.executable, "-m", "rewheel", "diff", str(h.recipe), a, "--path", "*/toypkg/core.py"],
                                stdout=f, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, timeout=120,
                                env={**os.environ, **env, "COLUMNS": columns}).returncode
        text = patch.read_text()
        assert rc == 0 and f"+{long_line}\n" in text, text
        git = subprocess.run(["git", "apply", "-R", "--check", str(patch)], cwd=h.prefix, capture_output=True,
                             text=True, env={**os.environ, "GIT_CEILING_DIRECTORIES": str(h.tmp)})
        assert git.returncode == 0, git.stderr + text
        gnu = subprocess.run(["patch", "-R", "-p1", "--dry-run", "-i", str(patch)], cwd=h.prefix, capture_output=True,
                             text=True)
        assert gnu.returncode == 0, gnu.stdout + gnu.stderr + text
    finally:
        replace(core, before)


def replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_fleet_markdown_keeps_a_root_cause_with_backticks_one_code_span(host) -> None:
    h, env, _a, _b, _doc, reports = host
    rc, text = piped(h, env, "80", "fleet-report", str(reports / "gpu-01.json"), str(reports / "gpu-02.json"),
                     "--markdown")
    assert rc == 1, text
    line = next(line for line in text.splitlines() if "weird" in line and line.startswith("- "))
    # The span opens with more backticks than any run inside it, and closes with as many.
    span = line.split(": ", 1)[1]
    fence = re.match(r"`+", span).group()  # type: ignore[union-attr]
    assert len(fence) == 3 and span.endswith(fence) and "name `x` is not defined in ``weird`` code" in span, line
