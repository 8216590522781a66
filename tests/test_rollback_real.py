"""Rollback without footguns, end to end: a real venv, a real local index, the real toy model
server under the `command` manager, `rewheel` run as a user runs it.

- a failed build is refused without --force (exit 2, nothing touched, the service left up);
- with --force, a failed build whose service cannot start: exit 3, the root cause read from
  the service's log, no interrupted run left behind, and the rollback undone from the
  snapshot it took;
- roll forward to an upgraded build after its nightly left the index;
- under a real systemd (booted in a container, tests/support_systemd.py), the cause read from
  the unit's journal.
"""

from __future__ import annotations

import json
import shutil


from support_run import Host


def rollback(h: Host, *args: str) -> tuple[int, dict, str]:
    cp = h.rewheel("rollback", str(h.recipe), *args, "--yes", "--json")
    return cp.returncode, (json.loads(cp.stdout) if cp.stdout.strip() else {}), cp.stderr


def test_failed_build_guard_service_failure_and_undo(host_factory) -> None:
    h = host_factory("4.0.0", "service-fails")
    before = h.state()
    code, rep = h.run_json()
    assert code == 1, rep["_stderr"]
    bad = rep["revert"]["failed_snapshot_id"]

    # Refused without --force: exit 2 naming the snapshot and its label; nothing touched.
    code, doc, err = rollback(h, bad)
    assert code == 2, err
    assert doc["error"] == "SnapshotError" and bad in doc["message"] and "failed upgrade of run" in doc["message"]
    assert "--force" in doc["hint"]
    assert h.state() == before and h.served_version() == "1.0.0"

    # Forced: the files are the failed build's, its service does not come up. Exit 3, the
    # root cause from the service's log, and the journal finished.
    code, doc, err = rollback(h, bad, "--force")
    assert code == 3, err
    assert doc["status"] == "service-failed" and doc["exit_code"] == 3
    assert "CUDA error" in doc["root_cause"]["message"] and "CUDA error" in doc["error"]
    assert doc["undo_snapshot_id"] and doc["undo_snapshot_id"] in doc["hint"]
    hist = h.rewheel("history", str(h.recipe), "--json")
    assert hist.returncode == 0, hist.stderr  # no stale interrupted record: not exit 4
    runs = json.loads(hist.stdout)["runs"]
    assert runs[0]["kind"] == "rollback" and runs[0]["status"] == "failed"
    undo = next(s for s in json.loads(hist.stdout)["snapshots"] if s["id"] == doc["undo_snapshot_id"])
    assert undo["status"] == "pre-rollback" and undo["label"].startswith("before rollback ")

    # Undo it: the state the forced rollback replaced, the service healthy on 1.0.0 again.
    code, doc, err = rollback(h, doc["undo_snapshot_id"])
    assert code == 0, err
    assert doc["status"] == "restored" and doc["service"]["ok"]
    assert h.served_version() == "1.0.0"
    assert h.state() == before


def test_roll_forward_after_the_nightly_left_the_index(host_factory) -> None:
    h = host_factory("2.0.0", "good")
    code, rep = h.run_json()
    assert code == 0, rep["_stderr"]
    upgraded = h.state()
    assert h.served_version() == "2.0.0"
    # The nightly is gone: the index stops and its wheels are deleted.
    h._index.stop()  # type: ignore[attr-defined]
    shutil.rmtree(h.wheels)

    code, doc, err = rollback(h)
    assert code == 0, err
    assert doc["snapshot_id"] == rep["snapshot_id"] and h.served_version() == "1.0.0"
    assert doc["undo_snapshot_id"] and doc["undo_snapshot_error"] is None
    # The undo snapshot was taken while the service served; in the window only one stat walk
    # proved it current. The downtime is reported as a run's: the stop, that check, the
    # restore, the start and the wait for health.
    names = [s["name"] for s in doc["steps"]]
    assert names == ["restore-prepare", "snapshot", "stop", "snapshot-check", "restore", "start"], names
    dt = doc["downtime"]
    assert set(dt["parts"]) == {"stop", "snapshot", "restore", "start", "ready"} and "ongoing" not in dt
    assert 0 < sum(dt["parts"].values()) <= dt["seconds"] + 0.005  # each part rounded to 1 ms
    served = next(s for s in doc["steps"] if s["name"] == "snapshot")["seconds"]
    assert dt["parts"]["snapshot"] == next(s for s in doc["steps"] if s["name"] == "snapshot-check")["seconds"]
    assert served > 0
    hist = json.loads(h.rewheel("history", str(h.recipe), "--json").stdout)
    assert hist["runs"][0]["kind"] == "rollback" and hist["runs"][0]["downtime"]["seconds"] == dt["seconds"]

    code, doc, err = rollback(h, doc["undo_snapshot_id"])
    assert code == 0, err
    assert h.served_version() == "2.0.0" and h.state() == upgraded


def test_under_systemd_the_cause_comes_from_the_units_journal(systemd_host, real_systemd) -> None:
    from support_standins import wait_for

    h = systemd_host("4.0.0", "service-fails")
    code, rep = h.run_json()
    assert code == 1, rep["_stderr"]
    bad = rep["revert"]["failed_snapshot_id"]
    code, doc, err = rollback(h, bad, "--force")
    assert code == 3, err
    assert doc["status"] == "service-failed"
    assert "no kernel image is available" in doc["root_cause"]["message"]
    assert "vllm-toy" in doc["diagnosis"]["source"]  # the unit's journal was read
    st = h.rewheel("status", str(h.recipe), "--json")
    assert st.returncode == 0, st.stderr  # finished: no interrupted run
    # The state the forced rollback replaced was the verified old build: not a failed one.
    assert json.loads(st.stdout)["failed_builds"] == [bad]
    code, doc, err = rollback(h, doc["undo_snapshot_id"])
    assert code == 0, err
    wait_for(lambda: h.served_version() == "1.0.0", timeout=20)
    assert real_systemd.show("vllm-toy", "ActiveState")["ActiveState"] == "active"
