"""Human rendering of results (rich). JSON rendering is each result's `to_json()`."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from rewheel.errors import RewheelError


def print_error(console: Console, exc: RewheelError) -> None:
    console.print(f"[bold red]error:[/] {escape(exc.message)}", markup=True, highlight=False)
    if exc.hint:
        console.print(f"  [yellow]hint:[/] {escape(exc.hint)}", markup=True, highlight=False)


def human_bytes(n: int | float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _versions_line(versions: dict[str, str], names: list[str], limit: int = 3) -> str:
    shown = [f"{n} {versions[n]}" for n in names if n in versions][:limit]
    return ", ".join(shown) if shown else f"{len(versions)} distributions"


def render_snapshot(console: Console, result) -> None:  # runner.SnapshotCommandResult
    r = result.result
    m = r.meta
    console.print(f"[bold green]snapshot {m.id}[/] taken of {escape(m.prefix)}"
                  + (f" — label {escape(m.label)!r}" if m.label else ""))
    console.print(f"  {m.files:,} files, {human_bytes(m.bytes_total)} in all; "
                  f"{r.files_linked:,} shared by {m.link_mode} ({human_bytes(m.bytes_linked)}), "
                  f"{r.files_copied:,} copied ({human_bytes(m.bytes_copied)} of extra disk) "
                  f"in {r.seconds:.2f}s")
    if "copy" in m.link_mode and r.files_linked == 0:
        console.print("  [yellow]the store is on another filesystem: unchanged files were copied, not linked[/]")
    console.print(f"  stored at {escape(str(m.path))}")
    if result.pruned:
        console.print(f"  pruned old snapshots: {', '.join(result.pruned)}")


def render_history(console: Console, hist) -> None:  # runner.History
    from rich.table import Table

    t = Table(title=f"snapshots of {hist.target}", title_justify="left")
    for col in ("id", "created", "status", "label", "versions", "size (extra)"):
        t.add_column(col)
    for s in hist.snapshots:
        t.add_row(s.id, s.created_iso, s.status, escape(s.label),
                  escape(_versions_line(s.versions, hist.key_packages)),
                  f"{human_bytes(s.bytes_total)} ({human_bytes(s.bytes_copied)})")
    console.print(t if hist.snapshots else "no snapshots yet")
    if hist.runs:
        rt = Table(title="runs", title_justify="left")
        for col in ("id", "kind", "status", "snapshot", "last step"):
            rt.add_column(col)
        for r in hist.runs:
            style = "bold red" if not r.finished else ""
            rt.add_row(r.id, r.kind, r.status, r.snapshot_id or "", r.last_step or "", style=style)
        console.print(rt)


def render_rollback(console: Console, result) -> None:  # runner.RollbackResult
    r = result.restore
    console.print(f"[bold green]restored snapshot {result.snapshot.id}[/] "
                  f"({escape(result.snapshot.label or result.snapshot.status)}, {result.snapshot.created_iso})")
    console.print(f"  {r.written:,} files written, {r.deleted:,} removed, {r.chmodded:,} modes fixed, "
                  f"{r.unchanged:,} unchanged; {r.verified:,} entries verified against the manifest "
                  f"in {r.seconds:.2f}s")
    if r.cleanup_restored:
        console.print(f"  {r.cleanup_restored} cleanup path(s) moved back")
    if result.service:
        console.print(f"  service: {escape(str(result.service.get('detail', result.service)))}")
    if result.finished_run:
        console.print(f"  interrupted run {result.finished_run} is now finished as rolled-back")


def render_check(console: Console, result) -> None:  # preflight.CheckResult
    for c in result.checks:
        mark = "[green]ok[/]  " if c.ok else "[bold red]FAIL[/]"
        console.print(f"{mark} {c.name}: {escape(c.detail)}")
    console.print("[bold green]recipe is ready[/]" if result.ok
                  else f"[bold red]{len(result.failures)} check(s) failed[/]")
