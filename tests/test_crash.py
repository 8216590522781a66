"""Crash safety: `kill -9` of rewheel at a step boundary of a run, then resume.

The fault hook (`REWHEEL_FAULT_AT`) SIGKILLs the process right after the named journal
record is durable, which is what a power cut or an OOM kill at that boundary does. The
boundaries of a kept and of a reverted run are the fault suites' sample
(`support_killpoints.sample`: a spread over the whole run, moved by each session's seed;
`REWHEEL_KILLPOINTS=all` every one)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from support_killpoints import sample
from support_run import make_host

GOOD_RUN_BOUNDARIES = ["step:stop", "note", "step:snapshot", "snapshot", "step:reinstall", "step:diff", "installed",
                       "step:smoke", "step:start", "healthy", "step:keep", "finished"]
FAILING_RUN_BOUNDARIES = ["step:revert", "step:restore", "step:start"]


@pytest.mark.parametrize("variant, fault", [("good", f) for f in sample(GOOD_RUN_BOUNDARIES, "crash-kept")]
                         + [("smoke-fails", f) for f in sample(FAILING_RUN_BOUNDARIES, "crash-reverted")])
def test_kill_at_every_boundary_then_resume(tmp_path: Path, variant: str, fault: str) -> None:
    h = make_host(tmp_path, "2.0.0", variant)
    try:
        h.start_service()
        before = h.state()
        cp = h.rewheel("run", str(h.recipe), "--yes", "--quiet", env={"REWHEEL_FAULT_AT": fault})
        assert cp.returncode == -9, f"expected SIGKILL at {fault}: rc={cp.returncode}\n{cp.stderr}"

        if fault == "finished":
            # The run was complete and recorded before the kill: nothing is pending.
            assert h.rewheel("history", str(h.recipe)).returncode == 0
            assert h.served_version() == "2.0.0"
            return

        # Every command now reports the interrupted run and exits 4...
        hist = h.rewheel("history", str(h.recipe), "--json")
        assert hist.returncode == 4, hist.stderr
        assert json.loads(hist.stdout)["interrupted_run"]
        assert "interrupted" in hist.stderr
        again = h.rewheel("run", str(h.recipe), "--yes")
        assert again.returncode == 4 and "resume" in again.stderr

        # ...until resume finishes or undoes it.
        res = h.rewheel("resume", str(h.recipe), "--yes", "--json")
        assert res.returncode == 0, res.stderr
        outcome = json.loads(res.stdout)
        if fault == "step:keep":
            assert outcome["status"] == "upgraded"  # every check had passed: finish recording
            assert h.served_version() == "2.0.0"
        else:
            assert outcome["status"] in ("reverted", "aborted"), outcome
            assert h.state() == before  # byte-exact
            assert h.served_version() == "1.0.0"
        assert h.rewheel("history", str(h.recipe)).returncode == 0
    finally:
        h.stop_service()
        h._index.stop()  # type: ignore[attr-defined]


def test_rollback_also_clears_an_interrupted_run(tmp_path: Path) -> None:
    h = make_host(tmp_path, "3.0.0", "smoke-fails")
    try:
        h.start_service()
        before = h.state()
        cp = h.rewheel("run", str(h.recipe), "--yes", "--quiet", env={"REWHEEL_FAULT_AT": "step:smoke"})
        assert cp.returncode == -9
        rb = h.rewheel("rollback", str(h.recipe), "--yes", "--json")
        assert rb.returncode == 0, rb.stderr
        assert json.loads(rb.stdout)["finished_interrupted_run"]
        assert h.state() == before
        assert h.served_version() == "1.0.0"
        assert h.rewheel("history", str(h.recipe)).returncode == 0
    finally:
        h.stop_service()
        h._index.stop()  # type: ignore[attr-defined]


@pytest.mark.parametrize("fault, lanes", [("step:restore", None), ("restore-commit:2", "1"),
                                          ("restore-commit:2", "2")])
def test_interrupted_rollback_is_finished_by_resume(tmp_path: Path, fault: str, lanes: str | None) -> None:
    """SIGKILL of a rollback as its restore starts, or halfway through the restore's commit
    (some files relinked, others not, a second lane possibly still at work): `resume`
    finishes the rollback byte-exact and the service is back on the old build."""
    h = make_host(tmp_path, "2.0.0", "good")
    try:
        h.start_service()
        before = h.state()
        snap = json.loads(h.rewheel("snapshot", str(h.recipe), "--json").stdout)["id"]
        code, rep = h.run_json()
        assert code == 0 and h.served_version() == "2.0.0", rep["_stderr"]
        env = {"REWHEEL_FAULT_AT": fault, **({"REWHEEL_RESTORE_LANES": lanes} if lanes else {})}
        cp = h.rewheel("rollback", str(h.recipe), snap, "--yes", env=env)
        assert cp.returncode == -9, cp.stderr
        if fault.startswith("restore-commit"):
            assert h.state() != before  # killed midway: neither the old nor the new build
        assert h.rewheel("history", str(h.recipe)).returncode == 4
        res = h.rewheel("resume", str(h.recipe), "--yes", "--json")
        if res.returncode == 4:  # a second lane still finishing its share held the lock
            time.sleep(2)
            res = h.rewheel("resume", str(h.recipe), "--yes", "--json")
        assert res.returncode == 0, res.stderr
        assert h.state() == before
        assert h.served_version() == "1.0.0"
        snaps = json.loads(h.rewheel("history", str(h.recipe), "--json").stdout)["snapshots"]
        assert not any(s["status"] == "failed-upgrade" for s in snaps)
    finally:
        h.stop_service()
        h._index.stop()  # type: ignore[attr-defined]
