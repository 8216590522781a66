"""Issue 45 (safety, third round), the end-to-end cases of items 4, 5, 7 and 10: each the way an
operator met it, on real parts (a real venv, a real local index, the toy model server under the
command manager where a service matters). The sweeps of the round have files of their own:
tests/test_process_identity.py (item 2), tests/test_check_refusals.py (item 6),
tests/unit/test_record_sweep.py and tests/test_record_mutation.py (item 8), tests/test_output_lost.py
(item 9)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from support_run import Host, build_toypkg

pytestmark = pytest.mark.slow


def _json(cp) -> dict:  # noqa: ANN001
    try:
        return json.loads(cp.stdout)
    except ValueError:
        raise AssertionError(f"rc={cp.returncode}: not JSON\n{cp.stdout}\n{cp.stderr}") from None


def _history(h: Host) -> dict:
    return _json(h.rewheel("history", str(h.recipe), "--json"))


def _run_dir(h: Host, run_id: str) -> Path:
    from rewheel.commands import open_target
    from rewheel.recipe import load_recipe

    return open_target(load_recipe(h.recipe)).store.env_dir / "runs" / run_id


def _installed(h: Host) -> str:
    return next((h.prefix / "lib").glob("python3*/site-packages/toypkg-*.dist-info")
                ).name.removesuffix(".dist-info").split("-")[1]


# -- item 7: an unfinished journal older than a later finished run is superseded ------------------
def test_a_journal_older_than_a_finished_run_is_superseded_not_resumed(host_factory) -> None:
    """Run A reverted, run B upgraded to 3.0.0; A's `finished` status replaced by a value this
    rewheel does not know (as a newer rewheel might write). A later finished run proves A was
    settled: no command exits 4 for A, and `resume` never restores A's pre-upgrade snapshot over
    B's upgrade."""
    h = host_factory("2.0.0", "smoke-fails", start=False)
    h.write_recipe(service=None, install__staged=False)
    code, a = h.run_json()
    assert code == 1 and a["status"] == "reverted", a["_stderr"]
    build_toypkg(h.wheels, "3.0.0")
    code, b = h.run_json()
    assert code == 0 and b["status"] == "upgraded" and b["after"]["toypkg"] == "3.0.0", b["_stderr"]
    journal = _run_dir(h, a["run_id"]) / "journal.jsonl"
    lines = journal.read_text().splitlines()
    last = json.loads(lines[-1])
    assert last["event"] == "finished"
    lines[-1] = json.dumps({**last, "status": "handed-to-a-newer-rewheel"})
    journal.write_text("\n".join(lines) + "\n")
    before = h.state()

    for command in ("status", "history", "snapshot", "diff"):
        cp = h.rewheel(command, str(h.recipe))
        assert cp.returncode == 0, f"{command}: {cp.stderr}"
    cp = h.rewheel("resume", str(h.recipe), "--yes", "--json")
    assert cp.returncode == 0 and _json(cp)["status"] == "nothing-to-resume", cp.stderr
    assert _installed(h) == "3.0.0"
    runs = {r["id"]: r for r in _history(h)["runs"]}
    assert runs[a["run_id"]]["status"] == "superseded", runs[a["run_id"]]
    assert h.state() == before


def test_resuming_an_interrupted_rollback_snapshots_what_it_replaces(host_factory) -> None:
    """A rollback killed before its undo snapshot (here `--no-undo`, killed right after it began):
    `resume` restores its target — and takes an undo snapshot of the state it replaces first, so
    that the resume can be undone as any rollback can."""
    h = host_factory("2.0.0", "good", start=False)
    h.write_recipe(service=None, install__staged=False, snapshots={"keep": 20})
    code, run = h.run_json()
    assert code == 0 and run["status"] == "upgraded", run["_stderr"]
    pre = run["snapshot_id"]
    cp = h.rewheel("rollback", str(h.recipe), pre, "--yes", "--no-undo", env={"REWHEEL_FAULT_AT": "started"})
    assert cp.returncode < 0, cp.stderr  # killed
    assert _installed(h) == "2.0.0"
    before = {s["id"] for s in _history(h)["snapshots"]}
    cp = h.rewheel("resume", str(h.recipe), "--yes", "--json")
    doc = _json(cp)
    assert cp.returncode == 0 and doc["status"] == "restored", cp.stderr
    assert _installed(h) == "1.0.0"
    snaps = {s["id"]: s for s in _history(h)["snapshots"]}
    new = [s for i, s in snaps.items() if i not in before]
    assert [s["versions"].get("toypkg") for s in new] == ["2.0.0"], new
    undo = doc["report"]["revert"]["undo_snapshot_id"]
    assert undo == new[0]["id"] and new[0]["status"] == "pre-rollback"
    # Not the resume's own words for a failed upgrade: it finished a rollback.
    assert "upgrade failed" not in cp.stderr + cp.stdout
    human = h.rewheel("history", str(h.recipe))
    assert human.returncode == 0
    time.sleep(0)  # (nothing to wait for: the undo point is named, the default target passes over it)


# -- item 10: small lies --------------------------------------------------------------------------
def test_a_run_closed_by_rollback_counts_as_undone(host_factory) -> None:
    """A run interrupted, then closed by `rollback` (`rolled-back`): its upgrade is not in place
    any more, so a second plain `rollback` has nothing to undo (exit 2, as the docs say), where it
    said "restored … nothing needed restoring", exit 0."""
    h = host_factory("2.0.0", "good", start=False)
    h.write_recipe(service=None, install__staged=False)
    cp = h.rewheel("run", str(h.recipe), "--yes", env={"REWHEEL_FAULT_AT": "step:smoke"})
    assert cp.returncode < 0, cp.stderr
    cp = h.rewheel("rollback", str(h.recipe), "--yes", "--json")
    assert cp.returncode == 0 and _installed(h) == "1.0.0", cp.stderr
    runs = [r for r in _history(h)["runs"] if r["kind"] == "run"]
    assert runs[0]["status"] == "rolled-back"
    before = h.state()
    cp = h.rewheel("rollback", str(h.recipe), "--yes", "--json")
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert "no upgrade is in place to undo" in _json(cp)["message"]
    assert h.state() == before


def test_resume_reports_the_versions_it_moved(host_factory) -> None:
    """A run killed at its smoke test (toypkg 2.0.0 installed), undone by `resume`: the report
    says it moved toypkg 2.0.0 → 1.0.0 (JSON `changes`, `before`, `after`), not "no version
    changes", and in the resume's own words."""
    h = host_factory("2.0.0", "good", start=False)
    h.write_recipe(service=None, install__staged=False)
    cp = h.rewheel("run", str(h.recipe), "--yes", env={"REWHEEL_FAULT_AT": "step:smoke"})
    assert cp.returncode < 0 and _installed(h) == "2.0.0", cp.stderr
    cp = h.rewheel("resume", str(h.recipe), "--yes", "--json")
    doc = _json(cp)
    assert cp.returncode == 0 and doc["status"] == "reverted", cp.stderr
    rep = doc["report"]
    assert rep["before"]["toypkg"] == "2.0.0" and rep["after"]["toypkg"] == "1.0.0", rep
    assert [(c["name"], c["old"], c["new"]) for c in rep["changes"]] == [("toypkg", "2.0.0", "1.0.0")], rep["changes"]
    assert "upgrade failed" not in cp.stderr


def test_human_resume_says_what_it_moved(host_factory) -> None:
    h = host_factory("2.0.0", "good", start=False)
    h.write_recipe(service=None, install__staged=False)
    cp = h.rewheel("run", str(h.recipe), "--yes", env={"REWHEEL_FAULT_AT": "step:smoke"})
    assert cp.returncode < 0, cp.stderr
    cp = h.rewheel("resume", str(h.recipe), "--yes")
    assert cp.returncode == 0, cp.stderr
    assert "no version changes" not in cp.stdout and "upgrade failed" not in cp.stdout, cp.stdout
    assert "toypkg" in cp.stdout and "2.0.0" in cp.stdout and "1.0.0" in cp.stdout, cp.stdout


@pytest.mark.parametrize("how", ["smoke-killed", "rewheel-terminated"])
def test_a_smoke_test_ended_by_sigterm_is_not_shown_as_failed(host_factory, how: str) -> None:
    """A smoke test killed from outside by SIGTERM is said so ("killed by SIGTERM"), and a run
    that is itself sent SIGTERM during its smoke test says its smoke step was interrupted —
    neither is a "smoke FAILED" the build caused."""
    h = host_factory("2.0.0", "good", start=False)
    if how == "smoke-killed":
        h.write_recipe(service=None, install__staged=False,
                       smoke={"command": ["/bin/sh", "-c", "kill -TERM $$"], "timeout_s": 30})
        code, doc = h.run_json()
        assert code == 1 and doc["status"] == "reverted", doc["_stderr"]
        err = doc["_stderr"]
        assert "killed by SIGTERM" in err and "smoke FAILED" not in err, err
        assert "killed by SIGTERM" in doc["failure"]["message"], doc["failure"]
        cp = h.rewheel("run", str(h.recipe), "--yes", "--quiet")
        assert cp.returncode == 1 and "smoke killed by SIGTERM" in cp.stdout and "smoke FAILED" not in cp.stdout, cp.stdout
    else:
        import os
        import signal
        import subprocess

        import support_cli

        marker = h.tmp / "smoke-began"
        h.write_recipe(service=None, install__staged=False,
                       smoke={"command": ["/bin/sh", "-c", f"touch {marker}; sleep 60"], "timeout_s": 90})
        err = h.tmp / "stderr"
        with open(err, "wb") as fe:
            p = support_cli.start("run", str(h.recipe), "--yes", stdout=subprocess.DEVNULL, stderr=fe,
                                  stdin=subprocess.DEVNULL, env=dict(os.environ))
            deadline = time.monotonic() + 60
            while not marker.exists():
                assert p.poll() is None and time.monotonic() < deadline, err.read_text()
                time.sleep(0.05)
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=60) == 4, err.read_text()
        text = err.read_text()
        assert "smoke interrupted (SIGTERM)" in text and "smoke FAILED" not in text, text
        assert h.rewheel("resume", str(h.recipe), "--yes").returncode == 0


@pytest.mark.parametrize("before", ["stopped after it ran", "never started"])
def test_smoke_says_the_service_is_not_running(host_factory, before: str) -> None:
    """`smoke` when the service is simply not running: it says so (exit 1) — not "died while
    starting" with lines of its last, normal stop, and never a hint naming a service.log that
    does not exist."""
    h = host_factory("2.0.0", "good", start=before == "stopped after it ran")
    if before == "stopped after it ran":
        h.stop_service()
    cp = h.rewheel("smoke", str(h.recipe), "--json")
    doc = _json(cp)
    out = cp.stdout + cp.stderr
    assert cp.returncode == 1 and not doc["ok"], out
    assert "is not running" in doc["error"] and "died" not in out and "output ended with" not in out, out
    log = next(h.tmp.glob("rewheel-home/envs/*/service.log"), None)
    if log is None:
        assert "service.log" not in out, out
    else:
        assert "starting:" in log.read_text()  # the log of its last run exists; its lines are not blamed


# -- item 4: keep-old-version's plan gets the guards every plan gets --------------------------------
def _keep_old_bench(tmp_path: Path, offer: str):  # noqa: ANN202
    """toypkg 1.0.0 + toyhelper 1.0.0 installed, toyhelper patched in place (kept by
    `keep-old-version`); toypkg 2.0.0 needs toyhelper>=1.1. The index then lost toypkg 1.0.0 and
    offers, besides 2.0.0: `sdist` a toypkg 3.0.0 sdist (whose build leaves a mark), `older` a
    toypkg 0.9.0 wheel, `ok` toypkg 2.0.0 needing only toyhelper>=1."""
    from devtools.localindex import start_index
    from devtools.wheelbuild import build_wheel
    from support_env import make_venv, uv
    from support_index import site_packages
    from test_real_upgrade import _sdist

    wheels = tmp_path / "wheels"
    build_wheel(wheels, "toyhelper", "1.0.0", {"toyhelper/__init__.py": "HELP = 1\n"})
    build_wheel(wheels, "toyhelper", "1.1.0", {"toyhelper/__init__.py": "HELP = 2\n"})
    first = build_wheel(wheels, "toypkg", "1.0.0", {"toypkg/__init__.py": "V = 1\n"}, requires=["toyhelper>=1"])
    build_wheel(wheels, "toypkg", "2.0.0", {"toypkg/__init__.py": "V = 2\n"},
                requires=["toyhelper>=1" if offer == "ok" else "toyhelper>=1.1"])
    index = start_index(wheels)
    py = make_venv(tmp_path / "env")
    uv("pip", "install", "-q", "--python", str(py), "--index-url", index.url, "toypkg==1.0.0", "toyhelper==1.0.0")
    with open(site_packages(py) / "toyhelper" / "__init__.py", "a") as f:
        f.write("PATCHED = True\n")
    if offer != "ok":
        first.unlink()
    if offer == "sdist":
        _sdist(wheels, "toypkg", "3.0.0")
    elif offer == "older":
        build_wheel(wheels, "toypkg", "0.9.0", {"toypkg/__init__.py": "V = 0\n"}, requires=["toyhelper>=1"])
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[environment]\npython = "{py}"\n[install]\npackages = ["toypkg"]\nindex_url = "{index.url}"\n'
                      'reinstall = "all"\nstaged = false\n[patches]\npolicy = "keep-old-version"\n', encoding="utf-8")
    return py, recipe, index


@pytest.mark.parametrize("offer", ["sdist", "older"])
def test_keep_old_versions_plan_is_guarded_before_the_stop(tmp_path: Path, offer: str) -> None:
    """The kept versions constrain the one resolution, made before the stop with its guards: an
    sdist is never built (the old version gone from the index, 3.0.0 only as an sdist) and a
    recipe package is never downgraded (1.0.0 → 0.9.0) — refused, exit 2, nothing changed —
    where the second resolution after the stop built the sdist, or installed 0.9.0, as "upgraded"."""
    import support_cli
    from support_env import tree_state

    py, recipe, index = _keep_old_bench(tmp_path, offer)
    try:
        before = tree_state(py.parent.parent)
        cp = support_cli.rewheel("run", str(recipe), "--yes", "--json", stdin=__import__("subprocess").DEVNULL,
                                 timeout=300)
        doc = _json(cp)
        assert cp.returncode == 2, doc
        assert doc["error"] in ("ResolutionRefused", "PreflightError"), doc
        assert not (tmp_path / "built").exists()  # no sdist build ran
        assert tree_state(py.parent.parent) == before
    finally:
        index.stop()


def test_keep_old_version_keeps_the_patched_and_checks_the_install(tmp_path: Path) -> None:
    """Where the upgrade is possible, the kept distribution stays (its patch too), the plan
    says so before the stop, and what was installed is checked against the plan."""
    import subprocess

    import support_cli
    from support_index import installed_version, site_packages

    py, recipe, index = _keep_old_bench(tmp_path, "ok")
    try:
        cp = support_cli.rewheel("run", str(recipe), "--yes", "--json", stdin=subprocess.DEVNULL, timeout=300)
        doc = _json(cp)
        assert cp.returncode == 0 and doc["status"] == "upgraded", cp.stderr
        assert "keeping patched distributions: toyhelper 1.0.0" in cp.stderr.split("── stop")[0].split("── snapshot")[0]
        assert installed_version(py, "toypkg") == "2.0.0" and installed_version(py, "toyhelper") == "1.0.0"
        assert (site_packages(py) / "toyhelper" / "__init__.py").read_text().endswith("PATCHED = True\n")
    finally:
        index.stop()


# -- item 5: run --lock FILE installs what the file held at the plan --------------------------------
def test_a_lock_replaced_after_the_plan_changes_nothing(host_factory) -> None:
    """`run --lock L`: L is read once, at the plan (copied, hashed); replaced while the run is
    paused after its plan, the install still installs what the plan showed, and is checked
    against it."""
    import os
    import shutil
    import signal
    import subprocess

    import support_cli

    h = host_factory("2.0.0", "good", start=False)
    h.write_recipe(service=None, install__staged=False)

    def lock_of_newest(name: str) -> Path:
        cp = h.rewheel("run", str(h.recipe), "--dry-run", "--json")
        path = Path(_json(cp)["plan"]["lock"])
        return Path(shutil.copyfile(path, h.tmp / name))

    two = lock_of_newest("pylock.two.toml")
    build_toypkg(h.wheels, "3.0.0")
    three = lock_of_newest("pylock.three.toml")
    lock = h.tmp / "pylock.toml"
    shutil.copyfile(two, lock)
    out, err = h.tmp / "out", h.tmp / "err"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        p = support_cli.start("run", str(h.recipe), "--lock", str(lock), "--yes", "--json", stdout=fo, stderr=fe,
                              stdin=subprocess.DEVNULL,
                              env={**os.environ, "REWHEEL_FAULT_AT": "step:snapshot", "REWHEEL_FAULT_SIGNAL": "STOP"})
        deadline = time.monotonic() + 120
        while (Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T"):
            assert p.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        shutil.copyfile(three, lock)  # replaced while the run waits between its plan and its install
        os.kill(p.pid, signal.SIGCONT)
        assert p.wait(timeout=120) == 0, err.read_text()
    doc = json.loads(out.read_text())
    assert doc["status"] == "upgraded" and doc["after"]["toypkg"] == "2.0.0", doc
    assert _installed(h) == "2.0.0"
    assert "sha256" in err.read_text()
    journal = (_run_dir(h, doc["run_id"]) / "journal.jsonl").read_text()
    import hashlib

    assert hashlib.sha256(two.read_bytes()).hexdigest() in journal
