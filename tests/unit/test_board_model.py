"""`rewheel board`'s page models, without a browser and without a process: what each page
shows, read from journals, snapshot metadata, kept `ci` verdicts, bisection journals and a
fleet's run reports written here; and the pages themselves as text (escaping, the folder
rules). The pages in a real browser: tests/test_board.py and the demo's board in
tests/test_demo_parts.py."""

from __future__ import annotations

import json
import re
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.bench.board import HOSTILE, root_cause_doc, write_journal, write_smoke_log
from rewheel import bisection, qualify
from rewheel.board import model
from rewheel.board.diffs import kinds
from rewheel.board.model import Board, read_env, read_fleet, wave_sizes
from rewheel.board.render import MARKER, plain, write
from rewheel.errors import UsageError
from rewheel.paths import env_dir as make_env_dir
from rewheel.qualify import CiReport, CiStep
from rewheel.records import FailedSnapshot, Finish, Installed, Note, SnapshotTaken, Started, Step
from rewheel.snapshot import SnapshotMeta, Store
from rewheel.statuses import BisectStatus, Finished, StepName

OLD = {"vllm": "0.16.0rc2.dev313+g5719a4e4e", "torch": "2.9.0"}
NEW = {"vllm": "0.16.0rc2.dev344+g8c1b3f2a0", "torch": "2.9.0"}


def _snap(store: Store, sid: str, created: float, status: str = "pre-upgrade", run_id: str | None = None) -> SnapshotMeta:
    path = store.snapshots_dir / sid
    path.mkdir(parents=True)
    m = SnapshotMeta(sid, path, store.home, f"label {sid}", status, created, str(store.prefix), "python", "venv",
                     dict(OLD), [], 10, 100, 0, 100, "hardlink", run_id=run_id)
    m.save()
    return m


def _home(tmp_path: Path, *, hostile: bool = False) -> tuple[Store, dict[str, str]]:
    """An environment with: a kept upgrade (its after-state snapshotted by the next run), a
    reverted run (with its failed build and crash log), a rollback, a resumed run and an
    interrupted one. Returns the store and the run ids by name."""
    home = tmp_path / "home"
    prefix = tmp_path / "env"
    prefix.mkdir()
    make_env_dir(home, prefix)
    store = Store(prefix, home)
    t = time.time() - 10_000
    ids = {}
    runs = store.env_dir / "runs"

    def run(name: str, t0: float, records: list[tuple[float, Any]]) -> Path:
        ids[name] = f"20260101-0000{len(ids):02d}-{name}"
        write_journal(runs / ids[name], [(t0 + dt, r) for dt, r in records])
        return runs / ids[name]

    down = {"seconds": 31.5, "parts": {"stop": 1.0, "smoke": 20.0}}
    run("kept", t, [(0, Started(kind="run", recipe=None, before=OLD)), (1, SnapshotTaken(snapshot_id="pre1")),
                    (2, Step(name=StepName.STOP)), (3, Step(name=StepName.REINSTALL)), (8, Installed(versions=NEW)),
                    (9, Step(name=StepName.SMOKE)), (29, Step(name=StepName.START)), (33, Step(name=StepName.KEEP)),
                    (34, Finish(status=Finished.UPGRADED, before=OLD, after=NEW, downtime=down))])
    _snap(store, "pre1", t + 1, run_id=ids["kept"])
    rdir = run("reverted", t + 1000, [])
    mark = write_smoke_log(rdir, hostile)
    rc = root_cause_doc("Worker_TP4", mark, hostile, "/env/lib/python3.12/site-packages")
    write_journal(rdir, [(t + 1000, Started(kind="run", before=NEW)), (t + 1001, SnapshotTaken(snapshot_id="pre2")),
                         (t + 1002, Step(name=StepName.SMOKE)), (t + 1005, FailedSnapshot(failed_snapshot_id="bad2")),
                         (t + 1006, Step(name=StepName.REVERT, reason="smoke failed")),
                         (t + 1010, Finish(status=Finished.REVERTED, reason="smoke failed: exited 1", before=NEW,
                                           after=NEW, attempted={**NEW, "vllm": "0.16.0rc2.dev350"},
                                           root_cause=rc, downtime={"seconds": 12.0, "parts": {}}))])
    _snap(store, "pre2", t + 1001, run_id=ids["reverted"])
    _snap(store, "bad2", t + 1005, status="failed-upgrade", run_id=ids["reverted"])
    run("rollback", t + 2000, [(0, Started(kind="rollback", snapshot_id="pre1")), (1, Step(name=StepName.RESTORE)),
                               (4, Finish(status=Finished.RESTORED))])
    run("resumed", t + 3000, [(0, Started(kind="run", before=OLD)), (1, Step(name=StepName.REINSTALL)),
                              (50, Step(name=StepName.RESTORE, resumed=True)),
                              (60, Finish(status=Finished.REVERTED, resumed=True, before=OLD, after=OLD))])
    run("cut", t + 4000, [(0, Started(kind="run", before=OLD)), (1, Step(name=StepName.STOP)),
                          (2, Note(service_was_active=True)), (3, Step(name=StepName.REINSTALL))])
    return store, ids


def _runs(store: Store) -> dict[str, model.RunView]:
    env = read_env(store)
    return {r.id.rsplit("-", 1)[1]: r for r in env.runs}


def test_the_timeline_says_what_each_journal_was(tmp_path: Path) -> None:
    store, _ = _home(tmp_path)
    env = read_env(store)
    assert [r.id.rsplit("-", 1)[1] for r in env.runs] == ["cut", "resumed", "rollback", "reverted", "kept"]
    runs = {r.id.rsplit("-", 1)[1]: r for r in env.runs}
    assert [runs[k].label for k in ("cut", "resumed", "rollback", "reverted", "kept")] == [
        "interrupted", "reverted", "rolled back", "reverted", "upgraded"]
    assert runs["resumed"].resumed and not runs["kept"].resumed
    # A rollback journals no versions: the snapshot it restored, against what the run before left.
    assert [(c.name, c.old, c.new, c.change) for c in runs["rollback"].changes] == [
        ("vllm", NEW["vllm"], OLD["vllm"], "downgraded")]
    assert runs["reverted"].failed and not runs["kept"].failed
    assert env.page == f"env-{store.env_dir.name[-10:]}.html" and runs["kept"].page.startswith("run-")
    assert env.versions == OLD  # as the newest finished run left it (the interrupted one has no end)


def test_a_run_shows_its_versions_outage_smoke_time_and_steps(tmp_path: Path) -> None:
    store, _ = _home(tmp_path)
    r = _runs(store)["kept"]
    assert [(c.name, c.old, c.new, c.change) for c in r.changes] == [("vllm", OLD["vllm"], NEW["vllm"], "upgraded")]
    assert r.changes[0].dev_distance == 31
    assert r.outage_s == 31.5 and r.outage_parts == {"stop": 1.0, "smoke": 20.0}
    assert r.smoke_s == pytest.approx(20.0, abs=0.01)
    assert [(s.name, round(s.offset), round(s.seconds or -1)) for s in r.steps] == [
        ("stop", 2, 1), ("reinstall", 3, 6), ("smoke", 9, 20), ("start", 29, 4), ("keep", 33, 1)]
    cut = _runs(store)["cut"]
    assert cut.steps[-1].name == "reinstall" and cut.steps[-1].seconds is None  # it never ended


def test_a_failed_run_shows_what_it_tried_its_root_cause_and_the_log_around_it(tmp_path: Path) -> None:
    store, _ = _home(tmp_path, hostile=True)
    r = _runs(store)["reverted"]
    assert [(c.name, c.new) for c in r.changes] == [("vllm", "0.16.0rc2.dev350")]  # what the revert undid
    assert r.root_cause is not None and r.root_cause.rank == "Worker_TP4"
    assert r.root_cause.suspects and r.root_cause.suspects[0].path.endswith("deepseek_v2.py")
    assert r.log is not None and r.log.mark == r.root_cause.log_line
    assert r.log.first == r.log.mark - model.EXCERPT_BEFORE
    assert any("Traceback" in line for line in r.log.lines) and any(HOSTILE in line for line in r.log.lines)
    assert r.reason == "smoke failed: exited 1" and r.outage_s == 12.0


def test_which_two_states_a_runs_source_diff_compares(tmp_path: Path) -> None:
    store, _ = _home(tmp_path)
    runs = _runs(store)
    rev = runs["reverted"]
    assert (rev.diff_old.id, rev.diff_new.id) == ("pre2", "bad2")  # type: ignore[union-attr]
    kept = runs["kept"]  # its result, as the next run's pre-upgrade snapshot caught it
    assert kept.diff_old is not None and kept.diff_old.id == "pre1" and getattr(kept.diff_new, "id", None) == "pre2"
    assert runs["rollback"].diff_old is None and "rollback" in runs["rollback"].diff_note
    assert runs["cut"].diff_old is None and "before it took a snapshot" in runs["cut"].diff_note
    (store.snapshots_dir / "pre2" / "meta.json").unlink()  # pruned
    runs = _runs(store)
    assert runs["reverted"].diff_old is None and "pruned" in runs["reverted"].diff_note


def test_the_fate_of_each_local_patch_follows_the_recipes_policy(tmp_path: Path) -> None:
    store, ids = _home(tmp_path)
    rdir = store.env_dir / "runs" / ids["kept"]
    (rdir / "patches").mkdir()
    (rdir / "patches" / "patches.json").write_text(json.dumps({"patches": [
        {"path": "vllm/a.py", "distribution": "vllm", "diff": "--- a\n+++ b\n"}, {"path": "vllm/b.py"}]}))
    (rdir / "patches" / "vllm__b.py.conflict").write_text("<<<<<<<")
    recipe = tmp_path / "r.toml"
    recipe.write_text('[environment]\npython = "/nonexistent/bin/python"\n[patches]\npolicy = "reapply"\n')
    lines = (rdir / "journal.jsonl").read_text().splitlines()
    first = json.loads(lines[0]) | {"recipe": str(recipe)}
    (rdir / "journal.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    patches = _runs(store)["kept"].patches
    assert [(p.path, p.fate.split(":")[0]) for p in patches] == [("vllm/a.py", "carried"), ("vllm/b.py", "dropped")]


def test_waves_are_the_playbooks_serial_batches() -> None:
    assert wave_sizes("1,30%,100%", 10) == [1, 3, 10]
    assert wave_sizes("1,30%,100%", 2) == [1, 1, 2]
    assert wave_sizes("2", 5) == [2]
    with pytest.raises(UsageError, match="--waves"):
        wave_sizes("one,two", 3)


def _report(folder: Path, host: str, status: str, run_id: str, **more: Any) -> None:
    doc = {"status": status, "run_id": run_id, "before": OLD, "after": NEW if status == "upgraded" else OLD,
           "attempted": NEW, "downtime": {"seconds": 40.0}, **more}
    (folder / f"{host}.json").write_text(json.dumps(doc))


def test_a_fleet_is_hosts_by_waves_in_the_order_they_were_upgraded(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    _report(folder, "gpu-b", "upgraded", "20261201-100500-bbbb")
    _report(folder, "gpu-a", "upgraded", "20261201-100000-aaaa")  # the canary: started first
    _report(folder, "gpu-c", "reverted", "20261201-101000-cccc",
            root_cause=root_cause_doc("Worker_TP4", 3, False, "/x/site-packages"))
    fleet = read_fleet(folder, expect=None, waves="1,30%,100%")
    assert [(h.host.host, h.wave) for h in fleet.hosts] == [("gpu-a", 1), ("gpu-b", 2), ("gpu-c", 3)]
    assert fleet.waves == 3 and fleet.counts == {"reverted": 1, "upgraded": 2}
    assert fleet.causes[0].hosts == ["gpu-c"]
    fleet = read_fleet(folder, expect=["gpu-a,gpu-b,gpu-c,gpu-d,gpu-e"], waves="1,100%")
    assert [(h.host.host, h.wave) for h in fleet.hosts] == [("gpu-a", 1), ("gpu-b", 2), ("gpu-c", 2),
                                                           ("gpu-d", None), ("gpu-e", None)]
    with pytest.raises(UsageError, match="no HOST.json"):
        read_fleet(tmp_path / "nothing")


def test_ci_keeps_each_verdict_and_reads_them_back(tmp_path: Path, rewheel_home: Path) -> None:
    for i, status in enumerate(("qualified", "failed")):
        d = rewheel_home / "ci" / "kimi" / f"2026010{i}-000000-abcd"
        d.mkdir(parents=True)
        rc = model.RootCause.from_json(root_cause_doc("Worker_TP4", 3, True, "/x")) if status == "failed" else None
        qualify.save_verdict(CiReport(status=status, recipe="r.toml", recipe_name="kimi", package="vllm",
                                      versions={"vllm": NEW["vllm"]}, root_cause=rc, run_dir=str(d),
                                      started=1000.0 + i, steps=[CiStep("smoke", "passed", 61.5)]))
    (rewheel_home / "ci" / "kimi" / "broken").mkdir()
    (rewheel_home / "ci" / "kimi" / "broken" / qualify.VERDICT).write_text("{not json")
    got = qualify.verdicts()
    assert [(r.status, r.started, r.version, r.recipe_name) for r in got] == [
        ("qualified", 1000.0, NEW["vllm"], "kimi"), ("failed", 1001.0, NEW["vllm"], "kimi")]
    assert got[1].root_cause is not None and got[1].root_cause.rank == "Worker_TP4"
    assert got[0].step("smoke") is not None and got[0].step("smoke").seconds == 61.5  # type: ignore[union-attr]
    assert got[1].to_json() == CiReport.from_json({**got[1].to_json(), "started": 1001.0,
                                                   "recipe_name": "kimi"}).to_json()


def test_bisections_are_read_back_from_their_journals(rewheel_home: Path) -> None:
    from devtools.bench.board import _bisection

    _bisection(rewheel_home)
    (found,) = bisection.journaled()
    assert found.status == BisectStatus.FOUND and found.mode == "commits" and len(found.candidates) == 32
    assert found.first_bad is not None and found.last_good is not None
    assert found.first_bad.version and "dev334" in found.first_bad.version
    assert found.compare_url and found.compare_url.startswith("https://github.com/vllm-project/vllm/compare/")
    assert found.smoke_runs == 7


# -- the pages as text --------------------------------------------------------------------
def _board(tmp_path: Path, store: Store) -> Board:
    return Board(store.home, time.time(), "test", [read_env(store)], qualify.verdicts(store.home), [], None)


def test_hostile_text_is_escaped_by_the_engine_and_no_page_can_run_a_script(tmp_path: Path) -> None:
    store, ids = _home(tmp_path, hostile=True)
    out = tmp_path / "board"
    res = write(_board(tmp_path, store), out, envs_live={})
    assert res.pages == len(list(out.glob("*.html"))) == 2 + 1 + 5  # index, nightlies, env, runs
    for page in out.glob("*.html"):
        html = page.read_text()
        assert "<script" not in html.lower(), page.name
        assert "\x1b" not in html and "\x07" not in html, page.name
        assert "default-src 'none'" in html  # the CSP: no script, no request
        assert not re.search(r'\s(?:src|href)="(?!https://)[a-z]+:', html), page.name  # no request out
    run_html = (out / _runs(store)["reverted"].page).read_text()
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in run_html and "&lt;/pre&gt;" in run_html
    assert "\u2407bell" in run_html  # a control character shown as its symbol, ANSI colours taken out
    assert "Worker_TP4" in run_html and "deepseek_v2.py" in run_html


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.tags.append(tag)


def _tags(html: str) -> list[str]:
    parser = _Tags()
    parser.feed(html)
    return parser.tags


# What a crash log, a model's output or a package name may hold: markup, entities, quotes,
# terminal escapes, control characters, any Unicode.
HOSTILE_TEXT = st.lists(st.one_of(st.sampled_from(["<", ">", "&", '"', "'", "</pre>", "<script>", "\x1b[31m",
                                                     "\x1b]0;t\x07", "&amp;", "{{", "{%", "\x00", "\r"]),
                                   st.characters(codec="utf-8")), max_size=30).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(message=HOSTILE_TEXT, line=HOSTILE_TEXT, package=HOSTILE_TEXT)
def test_any_text_in_a_log_a_root_cause_or_a_version_stays_text(tmp_path: Path, message: str, line: str,
                                                                package: str) -> None:
    """The run page of a failed run whose root cause, log line and package name are anything:
    the page has exactly the elements it has for plain words (nothing injected), and each
    text is in it, escaped."""
    from markupsafe import escape

    from rewheel.board.render import _env

    run = model.RunView("env-0123456789", "20260101-000000-abcd", "run", "reverted", tmp_path,
                        before={package: "1.0"}, attempted={package: "2.0"})
    run.changes = model.diff_versions(run.before, run.attempted)
    run.root_cause = model.RootCause.from_json({**root_cause_doc("Worker_TP4", 3, False, "/x"), "message": message})
    run.log = model.LogExcerpt("smoke.log", 1, [line, "after"], 1)
    board = Board(tmp_path, 0.0, "test", [], [], [], None)
    page = _env().get_template("run.html.j2")

    def render(r: model.RunView) -> str:
        return page.render(page=r.page, board=board, nav=[], title="t", run=r, diff=None, diff_note="",
                           longest=0.0, files=[], pager=[])

    html = render(run)
    tame = model.RunView(run.env_key, run.id, run.kind, run.status, tmp_path, before={"pkg": "1.0"},
                         attempted={"pkg": "2.0"})
    tame.changes, tame.root_cause = model.diff_versions(tame.before, tame.attempted), model.RootCause.from_json(
        {**root_cause_doc("Worker_TP4", 3, False, "/x"), "message": "m"})
    tame.log = model.LogExcerpt("smoke.log", 1, ["l", "after"], 1)
    assert _tags(html) == _tags(render(tame))
    for text in (message, line, package):
        assert str(escape(plain(text))) in html


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_plain_leaves_no_control_character_and_keeps_the_text(text: str) -> None:
    shown = plain(text)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", shown)
    if not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text):
        assert shown == text


def test_diff_lines_get_their_kinds() -> None:
    text = "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n ctx\n-old\n+new\n\\ No newline at end of file\n"
    assert [k for k, _ in kinds(text)] == ["f", "f", "h", "c", "d", "a", "c"]
    assert kinds("--- a/x\n+++ b/x\n@@ -1 +1 @@\n---- a removed line\n")[3][0] == "d"


def test_the_folder_must_be_new_empty_or_an_earlier_boards(tmp_path: Path) -> None:
    store, _ = _home(tmp_path)
    board = _board(tmp_path, store)
    other = tmp_path / "docs"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="not a board rewheel wrote"):
        write(board, other, envs_live={})
    assert sorted(p.name for p in other.iterdir()) == ["keep.txt"]  # nothing written
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        write(board, tmp_path / "file", envs_live={})
    out = tmp_path / "board"
    write(board, out, envs_live={})
    stale = out / _runs(store)["cut"].page
    assert stale.is_file() and (out / MARKER).is_file()
    import shutil

    shutil.rmtree(store.env_dir / "runs" / stale.name.split("-", 2)[2].removesuffix(".html"))
    again = write(_board(tmp_path, store), out, envs_live={})
    assert not stale.exists() and again.removed == [stale.name]
