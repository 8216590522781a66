"""Start-up: how long the `rewheel` command takes before it does any work, as a person (or
a script) running it pays on every use — `rewheel --help`, and `history` and `why` on a
small input, timed from the exec to the exit of the installed console script.

Start-up is the best of several runs (what the command costs when nothing else competes for
the machine; the median is kept too), against the interpreter's own start (`python -c pass`)
as the baseline. The targets are absolute: `--help` within 0.15 s, `history` and `why`
within 0.3 s. The byte-code is compiled first (`make bench` runs compileall), as an install
with `make venv` or `uv pip install --compile-bytecode` leaves it.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.bench.harness import BenchConfig, Row

STARTUP_TARGETS_S = {"--help": 0.15, "history": 0.3, "why": 0.3}

# A small crash log: one worker's traceback and the engine's cascade, as vLLM writes them.
SMALL_LOG = """INFO 03-30 10:00:00 [api_server.py:1] vLLM API server version 0.16.0rc2.dev344
(Worker_TP4 pid=4242) ERROR 03-30 10:00:05 [multiproc_executor.py:1] WorkerProc failed to start.
(Worker_TP4 pid=4242) ERROR 03-30 10:00:05 [multiproc_executor.py:1] Traceback (most recent call last):
(Worker_TP4 pid=4242) ERROR 03-30 10:00:05 [multiproc_executor.py:1]   File "/opt/vllm-env/lib/python3.12/site-packages/vllm/model_executor/models/deepseek_v2.py", line 84, in __init__
(Worker_TP4 pid=4242) ERROR 03-30 10:00:05 [multiproc_executor.py:1]     raise RuntimeError(
(Worker_TP4 pid=4242) ERROR 03-30 10:00:05 [multiproc_executor.py:1] RuntimeError: cannot reshape tensor of 1536 elements into shape [-1, 0, 192]
ERROR 03-30 10:00:06 [core.py:1] EngineCore failed to start.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}
"""


@dataclass
class StartupRow(Row):
    """A row whose target is absolute (seconds), not a ratio over its baseline."""

    target_s: float = 0.0

    @property
    def passed(self) -> bool | None:
        return None if self.rewheel_s is None else self.rewheel_s <= self.target_s


def rewheel_command() -> list[str]:
    """The `rewheel` console script of this interpreter's environment, as users run it."""
    exe = Path(sys.executable).parent / "rewheel"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "rewheel"]


def _times(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    out: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        cp = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
        out.append(time.perf_counter() - t0)
        if cp.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv)}` exited {cp.returncode}: {cp.stderr.decode(errors='replace')[-500:]}")
    return out


def bench_startup(cfg: BenchConfig, *, python: Path, home: Path) -> dict[str, Any]:
    """Time `rewheel --help`, `rewheel history --python PYTHON` (the snapshots in `home`) and
    `rewheel why` on a small log, `cfg.startup_runs` times each. Returns {"rows": [Row, ...],
    "startup": {name: {...}}}."""
    runs = cfg.startup_runs
    log = cfg.root / "logs" / "startup-crash.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(SMALL_LOG)
    env = {**os.environ, "REWHEEL_HOME": str(home), "COLUMNS": "100"}
    rewheel = rewheel_command()
    base = _times([sys.executable, "-c", "pass"], env, runs)
    cases = {"--help": ["--help"], "history": ["history", "--python", str(python)], "why": ["why", str(log)]}
    rows: list[Row] = []
    summary: dict[str, Any] = {}
    for name, args in cases.items():
        cfg.say(f"start-up: rewheel {name} ({runs} runs)")
        xs = _times([*rewheel, *args], env, runs)
        best, target = min(xs), STARTUP_TARGETS_S[name]
        summary[name] = {"seconds": round(best, 4), "median_s": round(statistics.median(xs), 4),
                         "target_s": target, "pass": best <= target}
        rows.append(StartupRow(f"start-up: rewheel {name}", best, "python -c pass", min(base), None,
                        note=f"best of {runs} (median {statistics.median(xs):.3f}s); target <= {target:g}s: "
                             + ("PASS" if best <= target else "FAIL"),
                        samples=xs, baseline_samples=base, target_s=target))
    return {"rows": rows, "startup": summary}
