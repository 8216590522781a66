"""The demo's parts: the toy vllm (its two builds, its server, its failure on rank 4), the real
`rewheel.smoke.vllm_init` module run against it, the demo stage, and the shipped recipes.

The toy builds are installed into real uv virtualenvs and run as real processes (an engine
core and 8 worker processes); the smoke module runs under the toy environment's interpreter
with only rewheel's `src` on PYTHONPATH, as on a GPU host.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tempfile
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from support_env import uv
from devtools.demo import stage as st
from devtools.demo import toyvllm as toy
from rewheel.smoke.vllm_init import find_config_file, shrink_overrides

SRC = Path(__file__).resolve().parents[1] / "src"
REPO = SRC.parent


# --- fixtures: the toy index and one environment per build, shared by this module ----------

@pytest.fixture(scope="module")
def toy_world(tmp_path_factory: pytest.TempPathFactory, uv_cache: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("toyworld")
    idx = st.build_index(root / "index")
    env = {**os.environ, "UV_CACHE_DIR": str(uv_cache), "UV_NO_PROGRESS": "1"}
    envs: dict[str, Path] = {}
    for name, version, sha in (("good", toy.GOOD_VERSION, idx.good_sub), ("bad", toy.BAD_VERSION, idx.bad_sub)):
        prefix = root / name
        uv("venv", "-q", "--python", sys.executable, str(prefix), env=env)
        uv("pip", "install", "-q", "--python", str(prefix / "bin" / "python"), "--no-index",
           "--find-links", str(idx.root / sha), "--find-links", str(idx.root), f"vllm=={version}", env=env)
        envs[name] = prefix / "bin" / "python"
    toy.write_hf_cache(root / "hf")
    return {"root": root, "index": idx.root, "hf": root / "hf", **envs}


def target_env(world: dict[str, Path], **extra: str) -> dict[str, str]:
    """The environment a smoke command gets on a host: rewheel's src on PYTHONPATH, the
    model's config in the HF cache, nothing else of the dev environment's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "VIRTUAL_ENV", "HF_"))}
    env.update({"PYTHONPATH": str(SRC), "HF_HOME": str(world["hf"]), "HF_HUB_OFFLINE": "1",
                "PYTHONUNBUFFERED": "1"}, **extra)
    return env


def run_smoke(python: Path, world: dict[str, Path], *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-m", "rewheel.smoke.vllm_init", *args], capture_output=True,
                          text=True, timeout=timeout, env=target_env(world), cwd=world["root"])


# --- the toy package itself ----------------------------------------------------------------

def test_builds_differ_in_several_files_one_added_one_removed() -> None:
    good = toy.toy_vllm_files(toy.GOOD_VERSION, bad=False)
    bad = toy.toy_vllm_files(toy.BAD_VERSION, bad=True)
    added = set(bad) - set(good)
    removed = set(good) - set(bad)
    changed = {p for p in set(good) & set(bad) if good[p] != bad[p]}
    assert "vllm/model_executor/layers/attention/head_layout.py" in added
    assert "vllm/attention/backends/mla/flashmla_legacy.py" in removed
    assert {"vllm/model_executor/models/deepseek_v2.py", "vllm/version.py", "vllm/envs.py"} <= changed
    assert len(changed) >= 5
    # The story's line: the decoder layer builds its attention through attn_cls.
    assert "self.self_attn = attn_cls(" in good["vllm/model_executor/models/deepseek_v2.py"]
    assert toy.GOOD_VERSION in good["vllm/version.py"] and toy.BAD_VERSION in bad["vllm/version.py"]
    for files in (good, bad):  # every generated module is valid Python
        for path, text in files.items():
            if path.endswith(".py"):
                compile(text, path, "exec")


def test_versions_are_the_storys_nightlies() -> None:
    from packaging.version import Version

    good, bad = Version(toy.GOOD_VERSION), Version(toy.BAD_VERSION)
    assert bad > good and bad.dev - good.dev == 31
    assert good.local == f"g{toy.GOOD_SHA}" and bad.local == f"g{toy.BAD_SHA}"
    assert toy.short_sha(toy.BAD_VERSION) == "5719a4e4e"


def test_index_layout_mirrors_per_commit_nightlies(tmp_path: Path) -> None:
    idx = st.build_index(tmp_path / "index")
    assert [p.name for p in (idx.root / idx.good_sub).glob("*.whl")] == [f"vllm-{toy.GOOD_VERSION}-py3-none-any.whl"]
    assert [p.name for p in (idx.root / idx.bad_sub).glob("*.whl")] == [f"vllm-{toy.BAD_VERSION}-py3-none-any.whl"]
    assert sorted(p.name for p in idx.root.glob("*.whl")) == [
        "flashinfer_python-0.6.3-py3-none-any.whl", "flashinfer_python-0.6.4-py3-none-any.whl"]
    assert idx.prefix_paths == {"nightly": toy.BAD_SHA}


def test_index_serves_nightly_to_uv(tmp_path: Path, uv_cache: Path) -> None:
    """Through the real local index, the nightly resolves to dev344 and its pinned flashinfer."""
    from devtools.localindex import serve_index

    idx = st.build_index(tmp_path / "index")
    req = tmp_path / "requirements.in"
    req.write_text("vllm\n")
    with serve_index(idx.root, prefix_paths=idx.prefix_paths) as server:
        cp = uv("pip", "compile", "-q", "--no-header", "--prerelease", "allow", "--index-url", server.url,
                "--extra-index-url", server.sub_url("nightly"), str(req), "--python", sys.executable,
                env={"UV_CACHE_DIR": str(uv_cache), "UV_NO_CONFIG": "1"})
    pins = [line.strip() for line in cp.stdout.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert f"vllm=={toy.BAD_VERSION}" in pins
    assert f"flashinfer-python=={toy.FLASHINFER_BAD}" in pins


# --- vllm_init: shrinking ----------------------------------------------------------------------

def test_shrink_deepseek_multimodal_keeps_a_dense_and_a_moe_layer() -> None:
    cfg = toy.toy_model_config()
    assert shrink_overrides(cfg, 8) == {"text_config": {
        "num_hidden_layers": 2, "first_k_dense_replace": 1, "n_routed_experts": 8}}


def test_shrink_grouped_topk_keeps_whole_groups() -> None:
    # DeepSeek-V3: 256 experts in 8 groups, top-8 from 4 groups.
    cfg = {"num_hidden_layers": 61, "first_k_dense_replace": 3, "n_routed_experts": 256,
           "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4}
    out = shrink_overrides(cfg, 8)
    assert out["n_routed_experts"] % 8 == 0 and out["n_routed_experts"] >= 8
    assert out["num_experts_per_tok"] <= (out["n_routed_experts"] // 8) * 4
    assert out["num_hidden_layers"] == 2 and out["first_k_dense_replace"] == 1


@pytest.mark.parametrize(("cfg", "expected"), [
    ({"num_hidden_layers": 32, "num_local_experts": 8, "num_experts_per_tok": 2}, {"num_hidden_layers": 1}),
    ({"num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8},
     {"num_hidden_layers": 1, "num_experts": 16}),
    ({"num_hidden_layers": 80, "hidden_size": 8192}, {"num_hidden_layers": 1}),
    ({"num_hidden_layers": 1}, {}),
])
def test_shrink_other_families(cfg: dict, expected: dict) -> None:
    assert shrink_overrides(cfg, 16 if "num_experts" in cfg else 8) == expected


def test_find_config_in_hf_cache_and_local_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = Path(toy.write_hf_cache(tmp_path / "hf"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    assert find_config_file(toy.TOY_MODEL) == snap / "config.json"
    assert find_config_file("nobody/nothing") is None
    assert find_config_file(str(snap)) == snap / "config.json"


# --- vllm_init against the toy vllm (real processes) --------------------------------------------

def test_vllm_init_passes_on_good_build_and_prints_timings(toy_world: dict[str, Path]) -> None:
    cp = run_smoke(toy_world["good"], toy_world, "--model", toy.TOY_MODEL, "--tensor-parallel-size", "8",
                   "--generate")
    out = cp.stdout + cp.stderr
    assert cp.returncode == 0, out
    assert f"vllm {toy.GOOD_VERSION}" in out
    assert '"n_routed_experts": 8' in out and '"num_hidden_layers": 2' in out
    # All 8 ranks came up, and the shrunken model has one dense and one MoE layer.
    for rank in range(8):
        assert f"(Worker_TP{rank} pid=" in out
    assert "2 decoder layers (1 dense, 1 MoE)" in out
    timings = json.loads(out.split("vllm_init: timings ", 1)[1].splitlines()[0])
    assert set(timings) == {"import_s", "init_s", "generate_s", "total_s"}
    assert "generated 1 token" in out


def test_vllm_init_fails_on_bad_build_with_rank4_traceback(toy_world: dict[str, Path]) -> None:
    cp = run_smoke(toy_world["bad"], toy_world, "--model", toy.TOY_MODEL, "--tensor-parallel-size", "8")
    out = cp.stdout + cp.stderr
    assert cp.returncode == 1, out
    lines = out.splitlines()
    tb = [ln for ln in lines if ln.startswith("(Worker_TP4 pid=") and " ERROR " in ln]
    assert any("WorkerProc failed to start." in ln for ln in tb)
    assert any("deepseek_v2.py" in ln and "in __init__" in ln for ln in tb)
    assert any("self.self_attn = attn_cls(" in ln for ln in tb)
    assert any("RuntimeError: cannot reshape tensor of 1536 elements into shape [-1, 0, 192]" in ln for ln in tb)
    # Every traceback line carries its own vLLM log header.
    assert all("[multiproc_executor.py:" in ln for ln in tb)
    # Only rank 4 fails; the others are terminated: the cascade real vLLM prints.
    assert sum("WorkerProc failed to start." in ln for ln in lines) == 1
    assert sum("WorkerProc was terminated" in ln for ln in lines) >= 1
    assert any(ln.startswith("(EngineCore_DP0 pid=") and "EngineCore failed to start." in ln for ln in lines)
    assert "Engine core initialization failed. See root cause above." in out
    assert "vllm_init: FAILED during engine init" in out
    assert "vllm_init: timings " in out


def test_bad_build_failing_rank_depends_on_tp_size(toy_world: dict[str, Path]) -> None:
    """With 4 ranks the bad build's off-by-one hits rank 2 instead: the failing rank is data."""
    cp = run_smoke(toy_world["bad"], toy_world, "--model", toy.TOY_MODEL, "-tp", "4")
    out = cp.stdout + cp.stderr
    assert cp.returncode == 1
    assert "(Worker_TP2 pid=" in out and "Worker_TP4" not in out


def test_vllm_init_explicit_overrides_and_llm_kwargs(toy_world: dict[str, Path]) -> None:
    cp = run_smoke(toy_world["good"], toy_world, "--model", toy.TOY_MODEL, "-tp", "2",
                   "--hf-overrides", '{"text_config": {"num_hidden_layers": 3, "first_k_dense_replace": 3}}',
                   "--llm-kwargs", '{"seed": 7}')
    out = cp.stdout + cp.stderr
    assert cp.returncode == 0, out
    assert "3 decoder layers (3 dense, 0 MoE)" in out
    assert "seed=7" in out


@pytest.mark.parametrize("args", [["--hf-overrides", "{not json"], ["--llm-kwargs", "[1]"],
                                  ["--tensor-parallel-size", "0"]])
def test_vllm_init_bad_arguments_exit_2(toy_world: dict[str, Path], args: list[str]) -> None:
    cp = run_smoke(toy_world["good"], toy_world, "--model", toy.TOY_MODEL, *args)
    assert cp.returncode == 2
    assert "error:" in cp.stderr


def test_vllm_init_unknown_llm_argument_is_a_failure_not_a_crash(toy_world: dict[str, Path]) -> None:
    cp = run_smoke(toy_world["good"], toy_world, "--model", toy.TOY_MODEL, "--llm-kwargs", '{"no_such_arg": 1}')
    assert cp.returncode == 1
    assert "FAILED during engine init" in cp.stderr and "no_such_arg" in cp.stderr


def test_vllm_init_without_vllm_fails_clearly(toy_world: dict[str, Path], tmp_path: Path, uv_cache: Path) -> None:
    prefix = tmp_path / "empty"
    uv("venv", "-q", "--python", sys.executable, str(prefix), env={"UV_CACHE_DIR": str(uv_cache)})
    cp = run_smoke(prefix / "bin" / "python", toy_world, "--model", toy.TOY_MODEL)
    assert cp.returncode == 1
    assert "FAILED during import vllm" in cp.stderr and "ModuleNotFoundError" in cp.stderr


def test_vllm_init_imports_only_the_stdlib(toy_world: dict[str, Path]) -> None:
    """It runs under the target's interpreter, where neither rewheel's dependencies nor vllm
    may be importable at module import time (the toy env has no `packaging`)."""
    code = ("import sys; import rewheel.smoke.vllm_init as m; "
            "bad = sorted(n for n in sys.modules if n.split('.')[0] in "
            "('packaging', 'httpx', 'typer', 'rich', 'vllm')); print(bad)")
    cp = subprocess.run([str(toy_world["good"]), "-c", code], capture_output=True, text=True,
                        env=target_env(toy_world), timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == "[]"


def test_diagnosis_finds_rank4_in_the_smoke_log(toy_world: dict[str, Path], tmp_path: Path) -> None:
    from rewheel import diagnose

    cp = run_smoke(toy_world["bad"], toy_world, "--model", toy.TOY_MODEL, "-tp", "8")
    log = tmp_path / "smoke.log"
    log.write_text(cp.stdout + cp.stderr)
    rc = diagnose.analyse_file(log, package="vllm").to_json()["root_cause"]
    assert rc is not None
    assert "Worker_TP4" in json.dumps(rc)
    assert rc["type"] == "RuntimeError" and "cannot reshape" in rc["message"]
    assert rc["frame"]["file"].endswith("deepseek_v2.py")


# --- the toy service, under rewheel's command manager --------------------------------------------

def _serve_argv(python: Path, port: int) -> list[str]:
    return [str(python), "-m", "vllm.entrypoints.cli.main", "serve", toy.TOY_MODEL,
            "--tensor-parallel-size", "8", "--host", "127.0.0.1", "--port", str(port)]


def test_toy_service_health_models_and_clean_stop(toy_world: dict[str, Path], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from rewheel.recipe import Probe, ServiceSpec
    from rewheel.service import CommandManager, wait_ready

    for k, v in target_env(toy_world).items():
        monkeypatch.setenv(k, v)
    port = st.free_port()
    mgr = CommandManager(_serve_argv(toy_world["good"], port), (), tmp_path / "svc")
    spec = ServiceSpec(manager="command", start=tuple(mgr.start_argv), health_url=f"http://127.0.0.1:{port}/health",
                       ready_timeout_s=60, settle_s=0.5,
                       probe=Probe(f"http://127.0.0.1:{port}/v1/models", toy.TOY_MODEL))
    t0 = time.time()
    mgr.start()
    try:
        health = wait_ready(mgr, spec, started_at=t0)
        assert health.ok
        status = mgr.status()
        assert status.active and len(status.pids) == 10  # API server, engine core, 8 workers
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
        assert models["data"][0]["id"] == toy.TOY_MODEL
        assert httpx.get(f"http://127.0.0.1:{port}/version", timeout=5).json()["version"] == toy.GOOD_VERSION
    finally:
        mgr.stop(30)
    assert mgr.status().pids == []
    log = (tmp_path / "svc" / "service.log").read_text()
    assert "(APIServer pid=" in log and "(Worker_TP7 pid=" in log


def test_toy_service_on_bad_build_dies_before_listening(toy_world: dict[str, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from rewheel.recipe import ServiceSpec
    from rewheel.service import CommandManager, HealthCheckFailed, wait_ready

    for k, v in target_env(toy_world).items():
        monkeypatch.setenv(k, v)
    port = st.free_port()
    mgr = CommandManager(_serve_argv(toy_world["bad"], port), (), tmp_path / "svc")
    spec = ServiceSpec(manager="command", start=tuple(mgr.start_argv),
                       health_url=f"http://127.0.0.1:{port}/health", ready_timeout_s=60, settle_s=0.5)
    t0 = time.time()
    mgr.start()
    try:
        with pytest.raises(HealthCheckFailed, match="died"):
            wait_ready(mgr, spec, started_at=t0)
    finally:
        mgr.stop(30)
    log = "\n".join(mgr.log_lines(t0))
    assert "(Worker_TP4 pid=" in log and "RuntimeError: cannot reshape" in log
    assert "(APIServer pid=" in log and "Engine core initialization failed" in log


# --- the stage and the recipes ------------------------------------------------------------------

def test_local_patch_and_dumps(toy_world: dict[str, Path], tmp_path: Path, uv_cache: Path) -> None:
    prefix = tmp_path / "env"
    env = {"UV_CACHE_DIR": str(uv_cache)}
    uv("venv", "-q", "--python", sys.executable, str(prefix), env=env)
    uv("pip", "install", "-q", "--python", str(prefix / "bin" / "python"), "--no-index", "--find-links",
       str(toy_world["index"] / toy.GOOD_SHA), "--find-links", str(toy_world["index"]), "vllm", env=env)
    patched = st.apply_local_patch(prefix / "bin" / "python")
    assert all(st.LOCAL_PATCH_MARKER in p.read_text() for p in patched)
    compile(patched[0].read_text(), str(patched[0]), "exec")
    dumps = st.make_debug_dumps(tmp_path)
    assert len(dumps) == st.N_DUMPS and all(p.parent == tmp_path / "tmp" for p in dumps)
    # The patched build still serves: the patch is a debugging aid, not a breakage.
    cp = subprocess.run([str(prefix / "bin" / "python"), "-m", "rewheel.smoke.vllm_init", "--model",
                         toy.TOY_MODEL, "-tp", "8"], capture_output=True, text=True, timeout=90,
                        env=target_env(toy_world), cwd=tmp_path)
    assert cp.returncode == 0, cp.stdout + cp.stderr


def test_demo_recipe_template_fills_and_validates(tmp_path: Path) -> None:
    from rewheel.recipe import load_recipe

    recipe_path = st.write_recipe(tmp_path, index_base="http://127.0.0.1:4321", port=8123)
    r = load_recipe(recipe_path, check_interpreter=False)
    assert r.python == tmp_path.resolve() / "env" / "bin" / "python"
    assert r.install.index_url == "http://127.0.0.1:4321/simple"
    assert r.install.extra_index_urls == ("http://127.0.0.1:4321/nightly",)
    assert r.service is not None and r.service.manager == "command"
    assert r.service.health_url == "http://127.0.0.1:8123/health"
    assert "8123" in r.service.start
    assert r.smoke is not None and list(r.smoke.command[:3]) == ["{python}", "-m", "rewheel.smoke.vllm_init"]
    assert r.cleanup_paths == (str(tmp_path.resolve() / "tmp" / "*.pt"),)


@pytest.mark.parametrize("name", ["vllm-kimi-k25.toml", "vllm-nightly-ci.toml"])
def test_real_recipes_validate(name: str) -> None:
    from rewheel.recipe import load_recipe

    r = load_recipe(REPO / "recipes" / name, check_interpreter=False)
    assert r.smoke is not None and r.smoke.gpus == 8
    assert "rewheel.smoke.vllm_init" in r.smoke.command
    assert r.install.prerelease and "--torch-backend=auto" in r.install.uv_args
    if name == "vllm-kimi-k25.toml":
        assert r.service is not None and r.service.unit == "vllm-kimi-k25"
        assert str(r.python) == "/root/ml-env/bin/python" and r.install.reinstall == "all"


def test_demo_env_keeps_everything_in_the_stage(tmp_path: Path) -> None:
    env = st.demo_env(tmp_path, {"PATH": "/usr/bin", "UV_INDEX_URL": "http://elsewhere/simple",
                                 "PIP_INDEX_URL": "x", "HF_TOKEN": "secret", "HOME": "/root"})
    for key in ("REWHEEL_HOME", "UV_CACHE_DIR", "HF_HOME", "TMPDIR"):
        assert env[key].startswith(str(tmp_path))
    assert "UV_INDEX_URL" not in env and "PIP_INDEX_URL" not in env and "HF_TOKEN" not in env


# --- after the demo: the README's "look around" commands work as written ---------------------

def readme_look_around() -> list[str]:
    """The `$ .demo/rewheel ...` lines of the README's demo section."""
    text = (REPO / "README.md").read_text()
    return [line[2:] for line in text.splitlines() if line.startswith("$ .demo/rewheel ")]


@dataclass
class DemoRun:
    folder: Path  # where the demo ran, as `make demo` runs in the repository
    stage: Path  # its `.demo`
    output: str  # what it printed (on the terminal: the lines as tmux joins them)
    screen: str | None  # the 80×40 terminal's capture, lines as wrapped (None without tmux)


@pytest.fixture(scope="module")
def demo_run() -> Iterator[DemoRun]:
    """The whole demo, once for this module: `make demo` on a real 80×40 terminal (tmux) where
    there is one, else with its output into a pipe; in a folder named `.demo` under a short
    scratch folder (the store names the environment's folder after its path, and a path longer
    than the terminal can only overflow it). Its stage stays for the tests; its service is
    stopped and the folder removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="rwdemo-"))
    stage = folder / ".demo"
    # The stage's path goes to the demo through the environment, never on a command line:
    # the demo ends every process whose command line names it (tmux's server included).
    env = {k: v for k, v in os.environ.items() if k not in ("REWHEEL_HOME", "COLUMNS", "LINES")}
    env.update(REWHEEL_DEMO_DIR=str(stage), PYTHONPATH=str(REPO), TERM="xterm-256color")
    try:
        if shutil.which("tmux") is None:
            demo = subprocess.run([sys.executable, "-m", "devtools.demo"], cwd=folder, capture_output=True,
                                  text=True, timeout=600, env=env)
            assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
            yield DemoRun(folder, stage, demo.stdout, None)
        else:
            screen, joined = _demo_in_tmux(folder, env)
            yield DemoRun(folder, stage, joined, screen)
    finally:
        subprocess.run([str(stage / "rewheel"), "--stop-service"], capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def _demo_in_tmux(folder: Path, env: dict[str, str]) -> tuple[str, str]:
    """The demo's screen on an 80×40 tmux, once it has ended: as wrapped, and joined."""
    sock = f"rewheel-demo-test-{os.getpid()}"
    conf = folder / "tmux.conf"
    conf.write_text("set -g history-limit 100000\n")
    tmux = ["tmux", "-L", sock, "-f", str(conf)]
    subprocess.run([*tmux, "new-session", "-d", "-x", "80", "-y", "40",
                    f"{shlex.quote(sys.executable)} -m devtools.demo; echo DEMO-EXIT $?; sleep 600"],
                   cwd=folder, env=env, check=True, timeout=30)
    try:
        deadline = time.monotonic() + 400
        screen = ""
        while time.monotonic() < deadline:
            screen = subprocess.run([*tmux, "capture-pane", "-p", "-S", "-", "-E", "-"], capture_output=True,
                                    text=True, timeout=30).stdout
            if "DEMO-EXIT" in screen:
                break
            time.sleep(1)
        joined = subprocess.run([*tmux, "capture-pane", "-p", "-J", "-S", "-", "-E", "-"], capture_output=True,
                                text=True, timeout=30).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=30)
    assert "DEMO-EXIT 0" in screen, screen[-4000:]
    return screen, joined


def test_readme_look_around_commands_work_after_the_demo(demo_run: DemoRun) -> None:
    """After the whole demo, each of the README's look-around commands typed in the folder it
    ran in, through a shell: each exits 0 and says what the README promises; no process of
    the demo is left afterwards."""
    from devtools.demo.__main__ import _stage_processes

    commands = readme_look_around()
    assert [c.split()[1] for c in commands] == ["history", "diff", "why", "check", "status"]
    # The demo prints the same commands at its end.
    printed = [line.strip()[2:] for line in demo_run.output.splitlines() if line.strip().startswith("$ .demo/rewheel ")]
    assert printed[-5:] == commands, demo_run.output[-2000:]
    env = {k: v for k, v in os.environ.items() if k not in ("REWHEEL_DEMO_DIR", "REWHEEL_HOME")}
    out = {}
    for cmd in commands:
        cp = subprocess.run(cmd, shell=True, cwd=demo_run.folder, capture_output=True, text=True, timeout=300,
                            env=env)
        assert cp.returncode == 0, f"{cmd}\n{cp.stdout}\n{cp.stderr}"
        out[cmd.split()[1]] = cp.stdout + cp.stderr
    assert toy.GOOD_VERSION in out["history"] and "reverted" in out["history"]
    # The live environment against the pre-upgrade snapshot, not the failed build.
    assert "no package versions changed" in out["diff"] and "downgraded" not in out["diff"]
    assert "Worker_TP4" in out["why"] and "deepseek_v2.py" in out["why"]
    assert "recipe is ready" in out["check"] and "FAIL" not in out["check"]
    assert "reverted" in out["status"] and toy.GOOD_VERSION in out["status"]
    # After a second run there are two smoke logs: `why` is still given one, the newest. (An
    # older run's log, with another crash, beside the demo's; removed afterwards.)
    log = max(demo_run.stage.glob("home/envs/*/runs/*/smoke.log"), key=lambda p: p.stat().st_mtime)
    older = log.parent.parent / "00000000-older" / "smoke.log"
    older.parent.mkdir()
    try:
        older.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                         "ValueError: an older run's crash\n")
        os.utime(older, (log.stat().st_mtime - 3600,) * 2)
        why = next(c for c in commands if c.split()[1] == "why")
        cp = subprocess.run(why, shell=True, cwd=demo_run.folder, capture_output=True, text=True, timeout=300,
                            env=env)
        assert cp.returncode == 0 and "Worker_TP4" in cp.stdout and "an older run's crash" not in cp.stdout, cp.stdout + cp.stderr
    finally:
        shutil.rmtree(older.parent)
    # A usage error through the wrapper names the program a person types, not `python -m rewheel`.
    cp = subprocess.run([str(demo_run.stage / "rewheel"), "why", "--no-such-option"], cwd=demo_run.folder,
                        capture_output=True, text=True, timeout=300, env=env)
    assert cp.returncode == 2 and cp.stderr.startswith("Usage: rewheel why "), cp.stderr
    # The index the look-around served is gone, and the service stayed stopped.
    assert _stage_processes(demo_run.stage) == []


def test_the_demo_on_an_80_by_40_terminal_keeps_every_line_and_word_whole(demo_run: DemoRun) -> None:
    """`make demo` on a real 80×40 terminal (tmux): no line is wider than the terminal (tmux
    wrapped none: its joined capture equals the screen), the words and paths the story turns
    on appear whole, and every path shown on the screen is a whole one that exists."""
    if demo_run.screen is None:
        pytest.skip("needs tmux")
    check_demo_screen(demo_run.screen, demo_run.output, demo_run.folder, demo_run.stage)


def check_demo_screen(screen: str, joined: str, tmp_path: Path, stage: Path) -> None:
    assert "DEMO-EXIT 0" in screen, screen[-4000:]
    lines = [line.rstrip() for line in screen.splitlines()]
    assert lines == [line.rstrip() for line in joined.splitlines()], "a line was wider than the terminal"
    assert max(len(line) for line in lines) <= 80
    for word in ("vllm/model_executor/models/deepseek_v2.py", "Worker_TP4", toy.GOOD_VERSION, toy.BAD_VERSION,
                 "https://github.com/vllm-project/vllm/compare/", "prepared/pylock.toml",
                 "The story played out as designed"):
        assert word in screen, f"{word!r} is not whole on the screen:\n{screen}"
    for token in re.findall(r"(?<![\w:/.*])(?:/|home/|\.demo/)[\w./@+*-]*", screen):
        token = token.rstrip(".")
        if "*" in token:
            assert list(stage.glob(token.removeprefix(".demo/"))), token  # a glob the demo prints
            continue
        if "/prepared" in token or token.startswith("/v1") or token in ("/", "/health", "/version"):
            continue  # a run's staging folders, gone once it ends; the toy server's URLs
        assert any(Path(base, token).exists() for base in (tmp_path, stage)), f"{token!r} is not a whole path:\n{screen}"


def test_the_demos_board_in_a_real_browser(demo_run: DemoRun, tmp_path: Path) -> None:
    """`make demo` ends by printing its board's path; every page of that board loads in a real
    headless Chromium with no console error and no failed request, no page is wider than the
    window at 1280×800 or at a 390-pixel phone width, every link between pages resolves, and
    the run's page shows the upgrade, the revert and its root cause."""
    from support_browser import DESKTOP, PHONE, broken_links, visit

    board = demo_run.stage / "board"
    lines = [line.strip() for line in demo_run.output.splitlines()]
    said = next(i for i, line in enumerate(lines) if line.startswith("The board, a static site"))
    assert lines[said + 1] == ".demo/board/index.html"  # what the demo prints last
    pages = sorted(p.name for p in board.glob("*.html"))
    assert {"index.html", "nightlies.html"} <= set(pages) and any(p.startswith("run-") for p in pages)
    shots = Path(os.environ.get("REWHEEL_BOARD_SHOTS") or tmp_path / "shots")
    visits = visit(board, shots=shots)
    assert len(visits) == 2 * len(pages) and {v.size for v in visits} == {DESKTOP, PHONE}
    for v in visits:
        assert v.console_errors == [] and v.failed_requests == [], (v.name, v.size, v.console_errors, v.failed_requests)
        assert not v.overflows, f"{v.name} at {v.size}: body {v.scroll_width}px in a {v.client_width}px window"
    assert broken_links(board, visits) == []
    (run_page,) = [p for p in pages if p.startswith("run-")]
    html = (board / run_page).read_text()
    for word in (toy.GOOD_VERSION, toy.BAD_VERSION, "reverted", "Worker_TP4", "deepseek_v2.py", "cannot reshape",
                 "head_layout.py", 'class="mark"'):
        assert word in html, word
    assert run_page in (board / "index.html").read_text()  # the front page links the revert
