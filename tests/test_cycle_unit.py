"""The run cycle's failure paths, in milliseconds: every step that can fail, what the cycle
does then (revert, or put the service back and stop), the report's status and exit code.

The cycle runs against a `Host` of in-memory fakes (service manager, health check,
installer, smoke runner, fetcher, GPU probe, preflight): no process starts, uv is never
called. The snapshot, the diff and the restore are the real ones, on a tiny environment
of two files in a temporary folder, so a revert is proven byte for byte as in production.
The end-to-end suites (test_run.py, test_run_systemd.py, ...) run the same paths on real
venvs, a real index and a real service.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rewheel import journal, runner
from rewheel.environment import Environment
from rewheel.errors import (EXIT_OK, EXIT_REVERTED, EXIT_UNRESTORED, InstallError, RewheelError,
                            ServiceError)
from rewheel.host import Host
from rewheel.installer import InstallPlan, InstallResult, PlannedChange
from rewheel.preflight import CheckResult
from rewheel.recipe import InstallSpec, Recipe, ServiceSpec, SmokeSpec
from rewheel.service import HealthCheckFailed, HealthResult, ServiceStatus
from rewheel.smoke import SmokeResult
from rewheel.snapshot import Store

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
    # How many of the next health checks fail (then they pass).
    unhealthy: int = 0
    health_calls: int = 0
    gpu_waits: list[float] = field(default_factory=list)

    def host(self) -> Host:
        return Host(checks=self.checks, plan=self.plan, install=self.install, smoke=self.smoke,
                    fetcher=self.fetcher, manager=lambda spec, state_dir, python: self.manager,
                    wait_ready=self.wait_ready, gpus_released=self.gpu_waits.append)

    def checks(self, recipe: Recipe, *, client: Any = None) -> CheckResult:
        return CheckResult(recipe)

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
def world(tmp_path: Path) -> tuple[World, runner.Target]:
    env = make_env(tmp_path)
    w = World(site=env.site_dirs[0])
    recipe = Recipe(name="unit", python=env.python, path=tmp_path / "unit.toml",
                    service=ServiceSpec(manager="command", start=("serve",), health_url="http://127.0.0.1:1/health"),
                    install=InstallSpec(packages=(PKG,)), smoke=SmokeSpec(command=("smoke",), gpus=1))
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return w, runner.Target(recipe, env, Store(env.prefix, home), w.host())


def version(t: runner.Target) -> str | None:
    return t.env.versions().get(PKG)


def last_run(t: runner.Target) -> journal.RunJournal:
    return journal.list_runs(t.store.env_dir)[0]


def steps(rep: runner.RunReport) -> list[tuple[str, bool]]:
    return [(s.name, s.ok) for s in rep.steps]


# -- kept, planned -----------------------------------------------------------------------------------
def test_good_upgrade_is_kept(world: tuple[World, runner.Target]) -> None:
    w, t = world
    rep = runner.run(t)
    assert (rep.status, rep.exit_code) == ("upgraded", EXIT_OK)
    assert version(t) == "2.0.0" and rep.before == {PKG: "1.0.0"} and rep.after == {PKG: "2.0.0"}
    assert steps(rep) == [("preflight", True), ("stop", True), ("snapshot", True), ("reinstall", True),
                          ("diff", True), ("smoke", True), ("start", True), ("keep", True)]
    assert w.manager.calls == ["stop", "start"] and w.manager.up
    assert w.gpu_waits == [120.0]  # the smoke test needs a GPU: its memory is waited for after the stop
    assert t.store.get(rep.snapshot_id).extra["upgraded_to"] == {PKG: "2.0.0"}
    assert last_run(t).status == "upgraded"
    assert [(c.name, c.old, c.new, c.change) for c in rep.changes] == [(PKG, "1.0.0", "2.0.0", "upgraded")]


def test_dry_run_plans_and_touches_nothing(world: tuple[World, runner.Target]) -> None:
    w, t = world
    rep = runner.run(t, dry_run=True)
    assert (rep.status, rep.exit_code) == ("planned", EXIT_OK)
    assert rep.plan is not None and rep.plan.changes[0].new == "2.0.0"
    assert rep.plan.snapshot_estimate is not None
    assert "snapshot_estimate" in rep.to_json()["plan"]
    assert version(t) == "1.0.0" and w.manager.calls == [] and t.store.list() == []
    assert journal.list_runs(t.store.env_dir) == []


# -- a failure before the reinstall: nothing to revert, the service goes back up ---------------------
def test_stop_fails_nothing_changed(world: tuple[World, runner.Target]) -> None:
    w, t = world
    w.manager.fail = {"stop"}
    with pytest.raises(ServiceError, match="did not stop") as exc:
        runner.run(t)
    assert exc.value.exit_code == EXIT_REVERTED
    assert version(t) == "1.0.0" and t.store.list() == []
    assert w.manager.calls == ["stop", "start"] and w.health_calls == 1  # put back as it was
    j = last_run(t)
    assert j.status == "failed" and "did not stop" in (j.last("finished") or {})["error"]


def test_snapshot_fails_service_restarted(world: tuple[World, runner.Target]) -> None:
    w, t = world
    w.fetcher_fails = True
    with pytest.raises(OSError, match="No space left"):
        runner.run(t)
    assert version(t) == "1.0.0"
    assert w.manager.calls == ["stop", "start"] and w.manager.up
    assert last_run(t).status == "failed"


# -- a failure after the reinstall began: reverted, exit 1 -------------------------------------------
def _assert_reverted(w: World, t: runner.Target, rep: runner.RunReport, failed_step: str) -> None:
    assert (rep.status, rep.exit_code) == ("reverted", EXIT_REVERTED)
    assert version(t) == "1.0.0" and rep.after == {PKG: "1.0.0"}
    assert rep.failure is not None and rep.failure.step == failed_step
    assert (failed_step, False) in steps(rep) and steps(rep)[-1] == ("revert", True)
    assert rep.revert is not None and rep.revert.restore is not None and rep.revert.restore.verified > 0
    assert w.manager.up and w.manager.calls[-1] == "start"
    assert last_run(t).status == "reverted"
    # The failed build is kept for inspection beside the pre-upgrade snapshot.
    assert {m.status for m in t.store.list()} == {"pre-upgrade", "failed-upgrade"}


def test_reinstall_fails_reverted(world: tuple[World, runner.Target]) -> None:
    w, t = world
    w.install_fails = True
    rep = runner.run(t)
    _assert_reverted(w, t, rep, "reinstall")
    assert rep.failure.error == "InstallError" and rep.failure.exit_code is not None


def test_smoke_fails_reverted_with_root_cause(world: tuple[World, runner.Target]) -> None:
    w, t = world
    w.smoke_fails = True
    rep = runner.run(t)
    _assert_reverted(w, t, rep, "smoke")
    assert rep.attempted == {PKG: "2.0.0"}
    assert rep.root_cause is not None and "no kernel image" in rep.root_cause.message
    # Not started after the failed smoke test; the revert stops it again (a no-op) and starts it.
    assert w.manager.calls == ["stop", "stop", "start"]
    # The report holds the objects; the JSON is made from them at the edge, the human
    # rendering reads them.
    import io

    from rich.console import Console

    from rewheel import report

    doc = rep.to_json()
    assert doc["root_cause"] == rep.root_cause.to_json() and doc["root_cause"]["frame"]["line"] == 1
    assert doc["failure"]["step"] == "smoke" and doc["revert"]["service"]["ok"] is True
    out = io.StringIO()
    report.render_run(Console(file=out, width=300, color_system=None), rep)
    text = out.getvalue()
    assert "failed at smoke: smoke test exited 1: RuntimeError: CUDA error" in text
    assert "at /env/lib/python3.12/site-packages/toypkg/__init__.py:1 in <module>" in text
    assert "service healthy again: GET /health: 200" in text


def test_start_fails_reverted(world: tuple[World, runner.Target]) -> None:
    w, t = world
    w.manager.fail = {"start"}
    rep = None
    try:
        rep = runner.run(t)
    except RewheelError:
        pass
    # The revert's own start fails too (same fake): the old state is restored but not
    # running, which the report says with exit 3.
    assert rep is not None and (rep.status, rep.exit_code) == ("failed", EXIT_UNRESTORED)
    assert version(t) == "1.0.0"
    assert rep.failure is not None and rep.failure.step == "start" and "failed to start" in rep.revert.error


def test_health_fails_reverted_and_diagnosed(world: tuple[World, runner.Target]) -> None:
    w, t = world
    w.unhealthy = 1  # the first health check (after the upgrade) fails, the revert's passes
    rep = runner.run(t)
    _assert_reverted(w, t, rep, "start")
    assert rep.diagnosis is not None and rep.diagnosis.source == "fake log"
    assert rep.root_cause is not None and rep.root_cause.type == "RuntimeError"


def test_revert_fails_exit_3(world: tuple[World, runner.Target]) -> None:
    w, t = world
    w.unhealthy = 2  # every health check fails: the upgrade's and the revert's
    rep = runner.run(t)
    assert (rep.status, rep.exit_code) == ("failed", EXIT_UNRESTORED)
    assert steps(rep)[-1] == ("revert", False)
    assert "revert failed" in rep.revert.error and "rewheel rollback" in rep.revert.hint
    assert version(t) == "1.0.0"  # the files are back; the service is what did not come up
    assert last_run(t).status == "failed"


def test_no_revert_keeps_the_failed_state(world: tuple[World, runner.Target]) -> None:
    w, t = world
    w.smoke_fails = True
    rep = runner.run(t, no_revert=True)
    assert (rep.status, rep.exit_code) == ("failed", EXIT_UNRESTORED)
    assert version(t) == "2.0.0" and rep.revert is None
    assert w.manager.calls == ["stop"] and not w.manager.up
    j = last_run(t)
    assert j.status == "failed" and (j.last("finished") or {}).get("kept_failed_state") is True


def test_service_that_was_stopped_stays_stopped(world: tuple[World, runner.Target]) -> None:
    w, t = world
    w.manager.up = False
    rep = runner.run(t)
    assert rep.status == "upgraded" and rep.service_before == "inactive"
    assert w.manager.calls == ["stop"] and w.health_calls == 0


# -- resume and rollback, through the same host ------------------------------------------------------
def test_interrupted_run_is_resumed_from_its_journal(world: tuple[World, runner.Target]) -> None:
    w, t = world
    w.interrupt_install = True
    with pytest.raises(KeyboardInterrupt):
        runner.run(t)
    assert version(t) == "2.0.0" and journal.interrupted_run(t.store.env_dir) is not None
    res = runner.resume(t)
    assert res.status == "reverted" and res.report is not None and res.report.status == "reverted"
    assert res.report.before == {PKG: "1.0.0"} and res.report.service_before == "active"
    assert version(t) == "1.0.0" and w.manager.up
    assert journal.interrupted_run(t.store.env_dir) is None


def test_rollback_restarts_the_service(world: tuple[World, runner.Target]) -> None:
    w, t = world
    assert runner.run(t).status == "upgraded"
    w.manager.calls.clear()
    res = runner.rollback(t)
    assert version(t) == "1.0.0" and res.service is not None and res.service.ok
    assert w.manager.calls == ["stop", "start"]
    assert [s.name for s in res.steps] == ["stop", "snapshot", "restore", "start"]  # the state it replaced is kept first


def test_the_unit_layer_is_fast(world: tuple[World, runner.Target]) -> None:
    w, t = world
    t0 = time.monotonic()
    w.smoke_fails = True
    runner.run(t)
    assert time.monotonic() - t0 < 2.0  # no process, no uv: a whole failed cycle in milliseconds
