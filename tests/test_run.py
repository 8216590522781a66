"""`rewheel run` end to end: a real venv, a real local index on 127.0.0.1, a real model
server under the command manager, real smoke tests — and the documented exit codes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support_index import closed_port


def test_good_upgrade_exits_0_and_serves_the_new_version(host_factory) -> None:
    h = host_factory("2.0.0", "good")
    code, rep = h.run_json()
    assert code == 0, rep["_stderr"]
    assert rep["status"] == "upgraded"
    assert rep["before"]["toypkg"] == "1.0.0" and rep["after"]["toypkg"] == "2.0.0"
    assert any(c["name"] == "toypkg" and c["change"] == "upgraded" for c in rep["changes"])
    # Staged (the default): prepared while the service served, then stopped for the swap only.
    # Snapshotted while it still served; in the window only the check that nothing changed since.
    assert [s["name"] for s in rep["steps"] if s["ok"]][:5] == ["preflight", "prepare", "snapshot", "stop",
                                                                 "snapshot-check"]
    assert all(s["ok"] for s in rep["steps"])
    assert h.served_version() == "2.0.0"
    down = rep["downtime"]
    assert 0 < down["parts"]["stop"] <= down["seconds"] and down["parts"]["install"] > 0
    hist = h.rewheel("history", str(h.recipe), "--json")
    assert hist.returncode == 0
    assert '"status": "upgraded"' in hist.stdout
    assert json.loads(hist.stdout)["runs"][0]["downtime"] == down


@pytest.mark.parametrize("lanes", [1, 2])
def test_breaking_smoke_reverts_byte_exact_and_names_the_root_cause(host_factory, lanes: int) -> None:
    h = host_factory("3.0.0", "smoke-fails")
    before = h.state()
    # One process restores a small environment by default; two is what a large one gets.
    code, rep = h.run_json(env={"REWHEEL_RESTORE_LANES": str(lanes)})
    assert code == 1, rep["_stderr"]
    assert rep["status"] == "reverted"
    assert h.state() == before
    assert h.served_version() == "1.0.0"
    rc = rep["root_cause"]
    assert rc["type"] == "ValueError"
    assert rc["message"] == "q_lora_rank 1536 must divide num_heads 7 on rank 4"
    assert rc["frame"]["file"].endswith("toypkg/layers.py")
    # layers.py did not change; the upgraded core.py, which now calls into it, is the suspect
    assert [(x["path"], x["change"], x["distance_lines"]) for x in rc["suspects"]] == [("toypkg/core.py", "changed", 0)]
    assert "+    return [build_attention(r) for r in range(8)]" in rc["suspects"][0]["hunks"][0]["text"]
    assert [s["name"] for s in rep["steps"] if not s["ok"]] == ["smoke"]
    assert rep["revert"]["restore"]["verified"] > 0
    assert rep["revert"]["restore"]["lanes"] == lanes
    assert Path(rep["logs"]["smoke"]).read_text().count("Traceback") >= 1


def test_service_that_fails_after_upgrade_is_reverted(host_factory) -> None:
    h = host_factory("4.0.0", "service-fails")
    before = h.state()
    code, rep = h.run_json()
    assert code == 1, rep["_stderr"]
    assert h.state() == before
    assert h.served_version() == "1.0.0"
    assert rep["failure"]["step"] == "start"
    assert "CUDA error" in (rep["root_cause"] or {}).get("message", ""), rep["root_cause"]


def test_hanging_smoke_is_killed_and_reverted(host_factory) -> None:
    h = host_factory("5.0.0", "smoke-hangs")
    h.write_recipe(smoke__timeout_s=3)
    before = h.state()
    code, rep = h.run_json()
    assert code == 1, rep["_stderr"]
    assert h.state() == before
    assert "timed out" in rep["failure"]["message"]
    assert h.served_version() == "1.0.0"


def test_service_that_never_becomes_healthy_is_reverted(host_factory) -> None:
    h = host_factory("6.0.0", "never-healthy")
    h.write_recipe(service__ready_timeout_s=4)
    before = h.state()
    code, rep = h.run_json()
    assert code == 1, rep["_stderr"]
    assert h.state() == before
    assert h.served_version() == "1.0.0"
    assert "did not become healthy within 4s" in rep["failure"]["message"]


def test_revert_that_cannot_verify_the_old_service_exits_3(host_factory) -> None:
    h = host_factory("2.0.0", "good")
    # A health URL no build answers: the new build fails, and so does the restored old one.
    h.write_recipe(service__health_url=f"http://127.0.0.1:{h.port}/never", service__ready_timeout_s=3)
    before = h.state()
    code, rep = h.run_json()
    assert code == 3, rep["_stderr"]
    assert rep["status"] == "failed"
    assert h.state() == before  # the files were restored; the service could not be verified
    assert "did not become healthy" in rep["revert"]["error"]
    assert "rewheel rollback" in rep["revert"]["hint"]


def test_dry_run_changes_nothing(host_factory) -> None:
    h = host_factory("2.0.0", "good")
    before = h.state()
    code, rep = h.run_json("--dry-run")
    assert code == 0
    assert rep["status"] == "planned"
    assert any(c["name"] == "toypkg" and c["new"] == "2.0.0" for c in rep["plan"]["changes"])
    human = h.rewheel("run", str(h.recipe), "--dry-run")
    assert human.returncode == 0
    text = " ".join(human.stdout.split())
    assert "toypkg: 1.0.0 → 2.0.0" in text
    assert "the service is stopped during the upgrade: service command" in text
    assert h.state() == before
    assert h.served_version() == "1.0.0"


def test_plan_states_the_snapshot_cost_and_refuses_a_store_too_small(host_factory, tmp_path: Path) -> None:
    """The plan says what the snapshot will copy before anything is stopped; a store on a
    real 4 MiB filesystem cannot hold an 8 MiB model cache: exit 2, nothing changed."""
    h = host_factory("2.0.0", "good")
    site = next((h.prefix / "lib").glob("python3*/site-packages"))
    (site / "toypkg" / "cache.bin").write_bytes(os.urandom(8 << 20))  # no RECORD lists it
    code, rep = h.run_json("--dry-run")
    est = rep["plan"]["snapshot_estimate"]
    assert code == 0 and est["files_to_copy"] >= 1 and est["bytes_to_copy"] >= 8 << 20
    # The estimate is what the snapshot then does: every file counted, the copies and their
    # bytes (the toy environment is all small text files, which are copied, never shared).
    r = h.rewheel("snapshot", str(h.recipe), "--json")
    snap = json.loads(r.stdout)
    assert snap["files"] == est["files"] and snap["files_copied"] == est["files_to_copy"], (snap, est)
    assert snap["bytes_copied"] == est["bytes_to_copy"], (snap, est)
    human = " ".join(h.rewheel("run", str(h.recipe), "--dry-run").stdout.split())
    assert "the snapshot will share" in human and "copy" in human
    # A store on a real 4 MiB filesystem cannot hold the 8 MiB copy: refused before anything
    # is stopped. (The whole run is refused earlier still by the generic 2 GiB free-disk
    # check; the snapshot's own cost check is what guards a large copy on a large disk.)
    small = tmp_path / "small-store"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small)]).returncode != 0:
        pytest.fail("mounting a 4 MiB tmpfs needs root (as in CI)")
    try:
        from rewheel.errors import PreflightError
        from rewheel.recipe import load_recipe
        from rewheel.installer import InstallPlan
        from rewheel.commands import open_target
        from rewheel.commands.cycle import Cycle
        from rewheel.commands.results import RunPlan
        h.write_recipe(snapshots={"store": str(small)})
        cyc = Cycle(open_target(load_recipe(h.recipe)), lock=None, say=lambda m: None,
                     on_output=lambda m: None, progress=None)
        cyc.report.plan = RunPlan(InstallPlan(argv=[], changes=[]))
        with pytest.raises(PreflightError, match="would copy") as exc:
            cyc._snapshot_cost()
        assert str(small) in str(exc.value) and "[snapshots] exclude" in (exc.value.hint or "")
        code, rep = h.run_json()
        assert code == 2 and h.served_version() == "1.0.0"
    finally:
        h.write_recipe()  # the service's state is in the default store
        subprocess.run(["umount", str(small)])


def test_without_terminal_or_yes_nothing_changes(host_factory) -> None:
    h = host_factory("2.0.0", "good")
    before = h.state()
    cp = h.rewheel("run", str(h.recipe))
    assert cp.returncode == 2
    assert "--yes" in cp.stderr
    assert h.state() == before
    assert h.served_version() == "1.0.0"


@pytest.mark.parametrize("url, words", [
    ("ftp://127.0.0.1/simple", "install.index_url"),
    ("http://127.0.0.1:{closed}/simple", "127.0.0.1"),
])
def test_bad_or_unreachable_index_exits_2_unchanged(host_factory, url: str, words: str) -> None:
    h = host_factory("2.0.0", "good")
    h.write_recipe(install__index_url=url.format(closed=closed_port()))
    before = h.state()
    code, rep = h.run_json()
    assert code == 2, rep["_stderr"]
    assert words in rep["message"]
    assert h.state() == before
    assert h.served_version() == "1.0.0"  # never stopped


def test_second_run_is_refused_with_4(host_factory) -> None:
    from rewheel.journal import EnvLock
    from rewheel.recipe import load_recipe
    from rewheel.commands import open_target

    h = host_factory("2.0.0", "good", start=False)
    t = open_target(load_recipe(h.recipe))
    with EnvLock(t.store.env_dir, "test holds it"):
        code, rep = h.run_json()
    assert code == 4
    assert "another rewheel process" in rep["message"]


def test_no_revert_leaves_the_failed_state(host_factory) -> None:
    h = host_factory("3.0.0", "smoke-fails")
    code, rep = h.run_json("--no-revert")
    assert code == 3
    assert rep["status"] == "failed"
    assert rep["after"]["toypkg"] == "3.0.0"
    # The service is still down: its downtime is ongoing, never "to the first healthy answer".
    assert h.served_version() is None
    assert rep["downtime"]["ongoing"] is True and rep["downtime"]["seconds"] > 0
    # A person can restore by hand.
    cp = h.rewheel("rollback", str(h.recipe), "--yes")
    assert cp.returncode == 0, cp.stderr
    assert h.served_version() == "1.0.0"


def test_no_revert_says_the_downtime_is_ongoing(host_factory) -> None:
    h = host_factory("3.0.0", "smoke-fails")
    cp = h.rewheel("run", str(h.recipe), "--yes", "--no-revert")
    assert cp.returncode == 3, cp.stderr
    text = " ".join(cp.stdout.split())
    assert "downtime: ongoing" in text and "first healthy answer" not in text
    assert h.served_version() is None
    hist = json.loads(h.rewheel("history", str(h.recipe), "--json").stdout)
    assert hist["runs"][0]["downtime"]["ongoing"] is True


def test_a_recipe_without_a_service_is_told_no_story_about_one(host_factory) -> None:
    h = host_factory("3.0.0", "smoke-fails", start=False)
    h.write_recipe(service=None)
    cp = h.rewheel("run", str(h.recipe), "--yes")
    assert cp.returncode == 1, cp.stderr
    text = " ".join(cp.stdout.split())
    assert "upgrade failed; the environment was restored and verified" in text
    assert "service" not in text.replace("[service]", ""), text
    # Rejected by its pre-check: prepared before anything was changed, not "while it served".
    h.write_recipe(service=None, smoke__precheck=["{python}", "-c", "import toypkg.core as c; c.init_model()"])
    cp = h.rewheel("run", str(h.recipe), "--yes")
    assert cp.returncode == 1, cp.stderr
    text = " ".join(cp.stdout.split())
    assert "rejected: the prepared build failed its checks" in text
    assert "served" not in text and "serving" not in text, text


def test_credentials_in_index_urls_are_redacted(host_factory) -> None:
    h = host_factory("3.0.0", "smoke-fails")
    secret_url = h.index_url.replace("http://", "http://deploy:s3cretToken@")
    h.write_recipe(install__index_url=secret_url)
    code, rep = h.run_json()
    assert code == 1, rep["_stderr"]
    journal = Path(rep["run_dir"]) / "journal.jsonl"
    for text in (rep["_stderr"], str(rep), journal.read_text(),
                 *(Path(p).read_text() for p in rep["logs"].values())):
        assert "s3cretToken" not in text


def test_smoke_command_checks_the_live_environment(host_factory) -> None:
    h = host_factory("2.0.0", "good")
    cp = h.rewheel("smoke", str(h.recipe), "--json")
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["ok"] and doc["smoke"]["ok"] and doc["health"]["ok"]
    # A smoke test that fails names the root cause; nothing is changed or reverted.
    h.write_recipe(smoke__command=["{python}", "-c", "from toypkg.layers import build_attention; build_attention(4)"])
    before = h.state()
    cp = h.rewheel("smoke", str(h.recipe), "--json")
    assert cp.returncode == 1
    doc = json.loads(cp.stdout)
    assert doc["root_cause"]["type"] == "ValueError"
    assert h.state() == before
    # And a service that is down fails the health check.
    h.stop_service()
    h.write_recipe(smoke=None, service__ready_timeout_s=2)
    cp = h.rewheel("smoke", str(h.recipe), "--json")
    assert cp.returncode == 1
    assert json.loads(cp.stdout)["health"]["ok"] is False


def test_ctrl_c_during_smoke_is_reported_kills_the_smoke_and_resume_undoes_it(host_factory) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    h = host_factory("2.0.0", "good")
    before = h.state()
    marker = h.tmp / "smoke-still-running"
    started = h.tmp / "smoke-started"
    # A smoke test that outlives a Ctrl-C of rewheel would keep holding the GPUs. It says
    # when it runs (a file): the Ctrl-C is sent while it surely runs, however loaded the machine.
    h.write_recipe(smoke__command=["{python}", "-c",
                                   f"import time; open({str(started)!r}, 'w').write('x'); time.sleep(6); "
                                   f"open({str(marker)!r}, 'w').write('x')"])
    err_path = h.tmp / "run.err"
    with open(err_path, "w") as err:
        def as_from_a_shell() -> None:
            # A foreground command started by a shell gets Ctrl-C: SIGINT unblocked and at its
            # default action, whatever this test process (a pytest-xdist worker) inherited.
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            signal.signal(signal.SIGINT, signal.SIG_DFL)

        p = subprocess.Popen([sys.executable, "-m", "rewheel", "run", str(h.recipe), "--yes", "--json"],
                             stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True,
                             env={**os.environ}, preexec_fn=as_from_a_shell)
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.exists(), err_path.read_text()
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=60)
    assert p.returncode == 4, err_path.read_text()
    doc = json.loads(out)  # one JSON document, even for a Ctrl-C
    assert doc["error"] == "InterruptedRun" and "resume" in doc["hint"]
    time.sleep(7)
    assert not marker.exists(), "the smoke test's process group survived the Ctrl-C"
    res = h.rewheel("resume", str(h.recipe), "--yes", "--json")
    assert res.returncode == 0, res.stderr
    rdoc = json.loads(res.stdout)
    assert rdoc["status"] == "reverted"
    # It names the snapshot it restored (the human report said "snapshot None").
    assert rdoc["report"]["snapshot_id"] == json.loads(
        h.rewheel("history", str(h.recipe), "--json").stdout)["runs"][0]["snapshot_id"]
    assert h.state() == before
    assert h.served_version() == "1.0.0"


def test_why_with_run_or_snapshot_names_the_suspects(host_factory) -> None:
    h = host_factory("3.0.0", "smoke-fails")
    code, rep = h.run_json()
    assert code == 1 and rep["status"] == "reverted", rep["_stderr"]
    log = rep["logs"]["smoke"]
    # the run's upgrade, from its journal: pre-upgrade snapshot vs the failed state it kept
    cp = h.rewheel("why", log, "--run", rep["run_id"], "--json")
    assert cp.returncode == 0, cp.stderr
    got = json.loads(cp.stdout)["root_cause"]["suspects"]
    assert [(s["path"], s["change"], s["distance_lines"]) for s in got] == [("toypkg/core.py", "changed", 0)]
    human = h.rewheel("why", log, "--run", rep["run_id"])
    assert "suspects" in human.stdout and "toypkg/core.py" in human.stdout
    # the pre-upgrade snapshot against the live environment, which the revert restored: nothing changed
    cp = h.rewheel("why", log, "--snapshot", rep["snapshot_id"], "--json")
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["root_cause"]["suspects"] == []
    # without either: no upgrade to compare with
    assert json.loads(h.rewheel("why", log, "--json").stdout)["root_cause"]["suspects"] == []
    bad = h.rewheel("why", log, "--run", "20990101-000000-nope", "--json")
    assert bad.returncode == 2 and "20990101-000000-nope" in json.loads(bad.stdout)["message"]
    both = h.rewheel("why", log, "--run", rep["run_id"], "--snapshot", rep["snapshot_id"])
    assert both.returncode == 2
