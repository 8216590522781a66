"""`rewheel status` on a real venv, a real local index and the real toy model server: the key
versions, the snapshot the live environment equals or what differs from the newest, a
command holding the lock, an interrupted run (exit 4 after the report), the service's state
and health, pinned and failed-build snapshots — without reading the environment's files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rewheel.journal import EnvLock
from rewheel.recipe import load_recipe
from rewheel.commands import open_target
from support_run import Host, make_host
from test_json_shapes import check as check_shape
import support_cli


@pytest.fixture
def host(tmp_path: Path):
    h = make_host(tmp_path, "2.0.0", "good")
    h.start_service()
    yield h
    h.stop_service()
    h._index.stop()  # type: ignore[attr-defined]


def status(h: Host, code: int = 0) -> dict:
    cp = h.rewheel("status", str(h.recipe), "--json")
    assert cp.returncode == code, cp.stdout + cp.stderr
    return json.loads(cp.stdout)


def test_status_follows_an_upgrade_a_rollback_and_a_pin(host: Host) -> None:
    h = host
    st = status(h)
    assert st["key_packages"] == {"toypkg": "1.0.0"}
    assert st["equals"] is None and st["newest"] is None and st["snapshots"] == 0
    assert st["service"]["state"] == "active" and st["service"]["up"] is True
    assert st["service"]["health"]["ok"] is True
    assert st["interrupted"] is None and st["running"] is None and st["damaged"] == []

    code, rep = h.run_json()
    assert code == 0, rep["_stderr"]
    st = status(h)
    assert st["key_packages"] == {"toypkg": "2.0.0"}
    check_shape("status-differs", st)
    # The only snapshot is the pre-upgrade one: the live environment is 1 package from it.
    assert st["equals"] is None and st["newest"]["id"] == rep["snapshot_id"]
    assert [(c["name"], c["old"], c["new"], c["change"]) for c in st["differs_from_newest"]] == [
        ("toypkg", "1.0.0", "2.0.0", "upgraded")]
    assert st["last_run"]["kind"] == "run" and st["last_run"]["status"] == "upgraded"

    rb = h.rewheel("rollback", str(h.recipe), "--yes", "--json")
    assert rb.returncode == 0, rb.stderr
    undo = json.loads(rb.stdout)["undo_snapshot_id"]
    assert h.rewheel("pin", str(h.recipe), undo).returncode == 0
    st = status(h)
    assert st["key_packages"] == {"toypkg": "1.0.0"}
    assert st["equals"]["id"] == rep["snapshot_id"] and st["newest"]["id"] == undo
    assert st["differs_from_newest"] == [] and st["pinned"] == [undo]
    check_shape("status", st)
    human = h.rewheel("status", str(h.recipe))
    assert human.returncode == 0
    text = " ".join(human.stdout.split())  # as wrapped for 80 columns, joined again
    assert f"equals snapshot {rep['snapshot_id']}" in text and f"pinned: {undo}" in text
    assert "toypkg 1.0.0" in text and "is active, healthy" in text


def test_status_reads_no_file_of_the_environment(host: Host) -> None:
    h = host
    payload = next(h.prefix.glob("lib/python3*/site-packages/toypkg/core.py"))
    saved = payload.read_bytes()
    # A FIFO in place of a payload file: reading (hashing) it would block until the timeout.
    payload.unlink()
    os.mkfifo(payload)
    try:
        cp = h.rewheel("status", str(h.recipe), "--json", timeout=60)
        assert cp.returncode == 0, cp.stderr
        assert json.loads(cp.stdout)["key_packages"] == {"toypkg": "1.0.0"}
    finally:
        payload.unlink()
        payload.write_bytes(saved)


def test_status_names_the_holder_and_an_interrupted_run(host: Host) -> None:
    h = host
    t = open_target(load_recipe(h.recipe))
    with EnvLock(t.store.env_dir, "run", prefix=t.env.prefix):
        st = status(h)
    running = st["running"]
    assert (running["pid"], running["purpose"], running["run_id"], running["step"]) == (os.getpid(), "run", None, None)

    cp = h.rewheel("run", str(h.recipe), "--yes", "--quiet", env={"REWHEEL_FAULT_AT": "step:smoke"})
    assert cp.returncode == -9, cp.stderr
    st = status(h, code=4)  # reported in full, then exit 4 like every read-only command
    assert st["interrupted"]["kind"] == "run" and st["interrupted"]["last_step"] == "smoke"
    assert st["running"] is None
    assert st["service"]["up"] is False and st["service"]["health"]["ok"] is False
    human = h.rewheel("status", str(h.recipe))
    assert human.returncode == 4 and "interrupted run" in " ".join(human.stdout.split())
    assert h.rewheel("resume", str(h.recipe), "--yes").returncode == 0
    st = status(h)
    assert st["interrupted"] is None and st["service"]["health"]["ok"] is True
    assert st["key_packages"] == {"toypkg": "1.0.0"}


def test_status_says_equals_only_when_the_files_are_the_snapshots_and_prefers_a_good_build(host: Host) -> None:
    h = host
    assert h.rewheel("snapshot", str(h.recipe), "--label", "good").returncode == 0
    good = status(h)["equals"]["id"]
    core = next(h.prefix.glob("lib/python3*/site-packages/toypkg/core.py"))
    saved, st0 = core.read_bytes(), core.stat()
    # An edit in place: the versions still match, the files do not.
    core.write_bytes(saved + b"# edited\n")
    st = status(h)
    assert st["equals"] is None and st["differs_from_newest"] == []
    assert [(o["id"], o["failed_build"]) for o in st["same_versions"]] == [(good, False)]
    assert "toypkg/core.py" in st["same_versions"][0]["differs"]
    text = " ".join(h.rewheel("status", str(h.recipe)).stdout.split())
    assert f"same versions as snapshot {good}" in text and "its files differ" in text
    assert "equals snapshot" not in text
    # A failed build with the live versions, taken of that edited state, is newer than the good
    # snapshot; once the edit is undone only the good one is the live environment.
    assert h.rewheel("snapshot", str(h.recipe), "--label", "edited").returncode == 0
    t = open_target(load_recipe(h.recipe))
    failed = next(m for m in t.store.list() if m.label == "edited")
    failed.extra["failed_build"] = True
    failed.save()
    core.write_bytes(saved)
    os.utime(core, ns=(st0.st_atime_ns, st0.st_mtime_ns))
    st = status(h)
    assert st["equals"]["id"] == good, st
    assert [o["id"] for o in st["same_versions"]] == [failed.id]


def test_a_live_run_is_running_not_interrupted_and_its_ctrl_c_says_the_service_is_stopped(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    h = make_host(tmp_path, "2.0.0", "smoke-hangs")
    h.start_service()
    try:
        # The recipe as the operator typed it: a path relative to where rewheel runs.
        run = subprocess.Popen([sys.executable, "-m", "rewheel", "run", h.recipe.name, "--yes"], cwd=h.recipe.parent,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        st: dict = {}
        while time.monotonic() < deadline and (st.get("running") or {}).get("step") != "smoke":
            st = status(h)  # exit 0 throughout: a live run is not an interrupted one
            time.sleep(0.2)
        live = st["running"]
        assert live["pid"] == run.pid and live["purpose"] == "run" and live["kind"] == "run", st
        assert live["run_id"] and time.time() - 60 < live["since"] <= time.time()
        assert st["interrupted"] is None
        hist = h.rewheel("history", str(h.recipe), "--json")
        assert hist.returncode == 0, hist.stderr
        doc = json.loads(hist.stdout)
        assert doc["interrupted_run"] is None and doc["running"]["run_id"] == live["run_id"]
        assert doc["runs"][0]["id"] == live["run_id"] and doc["runs"][0]["status"] == "running"
        human = h.rewheel("status", str(h.recipe))
        assert human.returncode == 0
        text = " ".join(human.stdout.split())
        assert f"running now: rewheel run (pid {run.pid})" in text and "step smoke" in text and "interrupted run" not in text
        run.send_signal(signal.SIGINT)  # Ctrl-C while the service is down
        _, err = run.communicate(timeout=60)
        assert run.returncode == 4, err
        said = " ".join(err.split())
        assert "is STOPPED" in said and f"`rewheel resume {h.recipe.name}`" in said, said
        assert h.served_version() is None
        st = status(h, code=4)  # now it is interrupted
        assert st["running"] is None and st["interrupted"]["id"] == live["run_id"]
        cp = support_cli.rewheel("resume", h.recipe.name, "--yes", cwd=h.recipe.parent,
                                 stdin=subprocess.DEVNULL, timeout=120)
        assert cp.returncode == 0, cp.stderr
        assert h.served_version() == "1.0.0"
    finally:
        h.stop_service()
        h._index.stop()  # type: ignore[attr-defined]
