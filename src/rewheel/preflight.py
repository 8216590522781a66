"""Preconditions of a run, checked before anything is touched: `rewheel check` and step 1
of `rewheel run`. Each check is data (name, ok, detail); the caller decides what fails."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rewheel.errors import RewheelError
from rewheel.recipe import Recipe, load_recipe

# A reinstall unpacks new wheels beside the old ones and the snapshot copies patched files:
# ask for this much free space (or 10% of the environment, whichever is more).
MIN_FREE_BYTES = 2 << 30


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    # A failed check: the exit code the command that meets it exits with (2 bad recipe or host,
    # 3 a person must act, 4 an interrupted run or another rewheel), and the error itself.
    exit_code: int = 0
    error: RewheelError | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "ok": self.ok, "detail": self.detail}
        if not self.ok:
            doc["exit_code"] = self.exit_code
        return doc


@dataclass
class CheckResult:
    recipe: Recipe
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def exit_code(self) -> int:
        """0, or the exit code of the gravest refusal: 4 (an interrupted run, another rewheel)
        before 3 (a record a person must look at) before 2 — what the commands exit with."""
        return max((c.exit_code for c in self.failures), default=0)

    def refusal(self, hint: str) -> RewheelError:
        """The error a command raises for these failed checks: the gravest one's own when it
        is graver than a bad recipe or host (exit 3, 4), else one PreflightError naming each."""
        from rewheel.errors import EXIT_USAGE, PreflightError

        grave = max(self.failures, key=lambda c: c.exit_code)
        if grave.exit_code > EXIT_USAGE and grave.error is not None:
            return grave.error
        return PreflightError("preflight failed: " + "; ".join(f"{c.name}: {c.detail}" for c in self.failures),
                              hint=hint)

    def to_json(self) -> dict[str, Any]:
        return {"recipe": self.recipe.source, "ok": self.ok, "exit_code": self.exit_code,
                "checks": [c.to_json() for c in self.checks]}


def _run_check(result: CheckResult, name: str, fn: Callable[[], str]) -> None:
    try:
        result.checks.append(Check(name, True, fn()))
    except RewheelError as exc:
        result.checks.append(Check(name, False, str(exc), exit_code=exc.exit_code, error=exc))


def _tree_size(path: Path, limit_files: int = 200_000) -> int:
    total = 0
    for n, (dirpath, _dirs, files) in enumerate(os.walk(path)):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
        if n > limit_files:
            break
    return total


def unwritable_folders(env: Any) -> list[Path]:  # env: environment.Environment
    """The folders a reinstall writes into (the site folders, the scripts folder) that this
    process cannot write: a read-only mount, or modes it has no power to override."""
    folders = list(dict.fromkeys([*env.site_dirs, env.scripts_dir]))
    return [f for f in folders if f.is_dir() and not os.access(f, os.W_OK)]


def writable_refusal(env: Any) -> RewheelError | None:  # env: environment.Environment
    """PreflightError (exit 2) naming the folders a reinstall could not write, or None."""
    from rewheel.errors import PreflightError

    bad = unwritable_folders(env)
    if not bad:
        return None
    return PreflightError(f"{', '.join(map(str, bad))}: not writable by this user (uid {os.geteuid()}): "
                          "the reinstall would fail there",
                          hint="run rewheel as the user that owns the environment, or make the folder "
                               "writable (a read-only mount, a root-owned site-packages); nothing was changed")


def _distributions_text(env: Any) -> str:  # env: environment.Environment
    n = len(env.distributions())
    others = env.other_site_counts()
    if not others:
        return f"{n} distributions"
    # A Debian python: apt's packages live in dist-packages folders outside its install
    # scheme; uv (and so a run) neither lists, reinstalls nor snapshots them.
    where = ", ".join(map(str, env.site_dirs))
    return (f"{n + sum(others.values())} distributions the interpreter imports: {n} where a run installs "
            f"({where}), " + ", ".join(f"{c} in {site}" for site, c in others.items())
            + " (outside its install scheme: a run leaves them alone)")


def run_checks(recipe: Recipe, *, client: httpx.Client | None = None, gpus: bool = True,
               indexes: bool = True) -> CheckResult:
    from rewheel import gpu, installer
    from rewheel.environment import Environment
    from rewheel.paths import state_home
    from rewheel.report import human_bytes

    result = CheckResult(recipe)
    env_box: dict[str, Environment] = {}
    service_box: dict[str, Any] = {}  # the service's status, for the GPU check: who holds what

    def interpreter() -> str:
        env = Environment.inspect(recipe.python)
        env_box["env"] = env
        refused = env.system_refusal(recipe)
        if refused is not None:
            raise refused
        return f"{env.kind} at {env.prefix}, Python {env.version}, {_distributions_text(env)}"

    _run_check(result, "interpreter", interpreter)

    def writable() -> str:
        env = env_box.get("env")
        if env is None:
            raise RewheelError("no environment to check")
        refused = writable_refusal(env)
        if refused is not None:
            raise refused
        return ", ".join(str(f) for f in dict.fromkeys([*env.site_dirs, env.scripts_dir]))

    _run_check(result, "writable", writable)
    _run_check(result, "uv", lambda: f"{installer.find_uv()} ({installer.uv_version()})")

    def disk() -> str:
        env = env_box.get("env")
        if env is None:
            raise RewheelError("no environment to measure")
        need = max(MIN_FREE_BYTES, _tree_size(env.prefix) // 10)
        home = recipe.store or state_home()
        probe = home if home.exists() else home.parent if home.parent.exists() else Path.home()
        free_env = shutil.disk_usage(env.prefix).free
        free_store = shutil.disk_usage(probe).free
        if min(free_env, free_store) < need:
            raise RewheelError(f"only {human_bytes(min(free_env, free_store))} free "
                               f"(environment {env.prefix}: {human_bytes(free_env)}, store {probe}: "
                               f"{human_bytes(free_store)}); need {human_bytes(need)}")
        return f"{human_bytes(free_env)} free at the environment, {human_bytes(free_store)} at the store"

    _run_check(result, "disk", disk)

    if recipe.cleanup_paths:
        def cleanup() -> str:
            # What each glob matches today, each match checked as a run checks it before moving.
            from rewheel.snapshot import cleanup_matches

            env = env_box.get("env")
            protected = [str(recipe.store or state_home())] + ([str(env.prefix)] if env is not None else [])
            parts = []
            for g in recipe.cleanup_paths:
                found = cleanup_matches([g], protected)
                shown = ", ".join(found[:5]) + (f", … {len(found) - 5} more" if len(found) > 5 else "")
                parts.append(f"{g}: {len(found)} match(es)" + (f" ({shown})" if found else ""))
            return "; ".join(parts)

        _run_check(result, "cleanup", cleanup)

    if recipe.service is not None:
        svc = recipe.service

        def service_tools() -> str:
            from rewheel import service
            from rewheel.paths import env_dir

            home = recipe.store or state_home()
            env = env_box.get("env")
            state = env_dir(home, env.prefix) if env is not None else Path(home)
            mgr = service.make_manager(svc, state, python=recipe.python)
            mgr.check()
            st = mgr.status()
            service_box["status"] = st
            # A service started outside rewheel, with no `[service] stop`: `run` could not
            # stop it (ServiceSteps.check_stoppable refuses it again at the stop).
            stoppable = getattr(mgr, "check_stoppable", None)
            if stoppable is not None:
                stoppable(st)
            return f"{mgr.describe()}: {st.state}" + (f" (pid {st.main_pid})" if st.main_pid else "")

        _run_check(result, "service", service_tools)

    smoke = recipe.smoke
    if gpus and smoke is not None and smoke.gpus > 0:
        def gpu_check() -> str:
            # A running service's processes are freed by its stop; any other holder is refused
            # here, before the service is stopped, not by the wait after the stop.
            # (None: nothing the run stops runs; empty: a service whose processes are unknown)
            st = service_box.get("status")
            pids: set[int] | None = None
            if recipe.service is not None and (st is None or st.up):
                pids = ({*st.pids, st.main_pid} - {0}) if st is not None else set()
            return gpu.check_gpus(smoke.gpus, need_free_mib=smoke.gpu_free_mib, service_pids=pids,
                                  has_service=recipe.service is not None).describe()

        _run_check(result, "gpus", gpu_check)

    if smoke is not None:
        def smoke_cmd() -> str:
            from rewheel import proc
            from rewheel.errors import PreflightError

            argv = recipe.expand(smoke.command)
            if os.sep not in argv[0] and not proc.which(argv[0]):
                raise PreflightError(f"smoke.command: {argv[0]!r} not found on PATH")
            if os.sep in argv[0] and not os.path.exists(argv[0]):
                raise PreflightError(f"smoke.command: {argv[0]} does not exist")
            return " ".join(argv)

        _run_check(result, "smoke command", smoke_cmd)

    if indexes and recipe.install.packages:
        def index_check() -> str:
            checks = installer.check_indexes(recipe, client=client)
            return "; ".join(c.summary() for c in checks) or "default index"

        _run_check(result, "indexes", index_check)
    return result


def not_interrupted(t: Any) -> str:  # t: commands.Target
    """No interrupted run waits (InterruptedRun, exit 4) and no other rewheel holds the
    environment (LockHeld, exit 4): what every command that acts refuses first."""
    from rewheel import journal
    from rewheel.errors import LockHeld
    from rewheel.status import interrupted_now, running_now

    live = running_now(t)
    if live is not None:
        raise LockHeld(f"another rewheel process holds this environment (pid {live.get('pid')}: "
                       f"{live.get('purpose')})", hint="wait for it to finish; the lock is released when it exits")
    j = interrupted_now(t)
    if j is not None:
        raise journal.interrupted_error(j, t.cli_ref)
    return "no interrupted run, no other rewheel at work"


def target_checks(result: CheckResult) -> None:
    """The refusals every command makes of its target before it acts, as checks (the one
    preflight `check` shares with the commands): the state folder (`commands.open_target`:
    never inside the environment, a file, a pseudo-filesystem; the settings it reads), the
    service's record, an interrupted run or another rewheel at work."""
    if not any(c.name == "interpreter" and c.ok for c in result.checks):
        return
    box: dict[str, Any] = {}

    def store() -> str:
        from rewheel.commands.target import open_target

        t = box["t"] = open_target(result.recipe)
        return str(t.store.env_dir)

    _run_check(result, "store", store)
    if "t" not in box:
        return
    from rewheel.commands.target import service_record

    _run_check(result, "service record", lambda: service_record(box["t"]))
    _run_check(result, "interrupted", lambda: not_interrupted(box["t"]))


def check_recipe(path: str) -> CheckResult:
    """`rewheel check`: load and validate (RecipeError → exit 2), then every precondition,
    then resolve the recipe's packages against its indexes (uv's dry run, as `run --dry-run`
    plans): a misspelled package, a version no index has, a missing `prerelease = true` fail
    here. (`run` makes the same plan itself after these checks, so it is not asked twice.)
    The target's own refusals (`target_checks`) are checked too: `check` exits with the code
    the commands would (4 for an interrupted run, 3 for a damaged record)."""
    recipe = load_recipe(path)
    result = run_checks(recipe)
    target_checks(result)
    usable = {c.name for c in result.checks if c.ok}
    if recipe.install.packages and {"interpreter", "uv"} <= usable and "indexes" in usable:
        _run_check(result, "resolve", lambda: _resolve(recipe))
    return result


def _resolve(recipe: Recipe) -> str:
    """The resolution `rewheel run` would install (resolution.resolve, in a scratch folder):
    its version changes and held-back releases; PreflightError with uv's own error lines when
    it cannot resolve, ResolutionRefused where `run` would refuse it."""
    import tempfile

    from rewheel.environment import Environment
    from rewheel.resolution import resolve

    with tempfile.TemporaryDirectory(prefix="rewheel-check-") as tmp:
        res = resolve(recipe, Environment.inspect(recipe.python), folder=Path(tmp))
    changes = [f"{c.name} {c.old or '-'} → {c.new or '-'}" for c in res.version_changes]
    resolved = f"{len(res.locked)} distribution(s) locked"
    held = "".join(f"; held back: {h.summary()}" for h in res.held_back)
    if not changes:
        return f"{resolved}; no version would change{held}"
    return (f"{resolved}; {len(changes)} would change: " + ", ".join(changes[:5])
            + (f", … {len(changes) - 5} more" if len(changes) > 5 else "") + held)
