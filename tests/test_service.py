"""Service managers against real service processes (a tiny HTTP server on 127.0.0.1) under the
command manager; the systemd manager runs against a real systemd in test_service_systemd.py.
Also: the journalctl stand-in (which replays recorded crash logs) behaves like the real tool."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import httpx
import pytest

from rewheel.errors import PreflightError
from rewheel.recipe import Probe, ServiceSpec
from rewheel.service import (CommandManager, HealthCheckFailed, ServiceManager, SystemdManager,
                             make_manager, wait_ready)
from support_standins import FakeHost, free_port, http_service_argv, pid_alive, wait_for


def spec_for(port: int, *, manager: str = "command", unit: str | None = None,
             ready_timeout_s: int = 30, settle_s: float = 0.3, model: str = "tiny/model",
             probe: bool = True, health: bool = True) -> ServiceSpec:
    return ServiceSpec(
        manager=manager, unit=unit, start=("x",) if manager == "command" else (),
        health_url=f"http://127.0.0.1:{port}/health" if health else None,
        ready_timeout_s=ready_timeout_s, settle_s=settle_s,
        probe=Probe(url=f"http://127.0.0.1:{port}/v1/models", expect=model) if probe else None)


@pytest.fixture
def managed(fake_host: FakeHost):
    """Command managers made here are stopped (and their groups killed) at teardown."""
    made: list[CommandManager] = []

    def make(start: list[str], stop: list[str] | None = None, state_dir: Path | None = None) -> CommandManager:
        m = CommandManager(start, stop or [], state_dir or fake_host.root / "svc")
        made.append(m)
        return m

    yield make
    for m in made:
        info = m._info()
        if info:
            fake_host.track_group(int(info["pid"]))


# --- command manager ------------------------------------------------------------------------

def test_command_manager_starts_a_real_service_and_proves_it(managed, tmp_path: Path) -> None:
    port = free_port()
    m = managed(http_service_argv(port, model="org/Model-A"))
    assert isinstance(m, ServiceManager)
    m.check()
    started = time.time()
    m.start()
    pid = int((m.state_dir / "service.pid").read_text())
    progress: list[str] = []
    result = wait_ready(m, spec_for(port, model="org/Model-A"), started_at=started,
                        on_progress=progress.append)
    assert result.ok and "answered 200" in result.detail and "probe" in result.detail
    assert result.to_json()["ok"] is True
    st = m.status()
    assert st.active and st.state == "active" and st.main_pid == pid and pid in st.pids
    assert any("listening on" in line for line in m.log_lines(started))
    m.stop(10)
    assert not pid_alive(pid)
    st = m.status()
    assert not st.active and st.state == "inactive" and st.pids == []


def test_command_manager_stop_waits_for_every_process_of_the_group(managed) -> None:
    port = free_port()
    m = managed(http_service_argv(port, workers=2, worker_linger_s=0.5))
    m.start()
    st = wait_for(lambda: (s := m.status()) and len(s.pids) == 3 and s)
    m.stop(20)
    assert [p for p in st.pids if pid_alive(p)] == []  # workers outlived SIGTERM by 0.5s


def test_command_manager_kills_what_ignores_sigterm(managed) -> None:
    port = free_port()
    m = managed(http_service_argv(port, workers=1, ignore_sigterm=True))
    m.start()
    st = wait_for(lambda: (s := m.status()) and len(s.pids) == 2 and s)
    m.stop(0.5)  # SIGTERM is ignored: SIGKILL after the timeout
    assert [p for p in st.pids if pid_alive(p)] == []
    assert m.status().state == "inactive"


def test_command_manager_runs_the_stop_argv(managed, tmp_path: Path) -> None:
    port = free_port()
    marker = tmp_path / "stop-ran"
    state_dir = tmp_path / "svc"
    stop = [sys.executable, "-c",
            "import os, signal, sys; open(sys.argv[2], 'w').close(); "
            "os.kill(int(open(sys.argv[1]).read()), signal.SIGTERM)",
            str(state_dir / "service.pid"), str(marker)]
    m = managed(http_service_argv(port), stop, state_dir)
    m.start()
    pid = m.status().main_pid
    wait_ready(m, spec_for(port, probe=False, settle_s=0), started_at=time.time())
    m.stop(10)
    assert marker.exists() and not pid_alive(pid)


def test_a_later_rewheel_process_can_stop_the_recorded_service(managed, tmp_path: Path) -> None:
    port = free_port()
    first = managed(http_service_argv(port), state_dir=tmp_path / "svc")
    first.start()
    pid = first.status().main_pid
    # A new manager knows the service only from the durable pid file (e.g. `rewheel resume`).
    second = managed(http_service_argv(port), state_dir=tmp_path / "svc")
    assert second.status().active and second.status().main_pid == pid
    second.stop(10)
    assert not pid_alive(pid)
    assert json.loads((tmp_path / "svc" / "service.json").read_text())["stopped"] is True


def test_a_service_started_by_a_rewheel_killed_before_it_recorded_the_pid(managed, tmp_path: Path) -> None:
    """What a kill between the start and the pid's record leaves: service.json holds only the
    intent (its token), no pid file. The next rewheel finds the service by the token its
    environment carries — its own, stoppable without a `[service] stop` — where it used to
    refuse it as started outside rewheel."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/health"
    first = CommandManager(http_service_argv(port), [], tmp_path / "svc", health_url=url)
    first.start()
    pid = first.status().main_pid
    wait_for(first._answers)
    info = json.loads(first.info_file.read_text())
    assert info["starting"] and info["pid"] == pid
    first.info_file.write_text(json.dumps({**info, "pid": None, "start_ticks": None}))
    first.pid_file.unlink()

    second = managed(http_service_argv(port), state_dir=tmp_path / "svc")
    second.health_url = url
    st = second.status()
    assert (st.active, st.judged_by, st.main_pid) == (True, "pid", pid)
    second.check_stoppable(st)  # not refused
    second.stop(10)
    assert not pid_alive(pid) and not second._answers()
    assert json.loads(second.info_file.read_text())["stopped"] is True

    # An intent whose start never happened (killed before it): nothing runs, nothing to stop.
    second.info_file.write_text(json.dumps({**info, "pid": None, "starting": "0" * 16}))
    assert not second.status().active
    second.stop(5)


def test_command_service_that_crashes_at_start_fails_fast(managed) -> None:
    port = free_port()
    m = managed(http_service_argv(port, crash=True))
    started = time.time()
    m.start()
    with pytest.raises(HealthCheckFailed) as exc:
        wait_ready(m, spec_for(port, ready_timeout_s=600), started_at=started)
    assert "died while starting" in exc.value.message and "exit status 1" in exc.value.message
    # In the command manager's own words: its process ended; not systemd's states and Result=.
    assert "its process ended with exit status 1" in exc.value.message
    assert "Result=" not in exc.value.message and "failed/failed" not in exc.value.message
    assert str(m.log_path) in (exc.value.hint or "")
    assert exc.value.result.ok is False
    assert any("model init failed on purpose" in line for line in m.log_lines(started))
    st = m.status()
    assert st.state == "failed" and st.result == "exit-code" and st.exit_status == 1


def test_service_that_never_becomes_healthy_times_out(managed) -> None:
    port = free_port()
    m = managed(http_service_argv(port, never_healthy=True))
    started = time.time()
    m.start()
    with pytest.raises(HealthCheckFailed) as exc:
        wait_ready(m, spec_for(port, ready_timeout_s=1), started_at=started)
    msg = exc.value.message
    assert msg.startswith(f"{m.describe()} did not become healthy within 1s")
    assert f"http://127.0.0.1:{port}/health last answered: HTTP 503" in msg
    assert "ready_timeout_s" in (exc.value.hint or "")
    assert exc.value.exit_code == 1


def test_probe_passes_and_fails(managed) -> None:
    port = free_port()
    m = managed(http_service_argv(port, model="org/Model-A"))
    m.start()
    with httpx.Client() as client:
        ok = wait_ready(m, spec_for(port, model="org/Model-A"), client=client, started_at=time.time())
        assert ok.probe_url == f"http://127.0.0.1:{port}/v1/models"
        with pytest.raises(HealthCheckFailed) as exc:
            wait_ready(m, spec_for(port, model="org/Model-B"), client=client, started_at=time.time())
        assert "answered 200 but without 'org/Model-B'" in exc.value.message
        wrong_url = ServiceSpec(manager="command", start=("x",), health_url=f"http://127.0.0.1:{port}/health",
                                settle_s=0, probe=Probe(url=f"http://127.0.0.1:{port}/nope"))
        with pytest.raises(HealthCheckFailed) as exc:
            wait_ready(m, wrong_url, client=client, started_at=time.time())
        assert f"probe http://127.0.0.1:{port}/nope failed: HTTP 404" in exc.value.message


def test_without_health_url_only_liveness_is_checked(managed) -> None:
    port = free_port()
    m = managed(http_service_argv(port))
    m.start()
    result = wait_ready(m, spec_for(port, health=False, probe=False, settle_s=0.2), started_at=time.time())
    assert result.ok and "liveness only" in result.detail


def test_a_service_dying_while_settling_fails(managed) -> None:
    port = free_port()
    m = managed(http_service_argv(port, die_after_s=1.5))  # 1.5s after it starts listening
    m.start()
    with pytest.raises(HealthCheckFailed) as exc:
        wait_ready(m, spec_for(port, settle_s=30, probe=False), started_at=time.time(), poll_s=0.05)
    assert "right after" in exc.value.message


def test_make_manager_expands_python_and_picks_the_manager(tmp_path: Path) -> None:
    cmd = ServiceSpec(manager="command", start=("{python}", "-m", "srv"), stop=("{python}", "-m", "stop"))
    m = make_manager(cmd, tmp_path, python="/env/bin/python")
    assert isinstance(m, CommandManager)
    assert m.start_argv == ["/env/bin/python", "-m", "srv"] and m.stop_argv[0] == "/env/bin/python"
    sd = make_manager(ServiceSpec(manager="systemd", unit="vllm-kimi-k25"), tmp_path)
    assert isinstance(sd, SystemdManager) and sd.describe() == "systemd unit vllm-kimi-k25.service"


def test_command_check_names_a_missing_executable(tmp_path: Path) -> None:
    m = CommandManager(["no-such-server-binary", "--port", "1"], [], tmp_path)
    with pytest.raises(PreflightError) as exc:
        m.check()
    assert "service.start" in exc.value.message and "no-such-server-binary" in exc.value.message


# --- systemd: against a real systemd in tests/test_service_systemd.py ---------------------------

def test_systemd_check_without_systemctl(fake_host: FakeHost) -> None:
    fake_host.hide("systemctl")
    with pytest.raises(PreflightError) as exc:
        SystemdManager("vllm-kimi-k25").check()
    assert "systemctl is not on PATH" in exc.value.message and "vllm-kimi-k25.service" in exc.value.message


# --- the stand-ins behave like the real tools ------------------------------------------------

def test_journalctl_standin_formats_and_since(fake_host: FakeHost) -> None:
    # What the real journal holds for a unit whose main process crashed at start (the
    # stand-in replays such records; tests/test_service_systemd.py reads the real journal).
    t0 = int(time.time()) - 30
    unit = "vllm-kimi-k25.service"
    said = ["(APIServer pid=4242) starting on port 8000", "Traceback (most recent call last):",
            "RuntimeError: model init failed on purpose"]
    fake_host.add_journal(unit, [
        *({"MESSAGE": m, "_PID": "4242", "__REALTIME_TIMESTAMP": str((t0 + i) * 1_000_000),
           "_SYSTEMD_UNIT": unit, "SYSLOG_IDENTIFIER": "vllm-kimi"} for i, m in enumerate(said)),
        {"MESSAGE": f"{unit}: Main process exited, code=exited, status=1/FAILURE", "_PID": "1",
         "__REALTIME_TIMESTAMP": str((t0 + 5) * 1_000_000), "UNIT": unit, "SYSLOG_IDENTIFIER": "systemd"}])
    short = fake_host.journalctl("-u", "vllm-kimi-k25", "--no-pager").stdout.splitlines()
    pattern = re.compile(r"^[A-Z][a-z]{2} \d{2} \d{2}:\d{2}:\d{2} \S+ vllm-kimi\[(\d+)\]: (.*)$")
    service_lines = [m for m in map(pattern.match, short) if m]
    assert [m.group(2) for m in service_lines] == said
    assert short[-1].endswith(f"systemd[1]: {unit}: Main process exited, code=exited, status=1/FAILURE")
    records = [json.loads(x) for x in fake_host.journalctl("-u", "vllm-kimi-k25", "-o", "json").stdout.splitlines()]
    assert [r["MESSAGE"] for r in records] == [*said, f"{unit}: Main process exited, code=exited, status=1/FAILURE"]
    cat = fake_host.journalctl("-u", "vllm-kimi-k25", "-o", "cat").stdout
    assert "RuntimeError: model init failed on purpose\n" in cat
    future = fake_host.journalctl("-u", "vllm-kimi-k25", "--since", f"@{int(time.time()) + 60}")
    assert future.stdout == "-- No entries --\n"
    assert len(fake_host.journalctl("-u", "vllm-kimi-k25", "--since", f"@{t0 + 2}", "-o", "cat").stdout.splitlines()) == 2
    assert "RuntimeError" in fake_host.journalctl("-u", "vllm-kimi-k25", "--since", "20 min ago").stdout
    day = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - 3600))
    assert "RuntimeError" in fake_host.journalctl("-u", "vllm-kimi-k25", "--since", day).stdout
    assert len(fake_host.journalctl("-u", "vllm-kimi-k25", "-n", "2", "-o", "cat").stdout.splitlines()) == 2
    bad = fake_host.journalctl("--since", "yesterdayish")
    assert bad.returncode == 1 and "Failed to parse timestamp: yesterdayish" in bad.stderr
