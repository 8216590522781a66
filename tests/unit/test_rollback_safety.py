"""Rollback without footguns, in milliseconds: the failed-build guard, the snapshot a rollback
takes of the state it replaces (roll forward), a service that does not come back after a
rollback or a resume (root cause named, journal finished), and stacks of interrupted
journals closed at once.

The cycle runs against the in-memory host of test_cycle_unit.py (fake service manager,
installer, smoke runner); the snapshots, journals and restores are the real ones, on a
tiny environment, byte for byte. test_rollback_real.py runs the same paths on a real venv,
a real index and a real service.
"""

from __future__ import annotations

import dataclasses

import pytest

from rewheel import commands, journal
from rewheel.commands.rollback import PRE_ROLLBACK, is_failed_build
from rewheel.errors import EXIT_UNRESTORED, EXIT_USAGE, RestoreError, SnapshotError
from rewheel.journal import RunJournal
from rewheel.records import Finish, Note, Started, Step
from rewheel.statuses import StepName
from support_cycle import PKG, World, last_run, version

Pair = tuple[World, commands.Target]


def failed_build(w: World, t: commands.Target) -> str:
    """A run whose smoke test fails: reverted, the failed build kept; returns its id."""
    w.smoke_fails = True
    rep = commands.run(t)
    w.smoke_fails = False
    assert rep.status == "reverted" and rep.revert is not None and rep.revert.failed_snapshot_id
    return rep.revert.failed_snapshot_id


# -- the failed-build guard -------------------------------------------------------------------------
def test_a_failed_build_is_restored_only_with_force(world: Pair) -> None:
    w, t = world
    bad = failed_build(w, t)
    runs_before = len(journal.list_runs(t.store.env_dir))
    w.manager.calls.clear()
    with pytest.raises(SnapshotError) as exc:
        commands.rollback(t, bad)
    assert exc.value.exit_code == EXIT_USAGE
    label = t.store.get(bad).label
    assert bad in exc.value.message and label in exc.value.message and "failed build" in exc.value.message
    assert "--force" in (exc.value.hint or "") and "nothing was changed" in (exc.value.hint or "")
    # Refused before anything: no journal, no stop, the environment as it was.
    assert len(journal.list_runs(t.store.env_dir)) == runs_before and w.manager.calls == []
    assert version(t) == "1.0.0"
    res = commands.rollback(t, bad, force=True)
    assert res.exit_code == 0 and version(t) == "2.0.0" and w.manager.up
    assert journal.RunJournal.load(t.store.env_dir / "runs" / res.run_id).first(Started).force is True


def test_the_default_rollback_target_is_never_a_failed_build(world: Pair) -> None:
    w, t = world
    bad = failed_build(w, t)
    pre = [m for m in t.store.list() if m.status == "pre-upgrade"]
    # The reverted run's pre-upgrade snapshot is what its revert already put back: no default.
    with pytest.raises(SnapshotError, match="no upgrade is in place to undo") as undone:
        commands.default_rollback_snapshot(t.store)
    assert pre[0].id in undone.value.message and undone.value.exit_code == EXIT_USAGE
    # Without a pre-upgrade snapshot the newest usable one is the default, never the failed one.
    t.store.delete(pre[0].id)
    manual = commands.snapshot_now(t, label="by hand").result.meta
    t.store.delete(manual.id)
    with pytest.raises(SnapshotError, match="every snapshot of this environment is a failed build") as exc:
        commands.default_rollback_snapshot(t.store)
    assert bad in exc.value.message and exc.value.exit_code == EXIT_USAGE
    manual = commands.snapshot_now(t, label="by hand").result.meta
    assert commands.default_rollback_snapshot(t.store).id == manual.id


def test_after_a_reverted_run_a_plain_rollback_undoes_the_upgrade_still_in_place(world: Pair) -> None:
    w, t = world
    kept = commands.run(t)
    assert kept.status == "upgraded" and version(t) == "2.0.0"
    failed_build(w, t)  # reverted: 2.0.0 is live again, put back from that run's snapshot
    assert version(t) == "2.0.0"
    assert commands.default_rollback_snapshot(t.store).id == kept.snapshot_id
    res = commands.rollback(t)
    assert res.snapshot.id == kept.snapshot_id and version(t) == "1.0.0"
    assert res.exit_code == 0 and w.manager.up


def test_the_state_a_rollback_replaces_while_a_failed_build_is_live_is_marked_failed(world: Pair) -> None:
    w, t = world
    w.smoke_fails = True
    rep = commands.run(t, no_revert=True)  # the failed build is left live
    assert rep.status == "failed" and version(t) == "2.0.0"
    res = commands.rollback(t)
    assert version(t) == "1.0.0" and res.undo_snapshot_id
    undo = t.store.get(res.undo_snapshot_id)
    assert undo.status == PRE_ROLLBACK and is_failed_build(undo)
    with pytest.raises(SnapshotError, match="failed build"):
        commands.rollback(t, undo.id)


# -- roll forward -------------------------------------------------------------------------------------
def test_a_rollback_can_be_undone_from_the_snapshot_it_took(world: Pair) -> None:
    w, t = world
    assert commands.run(t).status == "upgraded" and version(t) == "2.0.0"
    res = commands.rollback(t)
    assert version(t) == "1.0.0" and res.undo_snapshot_id and res.undo_snapshot_error is None
    undo = t.store.get(res.undo_snapshot_id)
    assert undo.status == "pre-rollback" and undo.versions == {PKG: "2.0.0"}
    assert undo.label == f"before rollback {res.run_id} to {res.snapshot.id}"
    assert not is_failed_build(undo)  # a verified upgrade: restorable without --force
    assert res.to_json()["undo_snapshot_id"] == undo.id
    # The history shows it with its label; the default target is still the pre-upgrade one.
    hist = commands.history(t).to_json()
    assert any(s["id"] == undo.id and s["status"] == "pre-rollback" for s in hist["snapshots"])
    assert commands.default_rollback_snapshot(t.store).id == res.snapshot.id
    fwd = commands.rollback(t, undo.id)  # roll forward: no index involved
    assert version(t) == "2.0.0" and fwd.exit_code == 0 and w.manager.up
    assert t.store.get(fwd.undo_snapshot_id).versions == {PKG: "1.0.0"}


def test_no_undo_skips_the_snapshot_of_the_replaced_state(world: Pair) -> None:
    w, t = world
    assert commands.run(t).status == "upgraded"
    before = {m.id for m in t.store.list()}
    res = commands.rollback(t, undo=False)
    assert version(t) == "1.0.0" and res.exit_code == 0 and w.manager.up
    assert res.undo_snapshot_id is None and res.undo_snapshot_error == "skipped (--no-undo)"
    assert {m.id for m in t.store.list()} == before  # no pre-rollback snapshot was taken
    assert any(n.undo_snapshot_error for n in last_run(t).all(Note))


def test_a_rollback_that_changes_nothing_takes_no_snapshot(world: Pair) -> None:
    w, t = world
    snap = commands.snapshot_now(t).result.meta
    n = len(t.store.list())
    res = commands.rollback(t, snap.id)
    assert res.undo_snapshot_id is None and len(t.store.list()) == n
    assert [s.name for s in res.steps] == ["restore-prepare", "restore", "health"]  # a no-op restore, no stop


def test_rollback_prunes_to_keep_and_says_what_it_removed(world: Pair) -> None:
    w, t = world
    t = dataclasses.replace(t, recipe=dataclasses.replace(t.recipe, keep=2))
    manual = commands.snapshot_now(t, label="by hand").result.meta
    assert commands.run(t).status == "upgraded"
    res = commands.rollback(t)
    # Three snapshots for two places: the manual one goes; the target and the undo stay.
    assert res.pruned == [manual.id] and res.to_json()["pruned"] == [manual.id]
    assert {m.id for m in t.store.list()} == {res.snapshot.id, res.undo_snapshot_id}


# -- a service that does not come back ----------------------------------------------------------------
def test_a_rollback_whose_service_fails_names_the_cause_and_leaves_no_interrupted_run(world: Pair) -> None:
    w, t = world
    assert commands.run(t).status == "upgraded"
    w.unhealthy = 1  # the rolled-back build's service does not become healthy
    res = commands.rollback(t)
    assert (res.status, res.exit_code) == ("service-failed", EXIT_UNRESTORED)
    assert version(t) == "1.0.0"  # the files are restored all the same
    assert res.root_cause is not None and res.root_cause.type == "RuntimeError"
    assert "no kernel image" in res.error and res.diagnosis.source == "fake log"
    assert res.undo_snapshot_id and f"rollback {t.cli_ref} {res.undo_snapshot_id}" in res.hint
    doc = res.to_json()
    assert doc["status"] == "service-failed" and doc["exit_code"] == EXIT_UNRESTORED and doc["root_cause"]
    # Finished, not interrupted: the next command is not blocked with exit 4.
    assert journal.interrupted_run(t.store.env_dir) is None and last_run(t).status == "failed"
    journal.refuse_if_interrupted(t.store.env_dir, t.cli_ref)
    # Undo it: the service, running before the failed rollback, is started again.
    back = commands.rollback(t, res.undo_snapshot_id)
    assert back.exit_code == 0 and version(t) == "2.0.0" and w.manager.up
    assert back.service is not None and back.service.ok


def test_a_resume_whose_service_fails_names_the_cause_and_finishes(world: Pair) -> None:
    w, t = world
    w.interrupt_install = True
    with pytest.raises(KeyboardInterrupt):
        commands.run(t)
    w.interrupt_install = False
    w.unhealthy = 1
    with pytest.raises(RestoreError) as exc:
        commands.resume(t)
    assert exc.value.exit_code == EXIT_UNRESTORED
    assert "its log says: RuntimeError: CUDA error: no kernel image" in exc.value.message
    assert journal.interrupted_run(t.store.env_dir) is None
    fin = last_run(t).last(Finish)
    assert fin is not None and fin.root_cause is not None
    assert fin.status == "failed" and fin.root_cause["type"] == "RuntimeError"
    assert version(t) == "1.0.0"


# -- stale journals -----------------------------------------------------------------------------------
def killed_rollback(t: commands.Target, snap_id: str) -> RunJournal:
    """What `kill -9` during a rollback leaves: a journal with no `finished` record."""
    j = RunJournal.create(t.store.env_dir, Started(kind="rollback", snapshot_id=snap_id, recipe=t.label))
    j.append(Step(name=StepName.RESTORE, snapshot_id=snap_id))
    return j


def test_one_rollback_closes_a_stack_of_interrupted_ones(world: Pair) -> None:
    w, t = world
    snap = commands.snapshot_now(t).result.meta
    stack = {killed_rollback(t, snap.id).id for _ in range(3)}
    # (Ids made within one second order by their random part: "newest" is any of them.)
    newest = journal.interrupted_run(t.store.env_dir)
    assert newest is not None and newest.id in stack
    res = commands.rollback(t)
    assert res.snapshot.id == snap.id and res.finished_run == newest.id
    assert set(res.superseded_runs) == stack - {newest.id}
    assert journal.interrupted_run(t.store.env_dir) is None
    statuses = {j.id: j.status for j in journal.list_runs(t.store.env_dir)}
    assert sorted(statuses[i] for i in stack) == ["rolled-back", "superseded", "superseded"]


def test_resume_closes_older_interrupted_journals(world: Pair) -> None:
    w, t = world
    snap = commands.snapshot_now(t).result.meta
    ids = {killed_rollback(t, snap.id).id for _ in range(2)}
    res = commands.resume(t)
    assert res.run_id in ids and journal.interrupted_run(t.store.env_dir) is None
    (older,) = ids - {res.run_id}
    assert {j.id: j.status for j in journal.list_runs(t.store.env_dir)}[older] == "superseded"


def test_the_report_says_how_to_undo_and_why_the_service_failed(world: Pair) -> None:
    from rich.console import Console

    from rewheel import report

    w, t = world
    assert commands.run(t).status == "upgraded"
    w.unhealthy = 1
    res = commands.rollback(t)
    console = Console(record=True, width=200)
    report.render_rollback(console, res)
    report.render_rollback_more(console, res)
    text = console.export_text()
    assert f"rewheel rollback {t.cli_ref} {res.undo_snapshot_id}" in text and "undoes this rollback" in text
    assert "did not come back healthy" in text and "RuntimeError" in text


def test_a_rollback_whose_stop_fails_changes_nothing_and_finishes(world: Pair) -> None:
    from rewheel.errors import ServiceError

    w, t = world
    assert commands.run(t).status == "upgraded"
    w.manager.fail = {"stop"}
    w.manager.calls.clear()
    n = len(t.store.list())
    with pytest.raises(ServiceError, match="did not stop"):
        commands.rollback(t)
    assert version(t) == "2.0.0" and len(t.store.list()) == n  # no file changed, no snapshot taken
    assert w.manager.up and w.manager.calls == ["stop"]  # still up: nothing to start again
    assert journal.interrupted_run(t.store.env_dir) is None and last_run(t).status == "failed"
    w.manager.fail = set()
    assert commands.rollback(t).exit_code == 0 and version(t) == "1.0.0" and w.manager.up


def test_a_second_plain_rollback_does_not_undo_the_first(world: Pair) -> None:
    w, t = world
    manual = commands.snapshot_now(t, label="by hand").result.meta  # no pre-upgrade snapshot at all
    from support_cycle import install_toypkg

    install_toypkg(w.site, "2.0.0")  # upgraded by hand
    first = commands.rollback(t)
    assert first.snapshot.id == manual.id and version(t) == "1.0.0" and first.undo_snapshot_id
    # The undo point is newer, but the default stays the manual snapshot (a no-op now).
    assert commands.default_rollback_snapshot(t.store).id == manual.id
    second = commands.rollback(t)
    assert second.snapshot.id == manual.id and version(t) == "1.0.0"


# -- the undo snapshot, taken while the service serves ----------------------------------------------
def test_an_undo_snapshot_gone_stale_at_the_stop_is_taken_again_in_the_window(world: Pair) -> None:
    w, t = world
    assert commands.run(t).status == "upgraded"
    cache = w.site / PKG / "__pycache__" / "__init__.cpython-312.pyc"

    def write_cache() -> None:  # what a service may write as it stops
        cache.parent.mkdir(exist_ok=True)
        cache.write_bytes(b"compiled while stopping")

    w.manager.on_stop = write_cache
    w.manager.calls.clear()
    res = commands.rollback(t)
    assert res.exit_code == 0 and version(t) == "1.0.0" and not cache.exists()
    assert [s.name for s in res.steps] == ["restore-prepare", "snapshot", "stop", "snapshot-check", "snapshot", "restore", "start"]
    assert res.downtime is not None and res.downtime.parts["snapshot"] > 0
    j = journal.RunJournal.load(t.store.env_dir / "runs" / res.run_id)
    stale = next(n.undo_snapshot_stale for n in j.all(Note) if n.undo_snapshot_stale)
    assert stale != res.undo_snapshot_id and stale not in {m.id for m in t.store.list()}
    # The undo snapshot holds the state the rollback replaced, the late cache included.
    w.manager.on_stop = None
    back = commands.rollback(t, res.undo_snapshot_id)
    assert back.exit_code == 0 and version(t) == "2.0.0" and cache.read_bytes() == b"compiled while stopping"


def test_an_undo_snapshot_still_current_costs_one_walk_in_the_window(world: Pair) -> None:
    w, t = world
    assert commands.run(t).status == "upgraded"
    res = commands.rollback(t)
    assert [s.name for s in res.steps] == ["restore-prepare", "snapshot", "stop", "snapshot-check", "restore", "start"]
    j = journal.RunJournal.load(t.store.env_dir / "runs" / res.run_id)
    snap_step = next(s for s in j.all(Step) if s.name == "snapshot")
    stop_at = next(i for i, r in enumerate(j.records) if isinstance(r, Step) and r.name == "stop")
    assert snap_step.served is True and j.records.index(snap_step) < stop_at
    assert not any(n.undo_snapshot_stale for n in j.all(Note))
    assert res.downtime is not None and res.downtime.seconds >= sum(res.downtime.parts.values()) - 0.005  # steps rounded to 1 ms
    # A service that was not running: nothing to serve, no downtime, the snapshot in place.
    w.manager.up = False
    res = commands.rollback(t, res.undo_snapshot_id)
    assert res.downtime is None and [s.name for s in res.steps][:2] == ["restore-prepare", "stop"]
