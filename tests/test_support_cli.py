"""The suite's launcher (tests/support_cli.py, tests/support_zygote.py): a command forked from
the warm interpreter answers as `python -m rewheel` started anew does — the same exit status,
stdout and stderr, its own command line, process group, working folder, environment and umask —
and a timeout kills it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import support_cli

LOG = "Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: CUDA error: out of memory\n"


def _both(*args: str, **kw) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    env = {**os.environ, **kw.pop("env", {})}
    warm = support_cli.rewheel(*args, env=env, **kw)
    cold = support_cli.rewheel(*args, env={**env, "REWHEEL_TESTS_REAL_CLI": "1"}, **kw)
    return warm, cold


@pytest.mark.parametrize("args, kw", [
    (("--help",), {}),
    (("history", "--bogus"), {}),  # a usage error
    (("history", "--bogus", "--json"), {}),
    (("check", "nope.toml", "--json"), {}),
    (("why", "-", "--json"), {"input": LOG}),
    (("why", "-"), {"input": LOG}),
    # The width a person's terminal (or a script) gives, read when the output is laid out.
    (("--help",), {"env": {"COLUMNS": "60", "LINES": "20"}}),
    (("run", "--help"), {"env": {"COLUMNS": "200"}}),
    (("history", "--bogus"), {"env": {"COLUMNS": "40"}}),
    (("why", "-"), {"input": LOG, "env": {"COLUMNS": "50"}}),
])
def test_a_warm_command_answers_as_a_new_interpreter(args: tuple[str, ...], kw: dict) -> None:
    warm, cold = _both(*args, **kw)
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)


def test_cwd_env_and_umask_are_the_callers(tmp_path: Path) -> None:
    (tmp_path / "r.toml").write_text("[install]\npackages = 'vllm'\n")  # a bad recipe, named relatively
    warm, cold = _both("check", "r.toml", cwd=tmp_path, env={"REWHEEL_HOME": str(tmp_path / "h")})
    assert warm.returncode == cold.returncode == 2
    assert warm.stderr == cold.stderr and "r.toml" in warm.stderr


def test_its_command_line_and_group_are_a_child_of_this_process(tmp_path: Path) -> None:
    r, w = os.pipe()
    proc: dict = {}
    import threading

    t = threading.Thread(target=lambda: proc.setdefault("cp", support_cli.rewheel("why", "-", stdin=r, timeout=60,
                                                                                  cwd=tmp_path)))
    t.start()
    try:
        deadline = time.monotonic() + 30
        found = None
        while found is None and time.monotonic() < deadline:
            found = next(iter(_running_here(support_cli.argv("why", "-"), tmp_path)), None)
            time.sleep(0.05)
        assert found is not None, "no process shows the command's own command line"
        assert os.getpgid(found) == os.getpgrp()
    finally:
        os.write(w, LOG.encode())
        os.close(w)
        t.join(60)
        os.close(r)
    assert proc["cp"].returncode == 0 and "out of memory" in proc["cp"].stdout


def test_a_timeout_kills_the_command(tmp_path: Path) -> None:
    r, w = os.pipe()
    try:
        start = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            support_cli.rewheel("why", "-", stdin=r, timeout=1.5, cwd=tmp_path)
        assert time.monotonic() - start < 10
        time.sleep(0.2)
        assert _running_here(support_cli.argv("why", "-"), tmp_path) == []
    finally:
        os.close(w)
        os.close(r)


def test_interpreter_settings_start_a_real_interpreter() -> None:
    # PYTHONIOENCODING is fixed when an interpreter starts: the warm one cannot take it.
    cp = support_cli.rewheel("why", "-", input="RuntimeError: é\n",
                             env={**os.environ, "PYTHONIOENCODING": "ascii:strict"})
    assert cp.returncode == 0 and "\\xe9" in cp.stdout
    assert sys.executable in cp.args


def _cmd(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _cwd(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def _running_here(argv: list[str], folder: Path) -> list[int]:
    """Processes with this command line, in this folder (a test's own: another worker may run
    the same command line meanwhile)."""
    want = " ".join(argv)
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and _cmd(e) == want and _cwd(e) == str(folder)]


@pytest.mark.skipif(shutil.which("strace") is None and os.environ.get("REWHEEL_TESTS_STRACE") != "require",
                    reason="strace is not installed (CI installs it: .ci/run)")
def test_a_tracer_attached_by_pid_sees_the_command_from_its_first_line(tmp_path: Path) -> None:
    """`attach`: strace attaches to the held warm command before it runs, so it sees every
    call the command makes (here: the writes of its answer) and an injected kill lands in it;
    a command with real-interpreter settings runs under the tracer as a prefix instead."""
    log = tmp_path / "trace"
    cp = support_cli.rewheel("why", "-", input=LOG, timeout=60,
                             attach=["strace", "-qq", "-s", "256", "-o", str(log), "-e", "trace=write"])
    assert cp.returncode == 0 and "CUDA error: out of memory" in cp.stdout, cp.stderr
    writes = [line for line in log.read_text().splitlines() if line.startswith("write(1,")]
    assert writes and writes[0].startswith('write(1, "root cause'), log.read_text()  # its first line
    assert "".join(writes).count("out of memory") == 1, log.read_text()
    for env in ({}, {"REWHEEL_TESTS_REAL_CLI": "1"}):
        killed = support_cli.rewheel("why", "-", input=LOG, timeout=60, env={**os.environ, **env},
                                     attach=["strace", "-qq", "-o", "/dev/null", "-e", "trace=write",
                                             "-e", "inject=write:signal=KILL:when=1"])
        assert killed.returncode == -9 and killed.stdout == "", (env, killed)


@pytest.mark.parametrize("real", [False, True], ids=["warm", "new-interpreter"])
def test_a_started_command_is_watched_as_a_popen(tmp_path: Path, real: bool) -> None:
    """`start`: its pid is the command's (its command line in /proc), `poll` says None while it
    runs, a signal reaches it, `wait` gives the status; its output goes to the files given."""
    env = {**os.environ, **({"REWHEEL_TESTS_REAL_CLI": "1"} if real else {})}
    log = tmp_path / "crash.log"
    log.write_text(LOG)
    out, err = tmp_path / "out", tmp_path / "err"
    with open(log) as i, open(out, "w") as o, open(err, "w") as e:
        p = support_cli.start("why", "-", "--json", stdin=i, stdout=o, stderr=e, env=env)
    assert p.wait(60) == 0 and p.poll() == 0 and p.returncode == 0
    assert "CUDA error: out of memory" in json.loads(out.read_text())["root_cause"]["message"], err.read_text()
    with open(out, "w") as o:  # stderr into stdout's file, as `> out 2>&1`
        p = support_cli.start("why", "--bogus", stdout=o, stderr=subprocess.STDOUT, env=env)
    assert p.wait(60) == 2 and "No such option '--bogus'" in out.read_text(), out.read_text()
    r, w = os.pipe()  # stdin that never ends: `why -` waits on it
    try:
        p = support_cli.start("why", "-", stdin=r, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                              cwd=tmp_path)
        os.close(r)
        deadline = time.monotonic() + 30  # (a warm child names itself once forked)
        while "-m rewheel why -" not in _cmd(str(p.pid)):
            assert time.monotonic() < deadline, _cmd(str(p.pid))
            time.sleep(0.01)
        assert p.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(0.2)
        p.kill()
        assert p.wait(30) == -signal.SIGKILL and p.returncode == -signal.SIGKILL
    finally:
        os.close(w)
