"""SystemdManager and wait_ready against a real systemd (the host's /usr booted in a container,
tests/support_systemd.py): the manager runs inside it, the tiny HTTP service is the unit.

What systemd 252 really does, and these tests hold rewheel to: a Restart=always unit that
crash-loops shows `activating/auto-restart` between starts and counts NRestarts; at its start
limit it ends `failed` with Result=exit-code (not start-limit-hit) and NRestarts at the burst,
and a plain `systemctl start` is refused until `reset-failed`; `stop` with KillMode=process
returns while the workers still run in the unit's cgroup; TimeoutStopSec ends in SIGKILL and
Result=timeout."""

from __future__ import annotations

from typing import Any

from support_standins import free_port, http_service_argv
from support_systemd import RealSystemd


def spec(port: int, unit: str, **fields: Any) -> dict[str, Any]:
    return {"manager": "systemd", "unit": unit, "health_url": f"http://127.0.0.1:{port}/health",
            "ready_timeout_s": 30, "settle_s": 0.3,
            "probe": {"url": f"http://127.0.0.1:{port}/v1/models", "expect": "tiny/model"}, **fields}


def ok(result: dict) -> Any:
    assert result["ok"], result
    return result["value"]


def failed(result: dict, error: str) -> str:
    assert not result["ok"] and result["error"] == error, result
    return result["message"]


def test_healthy_unit_start_ready_log_stop(real_systemd: RealSystemd) -> None:
    port = free_port()
    unit = real_systemd.add_unit("tiny-llm", http_service_argv(port, workers=2, worker_linger_s=0.5),
                                 restart="always", syslog_identifier="tiny-llm")
    check, start, ready, st, lines, where, stop, after = real_systemd.steps(
        "tiny-llm", ["check"], ["start"], ["wait_ready", spec(port, unit)],
        ["until", {"sub_state": "running"}],
        ["log_lines"], ["log_location"], ["stop", 30], ["status"])
    ok(check), ok(start)
    assert ok(ready)["ok"] and ok(ready)["n_restarts"] == 0
    st = ok(st)
    # MainPID and the two workers, read from the unit's cgroup.
    assert st["state"] == "active" and st["main_pid"] in st["pids"] and len(st["pids"]) == 3, st
    assert any(f"listening on http://127.0.0.1:{port}" in line for line in ok(lines))
    assert ok(where).startswith("journalctl -u tiny-llm.service --since @")
    ok(stop)
    after = ok(after)
    assert (after["state"], after["main_pid"], after["pids"]) == ("inactive", 0, [])
    assert ok(real_systemd.steps(unit, ["alive", st["pids"]])[0]) == []  # the workers too


def test_restart_loop_is_detected_then_systemd_gives_up_and_reset_failed_restarts_it(
        real_systemd: RealSystemd) -> None:
    port = free_port()
    unit = real_systemd.add_unit("crashy", http_service_argv(port, crash=True), restart="always",
                                 restart_sec=0.2, start_limit_burst=3, start_limit_interval_s=30)
    _, ready, gave_up, lines, again = real_systemd.steps(
        unit, ["start"], ["wait_ready", spec(port, unit, ready_timeout_s=60)],
        ["until", {"state": "failed"}], ["log_lines"], ["wait_ready", spec(port, unit)])
    message = failed(ready, "HealthCheckFailed")
    assert message.startswith("systemd unit crashy.service is restart-looping"), message
    # Left alone, systemd 252 gives up: failed, Result=exit-code, NRestarts at the burst.
    st = ok(gave_up)
    assert (st["state"], st["sub_state"], st["result"], st["n_restarts"]) == (
        "failed", "failed", "exit-code", 3)
    assert "crashy.service: Start request repeated too quickly." in real_systemd.messages(unit)
    assert "RuntimeError: model init failed on purpose" in ok(lines)
    # A unit that already gave up is named as restart-looping, not as one that died once.
    message = failed(again, "HealthCheckFailed")
    assert "restart-looping" in message and "start limit" in message and "NRestarts=3" in message, message
    # Over its start limit it refuses a plain start; the manager resets it first.
    refused = real_systemd.systemctl("start", unit)
    assert refused.returncode == 1 and "Job for crashy.service failed" in refused.stderr
    real_systemd.add_unit("crashy", http_service_argv(port), restart="always")  # "the old build"
    start, ready, st, stop = real_systemd.steps(unit, ["start"], ["wait_ready", spec(port, unit)],
                                                ["status"], ["stop", 30])
    ok(start), ok(stop)
    assert ok(ready)["ok"] and ok(st)["n_restarts"] == 0


def test_a_crash_loop_after_the_first_healthy_answer_is_caught_while_settling(
        real_systemd: RealSystemd) -> None:
    port = free_port()
    unit = real_systemd.add_unit("flaky", http_service_argv(port, die_after_s=2.0), restart="always",
                                 restart_sec=0.3)
    _, ready, _ = real_systemd.steps(unit, ["start"], ["wait_ready", spec(port, unit, settle_s=30)],
                                     ["stop", 30])
    message = failed(ready, "HealthCheckFailed")
    assert "flaky.service is restart-looping" in message, message
    assert "right after becoming healthy" in message, message


def test_unit_that_never_becomes_healthy(real_systemd: RealSystemd) -> None:
    port = free_port()
    unit = real_systemd.add_unit("slow", http_service_argv(port, never_healthy=True))
    _, ready, _ = real_systemd.steps(unit, ["start"], ["wait_ready", spec(port, unit, ready_timeout_s=1)],
                                     ["stop", 30])
    message = failed(ready, "HealthCheckFailed")
    assert message.startswith("systemd unit slow.service did not become healthy within 1s"), message
    assert "HTTP 503" in message


def test_unknown_unit(real_systemd: RealSystemd) -> None:
    check, stop, start = real_systemd.steps("nosuch", ["check"], ["stop", 5], ["start"])
    assert "nosuch.service is not loaded (LoadState=not-found)" in failed(check, "PreflightError")
    assert "nosuch.service" in failed(stop, "ServiceError") and "not loaded" in stop["message"]
    assert "Unit nosuch.service not found." in failed(start, "ServiceError")


def test_workers_that_outlive_the_main_process_are_waited_for_in_the_cgroup(
        real_systemd: RealSystemd) -> None:
    port = free_port()
    # KillMode=process: systemd signals only the main process and calls the unit stopped when it
    # exits; the workers (SIGTERMed by it) take their time, still in the unit's cgroup.
    unit = real_systemd.add_unit("lingering", http_service_argv(port, workers=2, worker_linger_s=1.5),
                                 extra={"KillMode": "process"})
    _, _, st, stop, after = real_systemd.steps(
        unit, ["start"], ["wait_ready", spec(port, unit)], ["until", {"sub_state": "running"}],
        ["stop", 30], ["status"])
    st = ok(st)
    assert len(st["pids"]) == 3, st
    ok(stop)
    assert ok(real_systemd.steps(unit, ["alive", st["pids"]])[0]) == []
    assert ok(after)["state"] == "inactive"


def test_workers_that_do_not_exit_fail_the_stop_naming_them(real_systemd: RealSystemd) -> None:
    port = free_port()
    unit = real_systemd.add_unit("leaky", http_service_argv(port, workers=1, worker_linger_s=600),
                                 extra={"KillMode": "process"})
    _, _, st, stop = real_systemd.steps(unit, ["start"], ["wait_ready", spec(port, unit)],
                                        ["until", {"sub_state": "running"}], ["stop", 1])
    worker = [p for p in ok(st)["pids"] if p != ok(st)["main_pid"]]
    message = failed(stop, "ServiceError")
    assert "leaky.service did not stop within 1s" in message
    assert f"processes still running: {worker[0]} (python" in message, message
    assert f"kill -9 {worker[0]}" in (stop["hint"] or "")


def test_timeout_stop_sec_ends_in_sigkill(real_systemd: RealSystemd) -> None:
    port = free_port()
    unit = real_systemd.add_unit("stubborn", http_service_argv(port, ignore_sigterm=True, workers=1),
                                 timeout_stop_s=0.5)
    _, _, st, stop, after = real_systemd.steps(unit, ["start"], ["wait_ready", spec(port, unit)],
                                               ["until", {"sub_state": "running"}], ["stop", 30], ["status"])
    ok(stop)
    assert ok(real_systemd.steps(unit, ["alive", ok(st)["pids"]])[0]) == []
    assert (ok(after)["state"], ok(after)["result"]) == ("failed", "timeout")
    assert "stubborn.service: State 'stop-sigterm' timed out. Killing." in real_systemd.messages(unit)


def test_a_stop_longer_than_stop_timeout_s_is_an_error_that_says_so(real_systemd: RealSystemd) -> None:
    port = free_port()
    unit = real_systemd.add_unit("slowstop", http_service_argv(port, ignore_sigterm=True),
                                 timeout_stop_s=60)
    _, _, stop = real_systemd.steps(unit, ["start"], ["wait_ready", spec(port, unit)], ["stop", 1])
    message = failed(stop, "ServiceError")
    assert "slowstop.service" in message and "1s" in message, message
    assert "stop_timeout_s" in (stop["hint"] or "")
