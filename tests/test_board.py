"""`rewheel board` end to end: the command on a home of real journals, real snapshots of a
real virtualenv (their 250-file source diff paged), kept `ci` verdicts, a bisection and a
fleet's run reports — with hostile text in its logs, root causes, package names and patches —
and its pages loaded in a real headless Chromium (tests/support_browser.py): no console error,
no failed request, no horizontal overflow at 1280×800 and at a 390-pixel phone width, every
link between pages resolves, the hostile log lines shown as text. The demo's own board is
checked the same way in tests/test_demo_parts.py; the page models in tests/unit/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.bench.board import HOSTILE, make_home
from support_browser import DESKTOP, PHONE, broken_links, text_of, visit

pytestmark = pytest.mark.slow


def board_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REWHEEL_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "rewheel", "board", *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return make_home(tmp_path_factory.mktemp("board"), runs=40, diff_files=250, hostile=True, nightlies=20)


def test_the_board_of_a_home_in_a_real_browser(home: dict, tmp_path: Path) -> None:
    out = tmp_path / "board"
    cp = board_cli("--out", str(out), "--fleet", str(home["fleet"]), "--expect", ",".join(home["expect"]), "--json",
                   home=home["home"])
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert (doc["environments"], doc["runs"], doc["nightlies"], doc["bisections"], doc["fleet_hosts"]) == (1, 40, 20, 1, 4)
    assert doc["largest_page"]["bytes"] < 4 << 20 and doc["index"] == str(out / "index.html")
    names = sorted(p.name for p in out.glob("*.html"))
    newest = max((n for n in names if n.endswith("-last.html")), default=None)
    assert newest is not None
    diff_pages = [n for n in names if n.startswith(newest.removesuffix(".html") + "-diff-")]
    assert len(diff_pages) == 2  # 250 files: 100 on the run's page, then two more pages
    # Every kind of page (and the runs with hostile logs); every link of these must resolve.
    failed = [n for n in names if n.startswith("run-") and "-last" not in n][:4]
    pages = ["index.html", "nightlies.html", "fleet.html", *[n for n in names if n.startswith("env-")],
             newest, *diff_pages, *failed]
    shots = Path(os.environ.get("REWHEEL_BOARD_SHOTS") or tmp_path / "shots")
    visits = visit(out, pages=pages, shots=shots, shoot={"index.html", newest, "fleet.html", "nightlies.html"})
    assert len(visits) == 2 * len(pages)
    for v in visits:
        assert v.console_errors == [] and v.failed_requests == [], (v.name, v.size, v.console_errors, v.failed_requests)
        assert not v.overflows, f"{v.name} at {v.size}: body {v.scroll_width}px in a {v.client_width}px window"
        assert v.title.endswith("rewheel board") and "pwned" not in v.title
    assert {v.size for v in visits} == {DESKTOP, PHONE}
    assert broken_links(out, visits) == []
    assert all(p.stat().st_size > 10_000 for p in shots.glob("*.png")) and len(list(shots.glob("*.png"))) == 8
    # The hostile log lines are text: every character there, nothing run, no escape code left.
    *logs, scripts = text_of(out, newest, "pre.log")
    assert scripts == "0"
    (log,) = logs
    assert "<script>alert('x')</script> </pre> &amp; red" in log and "</pre><script>document.title='pwned'</script>" in log
    assert "\x1b" not in log and "[31m" not in log and "\u2407bell" in log
    assert HOSTILE not in log  # (as written it holds the escape codes the page takes out)


def test_a_targets_board_and_a_folder_that_is_not_a_board(home: dict, tmp_path: Path) -> None:
    out = tmp_path / "one"
    cp = board_cli("--python", str(home["python"]), "--out", str(out), home=home["home"])
    assert cp.returncode == 0, cp.stderr
    assert f"board: {out / 'index.html'}" in cp.stdout and "40 run(s)" in cp.stdout
    assert "0 qualification(s)" in cp.stdout  # the nightlies of its recipe: it has none
    assert not (out / "fleet.html").exists()
    again = board_cli("--python", str(home["python"]), "--out", str(out), home=home["home"])
    assert again.returncode == 0, again.stderr  # an earlier board's folder is replaced
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    cp = board_cli("--out", str(mine), "--json", home=home["home"])
    assert cp.returncode == 2 and "not a board rewheel wrote" in json.loads(cp.stdout)["message"]
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
