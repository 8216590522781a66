"""Hostile input to `rewheel fleet-report`, swept (Hypothesis): it reads one JSON document per host,
written by other processes on other machines (a run's report, an error document, the collection's
`unreachable` document, or a file that is none of them). Any JSON value gives a host result with a
known status, or a refusal (exit 2) naming the file — never another exception — and whatever it
gives renders (table text, Markdown, JSON). (The fleet module's own record on the host, swept the
same way: tests/test_fleet_detached.py.)"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from support_json import JSON

from rewheel import fleet
from rewheel.errors import UsageError

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
