"""Signals during a revert, a rollback and a resume: the moment an operator presses Ctrl-C
("the revert looks stuck"), a service manager stops rewheel, or the terminal goes away.

The fault hook sends the signal (`REWHEEL_FAULT_SIGNAL`: TERM, INT, HUP or KILL) right after a
journal record is durable (`step:restore`) or halfway through the restore's commit
(`restore-commit:2`: two files put in place, the rest not). Whatever arrives, the run must stay
recorded as interrupted, and `resume` must finish the revert: the environment byte for byte as
before the run, and the old service serving."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from support_run import make_host

SIGNALS = ["TERM", "INT", "HUP", "KILL"]


def _resume_restores(h, before: dict) -> dict:
    """The run is recorded as interrupted (every command exits 4), and `resume` puts the old
    state back byte for byte, the old build serving."""
    hist = h.rewheel("history", str(h.recipe), "--json")
    assert hist.returncode == 4 and json.loads(hist.stdout)["interrupted_run"], hist.stderr
    res = h.rewheel("resume", str(h.recipe), "--yes", "--json")
    assert res.returncode == 0, res.stderr
    assert h.state() == before
    assert h.served_version() == "1.0.0"
    assert h.rewheel("history", str(h.recipe)).returncode == 0
    return json.loads(res.stdout)


def _exit_for(sig: str) -> int:
    # Polite signals end rewheel like Ctrl-C (exit 4: an interrupted run is recorded); SIGKILL
    # ends it where it stands.
    return -signal.SIGKILL if sig == "KILL" else 4


@pytest.mark.parametrize("fault", ["step:restore", "restore-commit:2"])
@pytest.mark.parametrize("sig", SIGNALS)
def test_a_signal_during_the_revert_leaves_a_run_that_resume_finishes(tmp_path: Path, sig: str,
                                                                      fault: str) -> None:
    h = make_host(tmp_path, "2.0.0", "smoke-fails")
    try:
        h.start_service()
        before = h.state()
        cp = h.rewheel("run", str(h.recipe), "--yes", "--quiet",
                       env={"REWHEEL_FAULT_AT": fault, "REWHEEL_FAULT_SIGNAL": sig})
        assert cp.returncode == _exit_for(sig), cp.stderr
        if sig != "KILL":
            assert "resume" in cp.stderr
        assert _resume_restores(h, before)["status"] == "reverted"
        # No half-restored state was kept as the "failed build".
        snaps = json.loads(h.rewheel("history", str(h.recipe), "--json").stdout)["snapshots"]
        assert sum(s["status"] == "failed-upgrade" for s in snaps) <= 1
    finally:
        h.stop_service()
        h._index.stop()  # type: ignore[attr-defined]


@pytest.mark.parametrize("sig", ["TERM", "KILL"])
def test_a_resume_interrupted_in_its_own_restore_is_finished_by_the_next(tmp_path: Path, sig: str) -> None:
    h = make_host(tmp_path, "2.0.0", "smoke-fails")
    try:
        h.start_service()
        before = h.state()
        cp = h.rewheel("run", str(h.recipe), "--yes", "--quiet", env={"REWHEEL_FAULT_AT": "restore-commit:2"})
        assert cp.returncode == -signal.SIGKILL, cp.stderr
        again = h.rewheel("resume", str(h.recipe), "--yes",
                          env={"REWHEEL_FAULT_AT": "step:restore", "REWHEEL_FAULT_SIGNAL": sig})
        assert again.returncode == _exit_for(sig), again.stderr
        _resume_restores(h, before)
    finally:
        h.stop_service()
        h._index.stop()  # type: ignore[attr-defined]


@pytest.mark.parametrize("sig", ["INT", "HUP"])
def test_a_signal_during_a_rollbacks_restore_is_finished_by_resume(tmp_path: Path, sig: str) -> None:
    h = make_host(tmp_path, "2.0.0", "good")
    try:
        h.start_service()
        before = h.state()
        snap = json.loads(h.rewheel("snapshot", str(h.recipe), "--json").stdout)["id"]
        code, rep = h.run_json()
        assert code == 0 and h.served_version() == "2.0.0", rep["_stderr"]
        cp = h.rewheel("rollback", str(h.recipe), snap, "--yes",
                       env={"REWHEEL_FAULT_AT": "restore-commit:2", "REWHEEL_FAULT_SIGNAL": sig,
                            "REWHEEL_RESTORE_LANES": "1"})
        assert cp.returncode == 4, cp.stderr
        _resume_restores(h, before)
    finally:
        h.stop_service()
        h._index.stop()  # type: ignore[attr-defined]
