"""A torn or garbage journal line never blocks an environment, and a full disk never tears one.

Real files throughout: a journal cut off mid-record (what a crash or a full disk leaves),
garbage in the middle of one, a journal that is a folder or a FIFO, and appends on a real
tmpfs filled to the last byte (root, as in CI). Then the real CLI: a run killed at a step
boundary whose journal was torn afterwards is still closed by `resume`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rewheel.errors import JournalDamaged, JournalWriteError, LinkInState
from rewheel.journal import RunJournal, interrupted_run, list_runs
from rewheel.records import Finish, Note, Started, Step
from rewheel.statuses import Finished, StepName
from support_env import make_venv
from support_run import make_host
import support_cli


def _journal(tmp: Path, lines: list[str]) -> Path:
    run = tmp / "runs" / "20260101-000000-abcd"
    run.mkdir(parents=True)
    (run / "journal.jsonl").write_text("".join(lines))
    return run


def _rec(event: str, t: float, **kw: object) -> str:
    return json.dumps({"event": event, "time": t, **kw}) + "\n"


def test_a_torn_last_line_is_skipped_and_the_next_record_gets_a_line_of_its_own(tmp_path: Path) -> None:
    run = _journal(tmp_path, [_rec("started", 1.0, kind="run"), _rec("step", 2.0, name="smoke"),
                              '{"event": "step", "time": 3.0, "na'])  # torn: no newline
    j = RunJournal.load(run)
    assert [r.event for r in j.records] == ["started", "step"]
    assert j.damaged and j.damaged[0][0] == 3
    assert interrupted_run(tmp_path) is not None
    j.append(Finish(status=Finished.REVERTED))
    again = RunJournal.load(run)
    # Closed: the record did not glue onto the torn line, and the damage is noted in the journal.
    assert again.finished and again.status == "reverted"
    note = again.last(Note)
    assert note is not None and note.damaged_lines == [3]
    assert interrupted_run(tmp_path) is None
    assert again.summary()["damaged_lines"] == [3]


def test_garbage_mid_file_does_not_hide_the_records_after_it(tmp_path: Path) -> None:
    run = _journal(tmp_path, [_rec("started", 1.0, kind="run"), "\x00\x00\x00\x00garbage{{{\n",
                              "[" * 100000 + "\n",  # deeper than the JSON parser recurses
                              '{"event": 7}\n', '{"event": "step", "time": "noon", "name": "x"}\n',
                              '{"event": "step", "time": 4.0}\n',
                              _rec("step", 5.0, name="keep"), _rec("finished", 6.0, status="upgraded")])
    j = RunJournal.load(run)
    assert [r.event for r in j.records] == ["started", "step", "finished"]
    assert [n for n, _ in j.damaged] == [2, 3, 4, 5, 6]
    assert j.finished and j.status == "upgraded"
    assert [r.id for r in list_runs(tmp_path)] == [run.name]


@pytest.mark.parametrize("kind", ["folder", "fifo", "symlink"])
def test_a_journal_that_is_not_a_regular_file_is_refused_not_read(tmp_path: Path, kind: str) -> None:
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    path = run / "journal.jsonl"
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # a read would hang
    else:
        (tmp_path / "elsewhere").write_text(_rec("started", 1.0, kind="run"))
        path.symlink_to(tmp_path / "elsewhere")
    if kind == "symlink":  # a link in rewheel's own folders: exit 3, naming it (rewheel.owned)
        with pytest.raises(LinkInState) as linked:
            RunJournal.load(run)
        assert linked.value.path == str(path) and linked.value.exit_code == 3
        return
    with pytest.raises(JournalDamaged) as err:
        RunJournal.load(run)
    assert str(path) in err.value.message and str(run) in (err.value.hint or "")


@pytest.fixture
def small_fs(tmp_path: Path):
    """A real tmpfs of 2 MiB (root, as in CI): small enough to fill in a moment."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)]).returncode != 0:
        pytest.fail("mounting a tmpfs needs root (as in CI)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def _fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (4096, 1):  # whole pages, then the last bytes
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    return filler


def test_an_append_on_a_full_disk_keeps_no_half_record_and_fails_loudly(small_fs: Path) -> None:
    run = small_fs / "runs" / "r1"
    run.mkdir(parents=True)
    j = RunJournal(run)
    j.append(Started(kind="run"))
    filler = _fill(small_fs)
    before = (run / "journal.jsonl").read_bytes()
    # A record bigger than what is left of the journal's last page: a short write, then ENOSPC.
    with pytest.raises(JournalWriteError) as err:
        j.append(Step(name=StepName.REINSTALL, reason="x" * 8000))
    assert "No space left" in err.value.message and str(run / "journal.jsonl") in err.value.message
    assert "resume" in (err.value.hint or "")
    assert (run / "journal.jsonl").read_bytes() == before  # nothing of it kept
    assert [r.event for r in j.records] == ["started"]

    filler.unlink()  # the disk freed: the journal goes on, every line a record
    j.append(Finish(status=Finished.FAILED))
    again = RunJournal.load(run)
    assert not again.damaged and [r.event for r in again.records] == ["started", "finished"]


def test_resume_closes_a_run_whose_journal_was_torn(tmp_path: Path) -> None:
    """A run killed at the smoke step, its journal then torn mid-record (as a full disk or a
    crash mid-write leaves it): every command still sees the interrupted run, `resume` undoes
    it byte-exact and closes it, and the next commands exit 0."""
    h = make_host(tmp_path, "2.0.0", "good")
    try:
        h.start_service()
        before = h.state()
        cp = h.rewheel("run", str(h.recipe), "--yes", "--quiet", env={"REWHEEL_FAULT_AT": "step:smoke"})
        assert cp.returncode == -9, cp.stderr
        run_id = json.loads(h.rewheel("history", str(h.recipe), "--json").stdout)["interrupted_run"]
        journals = list(Path(os.environ["REWHEEL_HOME"]).rglob(f"runs/{run_id}/journal.jsonl"))
        assert len(journals) == 1
        with open(journals[0], "ab") as f:
            f.write(b'{"event": "step", "time": 1.0, "name": "sta')  # torn

        again = h.rewheel("run", str(h.recipe), "--yes")
        assert again.returncode == 4 and "damaged line" in again.stderr, again.stderr
        res = h.rewheel("resume", str(h.recipe), "--yes", "--json")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["status"] in ("reverted", "aborted")
        assert h.state() == before
        assert h.served_version() == "1.0.0"
        hist2 = h.rewheel("history", str(h.recipe), "--json")
        assert hist2.returncode == 0, hist2.stderr
        runs = json.loads(hist2.stdout)["runs"]
        assert runs[0]["status"] != "interrupted" and runs[0]["damaged_lines"]
    finally:
        h.stop_service()
        h._index.stop()  # type: ignore[attr-defined]


def _leave_free(folder: Path, pages: int) -> Path:
    """Fill the filesystem of `folder`, then give back `pages` pages: what a command finds
    when the disk is all but full."""
    filler = _fill(folder)
    with open(filler, "r+b") as f:
        f.truncate(max(0, filler.stat().st_size - pages * 4096))
    return filler


def _pad_to(journal: Path, room: int) -> None:
    """Append a valid note record so that the journal ends `room` bytes before a page
    boundary of the filesystem: the next appends cross it (then the disk has no page left)."""
    size = journal.stat().st_size
    end = (size // 4096 + 1) * 4096
    while end - room - size < 120:
        end += 4096
    length = end - room - size
    rec = {"event": "note", "time": 1.0, "pad": ""}
    rec["pad"] = "x" * (length - len(json.dumps(rec)) - 1)
    with open(journal, "a") as f:
        f.write(json.dumps(rec) + "\n")
    assert journal.stat().st_size == end - room


@pytest.mark.parametrize("room", [0, 40, 200, 600, 1500])
def test_a_resume_on_a_full_disk_never_tears_its_journal(tmp_path: Path, small_fs: Path, room: int) -> None:
    """A rollback killed as its restore starts; its journal then ends `room` bytes before a
    page boundary of a real 2 MiB tmpfs, and the disk is full: `resume`'s appends fail
    (short write, then ENOSPC) at a different record for each `room`. `resume` exits 0 or 3
    with a sentence, never an internal error, and leaves no torn line; once the disk is freed,
    `resume` finishes the rollback and every command exits 0."""
    small = small_fs
    py = make_venv(tmp_path / "env")
    site = next((py.parent.parent / "lib").glob("python3*/site-packages"))
    env = {**os.environ, "REWHEEL_HOME": str(small / "home")}

    def cli(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return support_cli.rewheel(*args, "--python", str(py), stdin=subprocess.DEVNULL,
                                   env={**env, **extra}, timeout=120)

    snap = cli("snapshot", "--json")
    assert snap.returncode == 0, snap.stderr
    snap_id = json.loads(snap.stdout)["id"]
    (site / "added.py").write_text("X = 1\n")
    killed = cli("rollback", snap_id, "--yes", "--no-undo", REWHEEL_FAULT_AT="step:restore")
    assert killed.returncode == -9, killed.stderr
    run_id = json.loads(cli("history", "--json").stdout)["interrupted_run"]
    journal = next((small / "home").rglob(f"runs/{run_id}/journal.jsonl"))
    _pad_to(journal, room)

    filler = _leave_free(small, 0)
    res = cli("resume", "--yes", "--json")
    filler.unlink()
    assert res.returncode in (0, 3), (res.stdout, res.stderr)
    assert "internal error" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    if res.returncode == 3:
        assert "No space left" in json.loads(res.stdout)["message"]
    lines = journal.read_text().splitlines()
    assert all(json.loads(line)["event"] for line in lines)  # every line whole

    again = cli("resume", "--yes", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    hist = cli("history", "--json")
    assert hist.returncode == 0, hist.stdout + hist.stderr
    assert not any("damaged_lines" in r for r in json.loads(hist.stdout)["runs"])
    assert not (site / "added.py").exists()  # the rollback was finished
