"""Staged upgrades: the new build resolved, fetched, built and pre-checked beside the live
environment while the service still serves, and the prepared state a swap installs offline
from uv's cache ([run-cycle.md](../../docs/run-cycle.md), "Staged upgrades").

`build` is what the host does (the `Host.prepare` seam): in a throwaway `uv venv` (the
recipe's interpreter, so the same Python) it installs a lock — the run's one resolution
(`resolution.resolve`, the plan the operator saw) or a `--lock FILE` — which brings every wheel
into uv's cache, and runs the CPU part of the check there: the recipe's packages imported, `uv
pip check`, the recipe's `[smoke] precheck`. With `offline` it only rebuilds from the cache:
the honest proof, for `run --prepared`, that every wheel is still there (uv's `--dry-run` says
"would download" without looking).

The prepared state lives in the target's state folder, `<env>/prepared/`:
  pylock.toml     the exact set the swap installs
  prepared.json   what it was prepared from (the recipe's sha256, the live environment's
                  distributions fingerprint, uv's version and UV_* settings), the versions,
                  the changes and the checks; written last: a folder without it is unfinished
  logs/           one log per step
It is made in `<env>/prepared.new/` (with the throwaway environment in `work/`) and renamed
into place once complete; a killed prepare leaves only that folder, which the next one removes.
Nothing here writes into the live environment.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewheel import proc
from rewheel.errors import InstallError, PreparedStale, RewheelError
from rewheel.snapshot.tree import UNSHARE_SUFFIX

if TYPE_CHECKING:
    from rewheel.environment import Environment
    from rewheel.recipe import Recipe

Say = Callable[[str], None]
PREPARED = "prepared"
CHECK_TIMEOUT_S = 600.0
# uv settings that change what a resolution or an install means; a prepared lock made under
# others is stale. (Values are hashed, never stored: some carry index credentials.)
_UV_SETTINGS = ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX", "UV_FIND_LINKS",
                "UV_CACHE_DIR", "UV_PRERELEASE", "UV_TORCH_BACKEND", "UV_CONSTRAINT", "UV_OVERRIDE")
# Imports every upgraded package; a traceback for each that fails (diagnose reads them).
_IMPORTS = """\
import importlib, sys, traceback
failed = 0
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        print(f"import {name}: ok", flush=True)
    except BaseException:
        traceback.print_exc()
        failed = 1
sys.exit(failed)
"""


@dataclass
class PrepCheck:
    """One step of a prepare: "resolve", "build", "imports", "dependencies", "precheck"."""

    name: str
    ok: bool
    seconds: float = 0.0
    detail: str = ""
    log: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 3)}


@dataclass
class Build:
    """What `build` made of an upgrade: the lock, the throwaway environment's versions and
    distributions (for the diff of what the swap would change), each check, the first failed."""

    ok: bool
    lock: str
    versions: dict[str, str] = field(default_factory=dict)
    distributions: list[dict[str, Any]] = field(default_factory=list)
    checks: list[PrepCheck] = field(default_factory=list)
    # The top-level package a failing check's traceback is read for (diagnosis).
    package: str | None = None

    @property
    def failed(self) -> PrepCheck | None:
        return next((c for c in self.checks if not c.ok), None)

    def moved(self, old: Path, new: Path) -> None:
        """Its files now live under `new` instead of `old`."""
        def move(p: str | None) -> str | None:
            if p is None or not p.startswith(str(old)):
                return p
            return str(new) + p[len(str(old)):]
        self.lock = move(self.lock) or self.lock
        for c in self.checks:
            c.log = move(c.log)


@dataclass
class Prepared:
    """The prepared state (prepared.json): what a later `run --prepared` swaps in, and what it
    was prepared from (the keys `check_fresh` compares)."""

    created: float
    recipe: str
    recipe_sha256: str
    env_fingerprint: str
    uv_settings: str
    uv_version: str
    source: str  # "resolved" | "lock FILE"
    lock: str
    reinstall: str
    before: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)
    checks: list[PrepCheck] = field(default_factory=list)
    folder: str = ""
    # The live environment's import name of the upgraded package (for diagnosis).
    package: str | None = None
    # Whether every check passed (a rejected build's record says false; only a passing one is saved).
    ok: bool = True

    def moved(self, old: Path, new: Path) -> None:
        """Its folder now lives at `new` instead of `old` (a swap keeps it with its run)."""
        def move(p: str | None) -> str | None:
            return str(new) + p[len(str(old)):] if p and p.startswith(str(old)) else p
        self.folder = move(self.folder) or self.folder
        self.lock = move(self.lock) or self.lock
        for c in self.checks:
            c.log = move(c.log)

    @property
    def created_iso(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.created))

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["checks"] = [c.to_json() for c in self.checks]
        doc["created_iso"] = self.created_iso
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> Prepared:
        """The record `save` wrote; ValueError naming the field when it is not (a field missing
        or of the wrong type, a time no clock has, versions that are not strings): checked
        before any of it is used, so a tampered file is refused, never an internal error."""
        problem = _prepared_problem(doc)
        if problem is not None:
            raise ValueError(problem)
        doc = {k: v for k, v in doc.items() if k in cls.__dataclass_fields__}
        doc["checks"] = [PrepCheck(**{k: v for k, v in c.items() if k in PrepCheck.__dataclass_fields__})
                         for c in doc.get("checks", [])]
        return cls(**doc)


_PREPARED_STR = ("recipe", "recipe_sha256", "env_fingerprint", "uv_settings", "uv_version", "source", "lock",
                 "reinstall")


def _prepared_problem(doc: Any) -> str | None:
    """What makes a prepared.json not one `save` wrote, or None."""
    import math

    if not isinstance(doc, dict):
        return f"holds {type(doc).__name__}, not a JSON object"
    created: Any = doc.get("created")
    if type(created) not in (int, float) or not (math.isfinite(created) and 0 <= created < 1e11):
        return f"created = {str(created)[:40]!r} is not a moment"
    for key in _PREPARED_STR:
        if type(doc.get(key)) is not str:
            return f"{key} is {type(doc.get(key)).__name__}, not a string"
    for key in ("folder", "package"):
        if doc.get(key) is not None and type(doc[key]) is not str:
            return f"{key} is {type(doc[key]).__name__}, not a string"
    for key in ("before", "after"):
        v = doc.get(key, {})
        if not (isinstance(v, dict) and all(type(a) is str and type(b) is str for a, b in v.items())):
            return f"{key} is not a map of distributions to versions"
    if type(doc.get("ok", True)) is not bool:
        return "ok is not true or false"
    checks = doc.get("checks", [])
    if not isinstance(checks, list):
        return "checks is not a list"
    for c in checks:
        if not (isinstance(c, dict) and type(c.get("name")) is str and type(c.get("ok")) is bool
                and type(c.get("seconds", 0.0)) in (int, float) and math.isfinite(c.get("seconds", 0.0))
                and type(c.get("detail", "")) is str and (c.get("log") is None or type(c["log"]) is str)):
            return "a check is not a name, ok, seconds, detail and log"
    return None


# --- what a prepared lock was made from ------------------------------------------------------

def recipe_digest(recipe: Recipe) -> str:
    """sha256 of the recipe file's bytes (of its parsed form for a bare `--python` target)."""
    if recipe.path is not None and Path(recipe.path).is_file():
        return hashlib.sha256(Path(recipe.path).read_bytes()).hexdigest()
    return hashlib.sha256(repr(recipe).encode()).hexdigest()


def env_fingerprint(env: Environment) -> str:
    """sha256 over every installed distribution: name, version, and its RECORD's bytes (an
    install, removal or reinstall of any of them changes it)."""
    h = hashlib.sha256()
    for d in sorted(env.distributions(), key=lambda d: d.name):
        try:
            record = (d.dist_info / "RECORD").read_bytes()
        except OSError:
            record = b""
        h.update(f"{d.name}=={d.version_text}\0{d.dist_info.name}\0".encode())
        h.update(hashlib.sha256(record).digest())
    return h.hexdigest()


def uv_settings() -> str:
    """sha256 of the UV_* settings that change a resolution or an install."""
    doc = {k: os.environ.get(k) for k in _UV_SETTINGS}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


# --- the build (the real `Host.prepare`) -------------------------------------------------------

def _step(checks: list[PrepCheck], name: str, fn: Callable[[], str], log: Path | None, say: Say) -> bool:
    say(f"   prepare: {name}")
    t0 = time.monotonic()
    try:
        detail = fn()
        ok = True
    except _CheckFailed as exc:
        detail, ok = exc.detail, False
    except RewheelError as exc:
        detail, ok = exc.message, False
    checks.append(PrepCheck(name, ok, time.monotonic() - t0, detail, str(log) if log else None))
    if not ok:
        say(f"   prepare: {name} FAILED: {detail.splitlines()[0] if detail else ''}")
    return ok


class _CheckFailed(Exception):
    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def _cpu_env() -> dict[str, str]:
    """The environment of a pre-check: no GPU (the service still holds them)."""
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _tail(cp: proc.Completed, n: int = 12) -> str:
    from rewheel.installer import redact

    lines = [redact(line) for line in cp.stdout.splitlines() if line.strip()]
    return "\n".join(lines[-n:])


def build(recipe: Recipe, env: Environment, *, folder: Path, lock: Path,
          offline: bool = False, checks: bool = True, on_line: Say | None = None,
          say: Say | None = None) -> Build:
    """Build `lock` (the upgrade of `env` per `recipe`) in a throwaway environment under
    `folder/work` (removed at the end) and check it on the CPU; logs in `folder/logs`, the lock
    copied to `folder/pylock.toml`. `offline`: from uv's cache only. `checks=False`: only the
    build. A failing step is a result (`Build.ok` false, the step in `checks`), never an
    exception; setup problems (no interpreter) raise."""
    from rewheel import nightly
    from rewheel.environment import Environment
    from rewheel.installer import install, usable_lock

    say = say or (lambda _: None)
    logs = folder / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    work = folder / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    out = folder / "pylock.toml"
    result = Build(ok=False, lock=str(out))
    try:
        python = nightly.make_venv(recipe, work / "env")
        scoped = nightly.scoped_recipe(recipe, python)
        if not any(a.split("=", 1)[0] == "--link-mode" for a in scoped.install.uv_args):
            # Links into uv's cache: the throwaway copy of a vLLM environment costs no disk.
            scoped = replace(scoped, install=replace(scoped.install,
                                                     uv_args=(*scoped.install.uv_args, "--link-mode", "hardlink")))

        def resolve() -> str:
            if Path(lock).resolve() != out.resolve():
                with usable_lock(lock) as usable:
                    shutil.copyfile(usable, out)
            return f"the lock {lock}: {len(nightly.read_lock(out))} package(s)"

        def make() -> str:
            try:
                res = install(scoped, lock=out, on_line=on_line, log_path=logs / "build.log", offline=offline)
            except InstallError as exc:
                raise _CheckFailed(exc.message) from None
            new = Environment.inspect(python)
            result.versions = new.versions()
            result.distributions = [d.to_json() for d in new.distributions()]
            result.package = new.import_name(recipe.install.names)
            return f"{len(result.versions)} distribution(s) in {res.seconds:.1f}s" + \
                   (" offline from uv's cache" if offline else "")

        steps: list[tuple[str, Callable[[], str], Path | None]] = [
            ("resolve", resolve, logs / "resolve.log" if (logs / "resolve.log").is_file() else None),
            ("build", make, logs / "build.log")]
        if checks:
            steps += [("imports", lambda: _imports(recipe, python, logs / "imports.log", on_line), logs / "imports.log"),
                      ("dependencies", lambda: _dependencies(python, logs / "dependencies.log"),
                       logs / "dependencies.log")]
            if recipe.smoke is not None and recipe.smoke.precheck:
                steps.append(("precheck", lambda: _precheck(recipe, python, logs / "precheck.log", on_line),
                              logs / "precheck.log"))
        for name, fn, log in steps:
            if not _step(result.checks, name, fn, log, say):
                return result
        result.ok = True
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _imports(recipe: Recipe, python: Path, log: Path, on_line: Say | None) -> str:
    from rewheel.environment import Environment

    new = Environment.inspect(python)
    names = list(dict.fromkeys(n for n in (new.import_name([d]) for d in recipe.install.names) if n))
    if not names:
        return "nothing to import"
    cp = proc.stream([str(python), "-c", _IMPORTS, *names], on_line=on_line, timeout=CHECK_TIMEOUT_S,
                     env=_cpu_env(), cwd=log.parent, log_path=log)
    if cp.timed_out:
        raise _CheckFailed(f"importing {', '.join(names)} did not finish within {CHECK_TIMEOUT_S:g}s")
    if cp.returncode != 0:
        raise _CheckFailed(f"importing {', '.join(names)} failed (exit {cp.returncode}):\n{_tail(cp)}")
    return "imported " + ", ".join(names)


def _dependencies(python: Path, log: Path) -> str:
    from rewheel.installer import find_uv

    cp = proc.stream([find_uv(), "pip", "check", "--python", str(python), "--no-progress", "--color", "never"],
                     timeout=CHECK_TIMEOUT_S, log_path=log)
    if cp.returncode != 0 or cp.timed_out:
        raise _CheckFailed(f"the dependencies are inconsistent (`uv pip check`, exit {cp.returncode}):\n{_tail(cp)}")
    return "consistent (uv pip check)"


def _precheck(recipe: Recipe, python: Path, log: Path, on_line: Say | None) -> str:
    from rewheel.smoke import run_smoke

    assert recipe.smoke is not None
    # The recipe's smoke runner (its own process group, the timeout, the log), on the precheck.
    aimed = replace(recipe, python=python, smoke=replace(recipe.smoke, command=recipe.smoke.precheck, gpus=0))
    res = run_smoke(aimed, log_path=log, on_line=on_line, env=_cpu_env())
    if not res.ok:
        why = f"timed out after {res.timeout_s:g}s" if res.timed_out else f"exited {res.returncode}"
        raise _CheckFailed(f"the precheck {why}: {' '.join(res.argv)}")
    return f"passed in {res.seconds:.1f}s: {' '.join(res.argv)}"


# --- the prepared state --------------------------------------------------------------------------

def folder(env_dir: Path) -> Path:
    return env_dir / PREPARED


def new_folder(env_dir: Path) -> Path:
    """A fresh `prepared.new/`: what a killed prepare left there is removed first."""
    d = env_dir / f"{PREPARED}.new"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True, mode=0o700)
    return d


def save(env_dir: Path, new: Path, prepared: Prepared) -> Prepared:
    """Make `new` (a finished prepare's folder) the prepared state, replacing any older one:
    prepared.json written last, then the folder renamed into place."""
    from rewheel.paths import atomic_write

    final = folder(env_dir)
    old = env_dir / f"{PREPARED}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    prepared.folder = str(final)
    prepared.lock = str(final / Path(prepared.lock).name)
    for c in prepared.checks:
        if c.log and c.log.startswith(str(new)):
            c.log = str(final) + c.log[len(str(new)):]
    atomic_write(new / "prepared.json", json.dumps(prepared.to_json(), indent=1))
    new.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return prepared


def load(env_dir: Path) -> Prepared | None:
    """The prepared state, or None when nothing is prepared. One that is not what `save`
    wrote (not JSON, nested too deeply, a field of the wrong type) is refused: PreparedStale
    (exit 2) naming the file and the field — prepare again; nothing was changed."""
    from rewheel.errors import PreparedStale

    path = folder(env_dir) / "prepared.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        problem = f"cannot be read ({getattr(exc, 'strerror', None) or exc})"
    else:
        try:
            return Prepared.from_json(json.loads(text))
        except RecursionError:
            problem = "is nested too deeply"
        except (ValueError, TypeError) as exc:
            problem = str(exc)
    raise PreparedStale(f"{path}: {problem}: not a prepared upgrade rewheel wrote",
                        hint="`rewheel run RECIPE --prepare-only` prepares the upgrade again (and replaces it); "
                             "nothing was changed")


def discard(env_dir: Path, keep_in: Path | None = None) -> Path | None:
    """The prepared state is used up (a swap installed it): moved into `keep_in` (the run's
    folder, so that its lock and logs stay with the run; returns where), or removed."""
    d = folder(env_dir)
    if not d.exists():
        return None
    if keep_in is not None:
        try:
            d.rename(keep_in / PREPARED)
            return keep_in / PREPARED
        except OSError:
            pass
    shutil.rmtree(d, ignore_errors=True)
    return None


def stale_reasons(prepared: Prepared, recipe: Recipe, env: Environment, *,
                  uv_now: Callable[[], str] | None = None) -> list[str]:
    """Why a prepared lock no longer fits (empty: it does): the recipe, the live
    environment, or uv's settings changed since it was prepared."""
    from rewheel.installer import uv_version

    uv_now = uv_now or uv_version
    why = []
    if prepared.recipe_sha256 != recipe_digest(recipe):
        why.append(f"the recipe {recipe.source} changed since {prepared.created_iso}")
    if prepared.env_fingerprint != env_fingerprint(env):
        why.append(f"the live environment {env.prefix} changed since {prepared.created_iso} "
                   "(a distribution was installed, removed or reinstalled)")
    if prepared.uv_settings != uv_settings():
        why.append("uv's settings (UV_* variables: indexes, cache) changed since it was prepared")
    now = uv_now()
    if prepared.uv_version != now:
        why.append(f"uv changed ({prepared.uv_version} then, {now} now)")
    return why


def planned_swap(prepared: Prepared, recipe: Recipe) -> Any:  # installer.InstallPlan
    """The plan of a swap: what the prepared lock changes against the versions it was prepared
    from (the live environment's, which `stale_reasons` proved unchanged)."""
    from rewheel.installer import InstallPlan, PlannedChange

    names = sorted(set(prepared.before) | set(prepared.after))
    again = recipe.install.reinstall == "all"
    changes = [PlannedChange(n, prepared.before.get(n), prepared.after.get(n)) for n in names
               if prepared.before.get(n) != prepared.after.get(n) or (again and n in prepared.after)]
    argv = ["uv", "pip", "sync" if prepared.source.startswith("lock ") else "install", "--offline",
            "--python", str(recipe.python), "-r", prepared.lock]
    return InstallPlan(argv=argv, changes=changes, resolved=len(prepared.after), lock=prepared.lock)


def refuse_stale(reasons: list[str], cli_ref: str) -> None:
    if reasons:
        raise PreparedStale("the prepared upgrade is stale: " + "; ".join(reasons),
                            hint=f"prepare it again: `rewheel run {cli_ref} --prepare-only` (or a plain "
                                 f"`rewheel run {cli_ref}`, which prepares and swaps); nothing was changed")


def unshare(env: Environment, since_ns: int) -> tuple[int, int]:
    """Give the files a swap hard-linked from uv's cache inodes of their own again: each file
    of a distribution installed at or after `since_ns` (its RECORD's mtime) that has more than
    one link is copied beside itself and renamed over it (same bytes, mode and mtime; a running
    service keeps the inode it opened). Returns (files, bytes). Run once the service answers:
    the swap links (seconds) instead of copying (a minute for torch and the CUDA libraries),
    and this restores the independence of the environment and the cache — a patch written in
    place later, into a source or a binary (`patchelf`), must not change the cached wheel,
    one of the sources rewheel recovers damaged snapshot bytes from — outside the downtime.
    Every file, not only the hand-editable ones snapshots copy (`hand_editable`): a binary
    may stay one inode with a snapshot, whose damage `verify` finds and recovery repairs from
    uv's cache, but not with that cache itself."""
    files = size = 0
    for d in env.distributions():
        if d.install_time_ns < since_ns:
            continue
        for e in d.record:
            path = Path(e.path)
            try:
                st = path.lstat()
            except OSError:
                continue
            tmp = path.with_name(f".{path.name}{UNSHARE_SUFFIX}")
            if os.path.lexists(tmp):
                # Left by an unshare that was killed (or failed) between its copy and rename:
                # never a file of the environment's own.
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
                continue
            try:
                shutil.copy2(path, tmp)
                os.replace(tmp, path)
            except OSError:
                tmp.unlink(missing_ok=True)
                continue
            files += 1
            size += st.st_size
    return files, size

