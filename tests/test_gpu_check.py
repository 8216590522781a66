"""`make gpu-check` (devtools/gpu_check.py) on this CPU host: it stops at once where there is no
NVIDIA GPU, and its whole pipeline runs on the nvidia-smi stand-in with gpu_smoke.py's CPU
stand-in for torch — rewheel and uv installed offline from a wheels folder that `make gpu-wheels`
would fill, a real virtualenv, a real local index, real `rewheel check/smoke/run/why`, every file
hashed before and after each revert. Only the GPU is not real; the real path needs a GPU host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support_standins import FakeHost

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def gpu_check(*args: str, tmp: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run([sys.executable, "-m", "devtools.gpu_check", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("host", ["no nvidia-smi", "no driver", "no GPU"])
def test_on_a_host_without_an_nvidia_gpu_it_stops_at_once_and_says_why(
        fake_host: FakeHost, tmp_path: Path, host: str) -> None:
    if host == "no nvidia-smi":
        fake_host.hide("nvidia-smi")
    elif host == "no driver":
        fake_host.set_gpus(1)
        fake_host.set_no_driver()
    else:
        fake_host.set_gpus(0)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cp = gpu_check("--json", tmp=tmp)
    assert cp.returncode == 3, cp.stdout + cp.stderr
    said = cp.stdout + cp.stderr
    assert said.startswith("gpu-check: no NVIDIA GPU on this host: ")
    assert {"no nvidia-smi": "nvidia-smi not found on PATH", "no driver": "could not communicate with the NVIDIA driver",
            "no GPU": "nvidia-smi lists no GPU"}[host] in said
    assert "Nothing was checked (exit 3)" in said
    assert list(tmp.iterdir()) == []  # no work folder, no wheel looked at: it stopped before anything


def test_make_gpu_check_runs_it_and_needs_no_virtualenv(fake_host: FakeHost, tmp_path: Path) -> None:
    fake_host.hide("nvidia-smi")
    cp = subprocess.run(["make", "-s", "gpu-check", f"GPU_PYTHON={sys.executable}", "VENV=/nonexistent"], cwd=REPO,
                        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert "gpu-check: no NVIDIA GPU on this host" in cp.stdout and "Error 3" in cp.stderr, cp.stdout + cp.stderr
    assert not Path("/nonexistent").exists()


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `make gpu-wheels` makes: rewheel built from this checkout, uv and every dependency."""
    from devtools import gpu_stage

    out = tmp_path_factory.mktemp("gpu-wheels")
    gpu_stage.build_wheels(out, python_version=f"{sys.version_info.major}.{sys.version_info.minor}")
    return out


EXPECTED_ROWS = [
    "nvidia-smi read through gpu.py", "rewheel check passes: gpus = 1, gpu_free_mib = 1024",
    "refused: too few GPUs (gpus = 2, one visible)", "a process holding 2048 MiB, seen through gpu.py",
    "refused: the GPU held by another process", "tiny Llama-style model made locally",
    "model-init smoke on the GPU (rewheel smoke)", "CUDA_VISIBLE_DEVICES as rewheel passes it",
    "the timeout as rewheel sets it", "an upgrade kept: the new build passes the smoke (rewheel run)",
    "oom: the failing build reverted (rewheel run)", "oom: restored byte for byte",
    "oom: rewheel why names the CUDA error", "assert: the failing build reverted (rewheel run)",
    "assert: restored byte for byte", "assert: rewheel why names the CUDA error",
    "hang: the failing build reverted (rewheel run)", "hang: restored byte for byte",
    "holder's memory released after its kill", "smoke start to ready", "GPU memory free after the oom revert",
    "GPU memory free after the assert revert", "GPU memory free after the hang revert",
    "nothing left holding the card",
]


def test_the_whole_check_on_the_standin_gpu(fake_host: FakeHost, tmp_path: Path, wheels: Path) -> None:
    fake_host.set_gpus(2, name="NVIDIA H100 80GB HBM3", memory_total=81559)
    # Another tenant on GPU 1: the check picks GPU 0 (the most free memory) and, with
    # CUDA_VISIBLE_DEVICES=0, neither rewheel nor the smoke test look at GPU 1.
    tenant = fake_host.spawn([sys.executable, "-c", "import time; time.sleep(600)"])
    fake_host.hold_gpu(tenant.pid, gpu_index=1, used_memory=30000)
    work, report = tmp_path / "work", tmp_path / "report"
    cp = gpu_check("--standin", "--wheels", str(wheels), "--work", str(work), "--report", str(report), "--json",
                   tmp=tmp_path)
    doc = json.loads(cp.stdout)
    rows = {r["check"]: r for r in doc["rows"]}
    failed = [r for r in doc["rows"] if r["ok"] is False]
    assert cp.returncode == 0 and not failed and doc["exit_code"] == 0, (failed, cp.stderr[-3000:])
    assert [name for name in EXPECTED_ROWS if name not in rows] == []
    assert doc["mode"] == "standin" and "STAND-IN: no GPU was used" in cp.stderr
    assert doc["facts"]["gpu"]["index"] == 0
    # rewheel and uv came from the wheels folder, with no index.
    assert rows["rewheel and uv"]["detail"].startswith("rewheel 0.1.0; installed offline from rewheel-0.1.0-")
    assert (work / "tools" / "bin" / "rewheel").exists()
    # The refusals name what reality offered.
    holder = rows["a process holding 2048 MiB, seen through gpu.py"]["detail"].split()[1]
    assert f"pid {holder} " in rows["refused: the GPU held by another process"]["detail"]
    assert "smoke.gpu_free_mib = 83607" in rows["refused: too little free memory (gpu_free_mib = 83607)"]["detail"]
    # The smoke ran with the GPU rewheel counted, and rewheel's timeout.
    assert "CUDA_VISIBLE_DEVICES='0', 1 device(s), device 0 = GPU-00000000-" in \
        rows["CUDA_VISIBLE_DEVICES as rewheel passes it"]["detail"]
    assert "(timeout 600s" in rows["the timeout as rewheel sets it"]["detail"]
    # Each failing build was reverted byte for byte and named by its CUDA error.
    for build, error in (("oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"),
                         ("assert", "torch.AcceleratorError: CUDA error: device-side assert triggered")):
        assert "before and after: identical" in rows[f"{build}: restored byte for byte"]["detail"]
        assert rows[f"{build}: rewheel why names the CUDA error"]["detail"].startswith(error)
    hang = next(r for r in doc["rows"] if r["check"].startswith("hang: killed at rewheel's timeout"))
    assert hang["ok"] and "timed out after" in hang["detail"]
    # What stayed: the kept upgrade (1.1.0), nothing of the failing builds.
    site = next((work / "env" / "lib").glob("python3*/site-packages"))
    assert sorted(p.name for p in site.glob("gpucheck_knob-*.dist-info")) == ["gpucheck_knob-1.1.0.dist-info"]
    # The report folder holds the table, the JSON and every log, the smoke's included.
    assert (report / "table.txt").read_text().splitlines()[-1] == "result: everything held (exit 0)"
    assert json.loads((report / "report.json").read_text())["exit_code"] == 0
    smoke_logs = list((report / "home").rglob("runs/*/smoke.log"))
    assert len(smoke_logs) == 4 and any("torch.OutOfMemoryError" in p.read_text() for p in smoke_logs)
    assert tenant.poll() is None  # the check ends only its own processes
