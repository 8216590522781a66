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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rewheel.environment import Environment
    from rewheel.installer import InstallPlan, InstallResult
    from rewheel.patches import Fetcher
    from rewheel.preflight import CheckResult
    from rewheel.recipe import Recipe, ServiceSpec
    from rewheel.resolution import Resolution
    from rewheel.service import HealthResult, ServiceManager
    from rewheel.smoke import SmokeResult
    from rewheel.staging import Build


Say = Callable[[str], None]


# The collaborators, as the cycle calls them: a fake that does not honour one is a type error.
class Checks(Protocol):  # preflight.run_checks
    def __call__(self, recipe: Recipe, *, client: Any = None, indexes: bool = True) -> CheckResult: ...


class Resolver(Protocol):  # resolution.resolve
    def __call__(self, recipe: Recipe, env: Environment, *, folder: Path, on_line: Say | None = None,
                 say: Say | None = None, guards: bool = True) -> Resolution: ...


class Planner(Protocol):  # installer.plan
    def __call__(self, recipe: Recipe, *, lock: Path | None = None) -> InstallPlan: ...


class Installer(Protocol):  # installer.install
    def __call__(self, recipe: Recipe, *, lock: Path | None = None, installed: Sequence[str] | None = None,
                 keep: Mapping[str, str] | None = None, also_reinstall: Sequence[str] = (),
                 on_line: Say | None = None, log_path: Path | None = None, timeout: float | None = None,
                 offline: bool = False, sync: bool = True, link_mode: str | None = None) -> InstallResult: ...


class SmokeRunner(Protocol):  # smoke.run_smoke
    def __call__(self, recipe: Recipe, *, log_path: Path, on_line: Say | None = None) -> SmokeResult: ...


class FetcherFactory(Protocol):  # patches.UvIndexFetcher.for_recipe
    def __call__(self, recipe: Recipe, /) -> Fetcher: ...


class ManagerFactory(Protocol):  # service.make_manager
    def __call__(self, spec: ServiceSpec, state_dir: Path, python: Path | str | None) -> ServiceManager: ...


class ReadyWaiter(Protocol):  # service.wait_ready: raises HealthCheckFailed for an unhealthy service
    def __call__(self, manager: ServiceManager, spec: ServiceSpec, *, client: Any = None, started_at: float,
                 on_progress: Say | None = None) -> HealthResult: ...


class GpuWaiter(Protocol):  # gpu.wait_gpus_released
    def __call__(self, timeout_s: float, /) -> Any: ...


class Stager(Protocol):  # staging.build: never raises for a failing check
    def __call__(self, recipe: Recipe, env: Environment, *, folder: Path, lock: Path, offline: bool = False,
                 checks: bool = True, on_line: Say | None = None, say: Say | None = None) -> Build: ...


class UvProbe(Protocol):  # installer.uv_version
    def __call__(self) -> str: ...


class CacheCleaner(Protocol):  # patches.clean_uv_cache_for
    def __call__(self, names: list[str], /) -> Any: ...


def _checks(recipe: Recipe, *, client: Any = None, indexes: bool = True) -> CheckResult:
    from rewheel import preflight

    return preflight.run_checks(recipe, client=client, indexes=indexes)


def _prepare(recipe: Recipe, env: Environment, *, folder: Path, lock: Path, offline: bool = False,
             checks: bool = True, on_line: Say | None = None, say: Say | None = None) -> Build:
    from rewheel import staging

    return staging.build(recipe, env, folder=folder, lock=lock, offline=offline, checks=checks,
                         on_line=on_line, say=say)


def _resolve(recipe: Recipe, env: Environment, *, folder: Path, on_line: Say | None = None,
             say: Say | None = None, guards: bool = True) -> Resolution:
    from rewheel import resolution

    return resolution.resolve(recipe, env, folder=folder, on_line=on_line, say=say, guards=guards)


def _plan(recipe: Recipe, *, lock: Path | None = None) -> InstallPlan:
    from rewheel import installer

    return installer.plan(recipe, lock=lock)


def _install(recipe: Recipe, *, lock: Path | None = None, installed: Sequence[str] | None = None,
             keep: Mapping[str, str] | None = None, also_reinstall: Sequence[str] = (),
             on_line: Say | None = None, log_path: Path | None = None, timeout: float | None = None,
             offline: bool = False, sync: bool = True, link_mode: str | None = None) -> InstallResult:
    from rewheel import installer

    return installer.install(recipe, lock=lock, installed=installed, keep=keep, also_reinstall=also_reinstall,
                             on_line=on_line, log_path=log_path, timeout=timeout, offline=offline, sync=sync,
                             link_mode=link_mode)


def _smoke(recipe: Recipe, *, log_path: Path, on_line: Say | None = None) -> SmokeResult:
    from rewheel.smoke import run_smoke

    return run_smoke(recipe, log_path=log_path, on_line=on_line)


def _uv_version() -> str:
    from rewheel import installer

    return installer.uv_version()


def _clean_cache(names: list[str]) -> Any:
    from rewheel import patches

    return patches.clean_uv_cache_for(names)


def _fetcher(recipe: Recipe) -> Fetcher:
    from rewheel import patches

    return patches.UvIndexFetcher.for_recipe(recipe)


def _manager(spec: ServiceSpec, state_dir: Path, python: Path | str | None) -> ServiceManager:
    from rewheel import service

    return service.make_manager(spec, state_dir, python=python)


def _wait_ready(manager: ServiceManager, spec: ServiceSpec, *, client: Any = None, started_at: float,
                on_progress: Say | None = None) -> HealthResult:
    from rewheel import service

    return service.wait_ready(manager, spec, client=client, started_at=started_at, on_progress=on_progress)


def _gpus_released(timeout_s: float) -> Any:
    from rewheel import gpu

    return gpu.wait_gpus_released(timeout_s)


@dataclass
class Host:
    """What the cycle, rollback, resume and smoke act through. Each field is typed by a
    Protocol with the signature of the real function it stands for (named in its comment); a
    fake need only honour that.
    `wait_ready` raises `service.HealthCheckFailed` for an unhealthy service, `install`
    raises `InstallError`, `smoke` never raises (its result says how the command ended)."""

    checks: Checks = _checks
    # The upgrade's one resolution (its lock and plan); `plan` only for a run given
    # `--lock FILE` (uv's dry run of the sync).
    resolve: Resolver = _resolve
    plan: Planner = _plan
    install: Installer = _install
    smoke: SmokeRunner = _smoke
    fetcher: FetcherFactory = _fetcher
    manager: ManagerFactory = _manager
    wait_ready: ReadyWaiter = _wait_ready
    gpus_released: GpuWaiter = _gpus_released
    # The staged build in a throwaway environment and its CPU checks.
    prepare: Stager = _prepare
    uv_version: UvProbe = _uv_version  # what a prepared lock was made with
    clean_cache: CacheCleaner = _clean_cache  # uv's cache entries a patch written in place corrupted
    # The HTTP client the health checks and the index preflight use; None: each makes its own.
    client: Any = None

    @classmethod
    def real(cls, client: Any = None) -> Host:
        """The host this machine is: uv, the recipe's service manager, nvidia-smi."""
        return cls(client=client)
