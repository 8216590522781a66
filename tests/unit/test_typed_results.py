"""Reports hold the real result objects until the edge: a root cause read back from JSON (a
bisection's journal) is the one that was written, the small records a run report holds make
the JSON they always made, and the human rendering reads attributes.

The root causes are those `diagnose` finds in the log corpus (tests/logs) and, where the
checkout has them, in real logs from public bug reports (../shared/real-logs)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from rewheel import diagnose, report
from rewheel.diagnose import RootCause
from rewheel.errors import InstallError
from rewheel.commands.results import DiagnosisRecord, Failure, SmokeReport
from rewheel.service import HealthResult
from rewheel.smoke import SmokeResult

LOGS = Path(__file__).parents[1] / "logs"
REAL = Path(__file__).parents[2] / ".." / "shared" / "real-logs"


def _roots() -> list[tuple[str, RootCause]]:
    found = []
    for log in sorted(LOGS.glob("*.log")) + (sorted(REAL.glob("*.log")) if REAL.is_dir() else []):
        rc = diagnose.analyse_file(log, package="vllm").root
        if rc is not None:
            found.append((log.name, rc))
    return found


ROOTS = _roots()


def test_the_corpus_has_root_causes_with_frames_and_secondaries() -> None:
    # The round trip below would prove little on bare root causes.
    assert len(ROOTS) >= 10
    assert any(rc.frame is not None and rc.frame.source for _, rc in ROOTS)
    assert any(rc.secondary for _, rc in ROOTS)
    assert {rc.kind for _, rc in ROOTS} == {"traceback", "error-line"}


@pytest.mark.parametrize("name,rc", ROOTS, ids=[n for n, _ in ROOTS])
def test_root_cause_round_trips_through_json(name: str, rc: RootCause) -> None:
    doc = rc.to_json()
    back = RootCause.from_json(json.loads(json.dumps(doc)))  # as a journal stores and reads it
    assert back.to_json() == doc
    assert back == rc


def test_root_cause_from_an_older_record_takes_defaults() -> None:
    rc = RootCause.from_json({"type": "RuntimeError", "message": "boom",
                              "frame": {"file": "/x/core.py", "line": 3}})
    assert (rc.rank, rc.kind, rc.count, rc.restarts, rc.secondary) == (None, "traceback", 1, 1, [])
    assert rc.frame is not None and (rc.frame.file, rc.frame.line, rc.frame.function) == ("/x/core.py", 3, None)


def test_failure_json_has_hint_and_exit_code_only_for_rewheel_errors() -> None:
    ours = Failure.of("reinstall", InstallError("uv failed", hint="see the log"))
    assert ours.to_json() == {"step": "reinstall", "error": "InstallError", "message": "uv failed",
                              "hint": "see the log", "exit_code": InstallError.exit_code}
    other = Failure.of("diff", KeyError("x"))
    assert other.to_json() == {"step": "diff", "error": "KeyError", "message": "'x'"}
    assert DiagnosisRecord(error="unreadable").to_json() == {"error": "unreadable"}
    assert DiagnosisRecord("smoke.log", "RuntimeError: boom").to_json() == {"source": "smoke.log",
                                                                          "summary": "RuntimeError: boom"}


def test_health_json_says_restarted_only_when_known() -> None:
    h = HealthResult(True, 1.23456, "ok")
    assert "restarted" not in h.to_json()
    h.restarted = False
    assert h.to_json()["restarted"] is False and h.to_json()["seconds"] == 1.235


def test_smoke_report_is_json_only_at_the_edge_and_renders_from_attributes() -> None:
    name, rc = next((n, r) for n, r in ROOTS if r.frame is not None and r.secondary)
    smoke = SmokeResult(ok=False, returncode=1, timed_out=False, seconds=2.5, log_path="/tmp/smoke.log")
    rep = SmokeReport(ok=False, smoke=smoke, health=HealthResult(False, 3.0, "no answer"), root_cause=rc)
    doc = rep.to_json()
    assert doc["smoke"] == smoke.to_json() and doc["root_cause"] == rc.to_json()
    assert doc["health"] == {"ok": False, "seconds": 3.0, "detail": "no answer", "health_url": None,
                             "probe_url": None, "n_restarts": 0}
    json.dumps(doc)
    out = io.StringIO()
    report.render_smoke(Console(file=out, width=200, color_system=None), rep)
    text = out.getvalue()
    assert "smoke test failed (exit 1) in 2.5s" in text and "health: FAILED — no answer" in text
    assert rc.frame is not None and f":{rc.frame.line} in " in text, name
    assert f"secondary: {rc.secondary[0].type}" in text
