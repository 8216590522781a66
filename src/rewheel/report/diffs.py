"""Rendering of what changed between two states (rewheel.diff, rewheel.patches): the package
table of a diff or a run, the file list and unified diffs of `rewheel diff`, and the local
patches of `rewheel patches`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewheel.report.layout import _plain, _table_or_stack, is_plain
from rewheel.report.text import clean, escape, human_bytes

if TYPE_CHECKING:  # rich is imported by the renderers that run, not with this module
    from rich.console import Console


_CHANGE_STYLE = {"upgraded": "green", "downgraded": "yellow", "added": "cyan", "removed": "red",
                 "reinstalled": "magenta", "changed": "yellow", "mode": "dim"}


_FILE_MARK = {"added": "A", "removed": "D", "changed": "M", "mode": "m"}


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
