"""Rendering of a run (rewheel.commands): `check`'s checks, the plan read before saying yes, a
run's report (its changes, patches, failure, revert, steps, downtime and verdict), a resume, and
`rewheel smoke`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewheel.report.diagnosis import render_root_cause
from rewheel.report.diffs import render_package_changes
from rewheel.report.layout import _plain, is_plain
from rewheel.report.snapshots import snapshot_cost
from rewheel.report.text import _arg, escape, human_bytes, render_downtime, show_path, typed_line
from rewheel.statuses import RunStatus

if TYPE_CHECKING:  # rich is imported by the renderers that run, not with this module
    from rich.console import Console


def render_check(console: Console, result) -> None:  # preflight.CheckResult
    for c in result.checks:
        mark = "[green]ok[/]  " if c.ok else "[bold red]FAIL[/]"
        console.print(f"{mark} {c.name}: {escape(c.detail)}")
    console.print("[bold green]recipe is ready[/]" if result.ok
                  else f"[bold red]{len(result.failures)} check(s) failed[/]")


_PLAN_ORDER = {"upgrade": 0, "downgrade": 1, "install": 2, "remove": 3, "replace": 4}


_PLAN_LABEL = {"upgrade": "upgrade", "downgrade": "downgrade", "install": "add", "remove": "remove",
               "replace": "replace"}


_PLAN_STYLE = {"upgrade": "green", "downgrade": "yellow", "install": "cyan", "remove": "red"}


def _plan_line(c) -> str:  # installer.PlannedChange
    """`  upgrade    vllm: 0.16.0rc2.dev313+g5719a4e4e → 0.16.0rc2.dev344+g8c1b3f2  (+31 builds)`"""
    kind = c.change
    arrow = f"{c.old} → {c.new}" if c.old and c.new else (f"{c.new}" if c.new else f"{c.old}")
    dist = c.dev_distance
    builds = f"  ({dist:+d} builds)" if isinstance(dist, int) and dist else ""
    return f"  {_PLAN_LABEL.get(kind, kind):<10} {c.name}: {arrow}{builds}"


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
