"""Preflight's "are the GPUs free?": who holds memory on the visible GPUs, sorted by what frees it
(the service's stop, nothing, or unknown), and the refusals that follow (gpu.survey_gpus,
gpu.survey_refusal). Pure logic over nvidia-smi's rows; the stand-in and `rewheel check` take
it end to end in tests/test_gpu.py."""

from __future__ import annotations

import random

import pytest

from rewheel import gpu

H100 = "NVIDIA H100 80GB HBM3"


def gpus(n: int, used: int = 0, total: int | None = 81559) -> list[gpu.Gpu]:
    return [gpu.Gpu(i, H100, f"GPU-{i:08x}-aaaa", used, total) for i in range(n)]


def app(pid: int, on: int, mib: int | None = 2048, name: str = "/usr/bin/python3") -> gpu.GpuProcess:
    return gpu.GpuProcess(pid, name, mib, f"GPU-{on:08x}-aaaa", on)


def everywhere(pid: int) -> bool:
    return True


def test_without_a_service_every_holder_is_foreign_and_refused() -> None:
    s = gpu.survey_gpus(gpus(2), [app(10, 0), app(11, 1, 500)], 1, service_pids=None, in_namespace=everywhere)
    assert [p.pid for p in s.foreign] == [10, 11]  # GPU 1 too: the wait after a stop covers every visible GPU
    err = gpu.survey_refusal(s, need_free_mib=0, has_service=False)
    assert err is not None and err.exit_code == 2
    assert "pid 10 (/usr/bin/python3) holds 2048 MiB on GPU 0" in err.message
    assert "no [service] whose stop would free it" in err.message
    assert "kill 10 11" in (err.hint or "") and "CUDA_VISIBLE_DEVICES" in (err.hint or "")


def test_the_running_services_processes_are_freed_by_its_stop_and_others_are_not() -> None:
    apps = [app(100, 0, 70000), app(101, 0, 900), app(555, 0, 1000)]
    s = gpu.survey_gpus(gpus(1, used=71900), apps, 1, service_pids={100, 101}, in_namespace=everywhere)
    assert [p.pid for p in s.service] == [100, 101] and [p.pid for p in s.foreign] == [555]
    err = gpu.survey_refusal(s, need_free_mib=0, has_service=True)
    assert err is not None and "pid 555" in err.message and "pid 100" not in err.message
    assert "not part of the running service" in err.message
    # The service's 70900 MiB count as free for the smoke test: its stop releases them.
    assert s.free_mib(s.used[0]) == 81559 - 71900 + 70900


def test_a_stopped_service_frees_nothing() -> None:
    s = gpu.survey_gpus(gpus(1), [app(7, 0)], 1, service_pids=None, in_namespace=everywhere)
    err = gpu.survey_refusal(s, need_free_mib=0, has_service=True)
    assert err is not None and "the service is not running: its stop frees nothing" in err.message


def test_holders_that_cannot_be_told_from_the_service_are_left_to_the_wait_after_the_stop() -> None:
    # Another pid namespace (a container's, "[Not Found]") while a service runs, or a service whose
    # processes are unknown: refusing could refuse the service itself.
    other_ns = gpu.survey_gpus(gpus(1), [app(4_000_000, 0, name="[Not Found]")], 1, service_pids={12},
                               in_namespace=lambda pid: pid != 4_000_000)
    unknown_pids = gpu.survey_gpus(gpus(1), [app(13, 0)], 1, service_pids=set(), in_namespace=everywhere)
    for s in (other_ns, unknown_pids):
        assert s.foreign == [] and len(s.unknown) == 1
        assert gpu.survey_refusal(s, need_free_mib=0, has_service=True) is None
        assert "unattributed pid" in s.describe()


def test_gpus_outside_cuda_visible_devices_are_not_looked_at() -> None:
    visible = gpu.visible_gpus(gpus(4), "2")
    s = gpu.survey_gpus(visible, [app(9, 0), app(10, 3)], 1, service_pids=None, in_namespace=everywhere)
    assert s.foreign == [] and [g.index for g in s.used] == [2]


def test_too_little_free_memory_names_the_gpu_and_the_numbers() -> None:
    s = gpu.survey_gpus(gpus(2, used=60000), [], 2, service_pids=None, in_namespace=everywhere)
    err = gpu.survey_refusal(s, need_free_mib=30000, has_service=False)
    assert err is not None
    assert ("smoke.gpu_free_mib = 30000 needs 30000 MiB free on each GPU the smoke test uses, but "
            f"GPU 0 ({H100}) has 21559 MiB free (60000 of 81559 MiB used)") in err.message
    assert gpu.survey_refusal(s, need_free_mib=21559, has_service=False) is None
    assert gpu.survey_refusal(s, need_free_mib=0, has_service=False) is None


def test_free_memory_is_asked_only_of_the_gpus_the_smoke_test_uses() -> None:
    g = [gpu.Gpu(0, H100, "GPU-0", 0, 81559), gpu.Gpu(1, H100, "GPU-1", 81000, 81559)]
    s = gpu.survey_gpus(g, [], 1, service_pids=None, in_namespace=everywhere)
    assert gpu.survey_refusal(s, need_free_mib=40000, has_service=False) is None
    s2 = gpu.survey_gpus(g, [], 2, service_pids=None, in_namespace=everywhere)
    err = gpu.survey_refusal(s2, need_free_mib=40000, has_service=False)
    assert err is not None and "GPU 1" in err.message and "GPU 0" not in err.message


def test_unknown_memory_is_not_refused_for() -> None:
    s = gpu.survey_gpus(gpus(1, used=0, total=None), [], 1, service_pids=None, in_namespace=everywhere)
    assert s.free_mib(s.used[0]) is None
    assert gpu.survey_refusal(s, need_free_mib=10**6, has_service=False) is None
    assert "memory [N/A]" in s.describe()


def test_a_holder_is_refused_before_the_free_memory_is_counted() -> None:
    s = gpu.survey_gpus(gpus(1, used=81000), [app(5, 0, 81000)], 1, service_pids=None, in_namespace=everywhere)
    err = gpu.survey_refusal(s, need_free_mib=1024, has_service=False)
    assert err is not None and "held by another process" in err.message


SWEEP = 3000


@pytest.mark.parametrize("seed", range(6))
def test_sweep_every_holder_lands_in_exactly_one_bucket(seed: int) -> None:
    """Random tables of GPUs, holders (some on invisible GPUs, some with [N/A] memory, some in
    another namespace), service pid sets and demands: the buckets partition the holders on
    visible GPUs, the refusal is there exactly when a foreign holder or a short GPU is, and free
    memory is never negative nor above the GPU's total."""
    rng = random.Random(seed)
    for _ in range(SWEEP // 6):
        n_gpus = rng.randint(1, 8)
        table = [gpu.Gpu(i, H100, f"GPU-{i}", rng.randint(0, 81559), rng.choice([81559, 81559, None]))
                 for i in range(n_gpus)]
        visible = gpu.visible_gpus(table, rng.choice([None, "0", "1,0", "", "3,2,1"]))
        apps = [gpu.GpuProcess(rng.randint(1, 60), "p", rng.choice([None, rng.randint(1, 80000)]),
                               f"GPU-{rng.randrange(n_gpus + 1)}") for _ in range(rng.randint(0, 6))]
        service = rng.choice([None, set(), {rng.randint(1, 60) for _ in range(3)}])
        here = set(range(1, 61)) - {rng.randint(1, 60) for _ in range(2)}  # the rest: another namespace
        need = rng.choice([0, 1, 40000, 90000])
        n = rng.randint(1, 4)
        s = gpu.survey_gpus(visible, apps, n, service_pids=service, in_namespace=here.__contains__)
        on_visible = [a for a in apps if a.gpu_uuid in {g.uuid for g in visible}]
        assert sorted(map(id, s.service + s.unknown + s.foreign)) == sorted(map(id, on_visible))
        if service is None:
            assert s.foreign == on_visible
        for g in s.used:
            free = s.free_mib(g)
            assert free is None or 0 <= free <= (g.memory_total_mib or 0) + sum(
                p.used_memory_mib or 0 for p in s.service)
        short = [g for g in s.used if (f := s.free_mib(g)) is not None and f < need]
        err = gpu.survey_refusal(s, need_free_mib=need, has_service=service is not None)
        assert (err is not None) == bool(s.foreign or (need and short))
