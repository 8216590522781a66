"""`make demo` (`python -m devtools.demo`): the story in the README, played for real on a machine
without a GPU, in about half a minute.

A toy vLLM nightly index runs on 127.0.0.1 with two builds: dev313 (good) and dev344, whose
attention init fails on tensor-parallel rank 4. A toy `vllm serve` (8 worker processes) runs
from a virtualenv on dev313, with a hand-made patch in deepseek_v2.py and 35 leftover debug
dumps. `rewheel run` then upgrades it to the nightly: snapshot, reinstall, diff, smoke test —
which fails on Worker_TP4 — and the automatic revert, after which the old service is healthy
again. `rewheel history`, `rewheel diff` and `rewheel board` follow. Every step runs the real code; nothing is
mocked. Everything lives under one folder (default `<repo>/.demo`, or `$REWHEEL_DEMO_DIR`);
the demo removes it at the start, leaves it for inspection at the end, and leaves no process.

Exit status 0 when the story played out as designed (the run reverted, the root cause names
Worker_TP4 and deepseek_v2.py, the environment, its patch and the debug dumps are back, the
service answers on dev313, no process is left), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from devtools import REPO
from devtools.demo import stage as st
from devtools.demo import toyvllm as toy
from rewheel import proc
from rewheel.diagnose import short_path
from rewheel.records import FailedSnapshot, Finish, Note, Record, Started, Step
from rewheel.report import fitted_console


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Demo:
    stage: Path
    console: Console
    checks: list[Check] = field(default_factory=list)
    index: Any = None
    manager: Any = None
    run_output: list[str] = field(default_factory=list)
    diff_output: list[str] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    # -- presentation ----------------------------------------------------------------------
    def header(self, n: int, title: str, blurb: str = "") -> None:
        self.console.print()
        self.console.rule(f"[bold cyan]{n}. {title}", align="left", style="cyan")
        if blurb:
            self.console.print(blurb, style="italic", highlight=False)

    def note(self, text: str) -> None:
        self.console.print(f"  {text}", highlight=False, markup=False)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, ok, detail))
        mark = "[green]✓[/]" if ok else "[red]✗[/]"
        self.console.print(f"  {mark} {name}" + (f" [dim]({detail})[/]" if detail else ""), highlight=False)
        return ok

    def rewheel(self, *args: str, capture: list[str] | None = None) -> int:
        """Run the real CLI as a user would, streaming its output indented."""
        argv = [sys.executable, "-m", "rewheel", *args]
        self.console.print(f"[bold]$ rewheel {' '.join(args)}[/]", highlight=False)

        def on_line(line: str) -> None:
            if capture is not None:
                capture.append(line)
            # The child's own ANSI styling passes through untouched.
            sys.stdout.write("    " + line + "\n")
            sys.stdout.flush()

        r = proc.stream(argv, on_line=on_line, timeout=300, env=os.environ, cwd=self.stage)
        self.console.print(f"  [dim]→ exit status {r.returncode}[/]", highlight=False)
        return r.returncode


def _default_stage() -> Path:
    env = os.environ.get("REWHEEL_DEMO_DIR")
    return Path(env).resolve() if env else REPO / ".demo"


def _stage_processes(stage: Path) -> list[int]:
    """Processes whose command line names something inside the stage (the service, its
    engine and workers, a smoke test): the demo's own, to be gone at the end."""
    needle = str(stage).encode()
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if needle in cmd and stat.rsplit(")", 1)[-1].split()[0] != "Z":
            pids.append(int(entry))
    return sorted(pids)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _http(url: str) -> tuple[int | None, str]:
    try:
        r = httpx.get(url, timeout=5.0)
        return r.status_code, r.text
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"


def _installed_version(python: Path, dist: str) -> str:
    r = proc.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                 timeout=60, env=os.environ)
    return r.stdout.strip() if r.ok else f"? ({r.stderr.strip()[-200:]})"


def play(demo: Demo) -> None:
    from rewheel import commands, journal, service
    from devtools.localindex import start_index
    from rewheel.recipe import load_recipe

    stage = demo.stage
    c = demo.console

    # 1 ---------------------------------------------------------------------------------
    demo.header(1, "A toy vLLM nightly index on 127.0.0.1",
                "Two nightlies of a small package shaped like vLLM (worker processes Worker_TP0..7, "
                "a DeepSeek-V2 model, vLLM's log format), served by a real package index.")
    idx = st.build_index(stage / "index")
    demo.index = start_index(idx.root, prefix_paths=idx.prefix_paths)
    for whl in sorted(idx.root.rglob("*.whl")):
        demo.note(f"{whl.relative_to(idx.root)}")
    demo.note(f"index:   {demo.index.url}   nightly: {demo.index.sub_url('nightly')}  "
              f"(mirrors only the newest commit, {toy.BAD_SHA})")

    # 2 ---------------------------------------------------------------------------------
    demo.header(2, "The service's environment, as the story found it",
                f"A virtualenv on vllm {toy.GOOD_VERSION}, a hand-made debugging patch in installed files, "
                f"and {st.N_DUMPS} leftover debug dumps.")
    python = st.create_env(stage, demo.index.url, demo.index.sub_url(toy.GOOD_SHA), os.environ)
    patched = st.apply_local_patch(python)
    dumps = st.make_debug_dumps(stage)
    toy.write_hf_cache(stage / "hf")
    demo.note(f"environment: {python.parent.parent}  (vllm {_installed_version(python, 'vllm')})")
    for p in patched:
        demo.note(f"patched by hand: {p.relative_to(st.site_packages(python))}")
    demo.note(f"debug dumps: {len(dumps)} files in {stage / 'tmp'}")
    port = st.free_port()
    recipe_path = st.write_recipe(stage, index_base=demo.index.base, port=port)
    demo.note(f"recipe: {recipe_path}  (from recipes/demo.toml)")

    # 3 ---------------------------------------------------------------------------------
    demo.header(3, "Start the service: `vllm serve` with tensor parallel 8",
                "Started through rewheel's command manager, exactly as the recipe's \\[service] says.")
    recipe = load_recipe(recipe_path)
    target = commands.open_target(recipe)
    assert recipe.service is not None
    demo.manager = service.make_manager(recipe.service, target.store.env_dir, python=recipe.python)
    started = time.time()
    demo.manager.start()
    health = service.wait_ready(demo.manager, recipe.service, started_at=started)
    status = demo.manager.status()
    demo.note(f"{health.detail}")
    demo.note(f"processes: {len(status.pids)} (API server, EngineCore_DP0, Worker_TP0..7), main pid {status.main_pid}")
    code, body = _http(f"http://127.0.0.1:{port}/version")
    demo.note(f"GET /version -> {code} {body.strip()}")

    # 4 ---------------------------------------------------------------------------------
    demo.header(4, "rewheel run: upgrade to the nightly, prove it, or put everything back",
                "Plan; prepare the nightly beside the live environment and pre-check it while the service "
                "serves; then stop, snapshot, install offline from uv's cache, diff, smoke test on 8 ranks; "
                "on failure: revert. The downtime is measured from the stop to the first healthy answer.")
    # --quiet: uv's and the smoke test's own output stay in the run's logs (shown below).
    rc = demo.rewheel("run", str(recipe_path), "--yes", "--quiet", capture=demo.run_output)
    run = next((j for j in journal.list_runs(target.store.env_dir) if j.kind == "run"), None)
    smoke_log = run.dir / "smoke.log" if run else None
    if smoke_log is not None and smoke_log.is_file():
        lines = smoke_log.read_text(errors="replace").splitlines()
        c.print(f"\n  The smoke test's log ({len(lines)} lines, smoke.log in the run's folder) ends with "
                "what a person reads first — the cascade:", highlight=False, markup=False)
        for line in [ln for ln in lines if not ln.startswith("[rewheel]")][-3:]:
            c.print(f"    {line[:160]}", style="dim", highlight=False, markup=False)
        first = next((i for i, ln in enumerate(lines, 1) if "Worker_TP4" in ln and " ERROR " in ln), None)
        if first:
            c.print(f"  The root cause rewheel named above is Worker_TP4's traceback, {len(lines) - first} "
                    "lines further up, under the cascade.", highlight=False)

    # 5 ---------------------------------------------------------------------------------
    demo.header(5, "rewheel history", "Snapshots and runs, newest first.")
    demo.rewheel("history", str(recipe_path))

    kept = run.first(FailedSnapshot) if run else None
    failed_snap = kept.failed_snapshot_id if kept else None
    pre_snap = run.snapshot_id if run else None
    demo.header(6, "rewheel diff",
                "What the failed nightly changed: the pre-upgrade snapshot against the failed build, "
                "which the revert kept as a snapshot for inspection.")
    if pre_snap and failed_snap:
        demo.rewheel("diff", str(recipe_path), pre_snap, failed_snap, "--stat", capture=demo.diff_output)
    demo.note("And the live environment against the pre-upgrade snapshot: after the revert, nothing differs.")
    demo.rewheel("diff", str(recipe_path), pre_snap or "", "--stat")

    # 7 ---------------------------------------------------------------------------------
    demo.header(7, "rewheel board",
                "The same, as a static site to look at: the environment's timeline, the run with its versions, "
                "root cause, log excerpt, suspects and source diff.")
    board = stage / "board"
    demo.rewheel("board", str(recipe_path), "--out", str(board))

    # 8 ---------------------------------------------------------------------------------
    demo.header(8, "Did the story play out as designed?")

    def run_fetched(j) -> list:  # journal.RunJournal | None: what uv downloaded after the stop
        return [x for n in (j.all(Note) if j else []) for x in n.fetched_after_stop or []]

    def doc(rec: Record | None) -> dict[str, Any]:  # a journal record as its JSON line
        return rec.to_json() if rec else {}

    fin = doc(run.last(Finish) if run else None)
    demo.check("`rewheel run` exited 1: verification failed, environment restored", rc == 1, f"exit status {rc}")
    demo.check("the run is recorded as reverted", fin.get("status") == "reverted",
               f"status {fin.get('status')!r}, run {run.id if run else '?'}")
    text = "\n".join(demo.run_output)
    demo.check("the run showed dev313 -> dev344", "dev313" in text and "dev344" in text)
    steps = [str(s.name) for s in (run.all(Step) if run else [])]
    start = doc(run.first(Started) if run else None)
    # The story's patch was written in place through uv's hard links: its clean wheel is
    # fetched again while the service serves (`rewarm`), so the swap stays offline.
    demo.check("the run was staged: prepared, pre-checked and snapshotted while the service served, "
               "the patched package's clean wheel fetched before the stop, the window's check passed (nothing taken again), "
               "installed offline",
               bool(start.get("staged")) and bool(start.get("prepared"))
               and steps[:5] == ["snapshot", "rewarm", "stop", "snapshot-check", "reinstall"]
               and not (fin.get("fetched_after_stop") or run_fetched(run)),
               f"staged={start.get('staged')}, first steps {steps[:5]}")
    down = fin.get("downtime") or {}
    demo.check("the downtime is reported, until the old service answered again (with the revert)",
               down.get("seconds", 0) > 0 and down.get("parts", {}).get("revert", 0) > 0
               and "downtime" in text, f"{down.get('seconds')} s: {down.get('parts')}")
    diff_text = "\n".join(demo.diff_output)
    demo.check("`rewheel diff` of the failed build shows dev313 -> dev344 and deepseek_v2.py",
               "dev344" in diff_text and "deepseek_v2.py" in diff_text)
    rcause = fin.get("root_cause") or {}
    rc_text = json.dumps(rcause)
    demo.check("root cause names Worker_TP4", "Worker_TP4" in rc_text,
               f"rank {rcause.get('rank')!r}")
    frame = rcause.get("frame") or {}
    demo.check("root cause points into deepseek_v2.py", "deepseek_v2.py" in str(frame.get("file", "")),
               f"{short_path(str(frame.get('file')))}:{frame.get('line')} in {frame.get('function')}")
    demo.check("root cause is the real exception, not the cascade",
               rcause.get("type") == "RuntimeError" and "cannot reshape" in str(rcause.get("message", "")),
               f"{rcause.get('type')}: {str(rcause.get('message', ''))[:70]}")
    sus = {x.get("path"): x for x in rcause.get("suspects") or []}
    ds = sus.get(st.DEEPSEEK_REL) or {}
    demo.check("suspects: dev344's deepseek_v2.py hunk around the failing line, its removed local patch",
               ds.get("distance_lines") == 0 and bool(ds.get("hunks")) and bool(ds.get("patch_removed")),
               f"{list(sus)}")
    helper = sus.get("vllm/model_executor/layers/attention/head_layout.py") or {}
    demo.check("suspects: the head_layout.py helper dev344 added", helper.get("change") == "added",
               f"{list(sus)}")
    version = _installed_version(python, "vllm")
    demo.check("vllm is back on dev313", version == toy.GOOD_VERSION, version)
    site = st.site_packages(python)
    demo.check("the hand-made patch is back in deepseek_v2.py and weight_utils.py",
               all(st.LOCAL_PATCH_MARKER in (site / rel).read_text() for rel in (st.DEEPSEEK_REL, st.WEIGHT_UTILS_REL)))
    demo.check("the file dev344 added is gone",
               not (site / "vllm/model_executor/layers/attention/head_layout.py").exists())
    back = sorted((stage / "tmp").glob("*.pt"))
    demo.check(f"the {st.N_DUMPS} debug dumps are back", len(back) == st.N_DUMPS, f"{len(back)} found")
    code, _ = _http(f"http://127.0.0.1:{port}/health")
    demo.check("the service is healthy again", code == 200, f"GET /health -> {code}")
    code, body = _http(f"http://127.0.0.1:{port}/version")
    demo.check("the service runs dev313", code == 200 and toy.GOOD_VERSION in body, body.strip()[:80])
    code, body = _http(f"http://127.0.0.1:{port}/v1/models")
    demo.check("the probe answers with the model", code == 200 and toy.TOY_MODEL in body, f"GET /v1/models -> {code}")
    page = board / run_page(run) if run else None
    html = page.read_text() if page is not None and page.is_file() else ""
    demo.check("the board shows the upgrade, the revert and its root cause",
               (board / "index.html").is_file() and all(w in html for w in (
                   toy.BAD_VERSION, "reverted", "Worker_TP4", "deepseek_v2.py", "cannot reshape")),
               str(page.relative_to(stage)) if page is not None else "no run")


def run_page(run: Any) -> str:  # journal.RunJournal: its page on the board (rewheel.board)
    from rewheel.board.model import RunView

    return RunView(run.dir.parent.parent.name, run.id, run.kind, run.status, run.dir).page


def teardown(demo: Demo) -> None:
    """Stop the service and the index; end every process the demo started."""
    if demo.manager is not None:
        try:
            demo.manager.stop(30.0)
        except Exception as exc:  # reported by the process check below
            demo.note(f"stopping the service: {exc}")
    if demo.index is not None:
        demo.index.stop()
    left = _stage_processes(demo.stage)
    deadline = time.monotonic() + 10
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _stage_processes(demo.stage)
    if left:
        _kill(left)
    demo.check("no demo process is left", not left, f"had to kill {left}" if left else "service and index stopped")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devtools.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="the demo's folder (default: $REWHEEL_DEMO_DIR or <repo>/.demo)")
    args = ap.parse_args(argv)
    stage = Path(args.dir).resolve() if args.dir else _default_stage()
    # Fitted to the terminal as rewheel's own output is: wrapped between words, indent kept.
    console = fitted_console(highlight=False)
    # A previous demo that was killed may have left its service running: end it first.
    _kill(_stage_processes(stage))
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    env = st.demo_env(stage)
    if sys.stdout.isatty():
        env.pop("NO_COLOR", None)
        env["FORCE_COLOR"] = "1"
    # The CLI's lines are shown indented by 4: it fits them to what is left of the terminal.
    env["COLUMNS"] = str(max(40, shutil.get_terminal_size((120, 40)).columns - 4))
    os.environ.clear()
    os.environ.update(env)

    console.rule("[bold]rewheel demo: the Kimi-K2.5 upgrade story, on a machine without a GPU")
    console.print(f"Everything happens in {stage} (state, caches, the environment, the index's wheels).",
                  highlight=False)
    demo = Demo(stage, console)
    failed: BaseException | None = None
    try:
        play(demo)
    except KeyboardInterrupt:
        failed = KeyboardInterrupt()
        console.print("\n[red]interrupted[/]")
    except Exception as exc:  # the demo says what broke, cleans up, and exits 1
        failed = exc
        import traceback

        console.print(f"\n[red]the demo broke: {type(exc).__name__}: {exc}[/]", highlight=False)
        traceback.print_exc()
    finally:
        teardown(demo)
    bad = [ch for ch in demo.checks if not ch.ok]
    secs = time.monotonic() - demo.t0
    console.print()
    if failed is None and not bad:
        console.rule(f"[bold green]The story played out as designed ({secs:.0f}s)", style="green")
        console.print(f"Look around: {stage}  (state in home/, the run's logs in home/envs/*/runs/)",
                      highlight=False)
        print_look_around(console, stage)
        console.print("The board, a static site (open it in a browser):", highlight=False)
        console.print(f"  {board_path(stage)}", highlight=False, markup=False, soft_wrap=True)
        return 0
    why = f"{len(bad)} check(s) failed" if bad else f"it broke: {type(failed).__name__}"
    console.rule(f"[bold red]The demo did not play out as designed ({why})", style="red")
    for ch in bad:
        console.print(f"  ✗ {ch.name} ({ch.detail})", highlight=False)
    return 1


def look_around_commands(stage: Path) -> list[str]:
    """The commands that work on what the demo left, as a person types them from here: each
    through `<stage>/rewheel`, which brings the demo's environment and serves its toy index
    while the command runs (devtools/demo/lookaround.py)."""
    rel = os.path.relpath(stage)
    where = rel if not rel.startswith("..") else str(stage)
    return [f"{where}/rewheel history {where}/demo.toml",
            f"{where}/rewheel diff {where}/demo.toml",
            # The newest run's log: `why` reads one log, and each run (a look-around `run` too)
            # leaves one more. (Unquoted, as the other paths here: it fits the demo's 76 columns.)
            f"{where}/rewheel why $(ls -t {where}/home/envs/*/runs/*/smoke.log | head -1)",
            f"{where}/rewheel check {where}/demo.toml",
            f"{where}/rewheel status {where}/demo.toml"]


def board_path(stage: Path) -> str:
    """The board's front page as a person types it from here (as the look-around commands)."""
    rel = os.path.relpath(stage / "board" / "index.html")
    return rel if not rel.startswith("..") else str(stage / "board" / "index.html")


def print_look_around(console: Console, stage: Path) -> None:
    from devtools.demo.lookaround import write_script

    write_script(stage)
    console.print("These work on it as written (the demo's environment and its toy index come along):",
                  highlight=False)
    for cmd in look_around_commands(stage):
        console.print(f"  $ {cmd}", highlight=False, markup=False, soft_wrap=True)


if __name__ == "__main__":
    sys.exit(main())
