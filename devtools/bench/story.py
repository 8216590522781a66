"""The real bench's story row: the story's recipe (`packages = ["vllm"]`, `reinstall = "all"`)
run to the newest vLLM the index offers and kept, then the default `rewheel rollback RECIPE`
(its undo snapshot first) — against what a person does by hand in the same state: `cp -al` of
the environment (their undo) and `uv pip sync` of the old set from the warm cache.

A scratch environment is made from the real bench's warm uv cache (only read). Per
repetition: the old set synced afresh (`--reinstall`, so every repetition starts from the
same files); `rewheel run RECIPE --yes` (its own pre-upgrade snapshot; kept); the rollback,
timed, then every file hashed: the old set's, exactly; then the same run again (untimed), and
`cp -al` + `uv pip sync` + sync(2), timed. Target: <= 1x.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from devtools.bench.harness import (TARGETS, BenchConfig, Row, _median, first_differences, fingerprint, rm_tree,
                                    settle)
from devtools.bench.rollback_downtime import _compare
from rewheel.errors import RewheelError

if TYPE_CHECKING:
    from devtools.bench.real import RealBench

STEP = "rollback + undo snapshot (the story's run, reinstall all)"
BASELINE = "cp -al + uv pip sync"


def _recipe(path: Any, python: Any, package: str, uv_args: tuple[str, ...]) -> None:
    import tomli_w

    path.write_text(tomli_w.dumps({
        "name": "bench-story",
        "environment": {"python": str(python)},
        "install": {"packages": [package], "reinstall": "all", "uv_args": list(uv_args)},
        "smoke": {"command": ["{python}", "-c", f"import {package}"], "timeout_s": 900, "gpus": 0},
    }))


def bench_story(cfg: BenchConfig, rb: RealBench) -> dict[str, Any]:
    root = cfg.root / "story"
    env, home = root / "env", root / "home"
    python = env / "bin" / "python"
    for d in (env, home):
        rm_tree(d)
    root.mkdir(parents=True, exist_ok=True)
    recipe = root / "recipe.toml"
    package = cfg.real_new.split("==")[0].strip()
    _recipe(recipe, python, package, cfg.real_uv_args)
    rb.uv("venv", "-q", "--python", sys.executable, str(env))
    mine: list[float] = []
    hand: list[float] = []
    notes: list[dict[str, Any]] = []
    exact: list[bool] = []
    prefix = str(env)
    for _ in range(cfg.reps):
        rm_tree(home)
        home.mkdir(mode=0o700)
        rb.sync_old("--reinstall", python=python)
        before = fingerprint(prefix)
        _, run = rb.cli("run", str(recipe), "--yes", home=home)
        if run.get("status") != "upgraded":
            raise RewheelError(f"the story's run did not upgrade: {run.get('status')}")
        dt, doc = rb.cli("rollback", str(recipe), "--yes", home=home)
        mine.append(dt)
        after = fingerprint(prefix)
        # Byte-code apart: the run's own probe of the interpreter (a `.pth` hook's import) and
        # its smoke test write caches, which the pre-upgrade snapshot then holds.
        same, _ = _compare(before, after)
        exact.append(same)
        if not same:
            cfg.say("  story rollback NOT byte-exact: " + "; ".join(first_differences(before, after)))
        r = doc.get("restore", {})
        notes.append({"versions": f"{(run.get('before') or {}).get(package)} -> {(run.get('after') or {}).get(package)}",
                      "steps": {x["name"]: x["seconds"] for x in doc.get("steps", [])},
                      **{k: r.get(k) for k in ("written", "from_cache", "proven_same")}})
        # By hand, from the same state: the same run again, then the person's undo copy and sync.
        rm_tree(home)
        home.mkdir(mode=0o700)
        rb.cli("run", str(recipe), "--yes", home=home)
        copy = root / "cp-al"
        rm_tree(copy)
        settle()
        t0 = time.perf_counter()
        subprocess.run(["cp", "-al", prefix, str(copy)], check=True)
        rb.sync_old(python=python)
        os.sync()
        hand.append(time.perf_counter() - t0)
        rm_tree(copy)
        cfg.say(f"  story rollback {mine[-1]:.2f}s ({notes[-1]}) vs cp -al + uv pip sync {hand[-1]:.2f}s")
    rm_tree(env)
    rm_tree(home)
    last = notes[-1] if notes else {}
    row = Row(STEP, _median(mine), BASELINE, _median(hand), TARGETS["rollback"], samples=mine, baseline_samples=hand,
              note=(f"{package} {last.get('versions')}; {', '.join(f'{k} {v:.2f}s' for k, v in (last.get('steps') or {}).items())}; "
                    f"written {last.get('written') or 0:,}, of them {last.get('from_cache') or 0:,} from uv's cache, "
                    f"{last.get('proven_same') or 0:,} proven identical; "
                    f"{'byte-exact' if exact and all(exact) else 'NOT byte-exact'}"))
    return {"rows": [row], "story": {"byte_exact": bool(exact) and all(exact), "runs": notes}}
