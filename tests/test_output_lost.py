"""Output that cannot be written (issue 45, item 9): stdout closed (a pipe whose reader went
away, `| head -1`) or full (`> /dev/full`, a file on a full disk) ends a command cleanly — its
own exit code (6), one line on stderr, never a traceback, never a "free disk, then resume" for
a command that changed nothing — and a Ctrl-C in a command's first milliseconds, before the
CLI is even imported, is one line too. A sweep: every command that answers on stdout × each
way stdout can be lost, and SIGINT at a spread of moments after the start (new interpreters:
the console script, as a person starts it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import support_cli
from support_env import make_venv

pytestmark = pytest.mark.slow

RUN_EXIT_OUTPUT = 6
CONSOLE = Path(sys.executable).parent / "rewheel"


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("out")
    py = make_venv(tmp / "env")
    recipe = tmp / "r.toml"
    recipe.write_text(f'[environment]\npython = "{py}"\n', encoding="utf-8")
    env = {**os.environ, "REWHEEL_HOME": str(tmp / "home")}
    cp = support_cli.rewheel("snapshot", str(recipe), env=env, stdin=subprocess.DEVNULL, timeout=120)
    assert cp.returncode == 0, cp.stderr
    return recipe, env


COMMANDS = [["history", "{r}"], ["history", "{r}", "--json"], ["status", "{r}"], ["status", "{r}", "--json"],
            ["diff", "{r}", "--json"], ["verify", "{r}"], ["patches", "{r}", "--offline", "--json"],
            ["check", "{r}", "--json"], ["snapshot", "{r}", "--json"], ["--version"], ["history", "--help"]]


def _lost(how: str, args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run the command with stdout lost `how`: 'full' (/dev/full) or 'closed' (a pipe whose
    reader closed it before the command wrote)."""
    argv = [str(CONSOLE), *args]
    if how == "full":
        with open("/dev/full", "w") as out:
            cp = subprocess.run(argv, stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                                timeout=120, text=True)
        return cp.returncode, cp.stderr
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first write
    try:
        cp = subprocess.run(argv, stdout=w, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                            timeout=120, text=True)
    finally:
        os.close(w)
    return cp.returncode, cp.stderr


@pytest.mark.parametrize("how", ["full", "closed"])
def test_lost_stdout_is_a_clean_exit_with_its_own_code(target, how: str) -> None:
    recipe, env = target
    counts: dict[int, int] = {}
    for args in COMMANDS:
        args = [a.replace("{r}", str(recipe)) for a in args]
        rc, err = _lost(how, args, env)
        assert "Traceback" not in err and "Exception ignored" not in err, (args, err)
        assert rc == RUN_EXIT_OUTPUT, (args, rc, err)
        lines = [line for line in err.splitlines() if line.strip()]
        said = [line for line in lines if "stdout" in line]
        assert len(said) == 1 and ("closed" in said[0] or "No space" in said[0]), (args, err)
        assert "resume" not in err, (args, err)  # nothing was under way
        counts[rc] = counts.get(rc, 0) + 1
    print(f"stdout {how}: {len(COMMANDS)} commands, exit codes {counts}")


def _interpreters_own(text: str) -> bool:
    """A KeyboardInterrupt of the interpreter's own start (its frozen modules, site's import,
    the console script's first line): no frame of rewheel's code, nothing rewheel can catch."""
    return "KeyboardInterrupt" in text and "/rewheel/" not in text.replace(f"{CONSOLE}", "")


def test_sigint_in_the_first_milliseconds_is_one_line(target) -> None:
    """SIGINT at a spread of moments over a whole command (`history`, some 100 ms): never a
    KeyboardInterrupt traceback from rewheel's code (exit 4 with one line, its import
    included). What comes before any of rewheel's code runs — the interpreter's start, a few
    milliseconds here — is the interpreter's (counted apart)."""
    recipe, env = target
    outcomes: dict[str, int] = {}
    # The spread: from the start to the end of an uninterrupted command (however loaded the
    # machine is), in 40 steps.
    t0 = time.monotonic()
    assert subprocess.run([str(CONSOLE), "history", str(recipe)], capture_output=True, env=env).returncode == 0
    whole_ms = (time.monotonic() - t0) * 1000
    for step in range(40):
        delay_ms = whole_ms * step / 40
        p = subprocess.Popen([str(CONSOLE), "history", str(recipe)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
        time.sleep(delay_ms / 1000)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        text = err.decode(errors="replace")
        if _interpreters_own(text):
            outcomes["the interpreter's own start"] = outcomes.get("the interpreter's own start", 0) + 1
            continue
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, (delay_ms, text)
        key = "done" if p.returncode == 0 else f"rc={p.returncode}"
        if p.returncode == 4:
            assert len([line for line in text.splitlines() if line.strip()]) <= 2, text  # error + hint
        else:
            assert p.returncode in (0, -signal.SIGINT, 130), (delay_ms, p.returncode, text)
        outcomes[key] = outcomes.get(key, 0) + 1
    print(f"SIGINT at 40 moments over 0..{whole_ms:.0f} ms:", outcomes)
    assert outcomes.get("rc=4", 0) >= 3  # rewheel's own code was reached and interrupted, repeatedly


def test_run_json_into_a_full_disk_after_the_run_handled_it(target, tmp_path: Path) -> None:
    """`--json` into a file on a full disk, from a command that failed on its own (here a
    refused one): its own error and exit code stand, and one more line says the JSON answer
    could not be written — no traceback."""
    recipe, env = target
    with open("/dev/full", "w") as out:
        cp = subprocess.run([str(CONSOLE), "rollback", str(recipe), "nosuchsnapshot", "--yes", "--json"],
                            stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, timeout=120,
                            text=True)
    assert "Traceback" not in cp.stderr, cp.stderr
    assert cp.returncode == 2 and "nosuchsnapshot" in cp.stderr and "stdout" in cp.stderr, cp.stderr
    json.dumps(cp.returncode)
