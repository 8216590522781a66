"""The benchmark harness end to end at a tiny scale: it builds real wheels, installs them
with uv, snapshots, upgrades, diffs, rolls back byte-exact and offline, and reports every row.
No timing assertions: ratios are only printed."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from devtools.bench.harness import BenchConfig, render, run_bench
from devtools.bench.profile import full_profile, scaled, totals
from rewheel.errors import RewheelError
from support_env import REPO


def test_profile_matches_a_vllm_environment_at_full_scale() -> None:
    t = totals(1.0)
    assert t["distributions"] == 200
    assert 55_000 <= t["files"] <= 59_000
    assert 7.5 * 2**30 <= t["bytes"] <= 8.5 * 2**30
    torch = next(scaled(p, 1.0) for p in full_profile() if p.name == "torch")
    assert sum(torch.big_bytes) > 800 * 2**20  # multi-hundred-MB libraries


def test_bench_runs_end_to_end_at_tiny_scale(tmp_path: Path) -> None:
    """The whole synthetic bench in process (every row), then again from the command line on
    the same folder: it reuses the built wheels and environment and writes its results JSON.
    (Each start-up row runs once: tests/test_bench.py's start-up test checks their samples.)"""
    cfg = BenchConfig(scale=0.002, reps=1, root=tmp_path / "bench", log_mb=1, startup_runs=1, say=lambda m: None)
    result = run_bench(cfg)
    steps = [(r["step"], r["baseline"]) for r in result["rows"]]
    assert steps == [("snapshot", "cp -al"), ("snapshot", "cp -a (full copy)"),
                     ("patch scan", "stat walk"), ("patch scan", "sha256 of every file"),
                     ("diff (snapshot vs live)", "cp -al"), ("rollback", "uv pip sync (warm cache) + sync"),
                     ("rollback", "uv pip sync (warm cache), not synced"),
                     ("rollback + deleting displaced", "uv pip sync (warm cache) + sync"),
                     ("why", "grep -c Traceback"), ("start-up: rewheel --help", "python -c pass"),
                     ("start-up: rewheel history", "python -c pass"), ("start-up: rewheel why", "python -c pass"),
                     ("downtime: staged", "smoke + start + 10 s"), ("downtime: staged", "unstaged, cold uv cache")]
    for r in result["rows"]:
        assert r["baseline_s"] is not None and r["baseline_s"] > 0, r
        if r["available"]:
            assert r["rewheel_s"] > 0 and r["ratio"] is not None, r
            assert r["target"] is None or isinstance(r["pass"], bool)
    # The rollback was measured byte-exact (every file hashed before and after), with the
    # time of each of its phases.
    assert result["rollback"]["byte_exact"] is True
    check_downtime_runs(result)
    # The rollback and uv's sync race several rounds per repetition, each checked byte-exact.
    rollback = next(r for r in result["rows"] if r["step"] == "rollback")
    assert result["rollback_rounds"] == 3
    assert result["rollback"]["lanes"] == 1  # a toy environment restores in one process
    assert len(rollback["samples"]) == len(rollback["baseline_samples"]) == 3
    assert "of 3 races with uv" in render(result)
    assert set(result["rollback"]["phases"]) == {"load", "scan", "stage", "commit", "verify", "finish"}
    assert result["environment"]["measured_files"] >= 400
    assert result["snapshot"]["files_linked"] > 0
    # The three hand patches the bench applies are what the patch scan should find.
    scan = next(r for r in result["rows"] if r["baseline"] == "stat walk")
    if scan["available"]:
        assert "3 patched files" in scan["note"], scan
    json.dumps(result)  # the results are JSON
    table = render(result)
    assert "rollback" in table and "cp -al" in table and "scale 0.002" in table
    # A second run, from the command line, reuses the cached wheels and environment.
    import subprocess

    wheels = tmp_path / "bench" / "synthetic-s0.002" / "wheels"
    built = {p.name: p.stat().st_mtime_ns for p in wheels.iterdir()}
    python_ino = (tmp_path / "bench" / "synthetic-s0.002" / "venv" / "pyvenv.cfg").stat().st_ino
    out = tmp_path / "r.json"
    cp = subprocess.run([sys.executable, "-m", "devtools.bench", "--scale", "0.002", "--reps", "1",
                         "--log-mb", "1", "--dir", str(tmp_path / "bench"), "--no-full-copy", "--rollback-rounds", "1",
                         "--startup-runs", "1", "--json", str(out)], capture_output=True, text=True, cwd=REPO)
    assert cp.returncode in (0, 1), cp.stderr  # 1: a target missed at this toy scale
    assert "ratio" in cp.stdout and f"results written to {out}" in cp.stdout
    again = json.loads(out.read_text())
    assert again["environment"]["scale"] == 0.002
    assert {p.name: p.stat().st_mtime_ns for p in wheels.iterdir()} == built
    assert (tmp_path / "bench" / "synthetic-s0.002" / "venv" / "pyvenv.cfg").stat().st_ino == python_ino
    assert again["rollback"]["byte_exact"] is True
    assert all(r["baseline"] != "cp -a (full copy)" for r in again["rows"])
    assert len(next(r for r in again["rows"] if r["step"] == "rollback")["samples"]) == 1
    startup = [r for r in again["rows"] if r["step"].startswith("start-up:")]
    assert len(startup) == 3 and all(len(r["samples"]) == 1 for r in startup), startup


def test_a_scale_the_disk_cannot_hold_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    import subprocess

    free = shutil.disk_usage(tmp_path).free
    scale = max(1.0, 3 * free / totals(1.0)["bytes"])  # needs three times more than is free
    cp = subprocess.run([sys.executable, "-m", "devtools.bench", "--scale", f"{scale:.0f}", "--reps", "1",
                         "--dir", str(tmp_path / "b")], capture_output=True, text=True, cwd=REPO)
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    assert f"free under {tmp_path / 'b'}" in cp.stderr and "BENCH_SCALE" in cp.stderr, cp.stderr
    # Nothing was built: the scale's folder holds at most the set lists, no wheels.
    assert not list((tmp_path / "b").rglob("*.whl"))


def test_real_mode_times_the_cli_end_to_end(tmp_path: Path, wheelhouse: Path) -> None:
    """The real mode's whole path — install from an index with uv, `rewheel patches`,
    `snapshot`, `diff`, `rollback` after a plain and a reinstall-all upgrade, each checked
    byte-exact — on small real wheels from a find-links folder instead of vLLM."""
    cfg = BenchConfig(reps=1, root=tmp_path / "bench", real=True, real_old="toypkg==1.0.0",
                      real_new="toypkg==2.0.0", real_uv_args=("--no-index", "--find-links", str(wheelhouse)),
                      real_edit=("toypkg/core.py", "toyhelper/__init__.py"), real_disk_need=256 << 20,
                      startup_runs=1, say=lambda m: None)
    result = run_bench(cfg)
    assert [r["step"] for r in result["rows"]] == [
        "snapshot (the first, empty store)", "snapshot (environment unchanged)", "patches (pristine)",
        "patches (2 edited)", "diff --json", "diff --stat", "rollback (plain upgrade)", "rollback (reinstall all)",
        "rollback + undo snapshot (plain upgrade)", "downtime: rollback (trivial service)",
        "downtime: rollback, to the start (trivial service)", "downtime: rollback", "downtime: rollback, to the start",
        "rollback + undo snapshot (the story's run, reinstall all)",
        "start-up: rewheel --help", "start-up: rewheel history", "start-up: rewheel why",
        "downtime: staged", "downtime: staged"]
    informational = ("downtime: rollback, to the start", "downtime: rollback, to the start (trivial service)",
                     "downtime: staged")
    for r in result["rows"]:
        assert r["rewheel_s"] > 0 and r["baseline_s"] > 0, r
        assert isinstance(r["pass"], bool) or (r["step"] in informational and r["pass"] is None), r
    assert result["false_patches"] == [0]
    assert result["edited_found_exactly"] == [True]
    assert result["rollback"]["byte_exact"] is True
    # The second snapshot found nothing changed and stored nothing; the story's run, kept and
    # rolled back, came back byte for byte; so did the rollback with a trivial service up.
    again = result["snapshot_unchanged"]
    assert again["files_unchanged"] == again["files"] > 0 and again["files_copied"] == 0, again
    assert result["story"]["byte_exact"] is True and result["rollback_downtime_trivial"]["byte_exact"] is True
    check_downtime_runs(result)
    # The default rollback with a service up (from the toy venv's interpreter): the undo
    # snapshot before the stop, its own downtime, byte-exact; and the same by hand.
    served = result["rollback_downtime"]
    assert len(served["runs"]) == 1 and served["byte_exact"] is True and served["undo_while_serving"] is True
    mine, hand = served["runs"][0]["rewheel"], served["runs"][0]["by_hand"]
    assert mine["steps"][:5] == ["restore-prepare", "snapshot", "stop", "snapshot-check", "restore"], mine
    assert mine["undo_snapshot_id"] and mine["seconds"] > 0 and mine["parts"]["restore"] > 0, mine
    assert mine["restart_s"] > 0, mine
    assert set(hand["parts"]) == {"stop", "sync", "start", "ready"} and hand["seconds"] > 0, hand
    row = next(r for r in result["rows"] if r["step"] == "downtime: rollback")
    assert row["rewheel_s"] == mine["seconds"] and row["baseline_s"] == hand["seconds"] and row["target"] == 1.0
    assert result["diff"]["packages"] >= 1 and result["diff"]["files"] >= 1
    # Each rollback says what it wrote and what it proved identical. The bench's uv hard-links
    # what it installs from its cache: a file the environment does not hold alone is never
    # proven in place (tests/test_restore_reinstall.py checks the proof itself, on files the
    # environment alone holds); it is put back as the very inode it was, from uv's cache, or
    # relinked. The reinstall-all replaced every file, the plain upgrade left the helper
    # package alone: it has more to put back.
    plain, everything = result["rollback_plain"], result["rollback_reinstall-all"]
    for r in (plain, everything):
        assert r["written"] >= 1 and isinstance(r["proven_same"], int), r
    assert plain["proven_same"] == 0, plain
    assert everything["written"] + everything["proven_same"] > plain["written"], (plain, everything)
    table = render(result)
    assert "toypkg==1.0.0 → toypkg==2.0.0" in table and "rollback (reinstall all)" in table
    json.dumps(result)


def test_rollback_downtime_rows_compare_medians_and_say_what_they_saw() -> None:
    """The rollback-downtime rows from repetitions' records (the numbers made up): medians,
    the ratio against the 1x target, the part before the start, and what the note says."""
    from devtools.bench.rollback_downtime import rollback_downtime_rows

    def rec(mine: float, hand: float, *, exact: bool = True, served: bool = True) -> dict:
        return {"rewheel": {"seconds": mine, "parts": {"stop": 0.5, "snapshot": 0.5, "restore": 1.0, "start": 0.1,
                                                       "ready": mine - 2.1},
                            "byte_exact": exact, "undo_while_serving": served, "bytecode_rewritten": 0},
                "by_hand": {"seconds": hand, "parts": {"stop": 0.5, "sync": 3.0, "start": 0.1, "ready": hand - 3.6}}}

    recs = [rec(4.0, 8.0), rec(5.0, 6.0), rec(9.0, 7.0)]
    for r, again in zip(recs, (3.0, 2.0, 1.0), strict=True):
        r["rewheel"]["restart_s"] = again
    recs[1]["rewheel"]["bytecode_rewritten"] = 7
    down, pre = [r.to_json() for r in rollback_downtime_rows(recs)]
    assert (down["step"], down["rewheel_s"], down["baseline_s"]) == ("downtime: rollback", 5.0, 7.0)
    assert down["target"] == 1.0 and down["pass"] is True and down["samples"] == [4.0, 5.0, 9.0]
    assert "undo snapshot taken while serving; byte-exact but for 7 bytecode files" in down["note"], down
    assert "a restart right after: 2.00" in down["note"] and "sync 3.00" in down["note"]
    assert (pre["rewheel_s"], pre["baseline_s"], pre["target"], pre["pass"]) == (2.0, 3.5, None, None)
    down, _ = [r.to_json() for r in rollback_downtime_rows([rec(8.0, 6.0, exact=False, served=False)])]
    assert down["pass"] is False
    assert "NOT taken while serving" in down["note"] and "NOT byte-exact" in down["note"]


def test_real_mode_seeds_its_uv_cache_by_hard_links_and_refuses_a_folder_that_is_no_cache(tmp_path: Path) -> None:
    from devtools.bench.real import RealBench

    seed = tmp_path / "seed"
    (seed / "archive-v0" / "x").mkdir(parents=True)
    (seed / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    (seed / "archive-v0" / "x" / "f.py").write_text("X = 1\n")
    cfg = BenchConfig(root=tmp_path / "bench", real=True, real_seed_cache=seed, say=lambda m: None)
    RealBench(cfg).seed_cache()
    copied = tmp_path / "bench" / "real" / "uv-cache" / "archive-v0" / "x" / "f.py"
    assert copied.stat().st_ino == (seed / "archive-v0" / "x" / "f.py").stat().st_ino
    RealBench(cfg).seed_cache()  # a cache there already: left alone
    cfg = BenchConfig(root=tmp_path / "other", real=True, real_seed_cache=tmp_path, say=lambda m: None)
    with pytest.raises(RewheelError, match="is not a uv cache"):
        RealBench(cfg).seed_cache()


def test_real_mode_refuses_a_disk_too_small_before_installing(tmp_path: Path, wheelhouse: Path) -> None:
    """The real mode checks the free disk its releases need before its first install (a
    vLLM pair's default is 30 GiB; `real_disk_need` sizes it for others), and builds nothing."""
    need = shutil.disk_usage(tmp_path).free + (1 << 40)
    cfg = BenchConfig(reps=1, root=tmp_path / "bench", real=True, real_old="toypkg==1.0.0",
                      real_new="toypkg==2.0.0", real_uv_args=("--no-index", "--find-links", str(wheelhouse)),
                      real_disk_need=need, say=lambda m: None)
    with pytest.raises(RewheelError, match=f"needs about {need / 2**30:.1f} GiB free under {tmp_path / 'bench'}"):
        run_bench(cfg)
    assert not (tmp_path / "bench" / "real").exists()
    assert BenchConfig().real_disk_need == 30 << 30


def test_startup_rows_time_the_installed_command(tmp_path: Path) -> None:
    """Only the start-up rows: `rewheel --help`, `history` on a store with one snapshot and
    `why` on a small log, each run for real (exit 0) and timed; the targets are absolute.
    No timing assertion: whether a target is met is the bench's verdict, not the test's."""
    import subprocess

    from devtools.bench.startup import STARTUP_TARGETS_S, bench_startup
    from support_env import make_venv

    py = make_venv(tmp_path / "env")
    home = tmp_path / "home"
    env = {**__import__("os").environ, "REWHEEL_HOME": str(home)}
    subprocess.run([sys.executable, "-m", "rewheel", "snapshot", "--python", str(py)], check=True, env=env,
                   capture_output=True)
    cfg = BenchConfig(root=tmp_path / "bench", startup_runs=2, say=lambda m: None)
    out = bench_startup(cfg, python=py, home=home)
    rows = [r.to_json() for r in out["rows"]]
    assert [r["step"] for r in rows] == ["start-up: rewheel --help", "start-up: rewheel history",
                                         "start-up: rewheel why"]
    for r in rows:
        assert len(r["samples"]) == 2 and all(s > 0 for s in r["samples"]), r
        assert r["baseline"] == "python -c pass" and r["baseline_s"] > 0
        assert isinstance(r["pass"], bool) and "target <=" in r["note"], r
    assert {k: v["target_s"] for k, v in out["startup"].items()} == STARTUP_TARGETS_S
    assert all(v["pass"] == (v["seconds"] <= v["target_s"]) for v in out["startup"].values())


def check_downtime_runs(result: dict) -> None:
    """The same upgrade run by the `rewheel` command, unstaged and staged, each with its
    downtime; the staged one prepared and snapshotted while the service served."""
    runs = result["downtime"]["runs"]
    assert [len(runs["unstaged"]), len(runs["staged"])] == [1, 1]
    for mode in ("unstaged", "staged"):
        down = runs[mode][0]["downtime"]
        assert down["seconds"] > 0 and down["parts"]["install"] > 0, (mode, down)
    assert [s["name"] for s in runs["staged"][0]["steps"]][:5] == ["preflight", "prepare", "snapshot", "stop",
                                                                   "snapshot-check"]
    assert [s["name"] for s in runs["unstaged"][0]["steps"]][:3] == ["preflight", "stop", "snapshot"]



def test_the_board_row_times_the_command_on_a_synthetic_home(tmp_path: Path) -> None:
    """`--only board` (and the row `make bench` adds): `rewheel board` on a synthetic home —
    here 20 runs and a 150-file diff — against `diff -ruN` of the same trees, its largest
    page, and the line saying both against their targets."""
    cfg = BenchConfig(reps=1, root=tmp_path / "bench", only="board", board_runs=20, board_files=150,
                      say=lambda m: None)
    result = run_bench(cfg)
    (row,) = result["rows"]
    assert row["step"] == "board (20 runs, 150-file diff)" and row["baseline"] == "diff -ruN of the two trees"
    assert row["rewheel_s"] > 0 and row["baseline_s"] > 0 and row["target"] == 15.0, row
    board = result["board"]
    assert board["pages"] == 20 + 1 + 1 + 2 + 1 and 0 < board["largest_page_mb"] < 4  # runs, index, env, …
    assert board["cpu_seconds"] > 0 and isinstance(result["all_pass"], bool)
    assert "board: written in" in render(result) and "largest page" in render(result)
    json.dumps(result)
