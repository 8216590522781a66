"""GPU checks against the nvidia-smi stand-in: counting visible GPUs, a missing tool, a
missing driver, a real leftover process that holds GPU memory until it is killed, and
preflight's "are the GPUs free?" with a real service that rewheel started holding one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rewheel import gpu
from rewheel.errors import GpuError, PreflightError
from support_standins import FakeHost, free_port, http_service_argv, wait_for

QUERY_GPU = ["nvidia-smi", "--query-gpu=index,name,uuid,memory.used,memory.total",
             "--format=csv,noheader,nounits"]


def sleeper(host: FakeHost):
    return host.spawn([sys.executable, "-c", "import time; time.sleep(600)"])


# --- the stand-in prints what the real tool prints ---------------------------------------------

def test_standin_csv_formats_match_the_real_tool(fake_host: FakeHost) -> None:
    fake_host.set_gpus(2)
    p = sleeper(fake_host)
    fake_host.hold_gpu(p.pid, gpu_index=1, used_memory=88210, process_name="/root/ml-env/bin/python3")
    plain = fake_host.nvidia_smi("--query-gpu=index,name,uuid,memory.used,memory.total",
                                 "--format=csv,noheader,nounits").stdout.splitlines()
    assert plain == [
        f"0, NVIDIA RTX PRO 6000 Blackwell Server Edition, {fake_host.gpu_uuid(0)}, 0, 97887",
        f"1, NVIDIA RTX PRO 6000 Blackwell Server Edition, {fake_host.gpu_uuid(1)}, 88210, 97887",
    ]
    with_units = fake_host.nvidia_smi("--query-gpu=index,memory.used,memory.total",
                                      "--format=csv").stdout.splitlines()
    assert with_units[0] == "index, memory.used [MiB], memory.total [MiB]"
    assert with_units[2] == "1, 88210 MiB, 97887 MiB"
    apps = fake_host.nvidia_smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
                                "--format=csv,noheader,nounits").stdout
    assert apps == f"{p.pid}, /root/ml-env/bin/python3, 88210, {fake_host.gpu_uuid(1)}\n"
    bad = fake_host.nvidia_smi("--query-gpu=index,bogus", "--format=csv")
    assert bad.returncode == 2 and 'Field "bogus" is not a valid field to query.' in bad.stdout


# --- counting -------------------------------------------------------------------------------

def test_list_gpus_parses_the_csv_and_asks_the_documented_query(fake_host: FakeHost) -> None:
    fake_host.set_gpus(2)
    gpus = gpu.list_gpus()
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].name == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert gpus[1].uuid == fake_host.gpu_uuid(1)
    assert (gpus[0].memory_used_mib, gpus[0].memory_total_mib) == (0, 97887)
    assert QUERY_GPU in fake_host.calls("nvidia-smi")
    assert gpus[0].to_json()["memory_total_mib"] == 97887


def test_require_gpus_enough(fake_host: FakeHost) -> None:
    fake_host.set_gpus(8)
    assert len(gpu.require_gpus(8)) == 8
    assert len(gpu.require_gpus(2)) == 8  # more than needed is fine; all visible come back


def test_require_gpus_too_few_names_the_counts(fake_host: FakeHost) -> None:
    fake_host.set_gpus(2)
    with pytest.raises(PreflightError) as exc:
        gpu.require_gpus(8)
    assert "smoke.gpus = 8" in exc.value.message
    assert "only 2 are visible" in exc.value.message


def test_host_without_gpus_counts_zero(fake_host: FakeHost) -> None:
    fake_host.set_gpus(0)
    raw = fake_host.nvidia_smi("--query-gpu=index", "--format=csv,noheader,nounits")
    assert (raw.returncode, raw.stdout) == (6, "No devices were found\n")
    assert gpu.list_gpus() == []
    with pytest.raises(PreflightError) as exc:
        gpu.require_gpus(1)
    assert "only 0 are visible [none]" in exc.value.message


def test_require_zero_gpus_needs_no_nvidia_smi(fake_host: FakeHost) -> None:
    fake_host.hide("nvidia-smi")
    assert gpu.require_gpus(0) == []
    assert fake_host.calls("nvidia-smi") == []


def test_missing_nvidia_smi_is_a_preflight_error(fake_host: FakeHost) -> None:
    fake_host.set_gpus(2)
    fake_host.hide("nvidia-smi")
    with pytest.raises(PreflightError) as exc:
        gpu.require_gpus(1)
    assert "nvidia-smi not found" in exc.value.message
    assert "smoke.gpus = 1" in exc.value.message
    assert exc.value.exit_code == 2


def test_no_driver_is_a_preflight_error(fake_host: FakeHost) -> None:
    fake_host.set_gpus(2)
    fake_host.set_no_driver()
    raw = fake_host.nvidia_smi("--query-gpu=index", "--format=csv")
    assert raw.returncode == 9 and "couldn't communicate with the NVIDIA driver" in raw.stdout
    with pytest.raises(PreflightError) as exc:
        gpu.require_gpus(2)
    assert "exit 9" in exc.value.message
    assert "couldn't communicate with the NVIDIA driver" in exc.value.message


def test_cuda_visible_devices_limits_the_count(fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_host.set_gpus(8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert [g.index for g in gpu.require_gpus(2)] == [0, 1]
    with pytest.raises(PreflightError) as exc:
        gpu.require_gpus(4)
    assert "CUDA_VISIBLE_DEVICES='0,1' selects 2 of the 8 GPUs" in exc.value.message


@pytest.mark.parametrize("value, expected", [
    (None, [0, 1, 2, 3]),
    ("", []),
    ("2,0", [2, 0]),
    ("1,7,0", [1]),          # CUDA stops at the first entry that names no device
    ("0,0,1", [0]),          # a repeated device is invalid too
    ("GPU-00000003", [3]),   # a unique UUID prefix
    ("MIG-abc", []),
])
def test_visible_gpus_follows_cuda_rules(value: str | None, expected: list[int]) -> None:
    gpus = [gpu.Gpu(i, "G", f"GPU-{i:08x}-0000", 0, 100) for i in range(4)]
    assert [g.index for g in gpu.visible_gpus(gpus, value)] == expected


# --- processes holding GPU memory ----------------------------------------------------------

def test_compute_apps_lists_live_holders_only(fake_host: FakeHost) -> None:
    fake_host.set_gpus(2)
    assert gpu.compute_apps() == []
    p = sleeper(fake_host)
    fake_host.hold_gpu(p.pid, gpu_index=1, used_memory=88210, process_name="python3, worker")
    apps = gpu.compute_apps(gpu.list_gpus())
    assert [(a.pid, a.process_name, a.used_memory_mib, a.gpu_index) for a in apps] == [
        (p.pid, "python3, worker", 88210, 1)]
    assert gpu.list_gpus()[1].memory_used_mib == 88210
    p.kill()
    p.wait()
    assert gpu.compute_apps() == []


def test_wait_times_out_naming_the_leftover_process(fake_host: FakeHost) -> None:
    fake_host.set_gpus(2)
    p = sleeper(fake_host)
    fake_host.hold_gpu(p.pid, gpu_index=1, used_memory=88210)
    with pytest.raises(GpuError) as exc:
        gpu.wait_gpus_released(0.3, poll_s=0.05)
    msg = exc.value.message
    assert f"pid {p.pid}" in msg and "88210 MiB on GPU 1" in msg
    assert "python" in msg  # the process name nvidia-smi reports
    assert f"kill {p.pid}" in (exc.value.hint or "")


def test_wait_passes_once_the_leftover_process_is_killed(fake_host: FakeHost) -> None:
    fake_host.set_gpus(2)
    p = sleeper(fake_host)
    fake_host.hold_gpu(p.pid, gpu_index=0, used_memory=1024)
    seen: list[str] = []

    def kill_it(message: str) -> None:  # called while the wait is waiting on this process
        seen.append(message)
        p.kill()
        p.wait()

    release = gpu.wait_gpus_released(60, poll_s=0.05, on_progress=kill_it)
    assert seen and f"pid {p.pid}" in seen[0]
    assert [w.pid for w in release.waited_for] == [p.pid]
    assert release.to_json()["waited_for"][0]["pid"] == p.pid


def test_wait_ignores_gpus_outside_cuda_visible_devices(fake_host: FakeHost,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fake_host.set_gpus(2)
    fake_host.hold_gpu(4_000_000, gpu_index=1, used_memory=500, process_name="[Not Found]", foreign=True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert gpu.wait_gpus_released(5, poll_s=0.05).waited_for == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(GpuError) as exc:
        gpu.wait_gpus_released(0.2, poll_s=0.05)
    assert "pid 4000000 ([Not Found])" in exc.value.message


def test_wait_without_driver_is_a_gpu_error(fake_host: FakeHost) -> None:
    fake_host.set_gpus(1)
    fake_host.set_no_driver()
    with pytest.raises(GpuError) as exc:
        gpu.wait_gpus_released(1)
    assert "NVIDIA driver" in exc.value.message


# --- preflight: are the GPUs free? ------------------------------------------------------------

def test_check_gpus_refuses_a_stranger_and_lets_the_services_own_processes_pass(fake_host: FakeHost) -> None:
    fake_host.set_gpus(2)
    svc, stranger = sleeper(fake_host), sleeper(fake_host)
    fake_host.hold_gpu(svc.pid, gpu_index=0, used_memory=70000)
    survey = gpu.check_gpus(1, service_pids={svc.pid}, has_service=True)
    assert [p.pid for p in survey.service] == [svc.pid] and survey.foreign == []
    assert f"0: NVIDIA RTX PRO 6000 Blackwell Server Edition (70000 of 97887 MiB used; service pid {svc.pid} " \
           "70000 MiB)" in survey.describe()
    # The service's 70000 MiB count as free for the smoke test: the stop releases them.
    assert gpu.check_gpus(1, need_free_mib=97887, service_pids={svc.pid}, has_service=True).used[0].index == 0
    fake_host.hold_gpu(stranger.pid, gpu_index=1, used_memory=500)
    with pytest.raises(PreflightError) as exc:
        gpu.check_gpus(1, service_pids={svc.pid}, has_service=True)
    assert f"pid {stranger.pid}" in exc.value.message and "500 MiB on GPU 1" in exc.value.message
    assert f"pid {svc.pid}" not in exc.value.message
    assert exc.value.exit_code == 2 and f"kill {stranger.pid}" in (exc.value.hint or "")


def test_check_gpus_refuses_too_little_free_memory(fake_host: FakeHost) -> None:
    fake_host.set_gpus(1)
    assert gpu.check_gpus(1, need_free_mib=97887).used[0].memory_total_mib == 97887
    with pytest.raises(PreflightError) as exc:
        gpu.check_gpus(1, need_free_mib=97888)
    assert "smoke.gpu_free_mib = 97888" in exc.value.message and "has 97887 MiB free" in exc.value.message


def test_rewheel_check_tells_the_services_gpu_processes_from_a_strangers(
        fake_host: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The preflight that `check` and `run` share: a service that rewheel started holds the GPU
    (its stop frees it: not refused), a stranger holds it too (refused, before anything stops),
    then the service is stopped (its stop frees nothing any more)."""
    from rewheel import preflight
    from rewheel.environment import Environment
    from rewheel.paths import env_dir, state_home
    from rewheel.recipe import load_recipe
    from rewheel.service import make_manager

    fake_host.set_gpus(1)
    monkeypatch.setenv("REWHEEL_HOME", str(tmp_path / "home"))
    port = free_port()
    recipe = tmp_path / "r.toml"
    recipe.write_text(f"[environment]\npython = {json.dumps(sys.executable)}\n[service]\nmanager = \"command\"\n"
                      f"start = {json.dumps(http_service_argv(port))}\n"
                      f"health_url = \"http://127.0.0.1:{port}/health\"\n"
                      "[smoke]\ncommand = [\"{python}\", \"-c\", \"pass\"]\ngpus = 1\n")
    r = load_recipe(recipe)
    assert r.service is not None
    mgr = make_manager(r.service, env_dir(state_home(), Environment.inspect(r.python).prefix), python=r.python)
    mgr.start()
    main_pid = mgr.status().main_pid
    fake_host.track_group(main_pid)
    wait_for(lambda: mgr.status().up)
    fake_host.hold_gpu(main_pid, gpu_index=0, used_memory=60000)

    def gpus_check() -> dict:
        res = preflight.run_checks(r, indexes=False)
        return next(c.to_json() for c in res.checks if c.name == "gpus")

    c = gpus_check()
    assert c["ok"] and f"service pid {main_pid} 60000 MiB" in c["detail"], c
    stranger = sleeper(fake_host)
    fake_host.hold_gpu(stranger.pid, gpu_index=0, used_memory=1000)
    c = gpus_check()
    assert not c["ok"] and f"pid {stranger.pid}" in c["detail"] and f"pid {main_pid} " not in c["detail"], c
    assert "not part of the running service" in c["detail"]
    mgr.stop(10)
    c = gpus_check()
    assert not c["ok"] and "the service is not running: its stop frees nothing" in c["detail"], c
