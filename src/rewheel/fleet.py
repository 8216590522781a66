"""`rewheel fleet-report`: one summary of an upgrade rolled out over many hosts.

Owns reading the JSON documents a rollout collected (one per host: what `rewheel run --json`
printed there, or the error document of a command that refused), each host's outcome
(status, the versions before and after, the downtime, the root cause), the root causes
grouped across hosts, and the Markdown for a CI job summary. It knows nothing of Ansible:
the collection under `ansible/` (docs/fleet.md) writes the documents and calls it.

Downtime: a report's `downtime.seconds` when the report has the key (null: none measured);
reports without the key get the sum of their steps from the first `stop` through the last
`start`, or through `revert` when the run was reverted (the revert's own time covers its
stop, restore and start) — `downtime_source` says which.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewheel.diagnose import RootCause, first_line
from rewheel.errors import EXIT_OK, EXIT_REVERTED, EXIT_UNRESTORED, UsageError

# A host's outcome, worst first: the order of the summary's counts.
STATUSES = ("failed", "error", "reverted", "rejected", "not-reached", "upgraded", "planned", "unchanged")
_RUN_STATUSES = {"upgraded", "reinstalled", "unchanged", "reverted", "failed", "planned", "rejected"}


@dataclass
class VersionChange:
    """One distribution a host changed (or would, or tried to): old and new versions."""

    name: str
    old: str | None
    new: str | None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "old": self.old, "new": self.new}


@dataclass
class HostResult:
    """One host's outcome, read from its report. `changes`: what the run installed (for a
    reverted run, what it tried, now undone; for a planned one, what it would install)."""

    host: str
    status: str
    source: str | None = None  # the file it was read from
    run_id: str | None = None
    before: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)
    changes: list[VersionChange] = field(default_factory=list)
    downtime_s: float | None = None
    downtime_source: str | None = None  # "report" | "steps" | None
    root_cause: RootCause | None = None
    message: str | None = None
    exit_code: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "status": self.status, "source": self.source, "run_id": self.run_id,
                "before": self.before, "after": self.after, "changes": [c.to_json() for c in self.changes],
                "downtime_s": self.downtime_s, "downtime_source": self.downtime_source,
                "root_cause": self.root_cause.to_json() if self.root_cause else None,
                "message": self.message, "exit_code": self.exit_code}


@dataclass
class CauseGroup:
    """One root cause and the hosts it stopped: grouped by exception type, the first line of
    its message and its deepest frame (path relative to site-packages, so that hosts with
    their environments in different places still group)."""

    type: str | None
    message: str
    frame: str | None
    hosts: list[str] = field(default_factory=list)

    def text(self) -> str:
        head = f"{self.type}: {self.message}" if self.type else self.message
        return head + (f" at {self.frame}" if self.frame else "")

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "frame": self.frame, "hosts": self.hosts}


@dataclass
class FleetReport:
    hosts: list[HostResult]
    causes: list[CauseGroup]

    @property
    def counts(self) -> dict[str, int]:
        found = {s: sum(1 for h in self.hosts if h.status == s) for s in STATUSES}
        return {s: n for s, n in found.items() if n}

    @property
    def exit_code(self) -> int:
        """3 when a host could not be restored (a person must act there), 1 when one was
        reverted, rejected or refused, else 0."""
        statuses = {h.status for h in self.hosts}
        if "failed" in statuses:
            return EXIT_UNRESTORED
        if statuses & {"reverted", "rejected", "error"}:
            return EXIT_REVERTED
        return EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {"hosts": [h.to_json() for h in self.hosts], "counts": self.counts,
                "root_causes": [c.to_json() for c in self.causes], "exit_code": self.exit_code}


# -- reading -------------------------------------------------------------------------------
def downtime(doc: dict[str, Any]) -> tuple[float | None, str | None]:
    """(seconds, source) of a run report: its own `downtime` when it has the key, else the
    steps from the first `stop` through the last `start` (or through `revert`)."""
    if "downtime" in doc:
        dt = doc["downtime"]
        if isinstance(dt, dict) and isinstance(dt.get("seconds"), (int, float)):
            return float(dt["seconds"]), "report"
        return None, "report"
    steps = [s for s in doc.get("steps") or [] if isinstance(s, dict)]
    names = [s.get("name") for s in steps]
    if "stop" not in names:
        return None, None  # nothing was stopped: no service, or the run ended before
    if doc.get("service_before") == "inactive":
        return 0.0, "steps"  # it was down before the run: the run took nothing away
    first = names.index("stop")
    if "revert" in names:
        # The revert appends its own stop and start before itself; its time covers them.
        failed = next((i for i in range(first, len(steps)) if steps[i].get("ok") is False), None)
        end = failed if failed is not None else names.index("revert") - 1
        span = steps[first:end + 1] + [steps[len(names) - 1 - names[::-1].index("revert")]]
    elif "start" in names:
        last = len(names) - 1 - names[::-1].index("start")
        span = steps[first:last + 1]
    else:
        return None, "steps"
    return round(sum(float(s.get("seconds") or 0.0) for s in span), 3), "steps"


def _changes(old: dict[str, str], new: dict[str, str]) -> list[VersionChange]:
    names = sorted(set(old) | set(new))
    return [VersionChange(n, old.get(n), new.get(n)) for n in names if old.get(n) != new.get(n)]


def host_result(host: str, doc: Any, source: str | None = None) -> HostResult:
    """One host's outcome from the JSON document its command printed."""
    if not isinstance(doc, dict):
        raise UsageError(f"{source or host}: not a rewheel JSON document (a JSON object)",
                         hint="give the files `rewheel run RECIPE --json` wrote, one per host")
    if "error" in doc and "status" not in doc:
        # A command that refused or broke before a run began (exit 2, 4, 5): nothing changed.
        return HostResult(host, "error", source, message=str(doc.get("message") or doc["error"]),
                          exit_code=doc.get("exit_code"))
    status = doc.get("status")
    if status not in _RUN_STATUSES:
        raise UsageError(f"{source or host}: not a `rewheel run RECIPE --json` report (status {status!r})",
                         hint="give the files `rewheel run RECIPE --json` wrote, one per host")
    before = dict(doc.get("before") or {})
    after = dict(doc.get("after") or {})
    rc = doc.get("root_cause")
    res = HostResult(host, status, source, run_id=doc.get("run_id"), before=before, after=after,
                     root_cause=RootCause.from_json(rc) if isinstance(rc, dict) else None,
                     exit_code=doc.get("exit_code"))
    if status == "planned":
        plan = (doc.get("plan") or {}).get("changes") or []
        res.changes = [VersionChange(c["name"], c.get("old"), c.get("new")) for c in plan
                       if isinstance(c, dict) and c.get("old") != c.get("new")]
        if not res.changes:
            res.status = "unchanged"  # the dry run found the host already there
        res.after = dict(before)
        return res
    kept = status in ("upgraded", "reinstalled", "unchanged")
    if status in ("reinstalled", "unchanged"):
        res.status = "unchanged"  # kept, and no version changed
    res.changes = _changes(before, dict(doc.get("attempted") or {}) if not kept else after)
    res.downtime_s, res.downtime_source = downtime(doc)
    failure = doc.get("failure")
    if isinstance(failure, dict) and not kept:
        res.message = failure.get("message")
    revert = doc.get("revert")
    if status == "failed" and isinstance(revert, dict) and revert.get("error"):
        res.message = f"{res.message}; the revert failed: {revert['error']}" if res.message else revert["error"]
    return res


def group_causes(hosts: list[HostResult]) -> list[CauseGroup]:
    """Root causes across hosts, the most widespread first."""
    groups: dict[tuple[str | None, str, str | None], CauseGroup] = {}
    for h in hosts:
        rc = h.root_cause
        if rc is None:
            if h.status in ("reverted", "failed", "error") and h.message:
                key: tuple[str | None, str, str | None] = (None, first_line(h.message), None)
            else:
                continue
        else:
            key = (rc.type, first_line(rc.message), rc.frame.short() if rc.frame else None)
        groups.setdefault(key, CauseGroup(*key)).hosts.append(h.host)
    return sorted(groups.values(), key=lambda g: -len(g.hosts))


def _host_and_path(arg: str) -> tuple[str, Path]:
    """`HOST=FILE`, or `FILE` named after its host (`gpu-01.json`)."""
    host, sep, path = arg.partition("=")
    if sep and host and "/" not in host:
        return host, Path(path)
    p = Path(arg)
    return p.name.removesuffix(".json"), p


def fleet_report(reports: list[str], *, expect: list[str] | None = None) -> FleetReport:
    """The fleet's summary from one report file per host (`HOST=FILE` or `HOST.json`); hosts
    in `expect` without a report were not reached (the rollout stopped before them)."""
    hosts: list[HostResult] = []
    seen: set[str] = set()
    for arg in reports:
        host, path = _host_and_path(arg)
        if host in seen:
            raise UsageError(f"{path}: a second report for host {host!r}", hint="give one report per host")
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"{path}: not JSON: {exc}",
                             hint="give the files `rewheel run RECIPE --json` wrote, one per host") from None
        hosts.append(host_result(host, doc, str(path)))
        seen.add(host)
    for name in expect or []:
        for host in (h.strip() for h in name.split(",")):
            if host and host not in seen:
                hosts.append(HostResult(host, "not-reached"))
                seen.add(host)
    if not hosts:
        raise UsageError("no reports given", hint="rewheel fleet-report reports/*.json")
    return FleetReport(hosts, group_causes(hosts))


# -- Markdown ------------------------------------------------------------------------------
_ICON = {"upgraded": "✅", "unchanged": "➖", "planned": "📝", "reverted": "↩️", "rejected": "↩️",
         "failed": "🛑", "error": "⚠️", "not-reached": "⏸️"}


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(text: Any, *, in_table: bool = False) -> str:
    """`text` as one Markdown code span, whatever backticks it holds: fenced by one backtick
    more than its longest run of them, padded with a space where it starts or ends with one
    (CommonMark). In a table cell `|` is escaped too (GitHub splits cells before spans)."""
    body = str(text).replace("\n", " ")
    if in_table:
        body = body.replace("|", "\\|")
    if not body:
        return ""
    fence = "`" * (max((len(r) for r in re.findall("`+", body)), default=0) + 1)
    pad = " " if body.startswith("`") or body.endswith("`") else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def versions_text(h: HostResult, limit: int = 3, sep: str = ", ") -> str:
    """`toypkg 1.0.0 → 2.0.0` for the packages a host changed (tried, would change)."""
    shown = [f"{c.name} {c.old or '-'} → {c.new or '-'}" for c in h.changes[:limit]]
    more = len(h.changes) - limit
    return sep.join(shown + ([f"(+{more} more)"] if more > 0 else []))


def downtime_text(h: HostResult) -> str:
    if h.downtime_s is None:
        return ""
    return f"{h.downtime_s:.1f}s" + (" (from steps)" if h.downtime_source == "steps" else "")


def cause_text(h: HostResult) -> str:
    rc = h.root_cause
    if rc is not None:
        head = f"{rc.type}: {first_line(rc.message)}" if rc.type else first_line(rc.message)
        return head + (f" at {rc.frame.short()}" if rc.frame else "")
    return first_line(h.message) if h.message else ""


def markdown(rep: FleetReport) -> str:
    """The summary for a CI job ($GITHUB_STEP_SUMMARY)."""
    counts = ", ".join(f"{n} {s}" for s, n in rep.counts.items())
    ok = rep.exit_code == EXIT_OK
    out = [f"## {'✅' if ok else '❌'} rewheel fleet: {len(rep.hosts)} host(s): {counts}", "",
           "| host | status | versions | downtime | root cause |", "| --- | --- | --- | ---: | --- |"]
    for h in rep.hosts:
        out.append(f"| {_md(h.host)} | {_ICON.get(h.status, '')} {h.status} | {_md(versions_text(h))} | "
                   f"{downtime_text(h)} | {_code(cause_text(h)[:300], in_table=True)} |")
    if rep.causes:
        out += ["", "### Root causes", ""]
        for g in rep.causes:
            out.append(f"- **{len(g.hosts)} host(s)** ({_md(', '.join(g.hosts))}): {_code(g.text())}")
    return "\n".join(out) + "\n"


def write_summary(rep: FleetReport, path: Path) -> None:
    """Append the Markdown to `path`, as $GITHUB_STEP_SUMMARY expects."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(markdown(rep))
