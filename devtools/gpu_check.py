"""`make gpu-check`: prove rewheel's GPU paths on a host with NVIDIA GPUs, end to end, and print a
table of what held.

    python -m devtools.gpu_check [--wheels DIR | --rewheel PATH] [--python PY] [--gpu N]
                                 [--report DIR] [--work DIR] [--keep] [--json]
    python -m devtools.gpu_check --build-wheels DIR     (what `make gpu-wheels` runs; needs a network)

1. `rewheel check` of a recipe with `gpus = 1` reads the real `nvidia-smi` through gpu.py (names,
   memory, the processes on each GPU), and its preflight refuses what reality offers: a GPU held by
   another process (the check starts one that holds memory), too little free memory
   (`smoke.gpu_free_mib`), too few GPUs.
2. A real model-init smoke: a tiny random-weight Llama-style decoder, made here with transformers
   and saved as safetensors (nothing from a hub), loaded onto the GPU with one forward pass, as a
   recipe's smoke command under `rewheel smoke` (CUDA_VISIBLE_DEVICES and the timeout as rewheel
   passes them), then a `rewheel run` whose upgraded build passes it.
3. Failing builds: `rewheel run` upgrades the environment's one small package from a local index
   to builds that fail for real on the GPU — an allocation larger than the card, a device-side
   assert, a hang that rewheel's timeout kills; each is reverted byte for byte (every file hashed
   before and after) and `rewheel why` names the CUDA error from the smoke test's real log.
4. Timings: smoke start to ready, and how soon the GPU's memory is free after each revert;
   nothing is left holding the card.

The environment under test is a virtualenv made with --system-site-packages over the host's torch,
so only gpucheck-knob (a few hundred bytes) is installed into it. rewheel and uv come from a folder
of wheels (`make gpu-wheels`, 20 MB) and are installed with no network and no index.

Exit status: 0 everything held; 1 something did not (the table says what); 2 bad usage or a
missing prerequisite (no wheels, no torch with CUDA), nothing checked; 3 no NVIDIA GPU here
(`nvidia-smi` missing, without a driver, or listing no GPU), said at once, nothing done.

`--standin` is for the tests on a CPU host: the `nvidia-smi` on PATH is the tests' stand-in and the
smoke runs `gpu_smoke.py --backend standin`; every rewheel step is real, the GPU is not, and the
table says so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devtools import REPO
from devtools import gpu_stage as stage

EXIT_HELD, EXIT_FAILED, EXIT_USAGE, EXIT_NO_GPU = 0, 1, 2, 3
HOLD_MIB = 2048
SMOKE_TIMEOUT_S = 600
# The CUDA error each failing build must be named by (in `rewheel why`'s root cause).
EXPECTED_ERROR = {"oom": "CUDA out of memory", "assert": "device-side assert triggered"}
FREED_WITHIN_S = 60.0
# memory.used may stay this far above where it was (the driver's own bookkeeping) and count as freed.
FREED_SLACK_MIB = 64


@dataclass
class Row:
    part: str          # "0" setup, "1".."4" the parts
    check: str
    ok: bool | None    # None: a fact, not a check
    detail: str
    seconds: float | None = None


@dataclass
class Outcome:
    mode: str  # "gpu" | "standin"
    rows: list[Row] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    stopped: str | None = None  # why the check could not be set up (exit 2)

    def add(self, part: str, check: str, ok: bool | None, detail: str, seconds: float | None = None) -> bool:
        self.rows.append(Row(part, check, ok, detail, None if seconds is None else round(seconds, 3)))
        return bool(ok)

    @property
    def exit_code(self) -> int:
        if self.stopped is not None:
            return EXIT_USAGE
        return EXIT_HELD if all(r.ok is not False for r in self.rows) and self.rows else EXIT_FAILED

    def table(self) -> str:
        head = ("part", "check", "held", "seconds", "detail")
        body = [(r.part, r.check, {True: "yes", False: "NO", None: "-"}[r.ok],
                 "" if r.seconds is None else f"{r.seconds:.2f}", one_line(r.detail))
                for r in sorted(self.rows, key=lambda r: r.part)]  # (stable: each part in the order run)
        widths = [max(len(x[i]) for x in [head, *body]) for i in range(4)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(x[:4], widths, strict=True)) + "  " + x[4]
                 for x in [head, *body]]
        title = "rewheel gpu-check (" + ("STAND-IN: no GPU was used; this proves the orchestration only"
                                         if self.mode == "standin" else "on a real GPU") + ")"
        verdict = (f"stopped: {self.stopped}" if self.stopped is not None else
                   "everything held" if self.exit_code == EXIT_HELD else
                   f"{sum(r.ok is False for r in self.rows)} check(s) did not hold")
        return "\n".join([title, *lines, f"result: {verdict} (exit {self.exit_code})"])

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "exit_code": self.exit_code, "stopped": self.stopped,
                "facts": self.facts, "rows": [asdict(r) for r in self.rows]}


def one_line(text: str, limit: int = 240) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= limit else first[:limit - 1] + "…"


def hang_timeout(ready_s: float | None, floor_s: int = 30, margin_s: int = 10) -> int:
    """The hanging build's smoke timeout: room for a healthy build to get ready twice over."""
    return max(floor_s, 60 if ready_s is None else math.ceil(2 * ready_s) + margin_s)


def choose_gpu(gpus: Sequence[Any], wanted: int | None) -> Any:
    """The GPU to check on: `wanted` (an nvidia-smi index), else the one with the most free memory."""
    if wanted is not None:
        found = [g for g in gpus if g.index == wanted]
        if not found:
            raise ValueError(f"--gpu {wanted}: nvidia-smi lists GPUs {[g.index for g in gpus]}")
        return found[0]
    return max(gpus, key=lambda g: ((g.memory_total_mib or 0) - (g.memory_used_mib or 0), -g.index))


def same_device(device: dict[str, Any], g: Any) -> bool:
    """The smoke's CUDA device 0 (its facts) is nvidia-smi's GPU `g`: by UUID (any case), by name
    where torch gives no UUID."""
    if device.get("uuid"):
        return str(device["uuid"]).lower().removeprefix("gpu-") == g.uuid.lower().removeprefix("gpu-")
    return device.get("name") == g.name


def no_gpu_reason() -> str | None:
    """Why this host has no NVIDIA GPU to check on, read through rewheel's own gpu.py (stdlib
    only, from this checkout); None when nvidia-smi lists at least one."""
    from rewheel import gpu

    try:
        gpus = gpu.list_gpus()
    except gpu.NvidiaSmiUnavailable as exc:
        return exc.message
    return None if gpus else "nvidia-smi lists no GPU (\"No devices were found\")"


def check_name(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next((c for c in doc.get("checks", []) if c.get("name") == name), {})


class Check:
    """One pass of the check on one GPU; each part adds its rows to `out`."""

    def __init__(self, args: argparse.Namespace, out: Outcome, work: Path) -> None:
        from rewheel import gpu

        self.gpu = gpu
        self.args, self.out, self.work = args, out, work
        self.backend = "standin" if args.standin else "torch"
        self.chosen = choose_gpu(gpu.list_gpus(), args.gpu)
        self.cvd = str(self.chosen.index)
        self.stage = stage
        self.env = stage.child_env(work, self.cvd)
        self.holders: list[subprocess.Popen[str]] = []
        self.index: Any = None
        self.ready_s: float | None = None
        self.baseline = self._gpu_now()
        self.n_cmd = 0

    # --- helpers ---
    def _gpu_now(self) -> tuple[int | None, set[int]]:
        """memory.used of the chosen GPU and the pids holding memory on it."""
        gpus = self.gpu.list_gpus()
        g = next(x for x in gpus if x.uuid == self.chosen.uuid)
        pids = {a.pid for a in self.gpu.compute_apps(gpus) if a.gpu_uuid == g.uuid}
        return g.memory_used_mib, pids

    def _wait_freed(self, timeout_s: float = FREED_WITHIN_S) -> tuple[bool, float, str]:
        """Until no process but those there at the start holds the chosen GPU and its memory.used
        is back: (freed, seconds, what is left)."""
        base_used, base_pids = self.baseline
        t0 = time.monotonic()
        while True:
            used, pids = self._gpu_now()
            extra = pids - base_pids
            back = used is None or base_used is None or used <= base_used + FREED_SLACK_MIB
            if not extra and back:
                return True, time.monotonic() - t0, f"{used} MiB used (at the start: {base_used}), no process of the check"
            if time.monotonic() - t0 > timeout_s:
                return False, time.monotonic() - t0, f"{used} MiB used (at the start: {base_used}); still holding: {sorted(extra)}"
            time.sleep(0.05)

    def rewheel(self, *args: str) -> Any:
        ans = self.stage.rewheel(self.tools, self.env, *args, cwd=self.work)
        self.n_cmd += 1
        log = self.work / "commands" / f"{self.n_cmd:02d}-{args[0]}.txt"
        log.parent.mkdir(exist_ok=True)
        log.write_text(f"$ {' '.join(ans.argv)}\nexit {ans.returncode} after {ans.seconds:.2f}s\n--- stdout (JSON)\n"
                       f"{json.dumps(ans.doc, indent=1)}\n--- stderr\n{ans.stderr}")
        return ans

    def recipe(self, name: str, build: str, *, gpus: int = 1, free_mib: int = 0,
               timeout_s: int = SMOKE_TIMEOUT_S) -> str:
        path = self.work / f"{name}.toml"
        path.write_text(self.stage.recipe_text(name=name, python=self.python, index_url=self.index.sub_url(build),
                                               backend=self.backend, timeout_s=timeout_s, gpus=gpus,
                                               free_mib=free_mib))
        return str(path)

    def smoke_argv(self, *rest: str) -> list[str]:
        return [str(self.python), str(self.work / "gpu_smoke.py"), "--backend", self.backend, *rest]

    # --- part 0: the stage ---
    def setup(self) -> None:
        from devtools.localindex import start_index

        st, out = self.stage, self.out
        g = self.chosen
        out.facts["gpu"] = g.to_json()
        out.add("0", "GPU chosen", None, f"GPU {g.index}: {g.name} ({g.uuid}), {g.memory_used_mib} of "
                f"{g.memory_total_mib} MiB used; CUDA_VISIBLE_DEVICES={self.cvd} for every command")
        others = sorted(self.baseline[1])
        out.add("0", "no process holds it at the start", not others,
                "none" if not others else f"pids {others} hold memory on it: rewheel's preflight refuses a GPU "
                "another process holds, so the runs below will be refused while they run (--gpu picks another)")
        base = self.args.python or sys.executable
        if self.backend == "torch":
            probe = st.run([base, "-c", TORCH_PROBE], env=self.env, check=False, timeout=300)
            if probe.returncode != 0:
                raise st.StageError(f"{base} cannot run the model: {(probe.stderr or probe.stdout).strip()[-800:]}"
                                    " (it needs torch with CUDA, transformers and safetensors; --python names another)")
            facts = json.loads(probe.stdout.strip().splitlines()[-1])
            if not facts["cuda_available"]:
                raise st.StageError(f"torch {facts['torch']} in {base} sees no CUDA device with "
                                    f"CUDA_VISIBLE_DEVICES={self.cvd} (a CPU-only torch build?)")
            out.facts["host_python"] = facts
            out.add("0", "host interpreter", None, f"{base}: Python {facts['python']}, torch {facts['torch']} "
                    f"(CUDA {facts['cuda']}), transformers {facts['transformers']}, safetensors {facts['safetensors']}")
        t = time.monotonic()
        self.tools = (st.given_tools(self.args.rewheel) if self.args.rewheel
                      else st.install_tools(Path(self.args.wheels), self.work, self.env))
        version = st.run([self.tools.rewheel, "--version"], env=self.env).stdout.strip()
        out.add("0", "rewheel and uv", None, f"{version}; {self.tools.how}", time.monotonic() - t)
        st.knob_wheels(self.work / "index")
        self.index = start_index(self.work / "index")
        t = time.monotonic()
        needs = ("torch", "transformers", "safetensors") if self.backend == "torch" else ()
        self.python, how = st.make_env(self.work, base, self.index.sub_url("base"), self.tools, self.env, needs=needs)
        out.add("0", "environment under test", None, f"{self.python}: --system-site-packages over {base}; "
                + (f"the model's libraries through {how}; " if needs else "")
                + f"{st.KNOB} {st.BUILDS['base'][0]} from the local index",
                time.monotonic() - t)
        shutil.copyfile(st.SMOKE_SCRIPT, self.work / "gpu_smoke.py")

    # --- part 1: what nvidia-smi says, through gpu.py, and the preflight's refusals ---
    def part1(self) -> None:
        out, gpu = self.out, self.gpu
        gpus = gpu.list_gpus()
        apps = gpu.compute_apps(gpus)
        said = []
        for g in gpus:
            mine = [a for a in apps if a.gpu_uuid == g.uuid]
            procs = ", ".join(f"pid {a.pid} {a.process_name} {a.used_memory_mib} MiB" for a in mine) or "no process"
            said.append(f"GPU {g.index}: {g.name}, {g.memory_used_mib} of {g.memory_total_mib} MiB used, {procs}")
        readable = all(g.memory_total_mib is not None and g.memory_used_mib is not None and g.name for g in gpus)
        out.facts["gpus"] = [g.to_json() for g in gpus]
        out.facts["compute_apps"] = [a.to_json() for a in apps]
        out.add("1", "nvidia-smi read through gpu.py", readable, "; ".join(said))

        ok_recipe = self.recipe("check", "base", free_mib=1024)
        ans = self.rewheel("check", ok_recipe)
        c = check_name(ans.doc, "gpus")
        out.add("1", "rewheel check passes: gpus = 1, gpu_free_mib = 1024",
                ans.returncode == 0 and c.get("ok") is True and self.chosen.name in c.get("detail", ""),
                f"exit {ans.returncode}; gpus: {c.get('detail') or ans.doc.get('message') or ans.stderr.strip()[-300:]}",
                ans.seconds)

        ans = self.rewheel("check", self.recipe("check-two", "base", gpus=2))
        c = check_name(ans.doc, "gpus")
        out.add("1", "refused: too few GPUs (gpus = 2, one visible)",
                ans.returncode == 2 and c.get("ok") is False and "only 1 are visible" in c.get("detail", ""),
                f"exit {ans.returncode}; {c.get('detail')}", ans.seconds)

        holder, listed = self._start_holder()
        if holder is not None and listed is not None:
            ans = self.rewheel("check", ok_recipe)
            c = check_name(ans.doc, "gpus")
            detail = c.get("detail", "")
            out.add("1", "refused: the GPU held by another process",
                    ans.returncode == 2 and c.get("ok") is False and f"pid {listed.pid} " in detail,
                    f"exit {ans.returncode}; {detail}", ans.seconds)
            t0 = time.monotonic()
            holder.kill()
            holder.wait()
            gone = self._wait_pid_gone(listed.pid)
            out.add("4", "holder's memory released after its kill", gone,
                    f"pid {listed.pid} ({listed.used_memory_mib} MiB) "
                    + ("no longer listed by nvidia-smi" if gone else "still listed"), time.monotonic() - t0)

        used, _ = self._gpu_now()
        free = (self.chosen.memory_total_mib or 0) - (used or 0)
        need = free + 2048
        ans = self.rewheel("check", self.recipe("check-free", "base", free_mib=need))
        c = check_name(ans.doc, "gpus")
        out.add("1", f"refused: too little free memory (gpu_free_mib = {need})",
                ans.returncode == 2 and c.get("ok") is False and "smoke.gpu_free_mib" in c.get("detail", ""),
                f"exit {ans.returncode}; {c.get('detail')}", ans.seconds)

    def _start_holder(self) -> tuple[subprocess.Popen[str] | None, Any]:
        """A process holding HOLD_MIB on the chosen GPU, and nvidia-smi's line for it: by its pid,
        or, where nvidia-smi shows another pid namespace's pids (a container), the one new process
        on the GPU that holds at least that much."""
        t0 = time.monotonic()
        p = subprocess.Popen(self.smoke_argv("hold", "--mib", str(HOLD_MIB)), env=self.env, cwd=self.work,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        self.holders.append(p)
        said = self.stage.read_until(p, "gpu_smoke: HOLDING", timeout_s=300)
        deadline = time.monotonic() + 30
        listed, how = None, ""
        while p.poll() is None and time.monotonic() < deadline and listed is None:
            apps = [a for a in self.gpu.compute_apps(self.gpu.list_gpus()) if a.gpu_uuid == self.chosen.uuid]
            listed = next((a for a in apps if a.pid == p.pid), None)
            if listed is None:
                new = [a for a in apps if a.pid not in self.baseline[1]
                       and (a.used_memory_mib or 0) >= HOLD_MIB * 0.9]
                if len(new) == 1:
                    listed, how = new[0], f" (it is pid {p.pid} here: nvidia-smi shows another pid namespace's pids)"
            time.sleep(0.05 if listed is None else 0)
        ok = listed is not None and (listed.used_memory_mib is None or listed.used_memory_mib >= HOLD_MIB)
        self.out.add("1", f"a process holding {HOLD_MIB} MiB, seen through gpu.py", ok,
                     listed.describe() + how if listed is not None else
                     f"pid {p.pid} not listed by nvidia-smi on GPU {self.chosen.index} (memory.used now "
                     f"{self._gpu_now()[0]} MiB); it said: {''.join(said)[-500:]}",
                     time.monotonic() - t0)
        if not ok:
            p.kill()
            p.wait()
            return None, None
        return p, listed

    def _wait_pid_gone(self, pid: int, timeout_s: float = FREED_WITHIN_S) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(a.pid != pid for a in self.gpu.compute_apps()):
                return True
            time.sleep(0.05)
        return False

    # --- part 2: the model-init smoke on the GPU ---
    def part2(self) -> None:
        out, st = self.out, self.stage
        t = time.monotonic()
        made = st.run(self.smoke_argv("make-model", str(self.work / "model")), env=self.env, cwd=self.work, check=False)
        model = st.smoke_facts(made.stdout).get("MODEL")
        out.add("2", "tiny Llama-style model made locally", made.returncode == 0 and model is not None,
                (f"{model['params']:,} random weights, files {model['files']} (transformers {model['transformers']}), "
                 "saved as safetensors; Hugging Face offline") if model else made.stderr.strip()[-500:],
                time.monotonic() - t)
        if model is None:
            return
        recipe = str(self.work / "check.toml")
        ans = self.rewheel("smoke", recipe)
        smoke = ans.doc.get("smoke") or {}
        log = smoke.get("log_path")
        facts = st.smoke_facts(Path(log).read_text(errors="replace")) if log and Path(log).exists() else {}
        start, device, ready = facts.get("START", {}), facts.get("DEVICE", {}), facts.get("READY")
        out.add("2", "model-init smoke on the GPU (rewheel smoke)", ans.returncode == 0 and ready is not None,
                (f"{device.get('name')}: loaded {facts.get('LOADED', {}).get('params', 0):,} weights in "
                 f"{facts.get('LOADED', {}).get('load_s')}s, forward pass logits {ready.get('logits')}, "
                 f"peak {ready.get('peak_mib')} MiB; log {log}") if ready else
                f"exit {ans.returncode}: {ans.doc.get('root_cause') or ans.stderr.strip()[-500:]}", ans.seconds)
        same_gpu = same_device(device, self.chosen)
        out.add("2", "CUDA_VISIBLE_DEVICES as rewheel passes it",
                start.get("cuda_visible_devices") == self.cvd and device.get("device_count") == 1 and same_gpu,
                f"the smoke saw CUDA_VISIBLE_DEVICES={start.get('cuda_visible_devices')!r}, "
                f"{device.get('device_count')} device(s), device 0 = {device.get('uuid') or device.get('name')} "
                f"(nvidia-smi's GPU {self.chosen.index}: {self.chosen.uuid})")
        first = Path(log).read_text(errors="replace").splitlines()[0] if log and Path(log).exists() else ""
        out.add("2", "the timeout as rewheel sets it", f"(timeout {SMOKE_TIMEOUT_S}s" in first
                and smoke.get("timeout_s") == SMOKE_TIMEOUT_S, one_line(first))
        if ready is not None:
            self.ready_s = float(ready["since_start_s"])
            out.add("4", "smoke start to ready", True,
                    f"{self.ready_s:.2f}s from the smoke process's start to its forward pass done "
                    f"(rewheel's whole smoke step: {smoke.get('seconds')}s)", self.ready_s)
        ans = self.rewheel("run", self.recipe("good", "good"), "--yes")
        after = (ans.doc.get("after") or {}).get(st.KNOB)
        out.add("2", "an upgrade kept: the new build passes the smoke (rewheel run)",
                ans.returncode == 0 and ans.doc.get("status") == "upgraded" and after == st.BUILDS["good"][0],
                f"exit {ans.returncode}, {ans.doc.get('status')}: {st.KNOB} {(ans.doc.get('before') or {}).get(st.KNOB)}"
                f" -> {after}" + ("" if ans.returncode == 0 else f"; {ans.doc.get('message') or ans.stderr.strip()[-300:]}"),
                ans.seconds)

    # --- part 3: failing builds, reverted; part 4: the GPU freed ---
    def part3(self) -> None:
        for build in ("oom", "assert", "hang"):
            self._failing_build(build)

    def _failing_build(self, build: str) -> None:
        out, st = self.out, self.stage
        # (the stand-in is ready in a tenth of a second: a short wait proves the kill as well)
        timeout = (SMOKE_TIMEOUT_S if build != "hang" else hang_timeout(self.ready_s) if self.backend == "torch"
                   else hang_timeout(self.ready_s, floor_s=5, margin_s=3))
        recipe = self.recipe(build, build, timeout_s=timeout)
        prefix = self.python.parent.parent
        before = st.tree_hashes(prefix)
        ans = self.rewheel("run", recipe, "--yes")
        freed, freed_s, left = self._wait_freed()
        after = st.tree_hashes(prefix)
        version = st.BUILDS[build][0]
        out.add("3", f"{build}: the failing build reverted (rewheel run)",
                ans.returncode == 1 and ans.doc.get("status") == "reverted",
                f"exit {ans.returncode}, {ans.doc.get('status')}: {st.KNOB} {version} tried, "
                f"{(ans.doc.get('after') or {}).get(st.KNOB)} in place; "
                + (ans.doc.get("failure") or {}).get("message", ans.doc.get("message") or ans.stderr.strip()[-300:]),
                ans.seconds)
        changed = st.tree_changes(before, after)
        real = [p for p in changed if not st.is_bytecode(p)]
        out.add("3", f"{build}: restored byte for byte", not real,
                f"{len(before)} entries hashed (bytes, mode, link target) before and after: "
                + ("identical" if not changed else
                   f"{len(real)} differ: {real[:5]}" if real else
                   f"only byte-code caches differ ({len(changed)}, which a restore may rebuild)"))
        log = (ans.doc.get("logs") or {}).get("smoke")
        if build in EXPECTED_ERROR:
            expected = EXPECTED_ERROR[build]
            why = self.rewheel("why", log) if log else None
            rc = (why.doc.get("root_cause") if why else None) or {}
            named = f"{rc.get('type')}: {rc.get('message')}"
            in_run = expected in str((ans.doc.get("root_cause") or {}).get("message"))
            out.add("3", f"{build}: rewheel why names the CUDA error", why is not None and why.returncode == 0
                    and expected in named and in_run,
                    named + (f" (at {(rc.get('frame') or {}).get('file')}:{(rc.get('frame') or {}).get('line')})"
                             if rc.get("frame") else "") + ("" if in_run else "; the run's report named another cause"),
                    why.seconds if why else None)
        else:
            tail = Path(log).read_text(errors="replace").splitlines()[-1] if log and Path(log).exists() else ""
            facts = st.smoke_facts(Path(log).read_text(errors="replace")) if log and Path(log).exists() else {}
            out.add("3", f"{build}: killed at rewheel's timeout ({timeout}s), on the GPU",
                    "timed out" in tail and "HANGING" in facts, one_line(tail))
        out.add("4", f"GPU memory free after the {build} revert", freed, left, freed_s)

    def part4(self) -> None:
        freed, seconds, left = self._wait_freed(5.0)
        self.out.add("4", "nothing left holding the card", freed, left, seconds)

    def close(self) -> None:
        for p in self.holders:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if self.index is not None:
            self.index.stop()


TORCH_PROBE = """
import json, platform, torch, transformers, safetensors
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                  "cuda_available": torch.cuda.is_available(), "device_count": torch.cuda.device_count(),
                  "transformers": transformers.__version__, "safetensors": safetensors.__version__}))
"""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m devtools.gpu_check", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Exit status: 0 held, 1 something did not, 2 bad usage or a missing "
                                        "prerequisite, 3 no NVIDIA GPU on this host.")
    ap.add_argument("--wheels", default=str(REPO / ".gpu-wheels"), metavar="DIR",
                    help="the folder `make gpu-wheels` filled: rewheel, uv and their dependencies (default: %(default)s)")
    ap.add_argument("--rewheel", metavar="PATH", help="use this installed rewheel instead of the wheels")
    ap.add_argument("--python", metavar="PY", help="the interpreter with torch the environment under test is made "
                                                   "over (default: this one)")
    ap.add_argument("--gpu", type=int, metavar="N", help="nvidia-smi's index of the GPU to use (default: the "
                                                         "one with the most free memory)")
    ap.add_argument("--work", metavar="DIR", help="work folder (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (kept anyway when something failed)")
    ap.add_argument("--report", metavar="DIR", help="also write report.json, table.txt and every log there")
    ap.add_argument("--json", action="store_true", help="the report as JSON on stdout (the table on stderr)")
    ap.add_argument("--standin", action="store_true", help=argparse.SUPPRESS)  # the tests' CPU run
    ap.add_argument("--build-wheels", metavar="DIR", help="fill DIR with the wheels and exit (needs a network)")
    ap.add_argument("--platform", default="manylinux_2_17_x86_64", help=argparse.SUPPRESS)
    ap.add_argument("--python-version", default="3.12", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def write_report(out: Outcome, work: Path, report: Path) -> None:
    report.mkdir(parents=True, exist_ok=True)
    (report / "report.json").write_text(json.dumps(out.to_json(), indent=2))
    (report / "table.txt").write_text(out.table() + "\n")
    for sub in ("commands", "home"):
        src = work / sub
        if src.is_dir():
            for f in src.rglob("*.log" if sub == "home" else "*.txt"):
                dest = report / sub / f.relative_to(src)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dest)


def main(argv: Sequence[str] | None = None, *, say: Callable[[str], None] | None = None) -> int:
    args = parse_args(argv)
    say = say or (lambda text: print(text, file=sys.stderr if args.json else sys.stdout, flush=True))
    sys.path.insert(0, str(REPO / "src"))  # rewheel's gpu.py, from this checkout (stdlib only)
    if args.build_wheels:
        try:
            wheels = stage.build_wheels(Path(args.build_wheels), python_version=args.python_version,
                                            platform=args.platform)
        except stage.StageError as exc:
            say(f"gpu-check: {exc}")
            return EXIT_USAGE
        total = sum(w.stat().st_size for w in wheels)
        say(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {args.build_wheels}"
            + ("" if total <= stage.WHEELS_LIMIT else " (more than the 64 MiB one call to a lent GPU machine carries)"))
        return EXIT_HELD
    reason = no_gpu_reason()
    if reason is not None:
        say(f"gpu-check: no NVIDIA GPU on this host: {reason}\nNothing was checked (exit {EXIT_NO_GPU}). "
            "Run it on a host with an NVIDIA driver and at least one GPU (docs/service-and-gpus.md).")
        return EXIT_NO_GPU
    out = Outcome(mode="standin" if args.standin else "gpu")
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="rewheel-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    out.facts["work"] = str(work)
    check: Check | None = None
    try:
        check = Check(args, out, work)
        check.setup()
        for part in (check.part1, check.part2, check.part3, check.part4):
            try:
                part()
            except Exception as exc:  # noqa: BLE001 — a part that breaks is a row, the others still run
                out.add(part.__name__[-1], f"{part.__name__} stopped", False, f"{type(exc).__name__}: {exc}")
    except (stage.StageError, ValueError) as exc:  # (ValueError: --gpu naming no GPU)
        out.stopped = str(exc)
    finally:
        if check is not None:
            check.close()
    say(out.table())
    if args.report:
        write_report(out, work, Path(args.report))
    if args.json:
        print(json.dumps(out.to_json(), indent=2))
    if out.exit_code == EXIT_HELD and not args.keep and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    else:
        say(f"work folder kept: {work}")
    return out.exit_code


if __name__ == "__main__":
    sys.exit(main())
