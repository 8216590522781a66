"""Rendering of the snapshot store and the environment's state: `snapshot`, `history`,
`rollback`, `verify`, `pin`, `forget`, `status`, and what retention pruned."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewheel.report.diagnosis import render_root_cause
from rewheel.report.layout import _plain, _table_or_stack, is_plain
from rewheel.report.text import escape, human_bytes, render_downtime
from rewheel.statuses import UNDO_SKIPPED, RollbackStatus

if TYPE_CHECKING:  # rich is imported by the renderers that run, not with this module
    from rich.console import Console


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


def render_pruned(console: Console, pruned: list[str]) -> None:
    """The snapshots `[snapshots] keep` removed (a kept run's report)."""
    if pruned:
        console.print(f"  pruned old snapshots (\\[snapshots] keep): {escape(', '.join(pruned))}")


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
