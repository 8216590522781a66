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

from pathlib import Path

from dataclasses import replace

import time

import pytest

from rewheel import commands, journal
from rewheel.records import Finish
from rewheel.errors import (EXIT_OK, EXIT_REVERTED, EXIT_UNRESTORED, RewheelError,
                            ServiceError)

from support_cycle import PKG, TRACEBACK, World, install_toypkg, last_run, steps, version  # noqa: F401


# -- kept, planned -----------------------------------------------------------------------------------
def test_good_upgrade_is_kept(world: tuple[World, commands.Target]) -> None:
    w, t = world
    rep = commands.run(t)
    assert (rep.status, rep.exit_code) == ("upgraded", EXIT_OK)
    assert version(t) == "2.0.0" and rep.before == {PKG: "1.0.0"} and rep.after == {PKG: "2.0.0"}
    assert steps(rep) == [("preflight", True), ("prepare", True), ("snapshot", True), ("stop", True),
                          ("snapshot-check", True), ("reinstall", True), ("diff", True), ("smoke", True), ("start", True), ("keep", True),
                          ("unshare", True)]
    assert w.manager.calls == ["stop", "start"] and w.manager.up
    # Staged (the default): prepared once, online, with its checks, before the stop.
    # The plan is the lock: the build installs exactly the lock the plan was resolved into.
    assert rep.staged and w.resolves == 1
    assert w.prepares == [{"offline": False, "checks": True, "lock": Path(rep.plan.install.lock)}]
    down = rep.downtime
    assert down is not None and set(down.parts) == {"stop", "snapshot", "install", "smoke", "start", "ready"}
    assert sum(down.parts.values()) <= down.seconds + 1e-3
    assert last_run(t).summary()["downtime"] == down.to_json()
    assert w.gpu_waits == [120.0]  # the smoke test needs a GPU: its memory is waited for after the stop
    assert t.store.get(rep.snapshot_id).extra["upgraded_to"] == {PKG: "2.0.0"}
    assert last_run(t).status == "upgraded"
    assert [(c.name, c.old, c.new, c.change) for c in rep.changes] == [(PKG, "1.0.0", "2.0.0", "upgraded")]


def test_dry_run_plans_and_touches_nothing(world: tuple[World, commands.Target]) -> None:
    w, t = world
    rep = commands.run(t, dry_run=True)
    assert (rep.status, rep.exit_code) == ("planned", EXIT_OK)
    assert rep.plan is not None and rep.plan.changes[0].new == "2.0.0"
    assert rep.plan.snapshot_estimate is not None
    assert "snapshot_estimate" in rep.to_json()["plan"]
    assert version(t) == "1.0.0" and w.manager.calls == [] and t.store.list() == []
    assert journal.list_runs(t.store.env_dir) == []


# -- a failure before the reinstall: nothing to revert, the service goes back up ---------------------
def test_stop_fails_nothing_changed(world: tuple[World, commands.Target]) -> None:
    w, t = world
    w.manager.fail = {"stop"}
    with pytest.raises(ServiceError, match="did not stop") as exc:
        commands.run(t)
    assert exc.value.exit_code == EXIT_REVERTED
    # Staged: the snapshot was taken while the service served, before the stop failed.
    assert version(t) == "1.0.0" and [m.status for m in t.store.list()] == ["pre-upgrade"]
    assert w.manager.calls == ["stop", "start"] and w.health_calls == 1  # put back as it was
    j = last_run(t)
    fin = j.last(Finish)
    assert j.status == "failed" and fin is not None and "did not stop" in (fin.error or "")


@pytest.mark.parametrize("staged", [True, False])
def test_snapshot_fails_service_restarted(world: tuple[World, commands.Target], staged: bool) -> None:
    w, t = world
    t = replace(t, recipe=replace(t.recipe, install=replace(t.recipe.install, staged=staged)))
    w.fetcher_fails = True
    with pytest.raises(OSError, match="No space left"):
        commands.run(t)
    assert version(t) == "1.0.0" and w.manager.up
    # Staged, the snapshot fails while the service still serves: it is never stopped.
    assert w.manager.calls == ([] if staged else ["stop", "start"])
    assert last_run(t).status == "failed"


# -- a failure after the reinstall began: reverted, exit 1 -------------------------------------------
def _assert_reverted(w: World, t: commands.Target, rep: commands.RunReport, failed_step: str,
                     failed_kept: bool = True) -> None:
    assert (rep.status, rep.exit_code) == ("reverted", EXIT_REVERTED)
    assert version(t) == "1.0.0" and rep.after == {PKG: "1.0.0"}
    assert rep.failure is not None and rep.failure.step == failed_step
    assert (failed_step, False) in steps(rep) and steps(rep)[-1] == ("revert", True)
    assert rep.revert is not None and rep.revert.restore is not None and rep.revert.restore.verified > 0
    assert w.manager.up and w.manager.calls[-1] == "start"
    assert last_run(t).status == "reverted"
    # The failed build is kept for inspection beside the pre-upgrade snapshot; when the restore
    # changed no byte, it was the good state itself and is not kept.
    if failed_kept:
        assert {m.status for m in t.store.list()} == {"pre-upgrade", "failed-upgrade"}
    else:
        assert {m.status for m in t.store.list()} == {"pre-upgrade"}
        assert rep.revert.failed_snapshot_id is None and rep.revert.failed_snapshot_dropped


def test_reinstall_fails_reverted(world: tuple[World, commands.Target]) -> None:
    w, t = world
    w.install_fails = True
    rep = commands.run(t)
    _assert_reverted(w, t, rep, "reinstall", failed_kept=False)  # uv wrote nothing
    assert rep.failure.error == "InstallError" and rep.failure.exit_code is not None


def test_smoke_fails_reverted_with_root_cause(world: tuple[World, commands.Target]) -> None:
    w, t = world
    w.smoke_fails = True
    rep = commands.run(t)
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


def test_start_fails_reverted(world: tuple[World, commands.Target]) -> None:
    w, t = world
    w.manager.fail = {"start"}
    rep = None
    try:
        rep = commands.run(t)
    except RewheelError:
        pass
    # The revert's own start fails too (same fake): the old state is restored but not
    # running, which the report says with exit 3.
    assert rep is not None and (rep.status, rep.exit_code) == ("failed", EXIT_UNRESTORED)
    assert version(t) == "1.0.0"
    assert rep.failure is not None and rep.failure.step == "start" and "failed to start" in rep.revert.error


def test_health_fails_reverted_and_diagnosed(world: tuple[World, commands.Target]) -> None:
    w, t = world
    w.unhealthy = 1  # the first health check (after the upgrade) fails, the revert's passes
    rep = commands.run(t)
    _assert_reverted(w, t, rep, "start")
    assert rep.diagnosis is not None and rep.diagnosis.source == "fake log"
    assert rep.root_cause is not None and rep.root_cause.type == "RuntimeError"


def test_revert_fails_exit_3(world: tuple[World, commands.Target]) -> None:
    w, t = world
    w.unhealthy = 2  # every health check fails: the upgrade's and the revert's
    rep = commands.run(t)
    assert (rep.status, rep.exit_code) == ("failed", EXIT_UNRESTORED)
    assert steps(rep)[-1] == ("revert", False)
    assert "revert failed" in rep.revert.error and "rewheel rollback" in rep.revert.hint
    assert version(t) == "1.0.0"  # the files are back; the service is what did not come up
    assert last_run(t).status == "failed"


def test_no_revert_keeps_the_failed_state(world: tuple[World, commands.Target]) -> None:
    w, t = world
    w.smoke_fails = True
    rep = commands.run(t, no_revert=True)
    assert (rep.status, rep.exit_code) == ("failed", EXIT_UNRESTORED)
    assert version(t) == "2.0.0" and rep.revert is None
    assert w.manager.calls == ["stop"] and not w.manager.up
    j = last_run(t)
    fin = j.last(Finish)
    assert j.status == "failed" and fin is not None and fin.kept_failed_state is True


def test_service_that_was_stopped_stays_stopped(world: tuple[World, commands.Target]) -> None:
    w, t = world
    w.manager.up = False
    rep = commands.run(t)
    assert rep.status == "upgraded" and rep.service_before == "inactive"
    assert w.manager.calls == ["stop"] and w.health_calls == 0


# -- resume and rollback, through the same host ------------------------------------------------------
def test_interrupted_run_is_resumed_from_its_journal(world: tuple[World, commands.Target]) -> None:
    w, t = world
    w.interrupt_install = True
    with pytest.raises(KeyboardInterrupt) as ki:
        commands.run(t)
    assert version(t) == "2.0.0" and journal.interrupted_run(t.store.env_dir) is not None
    # What the CLI prints for it: the step, the service stopped, the exact command.
    said = ki.value.failure  # type: ignore[attr-defined]
    assert said.exit_code == 4 and "at its reinstall step" in said.message and "is STOPPED" in said.message
    assert f"`rewheel resume {t.recipe.path}`" in said.hint and "starts the service again" in said.hint
    res = commands.resume(t)
    assert res.status == "reverted" and res.report is not None and res.report.status == "reverted"
    # What the resume moved: the live versions it found, and what it left (issue 45, item 10).
    assert res.report.before == {PKG: "2.0.0"} and res.report.after == {PKG: "1.0.0"}
    assert [(c.name, c.old, c.new) for c in res.report.changes] == [(PKG, "2.0.0", "1.0.0")]
    assert res.report.service_before == "active"
    assert version(t) == "1.0.0" and w.manager.up
    assert journal.interrupted_run(t.store.env_dir) is None


def test_rollback_restarts_the_service(world: tuple[World, commands.Target]) -> None:
    w, t = world
    assert commands.run(t).status == "upgraded"
    w.manager.calls.clear()
    res = commands.rollback(t)
    assert version(t) == "1.0.0" and res.service is not None and res.service.ok
    assert w.manager.calls == ["stop", "start"]
    # The restore is compared and staged, and the state it replaces kept, while the service
    # serves; in the window one stat walk proves it is still current, and the restore commits.
    assert [s.name for s in res.steps] == ["restore-prepare", "snapshot", "stop", "snapshot-check", "restore",
                                           "start"]
    assert res.downtime is not None and set(res.downtime.parts) == {"stop", "snapshot", "restore", "start", "ready"}


def test_the_unit_layer_is_fast(world: tuple[World, commands.Target]) -> None:
    w, t = world
    t0 = time.monotonic()
    w.smoke_fails = True
    commands.run(t)
    assert time.monotonic() - t0 < 2.0  # no process, no uv: a whole failed cycle in milliseconds
