"""Pin, unpin and forget one snapshot, and retention that never prunes a pinned snapshot and
prunes failed builds last, saying what it removed. Real snapshots of a real venv made by
uv with real wheels, through the `rewheel` command; retention order on the tiny environment
of test_cycle_unit.py."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from rewheel import commands
from rewheel.commands.snapshots import pruned_text
from support_env import make_venv, uv_install
from test_json_shapes import check as check_shape
from support_cycle import World
import support_cli

Pair = tuple[World, commands.Target]


def rewheel(*args: str) -> subprocess.CompletedProcess:
    return support_cli.rewheel(*args, stdin=subprocess.DEVNULL, env=dict(os.environ), timeout=120)


def doc(cp: subprocess.CompletedProcess, code: int) -> dict:
    assert cp.returncode == code, cp.stdout + cp.stderr
    return json.loads(cp.stdout)


@pytest.fixture
def venv(tmp_path: Path, wheelhouse: Path) -> Path:
    py = make_venv(tmp_path / "env")
    uv_install(py, "toypkg==1.0.0", find_links=wheelhouse)
    return py


def test_pin_unpin_forget_through_the_cli(venv: Path) -> None:
    py = str(venv)
    a = doc(rewheel("snapshot", "--python", py, "--label", "keep me", "--json"), 0)["id"]
    b = doc(rewheel("snapshot", "--python", py, "--json"), 0)["id"]

    pinned = doc(rewheel("pin", "--python", py, "keep me", "--json"), 0)
    assert pinned == {"snapshot_id": a, "label": "keep me", "status": "manual", "pinned": True, "changed": True}
    check_shape("pin", pinned)
    again = rewheel("pin", "--python", py, a)
    assert again.returncode == 0 and "already pinned: `[snapshots] keep` never prunes it" in " ".join(again.stdout.split())
    hist = doc(rewheel("history", "--python", py, "--json"), 0)
    assert {s["id"]: s.get("pinned", False) for s in hist["snapshots"]} == {a: True, b: False}
    assert f"pinned (never pruned): {a}" in rewheel("history", "--python", py).stdout

    # A pinned snapshot is not forgotten: exit 2 naming it, nothing removed.
    refused = doc(rewheel("forget", "--python", py, a, "--yes", "--json"), 2)
    assert a in refused["message"] and "pinned" in refused["message"] and "unpin" in refused["hint"]
    # Without a terminal and without --yes, nothing is removed either.
    assert rewheel("forget", "--python", py, b).returncode == 2
    gone = doc(rewheel("forget", "--python", py, b, "--yes", "--json"), 0)
    assert gone["removed"] == b and gone["status"] == "manual"
    check_shape("forget", gone)
    ids = [s["id"] for s in doc(rewheel("history", "--python", py, "--json"), 0)["snapshots"]]
    assert ids == [a]
    assert doc(rewheel("unpin", "--python", py, a, "--json"), 0)["pinned"] is False
    assert doc(rewheel("forget", "--python", py, a, "--yes", "--json"), 0)["removed"] == a
    missing = doc(rewheel("forget", "--python", py, a, "--yes", "--json"), 2)
    assert missing["error"] == "SnapshotError" and a in missing["message"]
    assert doc(rewheel("pin", "--python", py, "--json"), 2)["error"] == "UsageError"  # no SNAPSHOT
    empty = doc(rewheel("forget", "--python", py, "", "--yes", "--json"), 2)  # an unset shell variable
    assert empty["error"] == "UsageError" and "empty snapshot reference" in empty["message"]


def test_keep_never_prunes_a_pinned_snapshot_and_says_what_it_removed(venv: Path, tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[environment]\npython = "{venv}"\n[snapshots]\nkeep = 2\n')
    first = doc(rewheel("snapshot", str(recipe), "--label", "first", "--json"), 0)["id"]
    doc(rewheel("pin", str(recipe), first, "--json"), 0)
    made = [doc(rewheel("snapshot", str(recipe), "--json"), 0) for _ in range(3)]
    # Pinned snapshots do not count: two unpinned are kept beside it.
    assert made[2]["pruned"] == [made[0]["id"]]
    ids = {s["id"] for s in doc(rewheel("history", str(recipe), "--json"), 0)["snapshots"]}
    assert ids == {first, made[1]["id"], made[2]["id"]}
    human = rewheel("snapshot", str(recipe))
    assert human.returncode == 0 and f"pruned old snapshots: {made[1]['id']}" in human.stdout


def test_a_failed_build_outlives_keep_runs_then_goes_named(world: Pair) -> None:
    """Retention (docs/snapshots.md#retention): what a run's report named — a reverted run's
    pre-upgrade snapshot and failed build, for its `diff` — stays through the next `keep` runs
    whatever `keep` says of the count, then goes with the others; the report says what each was."""
    w, t = world
    t = dataclasses.replace(t, recipe=dataclasses.replace(t.recipe, keep=1))
    w.smoke_fails = True
    rep = commands.run(t)
    failed = rep.revert.failed_snapshot_id
    w.smoke_fails = False
    up = commands.run(t)
    assert up.status == "upgraded"
    # One run later (no more than keep = 1): the reverted run's two stay beside the newest.
    assert up.pruned == [] and {rep.snapshot_id, failed} <= {m.id for m in t.store.list()}
    again = commands.run(t)
    # Two runs later: they go (oldest first), and the report says which was a failed build.
    assert set(again.pruned) == {rep.snapshot_id, failed} and again.to_json()["pruned"] == again.pruned
    assert "a failed build" in pruned_text(t.store, again.pruned)
    assert {rep.snapshot_id, failed}.isdisjoint(m.id for m in t.store.list())


def test_a_kept_run_reports_what_it_pruned(tmp_path: Path) -> None:
    from support_run import make_host

    h = make_host(tmp_path, "2.0.0", "good")
    try:
        h.write_recipe(service=None, snapshots={"keep": 1})
        first = doc(rewheel("snapshot", str(h.recipe), "--json"), 0)["id"]
        cp = h.rewheel("run", str(h.recipe), "--yes")
        assert cp.returncode == 0, cp.stderr
        assert f"pruned old snapshots ([snapshots] keep): {first}" in " ".join(cp.stdout.split())
    finally:
        h._index.stop()  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", ["", ".", "..", "../other", ".deleting-x"])
def test_store_delete_refuses_what_is_not_one_snapshot(venv: Path, bad: str) -> None:
    """`Store.delete` with an id that is not one snapshot's folder (an empty string once
    came from a failed `--json` parse in a script) removes nothing: the store and every
    snapshot in it stay."""
    from rewheel.environment import Environment
    from rewheel.errors import SnapshotError
    from rewheel.snapshot import Store

    sid = doc(rewheel("snapshot", "--python", str(venv), "--json"), 0)["id"]
    store = Store(Environment.inspect(venv).prefix)
    with pytest.raises(SnapshotError, match="not a snapshot id"):
        store.delete(bad)
    assert [m.id for m in store.list()] == [sid] and (store.snapshots_dir / sid / "manifest.bin").is_file()
