"""Human rendering of results (rich). JSON rendering is each result's `to_json()`."""

from __future__ import annotations

import re

from rich.console import Console
from rich.markup import escape as _escape_markup

from rewheel.errors import RewheelError

# What must never reach a terminal raw from text rewheel did not write (labels, paths,
# versions, log lines, file contents, messages quoting them): C0 and C1 control characters
# and DEL (an ESC starts sequences that clear the screen or set the window title), bidi
# overrides (text that reads differently than it is), and surrogate-escaped bytes of
# non-UTF-8 file names (unprintable; an encoding error on a strict stream).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_UNSAFE_LINES = re.compile("[\n\t]")


def _visible(m: re.Match[str]) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def clean(text: object, *, lines: bool = True) -> str:
    """`text` safe for a terminal: every control character (but newline and tab, unless
    `lines=False`), bidi override and undecodable byte shown as a visible escape (`\\x1b`).
    Every human rendering of text from files goes through this (`escape` does it); JSON
    keeps the raw text."""
    out = _UNSAFE.sub(_visible, str(text))
    return out if lines else _UNSAFE_LINES.sub(_visible, out)


def escape(text: object) -> str:
    """Text from outside rewheel for a rich markup string: control characters made visible
    (`clean`), then markup escaped."""
    return _escape_markup(clean(text))


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


def _run_versions(summary: dict, names: list[str], limit: int = 2) -> str:
    """`vllm 0.16.0rc2.dev313 → 0.16.0rc2.dev344` for the key packages a run changed."""
    before = summary.get("before") or {}
    after = summary.get("attempted") or summary.get("after") or {}
    changed = [n for n in names if before.get(n) != after.get(n) and (n in before or n in after)]
    return ", ".join(f"{n} {before.get(n, '-')} → {after.get(n, '-')}" for n in changed[:limit])


def render_snapshot(console: Console, result) -> None:  # runner.SnapshotCommandResult
    r = result.result
    m = r.meta
    console.print(f"[bold green]snapshot {escape(m.id)}[/] taken of {escape(m.prefix)}"
                  + (f" — label {escape(repr(m.label))}" if m.label else ""))
    console.print(f"  {m.files:,} files, {human_bytes(m.bytes_total)} in all; "
                  f"{r.files_linked:,} shared by {m.link_mode} ({human_bytes(m.bytes_linked)}), "
                  f"{r.files_copied:,} copied ({human_bytes(m.bytes_copied)} of extra disk) "
                  f"in {r.seconds:.2f}s")
    if m.extra.get("files_reused"):
        console.print(f"  {m.extra['files_reused']:,} unlisted file(s) unchanged since the previous snapshot: "
                      f"shared with its copy ({human_bytes(m.extra['bytes_reused'])} not copied again)")
    if "copy" in m.link_mode and r.files_linked == 0:
        console.print("  [yellow]the store is on another filesystem: unchanged files were copied, not linked[/]")
    console.print(f"  stored at {escape(str(m.path))}")
    for nested in m.extra.get("nested_skipped", []):
        console.print(f"  [yellow]left out {escape(nested)}: another environment inside this one "
                      "(its own pyvenv.cfg or conda-meta, or conda's package cache); never captured or reverted[/]")
    if result.pruned:
        console.print(f"  pruned old snapshots: {', '.join(result.pruned)}")


def render_history(console: Console, hist) -> None:  # runner.History
    from rich.table import Table

    t = Table(title=f"snapshots of {escape(hist.target)}", title_justify="left")
    for col in ("id", "created", "status", "label", "versions", "size (extra)"):
        t.add_column(col)
    for s in hist.snapshots:
        t.add_row(escape(s.id), s.created_iso, escape(s.status), escape(s.label),
                  escape(_versions_line(s.versions, hist.key_packages)),
                  f"{human_bytes(s.bytes_total)} ({human_bytes(s.bytes_copied)})")
    console.print(t if hist.snapshots else "no snapshots yet")
    for bad in hist.damaged:
        console.print(f"[yellow]snapshot {escape(bad)} is damaged (unreadable meta.json) and cannot be restored; "
                      f"inspect or delete its folder in the store[/]")
    if hist.runs:
        rt = Table(title="runs", title_justify="left")
        for col in ("id", "kind", "status", "snapshot", "last step", "versions"):
            rt.add_column(col)
        for r in hist.runs:
            style = "bold red" if not r.finished else ""
            rt.add_row(*(escape(v or "") for v in (r.id, r.kind, r.status, r.snapshot_id, r.last_step)),
                       escape(_run_versions(r.summary(), hist.key_packages)), style=style)
        console.print(rt)


def render_rollback(console: Console, result) -> None:  # runner.RollbackResult
    r = result.restore
    console.print(f"[bold green]restored snapshot {escape(result.snapshot.id)}[/] "
                  f"({escape(result.snapshot.label or result.snapshot.status)}, {result.snapshot.created_iso})")
    console.print(f"  {r.written:,} files written, {r.deleted:,} removed, {r.chmodded:,} modes fixed, "
                  f"{r.unchanged:,} unchanged; {r.verified:,} entries verified against the manifest "
                  f"in {r.seconds:.2f}s")
    if r.proven_same:
        console.print(f"  {r.proven_same:,} of the unchanged were reinstalled at the same version: "
                      "proven identical (same RECORD hash and size, untouched since), left in place")
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


def render_plan(console: Console, rep) -> None:  # runner.RunReport
    plan = rep.plan or {}
    changes = plan.get("changes") or []
    console.print(f"[bold]plan[/] for {escape(rep.recipe)}: {len(changes)} change(s)")
    for c in changes[:40]:
        old, new = c.get("old"), c.get("new")
        arrow = f"{old} → {new}" if old and new else (f"+ {new}" if new else f"- {old}")
        console.print(f"  {escape(str(c.get('name')))}: {escape(arrow)}")
    if len(changes) > 40:
        console.print(f"  … and {len(changes) - 40} more")
    est = plan.get("snapshot_estimate")
    if est:
        console.print(f"  the snapshot will share {est['files'] - est['files_to_copy']:,} files with the environment "
                      f"and copy {est['files_to_copy']:,} ({human_bytes(est['bytes_to_copy'])} of "
                      f"{human_bytes(est['store_free'])} free at the store)"
                      + (f"; {human_bytes(est['bytes_reused'])} unchanged since the last snapshot is shared with it"
                         if est.get("bytes_reused") else ""))
    for check in rep.preflight:
        if check.get("name") == "service":
            console.print(f"  the service is stopped during the upgrade: {escape(str(check.get('detail')))}")
        elif check.get("name") == "gpus":
            console.print(f"  GPUs: {escape(str(check.get('detail')))}")


def render_root_cause(console: Console, rc: dict | None) -> None:
    if not rc:
        console.print("  root cause: none found in the logs")
        return
    kind = "" if rc.get("kind") in (None, "traceback") else f" ({rc.get('kind')})"
    console.print(f"  [bold red]root cause{kind}:[/] {escape(str(rc.get('type')))}: {escape(str(rc.get('message')))}")
    if rc.get("rank"):
        console.print(f"    in process {escape(str(rc['rank']))}" +
                      (f" ({rc['count']} occurrences)" if rc.get("count", 1) > 1 else ""))
    fr = rc.get("frame") or {}
    if fr.get("file"):
        console.print(f"    at {escape(str(fr.get('file')))}:{fr.get('line')} in {escape(str(fr.get('function')))}")
        if fr.get("source"):
            console.print(f"      {escape(str(fr['source']).strip())}")
    if rc.get("log_line"):
        console.print(f"    log line {rc['log_line']}")
    render_suspects(console, rc.get("suspects"), indent="    ")
    for sec in (rc.get("secondary") or [])[:5]:
        text = sec if isinstance(sec, str) else f"{sec.get('type')}: {sec.get('message')}"
        console.print(f"    [dim]secondary: {escape(str(text))[:200]}[/]")


def render_changes(console: Console, changes: list, limit: int = 60) -> None:  # diff.PackageChange items
    """The package table of a run or CI report: the same table `diff` prints (builds,
    commits, variant, compare links)."""
    if not changes:
        console.print("  no version changes")
        return
    render_package_changes(console, changes[:limit])
    if len(changes) > limit:
        console.print(f"  … and {len(changes) - limit} more")


def render_run(console: Console, rep) -> None:  # runner.RunReport
    colour = {"upgraded": "bold green", "reverted": "bold yellow", "planned": "bold cyan"}.get(rep.status, "bold red")
    if rep.status == "planned":
        console.print(f"[{colour}]dry run: nothing was changed[/]")
        return
    console.print(f"[bold]run {rep.run_id}[/] of {escape(rep.recipe)}")
    if rep.snapshot:
        s = rep.snapshot
        console.print(f"  snapshot {s['id']}: {s['files']:,} files, {s.get('files_linked', 0):,} shared by "
                      f"{s.get('link_mode')}, {human_bytes(s.get('bytes_copied', 0))} copied")
    if rep.cleanup:
        console.print(f"  cleanup: {len(rep.cleanup)} path(s) moved into the snapshot "
                      f"({human_bytes(sum(c.get('bytes', 0) for c in rep.cleanup))})")
    console.print("[bold]what changed[/]")
    render_changes(console, rep.changes)
    if rep.files:
        from collections import Counter

        counts = Counter(f.change for f in rep.files)
        console.print("  source files: " + ", ".join(f"{n} {c}" for c, n in sorted(counts.items())))
        for f in rep.files[:15]:
            console.print(f"    {f.change:<9} {escape(f.path)} (+{f.added_lines or 0} -{f.removed_lines or 0})")
        if len(rep.files) > 15:
            console.print(f"    … and {len(rep.files) - 15} more (`rewheel diff` lists them all)")
    if rep.patches:
        console.print(f"[bold]local patches[/] ({len(rep.patches)}) — the reinstall replaced these files; "
                      f"saved as .patch files in {escape(str(rep.run_dir))}")
        for p in rep.patches[:20]:
            console.print(f"  {escape(str(p.get('path')))} ({escape(str(p.get('distribution')))}, {p.get('kind', 'modified')})")
    for r in rep.reapply:
        console.print(f"  reapply {escape(str(r.get('path')))}: {r.get('status')}")
    if rep.hazards:
        console.print(f"  [yellow]patched files shared inodes with uv's cache: {escape(', '.join(rep.hazards))}[/]")
    if rep.failure:
        console.print(f"[bold red]failed at {rep.failure.get('step')}:[/] {escape(str(rep.failure.get('message')))}")
        render_root_cause(console, rep.root_cause)
    if rep.revert:
        rv = rep.revert  # runner.RevertRecord
        r = rv.restore
        if r is not None:
            console.print(f"[bold]reverted[/]: snapshot {rep.snapshot_id} restored — {r.written:,} files "
                          f"written, {r.deleted:,} removed, {r.verified:,} verified")
        if rv.failed_snapshot_id:
            console.print(f"  the failed build is kept as snapshot {rv.failed_snapshot_id}: "
                          f"`rewheel diff {escape(rep.recipe)} {rep.snapshot_id} {rv.failed_snapshot_id}` shows what it changed")
        if rv.service:
            console.print(f"  service healthy again: {escape(str(rv.service.get('detail')))}")
        if rv.error:
            console.print(f"[bold red]revert failed:[/] {escape(rv.error)}")
    steps = "  ".join(f"{s.name} {'ok' if s.ok else 'FAILED'} {s.seconds:.1f}s" for s in rep.steps)
    console.print(f"  steps: {steps}")
    verdict = {"upgraded": "upgraded and verified",
               "reverted": "upgrade failed; the environment was restored and the old service verified",
               "failed": "FAILED: the environment is not in its verified state — see above"}[rep.status]
    console.print(f"[{colour}]{verdict}[/]")


def render_resume(console: Console, res) -> None:  # runner.ResumeResult
    console.print(f"[bold]{res.status}[/]: {escape(res.action)}" + (f" (run {res.run_id})" if res.run_id else ""))
    if res.report and res.report.revert:
        render_run(console, res.report)


def render_smoke(console: Console, rep) -> None:  # runner.SmokeReport
    if rep.smoke is not None:
        s = rep.smoke
        state = "passed" if s.get("ok") else ("timed out" if s.get("timed_out") else f"failed (exit {s.get('returncode')})")
        console.print(f"smoke test {state} in {s.get('seconds', 0):.1f}s — log {escape(str(s.get('log_path')))}")
        if not s.get("ok"):
            render_root_cause(console, rep.root_cause)
    if rep.health is not None:
        console.print(f"health: {'ok' if rep.health.get('ok') else 'FAILED'} — {escape(str(rep.health.get('detail')))}")
    if rep.error:
        console.print(f"[bold red]{escape(rep.error)}[/]")
    console.print("[bold green]ok[/]" if rep.ok else "[bold red]verification failed[/]")


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
                      + (f" on {escape(str(rc.node))}" if getattr(rc, "node", None) else ""))
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


# ---- diff and patches (rewheel.diff, rewheel.patches) ----
_CHANGE_STYLE = {"upgraded": "green", "downgraded": "yellow", "added": "cyan", "removed": "red",
                 "reinstalled": "magenta", "changed": "yellow", "mode": "dim"}
_FILE_MARK = {"added": "A", "removed": "D", "changed": "M", "mode": "m"}


def _counts(added: int | None, removed: int | None, binary: bool) -> str:
    if binary:
        return "[dim]binary[/]"
    if added is None and removed is None:
        return ""
    return f"[green]+{added or 0}[/] [red]-{removed or 0}[/]"


def render_package_changes(console: Console, packages: list, unchanged: int = 0) -> None:
    """The package table of a diff or a run report (diff.PackageChange items)."""
    from rich.table import Table

    if not packages:
        console.print(f"no package versions changed ({unchanged} unchanged)")
        return
    t = Table(title="packages", title_justify="left")
    for col in ("package", "old", "new", "change", "builds", "commits", "variant"):
        t.add_column(col, no_wrap=col not in ("commits", "variant"), overflow="fold")
    links = []
    for p in packages:
        style = _CHANGE_STYLE.get(p.change, "")
        dist = "" if p.dev_distance is None else f"{p.dev_distance:+d}"
        shas = (f"{p.old_sha or '?'} → {p.new_sha or '?'}"
                if (p.old_sha or p.new_sha) and p.old_sha != p.new_sha else (p.new_sha or ""))
        t.add_row(escape(p.name), escape(p.old or "-"), escape(p.new or "-"),
                  f"[{style}]{p.change}[/]" if style else p.change, dist, shas,
                  escape(p.variant or ""))
        if p.compare_url:
            links.append(f"  {escape(p.name)}: {escape(p.compare_url)}")
    console.print(t)
    if unchanged:
        console.print(f"{unchanged} package(s) unchanged")
    if links:
        console.print("compare:")
        for line in links:
            console.print(line, soft_wrap=True)


def render_diff(console: Console, result, *, stat_only: bool = False) -> None:  # diff.DiffResult
    from rich.syntax import Syntax
    from rich.text import Text

    console.print(f"[bold]diff {escape(result.old)} → {escape(result.new)}[/]")
    render_package_changes(console, result.packages, result.unchanged_packages)
    filt = ", ".join(f"{k} {v}" for k, v in result.filters.items() if v)
    if not result.files:
        console.print("no installed files changed" + (f" ({escape(filt)})" if filt else ""))
        return
    console.print(f"[bold]files[/] ({len(result.files)} changed" + (f"; {escape(filt)}" if filt else "") + ")")
    # One Text for the whole list: a real upgrade changes ~9,000 files, and printing each
    # line as markup (parsed and highlighted one by one) took seconds.
    added = removed = 0
    listing = Text()
    for i, f in enumerate(result.files):
        added += f.added_lines or 0
        removed += f.removed_lines or 0
        if i:
            listing.append("\n")
        listing.append(f" {_FILE_MARK.get(f.change, '?')} {clean(f.path, lines=False)}  ")
        if f.binary:
            listing.append("binary", "dim")
        elif f.added_lines is not None or f.removed_lines is not None:
            listing.append(f"+{f.added_lines or 0}", "green")
            listing.append(" ")
            listing.append(f"-{f.removed_lines or 0}", "red")
        if f.distribution:
            listing.append("  ")
            listing.append(clean(f.distribution, lines=False), "dim")
        if f.note:
            listing.append("  ")
            listing.append(clean(f.note), "dim")
    if console.is_terminal:
        console.print(listing, soft_wrap=True)
    else:  # no styles to show: the text as it is (rich's rendering is half the time)
        console.out(listing.plain, highlight=False)
    console.print(f" {len(result.files)} file(s), [green]+{added}[/] [red]-{removed}[/]")
    if stat_only:
        return
    for f in result.files:
        if f.diff:
            console.print(Syntax(clean(f.diff), "diff", theme="ansi_dark", word_wrap=True))
    h = result.stats
    if h.get("hashed_files"):
        console.print(f"[dim]{h['hashed_files']} file(s) hashed ({human_bytes(h['hashed_bytes'])}); "
                      f"the rest known from the manifest and RECORDs[/]")


def render_patches(console: Console, scan) -> None:  # patches.PatchScan
    from rich.syntax import Syntax
    from rich.table import Table

    st = scan.stats
    if not scan.patches:
        console.print(f"[bold green]no local patches[/] in {escape(scan.prefix)} "
                      f"({st.get('files_checked', 0):,} files of {st.get('distributions', 0)} "
                      f"distributions checked, {st.get('files_hashed', 0)} hashed)")
    else:
        t = Table(title=f"local patches in {escape(scan.prefix)}", title_justify="left")
        for col in ("kind", "file", "distribution", "lines", "pristine from"):
            t.add_column(col)
        for p in scan.patches:
            kind = "[yellow]modified[/]" if p.kind == "modified" else "[cyan]unlisted[/]"
            if p.shares_uv_cache_inode:
                kind += " [bold red]![/]"
            t.add_row(kind, escape(p.path), f"{escape(p.distribution)} {escape(p.version)}",
                      _counts(p.added_lines, p.removed_lines, p.binary),
                      escape(p.pristine_source or ("-" if p.kind == "unlisted" else "none")))
        console.print(t)
        for p in scan.patches:
            console.print(f"[bold]{escape(p.path)}[/] ({p.kind}, {escape(p.distribution)} {escape(p.version)})")
            if p.diff:
                console.print(Syntax(clean(p.diff), "diff", theme="ansi_dark", word_wrap=True))
            elif p.pristine_note:
                console.print(f"  [yellow]{escape(p.pristine_note)}[/]")
    hazard = sorted({p.distribution for p in scan.patches if p.shares_uv_cache_inode})
    if hazard:
        console.print(f"[bold red]warning:[/] patched in place into files uv hard-linked from its cache "
                      f"({escape(', '.join(hazard))}): uv's cached copies carry the patch too, and a "
                      f"reinstall would link the patched bytes back. `rewheel run` cleans these from "
                      f"uv's cache first; by hand: `uv cache clean {' '.join(hazard)}`")
    if scan.missing:
        console.print(f"[yellow]{len(scan.missing)} file(s) listed in a RECORD are missing:[/] "
                      + escape(", ".join(m["path"] for m in scan.missing[:10]))
                      + (" …" if len(scan.missing) > 10 else ""))
    for s in scan.skipped:
        console.print(f"[dim]not checked: {escape(s['distribution'])} ({escape(s['reason'])})[/]")
    if scan.record_inconsistent:
        shown = scan.record_inconsistent[:10]
        console.print(f"{len(scan.record_inconsistent)} file(s) match no RECORD but are exactly what "
                      "their wheel ships (RECORD inconsistent, matches its wheel; not patches, never "
                      "reapplied): " + clean(", ".join(f"{r['path']} ({r['distribution']})" for r in shown))
                      + (" …" if len(scan.record_inconsistent) > 10 else ""),
                      markup=False, highlight=False, style="dim", soft_wrap=True)


# ---- ci and bisect (rewheel.qualify, rewheel.bisection) ----
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


# ---- suspects (rewheel.suspects) ----
def render_suspects(console: Console, suspects: list | None, indent: str = "  ", hunk_lines: int = 14) -> None:
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
                          f"{escape(str(pr.get('patch') or 'not saved'))}")
        if s.get("compare_url"):
            console.print(f"{indent}     compare: {escape(str(s['compare_url']))}")
