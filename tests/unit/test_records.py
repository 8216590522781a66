"""The journal's record types (`rewheel.records`): each writes the line rewheel has always
written, reads back equal, and reads the lines earlier rewheels wrote; what is not a record
is refused, what a newer rewheel added is kept."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from rewheel import records
from rewheel.journal import RunJournal
from rewheel.records import (Candidates, ChildEnded, ChildStarted, ChildStarting, FailedSnapshot, Finish, Healthy,
                             Installed, Note, Record, SnapshotTaken, Started, Step, BuildVerdict, Unrecognised)
from rewheel.statuses import BisectStatus, Event, Finished, RunStatus, StepName

EXAMPLES: list[Record] = [
    Started(kind="run", recipe="/etc/rewheel/vllm.toml", before={"vllm": "0.31.0"}, lock="/x/pylock.toml",
            plan={"packages": ["vllm"]}, staged=True, time=1.5),
    Started(kind="rollback", snapshot_id="20261205-1", force=False, time=2.0),
    Started(kind="bisect", recipe="r.toml", package="vllm", good="0.1", bad="0.2", time=2.5),
    Step(name=StepName.SNAPSHOT, served=True, time=3.0),
    Step(name=StepName.REWARM, packages=["six"], time=3.1),
    Step(name=StepName.UNSHARE, install_ns=1_770_000_000_123_456_789, time=3.2),
    Step(name=StepName.TEST, version="0.1.1", commit="abc", index=None, time=3.3),
    Note(service_was_active=True, service_judged_by="systemd", time=4.0),
    Note(damaged_lines=[3, 4], damaged_text=["{\"ev"], time=4.1),
    SnapshotTaken(snapshot_id="s1", time=5.0),
    FailedSnapshot(failed_snapshot_id="s2", time=5.1),
    Installed(versions={"vllm": "0.32.0"}, install_ns=7, time=6.0),
    Healthy(detail="200 OK", time=7.0),
    Finish(status=Finished.REVERTED, reason="smoke failed", before={"a": "1"}, after={"a": "1"},
           downtime={"seconds": 1.25}, root_cause={"type": "RuntimeError"}, time=8.0),
    Finish(status=BisectStatus.FOUND, first_bad={"version": "0.2"}, last_good={"version": "0.1"}, time=8.1),
    ChildStarting(name="uv", time=9.0),
    ChildStarted(pid=10, pgid=10, start=12345, name="uv", time=9.1),
    ChildEnded(pid=10, pgid=10, name="uv", time=9.2),
    Candidates(mode="versions", source=None, builds=[{"version": "0.1", "commit": None}], time=10.0),
    BuildVerdict(verdict="bad", version="0.2", reason="exit 1", seconds=1.5, project_urls={"Source": "u"}, time=11.0),
]


@pytest.mark.parametrize("rec", EXAMPLES, ids=lambda r: type(r).__name__)
def test_every_record_reads_back_equal_through_its_json_line(rec: Record) -> None:
    line = json.dumps(rec.to_json())
    back = records.from_json(json.loads(line))
    assert back == rec and type(back) is type(rec)


def test_the_line_has_the_shape_earlier_rewheels_wrote() -> None:
    """Enum members as their strings, None left out, False kept (a rollback's `force`)."""
    assert Step(name=StepName.SNAPSHOT_CHECK, snapshot_id="s1", time=1.0).to_json() == {
        "event": "step", "time": 1.0, "name": "snapshot-check", "snapshot_id": "s1"}
    assert Started(kind="rollback", snapshot_id="s", force=False, time=2.0).to_json() == {
        "event": "started", "time": 2.0, "kind": "rollback", "snapshot_id": "s", "force": False}
    assert json.dumps(Finish(status=Finished.of(RunStatus.UPGRADED)).to_json()) == (
        '{"event": "finished", "time": 0.0, "status": "upgraded"}')


def test_every_event_has_one_record_type() -> None:
    assert {str(t.EVENT) for t in records._TYPES.values()} == {str(e) for e in Event}
    assert len(records._TYPES) == len(Event)


@pytest.mark.parametrize("line, want", [
    # As rewheel 0.x wrote them (keyword arguments, some None written out).
    ('{"event": "note", "time": 1, "service_was_active": true, "service_judged_by": "systemd"}',
     Note(service_was_active=True, service_judged_by="systemd", time=1.0)),
    ('{"event": "finished", "time": 2.5, "status": "prepared", "prepared": "/p/pylock.toml", "downtime": null}',
     Finish(status=Finished.PREPARED, prepared="/p/pylock.toml", time=2.5)),
    ('{"event": "verdict", "time": 3, "version": "0.2", "commit": null, "index": null, "verdict": "skip", '
     '"reason": "no wheel", "root_cause": null, "frames": [], "log": null, "seconds": 0, "project_urls": {}}',
     BuildVerdict(verdict="skip", version="0.2", reason="no wheel", time=3.0)),
])
def test_lines_earlier_rewheels_wrote_read_as_records(line: str, want: Record) -> None:
    assert records.from_json(json.loads(line)) == want


@pytest.mark.parametrize("doc", [
    [], "step", {"time": 1}, {"event": 7, "time": 1}, {"event": "step", "time": "noon", "name": "x"},
    {"event": "step", "time": True, "name": "smoke"},
    {"event": "step", "time": 1},                        # a step without its name
    {"event": "step", "time": 1, "name": "dance"},       # a step this rewheel never takes
    {"event": "finished", "time": 1},                    # a finish without a status
    {"event": "finished", "time": 1, "status": "partly"},
    {"event": "snapshot", "time": 1, "snapshot_id": 5},
    {"event": "verdict", "time": 1},
], ids=repr)
def test_what_is_not_a_record_is_refused(doc: object) -> None:
    assert records.from_json(doc) is None


def test_a_wrong_typed_field_keeps_its_default_and_its_value_is_kept() -> None:
    doc = {"event": "child", "time": 1, "pid": True, "pgid": "7", "name": "uv", "note": "from a newer rewheel"}
    rec = records.from_json(doc)
    assert isinstance(rec, ChildStarted)
    assert rec.pid is None and rec.pgid is None and rec.name == "uv"  # a bool is not a pid
    assert rec.extra == {"pid": True, "pgid": "7", "note": "from a newer rewheel"}
    assert rec.to_json() == {"event": "child", "time": 1.0, "name": "uv", "pid": True, "pgid": "7",
                             "note": "from a newer rewheel"}


def test_an_unknown_event_is_kept_as_read_and_acted_on_by_nothing(tmp_path: Path) -> None:
    doc = {"event": "teleported", "time": 4, "where": "mars"}
    rec = records.from_json(doc)
    assert isinstance(rec, Unrecognised) and rec.to_json() == doc and rec.time == 4.0
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "journal.jsonl").write_text(
        "".join(json.dumps(d) + "\n" for d in ({"event": "started", "time": 1, "kind": "run"}, doc,
                                                {"event": "finished", "time": 5, "status": "upgraded"})))
    j = RunJournal.load(run)
    assert not j.damaged and j.finished and j.status == "upgraded" and j.kind == "run"
    assert [r.event for r in j.records] == ["started", "teleported", "finished"]


def test_the_journal_writes_typed_records_and_answers_by_type(tmp_path: Path) -> None:
    j = RunJournal.create(tmp_path, Started(kind="run", recipe="r.toml", before={"a": "1"}))
    j.append(Note(service_was_active=False, service_judged_by="pid file"))
    j.append(SnapshotTaken(snapshot_id="s1"))
    j.append(Step(name=StepName.REINSTALL))
    j.append(Installed(versions={"a": "2"}))
    j.append(Finish(status=Finished.REVERTED, before={"a": "1"}, after={"a": "1"}))
    again = RunJournal.load(j.dir)
    assert [type(r) for r in again.records] == [Started, Note, SnapshotTaken, Step, Installed, Finish]
    assert all(r.time > 0 for r in again.records)  # stamped when written
    assert again.stepped(StepName.REINSTALL) and not again.stepped(StepName.KEEP)
    assert again.snapshot_id == "s1" and again.last_step == "reinstall" and again.status == "reverted"
    assert again.summary()["attempted"] == {"a": "2"} and again.summary()["recipe"] == "r.toml"
    assert [n.service_judged_by for n in again.all(Note)] == ["pid file"]


def test_the_note_record_names_every_fact_the_commands_note() -> None:
    """A note's facts are its fields: a misspelt one is a type error where it is written."""
    names = {f.name for f in fields(Note)} - {"time", "extra"}
    assert {"service_was_active", "undo_snapshot_error", "restart_after_abort_failed",
            "unchanged_but_restored", "damaged_lines"} <= names
    with pytest.raises(TypeError):
        Note(service_was_activ=True)  # type: ignore[call-arg]


def test_a_planned_run_has_no_journal_status() -> None:
    assert [Finished.of(s) for s in RunStatus if s != RunStatus.PLANNED] == [
        Finished(s.value) for s in RunStatus if s != RunStatus.PLANNED]
    with pytest.raises(ValueError):
        Finished.of(RunStatus.PLANNED)


def test_a_runs_snapshot_is_its_last_pre_upgrade_snapshot(tmp_path: Path) -> None:
    """A staged run takes its pre-upgrade snapshot again (after the rewarm, or in the window when
    the environment changed) and deletes the first: the journal names the one that exists."""
    from rewheel.journal import RunJournal
    from rewheel.records import SnapshotTaken, Step
    from rewheel.statuses import StepName

    j = RunJournal(tmp_path / "r1", [Started(kind="run", recipe="r.toml", time=1.0),
                                     SnapshotTaken(snapshot_id="first", time=2.0),
                                     Step(name=StepName.SNAPSHOT_CHECK, snapshot_id="first", time=3.0),
                                     SnapshotTaken(snapshot_id="again", time=4.0)])
    assert j.snapshot_id == "again"
    roll = RunJournal(tmp_path / "r2", [Started(kind="rollback", snapshot_id="target", time=1.0),
                                        Step(name=StepName.SNAPSHOT_CHECK, snapshot_id="undo", time=2.0)])
    assert roll.snapshot_id == "target"
