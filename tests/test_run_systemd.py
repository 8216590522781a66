"""The systemd and GPU paths of `rewheel run` against a real systemd (booted from the host's
/usr in a container, rewheel run inside it; tests/support_systemd.py), with a real model server
as the unit's main process and a stand-in nvidia-smi (the only fake: there is no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from support_standins import FakeHost, wait_for
from support_systemd import RealSystemd


def test_restart_looping_unit_is_detected_and_reverted(systemd_host, real_systemd: RealSystemd,
                                                       fake_gpus: FakeHost) -> None:
    h = systemd_host("4.0.0", "service-fails")
    before = h.state()
    code, rep = h.run_json()
    assert code == 1, rep["_stderr"]
    assert rep["status"] == "reverted"
    assert "restart-looping" in rep["failure"]["message"], rep["failure"]
    assert h.state() == before
    wait_for(lambda: h.served_version() == "1.0.0", timeout=20)
    st = real_systemd.show("vllm-toy", "ActiveState", "NRestarts")
    assert st["ActiveState"] == "active" and st["NRestarts"] == "0", st
    # The root cause comes from the unit's journal, not from the cascade of restarts.
    assert rep["root_cause"]["type"] == "RuntimeError"
    assert "no kernel image is available" in rep["root_cause"]["message"]
    assert "vllm-toy" in rep["diagnosis"]["source"], rep["diagnosis"]
    # systemd itself logged the crash the report names (and, when rewheel was not quicker,
    # its restart).
    said = real_systemd.messages("vllm-toy")
    assert "vllm-toy.service: Main process exited, code=exited, status=1/FAILURE" in said, said
    assert any("--query-gpu=index,name,uuid,memory.used,memory.total" in " ".join(c)
               for c in fake_gpus.calls("nvidia-smi"))


def test_good_upgrade_under_systemd(systemd_host, real_systemd: RealSystemd) -> None:
    h = systemd_host("2.0.0", "good")
    pid_before = real_systemd.show("vllm-toy", "MainPID")["MainPID"]
    code, rep = h.run_json()
    assert code == 0, rep["_stderr"]
    assert rep["status"] == "upgraded"
    assert h.served_version() == "2.0.0"
    st = real_systemd.show("vllm-toy", "ActiveState", "MainPID", "NRestarts")
    assert st["ActiveState"] == "active" and st["NRestarts"] == "0", st
    assert st["MainPID"] != pid_before  # stopped and started by rewheel, not left running
    assert (rep["service_before"], rep["service_judged_by"]) == ("active", "systemd")


def test_gpu_held_by_leftover_process_stops_the_run_before_anything_changes(
        systemd_host, real_systemd: RealSystemd, fake_gpus: FakeHost) -> None:
    h = systemd_host("2.0.0", "good")
    # A process outside the unit (in the container's pid namespace, as rewheel sees it): no
    # step of the run would end it, so the preflight refuses it while the service still serves.
    leftover = real_systemd.transient("leftover", [sys.executable, "-c", "import time; time.sleep(600)"])
    fake_gpus.hold_gpu(leftover, gpu_index=1, used_memory=88210, process_name=sys.executable)
    unit = real_systemd.show("vllm-toy", "MainPID", "InvocationID")
    before = h.state()
    code, rep = h.run_json()
    assert code == 2, rep["_stderr"]
    assert f"pid {leftover} " in rep["message"] and "not part of the running service" in rep["message"]
    assert h.state() == before
    assert real_systemd.show("vllm-toy", "MainPID", "InvocationID") == unit  # never stopped


def test_gpu_held_from_another_container_is_waited_for_after_the_stop(
        systemd_host, real_systemd: RealSystemd, fake_gpus: FakeHost) -> None:
    h = systemd_host("2.0.0", "good")
    # A pid nvidia-smi shows that is not in rewheel's pid namespace ("[Not Found]"): it cannot be
    # told from the service's own workers, so the preflight lets it be and the wait for GPU memory
    # after the stop names it; the old service is put back as it was.
    fake_gpus.hold_gpu(4_000_000, gpu_index=1, used_memory=88210, process_name="[Not Found]", foreign=True)
    before = h.state()
    code, rep = h.run_json()
    assert code == 1, rep["_stderr"]
    assert "pid 4000000 ([Not Found]) holds 88210 MiB on GPU 1" in rep["message"]
    assert h.state() == before
    wait_for(lambda: h.served_version() == "1.0.0", timeout=20)
    assert real_systemd.show("vllm-toy", "ActiveState")["ActiveState"] == "active"


def test_too_few_gpus_is_a_preflight_error(systemd_host, real_systemd: RealSystemd,
                                           fake_gpus: FakeHost) -> None:
    h = systemd_host("2.0.0", "good")
    before = real_systemd.show("vllm-toy", "MainPID", "InvocationID")
    fake_gpus.set_gpus(1)
    code, rep = h.run_json()
    assert code == 2, rep["_stderr"]
    assert "gpus" in rep["message"]
    assert h.served_version() == "1.0.0"
    assert real_systemd.show("vllm-toy", "MainPID", "InvocationID") == before  # never stopped


def test_missing_nvidia_smi_is_a_preflight_error(systemd_host, fake_gpus: FakeHost) -> None:
    h = systemd_host("2.0.0", "good")
    fake_gpus.hide("nvidia-smi")
    code, rep = h.run_json()
    assert code == 2, rep["_stderr"]
    assert "nvidia-smi" in rep["message"]


def test_why_reads_the_units_journal(systemd_host) -> None:
    h = systemd_host("4.0.0", "service-fails")
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - 1))
    code, rep = h.run_json()
    assert code == 1, rep["_stderr"]
    cp = h.rewheel("why", "--unit", "vllm-toy", "--since", since, "--json")
    assert cp.returncode == 0, cp.stderr
    rc = json.loads(cp.stdout)["root_cause"]
    assert rc and rc["type"] == "RuntimeError" and "no kernel image" in rc["message"], rc


def test_an_inactive_unit_stays_inactive_through_a_kept_run_a_reverted_run_and_a_rollback(
        systemd_host, real_systemd: RealSystemd) -> None:
    h = systemd_host("2.0.0", "good", start=False)
    code, rep = h.run_json()
    assert code == 0, rep["_stderr"]
    assert rep["status"] == "upgraded" and rep["after"]["toypkg"] == "2.0.0"
    assert (rep["service_before"], rep["service_judged_by"]) == ("inactive", "systemd")
    assert real_systemd.show("vllm-toy", "ActiveState")["ActiveState"] == "inactive"
    kept = h.state()
    # A build that fails its smoke test is reverted; the unit is still left stopped.
    h.write_recipe(smoke={"command": ["{python}", "-c", "raise SystemExit('smoke failed on purpose')"],
                          "timeout_s": 30, "gpus": 2})
    code, rep = h.run_json()
    assert code == 1, rep["_stderr"]
    assert rep["status"] == "reverted" and h.state() == kept
    # A plain rollback undoes the upgrade still in place (2.0.0 -> 1.0.0), not the reverted
    # run's snapshot (which is 2.0.0 again), and starts nothing.
    cp = h.rewheel("rollback", str(h.recipe), "--yes", "--json")
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["restore"]["written"] > 0 and doc["service"] is None
    assert subprocess.run([str(h.python), "-c", "import toypkg; print(toypkg.__version__)"],
                          capture_output=True, text=True).stdout == "1.0.0\n"
    assert h.rewheel("status", str(h.recipe), "--json").returncode == 0
    st = real_systemd.show("vllm-toy", "ActiveState", "ExecMainStartTimestamp")
    assert st == {"ActiveState": "inactive", "ExecMainStartTimestamp": ""}, st  # never started
    assert h.served_version() is None
