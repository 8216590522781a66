"""The real bench's rollback downtime: the default `rewheel rollback RECIPE` — its undo
snapshot taken while the service still serves, proven current by one stat walk once the
service is stopped — against the same rollback done by hand, with a service up.

A scratch environment is hard-linked from the real bench's warm uv cache (only read), and a
service runs from its interpreter: devtools/bench/serve.py under the command manager, which
imports the upgraded package before it answers (as `vllm serve` does). Per repetition:

  1. the service up on the old release — its first start there writes the bytecode of what
     it imports, as on a host where the service has run — then `rewheel snapshot RECIPE`
  2. the service restarted on the new release (`uv pip install NEW`, offline)
  3. `rewheel rollback RECIPE SNAPSHOT --yes --json`: its own `downtime`, from the moment the
     stop began to the first healthy answer; then every file hashed: the snapshot's, exactly,
     bytecode apart — counted instead, since the restarted service rewrites each `.pyc` it
     finds stale
  4. the service restarted once more (start to first 200 timed: every `.pyc` is current now,
     so this shows what the start after the rollback spent compiling what it found stale)
  5. the service restarted on the new release again, then by hand: stop it, `uv pip sync`
     the old set (warm cache, offline) + sync(2), start it, and poll its health URL every
     50 ms until the first 200 (rewheel polls every 0.5 s: that is its own cost)

Target: rewheel's downtime <= the one by hand (1x). A second row, informational, compares
the part before the start (rewheel: stop, snapshot check, restore; by hand: stop, sync): the
starts differ by what each leaves behind — the restore brings back the old release's
bytecode, while uv unpacks the old release without it, so that the first start after the
sync compiles what it imports.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devtools.bench.downtime import SERVE, _free_port
from devtools.bench.harness import TARGETS, BenchConfig, Row, _median, first_differences, fingerprint, rm_tree, settle
from rewheel.errors import RewheelError

if TYPE_CHECKING:
    from devtools.bench.real import RealBench

HAND_POLL_S = 0.05  # the by-hand side's health poll: close to the first answer
READY_TIMEOUT_S = 900
STOP_TIMEOUT_S = 60
HAND_STEP = "downtime: rollback"
HAND_BASELINE = "by hand: stop, uv pip sync + sync, start"
PRESTART_STEP = "downtime: rollback, to the start"
PRESTART_BASELINE = "by hand: stop, uv pip sync + sync"
TRIVIAL = " (trivial service)"  # the service imports nothing: the restore is what shows


def _recipe(path: Path, python: Path, port: int, package: str, uv_args: tuple[str, ...], imports: bool) -> None:
    import tomli_w

    path.write_text(tomli_w.dumps({
        "name": "bench-rollback-downtime",
        "environment": {"python": str(python)},
        "service": {"manager": "command",
                    "start": ["{python}", "-I", str(SERVE), "--port", str(port),
                              *(["--import", package] if imports else [])],
                    "health_url": f"http://127.0.0.1:{port}/health", "ready_timeout_s": READY_TIMEOUT_S,
                    "stop_timeout_s": STOP_TIMEOUT_S, "settle_s": 1.0},
        "install": {"packages": [package], "uv_args": list(uv_args)},
    }))


def _first_200(url: str, timeout_s: float, log: Path) -> None:
    """Poll `url` every HAND_POLL_S until it answers 200."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2.0) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() >= deadline:
            raise RewheelError(f"the bench's service did not answer 200 at {url} within {timeout_s:g}s",
                               hint=f"its log: {log}")
        time.sleep(HAND_POLL_S)


class _Service:
    """The recipe's service, driven through rewheel's own command manager (the one the
    rollback uses: same state folder, same pid records), for the untimed starts and the
    by-hand stop and start."""

    def __init__(self, recipe_path: Path, home: Path) -> None:
        from rewheel.environment import Environment
        from rewheel.recipe import load_recipe
        from rewheel.service import make_manager
        from rewheel.snapshot import Store

        self.recipe = load_recipe(recipe_path)
        spec = self.recipe.service
        assert spec is not None and spec.health_url
        self.spec = spec
        self.url = spec.health_url
        store = Store(Environment.inspect(self.recipe.python).prefix, home)
        self.mgr: Any = make_manager(spec, store.env_dir, python=self.recipe.python)

    def up(self) -> None:
        from rewheel.service import wait_ready

        if self.mgr.status().up:
            return
        started = time.time()
        self.mgr.start()
        wait_ready(self.mgr, self.spec, started_at=started)

    def stop(self) -> None:
        self.mgr.stop(float(STOP_TIMEOUT_S))

    def restart_after(self, change: Callable[[], Any]) -> None:
        self.stop()
        change()
        self.up()

    def timed_restart(self) -> float:
        """Stop (untimed), then start and wait for the first 200: seconds."""
        self.stop()
        settle()
        t0 = time.perf_counter()
        self.mgr.start()
        _first_200(self.url, READY_TIMEOUT_S, self.mgr.log_path)
        return round(time.perf_counter() - t0, 4)

    def by_hand(self, sync: Callable[[], Any]) -> dict[str, Any]:
        """Stop, sync, start, first 200: the downtime and its parts."""
        settle()
        t0 = time.perf_counter()
        self.stop()
        t1 = time.perf_counter()
        sync()
        os.sync()
        t2 = time.perf_counter()
        self.mgr.start()
        t3 = time.perf_counter()
        _first_200(self.url, READY_TIMEOUT_S, self.mgr.log_path)
        t4 = time.perf_counter()
        return {"seconds": round(t4 - t0, 4),
                "parts": {"stop": round(t1 - t0, 4), "sync": round(t2 - t1, 4), "start": round(t3 - t2, 4),
                          "ready": round(t4 - t3, 4)}}


def bench_rollback_downtime(cfg: BenchConfig, rb: RealBench, *, imports: bool = True) -> dict[str, Any]:
    """Both rollbacks per repetition (see the module's docstring); the rows and the record.
    `imports=False`: a trivial service, which imports nothing, so that the downtime is the
    restore's and not the new start's import of vLLM."""
    root = cfg.root / "rollback-downtime"
    env = root / "env"
    python = env / "bin" / "python"
    home = root / "home"
    for d in (env, home):
        rm_tree(d)
    root.mkdir(parents=True, exist_ok=True)
    package = cfg.real_new.split("==")[0].strip()
    recipe = root / "recipe.toml"
    cfg.say(f"rollback downtime: a service from {python}, " + (f"importing {package}" if imports else "importing nothing"))
    rb.uv("venv", "-q", "--python", sys.executable, str(env))
    rb.sync_old(python=python)
    _recipe(recipe, python, _free_port(), package, cfg.real_uv_args, imports)
    home.mkdir(mode=0o700)
    svc = _Service(recipe, home)
    runs: list[dict[str, Any]] = []
    prefix = str(env)

    def upgrade() -> None:
        rb.install(cfg.real_new, "--offline", python=python)

    try:
        for rep in range(cfg.reps):
            svc.up()  # on the old release: from the last repetition's sync, or the first start
            _, snap = rb.cli("snapshot", str(recipe), "--label", f"bench-service-{rep}", home=home)
            before = fingerprint(prefix)
            svc.restart_after(upgrade)
            wall, doc = rb.cli("rollback", str(recipe), snap["id"], "--yes", home=home)
            after = fingerprint(prefix)
            exact, rewritten = _compare(before, after)
            if not exact:
                a, b = ({k: v for k, v in d.items() if not _is_bytecode(k)} for d in (before, after))
                cfg.say("  rollback with the service NOT byte-exact: " + "; ".join(first_differences(a, b)))
            names = [s.get("name") for s in doc.get("steps", [])]
            down = doc.get("downtime") or {}
            if not down:
                raise RewheelError(f"`rewheel rollback {recipe}` reported no downtime: {doc.get('status')}, "
                                   f"steps {names}")
            mine = {"seconds": down["seconds"], "parts": down["parts"], "wall_s": round(wall, 4),
                    "undo_snapshot_id": doc.get("undo_snapshot_id"), "steps": names,
                    # The undo snapshot while the service served: its step before the stop.
                    "undo_while_serving": "snapshot" in names and "stop" in names
                    and names.index("snapshot") < names.index("stop"),
                    "byte_exact": exact, "bytecode_rewritten": rewritten}
            # The same start again, every .pyc now current: what the start after the rollback
            # spent compiling what it found stale.
            mine["restart_s"] = svc.timed_restart()
            svc.restart_after(upgrade)
            hand = svc.by_hand(lambda: rb.sync_old(python=python))
            runs.append({"rewheel": mine, "by_hand": hand})
            cfg.say(f"  rollback downtime {mine['seconds']:.2f}s {mine['parts']} vs by hand "
                    f"{hand['seconds']:.2f}s {hand['parts']}")
    finally:
        try:
            svc.stop()
        except RewheelError as exc:
            cfg.say(f"  stopping the bench's service: {exc}")
    rows = rollback_downtime_rows(runs, "" if imports else TRIVIAL)
    record = {"runs": runs, "target": TARGETS["rollback"], "hand_poll_s": HAND_POLL_S,
              "byte_exact": bool(runs) and all(r["rewheel"]["byte_exact"] for r in runs),
              "undo_while_serving": bool(runs) and all(r["rewheel"]["undo_while_serving"] for r in runs),
              "bytecode_rewritten": max((r["rewheel"]["bytecode_rewritten"] for r in runs), default=0)}
    for d in (env, home):
        shutil.rmtree(d, ignore_errors=True)
    return {"rows": rows, "rollback_downtime": record}


def _is_bytecode(rel: str) -> bool:
    return "__pycache__" in rel.split(os.sep)


def _compare(before: dict[str, tuple], after: dict[str, tuple]) -> tuple[bool, int]:
    """Whether the environment is the snapshot's, byte for byte, but for bytecode; and how
    many bytecode entries differ. The service has started by the time it is hashed: its
    interpreter rewrites a `.pyc` whose source's mtime is not the one the `.pyc` records
    (and writes one for a module no earlier start imported)."""
    keys = before.keys() | after.keys()
    rewritten = sum(1 for k in keys if _is_bytecode(k) and before.get(k) != after.get(k))
    exact = all(before.get(k) == after.get(k) for k in keys if not _is_bytecode(k))
    return exact, rewritten


def _prestart(run: dict[str, Any]) -> float:
    """The downtime before the service's start: everything but the start and the wait for
    its first healthy answer (rewheel's gaps between steps included)."""
    return max(0.0, run["seconds"] - run["parts"].get("start", 0.0) - run["parts"].get("ready", 0.0))


def rollback_downtime_rows(runs: list[dict[str, Any]], suffix: str = "") -> list[Row]:
    """The two rows from the repetitions' records: the downtime (target 1x) and its part
    before the start (informational), each with the medians of the parts in its note."""
    mine = [r["rewheel"] for r in runs]
    hand = [r["by_hand"] for r in runs]

    def parts(side: list[dict[str, Any]]) -> str:
        keys = side[0]["parts"] if side else {}
        return ", ".join(f"{k} {_median([s['parts'][k] for s in side]) or 0:.2f}" for k in keys)

    undo = "undo snapshot taken while serving" if mine and all(m["undo_while_serving"] for m in mine) \
        else "undo snapshot NOT taken while serving"
    exact = "byte-exact" if mine and all(m["byte_exact"] for m in mine) else "NOT byte-exact"
    rewritten = max((m.get("bytecode_rewritten", 0) for m in mine), default=0)
    if rewritten:
        exact += f" but for {rewritten} bytecode files its start rewrote"
    restart = _median([m["restart_s"] for m in mine if m.get("restart_s") is not None])
    again = f"; a restart right after: {restart:.2f} to the first 200" if restart is not None else ""
    a = [m["seconds"] for m in mine]
    b = [h["seconds"] for h in hand]
    pa = [_prestart(m) for m in mine]
    pb = [_prestart(h) for h in hand]
    return [
        Row(HAND_STEP + suffix, _median(a), HAND_BASELINE, _median(b), TARGETS["rollback"], samples=a,
            baseline_samples=b,
            note=f"default rollback ({undo}; {exact}): {parts(mine)}{again}; by hand: {parts(hand)}"),
        Row(PRESTART_STEP + suffix, _median(pa), PRESTART_BASELINE, _median(pb), None, samples=pa,
            baseline_samples=pb,
            note="the starts differ by bytecode: the restore brings the old release's back, uv's sync "
                 "unpacks it without"),
    ]
