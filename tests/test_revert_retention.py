"""What reverts leave in the store, on a real venv, a real local index and real runs: `[snapshots]
keep` holds after reverted runs too (a revert prunes, never a pinned snapshot nor the one a
plain rollback needs), and a revert or a resume whose restore changed no byte keeps no
"failed build" snapshot that is the good state itself."""

from __future__ import annotations

import json

from support_run import Host, build_toypkg


def history(h: Host) -> dict:
    cp = h.rewheel("history", str(h.recipe), "--json")
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def test_reverted_runs_are_pruned_to_keep_sparing_the_pinned_and_the_rollback_target(host_factory) -> None:
    h = host_factory("2.0.0", "good", start=False)
    h.write_recipe(service=None, snapshots={"keep": 2})
    assert h.rewheel("snapshot", str(h.recipe), "--label", "pinned one").returncode == 0
    pinned = history(h)["snapshots"][0]["id"]
    assert h.rewheel("pin", str(h.recipe), pinned).returncode == 0
    code, kept = h.run_json()
    assert code == 0 and kept["status"] == "upgraded", kept["_stderr"]
    target = kept["snapshot_id"]  # what a plain rollback restores: the upgrade is in place
    build_toypkg(h.wheels, "3.0.0", "smoke-fails")
    pruned: list[str] = []
    own: list[set[str]] = []
    for i in range(4):
        code, rep = h.run_json()
        assert code == 1 and rep["status"] == "reverted", rep["_stderr"]
        own.append({rep["snapshot_id"], rep["revert"]["failed_snapshot_id"]})
        # Beyond keep = 2, only what must stay: the pinned one, the rollback target, and the
        # snapshots of the runs whose reports are no more than `keep` runs old (this one's and
        # the two before it: the `diff` each printed still works).
        ids = {s["id"] for s in history(h)["snapshots"]}
        assert ids == {pinned, target}.union(*own[max(0, i - 2):]), i
        pruned += rep["pruned"]
    # Four reverted runs left eight snapshots of their own; the first run's went with the fourth.
    assert set(pruned) == own[0] and pinned not in pruned and target not in pruned
    assert len(history(h)["snapshots"]) == 8  # pinned, the rollback target, the last three runs' two
    cp = h.rewheel("rollback", str(h.recipe), "--yes", "--json")
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["snapshot_id"] == target


def test_a_resume_that_changed_no_byte_keeps_no_failed_build(host_factory) -> None:
    h = host_factory("3.0.0", "smoke-fails", start=False)
    h.write_recipe(service=None)
    before = h.state()
    # Killed once the reinstall is journaled, before uv wrote a byte.
    cp = h.rewheel("run", str(h.recipe), "--yes", "--quiet", env={"REWHEEL_FAULT_AT": "step:reinstall"})
    assert cp.returncode == -9, cp.stderr
    cp = h.rewheel("resume", str(h.recipe), "--yes", "--json")
    assert cp.returncode == 0, cp.stderr
    rv = json.loads(cp.stdout)["report"]["revert"]
    assert "failed_snapshot_id" not in rv and rv["failed_snapshot_dropped"]
    assert (rv["restore"]["written"], rv["restore"]["deleted"]) == (0, 0)
    assert h.state() == before
    snaps = history(h)["snapshots"]
    assert [s["status"] for s in snaps] == ["pre-upgrade"], snaps


def test_what_a_report_names_outlives_the_next_keep_runs(host_factory) -> None:
    """Issue 45, item 10: retention keeps the newest `keep` snapshots, and besides them what a
    run (or rollback, or resume) took and named in its report until more than `keep` runs have
    finished after it — the `rewheel diff TARGET <pre> <failed>` a reverted run printed works
    through the next `keep` runs, whatever manual snapshots are taken meanwhile."""
    h = host_factory("2.0.0", "smoke-fails", start=False)
    h.write_recipe(service=None, snapshots={"keep": 2})
    code, a = h.run_json()
    assert code == 1 and a["status"] == "reverted", a["_stderr"]
    pre, failed = a["snapshot_id"], a["revert"]["failed_snapshot_id"]

    def diff_works() -> bool:
        return h.rewheel("diff", str(h.recipe), pre, failed, "--stat").returncode == 0

    manual = []
    for label in ("m1", "m2", "m3"):
        cp = h.rewheel("snapshot", str(h.recipe), "--label", label, "--json")
        assert cp.returncode == 0, cp.stderr
        manual.append(json.loads(cp.stdout)["id"])
    ids = {s["id"] for s in history(h)["snapshots"]}
    assert {pre, failed, manual[1], manual[2]} <= ids and manual[0] not in ids  # the newest 2, and A's
    assert diff_works()
    for n in range(1, 4):
        code, rep = h.run_json()
        assert code == 1 and rep["status"] == "reverted", rep["_stderr"]
        if n <= 2:
            assert diff_works(), f"after {n} later run(s)"
            assert pre not in rep["pruned"] and failed not in rep["pruned"]
        else:
            assert {pre, failed} <= set(rep["pruned"])  # the third later run: more than keep
            assert not diff_works()
