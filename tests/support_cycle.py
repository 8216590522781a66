"""The fake world the run cycle's unit layer runs in (tests/test_cycle_unit.py and the
rollback, pin and status unit tests): a tiny real environment of two files, and a `Host` of
in-memory fakes (service manager, health check, installer, smoke runner, fetcher, GPU probe,
preflight). The `world` fixture is registered in conftest.py."""

from __future__ import annotations

import base64
import hashlib
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rewheel import commands, journal
from rewheel.environment import Environment
from rewheel.errors import (InstallError, ServiceError)
from rewheel.host import Host
from rewheel.installer import InstallPlan, InstallResult, PlannedChange
from rewheel.preflight import CheckResult
from rewheel.recipe import InstallSpec, Recipe, ServiceSpec, SmokeSpec
from rewheel.resolution import Resolution
from rewheel.service import HealthCheckFailed, HealthResult, ServiceStatus
from rewheel.smoke import SmokeResult
from rewheel.snapshot import Store
from rewheel.staging import Build, PrepCheck

PKG = "toypkg"
TRACEBACK = ["Traceback (most recent call last):",
             '  File "/env/lib/python3.12/site-packages/toypkg/__init__.py", line 1, in <module>',
             "RuntimeError: CUDA error: no kernel image is available for execution on the device"]


# -- a tiny environment: one distribution whose RECORD proves its files ----------------------------
def _record_row(site: Path, rel: str) -> str:
    data = (site / rel).read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{len(data)}"


def install_toypkg(site: Path, version: str) -> None:
    """What `uv pip install toypkg==VERSION` leaves: the old dist-info gone, the new files and
    a RECORD that lists them."""
    for old in site.glob(f"{PKG}-*.dist-info"):
        shutil.rmtree(old)
    (site / PKG).mkdir(exist_ok=True)
    # A new file, never the old one rewritten in place (the snapshot shares its inode).
    (site / PKG / "__init__.py").unlink(missing_ok=True)
    (site / PKG / "__init__.py").write_text(f'__version__ = "{version}"\n')
    info = site / f"{PKG}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PKG}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("uv\n")
    rows = [_record_row(site, r) for r in (f"{PKG}/__init__.py", f"{info.name}/METADATA",
                                           f"{info.name}/INSTALLER")]
    (info / "RECORD").write_text("\n".join(rows + [f"{info.name}/RECORD,,"]) + "\n")


def make_env(root: Path) -> Environment:
    prefix = root / "env"
    site = prefix / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    (prefix / "bin").mkdir()
    (prefix / "bin" / "python").write_text("")  # never run: the environment is described, not probed
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")
    install_toypkg(site, "1.0.0")
    return Environment(python=prefix / "bin" / "python", prefix=prefix, base_prefix=Path("/usr"),
                       version="3.12.0", site_dirs=[site], scripts_dir=prefix / "bin", kind="venv")


# -- the fakes -------------------------------------------------------------------------------------
@dataclass
class FakeManager:
    """A service manager in memory: `fail` names the calls that raise ServiceError."""

    up: bool = True
    fail: set[str] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)
    # What the service does to the host as it stops (writes a byte-compiled cache, say).
    on_stop: Callable[[], None] | None = None

    def describe(self) -> str:
        return "fake service"

    def check(self) -> None:
        pass

    def status(self) -> ServiceStatus:
        return ServiceStatus(active=self.up, state="active" if self.up else "inactive", judged_by="pid")

    def stop(self, timeout_s: float) -> None:
        self.calls.append("stop")
        if "stop" in self.fail:
            raise ServiceError("fake service did not stop within 1s")
        if self.on_stop is not None:
            self.on_stop()
        self.up = False

    def start(self) -> None:
        self.calls.append("start")
        if "start" in self.fail:
            raise ServiceError("fake service failed to start: exit 1")
        self.up = True

    def log_lines(self, since_epoch: float) -> Iterator[str]:
        return iter(TRACEBACK)

    def log_location(self, since_epoch: float) -> str:
        return "fake log"


@dataclass
class World:
    """The host's state the fakes act on, and the knobs a test turns to make a step fail."""

    site: Path
    manager: FakeManager = field(default_factory=FakeManager)
    install_fails: bool = False
    interrupt_install: bool = False
    smoke_fails: bool = False
    fetcher_fails: bool = False
    # The staged build's CPU checks fail (an import raises), or its wheels left the cache.
    precheck_fails: bool = False
    cache_lost: bool = False
    prepares: list[dict[str, Any]] = field(default_factory=list)
    resolves: int = 0
    # uv cache entries the cycle cleaned (a patch written in place through uv's links).
    cleaned: list[str] = field(default_factory=list)
    # How many of the next health checks fail (then they pass).
    unhealthy: int = 0
    health_calls: int = 0
    gpu_waits: list[float] = field(default_factory=list)

    def host(self) -> Host:
        return Host(checks=self.checks, resolve=self.resolve, plan=self.plan, install=self.install, smoke=self.smoke,
                    fetcher=self.fetcher, manager=lambda spec, state_dir, python: self.manager,
                    wait_ready=self.wait_ready, gpus_released=self.gpu_waits.append, prepare=self.prepare,
                    uv_version=lambda: "0.13.9", clean_cache=self.cleaned.extend)

    def checks(self, recipe: Recipe, *, client: Any = None, indexes: bool = True) -> CheckResult:
        return CheckResult(recipe)

    def prepare(self, recipe: Recipe, env: Environment, *, folder: Path, lock: Path | None = None,
                offline: bool = False, checks: bool = True, on_line: Any = None, say: Any = None) -> Build:
        """The staged build: a lock written, the checks' outcome per the knobs; never the live env."""
        self.prepares.append({"offline": offline, "checks": checks, "lock": lock})
        logs = folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out = folder / "pylock.toml"
        out.write_text('lock-version = "1.0"\n[[packages]]\nname = "toypkg"\nversion = "2.0.0"\n')
        dists = [{"name": PKG, "version": "2.0.0", "editable": False, "url": None}]
        if offline and self.cache_lost:
            return Build(False, str(out), checks=[PrepCheck("build", False, 0.0, "uv: toypkg==2.0.0 is not in the cache (--offline)")])
        done = [PrepCheck("resolve", True), PrepCheck("build", True)]
        if checks and self.precheck_fails:
            (logs / "imports.log").write_text("\n".join(TRACEBACK) + "\n")
            return Build(False, str(out), {PKG: "2.0.0"}, dists,
                         done + [PrepCheck("imports", False, 0.0, "importing toypkg failed", str(logs / "imports.log"))], PKG)
        return Build(True, str(out), {PKG: "2.0.0"}, dists, done + ([PrepCheck("imports", True)] if checks else []), PKG)

    def resolve(self, recipe: Recipe, env: Environment, *, folder: Path, on_line: Any = None,
                say: Any = None, guards: bool = True) -> Resolution:
        """The one resolution: toypkg 1.0.0 -> 2.0.0, its lock written into `folder`."""
        folder.mkdir(parents=True, exist_ok=True)
        lock = folder / "pylock.toml"
        lock.write_text('lock-version = "1.0"\n[[packages]]\nname = "toypkg"\nversion = "2.0.0"\n')
        self.resolves += 1
        plan = InstallPlan(argv=["uv", "pip", "install", "--dry-run", PKG],
                           changes=[PlannedChange(PKG, "1.0.0", "2.0.0")], lock=str(lock))
        return Resolution(lock=lock, plan=plan, before={PKG: "1.0.0"}, after={PKG: "2.0.0"},
                          locked={PKG: "2.0.0"})

    def plan(self, recipe: Recipe, *, lock: Path | None = None) -> InstallPlan:
        return InstallPlan(argv=["uv", "pip", "install", PKG], changes=[PlannedChange(PKG, "1.0.0", "2.0.0")])

    def install(self, recipe: Recipe, *, log_path: Path | None = None, **kw: Any) -> InstallResult:
        if self.interrupt_install:
            install_toypkg(self.site, "2.0.0")
            raise KeyboardInterrupt  # the process dies mid-run: nothing below runs
        if self.install_fails:
            raise InstallError("uv failed (exit 1): no matching distribution for toypkg==2.0.0")
        install_toypkg(self.site, "2.0.0")
        return InstallResult(ok=True, returncode=0, seconds=0.0, argv=["uv"], changes=[])

    def smoke(self, recipe: Recipe, *, log_path: Path, on_line: Callable[[str], None] | None = None) -> SmokeResult:
        lines = TRACEBACK if self.smoke_fails else ["ok"]
        Path(log_path).write_text("\n".join(lines) + "\n")
        return SmokeResult(ok=not self.smoke_fails, returncode=1 if self.smoke_fails else 0, timed_out=False,
                           seconds=0.0, log_path=str(log_path))

    def fetcher(self, recipe: Recipe) -> Any:
        if self.fetcher_fails:
            raise OSError(28, "No space left on device")
        return NoFetcher()

    def wait_ready(self, manager: Any, spec: ServiceSpec, *, client: Any = None, started_at: float,
                   on_progress: Callable[[str], None] | None = None) -> HealthResult:
        self.health_calls += 1
        if self.unhealthy > 0:
            self.unhealthy -= 1
            res = HealthResult(ok=False, seconds=0.0, detail="GET /health: connection refused")
            raise HealthCheckFailed("fake service never became healthy", res)
        return HealthResult(ok=True, seconds=0.0, detail="GET /health: 200")


class NoFetcher:
    """An index that has no wheels: the RECORDs are trusted as they are."""

    def unpack(self, dist: Any) -> None:
        return None

    def close(self) -> None:
        pass


# -- fixtures --------------------------------------------------------------------------------------
@pytest.fixture
def world(tmp_path: Path) -> tuple[World, commands.Target]:
    env = make_env(tmp_path)
    w = World(site=env.site_dirs[0])
    recipe = Recipe(name="unit", python=env.python, path=tmp_path / "unit.toml",
                    service=ServiceSpec(manager="command", start=("serve",), health_url="http://127.0.0.1:1/health"),
                    install=InstallSpec(packages=(PKG,)), smoke=SmokeSpec(command=("smoke",), gpus=1))
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return w, commands.Target(recipe, env, Store(env.prefix, home), w.host())


def version(t: commands.Target) -> str | None:
    return t.env.versions().get(PKG)


def last_run(t: commands.Target) -> journal.RunJournal:
    return journal.list_runs(t.store.env_dir)[0]


def steps(rep: commands.RunReport) -> list[tuple[str, bool]]:
    return [(s.name, s.ok) for s in rep.steps]
