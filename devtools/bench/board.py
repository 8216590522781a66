"""The board's benchmark row, and the synthetic home it is measured on (the board's tests
build smaller ones with the same function).

`make_home` writes the state rewheel keeps, with rewheel's own writers where it has them
(journal records, snapshots taken by `take_snapshot` of a real virtualenv, `ci` verdicts by
`qualify.save_verdict`): one environment with RUNS runs — upgrades, reverts with a crash
log, rejected builds, rollbacks, resumes, one interrupted — the newest of which is a revert
whose pre-upgrade snapshot and failed build differ in DIFF_FILES files; a year of nightly
qualifications; a bisection; a fleet's run reports. `hostile=True` puts what a crash log can
hold (`<script>`, `</pre>`, `&`, ANSI colour codes, control characters) into its logs, root
causes, package names and hosts.

The row: `rewheel board --out DIR` on that home (the command, start-up included), its
largest page, against `diff -ruN` of the same two trees (what writing those changes as one
plain diff costs on this machine): within TARGET_RATIO of it, each page under TARGET_PAGE_MB."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rewheel.records import (BuildVerdict, Candidates, FailedSnapshot, Finish, Installed, Note, Record,
                             SnapshotTaken, Started, Step)
from rewheel.statuses import BisectStatus, Finished, StepName

RUNS = 1000
DIFF_FILES = 9000
# Targets: the board within 15× of `diff -ruN` writing the same two trees' changes as one
# plain diff (a ratio, so that a loaded machine slows both: measured 10-12× on 2 CPUs), and
# each page under a few MB (absolute). Its seconds, wall and CPU, are reported beside.
TARGET_RATIO = 15.0
TARGET_PAGE_MB = 4.0
HOSTILE = "<script>alert('x')</script> </pre> &amp; \x1b[31mred\x1b[0m \x07bell"
GOOD, BAD = "0.16.0rc2.dev313+g5719a4e4e", "0.16.0rc2.dev344+g8c1b3f2a0"


def _line(rec: Record, t: float) -> str:
    return json.dumps(replace(rec, time=t).to_json()) + "\n"


def write_journal(run_dir: Path, records: list[tuple[float, Record]]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "journal.jsonl").write_text("".join(_line(r, t) for t, r in records))


def root_cause_doc(rank: str, line: int, hostile: bool, site: str) -> dict[str, Any]:
    msg = "cannot reshape tensor of 1536 into heads of 7" + (f" {HOSTILE}" if hostile else "")
    return {"type": "RuntimeError", "message": msg, "rank": rank, "log_line": line, "kind": "traceback",
            "count": 1, "restarts": 1, "secondary": [], "pid": 4242, "node": None,
            "frame": {"file": f"{site}/vllm/model_executor/models/deepseek_v2.py", "line": 998,
                      "function": "__init__", "source": "self.self_attn = attn_cls(...)"},
            "suspects": [{"path": "vllm/model_executor/models/deepseek_v2.py", "package": "vllm", "change": "changed",
                          "frame": {"line": 998}, "hunks": [{"old_start": 990, "old_lines": 3, "new_start": 990,
                                                             "new_lines": 4, "text": "@@ -990,3 +990,4 @@\n ctx\n-old\n+new <b>\n+more\n"}],
                          "distance_lines": 0, "patch_removed": None, "compare_url": None, "reason": "frame"}]}


def write_smoke_log(run_dir: Path, hostile: bool) -> int:
    lines = [f"INFO 12:00:{i:02d} [Worker_TP{i % 8}] loading weights" for i in range(40)]
    if hostile:
        lines += [f"(Worker_TP4) {HOSTILE}", "\x1b[1;31mERROR\x1b[0m </pre><script>document.title='pwned'</script>"]
    mark = len(lines) + 2
    lines += ["ERROR 12:01:00 [Worker_TP4] Traceback (most recent call last):",
              '  File "deepseek_v2.py", line 998, in __init__',
              "RuntimeError: cannot reshape tensor of 1536 into heads of 7"]
    lines += ["ERROR WorkerProc was terminated"] * 20
    (run_dir / "smoke.log").write_text("\n".join(lines) + "\n")
    return mark


def _venv(root: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    return root / "bin" / "python"


def _site(python: Path) -> Path:
    return next((python.parent.parent / "lib").glob("python3*/site-packages"))


def _sources() -> list[list[str]]:
    """Real Python source to fill the synthetic files with: the first 300 lines of each of
    the running interpreter's standard-library modules (a diff's cost depends on how
    repetitive the lines are; real code is what the board meets)."""
    out = []
    for path in sorted(Path(os.__file__).parent.glob("*.py")):
        try:
            lines = path.read_text(encoding="utf-8").splitlines()[:300]
        except (OSError, UnicodeDecodeError):
            continue
        if len(lines) >= 40:
            out.append(lines)
    return out


def _write_tree(site: Path, files: int, *, version: int) -> None:
    """`files` Python sources in a package `vllm` (a dist-info naming its version); `version`
    1 changes three lines of each, as a nightly does."""
    pkg = site / "vllm"
    sources = _sources()
    for i in range(files):
        d = pkg / f"m{i // 200:03d}"
        d.mkdir(parents=True, exist_ok=True)
        body = list(sources[i % len(sources)])
        if version:
            for at in (len(body) // 4, len(body) // 2, 3 * len(body) // 4):
                body[at] = body[at] + f"  # changed in the nightly ({i})"
        (d / f"mod{i:05d}.py").write_text("\n".join(body) + "\n")
    info = site / "vllm-0.16.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {GOOD if version == 0 else BAD}\n")


def make_home(root: Path, *, runs: int = RUNS, diff_files: int = DIFF_FILES, hostile: bool = False,
              nightlies: int = 365) -> dict[str, Any]:
    """The synthetic home (see the module docstring), under `root`; returns where things are:
    home, python, recipe (None), fleet (the reports' folder), expect (its hosts in order)."""
    from rewheel.environment import Environment
    from rewheel.snapshot import Store, take_snapshot

    home = root / "home"
    python = _venv(root / "env")
    site = _site(python)
    env = Environment.inspect(python)
    store = Store(env.prefix, home)
    t_end = time.time() - 60
    day = 86400.0
    step = 7 * day * 52 / max(1, runs)
    names = ["vllm", "torch", "flashinfer-python", "transformers"] + (["<b>pkg</b>"] if hostile else [])
    v_old = {n: "1.0" for n in names} | {"vllm": GOOD}
    v_new = {n: "1.1" for n in names} | {"vllm": BAD}
    for i in range(runs - 1):
        t0 = t_end - (runs - i) * step
        rid = time.strftime("%Y%m%d-%H%M%S", time.localtime(t0)) + f"-{i:04x}"
        rdir = store.env_dir / "runs" / rid
        kind = ("rollback" if i % 10 == 3 else "interrupted" if i == 5 else
                "reverted" if i % 7 == 2 else "rejected" if i % 11 == 4 else "upgraded")
        smoke = 20.0 + (i % 13)
        down = {"seconds": 30.0 + i % 9, "parts": {"stop": 2.0, "install": 5.0, "smoke": smoke, "start": 3.0}}
        recs: list[tuple[float, Record]] = [(t0, Started(kind="rollback" if kind == "rollback" else "run",
                                                        recipe="/etc/rewheel/kimi.toml", before=v_old, staged=True))]
        if kind == "rollback":
            recs += [(t0 + 1, Step(name=StepName.STOP)), (t0 + 3, Step(name=StepName.RESTORE, snapshot_id="gone")),
                     (t0 + 9, Step(name=StepName.START)), (t0 + 15, Finish(status=Finished.RESTORED, downtime=down))]
        elif kind == "rejected":
            recs += [(t0 + 40, Step(name=StepName.PREPARE, check="smoke")),
                     (t0 + 41, Finish(status=Finished.REJECTED, before=v_old, after=v_old, attempted=v_new, check="smoke",
                                      root_cause=root_cause_doc("Worker_TP4", 3, hostile, str(site))))]
        else:
            recs += [(t0 + 1, Note(service_was_active=True)), (t0 + 2, Step(name=StepName.SNAPSHOT, served=True)),
                     (t0 + 4, SnapshotTaken(snapshot_id=f"pruned{i:04x}")), (t0 + 5, Step(name=StepName.STOP)),
                     (t0 + 7, Step(name=StepName.REINSTALL)), (t0 + 12, Installed(versions=v_new)),
                     (t0 + 12.5, Step(name=StepName.DIFF)), (t0 + 13, Step(name=StepName.SMOKE))]
            if kind == "upgraded":
                recs += [(t0 + 13 + smoke, Step(name=StepName.START)), (t0 + 20 + smoke, Step(name=StepName.KEEP)),
                         (t0 + 21 + smoke, Finish(status=Finished.UPGRADED, before=v_old, after=v_new, downtime=down))]
            elif kind == "reverted":
                rdir.mkdir(parents=True)
                mark = write_smoke_log(rdir, hostile)
                recs += [(t0 + 13 + smoke, Step(name=StepName.REVERT, reason="smoke failed")),
                         (t0 + 25 + smoke, Finish(status=Finished.REVERTED, reason="smoke failed: exited 1",
                                                  before=v_old, after=v_old, downtime=down,
                                                  root_cause=root_cause_doc("Worker_TP4", mark, hostile, str(site))))]
        write_journal(rdir, recs)
    # The newest run: a revert whose two snapshots differ in `diff_files` files.
    _write_tree(site, diff_files, version=0)
    t0 = time.time() - 30
    rid = time.strftime("%Y%m%d-%H%M%S", time.localtime(t0)) + "-last"
    rdir = store.env_dir / "runs" / rid
    rdir.mkdir(parents=True)
    pre = take_snapshot(env, store, label=f"before run {rid}", status="pre-upgrade", run_id=rid).meta
    _write_tree(site, diff_files, version=1)
    failed = take_snapshot(env, store, label=f"failed upgrade of run {rid}", status="failed-upgrade", run_id=rid).meta
    _write_tree(site, diff_files, version=0)
    mark = write_smoke_log(rdir, hostile)
    (rdir / "patches").mkdir()
    (rdir / "patches" / "patches.json").write_text(json.dumps({"patches": [
        {"path": "vllm/model_executor/models/deepseek_v2.py", "distribution": "vllm",
         "diff": "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b " + (HOSTILE if hostile else "") + "\n"}]}))
    write_journal(rdir, [(t0, Started(kind="run", recipe="/etc/rewheel/kimi.toml", before=v_old, staged=True)),
                    (t0 + 1, Step(name=StepName.SNAPSHOT)), (t0 + 2, SnapshotTaken(snapshot_id=pre.id)),
                    (t0 + 3, Step(name=StepName.STOP)), (t0 + 4, Step(name=StepName.REINSTALL)),
                    (t0 + 6, Step(name=StepName.SMOKE)), (t0 + 9, FailedSnapshot(failed_snapshot_id=failed.id)),
                    (t0 + 9.5, Step(name=StepName.REVERT, reason="smoke failed")),
                    (t0 + 14, Finish(status=Finished.REVERTED, reason="smoke failed: exited 1", before=v_old,
                                     after=v_old, downtime={"seconds": 11.0, "parts": {"smoke": 3.0, "revert": 5.0}},
                                     root_cause=root_cause_doc("Worker_TP4", mark, hostile, str(site))))])
    _nightlies(home, nightlies, hostile)
    _bisection(home)
    fleet = _fleet(root / "fleet", hostile)
    return {"home": home, "python": python, "fleet": fleet, "expect": ["gpu-01", "gpu-02", "gpu-03", "gpu-04"],
            "old": pre, "new": failed, "store": store}


def _nightlies(home: Path, n: int, hostile: bool) -> None:
    from rewheel.diff import PackageChange
    from rewheel.diagnose import RootCause
    from rewheel.qualify import CiReport, CiStep, save_verdict

    base = home / "ci" / "kimi"
    for i in range(n):
        started = time.time() - (n - i) * 86400.0
        ok = i % 9 != 4
        d = base / (time.strftime("%Y%m%d-%H%M%S", time.localtime(started)) + f"-{i:04x}")
        d.mkdir(parents=True, exist_ok=True)
        rc = RootCause.from_json(root_cause_doc("Worker_TP4", 3, hostile, "/x/site-packages")) if not ok else None
        rep = CiReport(status="qualified" if ok else "failed", recipe="recipes/kimi.toml", recipe_name="kimi",
                       package="vllm", python_version="3.12.3", versions={"vllm": f"0.16.0rc2.dev{300 + i}+g{i:09x}"},
                       changes=[PackageChange("vllm", f"0.16.0rc2.dev{299 + i}", f"0.16.0rc2.dev{300 + i}", "upgraded",
                                              dev_distance=1, old_sha="5719a4e4e", new_sha="8c1b3f2a0",
                                              compare_url="https://github.com/vllm-project/vllm/compare/5719a4e4e...8c1b3f2a0")],
                       root_cause=rc, run_dir=str(d), started=started,
                       steps=[CiStep("environment", "passed", 1.0), CiStep("resolve", "passed", 3.0),
                              CiStep("install", "passed", 20.0), CiStep("diff", "passed", 0.1),
                              CiStep("smoke", "passed" if ok else "failed", 60.0 + i % 30)])
        save_verdict(rep)


def _bisection(home: Path) -> None:
    state = home / "bisect" / "kimi-0123456789ab"
    builds = [{"version": f"0.16.0rc2.dev{v}+g{v:09x}", "commit": f"{v:040x}"} for v in range(313, 345)]
    recs: list[tuple[float, Record]] = [(time.time() - 900, Started(kind="bisect", recipe="recipes/kimi.toml",
                                                                   package="vllm", good=builds[0]["version"],
                                                                   bad=builds[-1]["version"])),
                                        (time.time() - 899, Candidates(mode="commits", source="git", builds=builds))]
    for k, b in ((0, "good"), (31, "bad"), (15, "good"), (23, "bad"), (19, "good"), (21, "bad"), (20, "good")):
        recs.append((time.time() - 800 + k, BuildVerdict(version=builds[k]["version"], commit=builds[k]["commit"],
                                                         verdict=b, reason="smoke " + ("passed" if b == "good" else "failed"),
                                                         seconds=61.0,
                                                         project_urls={"Source": "https://github.com/vllm-project/vllm"})))
    recs.append((time.time() - 700, Finish(status=BisectStatus.FOUND, first_bad=builds[21], last_good=builds[20])))
    write_journal(state, recs)


def _fleet(folder: Path, hostile: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    old, new = {"vllm": GOOD}, {"vllm": BAD}
    docs = {"gpu-01": {"status": "upgraded", "run_id": "20261201-100000-aaaa", "before": old, "after": new,
                       "downtime": {"seconds": 41.5}},
            "gpu-02": {"status": "reverted", "run_id": "20261201-101000-bbbb", "before": old, "after": old,
                       "attempted": new, "downtime": {"seconds": 63.0},
                       "root_cause": root_cause_doc("Worker_TP4", 3, hostile, "/x/site-packages"),
                       "failure": {"step": "smoke", "error": "SmokeFailed", "message": "smoke test exited 1"}}}
    for host, doc in docs.items():
        (folder / f"{host}.json").write_text(json.dumps(doc))
    return folder


def bench_board(root: Path, *, runs: int = RUNS, diff_files: int = DIFF_FILES, reps: int = 1) -> dict[str, Any]:
    """Time `rewheel board` on a synthetic home (built fresh under `root`) against `diff -ruN`
    of the same two trees; the largest page's size."""
    from rewheel.board.render import page_names

    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    made = make_home(root, runs=runs, diff_files=diff_files)
    env = {**os.environ, "REWHEEL_HOME": str(made["home"])}
    board_s, cpu_s, diff_s, largest, pages = [], [], [], 0, 0
    for _ in range(reps):
        out = root / "board"
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        cp = subprocess.run([sys.executable, "-m", "rewheel", "board", "--out", str(out), "--fleet", str(made["fleet"])],
                            env=env, capture_output=True, text=True)
        board_s.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if cp.returncode != 0:
            raise RuntimeError(f"rewheel board failed: {cp.stderr[-2000:]}")
        sizes = [p.stat().st_size for p in page_names(out)]
        largest, pages = max(sizes), len(sizes)
        t0 = time.perf_counter()
        subprocess.run(["diff", "-ruN", str(made["old"].path / "tree"), str(made["new"].path / "tree")],
                       stdout=subprocess.DEVNULL)
        diff_s.append(time.perf_counter() - t0)
    return {"runs": runs, "diff_files": diff_files, "board_s": board_s, "cpu_s": cpu_s, "diff_s": diff_s,
            "largest_page_bytes": largest, "pages": pages}


def board_row(cfg: Any) -> tuple[Any, dict[str, Any]]:  # (harness.Row, the board's figures)
    """The board's row (`make bench`, `--only board`): `rewheel board` on a synthetic home of
    `cfg.board_runs` runs and a `cfg.board_files`-file diff, medians of `cfg.reps`, against
    `diff -ruN` of the same two trees; with the absolute targets the issue set."""
    from devtools.bench.harness import Row, _median

    cfg.say(f"board: a synthetic home of {cfg.board_runs:,} runs and a {cfg.board_files:,}-file diff")
    got = bench_board(cfg.root / "board", runs=cfg.board_runs, diff_files=cfg.board_files, reps=cfg.reps)
    seconds, page_mb = _median(got["board_s"]) or 0.0, got["largest_page_bytes"] / 2**20
    row = Row(f"board ({cfg.board_runs:,} runs, {cfg.board_files:,}-file diff)", seconds,
              "diff -ruN of the two trees", _median(got["diff_s"]), TARGET_RATIO, samples=got["board_s"],
              baseline_samples=got["diff_s"],
              note=f"{got['pages']:,} pages, the largest {page_mb:.2f} MiB; {_median(got['cpu_s']) or 0:.1f} CPU-s")
    info = {**got, "seconds": round(seconds, 3), "cpu_seconds": round(_median(got["cpu_s"]) or 0.0, 3),
            "largest_page_mb": round(page_mb, 3), "target_page_mb": TARGET_PAGE_MB,
            "pass": bool(row.passed) and page_mb <= TARGET_PAGE_MB}
    return row, info


def board_line(info: dict[str, Any]) -> str:
    return (f"board: written in {info['seconds']:.1f} s ({info['cpu_seconds']:.1f} CPU-s), largest page "
            f"{info['largest_page_mb']:.2f} MiB (target <= {info['target_page_mb']:g} MiB): "
            + ("PASS" if info["pass"] else "FAIL"))
