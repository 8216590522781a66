"""Human rendering of results (rich). JSON rendering is each result's `to_json()`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rewheel.errors import RewheelError
from rewheel.statuses import UNDO_SKIPPED, RollbackStatus, RunStatus

if TYPE_CHECKING:  # rich is imported by the renderers that run, not with this module
    from rich.console import Console

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
    from rich.markup import escape as _escape_markup

    return _escape_markup(clean(text))


# The command line as typed (after `rewheel`), set once by the CLI: a hint that retries it with a
# flag changed is this line, pasteable as it is. None (a caller without one): the plain form.
ARGV: list[str] | None = None


def typed_line(fallback: str, *, add: str = "", drop: str = "") -> str:
    """`rewheel` and the command line as typed, `drop` left out and `add` appended; `fallback`
    (the command without the person's other flags) where no command line is known."""
    import shlex

    if ARGV is None:
        return fallback
    return shlex.join(["rewheel", *(a for a in ARGV if a != drop), *([add] if add and add not in ARGV else [])])


def _arg(text: str) -> str:
    """A word of a command line, quoted for the shell where it must be."""
    import shlex

    return shlex.quote(text)


def print_error(console: Console, exc: RewheelError) -> None:
    if getattr(exc, "is_note", False):  # a choice the person made (answered "no"): no red
        console.print(clean(exc.message, lines=False), markup=False, highlight=False)
        return
    console.print(f"[bold red]error:[/] {escape(exc.message)}", markup=True, highlight=False)
    if exc.hint:
        console.print(f"  [yellow]hint:[/] {escape(exc.hint)}", markup=True, highlight=False)


def show_path(console: Console, path: object, base: tuple[object, str] | None = None) -> str:
    """A path as a terminal shows it: short enough to stay whole on a line — relative to
    `base` (a folder, and what to call it: `prepared/pylock.toml in the run's folder`) or to
    the current folder when it lies under one, else `~/…` under the home folder. Anywhere
    else (a pipe, a file) the path as it is: grep and scripts get it whole."""
    import os
    from pathlib import Path

    text = str(path)
    if not text or not console.is_terminal:
        return text
    p = Path(text)
    if base is not None and base[0]:
        try:
            rel = p.relative_to(Path(str(base[0])))
            return base[1] if str(rel) == "." else f"{rel} in {base[1]}"
        except ValueError:
            pass
    try:
        cwd = Path.cwd()
        rel = p.relative_to(cwd)
        if cwd != Path("/") and str(rel) != ".":
            return str(rel)
    except (ValueError, OSError):
        pass
    home = os.path.expanduser("~")
    if home not in ("", "/") and text.startswith(home.rstrip("/") + "/"):
        return "~" + text[len(home.rstrip("/")):]
    return text


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


def snapshot_cost(r) -> str:  # snapshot.SnapshotResult
    """What a snapshot stored, in words: `57,737 files (8.0 GiB): 57,000 unchanged since the
    last snapshot; 700 new contents copied (12.0 MiB), 37 already in the store; 1,184 large
    binaries shared by hard links (6.9 GiB)`."""
    m = r.meta
    unchanged = m.extra.get("files_unchanged", 0)
    parts = [f"{m.files:,} files ({human_bytes(m.bytes_total)})"]
    said = []
    if unchanged:
        said.append(f"{unchanged:,} unchanged since the last snapshot")
    said.append(f"{r.files_copied:,} new content(s) stored ({human_bytes(m.bytes_copied)} of extra disk)")
    if m.extra.get("files_reused"):
        said.append(f"{m.extra['files_reused']:,} already in the store")
    if r.files_linked:
        said.append(f"{r.files_linked:,} large binaries shared with the environment by hard links "
                    f"({human_bytes(m.bytes_linked)})")
    return parts[0] + ": " + "; ".join(said)


def render_snapshot(console: Console, result) -> None:  # results.SnapshotCommandResult
    r = result.result
    m = r.meta
    console.print(f"[bold green]snapshot {escape(m.id)}[/] taken of {escape(m.prefix)}"
                  + (f" — label {escape(repr(m.label))}" if m.label else ""))
    console.print(f"  {snapshot_cost(r)} in {r.seconds:.2f}s")
    if m.extra.get("links_refused"):
        console.print("  [yellow]the store is on another filesystem than the environment: its binaries were "
                      "copied, not linked (put the store on the environment's filesystem to share them)[/]")
    console.print(f"  stored at {escape(str(m.path))}")
    for nested in m.extra.get("nested_skipped", []):
        console.print(f"  [yellow]left out {escape(nested)}: another environment inside this one "
                      "(its own pyvenv.cfg or conda-meta, or conda's package cache); never captured or reverted[/]")
    if result.pruned:
        console.print(f"  pruned old snapshots: {', '.join(result.pruned)}")


def render_history(console: Console, hist) -> None:  # results.History
    """Snapshots and runs: a table when it fits the terminal whole, a stacked list when it
    does not, one line per snapshot or run when plain. Ids and versions are never cut."""
    snaps = [(s.id, s.created_iso,
              s.status + (f" damaged: {hist.damaged_files[s.id]} file(s)" if hist.damaged_files.get(s.id) else ""),
              s.label,
              [f"{n} {s.versions[n]}" for n in hist.key_packages if n in s.versions][:3]
              or [f"{len(s.versions)} distributions"],
              f"{human_bytes(s.bytes_total)} ({human_bytes(s.bytes_copied)})") for s in hist.snapshots]
    if not snaps:
        console.print("no snapshots yet")
    elif is_plain(console):
        for sid, created, status, label, vers_, size in snaps:
            _plain(console, f"snapshot {sid}  {created}  {status}  " + (f"{label!r}  " if label else "")
                   + ", ".join(vers_) + f"  {size}")
    else:
        _table_or_stack(console, f"snapshots of {hist.target}",
                        ("id", "created", "status", "label", "versions", "size (extra)"),
                        [(sid, created, status, label, "\n".join(vers_), size)
                         for sid, created, status, label, vers_, size in snaps],
                        head=(0, 2, 1), wrap=(3, 4, 5))
    for bad in hist.damaged:
        console.print(f"[yellow]snapshot {escape(bad)} is damaged (unreadable meta.json) and cannot be restored; "
                      f"inspect or delete its folder in the store[/]")
    edited = [i for i, n in hist.damaged_files.items() if n]
    if edited:
        console.print(f"[yellow]snapshot(s) {escape(', '.join(edited))}: stored files were changed after the "
                      f"snapshot (edited in place through a hard link); `rewheel verify {escape(hist.target)}` "
                      f"names them, and a rollback recovers their bytes first or refuses (exit 3)[/]")
    if hist.runs:
        def down(r) -> str:  # journal.RunJournal
            doc = r.summary().get("downtime")
            return f"{doc['seconds']:.1f}s" if doc else ""

        rows = [(r.id, r.kind, r.status, r.snapshot_id or "", r.last_step or "", down(r),
                 _run_versions(r.summary(), hist.key_packages).replace(", ", "\n"))
                for r in hist.runs]
        live = (hist.running or {}).get("run_id")
        rows = [(row[0], row[1], "running" if row[0] == live else row[2], *row[3:]) for row in rows]
        styles = ["" if r.finished else "yellow" if r.id == live else "bold red" for r in hist.runs]
        if is_plain(console):
            for rid, kind, status, sid, step, dt, run_vers in rows:
                _plain(console, f"run {rid}  {kind}  {status}" + (f"  snapshot {sid}" if sid else "")
                       + (f"  last step {step}" if step else "") + (f"  downtime {dt}" if dt else "")
                       + (f"  {run_vers.replace(chr(10), ', ')}" if run_vers else ""))
        else:
            _table_or_stack(console, "runs", ("id", "kind", "status", "snapshot", "last step", "downtime", "versions"),
                            rows, head=(0, 1, 2), styles=styles, wrap=(6,))
    if hist.running:
        console.print(f"[yellow]{escape(running_text(hist.running))}[/]")


def render_rollback(console: Console, result) -> None:  # results.RollbackResult
    r = result.restore
    console.print(f"[bold green]restored snapshot {escape(result.snapshot.id)}[/] "
                  f"({escape(result.snapshot.label or result.snapshot.status)}, {result.snapshot.created_iso})")
    console.print(f"  {r.written:,} files written, {r.deleted:,} removed, {r.chmodded:,} modes fixed, "
                  f"{r.unchanged:,} unchanged; {r.verified:,} entries verified against the manifest "
                  f"in {r.seconds:.2f}s")
    if not (r.written or r.deleted or r.chmodded or r.folders_rebuilt or r.cleanup_restored):
        # Said, not implied by the counts: "restored" alone reads as if something came back.
        console.print("  nothing needed restoring: the environment already matched the snapshot")
    if r.proven_same:
        console.print(f"  {r.proven_same:,} of the unchanged were reinstalled at the same version: "
                      "proven identical (same RECORD hash and size, untouched since), left in place")
    if r.cleanup_restored:
        console.print(f"  {r.cleanup_restored} cleanup path(s) moved back")
    if result.service:
        console.print(f"  service: {escape(result.service.detail)}")
    render_downtime(console, result.downtime)
    if result.finished_run:
        console.print(f"  interrupted run {result.finished_run} is now finished as rolled-back")


def render_check(console: Console, result) -> None:  # preflight.CheckResult
    for c in result.checks:
        mark = "[green]ok[/]  " if c.ok else "[bold red]FAIL[/]"
        console.print(f"{mark} {c.name}: {escape(c.detail)}")
    console.print("[bold green]recipe is ready[/]" if result.ok
                  else f"[bold red]{len(result.failures)} check(s) failed[/]")


def render_plan(console: Console, rep, *, verbose: bool = False) -> None:  # results.RunReport
    """The screen read before saying yes: what changes version first (upgrades, downgrades,
    additions, removals, with the builds between nightlies and a compare link), then one line
    for the packages reinstalled at the same version (`verbose` lists them)."""
    plan = rep.plan  # results.RunPlan
    changes = plan.changes if plan else []  # installer.PlannedChange items
    same = [c for c in changes if c.change == "reinstall"]
    real = sorted((c for c in changes if c.change != "reinstall"),
                  key=lambda c: (_PLAN_ORDER.get(c.change, len(_PLAN_ORDER)), c.name))
    console.print(f"[bold]plan[/] for {escape(rep.recipe)}: {len(real)} version change(s)"
                  + (f", {len(same)} reinstalled at the same version" if same else ""))
    for c in real:
        line, style = _plan_line(c), _PLAN_STYLE.get(c.change, "")
        if len(line) > console.width and not is_plain(console):
            # Too long for the terminal: the versions on a line of their own, never wrapped.
            head, _, versions = line.partition(": ")
            versions, _, builds = versions.partition("  (")
            _plain(console, head + (f"  ({builds}" if builds else ""), style=style)
            _plain(console, f"{'':13}{versions}")
        else:
            _plain(console, line, style=style)
        if c.compare_url:
            _plain(console, f"{'':13}compare: {c.compare_url}")
    if same:
        if verbose:
            for c in same:
                _plain(console, f"  {'same':<10} {c.name}: {c.new}")
        else:
            console.print(f"  {len(same)} reinstalled at the same version (--verbose lists them)")
    est = plan.snapshot_estimate if plan else None
    if est:
        console.print(f"  the snapshot will share {est['files'] - est['files_to_copy']:,} files with the environment "
                      f"and copy {est['files_to_copy']:,} ({human_bytes(est['bytes_to_copy'])} of "
                      f"{human_bytes(est['store_free'])} free at the store)"
                      + (f"; {human_bytes(est['bytes_reused'])} unchanged since the last snapshot is shared with it"
                         if est.get("bytes_reused") else ""))
    render_held_back(console, plan)
    if plan is not None and plan.install.lock:
        console.print(f"  the lock this plan installs: {escape(plan.install.lock)}")
    if getattr(rep, "staged", False):
        console.print("  staged: built and pre-checked beside the environment while the service serves; "
                      "stopped only for the swap (offline install, smoke test, start)")
    for check in rep.preflight:  # preflight.Check items
        if check.name == "service":
            console.print(f"  the service is stopped during the upgrade: {escape(check.detail)}")
        elif check.name == "gpus":
            console.print(f"  GPUs: {escape(check.detail)}")


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


def render_changes(console: Console, changes: list, limit: int = 60, *,
                   same_version: dict[str, str] | None = None, verbose: bool = False) -> None:  # diff.PackageChange items
    """The package table of a run or CI report: the same table `diff` prints (versions,
    builds between nightlies, compare links); `same_version` ({name: version}) are the
    packages the plan reinstalled at their version, counted on one line."""
    if not changes and not same_version:
        console.print("  no version changes")
        return
    render_package_changes(console, changes[:limit], same_version=same_version, verbose=verbose)
    if len(changes) > limit:
        console.print(f"  … and {len(changes) - limit} more")


def render_run(console: Console, rep, *, verbose: bool = False) -> None:  # results.RunReport
    colour = {"upgraded": "bold green", "reinstalled": "bold green", "unchanged": "bold green",
              "reverted": "bold yellow", "planned": "bold cyan", "prepared": "bold cyan"}.get(rep.status, "bold red")
    if rep.status == RunStatus.PLANNED:
        console.print(f"[{colour}]dry run: nothing was changed[/]")
        return
    here = (rep.run_dir, "the run's folder") if rep.run_dir else None
    console.print(f"[bold]run {rep.run_id}[/] of {escape(rep.recipe)}"
                  + (f"; its folder: {escape(show_path(console, rep.run_dir))}" if here else ""))
    served = rep.service_before == "active"
    render_prepared(console, rep.prepared, here, served=served)
    if rep.status == RunStatus.PREPARED:
        swap = typed_line(f"rewheel run {_arg(rep.recipe)} --prepared", add="--prepared", drop="--prepare-only")
        console.print(f"[{colour}]prepared{': the service kept serving' if served else ''}; `{escape(swap)}` "
                      "swaps it in[/]")
        return
    if rep.snapshot:
        s = rep.snapshot  # snapshot.SnapshotResult
        console.print(f"  snapshot {s.meta.id}: {snapshot_cost(s)}")
    if rep.cleanup:
        console.print(f"  cleanup: {len(rep.cleanup)} path(s) moved into the snapshot "
                      f"({human_bytes(sum(c.get('bytes', 0) for c in rep.cleanup))})")
    console.print("[bold]what would have changed[/]" if rep.status == RunStatus.REJECTED else "[bold]what changed[/]")
    same = {c.name: str(c.new) for c in (rep.plan.changes if rep.plan else []) if c.change == "reinstall"}
    render_changes(console, rep.changes, same_version=same, verbose=verbose)
    if rep.files:
        from collections import Counter

        counts = Counter(f.change for f in rep.files)
        console.print("  source files: " + ", ".join(f"{n} {c}" for c, n in sorted(counts.items())))
        for f in rep.files[:15]:
            console.print(f"    {f.change:<9} {escape(f.path)} (+{f.added_lines or 0} -{f.removed_lines or 0})")
        if len(rep.files) > 15:
            kept = rep.revert.failed_snapshot_id if rep.revert else None
            console.print(f"    … and {len(rep.files) - 15} more (`rewheel diff {escape(_arg(rep.recipe))} "
                          f"{rep.snapshot_id}{' ' + kept if kept else ''}` lists them all)")
    if rep.patches:
        console.print(f"[bold]local patches[/] ({len(rep.patches)}) — the reinstall replaced these files; "
                      f"saved as .patch files in {escape(show_path(console, rep.run_dir, here))}")
        for p in rep.patches[:20]:  # patches.Patch items
            console.print(f"  {escape(p.path)} ({escape(p.distribution)}, {p.kind})")
    for r in rep.reapply:  # patches.ReapplyResult items
        console.print(f"  reapply {escape(r.path)}: {r.status}")
    if rep.hazards:
        console.print(f"  [yellow]patched files shared inodes with uv's cache: {escape(', '.join(rep.hazards))}[/]")
    if rep.failure:
        console.print(f"[bold red]failed at {rep.failure.step}:[/] {escape(rep.failure.message)}")
        render_root_cause(console, rep.root_cause, base=here)
    if rep.revert:
        _render_revert(console, rep, "[bold]reverted[/]: ", "revert failed")
    _render_steps(console, rep)
    render_downtime(console, rep.downtime)
    if rep.fetched_after_stop and rep.staged:
        console.print("  [yellow]fetched after the stop (not in uv's cache before it): "
                      f"{escape(', '.join(rep.fetched_after_stop))}[/]")
    render_held_back(console, rep.plan)
    # What is said of the service matches what there was: none (no [service]), one left stopped.
    reverted = {"active": "upgrade failed; the environment was restored and the old service verified",
                "inactive": "upgrade failed; the environment was restored and verified (the service was not "
                            "running: left stopped)"}.get(rep.service_before or "",
                                                          "upgrade failed; the environment was restored and verified")
    verdict = {"upgraded": "upgraded and verified",
               "reinstalled": "reinstalled at the same versions and verified (no version changed)",
               "unchanged": "unchanged: nothing was installed" + (", and the service verified" if served else ""),
               "rejected": ("rejected before the stop: the service kept serving, the environment is untouched" if served
                            else "rejected: the prepared build failed its checks; the environment is untouched"),
               "reverted": reverted,
               "failed": "FAILED: the environment is not in its verified state — see above"}[rep.status]
    console.print(f"[{colour}]{verdict}[/]")


def render_held_back(console: Console, plan) -> None:  # results.RunPlan | None
    """Recipe packages the index offers newer than the plan takes, and uv's reason."""
    for h in (plan.install.held_back if plan is not None else []):
        newest = h.get("newest") or "a newer release"
        why = (h.get("why") or ["uv gave no reason"])[0]
        console.print(f"  [yellow]held back[/]: {escape(h['name'])} {escape(h.get('resolved'))}, not {escape(newest)}"
                      f" — uv says: {escape(why)}")


def render_prepared(console: Console, prepared, base: tuple[object, str] | None = None, *,
                    served: bool = True) -> None:  # staging.Prepared | None
    """A staged run's prepare: where the lock is, and each check of the build."""
    if prepared is None:
        return
    when = "while the service served" if served else "before anything was stopped or changed"
    lock = show_path(console, prepared.lock, base) if prepared.lock else "(no lock was made)"
    console.print(f"  prepared ({escape(prepared.source)}) {when}: {escape(lock)}")
    for c in prepared.checks:  # staging.PrepCheck items
        first = c.detail.splitlines()[0] if c.detail else ""
        console.print(f"    {'ok    ' if c.ok else 'FAILED'} {c.name} {c.seconds:.1f}s — {escape(first)}")


def downtime_text(doc: dict | None) -> str:
    """`12.3s (stop 1.0, snapshot 2.1, install 3.0, smoke 4.0, start 0.1, ready 2.1)`."""
    if not doc:
        return "none (the service was not stopped)"
    parts = ", ".join(f"{k} {v:.1f}" for k, v in doc["parts"].items() if v or k in ("install", "smoke"))
    return f"{doc['seconds']:.1f}s ({parts})"


def render_downtime(console: Console, downtime) -> None:  # results.Downtime | None
    if downtime is not None and downtime.ongoing:
        console.print(f"  [bold red]downtime: ongoing[/] — the service has not answered healthy since its stop; "
                      f"so far {downtime_text(downtime.to_json())}")
    elif downtime is not None:
        console.print(f"  downtime: {downtime_text(downtime.to_json())} — from the stop to the first healthy answer")


def _render_revert(console: Console, rep, head: str, failed: str) -> None:  # results.RunReport
    """A report's restore (a revert's, a resume's): what was restored, the failed build kept,
    the undo point taken, the service, the error."""
    rv = rep.revert  # results.RevertRecord
    if rv.restore is not None:
        r = rv.restore
        console.print(f"{head}snapshot {rep.snapshot_id} restored — {r.written:,} files written, {r.deleted:,} removed, "
                      f"{r.verified:,} verified")
    if rv.failed_snapshot_id:
        console.print(f"  the failed build is kept as snapshot {rv.failed_snapshot_id}: "
                      f"`rewheel diff {escape(_arg(rep.recipe))} {rep.snapshot_id} {rv.failed_snapshot_id}` shows what it changed")
    if rv.undo_snapshot_id:
        console.print(f"  the state it replaced is snapshot {rv.undo_snapshot_id}: "
                      f"`rewheel rollback {escape(_arg(rep.recipe))} {rv.undo_snapshot_id}` undoes it")
    if rv.service:
        console.print(f"  service healthy again: {escape(rv.service.detail)}")
    if rv.error:
        console.print(f"[bold red]{failed}:[/] {escape(rv.error)}")


def _render_steps(console: Console, rep) -> None:  # results.RunReport
    steps = "  ".join(f"{s.name} {'ok' if s.ok else s.reason or 'FAILED'} {s.seconds:.1f}s" for s in rep.steps)
    console.print(f"  steps: {steps}")


def render_resume(console: Console, res) -> None:  # results.ResumeResult
    """What a resume did in its own words — an interrupted run undone, or an interrupted
    rollback finished — never a run's verdict ("upgrade failed") for what it did not try."""
    console.print(f"[bold]{res.status}[/]: {escape(res.action)}" + (f" (run {res.run_id})" if res.run_id else ""))
    rep = res.report
    if rep is None or rep.revert is None:
        return
    console.print("[bold]what the resume moved[/]")
    render_changes(console, rep.changes)
    _render_revert(console, rep, "  ", "the restore failed")
    if rep.revert.service_skipped:
        console.print(f"  {escape(rep.revert.service_skipped)}")
    _render_steps(console, rep)


def render_smoke(console: Console, rep) -> None:  # results.SmokeReport
    if rep.smoke is not None:
        s = rep.smoke  # smoke.SmokeResult
        state = "passed" if s.ok else ("timed out" if s.timed_out else f"killed by {s.killed_by}" if s.killed_by
                                       else f"failed (exit {s.returncode})")
        console.print(f"smoke test {state} in {s.seconds:.1f}s — log {escape(str(s.log_path))}")
        if not s.ok:
            render_root_cause(console, rep.root_cause)
    if rep.health is not None:  # service.HealthResult
        console.print(f"health: {'ok' if rep.health.ok else 'FAILED'} — {escape(rep.health.detail)}")
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


def render_package_changes(console: Console, packages: list, unchanged: int = 0, *,
                           same_version: dict[str, str] | None = None, verbose: bool = False) -> None:
    """The package table of a diff or a run report (diff.PackageChange items): version changes
    first — a table when it fits the terminal whole, stacked when it does not, one line each
    when plain; versions are never cut — then one line for the packages reinstalled at the
    same version (`same_version`, {name: version}, and the changes classified "reinstalled");
    `verbose` lists them."""
    real = [p for p in packages if p.change != "reinstalled"]
    rebuilt = {p.name: p.new or "" for p in packages if p.change == "reinstalled"}
    same = {**(same_version or {}), **rebuilt}
    if not real and not same:
        console.print(f"no package versions changed ({unchanged} unchanged)")
        return
    if real:
        _package_table(console, real)
    else:
        console.print("no package versions changed")
    if same:
        line = f"{len(same)} reinstalled at the same version"
        if rebuilt:
            line += f", {len(rebuilt)} of them with other bytes"
            if not verbose:
                names = sorted(rebuilt)
                line += ": " + ", ".join(names[:8]) + (" …" if len(names) > 8 else "")
        # Words only (names, no versions): wrapped between words at the terminal's width.
        console.print(clean(line + ("" if verbose else " (--verbose lists them)"), lines=False),
                      markup=False, highlight=False)
        if verbose:
            for name in sorted(same):
                _plain(console, f"  {'same':<10} {name}: {same[name]}" + ("  (other bytes)" if name in rebuilt else ""))
    if unchanged:
        console.print(f"{unchanged} package(s) unchanged")
    links = [(p.name, p.compare_url) for p in real if p.compare_url]
    if links:
        console.print("compare:")
        for name, url in links:
            _plain(console, f"  {name}: {url}")


def print_diff(console: Console, diff: str) -> None:
    """A unified diff: coloured on a terminal (control characters made visible); elsewhere
    (a file, a pipe) its text exactly as it is, never wrapped, as `git diff` writes it — so
    `rewheel diff … > x.patch` applies with `git apply` and `patch`."""
    if console.is_terminal:
        from rich.syntax import Syntax

        console.print(Syntax(clean(diff), "diff", theme="ansi_dark", word_wrap=True))
        return
    text = diff if diff.endswith("\n") else diff + "\n"
    buffer = getattr(console.file, "buffer", None)
    console.file.flush()
    if buffer is not None:  # the bytes of a file that was not UTF-8 go out as they were read
        buffer.write(text.encode("utf-8", "surrogateescape"))
        buffer.flush()
    else:
        console.file.write(text)


def render_diff(console: Console, result, *, stat_only: bool = False, verbose: bool = False) -> None:  # diff.DiffResult
    from rich.text import Text

    console.print(f"[bold]diff {escape(result.old)} → {escape(result.new)}[/]")
    render_package_changes(console, result.packages, result.unchanged_packages, verbose=verbose)
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
    shown = [f.diff for f in result.files if f.diff]
    if shown and result.patch_base:
        # The patch's header (before its first `---`: git apply and patch skip it): the one
        # folder every path below is relative to.
        import shlex

        _plain(console, f"# patch: paths relative to {result.patch_base}; apply there: "
                        f"cd {shlex.quote(result.patch_base)} && git apply FILE")
    for diff in shown:
        print_diff(console, diff)
    h = result.stats
    if h.get("hashed_files"):
        console.print(f"[dim]{h['hashed_files']} file(s) hashed ({human_bytes(h['hashed_bytes'])}); "
                      f"the rest known from the manifest and RECORDs[/]")


def render_patches(console: Console, scan, *, target: str = "TARGET") -> None:  # patches.PatchScan
    st = scan.stats
    if not scan.patches:
        console.print(f"[bold green]no local patches[/] in {escape(scan.prefix)} "
                      f"({st.get('files_checked', 0):,} files of {st.get('distributions', 0)} "
                      f"distributions checked, {st.get('files_hashed', 0)} hashed)")
    else:
        # Through the layout that never cuts: a file path, a distribution's version whole.
        rows = [(p.kind + (" !" if p.shares_uv_cache_inode else ""), p.path, f"{p.distribution} {p.version}",
                 "binary" if p.binary else ("" if p.added_lines is None and p.removed_lines is None
                                            else f"+{p.added_lines or 0} -{p.removed_lines or 0}"),
                 p.pristine_source or ("-" if p.kind == "unlisted" else "none")) for p in scan.patches]
        if is_plain(console):
            for kind, path, dist, lines, source in rows:
                _plain(console, f"{kind}  {path}  {dist}  {lines}  pristine from {source}")
        else:
            _table_or_stack(console, f"local patches in {scan.prefix}",
                            ("kind", "file", "distribution", "lines", "pristine from"), rows, head=(1, 0, 3),
                            styles=["yellow" if p.kind == "modified" else "cyan" for p in scan.patches],
                            wrap=(2, 4))
        for p in scan.patches:
            console.print(f"[bold]{escape(p.path)}[/] ({p.kind}, {escape(p.distribution)} {escape(p.version)})")
            if p.diff:
                print_diff(console, p.diff)
            elif p.pristine_note:
                console.print(f"  [yellow]{escape(p.pristine_note)}[/]")
    for p in scan.patches:
        if p.shares_snapshot_inode:
            console.print(f"[bold red]warning:[/] {escape(p.path)} shares its inode with snapshot(s) "
                          f"{escape(', '.join(p.shares_snapshot_inode))} (a hard link): the patch, written in "
                          f"place, changed the snapshot's copy too")
    for d in scan.damaged_snapshots:
        console.print(f"[yellow]snapshot {escape(d['id'])}: {d['files']} stored file(s) were changed after the "
                      f"snapshot (edited in place); `rewheel verify {escape(target)}` names them, a rollback recovers their bytes "
                      f"first or refuses (exit 3)[/]")
    hazard = sorted({p.distribution for p in scan.patches if p.shares_uv_cache_inode})
    if hazard:
        console.print(f"[bold red]warning:[/] patched in place into files uv hard-linked from its cache "
                      f"({escape(', '.join(hazard))}): uv's cached copies carry the patch too, and a "
                      f"reinstall would link the patched bytes back. A rewheel run cleans these from "
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


# ---- layout: tables that never cut a version, hash or id ----
# `--plain` (or stdout not a terminal, e.g. a CI log): one fact per line, greppable. None:
# decided per console. Set once by the CLI.
PLAIN: bool | None = None

_PLAN_ORDER = {"upgrade": 0, "downgrade": 1, "install": 2, "remove": 3, "replace": 4}
_PLAN_LABEL = {"upgrade": "upgrade", "downgrade": "downgrade", "install": "add", "remove": "remove",
               "replace": "replace"}
_PLAN_STYLE = {"upgrade": "green", "downgrade": "yellow", "install": "cyan", "remove": "red"}


def is_plain(console: Console) -> bool:
    """One fact per line instead of tables: asked for (`--plain`), or not a terminal."""
    return PLAIN if PLAIN is not None else not console.is_terminal


def _plain(console: Console, text: str, style: str = "") -> None:
    """One line of text from outside rewheel, as it is: never markup, never cut or folded
    (a long line wraps at the terminal's edge and stays whole for grep and copy)."""
    console.print(clean(text, lines=False), style=style or None, markup=False, highlight=False,
                  soft_wrap=True)


def _plan_line(c) -> str:  # installer.PlannedChange
    """`  upgrade    vllm: 0.16.0rc2.dev313+g5719a4e4e → 0.16.0rc2.dev344+g8c1b3f2  (+31 builds)`"""
    kind = c.change
    arrow = f"{c.old} → {c.new}" if c.old and c.new else (f"{c.new}" if c.new else f"{c.old}")
    dist = c.dev_distance
    builds = f"  ({dist:+d} builds)" if isinstance(dist, int) and dist else ""
    return f"  {_PLAN_LABEL.get(kind, kind):<10} {c.name}: {arrow}{builds}"


def _builds(p) -> str:  # diff.PackageChange
    return "" if p.dev_distance is None else f"{p.dev_distance:+d}"


def _package_table(console: Console, packages: list) -> None:
    """Version changes: name, old, new, change, builds. The shas and the variant are parts of
    the versions, shown whole; compare links follow the table."""
    if is_plain(console):
        for p in packages:
            b = _builds(p)
            _plain(console, f"{p.name}: {p.old or '-'} → {p.new or '-'}  {p.change}"
                   + (f"  {b} builds" if b else ""))
        return
    rows = [(p.name, p.old or "-", p.new or "-", p.change, _builds(p)) for p in packages]
    styles = [_CHANGE_STYLE.get(p.change, "") for p in packages]
    _table_or_stack(console, "packages", ("package", "old", "new", "change", "builds"), rows,
                    head=(0, 3, 4), styles=styles, arrow=(1, 2))


def _table_or_stack(console: Console, title: str, columns: tuple[str, ...], rows: Sequence[tuple[str, ...]],
                    *, head: tuple[int, ...] = (0,), styles: list[str] | None = None,
                    arrow: tuple[int, int] | None = None, wrap: tuple[int, ...] = ()) -> None:
    """A table when it fits the console (no column squeezed, no cell cut or folded); else
    each row stacked: its `head` cells on one line, then one line per other cell (`arrow`:
    two cells shown as `old → new` on one line when that fits). Columns in `wrap` hold
    words (labels, lists of versions), which the table may wrap between words, never inside
    one."""
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    t = Table(title=clean(title, lines=False), title_justify="left")

    # Each column's width: its longest line; a word column (`wrap`) may go down to its
    # longest word. A table only when the table at those widths fits (one space of padding
    # each side, the borders); every column then gets an exact width, so rich never squeezes
    # or cuts one. What is left of the console's width goes to the word columns, up to their
    # longest line.
    def longest(j: int, words: bool) -> int:
        return max(cell_len(clean(piece)) for cell in (columns[j], *(row[j] for row in rows))
                   for piece in (str(cell).split() if words else str(cell).split("\n")))

    natural = [longest(j, False) for j in range(len(columns))]
    widths = [longest(j, True) if j in wrap else natural[j] for j in range(len(columns))]
    spare = console.width - (sum(widths) + 3 * len(columns) + 1)
    if spare >= 0:
        for j in wrap:
            more = min(spare, natural[j] - widths[j])
            widths[j] += more
            spare -= more
        for j, col in enumerate(columns):
            t.add_column(col, width=widths[j], no_wrap=j not in wrap)
        for i, row in enumerate(rows):
            t.add_row(*(Text(clean(cell)) for cell in row), style=(styles[i] if styles else "") or None)
        console.print(t)
        return
    _plain(console, f"{clean(title, lines=False)}:")
    width = console.width
    for i, row in enumerate(rows):
        style = (styles[i] if styles else "") or ""
        _plain(console, "  ".join(row[j] + (" builds" if columns[j] == "builds" else "")
                                  for j in head if row[j]), style=style)
        rest = [j for j in range(len(columns)) if j not in head]
        if arrow is not None:
            a, b = arrow
            both = f"    {row[a]} → {row[b]}"
            if len(both) <= width:
                _plain(console, both)
            else:
                _plain(console, f"    {columns[a]} {row[a]}")
                _plain(console, f"    {columns[b]} {row[b]}")
            rest = [j for j in rest if j not in arrow]
        for j in rest:
            for k, line in enumerate(str(row[j]).split("\n")):
                if line:
                    _plain(console, f"    {columns[j] + ':' if k == 0 else '':<{len(columns[j]) + 1}} {line}")


# ---- verify (rewheel.snapshot.integrity) ----
def strays_hint(target: str) -> str:
    """What to do about files a killed rewheel left in the environment (`target`: the CLI's
    reference, quoted for the shell)."""
    return (f"`rewheel resume {target}` finishes an interrupted run (and removes them); with no run to "
            "resume, delete them: nothing else uses them")


def render_verify(console: Console, res) -> None:  # snapshot.StoreVerify
    how = "every stored file hashed" if res.full else "size and mtime of every stored file"
    if not res.results:
        console.print(f"no snapshots of {escape(res.target)} to verify")
    for r in res.results:
        if r.manifest_error is not None:
            console.print(f"[bold red]snapshot {escape(r.snapshot_id)}: damaged[/]: {escape(r.manifest_error)}")
            continue
        if r.ok:
            extra = f", {human_bytes(r.bytes_hashed)} hashed" if r.full else ""
            console.print(f"[green]snapshot {escape(r.snapshot_id)}: ok[/] ({r.files_checked:,} files, {how}{extra}, "
                          f"{r.seconds:.2f}s)")
            continue
        console.print(f"[bold red]snapshot {escape(r.snapshot_id)}: {len(r.damaged)} of {r.files_checked:,} "
                      f"stored files damaged[/] ({how})")
        for d in r.damaged[:20]:
            found = ""
            if d.problem == "changed" and d.found_size is not None:
                what = []
                if d.found_size != d.size:
                    what.append(f"size {d.found_size:,} where {d.size:,} was stored")
                if d.found_mtime_ns is not None and d.size == d.found_size:
                    what.append("its mtime moved")
                found = f" ({', '.join(what)})" if what else ""
            why = {"changed": "changed after the snapshot" + found,
                   "sha256 differs": "its bytes differ from the recorded sha256 (its size and mtime do not)"
                   }.get(d.problem, d.problem)
            shared = " — a hard link shared with the environment: edited in place?" if d.shared else ""
            stored = f"the stored copy {d.stored_at}" if d.stored_at else "its stored copy"
            console.print(f"  {escape(r.display(d))}: {escape(stored)}: {escape(why)}{shared}")
        if len(r.damaged) > 20:
            console.print(f"  … and {len(r.damaged) - 20} more (`--json` lists them all)")
    if res.strays:
        console.print(f"[bold red]{len(res.strays)} file(s) a killed rewheel left inside the environment[/] "
                      "(a restore's staging folder, an unshare's or a patch's copy): not the environment's own")
        for p in res.strays:
            console.print(f"  {escape(p)}")
        console.print(escape(strays_hint(res.target)))
    if any(not r.ok for r in res.results):
        console.print("a rollback to a damaged snapshot recovers the files' bytes from the environment, uv's "
                      "cache or the recipe's index before it stops anything, and refuses (exit 3) when none "
                      "has them")


def render_rollback_more(console: Console, result) -> None:  # results.RollbackResult
    """What a rollback adds to the restore: how to undo it, what retention pruned, and why a
    service that did not come back failed."""
    if result.undo_snapshot_id:
        console.print(f"  the state it replaced is snapshot {escape(result.undo_snapshot_id)}: "
                      f"`rewheel rollback {escape(result.target or 'TARGET')} {escape(result.undo_snapshot_id)}"
                      f"{' --force' if result.undo_needs_force else ''}` undoes this rollback")
    elif result.undo_snapshot_error == UNDO_SKIPPED:
        console.print("  the state it replaced was not snapshotted (--no-undo): this rollback cannot be undone")
    elif result.undo_snapshot_error:
        console.print(f"  [yellow]the state it replaced could not be snapshotted "
                      f"({escape(result.undo_snapshot_error)}): this rollback cannot be undone[/]")
    if result.superseded_runs:
        console.print(f"  closed interrupted runs it superseded: {escape(', '.join(result.superseded_runs))}")
    if result.pruned:
        console.print(f"  pruned old snapshots: {escape(', '.join(result.pruned))}")
    if result.status != RollbackStatus.RESTORED:
        console.print("[bold red]the service did not come back healthy[/]")
        render_root_cause(console, result.root_cause)


def render_pin(console: Console, result) -> None:  # results.PinResult
    s = result.snapshot
    what = "pinned" if result.pinned else "unpinned"
    console.print(f"snapshot {escape(s.id)} ({escape(s.label or s.status)}) "
                  + (f"is now {what}" if result.changed else f"was already {what}")
                  + (": `\\[snapshots] keep` never prunes it" if result.pinned else ""))


def render_forget(console: Console, result) -> None:  # results.ForgetResult
    s = result.snapshot
    console.print(f"removed snapshot {escape(s.id)} ({escape(s.label or s.status)}, {s.created_iso}); "
                  f"{human_bytes(s.bytes_copied)} of copies freed (shared files stay where they are linked)")


def render_history_marks(console: Console, hist) -> None:  # results.History
    """Below the history's tables: which snapshots are pinned, which hold failed builds."""
    pinned = [s.id for s in hist.snapshots if s.pinned]
    failed = [s.id for s in hist.snapshots if s.failed_build]
    if pinned:
        console.print(f"pinned (never pruned): {escape(', '.join(pinned))}")
    if failed:
        console.print(f"failed builds (restored only with --force: `rewheel rollback {escape(hist.target)} "
                      f"{escape(failed[0])} --force`): {escape(', '.join(failed))}")


def running_text(doc: dict) -> str:
    """`running now: rewheel run (pid 4242), run 20261205-…, step smoke, since 09:20:01 (35s ago)`:
    a live rewheel holding the environment (status.running_now)."""
    import time as _time

    text = f"running now: rewheel {doc.get('purpose')} (pid {doc.get('pid')})"
    if doc.get("run_id"):
        text += f", {doc.get('kind')} {doc['run_id']}, step {doc.get('step')}"
    elif doc.get("purpose") == "run":
        text += ", preparing (no step journaled yet)"
    if doc.get("since"):
        ago = max(0.0, _time.time() - float(doc["since"]))
        text += f", since {_time.strftime('%H:%M:%S', _time.localtime(doc['since']))} ({ago:.0f}s ago)"
    return text + ": not interrupted; wait for it to finish"


def render_status(console: Console, st) -> None:  # status.Status
    """`rewheel status`: one fact a line, the most urgent first."""
    console.print(f"[bold]{escape(st.target)}[/]: {escape(st.prefix)}")
    if st.running:
        console.print(f"[yellow]{escape(running_text(st.running))}[/]")
    if st.interrupted:
        r = st.interrupted
        console.print(f"[bold red]interrupted {escape(r['kind'])} {escape(r['id'])}[/] (last step: "
                      f"{escape(r.get('last_step') or 'start')}): `rewheel resume {escape(st.target)}`"
                      + (f" or `rewheel rollback {escape(st.target)}`" if st.snapshots else "") + " first")
    shown = ", ".join(f"{n} {v or 'not installed'}" for n, v in st.key_packages.items())
    console.print(f"  versions: {escape(shown) or 'no key packages installed'}")
    if st.equals is not None:
        e = st.equals
        console.print(f"  equals snapshot {escape(e.id)} ({escape(e.label or e.status)}, {e.created_iso})"
                      + (f"; also {escape(', '.join(st.also_equal))}" if st.also_equal else ""))
    elif st.same_versions:
        # Only the versions match: never called "equals".
        for o in st.same_versions[:3]:
            console.print(f"  same versions as snapshot {escape(o['id'])} ({escape(o['label'])}"
                          + (", a failed build" if o["failed_build"] else "") + "), but "
                          + (f"its files differ ({escape(o['differs'])})" if o["differs"] else "its files were not compared"))
    elif st.newest is not None:
        n = st.newest
        console.print(f"  equals no snapshot; {len(st.differs_from_newest)} distribution(s) differ from the "
                      f"newest, {escape(n.id)} ({escape(n.label or n.status)}):")
        for c in st.differs_from_newest[:10]:
            console.print(f"    {escape(c.name)} {escape(c.old or '-')} → {escape(c.new or '-')} ({c.change})")
        if len(st.differs_from_newest) > 10:
            console.print(f"    … and {len(st.differs_from_newest) - 10} more (`rewheel diff {escape(st.target)} {n.id}` "
                          "shows all)")
    else:
        console.print(f"  no snapshots yet (`rewheel snapshot {escape(st.target)}` takes one)")
    if st.last_run:
        r = st.last_run
        console.print(f"  last command: {escape(r['kind'])} {escape(r['id'])}: {escape(r['status'])}")
    if st.service is not None:
        s = st.service
        h = s.get("health")
        health = "" if h is None else (", healthy" if h["ok"] else f", [red]not healthy[/] ({escape(h['detail'])})")
        console.print(f"  service: {escape(s['describe'])} is {escape(s['state'])}{health}"
                      + (f" ({escape(s['error'])})" if s.get("error") else ""))
    console.print(f"  snapshots: {st.snapshots}"
                  + (f"; pinned: {escape(', '.join(st.pinned))}" if st.pinned else "")
                  + (f"; failed builds: {escape(', '.join(st.failed_builds))}" if st.failed_builds else ""))
    if st.damaged:
        console.print(f"  [bold red]damaged snapshots: {escape(', '.join(st.damaged))}[/]")
    if st.strays:
        console.print(f"  [bold red]{len(st.strays)} file(s) a killed rewheel left inside the environment[/]: "
                      f"{escape(', '.join(st.strays[:5]))}" + (" …" if len(st.strays) > 5 else ""))
        console.print(f"  {escape(strays_hint(st.target))}")


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


def render_pruned(console: Console, pruned: list[str]) -> None:
    """The snapshots `[snapshots] keep` removed (a kept run's report)."""
    if pruned:
        console.print(f"  pruned old snapshots (\\[snapshots] keep): {escape(', '.join(pruned))}")
# ---- suspects (rewheel.suspects) ----
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


# ---- the consoles: fitted to a terminal, never wrapped elsewhere ----
# A line's indent, with the gutter of a tool's streamed output (`  │ `): kept on the lines a
# long line is wrapped onto.
_INDENT = re.compile(r" *(?:│ )?")
_CONSOLE_CLASS: type | None = None


def fitted_console(**kw: object) -> Console:
    """A rich Console for rewheel's human text. On a terminal every line of text is fitted to
    its width: wrapped between words only, the continuation indented like the line (two more
    spaces), a word or path longer than the room never cut (it gets a line of its own). On
    anything else (a pipe, a file, a CI log) nothing is wrapped: each line is written whole,
    whatever COLUMNS says, so a diff applies and grep finds a path."""
    global _CONSOLE_CLASS
    if _CONSOLE_CLASS is None:
        _CONSOLE_CLASS = _make_console_class()
    return _CONSOLE_CLASS(**kw)  # type: ignore[no-any-return]


def _make_console_class() -> type:
    from rich.console import Console as RichConsole
    from rich.text import Text

    class Fitted(RichConsole):
        def print(self, *objects: object, sep: str = " ", end: str = "\n", style: object = None,  # type: ignore[override]
                  markup: bool | None = None, highlight: bool | None = None, soft_wrap: bool | None = None,
                  **kw: object) -> None:
            if not self.is_terminal:  # never wrapped: each line whole
                super().print(*objects, sep=sep, end=end, style=style, markup=markup,  # type: ignore[arg-type]
                              highlight=highlight, soft_wrap=True, **kw)  # type: ignore[arg-type]
                return
            if not objects or not all(isinstance(o, (str, Text)) for o in objects) or kw.get("width"):
                super().print(*objects, sep=sep, end=end, style=style, markup=markup,  # type: ignore[arg-type]
                              highlight=highlight, soft_wrap=soft_wrap, **kw)  # type: ignore[arg-type]
                return
            text = Text(end="")
            for i, o in enumerate(objects):
                if i:
                    text.append(sep)
                text.append(o if isinstance(o, Text) else self.render_str(
                    shorten_paths(self, str(o)), markup=markup, highlight=False, emoji=False))
            lines = [piece for line in text.split("\n", allow_blank=True)
                     for piece in fit_text(line, self.width)]
            for i, line in enumerate(lines):
                super().print(line, style=style, end=end if i == len(lines) - 1 else "\n",  # type: ignore[arg-type]
                              soft_wrap=True, highlight=False, markup=False, emoji=False)

    return Fitted


# An absolute path in a message: not part of a URL (`http://host/x`) or of another path.
_ABS_PATH = re.compile(r"(?<![\w~.:/\\])/(?:[\w.@+-]+/)*[\w.@+-]+")


def shorten_paths(console: Console, text: str) -> str:
    """The absolute paths in a message, as `show_path` shows them on a terminal (relative to
    the current folder, else `~/…`): what keeps a line's paths whole at 80 columns, and
    still pastes from where the command ran. Elsewhere the text as it is."""
    if not console.is_terminal or "/" not in text:
        return text
    return _ABS_PATH.sub(lambda m: show_path(console, m.group()), text)


def fit_text(line, width: int) -> list:  # rich.text.Text -> list[Text]
    """One line of text wrapped to `width` between words (spaces) only; continuation lines
    carry the line's indent (and its `│ ` gutter) and two more spaces. A word longer than the
    room is never cut: it starts its own line, at the indent when it fits there, else at the
    line's start (only a word longer than the whole width overflows)."""
    from rich.cells import cell_len
    from rich.text import Text

    plain = line.plain
    if cell_len(plain) <= width:
        return [line]
    indent = _INDENT.match(plain).group()  # type: ignore[union-attr]
    cont = indent + "  "
    # The words (after the indent): their [start, end) offsets in `plain`.
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", plain[len(indent):])]
    words = [(s + len(indent), e + len(indent)) for s, e in words]
    out: list[Text] = []
    cur: Text | None = None
    cur_len = 0
    first = True
    prev_end = 0
    for s, e in words:
        piece = line[s:e]
        n = cell_len(piece.plain)
        gap = plain[prev_end:s]  # the spaces as written: columns of a plain line stay apart
        prev_end = e
        if cur is not None and cur_len + len(gap) + n <= width:
            cur.append(gap)
            cur.append(piece)
            cur_len += len(gap) + n
            continue
        if cur is not None:
            out.append(cur)
        lead = indent if first else cont
        if cell_len(lead) + n > width:
            lead = ""
        cur = Text(lead)
        cur.append(piece)
        cur_len = cell_len(lead) + n
        first = False
    if cur is not None:
        out.append(cur)
    return out or [line]
