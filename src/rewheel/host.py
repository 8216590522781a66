"""The host's moving parts the run cycle acts through, gathered in one object.

`Host` owns the seam between the cycle (`commands`) and everything that starts a process or
talks to the network: the service manager and its health check, the preflight checks, the
installer (uv), the staged build and its pre-checks, the smoke runner, the index fetcher
that unpacks pristine wheels, and the GPU probe. `commands.open_target` builds the real one; the unit tests hand the cycle a host
of in-memory fakes and test every failure path without a process.

The real collaborators are imported when first called, not when this module is: every
command imports `commands`, and `rollback` starts in a tenth of a second only because httpx,
uv's plumbing and the service code stay unimported until they are needed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rewheel.environment import Environment
    from rewheel.installer import InstallPlan, InstallResult
    from rewheel.preflight import CheckResult
    from rewheel.recipe import Recipe, ServiceSpec
    from rewheel.resolution import Resolution
    from rewheel.service import HealthResult, ServiceManager
    from rewheel.smoke import SmokeResult
    from rewheel.staging import Build


def _checks(recipe: Recipe, *, client: Any = None, indexes: bool = True) -> CheckResult:
    from rewheel import preflight

    return preflight.run_checks(recipe, client=client, indexes=indexes)


def _prepare(recipe: Recipe, env: Environment, **kw: Any) -> Build:
    from rewheel import staging

    return staging.build(recipe, env, **kw)


def _resolve(recipe: Recipe, env: Environment, **kw: Any) -> Resolution:
    from rewheel import resolution

    return resolution.resolve(recipe, env, **kw)


def _plan(recipe: Recipe, *, lock: Path | None = None) -> InstallPlan:
    from rewheel import installer

    return installer.plan(recipe, lock=lock)


def _install(recipe: Recipe, **kw: Any) -> InstallResult:
    from rewheel import installer

    return installer.install(recipe, **kw)


def _smoke(recipe: Recipe, *, log_path: Path, on_line: Callable[[str], None] | None = None) -> SmokeResult:
    from rewheel.smoke import run_smoke

    return run_smoke(recipe, log_path=log_path, on_line=on_line)


def _uv_version() -> str:
    from rewheel import installer

    return installer.uv_version()


def _clean_cache(names: list[str]) -> Any:
    from rewheel import patches

    return patches.clean_uv_cache_for(names)


def _fetcher(recipe: Recipe) -> Any:
    from rewheel import patches

    return patches.UvIndexFetcher.for_recipe(recipe)


def _manager(spec: ServiceSpec, state_dir: Path, python: Path | str | None) -> ServiceManager:
    from rewheel import service

    return service.make_manager(spec, state_dir, python=python)


def _wait_ready(manager: ServiceManager, spec: ServiceSpec, *, client: Any = None, started_at: float,
                on_progress: Callable[[str], None] | None = None) -> HealthResult:
    from rewheel import service

    return service.wait_ready(manager, spec, client=client, started_at=started_at, on_progress=on_progress)


def _gpus_released(timeout_s: float) -> Any:
    from rewheel import gpu

    return gpu.wait_gpus_released(timeout_s)


@dataclass
class Host:
    """What the cycle, rollback, resume and smoke act through. Each field has the signature
    of the real function it stands for (named in its comment); a fake need only honour that.
    `wait_ready` raises `service.HealthCheckFailed` for an unhealthy service, `install`
    raises `InstallError`, `smoke` never raises (its result says how the command ended)."""

    checks: Callable[..., CheckResult] = _checks  # preflight.run_checks(recipe, client=, indexes=)
    # resolution.resolve(recipe, env, folder=, on_line=, say=): the upgrade's one resolution
    # (its lock and plan); `plan` only for a run given `--lock FILE` (uv's dry run of the sync).
    resolve: Callable[..., Resolution] = _resolve
    plan: Callable[..., InstallPlan] = _plan  # installer.plan(recipe, lock=)
    install: Callable[..., InstallResult] = _install  # installer.install(recipe, lock=, on_line=, ...)
    smoke: Callable[..., SmokeResult] = _smoke  # smoke.run_smoke(recipe, log_path=, on_line=)
    fetcher: Callable[[Recipe], Any] = _fetcher  # patches.UvIndexFetcher.for_recipe(recipe)
    manager: Callable[..., ServiceManager] = _manager  # service.make_manager(spec, state_dir, python)
    wait_ready: Callable[..., HealthResult] = _wait_ready  # service.wait_ready(manager, spec, ...)
    gpus_released: Callable[[float], Any] = _gpus_released  # gpu.wait_gpus_released(timeout_s)
    # staging.build(recipe, env, folder=, lock=, offline=, checks=, on_line=, say=): the staged
    # build in a throwaway environment and its CPU checks; never raises for a failing check.
    prepare: Callable[..., Build] = _prepare
    uv_version: Callable[[], str] = _uv_version  # installer.uv_version(): what a prepared lock was made with
    # patches.clean_uv_cache_for(names): uv's cache entries a patch written in place corrupted
    clean_cache: Callable[[list[str]], Any] = _clean_cache
    # The HTTP client the health checks and the index preflight use; None: each makes its own.
    client: Any = None

    @classmethod
    def real(cls, client: Any = None) -> Host:
        """The host this machine is: uv, the recipe's service manager, nvidia-smi."""
        return cls(client=client)
