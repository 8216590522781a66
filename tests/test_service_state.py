"""The service's state across a command: what was up before a run or a rollback is up and
healthy after it, what was down stays down, and a rollback that changes no byte restarts
nothing. Real processes throughout: services started outside rewheel, start commands that
daemonize (double fork, exit 0), the toy model server in a real venv. A systemd unit that
was inactive is in test_run_systemd.py, against a real systemd."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rewheel.errors import PreflightError
from rewheel.recipe import ServiceSpec
from rewheel.service import CommandManager, HealthCheckFailed, make_manager, wait_ready
from support_run import SERVER, Host, make_host
from support_standins import free_port, http_service_argv, pid_alive, wait_for

SERVICES = Path(__file__).parent / "services"
DAEMONIZE = SERVICES / "daemonize.py"
STOP_PIDFILE = SERVICES / "stop_pidfile.py"


def read_pid(pidfile: Path) -> int:
    return int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip()))


def kill_pidfile(pidfile: Path) -> None:
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    # The daemon's group: the one its first fork's setsid made (the pid written is the second
    # fork's, not that group's leader, so killpg(pid) found no group and left the server
    # running after every session), with the server's workers in it.
    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        return
    for kill, target in ((os.killpg, group), (os.kill, pid)):
        if kill is os.killpg and group == os.getpgrp():
            continue  # never this test process's own group
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def daemonize(pidfile: Path, argv: list[str]) -> int:
    """Start argv the way an operator's init script would: outside rewheel, daemonized."""
    subprocess.run([sys.executable, str(DAEMONIZE), str(pidfile), *argv], check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return read_pid(pidfile)


def spec(port: int, **kw: object) -> ServiceSpec:
    return ServiceSpec(manager="command", start=("x",), health_url=f"http://127.0.0.1:{port}/health",
                       ready_timeout_s=int(kw.pop("ready_timeout_s", 20)), settle_s=0.3, **kw)  # type: ignore[arg-type]


@pytest.fixture
def pidfiles(tmp_path: Path):
    """Daemonized servers (pid in a pidfile) are killed at teardown."""
    made: list[Path] = []

    def make(name: str = "server.pid") -> Path:
        p = tmp_path / name
        made.append(p)
        return p

    yield make
    for p in made:
        kill_pidfile(p)


# --- the command manager ---------------------------------------------------------------------

def test_a_service_started_elsewhere_is_active_judged_by_health(tmp_path: Path, pidfiles) -> None:
    port = free_port()
    pidfile = pidfiles()
    pid = daemonize(pidfile, http_service_argv(port))
    m = CommandManager(["never-run"], [], tmp_path / "svc", health_url=f"http://127.0.0.1:{port}/health")
    wait_for(lambda: m.status().active)
    st = m.status()
    assert (st.state, st.judged_by, st.main_pid) == ("active", "health", 0)
    assert st.to_json()["judged_by"] == "health"
    m.start()  # already running: nothing is started (a second server could not bind the port)
    assert not (tmp_path / "svc" / "service.json").exists()
    # Without a `stop` argv, stopping it is refused before anything is done.
    with pytest.raises(PreflightError) as exc:
        m.stop(5)
    assert "[service] stop" in exc.value.message and "nothing was changed" in exc.value.message
    assert exc.value.exit_code == 2
    assert pid_alive(pid) and m.status().active


def test_stopping_a_service_started_elsewhere_runs_stop_and_waits_for_its_port(tmp_path: Path, pidfiles) -> None:
    port = free_port()
    pidfile = pidfiles()
    # The server takes a moment to exit after SIGTERM (its worker lingers): stop must wait.
    pid = daemonize(pidfile, http_service_argv(port, workers=1, worker_linger_s=0.3))
    m = CommandManager(["never-run"], [sys.executable, str(STOP_PIDFILE), str(pidfile)], tmp_path / "svc",
                       health_url=f"http://127.0.0.1:{port}/health")
    wait_for(lambda: m.status().active)
    m.stop(10)
    assert not m._answers() and not m._listening()  # the port is free for the next start
    # Its socket closes as its interpreter shuts down, a moment before the process is gone
    # (seen under load: still alive right after the stop returned).
    assert not pidfile.exists()
    wait_for(lambda: not pid_alive(pid), timeout=10)
    st = m.status()
    assert (st.active, st.state, st.judged_by) == (False, "inactive", "health")
    m.stop(5)  # already down: nothing to do, and `stop` is not run again
    assert not pidfile.exists()


def test_a_start_command_that_daemonizes_counts_as_started_once_healthy(tmp_path: Path, pidfiles) -> None:
    port = free_port()
    pidfile = pidfiles()
    argv = [sys.executable, str(DAEMONIZE), str(pidfile), *http_service_argv(port, ready_after_s=1)]
    m = make_manager(ServiceSpec(manager="command", start=tuple(argv),
                                 stop=(sys.executable, str(STOP_PIDFILE), str(pidfile)),
                                 health_url=f"http://127.0.0.1:{port}/health"), tmp_path / "svc")
    started = time.time()
    m.start()
    result = wait_ready(m, spec(port), started_at=started)  # the start command exited 0 long before
    assert result.ok
    st = m.status()
    assert st.active and st.judged_by == "health"
    pid = read_pid(pidfile)
    m.start()  # running: a no-op
    assert read_pid(pidfile) == pid
    m.stop(10)
    assert not m.status().active
    wait_for(lambda: not pid_alive(pid), timeout=10)  # gone a moment after its port closed (above)


def test_a_start_command_that_fails_is_a_failure_with_its_output(tmp_path: Path) -> None:
    port = free_port()
    m = CommandManager([sys.executable, str(DAEMONIZE), "--fail"], [], tmp_path / "svc",
                       health_url=f"http://127.0.0.1:{port}/health")
    started = time.time()
    m.start()
    with pytest.raises(HealthCheckFailed) as exc:
        wait_ready(m, spec(port, ready_timeout_s=600), started_at=started)
    msg = exc.value.message
    assert "died while starting" in msg and "exit status 3" in msg
    assert "config file /etc/toy.conf not found" in msg


def test_a_stopped_service_is_not_stopped_again(tmp_path: Path) -> None:
    port = free_port()
    marker = tmp_path / "stop-ran"
    m = CommandManager(http_service_argv(port), [sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                       tmp_path / "svc", health_url=f"http://127.0.0.1:{port}/health")
    st = m.status()
    assert (st.active, st.judged_by) == (False, "health")
    m.stop(5)
    assert not marker.exists()


# --- runs and rollbacks ----------------------------------------------------------------------

@pytest.fixture
def hosts(tmp_path: Path, pidfiles):
    made: list[Host] = []

    def make(new_version: str, variant: str, name: str = "h") -> Host:
        h = make_host(tmp_path / name, new_version, variant)
        h.pidfile = pidfiles(f"{name}.pid")  # type: ignore[attr-defined]
        made.append(h)
        return h

    yield make
    for h in made:
        try:
            h.write_recipe()  # no `stop`: what rewheel started goes at once (daemons: see pidfiles)
            h.stop_service()
        except Exception:
            pass
        h._index.stop()  # type: ignore[attr-defined]


def env_dir(h: Host) -> Path:
    from rewheel.recipe import load_recipe
    from rewheel.commands import open_target

    return open_target(load_recipe(h.recipe)).store.env_dir


def stop_argv(h: Host) -> list[str]:
    return ["{python}", str(STOP_PIDFILE), str(h.pidfile)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("variant, code, served", [("good", 0, "2.0.0"), ("smoke-fails", 1, "1.0.0")])
def test_a_service_started_outside_rewheel_is_up_after_the_run(hosts, variant: str, code: int, served: str) -> None:
    h = hosts("2.0.0", variant)
    h.write_recipe(service__stop=stop_argv(h))
    outside = daemonize(h.pidfile, [str(h.python), str(SERVER), "--port", str(h.port)])
    wait_for(lambda: h.served_version() == "1.0.0")
    rc, rep = h.run_json()
    assert rc == code, rep["_stderr"]
    assert (rep["service_before"], rep["service_judged_by"]) == ("active", "health")
    assert not pid_alive(outside)  # stopped through the recipe's `stop`
    assert h.served_version() == served  # kept or reverted: up, healthy, on the right build
    assert [s for s in rep["steps"] if s.get("skipped")] == []


def test_a_service_started_outside_rewheel_without_stop_is_refused(hosts) -> None:
    h = hosts("2.0.0", "good")
    daemonize(h.pidfile, [str(h.python), str(SERVER), "--port", str(h.port)])
    wait_for(lambda: h.served_version() == "1.0.0")
    before = h.state()
    # `check` says what `run` will refuse, and `run` refuses it in its preflight: before the
    # prepare, the snapshot or a journal (no snapshot, no history line is left behind).
    cp = h.rewheel("check", str(h.recipe), "--json")
    assert cp.returncode == 2, cp.stderr
    svc = next(c for c in json.loads(cp.stdout)["checks"] if c["name"] == "service")
    assert not svc["ok"] and "[service] stop" in svc["detail"]
    rc, rep = h.run_json()
    assert rc == 2, rep["_stderr"]
    assert "[service] stop" in rep["message"]
    assert h.state() == before and h.served_version() == "1.0.0"
    hist = json.loads(h.rewheel("history", str(h.recipe), "--json").stdout)
    assert (hist["snapshots"], hist["runs"]) == ([], [])
    assert "prepare" not in rep["_stderr"]


@pytest.mark.parametrize("variant, code, served", [("good", 0, "2.0.0"), ("smoke-fails", 1, "1.0.0")])
def test_a_daemonizing_start_command_is_healthy_after_the_run(hosts, variant: str, code: int, served: str) -> None:
    h = hosts("2.0.0", variant)
    h.write_recipe(service__start=["{python}", str(DAEMONIZE), str(h.pidfile), "{python}", str(SERVER),
                                   "--port", str(h.port)],
                   service__stop=stop_argv(h))
    h.start_service()
    first = read_pid(h.pidfile)
    assert h.served_version() == "1.0.0"
    rc, rep = h.run_json()
    assert rc == code, rep["_stderr"]
    assert rep["service_before"] == "active"
    assert h.served_version() == served
    assert not pid_alive(first) and read_pid(h.pidfile) != first  # restarted on the new/old build
    assert rep["status"] == ("upgraded" if code == 0 else "reverted")


def _starts(h: Host) -> int:
    log = env_dir(h) / "service.log"
    if not log.exists():
        return 0
    return sum(1 for line in log.read_text().splitlines()
               if line.startswith("[rewheel] ") and " starting: " in line)


def test_a_stopped_service_stays_stopped_through_a_kept_run_and_a_rollback(hosts) -> None:
    h = hosts("2.0.0", "good")
    rc, rep = h.run_json()
    assert rc == 0, rep["_stderr"]
    assert rep["status"] == "upgraded" and rep["after"]["toypkg"] == "2.0.0"
    assert rep["service_before"] == "inactive" and rep["service"] is None
    start = [s for s in rep["steps"] if s["name"] == "start"]
    assert start and start[0]["skipped"] and start[0]["ok"] and "not running" in start[0]["reason"]
    assert h.served_version() is None and _starts(h) == 0
    # The rollback restores files (2.0.0 -> 1.0.0) and still starts nothing.
    cp = h.rewheel("rollback", str(h.recipe), "--yes", "--json")
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["restore"]["written"] > 0 and doc["service"] is None
    assert any(s["name"] == "start" and s.get("skipped") for s in doc["steps"])
    assert h.served_version() is None and _starts(h) == 0


def test_a_stopped_service_stays_stopped_through_a_reverted_run(hosts) -> None:
    h = hosts("3.0.0", "smoke-fails")
    before = h.state()
    rc, rep = h.run_json()
    assert rc == 1, rep["_stderr"]
    assert rep["status"] == "reverted" and h.state() == before
    assert "left stopped" in rep["revert"]["service_skipped"]
    assert h.served_version() is None and _starts(h) == 0


def test_a_rollback_that_changes_no_byte_restarts_nothing(hosts) -> None:
    h = hosts("2.0.0", "good")
    h.start_service()
    info = env_dir(h) / "service.json"
    pid = json.loads(info.read_text())["pid"]
    cp = h.rewheel("snapshot", str(h.recipe), "--json")
    assert cp.returncode == 0, cp.stderr
    snap = json.loads(h.rewheel("history", str(h.recipe), "--json").stdout)["snapshots"][0]["id"]
    cp = h.rewheel("rollback", str(h.recipe), snap, "--yes", "--json")
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    r = doc["restore"]
    assert (r["written"], r["deleted"], r["chmodded"]) == (0, 0, 0)
    assert doc["service"]["ok"] and doc["service"]["restarted"] is False
    assert [s["name"] for s in doc["steps"]] == ["restore-prepare", "restore", "health"]
    assert json.loads(info.read_text())["pid"] == pid and pid_alive(pid)  # the same process
    assert _starts(h) == 1 and h.served_version() == "1.0.0"
