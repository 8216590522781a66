"""Downtime: the same upgrade run staged and unstaged, side by side in one run.

Each run is the `rewheel run RECIPE --yes --json` command, as users run it, on an environment
reset to the old release, with a service up (devtools/bench/serve.py: a small HTTP process that
imports the upgraded package before it answers, as `vllm serve` does) and a CPU smoke test that
imports it too. What is compared is the run's own downtime record: from the moment the stop
began to the first healthy answer of the new build.

  unstaged  `[install] staged = false`: stop, snapshot, download and unpack, smoke, start
  staged    the default: prepared and pre-checked while the service serves, then stop,
            snapshot, install offline from uv's cache, smoke, start

"Cold" is a uv cache that does not hold the new release's wheels, as on a host after a nightly:
  synthetic  wheels built once under `.bench/downtime/wheels` and served by the loopback index
             (devtools.localindex); every run starts from an empty cache, so the unstaged run
             downloads and unpacks the new wheels while the service is down and the staged run
             while it serves.
  real       (`BENCH_REAL=1`) the old release comes from the real bench's warm cache
             (`.bench/real/uv-cache`, read only: hard links into a scratch environment); the
             unstaged run starts from an empty private cache and downloads the new release's
             changed wheels from the index (the only download: once a repetition, the changed
             distributions only, since `reinstall = "named"` leaves the rest in place); the
             staged run prepares from the warm cache — which does not change its downtime, as
             its swap installs offline from whatever the prepare left in the cache.

Target: staged downtime ≤ its own smoke test + the service's start (to its first healthy
answer) + 10 s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.bench.harness import BenchConfig, Row, _median, rm_tree
from rewheel.errors import RewheelError
from rewheel.installer import find_uv as uv_bin

SERVE = Path(__file__).with_name("serve.py")
SLACK_S = 10.0  # the target's allowance over smoke + start


@dataclass
class Stage:
    """What the downtime runs upgrade, and how each run starts over."""

    root: Path
    python: Path
    packages: list[str]
    modules: list[str]  # imported by the service at start and by the smoke test
    index_url: str | None  # None: uv's default index
    uv_args: list[str]  # the recipe's [install] uv_args (the real bench's BENCH_REAL_UV_ARGS)
    reset: Callable[[], None]  # the environment back to the old release
    cache: Callable[[str], Path]  # UV_CACHE_DIR for a run ("staged" | "unstaged"), made cold where it must be
    description: str


def _uv(*args: str, env: dict[str, str]) -> None:
    cp = subprocess.run([uv_bin(), *args], env=env, capture_output=True, text=True)
    if cp.returncode != 0:
        raise RewheelError(f"`uv {' '.join(args[:4])} ...` failed (exit {cp.returncode}): "
                           f"{(cp.stderr or cp.stdout).strip()[-1500:]}")


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("VIRTUAL_ENV", "UV_LINK_MODE", "UV_OFFLINE", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL")}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _recipe(stage: Stage, path: Path, port: int, staged: bool) -> None:
    import tomli_w

    doc: dict[str, Any] = {
        "name": "bench-downtime",
        "environment": {"python": str(stage.python)},
        "service": {"manager": "command",
                    "start": ["{python}", str(SERVE), "--port", str(port),
                              *[a for m in stage.modules for a in ("--import", m)]],
                    "health_url": f"http://127.0.0.1:{port}/health", "ready_timeout_s": 900,
                    "stop_timeout_s": 60, "settle_s": 1.0},
        "install": {"packages": stage.packages, "reinstall": "named", "staged": staged, "uv_args": stage.uv_args},
        "smoke": {"command": ["{python}", "-c", "; ".join(f"import {m}" for m in stage.modules)],
                  "timeout_s": 1200},
    }
    if stage.index_url:
        doc["install"]["index_url"] = stage.index_url
    path.write_text(tomli_w.dumps(doc))


def _one_run(cfg: BenchConfig, stage: Stage, staged: bool) -> dict[str, Any]:
    """Reset, start the service, `rewheel run`, stop the service: the run's report."""
    from rewheel.recipe import load_recipe
    from rewheel.commands import open_target
    from rewheel.service import make_manager, wait_ready

    mode = "staged" if staged else "unstaged"
    stage.reset()
    home = stage.root / f"home-{mode}"
    rm_tree(home)
    home.mkdir(parents=True, mode=0o700)
    recipe = stage.root / f"{mode}.toml"
    _recipe(stage, recipe, _free_port(), staged)
    saved = os.environ.get("REWHEEL_HOME")
    os.environ["REWHEEL_HOME"] = str(home)
    try:
        t = open_target(load_recipe(recipe))
        assert t.recipe.service is not None
        mgr = make_manager(t.recipe.service, t.store.env_dir, python=t.recipe.python)
        started = time.time()
        mgr.start()
        wait_ready(mgr, t.recipe.service, started_at=started)
        env = {**_base_env(), "REWHEEL_HOME": str(home), "UV_CACHE_DIR": str(stage.cache(mode)),
               "UV_NO_PROGRESS": "1"}
        cfg.say(f"  {mode}: rewheel run (service up, cache {env['UV_CACHE_DIR']})")
        t0 = time.perf_counter()
        cp = subprocess.run([sys.executable, "-m", "rewheel", "run", str(recipe), "--yes", "--json", "--quiet"],
                            env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        try:
            mgr.stop(60)
        except RewheelError as exc:
            cfg.say(f"  stopping the service: {exc}")
    finally:
        if saved is None:
            os.environ.pop("REWHEEL_HOME", None)
        else:
            os.environ["REWHEEL_HOME"] = saved
    try:
        rep = json.loads(cp.stdout)
    except ValueError:
        raise RewheelError(f"`rewheel run` ({mode}) printed no JSON (exit {cp.returncode}): "
                           f"{cp.stderr.strip()[-1500:]}") from None
    if rep.get("status") != "upgraded" or not rep.get("downtime"):
        raise RewheelError(f"`rewheel run` ({mode}) ended {rep.get('status')!r} (exit {cp.returncode}): "
                           f"{rep.get('message') or rep.get('failure')}")
    down = rep["downtime"]
    cfg.say(f"  {mode}: downtime {down['seconds']:.2f}s {down['parts']}; whole run {wall:.1f}s")
    return {"downtime": down, "wall_s": round(wall, 3), "steps": rep.get("steps")}


def bench_downtime(cfg: BenchConfig, stage: Stage) -> dict[str, Any]:
    """Both runs per repetition (unstaged first), their downtimes and the target's rows."""
    runs: dict[str, list[dict[str, Any]]] = {"unstaged": [], "staged": []}
    for rep in range(cfg.reps):
        cfg.say(f"downtime repetition {rep + 1}/{cfg.reps}: {stage.description}")
        runs["unstaged"].append(_one_run(cfg, stage, staged=False))
        runs["staged"].append(_one_run(cfg, stage, staged=True))
    staged = [r["downtime"]["seconds"] for r in runs["staged"]]
    unstaged = [r["downtime"]["seconds"] for r in runs["unstaged"]]
    floor = [r["downtime"]["parts"]["smoke"] + r["downtime"]["parts"]["start"] + r["downtime"]["parts"]["ready"]
             + SLACK_S for r in runs["staged"]]

    def parts(mode: str) -> dict[str, float | None]:
        keys = runs[mode][0]["downtime"]["parts"] if runs[mode] else {}
        return {k: _median([r["downtime"]["parts"][k] for r in runs[mode]]) for k in keys}

    ps, pu = parts("staged"), parts("unstaged")
    fmt = ", ".join
    rows = [
        Row("downtime: staged", _median(staged), "smoke + start + 10 s", _median(floor), 1.0,
            samples=staged, baseline_samples=floor,
            note="staged parts: " + fmt(f"{k} {v:.2f}" for k, v in ps.items() if v is not None)),
        Row("downtime: staged", _median(staged), "unstaged, cold uv cache", _median(unstaged), None,
            samples=staged, baseline_samples=unstaged,
            note="unstaged parts: " + fmt(f"{k} {v:.2f}" for k, v in pu.items() if v is not None)),
    ]
    return {"rows": rows, "downtime": {"stage": stage.description, "runs": runs, "slack_s": SLACK_S}}


# --- the stages -------------------------------------------------------------------------------------

def synthetic_stage(cfg: BenchConfig) -> tuple[Stage, Callable[[], None]]:
    """A toy release on the loopback index: `toyvllm` 1.0 → 2.0 needing `toytorch` 1.0 → 2.0
    (random payloads of ~256 MB and ~64 MB at scale 1, stored uncompressed like real wheels'
    large libraries), and 20 small neighbours that do not change. Returns the stage and what
    stops its index."""
    from devtools.localindex import start_index
    from devtools.wheelbuild import build_wheel

    root = cfg.root / "downtime"
    wheels = root / "wheels"
    scale = max(0.05, min(cfg.scale, 4.0))
    stamp = wheels / f".built-{scale:g}"
    if not stamp.exists():
        rm_tree(wheels)
        cfg.say(f"building the downtime bench's wheels in {wheels} (scale {scale:g})")
        chunk = (4 << 20) if scale >= 0.25 else (256 << 10)  # a tiny scale is the harness's own test
        for version in ("1.0.0", "2.0.0"):
            torch_files: dict[str, str | bytes] = {"toytorch/__init__.py": f'__version__ = "{version}"\n'}
            for i in range(max(1, int(64 * scale))):
                torch_files[f"toytorch/lib/libtoy_{i}.so"] = os.urandom(chunk)
            build_wheel(wheels, "toytorch", version, torch_files, store_over=1 << 20)
            vllm_files: dict[str, str | bytes] = {"toyvllm/__init__.py": f'import toytorch\n__version__ = "{version}"\n'}
            for i in range(max(1, int(16 * scale))):
                vllm_files[f"toyvllm/kernels/_k{i}.so"] = os.urandom(chunk)
            for i in range(200):
                vllm_files[f"toyvllm/model_executor/m{i}.py"] = f"X = {i}  # {version}\n"
            build_wheel(wheels, "toyvllm", version, vllm_files, requires=[f"toytorch=={version}"], store_over=1 << 20)
        for i in range(20):
            build_wheel(wheels, f"toydep{i}", "1.0.0", {f"toydep{i}/__init__.py": f"N = {i}\n"})
        stamp.touch()
    index = start_index(wheels)
    env_dir = root / "env"
    python = env_dir / "bin" / "python"
    seed = root / "seed-cache"
    cold = root / "cold-cache"
    base = {**_base_env(), "UV_NO_PROGRESS": "1"}

    def reset() -> None:
        rm_tree(env_dir)
        _uv("venv", "-q", "--python", sys.executable, str(env_dir), env=base)
        _uv("pip", "install", "-q", "--python", str(python), "--index-url", index.url, "--link-mode", "copy",
            "toyvllm==1.0.0", *[f"toydep{i}" for i in range(20)], env={**base, "UV_CACHE_DIR": str(seed)})

    def cache(mode: str) -> Path:
        rm_tree(cold)  # empty for both runs: nothing of the new release is in it
        cold.mkdir(parents=True)
        return cold

    size = sum(p.stat().st_size for p in wheels.glob("toy*-2.0.0-*.whl"))
    stage = Stage(root, python, ["toyvllm"], ["toyvllm"], index.url, [], reset, cache,
                  f"synthetic toyvllm 1.0.0 → 2.0.0 ({size / 2**20:.0f} MiB of new wheels, loopback index)")
    return stage, index.stop


def real_stage(cfg: BenchConfig) -> Stage:
    """The real bench's releases (BENCH_REAL_OLD → BENCH_REAL_NEW) in a scratch environment
    hard-linked from its warm cache, which is only read (see the module's docstring)."""
    real = cfg.root / "real"
    warm = real / "uv-cache"
    old_txt = real / "old.txt"
    if not (warm.is_dir() and old_txt.is_file()):
        raise RewheelError(f"the real downtime bench needs the real bench's cache ({warm}, {old_txt}): "
                           "run `make bench` once first")
    root = cfg.root / "downtime-real"
    env_dir = root / "env"
    python = env_dir / "bin" / "python"
    cold = root / "cold-cache"
    base = {**_base_env(), "UV_NO_PROGRESS": "1", "UV_PYTHON_DOWNLOADS": "never"}
    new = cfg.real_new
    name = new.split("==")[0]

    def reset() -> None:
        rm_tree(env_dir)
        _uv("venv", "-q", "--python", sys.executable, str(env_dir), env=base)
        _uv("pip", "sync", "-q", "--offline", "--python", str(python), "--link-mode", "hardlink",
            *cfg.real_uv_args, str(old_txt), env={**base, "UV_CACHE_DIR": str(warm)})

    def cache(mode: str) -> Path:
        if mode == "staged":
            return warm
        rm_tree(cold)
        cold.mkdir(parents=True)
        return cold

    return Stage(root, python, [new], [name], None, list(cfg.real_uv_args), reset, cache,
                 f"{cfg.real_old} → {new} (changed wheels from the index into an empty cache when unstaged)")


def run_synthetic_downtime(cfg: BenchConfig) -> dict[str, Any]:
    stage, stop = synthetic_stage(cfg)
    try:
        res = bench_downtime(cfg, stage)
    finally:
        stop()
    _clean(stage)  # kept when a run failed: its logs are in the homes
    return res


def run_real_downtime(cfg: BenchConfig) -> dict[str, Any]:
    stage = real_stage(cfg)
    res = bench_downtime(cfg, stage)
    _clean(stage)  # kept when a run failed: its logs are in the homes
    return res


def _clean(stage: Stage) -> None:
    for d in ("env", "cold-cache", "home-staged", "home-unstaged"):
        shutil.rmtree(stage.root / d, ignore_errors=True)
