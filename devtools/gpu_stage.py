"""The GPU check's stage (`devtools/gpu_check.py`): rewheel and uv installed from a folder of
wheels with no network, the environment under test, the local index of its builds, the model,
the recipes, and the ways to look at them (the rewheel CLI, every file's hash).

Layout of a work folder:

    uv-boot/uv           uv, taken out of its wheel (nothing else on the host has to have it)
    tools/               a virtualenv with rewheel and its dependencies, from the wheels folder
    index/<build>/       one sub-index per build of `gpucheck-knob` (base, good, oom, ...)
    env/                 the environment under test: a virtualenv made with --system-site-packages
                         over the interpreter with torch, holding gpucheck-knob
    model/               the tiny random-weight model (config.json, model.safetensors)
    gpu_smoke.py         the smoke command, beside the recipes (`devtools/gpu_smoke.py`)
    *.toml               the recipes; home/ is REWHEEL_HOME, uv-cache/ is UV_CACHE_DIR

Only the standard library and `packaging` (which transformers needs, so every host with the
model's libraries has it) are imported here; rewheel is used through its command line, the
way a user runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools import REPO, sha256_file

SMOKE_SCRIPT = Path(__file__).with_name("gpu_smoke.py")
KNOB = "gpucheck-knob"
# The builds of the environment's one upgradable package: index sub-folder -> (version, MODE).
# gpu_smoke.py's smoke reads MODE: how the build behaves on the GPU.
BUILDS: dict[str, tuple[str, str]] = {
    "base": ("1.0.0", "ok"), "good": ("1.1.0", "ok"), "oom": ("2.0.0", "oom"),
    "assert": ("3.0.0", "assert"), "hang": ("4.0.0", "hang"),
}
WHEELS_LIMIT = 64 << 20  # what one call to a lent GPU machine carries
DEFAULT_PLATFORM = "manylinux_2_17_x86_64"
CMD_TIMEOUT_S = 900
# The site folders the modules named in argv are imported from.
SITES_OF = ("import importlib, json, os, sys\n"
            "print(json.dumps(sorted({os.path.dirname(os.path.dirname(importlib.import_module(m).__file__))"
            " for m in sys.argv[1:]})))")


class StageError(Exception):
    """A prerequisite is missing or a setup step failed (the check's exit 2): says which."""


def run(argv: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str] | None = None,
        cwd: Path | None = None, timeout: float = CMD_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess[str]:
    cp = subprocess.run([str(a) for a in argv], env=dict(env) if env is not None else None, cwd=cwd,
                        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and cp.returncode != 0:
        said = (cp.stderr.strip() or cp.stdout.strip())[-1500:]
        raise StageError(f"`{' '.join(map(str, argv))}` failed (exit {cp.returncode}): {said}")
    return cp


def child_env(work: Path, cuda_visible_devices: str | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every command of the check runs with: state, caches and the model in the work
    folder, nothing inherited that could point uv at another index or an interpreter at other
    packages, Hugging Face offline, and the GPU chosen through CUDA_VISIBLE_DEVICES."""
    env = {k: v for k, v in (base if base is not None else os.environ).items()
           if not k.startswith(("UV_", "PIP_", "HF_", "TRANSFORMERS_"))
           and k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "PYTHONHOME", "REWHEEL_HOME",
                         "CUDA_VISIBLE_DEVICES")}
    env.update({"REWHEEL_HOME": str(work / "home"), "UV_CACHE_DIR": str(work / "uv-cache"),
                "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1",
                "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"})
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    return env


# --- rewheel and uv, from wheels --------------------------------------------------------------

def newest_wheel(folder: Path, project: str) -> Path | None:
    """The highest version of `project` among the wheels in `folder`."""
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

    found = []
    for w in folder.glob("*.whl"):
        try:
            name, version, _build, _tags = parse_wheel_filename(w.name)
        except InvalidWheelFilename:
            continue
        if name == canonicalize_name(project):
            found.append((version, w))
    return max(found)[1] if found else None


def build_wheels(out: Path, *, python_version: str = "3.12", platform: str = DEFAULT_PLATFORM,
                 uv: str | None = None) -> list[Path]:
    """`make gpu-wheels`: rewheel's wheel (built from this checkout), the uv this checkout uses
    and every dependency, as wheels for `platform`, in `out` (needs the network once)."""
    uv = uv or shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rewheel-*.whl"):
        old.unlink()
    run([uv, "build", "--wheel", "--out-dir", out, REPO])
    wheel = newest_wheel(out, "rewheel")
    if wheel is None:
        raise StageError(f"`uv build` left no rewheel wheel in {out}")
    uv_version = run([uv, "--version"]).stdout.split()[1]
    run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--only-binary=:all:", "--platform", platform, "--python-version", python_version,
         "--implementation", "cp", "--dest", out, str(wheel), f"uv=={uv_version}"])
    return sorted(out.glob("*.whl"))


@dataclass(frozen=True)
class Tools:
    rewheel: str
    uv: str
    how: str


def install_tools(wheels: Path, work: Path, env: Mapping[str, str]) -> Tools:
    """rewheel and uv in `work/tools`, installed from `wheels` with no network and no index:
    uv comes out of its own wheel first (no pip needed), then installs the rest."""
    uv_wheel, rewheel_wheel = newest_wheel(wheels, "uv"), newest_wheel(wheels, "rewheel")
    if uv_wheel is None or rewheel_wheel is None:
        missing = " and ".join(n for n, w in (("rewheel", rewheel_wheel), ("uv", uv_wheel)) if w is None)
        raise StageError(f"no {missing} wheel in {wheels}: run `make gpu-wheels` where there is a "
                         f"network (it fills {REPO.name}/.gpu-wheels) and bring that folder along, or "
                         "give --rewheel PATH for a rewheel already installed")
    boot = work / "uv-boot" / "uv"
    boot.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(uv_wheel) as zf:
        member = next((n for n in zf.namelist() if n.endswith(".data/scripts/uv")), None)
        if member is None:
            raise StageError(f"{uv_wheel.name} holds no uv executable (a wheel for another platform?)")
        boot.write_bytes(zf.read(member))
    boot.chmod(0o755)
    tools = work / "tools"
    run([boot, "venv", "-q", "--python", sys.executable, tools], env=env)
    run([boot, "pip", "install", "-q", "--python", tools / "bin" / "python", "--offline", "--no-index",
         "--find-links", wheels, "rewheel"], env=env)
    return Tools(rewheel=str(tools / "bin" / "rewheel"), uv=str(tools / "bin" / "uv"),
                 how=f"installed offline from {rewheel_wheel.name} and {uv_wheel.name}")


def given_tools(rewheel: str) -> Tools:
    """A rewheel already installed (`--rewheel PATH`), with the uv beside it or on PATH."""
    exe = os.path.abspath(shutil.which(rewheel) or rewheel)
    if not os.access(exe, os.X_OK):
        raise StageError(f"--rewheel {rewheel}: not an executable")
    beside = Path(exe).with_name("uv")
    uv = str(beside) if os.access(beside, os.X_OK) else shutil.which("uv")
    if uv is None:
        raise StageError(f"no uv beside {exe} or on PATH")
    return Tools(rewheel=exe, uv=uv, how=f"given: {exe}")


# --- the environment under test ----------------------------------------------------------------

def knob_wheels(index: Path) -> None:
    from devtools.wheelbuild import build_wheel

    for sub, (version, mode) in BUILDS.items():
        build_wheel(index / sub, KNOB, version,
                    {"gpucheck_knob/__init__.py": f'"""The GPU check\'s build switch."""\n'
                                                  f'__version__ = "{version}"\nMODE = "{mode}"\n'},
                    summary=f"rewheel's GPU check: a build whose smoke test does '{mode}'")


def make_env(work: Path, base_python: str, index_url: str, tools: Tools, env: Mapping[str, str],
             *, needs: Sequence[str] = ()) -> tuple[Path, str]:
    """`work/env`: a virtualenv made with --system-site-packages over `base_python`, holding
    gpucheck-knob 1.0.0. Where the modules in `needs` (torch, transformers) live in a virtualenv
    of their own (invisible to --system-site-packages), a .pth file adds that site folder.
    Returns (its interpreter, how `needs` are reached)."""
    prefix = work / "env"
    run([tools.uv, "venv", "-q", "--system-site-packages", "--python", base_python, prefix], env=env)
    py = prefix / "bin" / "python"
    run([tools.uv, "pip", "install", "-q", "--python", py, "--index-url", index_url,
         f"{KNOB}=={BUILDS['base'][0]}"], env=env)
    how = "the base interpreter's site-packages (--system-site-packages)"
    if needs and run([py, "-c", f"import {', '.join(needs)}"], env=env, check=False).returncode != 0:
        where = run([base_python, "-c", SITES_OF, *needs], env=env, check=False)
        if where.returncode != 0:
            raise StageError(f"{base_python} cannot import {', '.join(needs)}: {where.stderr.strip()[-500:]}")
        sites = json.loads(where.stdout)
        site = next(prefix.glob("lib/python3*/site-packages"))
        (site / "_gpu_check_host.pth").write_text("".join(s + "\n" for s in sites))
        run([py, "-c", f"import {', '.join(needs)}"], env=env)
        how = f"a .pth file naming {', '.join(sites)} ({base_python} is a virtualenv itself)"
    return py, how


def recipe_text(*, name: str, python: Path, index_url: str, backend: str, timeout_s: int,
                gpus: int = 1, free_mib: int = 0) -> str:
    """A recipe for the environment under test: upgrade gpucheck-knob from one build's index,
    the model-init smoke on `gpus` GPU(s). (JSON strings are TOML basic strings.)"""
    command = ["{python}", "gpu_smoke.py", "--backend", backend, "smoke", "--model", "model"]
    return (f"name = {json.dumps(name)}\n\n[environment]\npython = {json.dumps(str(python))}\n\n"
            f"[install]\npackages = [{json.dumps(KNOB)}]\nindex_url = {json.dumps(index_url)}\n"
            f'reinstall = "named"\n\n[smoke]\ncommand = {json.dumps(command)}\n'
            f"timeout_s = {timeout_s}\ngpus = {gpus}\ngpu_free_mib = {free_mib}\n")


# --- looking at it ------------------------------------------------------------------------------

def tree_hashes(root: Path) -> dict[str, str]:
    """Every entry under `root`: relative path -> kind, mode and sha256 (files) or target (links)."""
    out: dict[str, str] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            mode = oct(stat.S_IMODE(st.st_mode))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = f"link {mode} -> {os.readlink(p)}"
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = f"dir {mode}"
            else:
                out[rel] = f"file {mode} {sha256_file(p)}"
    return out


def tree_changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """Paths whose entry differs (added, removed, or other bytes, mode or target), sorted."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def is_bytecode(rel: str) -> bool:
    """A byte-compiled cache (which the spec lets a restore rebuild)."""
    parts = Path(rel).parts
    return "__pycache__" in parts and (rel.endswith(".pyc") or parts[-1] == "__pycache__")


def smoke_facts(text: str) -> dict[str, dict[str, Any]]:
    """The `gpu_smoke: WORD {json}` facts in gpu_smoke.py's output, by WORD (the last of each)."""
    facts: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.startswith("gpu_smoke: "):
            word, _, rest = line[len("gpu_smoke: "):].partition(" ")
            try:
                facts[word] = json.loads(rest)
            except json.JSONDecodeError:
                continue
    return facts


def read_until(p: subprocess.Popen[str], marker: str, *, timeout_s: float) -> list[str]:
    """Lines `p` prints until one starts with `marker`, it exits, or `timeout_s` passes (read
    from the pipe's descriptor: a buffered reader could hold the marker while select waits)."""
    import selectors
    import time

    assert p.stdout is not None
    fd = p.stdout.fileno()
    said: list[str] = []
    pending = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            said += [line.decode(errors="replace") + "\n" for line in lines]
            if any(line.startswith(marker) for line in said):
                break
    return said


@dataclass
class Answer:
    """One rewheel command: its exit status, its JSON document, what it said on stderr."""

    argv: list[str]
    returncode: int
    doc: dict[str, Any]
    stderr: str
    seconds: float


def rewheel(tools: Tools, env: Mapping[str, str], *args: str, cwd: Path | None = None) -> Answer:
    import time

    t = time.monotonic()
    cp = run([tools.rewheel, *args, "--json"], env=env, cwd=cwd, check=False)
    try:
        doc = json.loads(cp.stdout) if cp.stdout.strip() else {}
    except json.JSONDecodeError:
        doc = {"unparsed_stdout": cp.stdout[-2000:]}
    return Answer(["rewheel", *args, "--json"], cp.returncode, doc, cp.stderr, time.monotonic() - t)
