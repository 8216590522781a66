"""The benchmark run: prepare (and cache) the environment, time each step and its baseline,
print the table and write `results.json`. See the package docstring for what is measured."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import shutil
import socket
import stat
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools import REPO
from devtools.bench import profile as prof
from rewheel import proc
from rewheel.environment import Environment
from rewheel.errors import RewheelError
from rewheel.installer import find_uv as uv_bin
from rewheel.snapshot import Store, remove_displaced, restore_snapshot, take_snapshot

DEFAULT_SCALE = 1.0  # a real vLLM environment's size: ~57,000 files, 8 GiB
DEFAULT_REPS = 5
DEFAULT_ROLLBACK_ROUNDS = 3
DEFAULT_LOG_MB = 1024
DEFAULT_STARTUP_RUNS = 15

# Targets: rewheel's time over the baseline's, in the same run.
# The store costs what changed (issue 44): the first snapshot of a host <= 2x `cp -al`; a
# snapshot of an environment unchanged since the last <= 1.5x a bare stat walk; `patches`
# <= 3x that walk; `diff` <= 2x `cp -al`; a rollback, its undo snapshot included, and its
# outage <= what a person does by hand (`cp -al` + `uv pip sync`; `uv pip sync`).
TARGETS = {"snapshot": 2.0, "snapshot unchanged": 1.5, "patch scan": 3.0, "diff": 2.0, "rollback": 1.0, "why": 3.0}
EXTRA_DISK_TARGET_PCT = 1.0
WHY_RSS_TARGET_MB = 256.0


SKIPPABLE = frozenset({"startup", "downtime", "board"})  # real mode's sections BENCH_SKIP may leave out


@dataclass
class BenchConfig:
    scale: float = DEFAULT_SCALE
    reps: int = DEFAULT_REPS
    root: Path = REPO / ".bench"
    real: bool = False  # the measure of record: a real vLLM release, the CLI timed end to end
    real_old: str = "vllm==0.32.0"
    real_new: str = "vllm==0.33.0"
    real_uv_args: tuple[str, ...] = ()  # e.g. ("--index-url", URL) for a mirror
    real_edit: tuple[str, ...] = ()  # the two files the bench edits (default: two of the story's)
    # Free disk the real mode needs before its first install: both vLLM releases in uv's cache,
    # the venv's folders and a reinstall's fresh copy. Other releases may need other sizes.
    real_disk_need: int = 30 << 30
    # A uv cache that already holds the releases (e.g. `.bench/acceptance/uv-cache`): the real
    # mode's first run hard-links it into its own cache instead of downloading them (read only).
    real_seed_cache: Path | None = None
    log_mb: float = DEFAULT_LOG_MB
    full_copy: bool = True  # also time `cp -a` (a full copy of every byte)
    rollback_rounds: int = DEFAULT_ROLLBACK_ROUNDS  # rollback-vs-uv races per repetition
    startup_runs: int = DEFAULT_STARTUP_RUNS  # runs of each start-up row (the best one is reported)
    # Which sections run: "all", "downtime" (the staged-vs-unstaged downtime section alone) or
    # "board" (the board's row alone).
    only: str = "all"
    # Real mode: sections left out (BENCH_SKIP, names separated by spaces or commas: "startup",
    # "downtime", "board"), to measure the store's rows alone; the results name them.
    skip: frozenset[str] = frozenset()
    # The board's row (devtools/bench/board.py): runs in its synthetic home (0: no row, as in
    # the tests' configs; `make bench` and `--only board` take BENCH_BOARD_RUNS, default 1,000)
    # and files in its diff (BENCH_BOARD_FILES, default 9,000).
    board_runs: int = 0
    board_files: int = 9000
    workers: int = max(1, os.cpu_count() or 1)
    say: Callable[[str], None] = field(default=lambda m: print(m, file=sys.stderr, flush=True))

    @classmethod
    def from_env(cls, **over: Any) -> BenchConfig:
        cfg = cls()
        e = os.environ
        if e.get("BENCH_SCALE"):
            cfg.scale = float(e["BENCH_SCALE"])
        if e.get("BENCH_REPS"):
            cfg.reps = int(e["BENCH_REPS"])
        if e.get("BENCH_DIR"):
            cfg.root = Path(e["BENCH_DIR"])
        cfg.real = e.get("BENCH_REAL", "") not in ("", "0")
        cfg.only = e.get("BENCH_ONLY", cfg.only)
        cfg.skip = frozenset(e.get("BENCH_SKIP", "").replace(",", " ").split())
        if cfg.skip - SKIPPABLE:
            raise SystemExit(f"BENCH_SKIP={e['BENCH_SKIP']!r}: expected names among {', '.join(sorted(SKIPPABLE))}")
        cfg.real_old = e.get("BENCH_REAL_OLD", cfg.real_old)
        cfg.real_new = e.get("BENCH_REAL_NEW", cfg.real_new)
        cfg.real_uv_args = tuple(shlex.split(e.get("BENCH_REAL_UV_ARGS", "")))
        cfg.real_edit = tuple(e.get("BENCH_REAL_EDIT", "").split())
        if e.get("BENCH_REAL_SEED_CACHE"):
            cfg.real_seed_cache = Path(e["BENCH_REAL_SEED_CACHE"])
        if e.get("BENCH_REAL_DISK_GIB"):
            cfg.real_disk_need = int(float(e["BENCH_REAL_DISK_GIB"]) * 2**30)
        if e.get("BENCH_LOG_MB"):
            cfg.log_mb = float(e["BENCH_LOG_MB"])
        if e.get("BENCH_ROLLBACK_ROUNDS"):
            cfg.rollback_rounds = max(1, int(e["BENCH_ROLLBACK_ROUNDS"]))
        if e.get("BENCH_STARTUP_RUNS"):
            cfg.startup_runs = max(1, int(e["BENCH_STARTUP_RUNS"]))
        if e.get("BENCH_FULL_COPY") == "0":
            cfg.full_copy = False
        for k, v in over.items():
            if v is not None:
                setattr(cfg, k, v)
        if cfg.real or cfg.only == "board":
            from devtools.bench.board import DIFF_FILES, RUNS

            cfg.board_runs = int(e.get("BENCH_BOARD_RUNS") or RUNS)
            cfg.board_files = int(e.get("BENCH_BOARD_FILES") or DIFF_FILES)
        if cfg.real and not e.get("BENCH_REPS") and over.get("reps") is None:
            from devtools.bench.real import DEFAULT_REAL_REPS

            cfg.reps = DEFAULT_REAL_REPS  # each repetition upgrades a real release twice over
        return cfg


@dataclass
class Row:
    step: str
    rewheel_s: float | None
    baseline: str
    baseline_s: float | None
    target: float | None  # max ratio; None: informational
    note: str = ""
    samples: list[float] = field(default_factory=list)
    baseline_samples: list[float] = field(default_factory=list)
    available: bool = True

    @property
    def ratio(self) -> float | None:
        if self.rewheel_s is None or not self.baseline_s:
            return None
        return self.rewheel_s / self.baseline_s

    @property
    def passed(self) -> bool | None:
        if not self.available or self.target is None or self.ratio is None:
            return None
        return self.ratio <= self.target

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "available": self.available, "rewheel_s": _r(self.rewheel_s),
                "baseline": self.baseline, "baseline_s": _r(self.baseline_s),
                "ratio": _r(self.ratio), "target": self.target, "pass": self.passed,
                "note": self.note, "samples": [_r(s) for s in self.samples],
                "baseline_samples": [_r(s) for s in self.baseline_samples]}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


# --------------------------------------------------------------------------------------
# Small tools
# --------------------------------------------------------------------------------------
def settle() -> None:
    """Flush dirty pages so that a timed step does not pay for the previous one's writes."""
    os.sync()


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    settle()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def stat_walk(root: str) -> int:
    """The floor of any scan: lstat every entry under root, nothing else."""
    n = 0
    stack = [root]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for de in it:
                st = de.stat(follow_symlinks=False)
                n += 1
                if stat.S_ISDIR(st.st_mode):
                    stack.append(de.path)
    return n


def fingerprint(root: str) -> dict[str, tuple]:
    """Every entry: type, mode, size and sha256 of files, symlink targets. Hashes every byte."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = p[len(root) + 1:]
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", stat.S_IMODE(st.st_mode))
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    digest = hashlib.file_digest(f, "sha256").hexdigest()
                out[rel] = ("f", stat.S_IMODE(st.st_mode), st.st_size, digest)
    return out


def first_differences(a: dict[str, tuple], b: dict[str, tuple], n: int = 5) -> list[str]:
    diffs = [f"missing {k}" for k in a if k not in b]
    diffs += [f"extra {k}" for k in b if k not in a]
    diffs += [f"differs {k}" for k in a if k in b and a[k] != b[k]]
    return diffs[:n]


def disk_usage(root: str, exclude_inodes: set[tuple[int, int]] | None = None) -> tuple[int, set[tuple[int, int]]]:
    """Allocated bytes under root, each inode once, not counting `exclude_inodes`."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames, ""] if dirpath == root else [*dirnames, *filenames]:
            p = os.path.join(dirpath, name) if name else dirpath
            st = os.lstat(p)
            key = (st.st_dev, st.st_ino)
            if key in seen or (exclude_inodes and key in exclude_inodes):
                continue
            seen.add(key)
            total += st.st_blocks * 512
    return total, seen


def check_disk(cfg: BenchConfig, need: int, what: str) -> None:
    """Refuse before writing anything when the bench folder's disk cannot hold `need`
    bytes (and 10% more): a bench that fills the disk halfway through helps no one."""
    cfg.root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cfg.root).free
    if free < need * 1.1:
        raise RewheelError(
            f"the benchmark needs about {need * 1.1 / 2**30:.1f} GiB free under {cfg.root} for {what}; "
            f"{free / 2**30:.1f} GiB is free",
            hint="free some disk, point BENCH_DIR (--dir) elsewhere, or use a smaller BENCH_SCALE (--scale), "
                 "e.g. 0.25: 2 GiB, ~7 GiB of disk")


def rm_tree(path: Path) -> None:
    if path.exists() or path.is_symlink():
        shutil.rmtree(path)


@contextmanager
def offline() -> Iterator[None]:
    """No network and no subprocess (so no uv, no package cache) while the block runs."""
    def refuse(*a: Any, **k: Any) -> Any:
        raise RuntimeError("rollback tried to use the network or start a process")
    saved = (socket.socket.connect, socket.create_connection, subprocess.Popen.__init__)
    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.create_connection = refuse  # type: ignore[assignment]
    subprocess.Popen.__init__ = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        socket.socket.connect, socket.create_connection, subprocess.Popen.__init__ = saved  # type: ignore[method-assign,assignment]


def machine_info(root: Path) -> dict[str, Any]:
    info: dict[str, Any] = {"nproc": os.cpu_count(), "python": platform.python_version(),
                            "kernel": platform.release()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()
        info["memory_gib"] = round(int(mem[1]) / (1 << 20), 1)
    except (OSError, IndexError, ValueError):
        pass
    best = ("", "", "")
    real_root = str(root.resolve())
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype = line.split()[:3]
            if (real_root == mnt or real_root.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[1]):
                best = (dev, mnt, fstype)
    except OSError:
        pass
    info["filesystem"] = best[2]
    info["device"] = best[0]
    name = os.path.basename(best[0])
    rot = Path(f"/sys/block/{name}/queue/rotational")
    if rot.exists():
        info["rotational"] = rot.read_text().strip() == "1"
    virt = Path(f"/sys/block/{name}/device/vendor")
    if name.startswith("vd"):
        info["disk"] = "virtio block device" + (" (reports rotational)" if info.get("rotational") else "")
    elif virt.exists():
        info["disk"] = virt.read_text().strip()
    try:
        info["uv"] = subprocess.run([uv_bin(), "--version"], capture_output=True, text=True).stdout.strip()
    except (OSError, RewheelError):
        pass
    return info


# --------------------------------------------------------------------------------------
# The environment under test
# --------------------------------------------------------------------------------------
@dataclass
class BenchEnv:
    kind: str  # "synthetic" | "real"
    python: Path
    prefix: Path
    work: Path  # scratch space on the same filesystem
    home: Path  # REWHEEL_HOME for the snapshots
    uv_env: dict[str, str]
    install_args: list[str]  # uv pip install ... (the upgrade)
    sync_args: list[str]  # uv pip sync ... (the baseline rollback)
    old_set: list[str]
    description: dict[str, Any]

    @property
    def site(self) -> Path:
        return next((self.prefix / "lib").glob("python3*/site-packages"))

    def uv(self, *args: str) -> proc.Completed:
        res = proc.run([uv_bin(), *args], env=self.uv_env, timeout=3600)
        if not res.ok:
            raise RewheelError(f"`uv {' '.join(args[:4])} ...` failed (exit {res.returncode}): "
                               f"{(res.stderr or res.stdout).strip()[-2000:]}")
        return res

    def upgrade(self) -> float:
        t0 = time.perf_counter()
        self.uv(*self.install_args)
        return time.perf_counter() - t0

    def sync_old(self) -> None:
        self.uv(*self.sync_args)

    def apply_patches(self) -> int:
        """The story's hand-made patches, written as editors do (new file, then rename), so
        the uv cache the files are hard-linked to stays pristine."""
        n = 0
        for rel in prof.PATCHED_FILES:
            p = self.site / rel
            if not p.exists():
                continue
            text = p.read_bytes()
            mark = b"# local patch: keep attention on rank 4 alive\n"
            if text.endswith(mark):
                continue
            tmp = p.with_name(p.name + ".rewheel-bench-tmp")
            tmp.write_bytes(text + mark)
            os.chmod(tmp, stat.S_IMODE(p.stat().st_mode))
            os.replace(tmp, p)
            n += 1
        return n

    def state_a(self) -> None:
        """The environment as it was before the upgrade: the old set, with the patches."""
        self.sync_old()
        self.apply_patches()


def _uv_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS",
                        "UV_LINK_MODE", "UV_COMPILE_BYTECODE", "UV_OFFLINE")}
    env.update({"UV_CACHE_DIR": str(root / "uv-cache"), "UV_NO_PROGRESS": "1",
                "UV_PYTHON_DOWNLOADS": "never"})
    return env


def prepare_synthetic(cfg: BenchConfig) -> BenchEnv:
    scale_tag = f"{cfg.scale:g}"
    base = cfg.root / f"synthetic-s{scale_tag}"
    wheels = base / "wheels"
    venv = base / "venv"
    stamp = base / "stamp.json"
    want = {"profile_version": prof.PROFILE_VERSION, "scale": cfg.scale,
            "python": sys.executable}
    base.mkdir(parents=True, exist_ok=True)
    dists = [prof.scaled(p, cfg.scale) for p in prof.full_profile()]
    jobs = [(s, s.profile.version, str(wheels)) for s in dists]
    jobs += [(s, s.profile.new_version, str(wheels)) for s in dists if s.profile.new_version]
    old_set = [f"{s.profile.name}=={s.profile.version}" for s in dists]
    new_set = [f"{s.profile.name}=={s.profile.new_version}" for s in dists if s.profile.new_version]
    (base / "old.txt").write_text("\n".join(old_set) + "\n")
    (base / "new.txt").write_text("\n".join(new_set) + "\n")
    uv_env = _uv_env(cfg.root)
    py = venv / "bin" / "python"
    common = ["--python", str(py), "--no-index", "--find-links", str(wheels)]
    be = BenchEnv("synthetic", py, venv, base / "scratch", base / "home", uv_env,
                  ["pip", "install", "-q", *common, "-r", str(base / "new.txt")],
                  ["pip", "sync", "-q", *common, "--offline", str(base / "old.txt")],
                  old_set, {"scale": cfg.scale, **prof.totals(cfg.scale)})
    missing = [j for j in jobs if not (wheels / prof.wheel_filename(j[0].profile.name, j[1])).exists()]
    if missing or not stamp.exists() or json.loads(stamp.read_text()) != want:
        # The wheels, uv's unpacked cache (the venv is hard-linked to it) and the `cp -a` copy.
        check_disk(cfg, (3 if cfg.full_copy else 2) * be.description["bytes"], f"a scale-{scale_tag} environment")
        if stamp.exists() and json.loads(stamp.read_text()) != want:
            rm_tree(wheels)
            rm_tree(venv)
            missing = jobs
        t0 = time.perf_counter()
        cfg.say(f"building {len(missing)} wheels ({be.description['files']} files, "
                f"{be.description['bytes'] / 2**30:.2f} GiB at scale {scale_tag}) in {wheels}")
        wheels.mkdir(parents=True, exist_ok=True)
        # Biggest first, so the pool is not left waiting on torch at the end.
        missing.sort(key=lambda j: -(j[0].small_bytes + sum(j[0].big_bytes)))
        if cfg.workers > 1 and len(missing) > 1:
            with ProcessPoolExecutor(cfg.workers) as pool:
                list(pool.map(prof.build_dist, missing))
        else:
            for j in missing:
                prof.build_dist(j)
        cfg.say(f"  wheels built in {time.perf_counter() - t0:.1f}s")
        rm_tree(venv)
        stamp.unlink(missing_ok=True)
    if not py.exists():
        t0 = time.perf_counter()
        cfg.say(f"installing {len(old_set)} distributions into {venv} with uv")
        rm_tree(venv)
        be.uv("venv", "-q", "--python", sys.executable, str(venv))
        be.uv("pip", "install", "-q", *common, "-r", str(base / "old.txt"))
        cfg.say(f"  installed in {time.perf_counter() - t0:.1f}s")
    stamp.write_text(json.dumps(want))
    return be


# --------------------------------------------------------------------------------------
# Optional modules (built concurrently; a missing one makes its row "not available")
# --------------------------------------------------------------------------------------
def _patch_scanner() -> Callable[[Environment], Any] | None:
    try:
        from rewheel import patches
    except ImportError:
        return None
    return getattr(patches, "scan", None)


def _differ() -> Callable[[Environment, Any], Any] | None:
    """A function (env, snapshot meta) -> diff of the snapshot against the live environment."""
    try:
        from rewheel import diff
    except ImportError:
        return None
    fn = getattr(diff, "diff_trees", None)
    if fn is None:
        return None
    return lambda env, snap: fn(env, snap)  # new_snap=None: against the live environment


def _log_tools() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    try:
        from devtools.bench_logs import generate_log
        from rewheel.diagnose import analyse_file
    except ImportError:
        return None
    return generate_log, analyse_file


# The child's own peak memory: VmHWM of its address space. (ru_maxrss would not do on Linux:
# it keeps the high-water mark of the process image exec replaced — the bench's own, which
# at scale 1 holds the fingerprints of 58,000 files.)
_WHY_CHILD = r"""
import json, resource, sys, time
from rewheel.diagnose import analyse_file
t0 = time.perf_counter()
d = analyse_file(sys.argv[1])
dt = time.perf_counter() - t0
rc = d.to_json().get("root_cause") if hasattr(d, "to_json") else None
try:
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
except (OSError, StopIteration, ValueError):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": dt, "maxrss_kib": peak,
                  "root_cause": (rc or {}).get("type") if isinstance(rc, dict) else None}))
"""


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------
def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    cfg.root.mkdir(parents=True, exist_ok=True)
    # In-process steps that consult uv (the patch scan's pristine sources) see the bench's cache.
    saved = os.environ.get("UV_CACHE_DIR")
    os.environ["UV_CACHE_DIR"] = str(cfg.root / "uv-cache")
    try:
        return _run(cfg)
    finally:
        if saved is None:
            os.environ.pop("UV_CACHE_DIR", None)
        else:
            os.environ["UV_CACHE_DIR"] = saved


def _run(cfg: BenchConfig) -> dict[str, Any]:
    if cfg.only == "downtime":
        return _downtime_only(cfg)
    if cfg.only == "board":
        return _board_only(cfg)
    if cfg.real:
        from devtools.bench.real import run_real

        return run_real(cfg)
    t_start = time.perf_counter()
    be = prepare_synthetic(cfg)
    t_prepared = time.perf_counter()
    rm_tree(be.home)
    rm_tree(be.work)
    be.work.mkdir(parents=True)
    be.home.mkdir(parents=True, mode=0o700)
    be.state_a()
    env = Environment.inspect(be.python)
    store = Store(env.prefix, be.home)
    scan = _patch_scanner()
    differ = _differ()

    s: dict[str, list[float]] = {k: [] for k in (
        "snapshot", "cp_al", "cp_a", "stat_walk", "scan", "hash_all", "diff", "rollback", "removal",
        "rollback_all", "uv_sync", "uv_sync_raw", "upgrade")}
    extra_disk: list[int] = []
    snap_info: dict[str, Any] = {}
    byte_exact: list[bool] = []
    restore_phases: list[dict[str, float]] = []
    lanes_used: list[int] = []
    env_files = env_bytes = env_disk = 0
    scan_found: int | None = None
    diff_info: dict[str, Any] = {}
    for rep in range(cfg.reps):
        cfg.say(f"repetition {rep + 1}/{cfg.reps}")
        be.state_a()
        env = Environment.inspect(be.python)
        prefix = str(env.prefix)
        # Hash every file: a baseline for the patch scan, and state A's fingerprint.
        dt, before = timed(lambda: fingerprint(prefix))
        s["hash_all"].append(dt)
        env_files = sum(1 for v in before.values() if v[0] == "f")
        env_bytes = sum(v[2] for v in before.values() if v[0] == "f")
        # Baselines for the snapshot: one hard link per file, and a full copy.
        dst = be.work / "cp-al"
        dt, _ = timed(lambda: subprocess.run(["cp", "-al", prefix, str(dst)], check=True))
        s["cp_al"].append(dt)
        rm_tree(dst)
        if cfg.full_copy and rep == 0:  # 20x slower than the rest: once is enough
            dst = be.work / "cp-a"
            dt, _ = timed(lambda: subprocess.run(["cp", "-a", prefix, str(dst)], check=True))
            s["cp_a"].append(dt)
            rm_tree(dst)
        dt, _ = timed(lambda: stat_walk(prefix))
        s["stat_walk"].append(dt)
        if scan is not None:
            dt, found = timed(lambda: scan(env))
            s["scan"].append(dt)
            scan_found = _count(found)
        # The snapshot itself.
        dt, res = timed(lambda: take_snapshot(env, store, label=f"bench-{rep}", status="pre-upgrade"))
        s["snapshot"].append(dt)
        env_disk, env_inodes = disk_usage(prefix)
        used, _ = disk_usage(str(res.meta.path), env_inodes)
        extra_disk.append(used)
        snap_info = {"files": res.meta.files, "files_linked": res.files_linked,
                     "files_copied": res.files_copied, "bytes_copied": res.meta.bytes_copied,
                     "link_mode": res.meta.link_mode}
        # The upgrade of a few large distributions, then the diff against the snapshot.
        settle()
        s["upgrade"].append(be.upgrade())
        env = Environment.inspect(be.python)
        if differ is not None:
            dt, d = timed(lambda: differ(env, res.meta))
            s["diff"].append(dt)
            diff_info = _diff_summary(d)
        # Rollback: byte-exact, offline, no uv, no package cache — against `uv pip sync`,
        # in rounds (upgrade, rollback, upgrade, uv sync): the two are the closest race of the
        # bench and this disk's timings move by a third between runs, so each gets more samples.
        for rnd in range(cfg.rollback_rounds):
            if rnd:
                settle()
                be.upgrade()
                env = Environment.inspect(be.python)
            with offline():
                # Timed until the environment is back, verified and synced; the failed build's
                # folders it moved out are deleted after that (in a run: once the service is up).
                dt, rr = timed(lambda: restore_snapshot(env, res.meta, defer_removal=True))
                s["removal"].append(remove_displaced(rr))
            s["rollback"].append(dt)
            s["rollback_all"].append(dt + s["removal"][-1])
            restore_phases.append(rr.phases)
            lanes_used.append(rr.lanes)
            after = fingerprint(prefix)
            exact = after == before
            byte_exact.append(exact)
            if not exact:
                cfg.say("  rollback NOT byte-exact: " + "; ".join(first_differences(before, after)))
            # The baseline: upgrade again, then `uv pip sync` of the old set from the warm cache.
            be.upgrade()
            # rewheel's restore is durable when it returns (it ends with sync(2)); the baseline
            # is timed both as uv leaves it and made equally durable.
            settle()
            t0 = time.perf_counter()
            be.sync_old()
            s["uv_sync_raw"].append(time.perf_counter() - t0)
            os.sync()
            s["uv_sync"].append(time.perf_counter() - t0)
            cfg.say(f"  rollback {s['rollback'][-1]:.2f}s (uv sync {s['uv_sync'][-1]:.2f}s)  byte-exact {exact}")
        store.delete(res.meta.id)
        cfg.say(f"  snapshot {s['snapshot'][-1]:.2f}s (cp -al {s['cp_al'][-1]:.2f}s)")
    be.state_a()

    rows = [
        Row("snapshot", _median(s["snapshot"]), "cp -al", _median(s["cp_al"]), TARGETS["snapshot"],
            samples=s["snapshot"], baseline_samples=s["cp_al"],
            note=f"{snap_info.get('files_linked', 0)} linked, {snap_info.get('files_copied', 0)} copied"),
    ]
    if cfg.full_copy:
        rows.append(Row("snapshot", _median(s["snapshot"]), "cp -a (full copy)", _median(s["cp_a"]), None,
                        samples=s["snapshot"], baseline_samples=s["cp_a"]))
    rows += [
        _opt_row("patch scan", s["scan"], "stat walk", s["stat_walk"], TARGETS["patch scan"], scan is not None,
                 f"{scan_found} patched files found" if scan_found is not None else ""),
        _opt_row("patch scan", s["scan"], "sha256 of every file", s["hash_all"], None, scan is not None),
        _opt_row("diff (snapshot vs live)", s["diff"], "cp -al", s["cp_al"], TARGETS["diff"], differ is not None,
                 ", ".join(f"{k} {v}" for k, v in diff_info.items())),
        Row("rollback", _median(s["rollback"]), "uv pip sync (warm cache) + sync", _median(s["uv_sync"]),
            TARGETS["rollback"], samples=s["rollback"], baseline_samples=s["uv_sync"],
            note=("byte-exact, offline, durable" if byte_exact and all(byte_exact) else "NOT byte-exact")
            + f"; then {_median(s['removal']) or 0:.3f}s deleting the displaced folders"
            + f"; the upgrade itself took {_median(s['upgrade']) or 0:.2f}s"),
        Row("rollback", _median(s["rollback"]), "uv pip sync (warm cache), not synced", _median(s["uv_sync_raw"]),
            None, samples=s["rollback"], baseline_samples=s["uv_sync_raw"]),
        Row("rollback + deleting displaced", _median(s["rollback_all"]), "uv pip sync (warm cache) + sync",
            _median(s["uv_sync"]), None, samples=s["rollback_all"], baseline_samples=s["uv_sync"]),
    ]
    why = bench_why(cfg)
    rows.append(why.pop("row"))
    from devtools.bench.startup import bench_startup

    startup = bench_startup(cfg, python=be.python, home=be.home)
    rows += startup["rows"]
    from devtools.bench.downtime import run_synthetic_downtime

    downtime = run_synthetic_downtime(cfg)
    rows += downtime["rows"]
    extra_med = int(statistics.median(extra_disk)) if extra_disk else 0
    extra_pct = 100.0 * extra_med / env_disk if env_disk else 0.0
    result = {
        "kind": be.kind, "environment": {**be.description, "measured_files": env_files,
                                         "measured_bytes": env_bytes, "disk_bytes": env_disk,
                                         "prefix": str(be.prefix)},
        "reps": cfg.reps, "rollback_rounds": cfg.rollback_rounds, "machine": machine_info(cfg.root),
        "rows": [r.to_json() for r in rows],
        "snapshot": {**snap_info, "extra_disk_bytes": extra_med, "extra_disk_pct": round(extra_pct, 3),
                     "extra_disk_target_pct": EXTRA_DISK_TARGET_PCT,
                     "extra_disk_pass": extra_pct <= EXTRA_DISK_TARGET_PCT},
        "rollback": {"byte_exact": bool(byte_exact) and all(byte_exact), "offline": True,
                     "lanes": max(lanes_used, default=None),  # processes the restore ran in
                     # Where the restore's time goes (medians): read the manifest, compare the
                     # tree, check the stored files it will use, put them in place, verify.
                     "phases": {k: _r(_median([p[k] for p in restore_phases if k in p]))
                                for k in (restore_phases[0] if restore_phases else {})}},
        "why": why,
        "startup": startup["startup"], "downtime": downtime["downtime"],
        "seconds": {"prepare": round(t_prepared - t_start, 1), "total": round(time.perf_counter() - t_start, 1)},
    }
    checks = [r["pass"] for r in result["rows"] if r["pass"] is not None]
    checks.append(result["snapshot"]["extra_disk_pass"])
    checks.append(result["rollback"]["byte_exact"])
    if why.get("peak_rss_mb") is not None:
        checks.append(why["rss_pass"])
    result["all_pass"] = all(checks)
    rm_tree(be.work)
    return result


def _downtime_only(cfg: BenchConfig) -> dict[str, Any]:
    """`--only downtime`: the staged-vs-unstaged section alone (synthetic, or real with --real)."""
    from devtools.bench.downtime import run_real_downtime, run_synthetic_downtime

    t0 = time.perf_counter()
    res = run_real_downtime(cfg) if cfg.real else run_synthetic_downtime(cfg)
    rows = [r.to_json() for r in res["rows"]]
    return {"kind": "downtime", "real": cfg.real, "reps": cfg.reps, "machine": machine_info(cfg.root), "rows": rows,
            "downtime": res["downtime"], "all_pass": all(r["pass"] for r in rows if r["pass"] is not None),
            "seconds": {"total": round(time.perf_counter() - t0, 1)}}


def _board_only(cfg: BenchConfig) -> dict[str, Any]:
    """`--only board`: the board's row alone (synthetic, real mode or not)."""
    from devtools.bench.board import board_row

    t0 = time.perf_counter()
    row, board = board_row(cfg)
    return {"kind": "board", "reps": cfg.reps, "machine": machine_info(cfg.root), "rows": [row.to_json()],
            "board": board, "all_pass": board["pass"], "seconds": {"total": round(time.perf_counter() - t0, 1)}}


def _opt_row(step: str, xs: list[float], baseline: str, ys: list[float], target: float | None,
             available: bool, note: str = "") -> Row:
    if not available:
        return Row(step, None, baseline, _median(ys), target, note="not available (module missing)",
                   available=False, baseline_samples=ys)
    return Row(step, _median(xs), baseline, _median(ys), target, note=note, samples=xs, baseline_samples=ys)


def _count(found: Any) -> int | None:
    for attr in ("patches", "files"):
        v = getattr(found, attr, None)
        if isinstance(v, list):
            return len(v)
    if isinstance(found, list):
        return len(found)
    return None


def _diff_summary(d: Any) -> dict[str, Any]:
    j = d.to_json() if hasattr(d, "to_json") else d
    if isinstance(j, dict):
        return {k: len(v) for k, v in j.items() if k in ("packages", "files") and isinstance(v, list)}
    return {}


def bench_why(cfg: BenchConfig) -> dict[str, Any]:
    tools = _log_tools()
    size = int(cfg.log_mb * (1 << 20))
    log = cfg.root / "logs" / f"vllm-crash-{size}.log"
    grep_s: list[float] = []
    if tools is None:
        row = Row("why", None, "grep -c Traceback", None, TARGETS["why"],
                  note="not available (rewheel.diagnose / devtools.bench_logs missing)", available=False)
        return {"row": row, "log_bytes": size, "peak_rss_mb": None}
    generate_log, _ = tools
    if not log.exists():
        cfg.say(f"generating a {cfg.log_mb:g} MiB crash log in {log}")
        log.parent.mkdir(parents=True, exist_ok=True)
        tmp = log.with_name(log.name + ".tmp")
        generate_log(tmp, size)
        os.replace(tmp, log)
    why_s: list[float] = []
    rss: list[float] = []
    root_cause = None
    # The child finds rewheel in REPO/src and devtools in REPO, whatever directory it starts in.
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO),
                                                              os.environ.get("PYTHONPATH", "")])}
    for _ in range(cfg.reps):
        dt, _ = timed(lambda: subprocess.run(["grep", "-c", "Traceback", str(log)], capture_output=True))
        grep_s.append(dt)
        settle()
        cp = subprocess.run([sys.executable, "-c", _WHY_CHILD, str(log)], capture_output=True, text=True,
                            env=child_env)
        if cp.returncode != 0:
            raise RewheelError(f"`rewheel why` on {log} failed: {cp.stderr.strip()[-2000:]}")
        out = json.loads(cp.stdout.strip().splitlines()[-1])
        why_s.append(out["seconds"])
        rss.append(out["maxrss_kib"] / 1024)
        root_cause = out.get("root_cause")
    peak = max(rss)
    row = Row("why", _median(why_s), "grep -c Traceback", _median(grep_s), TARGETS["why"],
              samples=why_s, baseline_samples=grep_s,
              note=f"{log.stat().st_size / 2**20:.0f} MiB log, peak RSS {peak:.0f} MiB, root cause {root_cause}")
    return {"row": row, "log_bytes": log.stat().st_size, "peak_rss_mb": round(peak, 1),
            "rss_target_mb": WHY_RSS_TARGET_MB, "rss_pass": peak <= WHY_RSS_TARGET_MB,
            "root_cause": root_cause}


# --------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------
def _fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def render_rows(rows: list[dict[str, Any]]) -> list[str]:
    """The table of steps: times, ratios, targets and results, in aligned columns."""
    header = ("step", "rewheel s", "baseline", "baseline s", "ratio", "target", "result")
    table = [header]
    for r in rows:
        ok = "n/a" if not r["available"] else ("-" if r["pass"] is None else ("PASS" if r["pass"] else "FAIL"))
        table.append((r["step"], _fmt_s(r["rewheel_s"]), r["baseline"], _fmt_s(r["baseline_s"]),
                      "-" if r["ratio"] is None else f"{r['ratio']:.2f}x",
                      "-" if r["target"] is None else f"<= {r['target']:g}x", ok))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    lines = []
    for i, row in enumerate(table):
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def render(result: dict[str, Any]) -> str:
    if result["kind"] == "board":
        from devtools.bench.board import board_line

        m = result["machine"]
        lines = [f"rewheel benchmarks — the board, medians of {result['reps']}",
                 f"machine: {m.get('nproc')} CPUs ({m.get('cpu', '?')}), {m.get('memory_gib', '?')} GiB RAM", ""]
        lines += render_rows(result["rows"])
        lines += ["", board_line(result["board"]), f"  {result['rows'][0]['step']}: {result['rows'][0]['note']}",
                  f"all targets: {'PASS' if result['all_pass'] else 'FAIL'}   (total {result['seconds']['total']}s)"]
        return "\n".join(lines)
    if result["kind"] == "downtime":
        lines = [f"rewheel benchmarks — downtime ({result['downtime']['stage']}), medians of {result['reps']}", ""]
        lines += render_rows(result["rows"])
        lines += [f"  {r['step']} vs {r['baseline']}: {r['note']}" for r in result["rows"] if r["note"]]
        lines.append(f"all targets: {'PASS' if result['all_pass'] else 'FAIL'}   (total {result['seconds']['total']}s)")
        return "\n".join(lines)
    if result["kind"] == "real":
        from devtools.bench.real import render_real

        return render_real(result)
    env = result["environment"]
    m = result["machine"]
    lines = [
        f"rewheel benchmarks — {result['kind']} environment"
        + (f" at scale {env['scale']:g}" if "scale" in env else "")
        + f": {env.get('distributions', '?')} distributions, {env['measured_files']} files, "
          f"{env['measured_bytes'] / 2**30:.2f} GiB; medians of {result['reps']} runs"
        + (f" (rollback: of {result['reps'] * result['rollback_rounds']} races with uv)"
           if result.get("rollback_rounds", 1) > 1 else ""),
        f"machine: {m.get('nproc')} CPUs ({m.get('cpu', '?')}), {m.get('memory_gib', '?')} GiB RAM, "
        f"{m.get('filesystem', '?')} on {m.get('disk', m.get('device', '?'))}; {m.get('uv', '')}",
        "",
    ]
    lines += render_rows(result["rows"])
    lines.append("")
    sn = result["snapshot"]
    lines.append(f"snapshot extra disk: {sn['extra_disk_bytes']:,} bytes = {sn['extra_disk_pct']:.3f}% of "
                 f"{env['disk_bytes']:,} (target <= {sn['extra_disk_target_pct']:g}%): "
                 + ("PASS" if sn["extra_disk_pass"] else "FAIL"))
    lines.append(f"rollback byte-exact and offline: {'PASS' if result['rollback']['byte_exact'] else 'FAIL'}")
    phases = result["rollback"].get("phases") or {}
    if phases:
        lanes = result["rollback"].get("lanes")
        lines.append(f"rollback phases (median s{f', {lanes} lanes' if lanes else ''}): " + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()))
    why = result["why"]
    if why.get("peak_rss_mb") is not None:
        lines.append(f"why peak memory: {why['peak_rss_mb']:.0f} MiB on a {why['log_bytes'] / 2**20:.0f} MiB log "
                     f"(target <= {why['rss_target_mb']:g} MiB): " + ("PASS" if why["rss_pass"] else "FAIL"))
    for r in result["rows"]:
        if r["note"]:
            lines.append(f"  {r['step']} vs {r['baseline']}: {r['note']}")
    lines.append(f"all targets: {'PASS' if result['all_pass'] else 'FAIL'}   "
                 f"(prepare {result['seconds']['prepare']}s, total {result['seconds']['total']}s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devtools.bench", description=__doc__)
    ap.add_argument("--scale", type=float, help=f"fraction of a full vLLM env (env BENCH_SCALE, default {DEFAULT_SCALE})")
    ap.add_argument("--reps", type=int, help=f"repetitions (env BENCH_REPS, default {DEFAULT_REPS})")
    ap.add_argument("--dir", type=Path, help="cache and scratch folder (env BENCH_DIR, default <repo>/.bench)")
    ap.add_argument("--rollback-rounds", type=int,
                    help=f"rollback-vs-uv races per repetition (env BENCH_ROLLBACK_ROUNDS, default {DEFAULT_ROLLBACK_ROUNDS})")
    ap.add_argument("--startup-runs", type=int,
                    help=f"runs of each start-up row, the best reported (env BENCH_STARTUP_RUNS, default {DEFAULT_STARTUP_RUNS})")
    ap.add_argument("--log-mb", type=float, help=f"size of the generated log (env BENCH_LOG_MB, default {DEFAULT_LOG_MB})")
    ap.add_argument("--real", action="store_true", default=None, help="a real vLLM release (env BENCH_REAL=1)")
    ap.add_argument("--no-full-copy", dest="full_copy", action="store_false", default=None,
                    help="skip the `cp -a` baseline")
    ap.add_argument("--json", type=Path, help="where to write the results (default <dir>/results.json)")
    ap.add_argument("--only", choices=("all", "downtime", "board"), default=None,
                    help="run one section: `downtime` (staged vs unstaged) or `board` (the board's row); env BENCH_ONLY")
    a = ap.parse_args(argv)
    if a.rollback_rounds is not None and a.rollback_rounds < 1:
        ap.error("--rollback-rounds must be at least 1")
    if a.startup_runs is not None and a.startup_runs < 1:
        ap.error("--startup-runs must be at least 1")
    cfg = BenchConfig.from_env(scale=a.scale, reps=a.reps, root=a.dir, log_mb=a.log_mb,
                               rollback_rounds=a.rollback_rounds, startup_runs=a.startup_runs,
                               real=a.real, full_copy=a.full_copy, only=a.only)
    try:
        result = run_bench(cfg)
    except RewheelError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 2
    out = a.json or cfg.root / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(render(result))
    print(f"\nresults written to {out}")
    return 0 if result["all_pass"] else 1
