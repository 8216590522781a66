"""Kills at the three moments issue #30 found `resume` could not undo: a rollback killed before
it records whether the service ran, rewheel killed while it records the pid of a service it just
started, and a kill during the unshare after a staged upgrade was kept. Each is a real SIGKILL
(the journal's fault hook, or strace's inject at the exact calls) of a real run on a real host,
followed by `rewheel resume` and the proof of tests/support_killpoints.py. Also: `status` and
`verify` name what a killed rewheel left inside an environment.

The strace trials are a sample, as the kill-point suite's (`support_killpoints.sample`:
REWHEEL_KILLPOINTS, REWHEEL_FAULT_SEED)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from support_killpoints import Bench, KillPoint, Scenario, sample, summary

pytestmark = pytest.mark.slow
needs_strace = pytest.mark.skipif(shutil.which("strace") is None and os.environ.get("REWHEEL_TESTS_STRACE") != "require",
                   reason="strace is not installed (CI installs it: .ci/run)")


def _after_calls(points: list[KillPoint], marker: str, following: int = 1) -> list[KillPoint]:
    """The calls on a path containing `marker`, each with the `following` calls after it (the
    folder's fsync after a rename)."""
    picked: list[KillPoint] = []
    for i, p in enumerate(points):
        if marker in p.what:
            picked += [q for q in points[i:i + 1 + following] if q not in picked]
    return picked


@pytest.mark.parametrize("sig", ["KILL", "TERM"])
def test_a_rollback_killed_before_it_records_the_service_state(tmp_path: Path, sig: str) -> None:
    """Killed right after its journal began: the service still runs (nothing was stopped), and
    `resume` must leave it running — it used to stop it for good."""
    b = Bench(tmp_path, Scenario("rollback", "rollback"))
    try:
        out = b.signal_at("started#1", sig)
        assert out.rc == (-signal.SIGKILL if sig == "KILL" else 4), out
        assert out.exact, out.problems
        assert b.served() in ("1.0.0", "2.0.0")
    finally:
        b.close()


@needs_strace
@pytest.mark.parametrize("scenario", [Scenario("kept", "run", "good", staged=False),
                                      Scenario("reverted", "run", "smoke-fails", staged=False),
                                      Scenario("rollback", "rollback")], ids=lambda s: s.name)
def test_killed_while_recording_the_started_service(tmp_path: Path, scenario: Scenario) -> None:
    """SIGKILL at every write, rename and fsync of `service.json` and `service.pid` (the start
    of the new build, of the old one in a revert, of a rollback's target): `resume` recognises
    the service rewheel started (by the token in its environment), stops it, and finishes —
    no untested build left serving, no restore's staging folder left in the prefix."""
    b = Bench(tmp_path, scenario, count=True)
    try:
        counted = b.points()  # the reference run's count, for both files
        points = list(dict.fromkeys(_after_calls(counted, "service.pid") + _after_calls(counted, "service.json")))
        assert points
        outcomes = [b.kill_at(p) for p in sample(points, f"records-{scenario.name}")]
        assert all(o.exact for o in outcomes), summary(scenario.name, outcomes)
    finally:
        b.close()


@needs_strace
def test_killed_during_the_unshare_after_keep(tmp_path: Path) -> None:
    """SIGKILL at each call of the unshare (the copies beside the files, their renames): `resume`
    finishes it — no `.rewheel-unshare` file left, no installed file linked into uv's cache."""
    b = Bench(tmp_path, Scenario("staged-kept", "run", "good", staged=True), count=True)
    try:
        points = [p for p in b.points() if "rewheel-unshare" in p.what]
        assert len(points) >= 5, points
        outcomes = [b.kill_at(p) for p in sample(points, "unshare")]
        assert all(o.exact for o in outcomes), summary("unshare", outcomes)
        assert {o.ended for o in outcomes} == {"after"}  # every check had passed: kept
    finally:
        b.close()


def test_status_and_verify_name_what_a_killed_rewheel_left(tmp_path: Path) -> None:
    b = Bench(tmp_path, Scenario("staged-kept", "run", "good", staged=True))
    try:
        site = next((b.h.prefix / "lib").glob("python3*/site-packages"))
        unshare = site / "toypkg" / ".core.py.rewheel-unshare"
        shutil.copy2(site / "toypkg" / "core.py", unshare)
        staging = site / ".rewheel-restore-0a1b2c3d"
        staging.mkdir()
        st = b.h.rewheel("status", str(b.h.recipe), "--json")
        assert st.returncode == 0, st.stderr
        assert json.loads(st.stdout)["strays"] == sorted([str(unshare), str(staging)])
        human = b.h.rewheel("status", str(b.h.recipe))
        assert "left inside the environment" in human.stdout and str(unshare) in human.stdout
        v = b.h.rewheel("verify", str(b.h.recipe), "--json")
        assert v.returncode == 3, v.stderr
        doc = json.loads(v.stdout)
        assert doc["ok"] is False and doc["strays"] == sorted([str(unshare), str(staging)])
        # Nothing left: both say so no more.
        unshare.unlink()
        staging.rmdir()
        assert "strays" not in json.loads(b.h.rewheel("status", str(b.h.recipe), "--json").stdout)
        assert b.h.rewheel("verify", str(b.h.recipe)).returncode == 0
    finally:
        b.close()
