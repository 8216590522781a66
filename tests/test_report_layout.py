"""The human reports at 80, 100 and 120 columns, on a terminal and plain: every version,
build hash and snapshot id appears whole (never cut, folded or ellipsised); what changes
version comes before the same-version reinstalls, which take one line unless `verbose`.

The reports are the real result objects (`RunReport`, `DiffResult`, `History` with real
`SnapshotMeta` and `RunJournal` records) rendered by `rewheel.report` on a rich console of a
fixed width, as a terminal of that width shows them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from rewheel import report
from rewheel.diff import DiffResult, PackageChange
from rewheel.journal import RunJournal
from rewheel.records import Finish, Installed, SnapshotTaken, Started, Step
from rewheel.statuses import Finished, StepName
from rewheel.installer import InstallPlan, PlannedChange
from rewheel.commands import RunReport
from rewheel.commands.results import History, RunPlan
from rewheel.snapshot import SnapshotMeta

OLD_VLLM, NEW_VLLM = "0.16.0rc2.dev313+g8c1b3f2a0", "0.16.0rc2.dev344+g5719a4e4e"
OLD_TORCH, NEW_TORCH = "2.13.0.dev20260329+cu130", "2.14.0.dev20260330+cu130"
COMPARE = "https://github.com/vllm-project/vllm/compare/8c1b3f2a0...5719a4e4e"
WHOLE = [OLD_VLLM, NEW_VLLM, OLD_TORCH, NEW_TORCH, "nvidia-cublas-cu13", "flashinfer-python",
         "0.6.3", "0.6.4", COMPARE]
SNAP_PRE, SNAP_FAILED = "cdc9f826", "e1d3d569"
RUN_ID = "20261203-133832-a9dd"


@pytest.fixture(autouse=True)
def _decided_per_console() -> Iterator[None]:
    """`--plain` is global state set by the CLI; each test sets it and it is put back."""
    before = report.layout.PLAIN
    yield
    report.layout.PLAIN = before


def console(width: int) -> Console:
    # A terminal of this width (tables allowed), without colours: the text as a person reads it.
    return Console(width=width, record=True, force_terminal=True, color_system=None, highlight=False)


def changes() -> list[PackageChange]:
    return [PackageChange("vllm", OLD_VLLM, NEW_VLLM, "upgraded", dev_distance=31, old_sha="8c1b3f2a0",
                          new_sha="5719a4e4e", compare_url=COMPARE),
            PackageChange("torch", OLD_TORCH, NEW_TORCH, "upgraded", old_variant="cu130", new_variant="cu130"),
            PackageChange("flashinfer-python", "0.6.4", "0.6.3", "downgraded"),
            PackageChange("nvidia-cublas-cu13", None, "13.1.0.3", "added"),
            PackageChange("triton-kernels", "3.5.0.dev20260301", None, "removed"),
            PackageChange("numpy", "2.3.1", "2.3.1", "reinstalled", files_changed=2)]


def plan_changes() -> list[PlannedChange]:
    planned = [PlannedChange("vllm", OLD_VLLM, NEW_VLLM, dev_distance=31, compare_url=COMPARE, annotated=True),
               PlannedChange("torch", OLD_TORCH, NEW_TORCH),
               PlannedChange("flashinfer-python", "0.6.4", "0.6.3"),
               PlannedChange("nvidia-cublas-cu13", None, "13.1.0.3")]
    # A reinstall-all plan: every other package of the environment at its own version.
    planned += [PlannedChange(f"dep{i:03d}", f"1.{i}.0", f"1.{i}.0") for i in range(187)]
    return planned


def run_report() -> RunReport:
    plan = RunPlan(InstallPlan(argv=["uv", "pip", "install"], changes=plan_changes()))
    return RunReport(status="reverted", recipe="/etc/rewheel/vllm.toml", run_id=RUN_ID, snapshot_id=SNAP_PRE,
                     changes=changes(), plan=plan)


def text_of(c: Console) -> str:
    return c.export_text(styles=False)


def assert_whole(text: str, width: int, plain: bool) -> None:
    for needle in WHOLE:
        assert needle in text, f"{needle!r} not whole at {width} columns:\n{text}"
    assert "…" not in text.replace("… and", ""), text  # no ellipsis anywhere but "… and N more"
    if not plain:
        # Nothing longer than the terminal (a long line wraps at the edge; here it is the
        # console that wraps, and a wrapped version would not be found whole above).
        assert max(len(line) for line in text.splitlines()) <= width


@pytest.mark.parametrize("plain", [False, True], ids=["terminal", "plain"])
@pytest.mark.parametrize("width", [80, 100, 120])
def test_plan_shows_changes_first_and_one_line_for_same_version_reinstalls(width: int, plain: bool) -> None:
    report.layout.PLAIN = plain
    c = console(width)
    report.render_plan(c, run_report())
    text = text_of(c)
    assert_whole(text.replace("\n" + " " * 13, " "), width, plain=True)
    lines = text.splitlines()
    # Upgrades (by name), then downgrades, then additions.
    order = [next(i for i, line in enumerate(lines) if re.search(rf" {name}[: ]", line))
             for name in ("torch", "vllm", "flashinfer-python", "nvidia-cublas-cu13")]
    assert order[0] < order[1] < order[2] < order[3], text
    assert " ".join(lines[:2]).startswith("plan for /etc/rewheel/vllm.toml: 4 version change(s), 187 reinstalled")
    assert "(+31 builds)" in lines[order[1]]
    assert "187 reinstalled at the same version (--verbose lists them)" in text
    assert "dep000" not in text
    assert len(lines) <= 10, text  # was: 40 lines of `name: x → x` and "… and 151 more"


def test_plan_verbose_lists_the_same_version_reinstalls() -> None:
    c = console(80)
    report.render_plan(c, run_report(), verbose=True)
    text = text_of(c)
    assert all(f"dep{i:03d}: 1.{i}.0" in text for i in range(187))


@pytest.mark.parametrize("plain", [False, True], ids=["terminal", "plain"])
@pytest.mark.parametrize("width", [80, 100, 120])
def test_run_report_versions_whole(width: int, plain: bool) -> None:
    report.layout.PLAIN = plain
    c = console(width)
    report.render_run(c, run_report())
    text = text_of(c)
    assert_whole(text, width, plain)
    assert "triton-kernels" in text
    # numpy (other bytes) and the plan's 187 same-version packages: one line.
    assert "188 reinstalled at the same version, 1 of them with other bytes: numpy" in text
    assert "dep000" not in text
    if plain:
        assert f"vllm: {OLD_VLLM} → {NEW_VLLM}  upgraded  +31 builds" in text.splitlines()


@pytest.mark.parametrize("plain", [False, True], ids=["terminal", "plain"])
@pytest.mark.parametrize("width", [80, 100, 120])
def test_diff_report_versions_whole(width: int, plain: bool) -> None:
    report.layout.PLAIN = plain
    c = console(width)
    report.render_diff(c, DiffResult(SNAP_PRE, SNAP_FAILED, changes(), [], unchanged_packages=190))
    text = text_of(c)
    assert_whole(text, width, plain)
    assert f"diff {SNAP_PRE} → {SNAP_FAILED}" in text
    if not plain and width == 120:
        assert "┃ package" in text  # wide enough: a table
    if not plain and width == 80:
        assert "┃" not in text  # too narrow for the table: stacked, not squeezed
        assert f"    {OLD_VLLM} → {NEW_VLLM}" in text


def history(tmp_path: Path) -> History:
    def snap(sid: str, status: str, label: str, versions: dict[str, str], created: float) -> SnapshotMeta:
        return SnapshotMeta(id=sid, path=tmp_path / sid, home=tmp_path, label=label, status=status,
                            created=created, prefix="/opt/vllm-env", python="/opt/vllm-env/bin/python",
                            kind="venv", versions=versions, distributions=[], files=57_000,
                            bytes_total=8 << 30, bytes_copied=3 << 20, bytes_linked=8 << 30, link_mode="hardlink")

    old = {"vllm": OLD_VLLM, "torch": OLD_TORCH, "flashinfer-python": "0.6.3"}
    new = {"vllm": NEW_VLLM, "torch": NEW_TORCH, "flashinfer-python": "0.6.4"}
    snaps = [snap(SNAP_FAILED, "failed-upgrade", f"failed upgrade of run {RUN_ID}", new, 1_770_000_100.0),
             snap(SNAP_PRE, "pre-upgrade", f"before run {RUN_ID}", old, 1_770_000_000.0)]
    run = RunJournal(tmp_path / "runs" / RUN_ID, [
        Started(kind="run", time=1.0), SnapshotTaken(snapshot_id=SNAP_PRE, time=2.0),
        Installed(versions=new, time=3.0), Step(name=StepName.START, time=4.0),
        Finish(status=Finished.REVERTED, before=old, after=old, time=5.0)])
    return History("/etc/rewheel/vllm.toml", snaps, [run], ["vllm", "torch", "flashinfer-python"])


@pytest.mark.parametrize("plain", [False, True], ids=["terminal", "plain"])
@pytest.mark.parametrize("width", [80, 100, 120])
def test_history_versions_and_ids_whole(tmp_path: Path, width: int, plain: bool) -> None:
    report.layout.PLAIN = plain
    c = console(width)
    report.render_history(c, history(tmp_path))
    text = text_of(c)
    # (A label is words: a table may wrap it between them.)
    for needle in (SNAP_PRE, SNAP_FAILED, RUN_ID, OLD_VLLM, NEW_VLLM, OLD_TORCH, NEW_TORCH, "before run"):
        assert needle in text, f"{needle!r} not whole at {width} columns:\n{text}"
    assert "…" not in text
    if plain:
        lines = text.splitlines()
        # One line per snapshot and per run: grep finds a snapshot with its versions.
        snap_line = next(line for line in lines if line.startswith(f"snapshot {SNAP_PRE}"))
        assert OLD_VLLM in snap_line and "pre-upgrade" in snap_line
        run_line = next(line for line in lines if line.startswith(f"run {RUN_ID}"))
        assert f"vllm {OLD_VLLM} → {NEW_VLLM}" in run_line and "reverted" in run_line
    else:
        assert max(len(line) for line in text.splitlines()) <= width
        if width == 120:
            assert "┃ id       ┃ created" in text  # wide enough: the snapshots as a table
        if width == 80:
            assert "┃" not in text  # too narrow: stacked, not squeezed


def test_plain_is_the_default_off_a_terminal() -> None:
    report.layout.PLAIN = None
    off = Console(width=200, record=True, force_terminal=False)
    report.render_package_changes(off, changes()[:1])
    assert text_of(off).splitlines()[0] == f"vllm: {OLD_VLLM} → {NEW_VLLM}  upgraded  +31 builds"
    on = console(200)
    report.render_package_changes(on, changes()[:1])
    assert "┃ package" in text_of(on)


def test_ids_and_versions_never_fold_even_narrower_than_a_version(tmp_path: Path) -> None:
    """Narrower than a version string: the line overflows the edge (the terminal wraps it)
    rather than the version being cut into pieces that grep cannot find."""
    report.layout.PLAIN = False
    c = console(20)
    report.render_diff(c, DiffResult(SNAP_PRE, "live", changes(), []))
    report.render_history(c, history(tmp_path))
    text = re.sub(r"\n", " ", text_of(c))  # the console's own wrapping, undone
    for needle in (OLD_VLLM, NEW_VLLM, OLD_TORCH, SNAP_PRE, RUN_ID):
        assert needle in text


@pytest.mark.parametrize("plain", [False, True], ids=["terminal", "plain"])
@pytest.mark.parametrize("width", [80, 100, 120])
def test_patches_report_versions_and_paths_whole(width: int, plain: bool) -> None:
    from rewheel.patches import Patch, PatchScan

    path = "vllm/model_executor/model_loader/weight_utils.py"
    patch = Patch(path, f"/opt/vllm-env/lib/python3.12/site-packages/{path}", "vllm", NEW_VLLM, "modified",
                  "0" * 64, 100, 0o644, added_lines=3, removed_lines=1, pristine_source="uv-cache")
    report.layout.PLAIN = plain
    c = console(width)
    report.render_patches(c, PatchScan("/opt/vllm-env", [patch]))
    text = text_of(c)
    for needle in (path, f"vllm {NEW_VLLM}", "+3 -1", "uv-cache"):
        assert needle in text, f"{needle!r} not whole at {width} columns:\n{text}"
    if not plain:
        assert max(len(line) for line in text.splitlines()) <= width


# --- the fitted console: wrapped between words on a terminal, never in a pipe ------------------

def _fitted(width: int, terminal: bool):
    import io

    buf = io.StringIO()
    return report.fitted_console(file=buf, width=width, force_terminal=terminal, color_system=None,
                                 highlight=False, emoji=False), buf


LINE = ("  stopping service command `/srv/envs/ml-env/bin/python -m vllm.entrypoints.cli.main serve "
        "moonshotai/Kimi-K2.5-NVFP4 --tensor-parallel-size 8` (pid 4242)")


@pytest.mark.parametrize("width", [40, 60, 80])
def test_a_terminal_gets_lines_wrapped_between_words_with_the_indent_kept(width: int) -> None:
    console, buf = _fitted(width, True)
    console.print(LINE, markup=False)
    console.print("  │ " + "uv says " * 20, markup=False, style="dim")
    lines = buf.getvalue().splitlines()
    assert all(len(line) <= width for line in lines), lines
    # Every word whole, in order: joining the lines' words gives the text's words.
    assert " ".join(" ".join(lines).split()).startswith(" ".join(LINE.split())), lines
    first = lines.index(next(line for line in lines if "│" in line))
    assert lines[0].startswith("  stopping") and all(line.startswith("    ") for line in lines[1:first])
    # A streamed tool's lines keep their gutter.
    assert all(line.startswith("  │ ") for line in lines[first:]), lines


def test_a_word_longer_than_the_terminal_is_never_cut() -> None:
    path = "/srv/" + "x" * 70 + "/pylock.toml"
    console, buf = _fitted(60, True)
    console.print(f"  prepared: locked in {path}, every wheel cached", markup=False)
    lines = buf.getvalue().splitlines()
    assert lines == ["  prepared: locked in", f"{path},", "    every wheel cached"], lines


@pytest.mark.parametrize("width", [40, 80, 200])
def test_a_pipe_gets_every_line_whole_whatever_the_width(width: int) -> None:
    console, buf = _fitted(width, False)
    console.print(LINE, markup=False)
    console.print(f"[bold]run[/] of {LINE}")
    assert buf.getvalue() == f"{LINE}\nrun of {LINE}\n"


def test_paths_on_a_terminal_are_short_and_whole_in_a_pipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    inside, home = tmp_path / "recipes" / "r.toml", tmp_path / "home" / "state" / "x.log"
    term, _ = _fitted(80, True)
    pipe, _ = _fitted(80, False)
    assert report.show_path(term, inside) == "recipes/r.toml"
    assert report.show_path(term, tmp_path / "runs" / "1" / "patches" / "a.patch",
                            (tmp_path / "runs" / "1", "the run's folder")) == "patches/a.patch in the run's folder"
    monkeypatch.chdir("/")
    assert report.show_path(term, home) == "~/state/x.log"
    assert report.shorten_paths(term, f"see {home}, http://h/x/y") == "see ~/state/x.log, http://h/x/y"
    assert report.show_path(pipe, home) == str(home) and report.shorten_paths(pipe, f"see {home}") == f"see {home}"
