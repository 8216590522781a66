"""Rendering of the commands that qualify and survey nightlies: `ci` (rewheel.qualify), `bisect`
(rewheel.bisection), `fleet-report` (rewheel.fleet) and `board` (rewheel.board)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewheel.report.diagnosis import render_root_cause
from rewheel.report.layout import _plain, _table_or_stack, is_plain
from rewheel.report.runs import render_changes
from rewheel.report.text import clean, escape, human_bytes

if TYPE_CHECKING:  # rich is imported by the renderers that run, not with this module
    from rich.console import Console


def render_ci(console: Console, rep) -> None:  # qualify.CiReport
    """`rewheel ci`: the verdict, each step, the root cause, the changes since the baseline."""
    colour = "bold green" if rep.status == "qualified" else "bold red"
    console.print(f"[{colour}]{rep.status}[/]: {escape(rep.package)} {escape(rep.version or '(not installed)')} "
                  f"(Python {escape(rep.python_version or '?')}) from {escape(rep.recipe)}")
    for s in rep.steps:
        mark = {"passed": "[green]✓[/]", "failed": "[red]✗[/]", "skipped": "[dim]-[/]"}[s.status]
        console.print(f"  {mark} {s.name:<12} {s.seconds:6.1f}s  {escape(s.message)}")
    if rep.root_cause:
        render_root_cause(console, rep.root_cause)
    if rep.baseline:
        console.print(f"changes since {escape(rep.baseline)}:")
        render_changes(console, rep.changes)
    if rep.promoted:
        console.print(f"promoted: {escape(rep.promoted)}")
    for kind, path in (("junit", rep.junit), ("summary", rep.summary)):
        if path:
            console.print(f"{kind}: {escape(path)}")


def render_ci_base(console: Console, rep) -> None:  # qualify.CiReport
    """What `ci` started the throwaway environment from."""
    b = rep.base or {}
    if b.get("from"):
        console.print(f"  started from {escape(b['from'])}: {b.get('pinned', 0)} distribution(s) at their "
                      f"versions ({escape(b.get('pins') or '')}), then the recipe's upgrade")
        if b.get("left_out"):
            console.print(f"  left out (no index gives them back): {escape(', '.join(b['left_out']))}")
    elif b.get("reason"):
        console.print(f"  started from the recipe's packages alone: {escape(b['reason'])}")


def render_bisect(console: Console, res) -> None:  # bisection.BisectResult
    """`rewheel bisect`: the verdict, each build tried, the last good and first bad builds."""
    colour = "bold green" if res.status == "found" else "bold red"
    console.print(f"[{colour}]{res.status}[/]: {escape(res.message)}")
    console.print(f"  {len(res.candidates)} {res.mode} from {escape(res.good)} to {escape(res.bad)}"
                  + (f" (commits from {escape(res.commit_source)})" if res.commit_source else "")
                  + f"; {res.smoke_runs} smoke run(s) in this invocation")
    for v in res.steps:
        mark = {"good": "[green]good[/]", "bad": "[red]bad [/]", "skip": "[yellow]skip[/]"}[v.verdict]
        commit = f" {v.build.commit[:12]}" if v.build.commit else ""
        again = " [dim](recorded)[/]" if v.resumed else ""
        console.print(f"  {mark} {escape(v.build.label)}{commit}{again}  [dim]{escape(v.reason)[:200]}[/]")
    if res.last_good:
        console.print(f"last good:  {escape(res.last_good.label)}")
    if res.first_bad:
        console.print(f"first bad:  {escape(res.first_bad.label)}")
    if res.compare_url:
        console.print(f"compare:    {escape(res.compare_url)}")
    fb = res.first_bad_verdict
    if fb and fb.root_cause:
        render_root_cause(console, fb.root_cause)


def render_fleet(console: Console, rep) -> None:  # fleet.FleetReport
    """`rewheel fleet-report`: one row per host (status, versions, downtime, root cause),
    then the root causes grouped across hosts."""
    from rewheel import fleet

    counts = ", ".join(f"{n} {s}" for s, n in rep.counts.items())
    colour = "bold green" if rep.exit_code == 0 else "bold red"
    console.print(f"[{colour}]fleet[/]: {len(rep.hosts)} host(s): {escape(counts)}")
    styles = {"upgraded": "green", "reverted": "yellow", "rejected": "yellow", "failed": "bold red",
              "error": "red", "unreachable": "red", "not-reached": "dim"}
    if is_plain(console):
        for h in rep.hosts:
            down = fleet.downtime_text(h)
            _plain(console, "  ".join(x for x in (h.host, h.status, fleet.versions_text(h),
                                                  down and f"downtime {down}", fleet.cause_text(h)) if x))
    else:
        # One package per line: a version change is never split.
        rows = [(h.host, h.status, fleet.versions_text(h, sep="\n"), fleet.downtime_text(h), fleet.cause_text(h))
                for h in rep.hosts]
        _table_or_stack(console, "hosts", ("host", "status", "versions", "downtime", "root cause"), rows,
                        head=(0, 1), styles=[styles.get(h.status, "") for h in rep.hosts], wrap=(4,))
    if rep.causes:
        console.print("root causes:")
        for g in rep.causes:
            _plain(console, f"  {len(g.hosts)} host(s) ({', '.join(g.hosts)}): {g.text()}")


def render_board(console: Console, res) -> None:  # board.BoardResult
    """`rewheel board`: where the site is, what it holds, how large its largest page is."""
    def say(text: str) -> None:  # wrapped between words on a terminal, never in a pipe
        console.print(clean(text, lines=False), markup=False, highlight=False)

    say(f"board: {res.index}")
    say(f"  {res.pages:,} page(s), {human_bytes(res.bytes)}; the largest: {res.largest[0]} "
        f"({human_bytes(res.largest[1])})")
    say(f"  written in {res.seconds:.1f}s: {res.environments} environment(s), {res.runs:,} run(s), "
        f"{res.nightlies} qualification(s), {res.bisections} bisection(s)"
        + (f", {res.fleet_hosts} fleet host(s)" if res.fleet_hosts else ""))
    if res.removed:
        say(f"  removed {len(res.removed)} page(s) the last board had and this one has not")
