"""Staged runs in the cycle's fake world (tests/support_cycle.py): what a rejected build, a
prepare-only run, a swap of a prepared build and a stale one do to the service, the
environment, the store and the journal — in milliseconds. The real build, on a real venv,
index and service, is tests/test_staged.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rewheel.records import Step
from rewheel import commands, journal, staging
from rewheel.commands.cycle import Cycle
from rewheel.errors import EXIT_OK, EXIT_REVERTED, EXIT_USAGE, PreparedStale

from support_cycle import PKG, World, install_toypkg, last_run, steps, version


def test_a_build_failing_its_checks_is_rejected_and_the_service_never_stops(world: tuple[World, commands.Target]) -> None:
    w, t = world
    w.precheck_fails = True
    rep = commands.run(t)
    assert (rep.status, rep.exit_code) == ("rejected", EXIT_REVERTED)
    assert w.manager.calls == [] and w.manager.up and w.gpu_waits == []
    assert version(t) == "1.0.0" and t.store.list() == [] and rep.snapshot_id is None
    assert rep.downtime is None and rep.to_json()["downtime"] is None
    assert steps(rep) == [("preflight", True), ("prepare", False)]
    assert rep.failure is not None and rep.failure.step == "prepare" and "imports" in rep.failure.message
    assert rep.root_cause is not None and rep.root_cause.type == "RuntimeError"
    # The diff of what would have changed, and the failing check's log kept with the run.
    assert [(c.name, c.old, c.new) for c in rep.changes] == [(PKG, "1.0.0", "2.0.0")]
    assert rep.logs["imports"].startswith(rep.run_dir) and "RuntimeError" in open(rep.logs["imports"]).read()
    j = last_run(t)
    assert j.status == "rejected" and j.summary()["downtime"] is None
    assert journal.interrupted_run(t.store.env_dir) is None
    assert staging.load(t.store.env_dir) is None and not (t.store.env_dir / "prepared.new").exists()


def test_prepare_only_then_prepared_swaps_offline(world: tuple[World, commands.Target]) -> None:
    w, t = world
    rep = commands.run(t, prepare_only=True)
    assert (rep.status, rep.exit_code) == ("prepared", EXIT_OK)
    assert w.manager.calls == [] and version(t) == "1.0.0" and rep.downtime is None
    ready = rep.to_json()["prepared"]
    assert ready["ok"] and ready["after"] == {PKG: "2.0.0"} and ready["lock"].endswith("prepared/pylock.toml")
    assert last_run(t).status == "prepared"
    rep = commands.run(t, prepared=True)
    assert (rep.status, rep.exit_code) == ("upgraded", EXIT_OK)
    assert version(t) == "2.0.0" and w.manager.calls == ["stop", "start"]
    # The swap proved the wheels are in the cache by an offline build, without the checks again.
    assert w.prepares[-1] == {"offline": True, "checks": False, "lock": staging.folder(t.store.env_dir) / "pylock.toml"}
    # Snapshotted while the service served; in the window only the check that nothing changed.
    assert [s for s, _ in steps(rep)][:5] == ["prepared", "preflight", "snapshot", "stop", "snapshot-check"]
    assert rep.downtime is not None and rep.downtime.seconds > 0
    check = next(s for s in rep.steps if s.name == "snapshot-check")
    assert rep.downtime.parts["snapshot"] == check.seconds
    # Used up: its lock and logs now live with the run.
    assert staging.load(t.store.env_dir) is None and (last_run(t).dir / "prepared" / "pylock.toml").is_file()


@pytest.mark.parametrize("change", ["nothing prepared", "recipe", "live environment", "cache"])
def test_a_stale_prepared_build_is_refused_before_anything_changes(world: tuple[World, commands.Target],
                                                                     change: str) -> None:
    w, t = world
    if change != "nothing prepared":
        commands.run(t, prepare_only=True)
    if change == "recipe":
        t = replace(t, recipe=replace(t.recipe, install=replace(t.recipe.install, packages=(f"{PKG}>=2",))))
    elif change == "live environment":
        install_toypkg(w.site, "1.5.0")
    elif change == "cache":
        w.cache_lost = True
    before = version(t)
    with pytest.raises(PreparedStale) as exc:
        commands.run(t, prepared=True)
    assert exc.value.exit_code == EXIT_USAGE
    words = {"nothing prepared": "nothing is prepared", "recipe": "recipe", "live environment": "live environment",
             "cache": "offline"}[change]
    assert words in exc.value.message and "--prepare-only" in (exc.value.hint or "")
    assert w.manager.calls == [] and version(t) == before and t.store.list() == []


def test_a_reverted_staged_run_counts_the_revert_in_its_downtime(world: tuple[World, commands.Target]) -> None:
    w, t = world
    w.smoke_fails = True
    rep = commands.run(t)
    assert (rep.status, rep.exit_code) == ("reverted", EXIT_REVERTED)
    assert version(t) == "1.0.0" and w.manager.up
    down = rep.to_json()["downtime"]
    assert set(down["parts"]) == {"stop", "snapshot", "install", "smoke", "start", "ready", "revert"}
    assert down["parts"]["revert"] > 0 and down["parts"]["start"] == 0  # the new build never started
    assert last_run(t).summary()["downtime"] == down


def test_staged_false_keeps_the_unstaged_cycle(world: tuple[World, commands.Target]) -> None:
    w, t = world
    t = replace(t, recipe=replace(t.recipe, install=replace(t.recipe.install, staged=False)))
    rep = commands.run(t)
    assert rep.status == "upgraded" and not rep.staged and w.prepares == []
    assert [s for s, _ in steps(rep)] == ["preflight", "stop", "snapshot", "reinstall", "diff", "smoke", "start", "keep"]
    assert rep.downtime is not None  # measured for both, so they can be compared


def test_a_service_that_was_down_has_no_downtime(world: tuple[World, commands.Target]) -> None:
    w, t = world
    w.manager.up = False
    rep = commands.run(t)
    assert rep.status == "upgraded" and rep.downtime is None and not w.manager.up


def test_a_staged_swap_snapshots_while_the_service_serves(world: tuple[World, commands.Target]) -> None:
    """The snapshot (and the patch scan) run before the stop; in the window one stat walk
    proves the environment still is that snapshot. The journal says so (`served`)."""
    w, t = world
    seen: list[int] = []
    w.manager.on_stop = lambda: seen.append(len(t.store.list()))
    rep = commands.run(t)
    assert rep.status == "upgraded" and seen == [1]  # the snapshot existed when the stop came
    names = [s.name for s in last_run(t).all(Step)]
    assert names.index("snapshot") < names.index("stop") < names.index("snapshot-check") < names.index("reinstall")
    snap_rec = next(s for s in last_run(t).all(Step) if s.name == "snapshot")
    assert snap_rec.served is True
    assert [m.id for m in t.store.list()] == [rep.snapshot_id]


def test_a_change_while_the_service_served_is_snapshotted_again(world: tuple[World, commands.Target]) -> None:
    """A file written between the served snapshot and the stop (here: by the service as it
    stops) fails the check: the snapshot is taken again in the window and the first removed,
    so a revert gives back the environment as it was at the stop, that file included."""
    w, t = world
    written = w.site / PKG / "late.txt"
    w.manager.on_stop = lambda: written.write_text("written while the service served\n")
    w.smoke_fails = True
    rep = commands.run(t)
    assert (rep.status, rep.exit_code) == ("reverted", EXIT_REVERTED)
    names = [s for s, _ in steps(rep)]
    assert names[:6] == ["preflight", "prepare", "snapshot", "stop", "snapshot-check", "snapshot"]
    assert [m.id for m in t.store.list() if m.status == "pre-upgrade"] == [rep.snapshot_id]
    assert version(t) == "1.0.0" and written.read_text() == "written while the service served\n"
    # The window's snapshot part: the check and the snapshot taken again (not the served one).
    check = next(s.seconds for s in rep.steps if s.name == "snapshot-check")
    again = [s.seconds for s in rep.steps if s.name == "snapshot"][1]
    assert rep.downtime is not None and rep.downtime.parts["snapshot"] == check + again


def test_a_staged_run_killed_before_its_stop_changed_nothing(world: tuple[World, commands.Target],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after the served snapshot and before the stop: `resume` sees that nothing was
    touched — no stop, no restore, no start of a service that never went down."""
    w, t = world

    def killed(self: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(Cycle, "stop", killed)
        with pytest.raises(KeyboardInterrupt):
            commands.run(t)
    assert journal.interrupted_run(t.store.env_dir) is not None and len(t.store.list()) == 1
    res = commands.resume(t)
    assert res.status == "aborted" and "nothing had been changed" in res.action
    assert w.manager.calls == [] and w.manager.up and version(t) == "1.0.0"
    assert journal.interrupted_run(t.store.env_dir) is None
