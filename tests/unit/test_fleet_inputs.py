"""Hostile input to the fleet's readers, swept (Hypothesis): what they read is written by other
processes and other machines, and may be anything.

- `rewheel fleet-report` reads one JSON document per host (a run's report, an error document, the
  collection's `unreachable` document, or a file that is none of them): any JSON value gives a host
  result with a known status, or a refusal (exit 2) — never another exception — and whatever it
  gives renders (table text, Markdown, JSON).
- The fleet module's record of a detached run, on the host (`module_utils/detached.py`): any bytes
  in that file are a record (a JSON object) or nothing, and whatever it holds, the questions the
  module asks of it (is its process alive, when did it start) answer without raising."""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rewheel import fleet
from rewheel.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "rewheel_fleet_detached", ROOT / "ansible" / "rewheel" / "fleet" / "plugins" / "module_utils" / "detached.py")
assert _spec is not None and _spec.loader is not None
detached = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(detached)

SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
JSON = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                                         max_size=4), max_leaves=10)
# The keys the readers look at, with any value; the statuses they know, more often than chance would.
REPORT_KEYS = ("status", "error", "unreachable", "message", "hint", "exit_code", "run_id", "before", "after",
               "attempted", "plan", "root_cause", "failure", "revert", "downtime", "steps", "service_before")
STATUS = st.sampled_from(["upgraded", "reinstalled", "unchanged", "reverted", "failed", "planned", "rejected",
                          "qualified"]) | JSON
DOCS = (JSON | st.dictionaries(st.sampled_from(REPORT_KEYS), JSON, max_size=10)
        | st.builds(lambda status, rest: {**rest, "status": status}, STATUS,
                    st.dictionaries(st.sampled_from(REPORT_KEYS), JSON, max_size=10))
        | st.builds(lambda rest: {**rest, "unreachable": True}, st.dictionaries(st.sampled_from(REPORT_KEYS), JSON,
                                                                                  max_size=4)))


@settings(max_examples=200, deadline=None)
@given(DOCS)
def test_any_document_is_a_host_result_or_a_refusal(doc: object) -> None:
    try:
        h = fleet.host_result("gpu-01", doc, "gpu-01.json")
    except UsageError as exc:
        assert "gpu-01.json" in exc.message
        return
    assert h.status in fleet.STATUSES
    rep = fleet.FleetReport([h, fleet.HostResult("gpu-02", "not-reached")], [])
    rep.causes = fleet.group_causes(rep.hosts)
    assert rep.exit_code in (0, 1, 3)
    json.dumps(rep.to_json())
    assert fleet.markdown(rep).startswith("## ")
    fleet.cause_text(h), fleet.versions_text(h), fleet.downtime_text(h)


FOLDER = tempfile.TemporaryDirectory(prefix="rewheel-fleet-records-")  # (removed at exit)
CONTENT = st.binary(max_size=300) | JSON.map(lambda v: json.dumps(v).encode()) | st.builds(
    lambda rec: json.dumps(rec).encode(),
    st.dictionaries(st.sampled_from(["pid", "start_ticks", "boot_id", "started", "reported", "lock_sha256",
                                     "stdout", "stderr", "argv"]), JSON, max_size=9))


@settings(max_examples=200, deadline=None)
@given(CONTENT)
def test_any_record_file_is_a_record_or_nothing(content: bytes) -> None:
    runs = detached.DetachedRuns(FOLDER.name, str(Path(FOLDER.name) / "toy.toml"))
    Path(runs.path).write_bytes(content)
    record = runs.unreported()
    assert record is None or isinstance(record, dict)
    if record is not None:
        assert detached.alive(record) in (True, False)
        assert isinstance(detached.started_at(record), float)
        assert runs.answer(record) is None or isinstance(runs.answer(record), dict)
        assert isinstance(runs.stderr_tail(record), str)
