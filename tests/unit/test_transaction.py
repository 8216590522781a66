"""The restore transaction's service step (`Transaction.service_back`), the branch revert,
rollback and resume share: which of start, health-check, stop-then-start or leave-stopped
it takes, what it journals, the root cause of a start that failed, and that what the
restore moved out always goes to the trash. In-memory fakes; the end-to-end suites run the
real thing."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rewheel.commands import transaction as txn_mod
from rewheel.commands.results import DiagnosisRecord
from rewheel.commands.transaction import Transaction
from rewheel.errors import ServiceError
from rewheel.records import Note, Record
from rewheel.snapshot import RestoreResult


class FakeJournal:
    def __init__(self) -> None:
        self.records: list[Record] = []

    def append(self, rec: Record) -> None:
        self.records.append(rec)


class FakeService:
    def __init__(self, *, start_fails: bool = False) -> None:
        self.calls: list[str] = []
        self.start_fails = start_fails

    def stop(self) -> None:
        self.calls.append("stop")

    def start_and_verify(self) -> str:
        self.calls.append("start")
        if self.start_fails:
            raise ServiceError("did not answer healthy in 60 s")
        return "healthy after start"

    def verify_running(self, reason: str) -> str:
        self.calls.append("check")
        return "healthy, not restarted"


def _result(tmp_path: Path, *, written: int = 0) -> tuple[RestoreResult, Path]:
    """A restore result; one that changed files moved a folder out (a failed build's new one)."""
    moved = tmp_path / "moved-out"
    moved.mkdir()
    (moved / "new_module.py").write_text("x = 1\n")
    return RestoreResult("snap1", written=written, deleted=0, chmodded=0, unchanged=10, verified=10,
                         seconds=0.1, displaced=[str(moved)] if written else []), moved


def _txn(tmp_path: Path, svc: FakeService | None) -> tuple[Transaction, FakeJournal]:
    j = FakeJournal()
    store = SimpleNamespace(home=tmp_path / "home", env_dir=tmp_path / "home" / "envs" / "e")
    t: Any = SimpleNamespace(store=store, recipe=SimpleNamespace(cleanup_paths=()))
    (tmp_path / "home").mkdir()
    snap: Any = SimpleNamespace(id="snap1")
    return Transaction(t, j, snap, svc, say=lambda m: None, progress=None, package=lambda: "toypkg"), j  # type: ignore[arg-type]


@pytest.mark.parametrize("was_up, up_now, stopped, written, calls, health", [
    (True, True, True, 5, ["start"], "healthy after start"),  # stopped for the restore: started
    (True, True, False, 0, ["check"], "healthy, not restarted"),  # no byte changed, still up: checked
    (True, False, False, 0, ["start"], "healthy after start"),  # up before an earlier command left it down
    (True, True, False, 3, ["stop", "start"], "healthy after start"),  # judged unchanged, yet restored
    (False, False, True, 5, [], None),  # not running before: left stopped
])
def test_the_service_after_a_restore(tmp_path: Path, was_up: bool, up_now: bool, stopped: bool, written: int,
                                     calls: list[str], health: str | None) -> None:
    svc = FakeService()
    txn, j = _txn(tmp_path, svc)
    res, moved = _result(tmp_path, written=written)
    back = txn.service_back(res, was_up=was_up, up_now=up_now, stopped=stopped)
    assert svc.calls == calls
    assert back.health == health and back.left_stopped is (not was_up) and back.error is None
    assert (back.stopped_at is not None) is (calls[:1] == ["stop"])
    assert [r for r in j.records if isinstance(r, Note) and r.unchanged_but_restored] == (
        [Note(unchanged_but_restored=True)] if calls[:1] == ["stop"] else [])
    assert moved.exists() is (written == 0)  # into the store's trash, whatever happened


def test_a_start_that_fails_is_diagnosed_and_returned_not_raised(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cause: Any = SimpleNamespace(type="RuntimeError", message="CUDA error: out of memory", rank=None)
    seen: list[Any] = []

    def root_cause(svc: Any, package: str | None) -> tuple[Any, DiagnosisRecord]:
        seen.append((svc, package))
        return cause, DiagnosisRecord("journalctl -u vllm", "RuntimeError: CUDA error: out of memory")

    monkeypatch.setattr(txn_mod, "service_root_cause", root_cause)
    svc = FakeService(start_fails=True)
    txn, _j = _txn(tmp_path, svc)
    res, moved = _result(tmp_path, written=2)
    back = txn.service_back(res, was_up=True, up_now=True, stopped=True)
    assert isinstance(back.error, ServiceError) and back.health is None
    assert back.root_cause is cause and back.diagnosis is not None and seen == [(svc, "toypkg")]
    assert not moved.exists() and res.displaced == []


def test_without_a_service_only_the_trash_is_taken_out(tmp_path: Path) -> None:
    txn, j = _txn(tmp_path, None)
    res, moved = _result(tmp_path, written=4)
    back = txn.service_back(res, was_up=True, up_now=True, stopped=False)
    assert back == txn_mod.ServiceBack() and j.records == []
    assert not moved.exists() and res.displaced == []
