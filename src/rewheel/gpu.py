"""GPUs, seen through `nvidia-smi`'s machine-readable CSV: how many are visible, and which
processes still hold GPU memory.

This module owns two checks of the run cycle: preflight's "are `smoke.gpus` GPUs visible, and
free?" and, after the service was stopped, "has every process let go of its GPU memory?" (a
model-init smoke test started while the old server's workers still hold 88 GiB per GPU
fails with out-of-memory, which would be blamed on the new build). "Free" at preflight: no
process that the run's stop would not end holds memory on a visible GPU (the wait after the
stop would time out on it, with the service already down), and, with `smoke.gpu_free_mib`,
that much memory is free on each GPU the smoke test uses once the service has stopped.

Only `--query-gpu=...` / `--query-compute-apps=...` with `--format=csv,noheader,nounits` is
parsed, never the human table.

CUDA_VISIBLE_DEVICES: nvidia-smi lists every GPU regardless of it, but the smoke test
inherits rewheel's environment and CUDA shows it only the devices that variable names. So
when it is set, rewheel counts (and waits on) only those GPUs, with CUDA's own rules: a
comma-separated list of indices or `GPU-` UUID prefixes, read up to the first entry that
names no GPU (or repeats one); an empty value means no GPU. Indices are matched to
nvidia-smi's (PCI bus) order, which is CUDA's order under CUDA_DEVICE_ORDER=PCI_BUS_ID and on
hosts with identical GPUs; MIG instances (`MIG-...`) are not supported and end the list.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from rewheel import proc
from rewheel.errors import GpuError, PreflightError

NVIDIA_SMI = "nvidia-smi"
GPU_FIELDS = "index,name,uuid,memory.used,memory.total"
APP_FIELDS = "pid,process_name,used_memory,gpu_uuid"
QUERY_TIMEOUT_S = 60.0


class NvidiaSmiUnavailable(PreflightError):
    """nvidia-smi is not installed, cannot reach the driver, or failed."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    memory_used_mib: int | None
    memory_total_mib: int | None

    def to_json(self) -> dict[str, object]:
        return {"index": self.index, "name": self.name, "uuid": self.uuid,
                "memory_used_mib": self.memory_used_mib, "memory_total_mib": self.memory_total_mib}


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    process_name: str
    used_memory_mib: int | None
    gpu_uuid: str
    gpu_index: int | None = None

    def describe(self) -> str:
        mem = f"{self.used_memory_mib} MiB" if self.used_memory_mib is not None else "memory"
        where = f"GPU {self.gpu_index}" if self.gpu_index is not None else self.gpu_uuid
        return f"pid {self.pid} ({self.process_name}) holds {mem} on {where}"

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "process_name": self.process_name,
                "used_memory_mib": self.used_memory_mib, "gpu_uuid": self.gpu_uuid,
                "gpu_index": self.gpu_index}


@dataclass
class GpuRelease:
    """The outcome of waiting for GPU memory to be released."""

    seconds: float
    waited_for: list[GpuProcess] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"ok": True, "seconds": round(self.seconds, 3),
                "waited_for": [p.to_json() for p in self.waited_for]}


def _int_or_none(value: str) -> int | None:
    # "[N/A]", "[Not Supported]", "[Insufficient Permissions]": nvidia-smi's unknowns.
    v = value.strip().removesuffix(" MiB")
    try:
        return int(v)
    except ValueError:
        return None


def _query(kind: str, fields: str) -> list[list[str]]:
    """Run one nvidia-smi CSV query; rows of stripped cells. Raises NvidiaSmiUnavailable."""
    if proc.which(NVIDIA_SMI) is None:
        raise NvidiaSmiUnavailable(
            "nvidia-smi not found on PATH: rewheel cannot see the GPUs",
            hint="install the NVIDIA driver utilities, or set smoke.gpus = 0 in the recipe "
                 "if the smoke test needs no GPU")
    argv = [NVIDIA_SMI, f"--query-{kind}={fields}", "--format=csv,noheader,nounits"]
    result = proc.run(argv, timeout=QUERY_TIMEOUT_S)
    said = (result.stdout.strip() or result.stderr.strip()).splitlines()
    first = said[0] if said else "(no output)"
    if result.timed_out:
        raise NvidiaSmiUnavailable(f"`{' '.join(argv)}` did not answer within {QUERY_TIMEOUT_S:g}s "
                                   "(a hung driver?)")
    if result.returncode == 6 and "No devices were found" in result.stdout:
        return []  # a driver without GPUs: a count of zero, not a broken tool
    if result.returncode == 9:
        raise NvidiaSmiUnavailable(
            f"nvidia-smi could not communicate with the NVIDIA driver (exit 9): {first}",
            hint="check that the driver is loaded (`lsmod | grep nvidia`) and matches the "
                 "installed utilities; a driver upgrade usually needs a reboot")
    if result.returncode != 0:
        raise NvidiaSmiUnavailable(f"`{' '.join(argv)}` failed (exit {result.returncode}): {first}")
    ncols = len(fields.split(","))
    rows = []
    for line in result.stdout.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(", ")]
        if len(cells) > ncols:
            # A name containing ", ": the name is column 1 in both queries; re-join it.
            extra = len(cells) - ncols
            cells = [cells[0], ", ".join(cells[1:2 + extra]), *cells[2 + extra:]]
        if len(cells) != ncols:
            raise NvidiaSmiUnavailable(f"unexpected output from `{' '.join(argv)}`: {line!r}")
        rows.append(cells)
    return rows


def list_gpus() -> list[Gpu]:
    """Every GPU nvidia-smi lists (CUDA_VISIBLE_DEVICES does not change this list)."""
    gpus = []
    for index, name, uuid, used, total in _query("gpu", GPU_FIELDS):
        gpus.append(Gpu(index=int(index), name=name, uuid=uuid,
                        memory_used_mib=_int_or_none(used), memory_total_mib=_int_or_none(total)))
    return gpus


def compute_apps(gpus: list[Gpu] | None = None) -> list[GpuProcess]:
    """Processes holding GPU memory; an empty list when none. `gpus` fills in indices."""
    index_of = {g.uuid: g.index for g in (gpus or [])}
    apps = []
    for pid, name, used, uuid in _query("compute-apps", APP_FIELDS):
        apps.append(GpuProcess(pid=int(pid), process_name=name, used_memory_mib=_int_or_none(used),
                               gpu_uuid=uuid, gpu_index=index_of.get(uuid)))
    return apps


def visible_gpus(gpus: list[Gpu], cuda_visible_devices: str | None) -> list[Gpu]:
    """The GPUs a CUDA program started with this CUDA_VISIBLE_DEVICES value would see."""
    if cuda_visible_devices is None:
        return list(gpus)
    chosen: list[Gpu] = []
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        match: Gpu | None = None
        if entry.isdigit():
            match = next((g for g in gpus if g.index == int(entry)), None)
        elif entry.startswith("GPU-"):
            found = [g for g in gpus if g.uuid.startswith(entry)]
            match = found[0] if len(found) == 1 else None
        if match is None or match in chosen:
            break  # CUDA ignores everything from the first invalid entry on
        chosen.append(match)
    return chosen


def _visibility_note(env: Mapping[str, str], listed: int, visible: int) -> str:
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return ""
    return f" (CUDA_VISIBLE_DEVICES={value!r} selects {visible} of the {listed} GPUs nvidia-smi lists)"


def require_gpus(n: int, *, env: Mapping[str, str] | None = None) -> list[Gpu]:
    """Check that at least `n` GPUs are visible; return the visible ones.

    n == 0 checks nothing (and needs no nvidia-smi). Raises PreflightError (nvidia-smi
    missing or without a driver: NvidiaSmiUnavailable) naming what was found.
    """
    if n <= 0:
        return []
    env = os.environ if env is None else env
    try:
        gpus = list_gpus()
    except NvidiaSmiUnavailable as exc:
        raise NvidiaSmiUnavailable(f"smoke.gpus = {n} needs {n} GPU(s), but {exc.message}",
                                   hint=exc.hint) from None
    visible = visible_gpus(gpus, env.get("CUDA_VISIBLE_DEVICES"))
    if len(visible) < n:
        names = ", ".join(f"{g.index}: {g.name}" for g in visible) or "none"
        raise PreflightError(
            f"smoke.gpus = {n} needs {n} GPU(s), but only {len(visible)} are visible "
            f"[{names}]{_visibility_note(env, len(gpus), len(visible))}",
            hint="lower smoke.gpus (and the smoke command's tensor-parallel size), or make "
                 "the GPUs visible (`nvidia-smi -L`)")
    return visible


@dataclass
class GpuSurvey:
    """What preflight saw on the GPUs a run would use, each holder sorted by who frees it."""

    visible: list[Gpu]
    used: list[Gpu]  # the first `smoke.gpus` visible GPUs: CUDA devices 0..n-1 of the smoke test
    service: list[GpuProcess] = field(default_factory=list)   # the running service's: its stop frees them
    unknown: list[GpuProcess] = field(default_factory=list)   # not in this pid namespace while a service runs
    foreign: list[GpuProcess] = field(default_factory=list)   # what no step of the run stops
    service_running: bool = False

    def free_mib(self, g: Gpu) -> int | None:
        """Memory free on `g` once the service has stopped; None where nvidia-smi says [N/A]."""
        if g.memory_total_mib is None or g.memory_used_mib is None:
            return None
        freed = sum(p.used_memory_mib or 0 for p in self.service if p.gpu_uuid == g.uuid)
        return max(0, g.memory_total_mib - g.memory_used_mib + freed)

    def describe(self) -> str:
        def one(g: Gpu) -> str:
            mem = (f"{g.memory_used_mib} of {g.memory_total_mib} MiB used"
                   if g.memory_total_mib is not None else "memory [N/A]")
            held = [f"{who} pid {p.pid} {p.used_memory_mib if p.used_memory_mib is not None else '?'} MiB"
                    for who, ps in (("service", self.service), ("unattributed", self.unknown))
                    for p in ps if p.gpu_uuid == g.uuid]
            return f"{g.index}: {g.name} ({mem}" + (f"; {', '.join(held)}" if held else "") + ")"

        return f"{len(self.visible)} GPU(s): " + "; ".join(one(g) for g in self.visible)


def survey_gpus(visible: list[Gpu], apps: list[GpuProcess], n: int, *,
                service_pids: Collection[int] | None,
                in_namespace: Callable[[int], bool]) -> GpuSurvey:
    """Sort the processes holding memory on the visible GPUs (`visible_gpus`: those rewheel
    waits on after the stop) by what frees them. `service_pids`: None when no service runs (nothing the run stops
    can free a GPU), else the running service's known processes (empty: not known). A holder
    that is not in this pid namespace (`in_namespace` false: another container's, a name
    nvidia-smi shows as [Not Found]) cannot be told from the service's while one runs."""
    survey = GpuSurvey(visible=list(visible), used=list(visible[:n]),
                       service_running=service_pids is not None)
    wanted = {g.uuid for g in visible}
    for p in apps:
        if p.gpu_uuid not in wanted:
            continue
        if service_pids is None:
            survey.foreign.append(p)
        elif p.pid in service_pids:
            survey.service.append(p)
        elif not service_pids or not in_namespace(p.pid):
            survey.unknown.append(p)
        else:
            survey.foreign.append(p)
    return survey


def survey_refusal(survey: GpuSurvey, *, need_free_mib: int, has_service: bool) -> PreflightError | None:
    """Why the smoke test could not have its GPUs: a process the run would not stop holds one
    (the smoke test would share it, and the wait after the stop would time out on it), or
    less than `smoke.gpu_free_mib` is free on a GPU the smoke test uses. None when neither."""
    if survey.foreign:
        pids = sorted({p.pid for p in survey.foreign})
        why = ("it is not part of the running service" if survey.service_running
               else "the service is not running: its stop frees nothing" if has_service
               else "the recipe has no [service] whose stop would free it")
        return PreflightError(
            "a GPU the smoke test would use is held by another process: "
            + "; ".join(p.describe() for p in survey.foreign) + f" ({why})",
            hint=f"end it (`kill {' '.join(map(str, pids))}`), or make only free GPUs visible "
                 "with CUDA_VISIBLE_DEVICES; nothing was changed")
    if need_free_mib > 0:
        short = [(g, free) for g in survey.used
                 if (free := survey.free_mib(g)) is not None and free < need_free_mib]
        if short:
            said = "; ".join(f"GPU {g.index} ({g.name}) has {free} MiB free ({g.memory_used_mib} of "
                             f"{g.memory_total_mib} MiB used)" for g, free in short)
            return PreflightError(
                f"smoke.gpu_free_mib = {need_free_mib} needs {need_free_mib} MiB free on each GPU the "
                f"smoke test uses, but {said}",
                hint="free memory on the GPU (`nvidia-smi` shows what holds it), lower "
                     "smoke.gpu_free_mib, or choose other GPUs with CUDA_VISIBLE_DEVICES; nothing was changed")
    return None


def check_gpus(n: int, *, need_free_mib: int = 0, service_pids: Collection[int] | None = None,
               has_service: bool = False, env: Mapping[str, str] | None = None) -> GpuSurvey:
    """Preflight for `smoke.gpus = n`: `n` GPUs visible (`require_gpus`), none of the visible
    ones held by a process the run would not stop, and `need_free_mib` free on each of the
    first `n` once the service has stopped. Raises PreflightError; returns what it saw."""
    visible = require_gpus(n, env=env)
    try:
        apps = compute_apps(visible)
    except NvidiaSmiUnavailable as exc:
        raise NvidiaSmiUnavailable(f"smoke.gpus = {n}: {exc.message}", hint=exc.hint) from None
    survey = survey_gpus(visible, apps, n, service_pids=service_pids,
                         in_namespace=lambda pid: proc.proc_stat(pid) is not None)
    refused = survey_refusal(survey, need_free_mib=need_free_mib, has_service=has_service)
    if refused is not None:
        raise refused
    return survey


def wait_gpus_released(timeout_s: float, *, poll_s: float = 1.0,
                       gpu_uuids: Collection[str] | None = None,
                       env: Mapping[str, str] | None = None,
                       on_progress: Callable[[str], None] | None = None) -> GpuRelease:
    """Wait until no process holds memory on the GPUs rewheel would use.

    `gpu_uuids` defaults to the visible GPUs (see the module docstring). Raises GpuError
    naming every pid, process name and the memory it still holds after `timeout_s`.
    """
    env = os.environ if env is None else env
    start = time.monotonic()
    deadline = start + timeout_s
    seen: dict[int, GpuProcess] = {}
    try:
        gpus = list_gpus()
        wanted = set(gpu_uuids) if gpu_uuids is not None else {
            g.uuid for g in visible_gpus(gpus, env.get("CUDA_VISIBLE_DEVICES"))}
        last_report = ""
        gaps = proc.backoff(poll_s)
        while True:
            holding = [a for a in compute_apps(gpus) if a.gpu_uuid in wanted]
            if not holding:
                return GpuRelease(seconds=time.monotonic() - start, waited_for=list(seen.values()))
            for a in holding:
                seen.setdefault(a.pid, a)
            if time.monotonic() >= deadline:
                break
            report = "; ".join(a.describe() for a in holding)
            if on_progress and report != last_report:
                on_progress(f"waiting for GPU memory to be released: {report}")
                last_report = report
            time.sleep(max(0.0, min(next(gaps), deadline - time.monotonic())))
    except NvidiaSmiUnavailable as exc:
        raise GpuError(f"cannot check that GPU memory was released: {exc.message}",
                       hint=exc.hint) from None
    pids = sorted({a.pid for a in holding})
    raise GpuError(
        f"GPU memory is still held {timeout_s:g}s after the service stopped: "
        + "; ".join(a.describe() for a in holding),
        hint=f"these processes are not part of the stopped service: end them "
             f"(`kill {' '.join(map(str, pids))}`) or raise smoke.gpu_release_timeout_s")
