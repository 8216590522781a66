"""Rendering of a crash's diagnosis (rewheel.diagnose, rewheel.suspects): a report's root cause,
`rewheel why`, and the suspects — the changes of the upgrade on the crash's path."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewheel.report.text import escape, show_path

if TYPE_CHECKING:  # rich is imported by the renderers that run, not with this module
    from rich.console import Console


# What named the failing process where its own lines do not (diagnose.processes.RankSource)
_NAMED_BY = {"text": "its error's text", "nearby": "the record just before it", "ray-task": "Ray's task error",
             "actor": "the dead actor's error", "raylet": "raylet's report of the dead worker",
             "field": "the logger's field after it", "launcher": "the launcher's summary",
             "same-error": "the same error printed again by it"}


def _named_by(rc) -> str:  # diagnose.RootCause
    """" (named by the launcher's summary, log line 57)", or "" where its own lines name it."""
    words = _NAMED_BY.get(rc.rank_source or "")
    if not words:
        return ""
    line = rc.evidence[0].log_line if rc.evidence else None
    return f" (named by {words}" + (f", log line {line})" if line else ")")


def render_root_cause(console: Console, rc, base: tuple[object, str] | None = None) -> None:  # diagnose.RootCause | None
    if not rc:
        console.print("  root cause: none found in the logs")
        return
    kind = "" if rc.kind in (None, "traceback") else f" ({rc.kind})"
    console.print(f"  [bold red]root cause{kind}:[/] {escape(str(rc.type))}: {escape(rc.message)}")
    if rc.rank:
        console.print(f"    in process {escape(rc.rank)}" +
                      (f" ({rc.count} occurrences)" if rc.count > 1 else "") + escape(_named_by(rc)))
    fr = rc.frame
    if fr and fr.file:
        from rewheel.diagnose import short_path

        # Inside site-packages the file as the package names it: a path that fits a line.
        console.print(f"    at {escape(short_path(fr.file) if console.is_terminal else fr.file)}:{fr.line} "
                      f"in {escape(str(fr.function))}")
        if fr.source:
            console.print(f"      {escape(fr.source.strip())}")
    if rc.log_line:
        console.print(f"    log line {rc.log_line}")
    render_suspects(console, rc.suspects, indent="    ", base=base)
    for sec in rc.secondary[:5]:
        console.print(f"    [dim]secondary: {escape(f'{sec.type}: {sec.message}')[:200]}[/]")


def render_why(console: Console, diag) -> None:  # diagnose.Diagnosis
    """`rewheel why`: the root exception, where it happened, how often, what it caused."""
    from rewheel.diagnose import short_path

    rc = diag.root
    if rc is None:
        where = f" in {diag.source}" if diag.source else ""
        lines = f" ({diag.lines} lines read)" if diag.lines is not None else ""
        console.print(f"[bold green]no error found[/]{escape(where)}{lines}: no traceback and no error line.")
        return
    if rc.kind == "error-line":
        console.print("[bold red]root cause[/] [dim](no traceback; the strongest error line)[/]")
        console.print(f"  [bold]{escape(str(rc.type))}[/]: {escape(rc.message)}")
    else:
        console.print("[bold red]root cause[/]")
        msg = rc.message.split("\n")
        console.print(f"  [bold]{escape(rc.type or 'unknown exception')}[/]: {escape(msg[0])}")
        for extra in msg[1:]:
            console.print(f"    {escape(extra)}")
    if rc.rank:
        console.print(f"  process: [bold]{escape(rc.rank)}[/]"
                      + (f" on {escape(str(rc.node))}" if getattr(rc, "node", None) else "")
                      + f"[dim]{escape(_named_by(rc))}[/]")
    if rc.frame:
        fr = rc.frame
        console.print(f"  at: [cyan]{escape(short_path(fr.file))}:{fr.line}[/]"
                      + (f" in {escape(fr.function)}" if fr.function else ""))
        if fr.source:
            console.print(f"      {escape(fr.source)}")
        console.print(f"  [dim]{escape(fr.file)}[/]")
    if rc.log_line:
        console.print(f"  starts at log line {rc.log_line}")
    seen = f"seen in {rc.count} process{'es' if rc.count != 1 else ''}"
    if rc.restarts > 1:
        seen += f" across {rc.restarts} restarts"
    console.print(f"  {seen}")
    render_suspects(console, rc.suspects, indent="  ")
    if rc.secondary:
        console.print("[bold]secondary errors[/] [dim](consequences, not the cause)[/]")
        for s in rc.secondary:
            where = f" — {s.rank}" if s.rank else ""
            at = f", line {s.log_line}" if s.log_line else ""
            times = f" ×{s.count}" if s.count > 1 else ""
            head = f"{s.type}: " if s.type else ""
            first = s.message.split("\n", 1)[0]
            if len(first) > 160:
                first = first[:159] + "…"
            console.print(f"  [dim]{s.relation}:[/] {escape(head + first)}{escape(where)}{at}{times}")


def render_suspects(console: Console, suspects: list | None, indent: str = "  ", hunk_lines: int = 14,
                    base: tuple[object, str] | None = None) -> None:
    """The changes of the upgrade a root cause points at, innermost first, each with the
    hunk around the failing line, its compare link and a removed local patch."""
    if not suspects:
        return
    docs = [s.to_json() if hasattr(s, "to_json") else s for s in suspects]
    console.print(f"{indent}[bold]suspects[/] [dim](changes of the upgrade on the crash's path, innermost first)[/]")
    for i, s in enumerate(docs, 1):
        fr = s.get("frame") or {}
        where = f"line {fr.get('line')}" + (f" in {fr.get('function')}" if fr.get("function") else "")
        if s.get("reason", "frame") != "frame":
            where = str(s.get("reason"))
        dist = s.get("distance_lines")
        near = "" if dist is None else (" — a hunk covers the line" if dist == 0 else f" — nearest hunk {dist} lines away")
        console.print(f"{indent}  {i}. [cyan]{escape(str(s.get('path')))}[/] ({escape(str(s.get('change')))}"
                      f"{', ' + escape(str(s.get('package'))) if s.get('package') else ''}): {escape(where)}{near}")
        for h in (s.get("hunks") or [])[:2]:
            console.print(f"{indent}     [dim]@@ -{h.get('old_start')},{h.get('old_lines')} "
                          f"+{h.get('new_start')},{h.get('new_lines')} @@[/]")
            lines = str(h.get("text") or "").splitlines()
            for t in lines[:hunk_lines]:
                style = "green" if t.startswith("+") else "red" if t.startswith("-") else "dim"
                console.print(f"{indent}     [{style}]{escape(t)}[/]", highlight=False, soft_wrap=True)
            if len(lines) > hunk_lines:
                console.print(f"{indent}     [dim]… {len(lines) - hunk_lines} more lines[/]")
        pr = s.get("patch_removed")
        if pr:
            counts = (f" (+{pr.get('added_lines')} -{pr.get('removed_lines')})"
                      if pr.get("added_lines") is not None else "")
            console.print(f"{indent}     [yellow]a local patch on this file was removed by the reinstall{counts}:[/] "
                          f"{escape(show_path(console, pr.get('patch'), base) if pr.get('patch') else 'not saved')}")
        if s.get("compare_url"):
            console.print(f"{indent}     compare: {escape(str(s['compare_url']))}")
