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
# `unreachable`: the controller could not reach the host (the fleet collection's callback writes
# that document); a run that had begun there goes on by itself.
STATUSES = ("failed", "error", "unreachable", "reverted", "rejected", "not-reached", "upgraded", "planned",
            "unchanged")
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
        reverted, rejected, refused or not reached by the controller, else 0."""
        statuses = {h.status for h in self.hosts}
        if "failed" in statuses:
            return EXIT_UNRESTORED
        if statuses & {"reverted", "rejected", "error", "unreachable"}:
            return EXIT_REVERTED
        return EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {"hosts": [h.to_json() for h in self.hosts], "counts": self.counts,
                "root_causes": [c.to_json() for c in self.causes], "exit_code": self.exit_code}


# -- reading -------------------------------------------------------------------------------
# A report is read by key; a key it needs holding the wrong kind of value (another program's
# file, a hand edit, a truncated copy) is refused naming the file and the key, never guessed at.
_HINT = "give the files `rewheel run RECIPE --json` wrote, one per host"


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _refuse(where: str, key: str, value: Any, expected: str) -> UsageError:
    return UsageError(f"{where}: `{key}` is {_kind(value)}, not {expected}", hint=_HINT)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _opt(where: str, doc: dict[str, Any], key: str, kind: type | tuple[type, ...], expected: str,
         path: str | None = None) -> Any:
    """`doc[key]`, None when absent or null; refused when it is not of `kind`."""
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _refuse(where, path or key, value, expected)
    return value


def _versions(where: str, doc: dict[str, Any], key: str) -> dict[str, str]:
    value = _opt(where, doc, key, dict, "an object of versions") or {}
    for name, version in value.items():
        if not isinstance(version, str):
            raise _refuse(where, f"{key}.{name}", version, "a version (a string)")
    return dict(value)


def _steps(where: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
    steps = _opt(where, doc, "steps", list, "a list of steps") or []
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            raise _refuse(where, f"steps[{i}]", step, "an object")
        _opt(where, step, "name", str, "a string", f"steps[{i}].name")
        _opt(where, step, "seconds", (int, float), "a number", f"steps[{i}].seconds")
    return steps


def _root_cause(where: str, doc: dict[str, Any]) -> RootCause | None:
    rc = _opt(where, doc, "root_cause", dict, "an object")
    if rc is None:
        return None
    for key in ("type", "message", "rank"):
        _opt(where, rc, key, str, "a string", f"root_cause.{key}")
    frame = _opt(where, rc, "frame", dict, "an object", "root_cause.frame")
    if frame is not None:
        if not isinstance(frame.get("file"), str):
            raise _refuse(where, "root_cause.frame.file", frame.get("file"), "a path (a string)")
        if not isinstance(frame.get("line"), int) or isinstance(frame.get("line"), bool):
            raise _refuse(where, "root_cause.frame.line", frame.get("line"), "a line number")
        _opt(where, frame, "function", str, "a string", "root_cause.frame.function")
    try:
        return RootCause.from_json(rc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageError(f"{where}: `root_cause` is not a root cause rewheel wrote ({type(exc).__name__}: {exc})",
                         hint=_HINT) from None


def downtime(doc: dict[str, Any], where: str = "report") -> tuple[float | None, str | None]:
    """(seconds, source) of a run report: its own `downtime` when it has the key, else the
    steps from the first `stop` through the last `start` (or through `revert`)."""
    if "downtime" in doc:
        dt = doc["downtime"]
        if isinstance(dt, dict) and _is_number(dt.get("seconds")):
            return float(dt["seconds"]), "report"
        return None, "report"
    steps = _steps(where, doc)
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


def _planned(where: str, doc: dict[str, Any]) -> list[VersionChange]:
    plan = _opt(where, doc, "plan", dict, "an object") or {}
    changes = _opt(where, plan, "changes", list, "a list", "plan.changes") or []
    out = []
    for i, c in enumerate(changes):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise _refuse(where, f"plan.changes[{i}]", c, "a change with a name")
        old = _opt(where, c, "old", str, "a version (a string)", f"plan.changes[{i}].old")
        new = _opt(where, c, "new", str, "a version (a string)", f"plan.changes[{i}].new")
        if old != new:
            out.append(VersionChange(c["name"], old, new))
    return out


def host_result(host: str, doc: Any, source: str | None = None) -> HostResult:
    """One host's outcome from the JSON document its command printed."""
    where = source or host
    if not isinstance(doc, dict):
        raise UsageError(f"{where}: not a rewheel JSON document (a JSON object)", hint=_HINT)
    if doc.get("unreachable") is True:
        return HostResult(host, "unreachable", source, message=str(doc.get("message") or "unreachable"))
    if "error" in doc and "status" not in doc:
        # A command that refused or broke before a run began (exit 2, 4, 5: nothing changed), or
        # stopped where a person must act (exit 3, e.g. a full disk: `failed`).
        code = _opt(where, doc, "exit_code", int, "an exit code")
        message = str(doc.get("message") or doc["error"]) + (f" (exit {code})" if code is not None else "")
        return HostResult(host, "failed" if code == EXIT_UNRESTORED else "error", source, message=message,
                          exit_code=code)
    status = doc.get("status")
    if not isinstance(status, str) or status not in _RUN_STATUSES:
        raise UsageError(f"{where}: not a `rewheel run RECIPE --json` report (status {status!r})", hint=_HINT)
    before = _versions(where, doc, "before")
    after = _versions(where, doc, "after")
    res = HostResult(host, status, source, run_id=_opt(where, doc, "run_id", str, "a run id (a string)"),
                     before=before, after=after, root_cause=_root_cause(where, doc),
                     exit_code=_opt(where, doc, "exit_code", int, "an exit code"))
    if status == "planned":
        res.changes = _planned(where, doc)
        if not res.changes:
            res.status = "unchanged"  # the dry run found the host already there
        res.after = dict(before)
        return res
    kept = status in ("upgraded", "reinstalled", "unchanged")
    if status in ("reinstalled", "unchanged"):
        res.status = "unchanged"  # kept, and no version changed
    res.changes = _changes(before, _versions(where, doc, "attempted") if not kept else after)
    res.downtime_s, res.downtime_source = downtime(doc, where)
    failure = _opt(where, doc, "failure", dict, "an object") or {}
    if not kept:
        res.message = _opt(where, failure, "message", str, "a string", "failure.message")
    if status == "failed":
        # What a person must act on first (the revert's error names where), then what began it.
        res.exit_code = EXIT_UNRESTORED
        revert = _opt(where, doc, "revert", dict, "an object") or {}
        error = _opt(where, revert, "error", str, "a string", "revert.error")
        step = _opt(where, failure, "step", str, "a string", "failure.step")
        began = f"{step} failed: {res.message}" if step and res.message else res.message
        res.message = f"NOT restored (exit {EXIT_UNRESTORED}): " + "; ".join(x for x in (error, began) if x)
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
         "failed": "🛑", "error": "⚠️", "unreachable": "🔌", "not-reached": "⏸️"}


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
    # (a message, unlike an exception's, says where and what to do: kept whole up to a paragraph)
    return first_line(h.message, 600) if h.message else ""


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
