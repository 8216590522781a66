"""`rewheel fleet-report`: hosts' run reports (the JSON `rewheel run --json` prints, in the
shapes docs/reference/json.md names) summed up — status, versions, downtime (the report's own
`downtime`, else its steps from stop through start), root causes grouped across hosts whose
environments live in different places — as a table, JSON and Markdown."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rewheel import fleet
import support_cli


def cause(env: str, message: str = "q_lora_rank 1536 must divide num_heads 7 on rank 4") -> dict[str, Any]:
    return {"type": "ValueError", "message": message, "rank": "Worker_TP4",
            "frame": {"file": f"{env}/lib/python3.12/site-packages/vllm/model_executor/models/deepseek_v2.py",
                      "line": 998, "function": "__init__"}, "log_line": 7}


def steps(*pairs: tuple[str, float, bool]) -> list[dict[str, Any]]:
    return [{"name": n, "seconds": s, "ok": ok} for n, s, ok in pairs]


UPGRADED_STEPS = steps(("preflight", 1.0, True), ("stop", 2.0, True), ("snapshot", 1.0, True),
                       ("reinstall", 10.0, True), ("diff", 1.0, True), ("smoke", 5.0, True),
                       ("start", 20.0, True), ("keep", 0.5, True))
# As a reverted run lists them: the revert's own stop and start come before the revert, whose
# time covers them.
REVERTED_STEPS = steps(("preflight", 1.0, True), ("stop", 2.0, True), ("snapshot", 1.0, True),
                       ("reinstall", 10.0, True), ("diff", 1.0, True), ("smoke", 5.0, False),
                       ("stop", 0.5, True), ("start", 15.0, True), ("revert", 18.0, True))


def upgraded(**extra: Any) -> dict[str, Any]:
    return {"status": "upgraded", "run_id": "r1", "before": {"vllm": "0.16.0rc2.dev313", "torch": "2.9.0"},
            "after": {"vllm": "0.16.0rc2.dev344", "torch": "2.9.0"}, "attempted": {}, "root_cause": None,
            "steps": UPGRADED_STEPS, "service_before": "active", "exit_code": 0, **extra}


def reverted(env: str, **extra: Any) -> dict[str, Any]:
    return {"status": "reverted", "run_id": "r2", "before": {"vllm": "0.16.0rc2.dev313"},
            "after": {"vllm": "0.16.0rc2.dev313"}, "attempted": {"vllm": "0.16.0rc2.dev344"},
            "root_cause": cause(env), "steps": REVERTED_STEPS, "service_before": "active",
            "failure": {"step": "smoke", "error": "SmokeFailed", "message": "smoke test exited 1"},
            "exit_code": 1, **extra}


def test_downtime_is_the_reports_own_when_it_has_one() -> None:
    doc = upgraded(downtime={"seconds": 12.5, "parts": {"stop": 2.0, "start": 10.5}})
    assert fleet.downtime(doc) == (12.5, "report")
    h = fleet.host_result("gpu-01", doc)
    assert (h.downtime_s, h.downtime_source) == (12.5, "report")
    assert fleet.downtime(upgraded(downtime=None)) == (None, "report")  # none measured: not guessed


def test_downtime_without_the_key_is_the_steps_from_stop_through_start_or_revert() -> None:
    assert fleet.downtime(upgraded()) == (39.0, "steps")  # stop .. start, not preflight nor keep
    # stop .. the failed smoke test, then the revert (its inner stop and start not counted twice)
    assert fleet.downtime(reverted("/env")) == (37.0, "steps")
    assert fleet.downtime(upgraded(service_before="inactive")) == (0.0, "steps")
    assert fleet.downtime(upgraded(steps=steps(("preflight", 1.0, True), ("keep", 0.1, True)))) == (None, None)
    h = fleet.host_result("gpu-01", upgraded())
    assert fleet.downtime_text(h) == "39.0s (from steps)"


def test_root_causes_group_across_hosts_and_the_worst_outcome_sets_the_exit_code(tmp_path: Path) -> None:
    docs = {"gpu-01": reverted("/srv/a/env"), "gpu-02": reverted("/root/ml-env"), "gpu-03": upgraded(),
            "gpu-04": reverted("/env", root_cause=cause("/env", "CUDA error: no kernel image"))}
    for name, doc in docs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    rep = fleet.fleet_report([str(tmp_path / f"{n}.json") for n in docs], expect=["gpu-01,gpu-05", "gpu-06"])
    assert [(h.host, h.status) for h in rep.hosts] == [
        ("gpu-01", "reverted"), ("gpu-02", "reverted"), ("gpu-03", "upgraded"), ("gpu-04", "reverted"),
        ("gpu-05", "not-reached"), ("gpu-06", "not-reached")]
    first, second = rep.causes
    assert (first.type, first.frame, first.hosts) == (
        "ValueError", "vllm/model_executor/models/deepseek_v2.py:998 in __init__", ["gpu-01", "gpu-02"])
    assert second.message == "CUDA error: no kernel image" and second.hosts == ["gpu-04"]
    assert rep.counts == {"reverted": 3, "not-reached": 2, "upgraded": 1}
    assert rep.exit_code == 1
    h1 = rep.hosts[0]
    assert [c.to_json() for c in h1.changes] == [{"name": "vllm", "old": "0.16.0rc2.dev313",
                                                  "new": "0.16.0rc2.dev344"}]
    assert h1.after == {"vllm": "0.16.0rc2.dev313"}  # put back
    md = fleet.markdown(rep)
    assert md.startswith("## ❌ rewheel fleet: 6 host(s): 3 reverted, 2 not-reached, 1 upgraded\n")
    assert "| gpu-03 | ✅ upgraded | vllm 0.16.0rc2.dev313 → 0.16.0rc2.dev344 | 39.0s (from steps) |  |" in md
    assert ("- **2 host(s)** (gpu-01, gpu-02): `ValueError: q_lora_rank 1536 must divide num_heads 7 on rank 4 "
            "at vllm/model_executor/models/deepseek_v2.py:998 in __init__`") in md
    failed = reverted("/env", status="failed", revert={"error": "environment does not match snapshot"})
    assert fleet.FleetReport([fleet.host_result("gpu-07", failed)], []).exit_code == 3


def test_dry_runs_and_refusals() -> None:
    plan = {"status": "planned", "before": {"vllm": "1"}, "after": {}, "steps": [],
            "plan": {"changes": [{"name": "vllm", "old": "1", "new": "2", "change": "upgrade"},
                                 {"name": "torch", "old": "2.9", "new": "2.9", "change": "reinstall"}]}}
    h = fleet.host_result("gpu-01", plan)
    assert h.status == "planned" and [c.name for c in h.changes] == ["vllm"] and h.downtime_s is None
    plan["plan"]["changes"] = plan["plan"]["changes"][1:]  # only same-version reinstalls: nothing to do
    assert fleet.host_result("gpu-01", plan).status == "unchanged"
    busy = {"error": "EnvBusy", "message": "another rewheel run holds /root/ml-env", "hint": None, "exit_code": 4}
    h = fleet.host_result("gpu-02", busy)
    assert (h.status, h.exit_code, fleet.cause_text(h)) == ("error", 4, "another rewheel run holds /root/ml-env (exit 4)")
    assert fleet.FleetReport([h], fleet.group_causes([h])).exit_code == 1


def rewheel(*args: str) -> subprocess.CompletedProcess[str]:
    return support_cli.rewheel(*args, stdin=subprocess.DEVNULL)


def test_the_command(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(reverted("/env")))
    (tmp_path / "b.json").write_text(json.dumps(upgraded()))
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier\n")
    cp = rewheel("fleet-report", f"gpu-01={tmp_path / 'a.json'}", f"gpu-02={tmp_path / 'b.json'}",
                 "--expect", "gpu-01,gpu-02,gpu-03", "--summary", str(summary), "--json")
    assert cp.returncode == 1, cp.stderr
    doc = json.loads(cp.stdout)
    assert [(h["host"], h["status"]) for h in doc["hosts"]] == [
        ("gpu-01", "reverted"), ("gpu-02", "upgraded"), ("gpu-03", "not-reached")]
    assert doc["root_causes"][0]["hosts"] == ["gpu-01"] and doc["exit_code"] == 1
    text = summary.read_text()
    assert text.startswith("earlier\n## ❌ rewheel fleet: 3 host(s)")  # appended, as CI summaries are
    md = rewheel("fleet-report", str(tmp_path / "b.json"), "--markdown")
    assert md.returncode == 0 and md.stdout.startswith("## ✅ rewheel fleet: 1 host(s): 1 upgraded")
    human = rewheel("--plain", "fleet-report", str(tmp_path / "a.json"))
    assert "a  reverted  vllm 0.16.0rc2.dev313 → 0.16.0rc2.dev344  downtime 37.0s (from steps)  ValueError" \
        in human.stdout


@pytest.mark.parametrize("content, says", [("{not json", "not JSON"), ('["a"]', "not a rewheel JSON document"),
                                           ('{"status": "qualified"}', "not a `rewheel run RECIPE --json` report")])
def test_what_is_not_a_run_report_is_refused_naming_the_file(tmp_path: Path, content: str, says: str) -> None:
    bad = tmp_path / "gpu-09.json"
    bad.write_text(content)
    cp = rewheel("fleet-report", str(bad), "--json")
    assert cp.returncode == 2
    msg = json.loads(cp.stdout)["message"]
    assert str(bad) in msg and says in msg


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_table_keeps_every_version_and_cause_whole(tmp_path: Path, width: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from rewheel import report

    monkeypatch.setattr(report.layout, "PLAIN", False)
    new = "0.16.0rc2.dev344+g5719a4e4e"
    doc = reverted("/root/ml-env", attempted={"vllm": new, "flashinfer-python": "0.6.4"},
                   before={"vllm": "0.16.0rc2.dev313", "flashinfer-python": "0.6.3"})
    rep = fleet.FleetReport([fleet.host_result("gpu-01", doc), fleet.HostResult("gpu-02", "not-reached")], [])
    rep.causes = fleet.group_causes(rep.hosts)
    console = Console(width=width, force_terminal=True, color_system=None, record=True)
    report.render_fleet(console, rep)
    text = console.export_text()
    # Each package's change on a line of its own, its versions whole, wide or narrow.
    for change, other in ((f"vllm 0.16.0rc2.dev313 → {new}", "flashinfer"), ("flashinfer-python 0.6.3 → 0.6.4", "vllm")):
        assert any(change in line and other not in line for line in text.splitlines()), text
    assert "1 host(s) (gpu-01): ValueError: q_lora_rank 1536 must divide num_heads 7 on rank 4 at " \
           "vllm/model_executor/models/deepseek_v2.py:998 in __init__" in text
    assert ("┏" in text) == (width >= 200)  # a table where it fits whole, else stacked
