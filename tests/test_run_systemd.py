"""The systemd and GPU paths of `rewheel run`, against stand-in systemctl, journalctl and
nvidia-smi that behave like the real tools, with a real model server as the
unit's main process."""

from __future__ import annotations

import json
import subprocess
import sys
import time


from support_standins import FakeHost, wait_for


def test_restart_looping_unit_is_detected_and_reverted(systemd_host, fake_host: FakeHost) -> None:
    h = systemd_host("4.0.0", "service-fails")
    before = h.state()
    code, rep = h.run_json()
    assert code == 1, rep["_stderr"]
    assert rep["status"] == "reverted"
    assert "restart-looping" in rep["failure"]["message"] or "died" in rep["failure"]["message"]
    assert h.state() == before
    wait_for(lambda: h.served_version() == "1.0.0", timeout=20)
    # The root cause comes from the unit's journal, not from the cascade of restarts.
    assert rep["root_cause"]["type"] == "RuntimeError"
    assert "no kernel image is available" in rep["root_cause"]["message"]
    calls = [c[1:] for c in fake_host.calls("systemctl")]
    assert ["stop", "vllm-toy.service"] in [c[:2] for c in calls]
    assert any(c and c[0] == "start" for c in calls)
    assert any("--query-gpu=index,name,uuid,memory.used,memory.total" in " ".join(c)
               for c in fake_host.calls("nvidia-smi"))


def test_good_upgrade_under_systemd(systemd_host, fake_host: FakeHost) -> None:
    h = systemd_host("2.0.0", "good")
    code, rep = h.run_json()
    assert code == 0, rep["_stderr"]
    assert h.served_version() == "2.0.0"
    assert fake_host.unit_state("vllm-toy")["ActiveState"] == "active"


def test_gpu_held_by_leftover_process_stops_the_run_before_anything_changes(systemd_host, fake_host: FakeHost) -> None:
    h = systemd_host("2.0.0", "good")
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fake_host.hold_gpu(leftover.pid, gpu_index=1, used_memory=88210)
        before = h.state()
        code, rep = h.run_json()
        assert code == 1, rep["_stderr"]
        assert str(leftover.pid) in rep["message"]
        assert h.state() == before
        # The old service was put back as it was.
        wait_for(lambda: h.served_version() == "1.0.0", timeout=20)
    finally:
        leftover.kill()
        leftover.wait()


def test_too_few_gpus_is_a_preflight_error(systemd_host, fake_host: FakeHost) -> None:
    h = systemd_host("2.0.0", "good")
    fake_host.set_gpus(1)
    code, rep = h.run_json()
    assert code == 2, rep["_stderr"]
    assert "gpus" in rep["message"]
    assert h.served_version() == "1.0.0"
    assert not any(c[1:2] == ["stop"] for c in fake_host.calls("systemctl"))


def test_missing_nvidia_smi_is_a_preflight_error(systemd_host, fake_host: FakeHost) -> None:
    h = systemd_host("2.0.0", "good")
    fake_host.hide("nvidia-smi")
    code, rep = h.run_json()
    assert code == 2, rep["_stderr"]
    assert "nvidia-smi" in rep["message"]


def test_why_reads_the_units_journal(systemd_host, fake_host: FakeHost) -> None:
    h = systemd_host("4.0.0", "service-fails")
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - 5))
    h.run_json()
    cp = h.rewheel("why", "--unit", "vllm-toy", "--since", since, "--json")
    assert cp.returncode == 0, cp.stderr
    rc = json.loads(cp.stdout)["root_cause"]
    assert rc and "no kernel image" in rc["message"]
