"""`rewheel why LOG --run ID | --snapshot A`: the suspects of a log's root cause, from an
upgrade rewheel recorded in any environment it keeps state for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rewheel.environment import inspect_prefix
from rewheel.errors import SnapshotError
from rewheel.journal import RunJournal
from rewheel.paths import known_environments, state_home
from rewheel.snapshot import SnapshotMeta, Store
from rewheel.records import FailedSnapshot, Started


def suspects_for(diag: Any, *, run_id: str | None = None, snapshot: str | None = None,
                 home: Path | None = None) -> None:
    """Set the suspects of `diag`'s root cause from an upgrade rewheel knows: a run (`run_id`:
    its pre-upgrade snapshot against the failed state it kept, else the live environment;
    the local patches it saved), or a snapshot (`snapshot`: it against the live environment
    of its environment). Raises UsageError when the run or snapshot is nowhere."""
    from rewheel import diff as diffmod
    from rewheel import suspects as suspectsmod
    from rewheel.errors import UsageError
    from rewheel.recipe import load_recipe

    root = getattr(diag, "root", None)
    home = home or state_home()
    found: list[tuple[Store, SnapshotMeta, SnapshotMeta | None, Path | None, Path]] = []
    for env_dir, prefix in known_environments(home):
        if run_id is not None:
            rdir = env_dir / "runs" / run_id
            if not (rdir / "journal.jsonl").is_file():
                continue
            j = RunJournal.load(rdir)
            if j.snapshot_id is None:
                raise UsageError(f"run {run_id} took no snapshot: there is no upgrade to compare the crash with",
                                 hint=f"its journal: {rdir / 'journal.jsonl'}")
            store = Store(prefix, home)
            kept = j.first(FailedSnapshot)
            failed = kept.failed_snapshot_id if kept else None
            found.append((store, store.get(j.snapshot_id), store.get(failed) if failed else None, rdir, prefix))
        else:
            assert snapshot is not None
            store = Store(prefix, home)
            try:
                found.append((store, store.get(snapshot), None, None, prefix))
            except SnapshotError:
                continue
    what = f"run {run_id}" if run_id is not None else f"snapshot {snapshot!r}"
    if not found:
        envs = [f"`rewheel history --python {p}/bin/python`" for _, p in known_environments(home)][:3]
        raise UsageError(f"no {what} in {home}",
                         hint=" or ".join(envs) + " lists the runs and snapshots" if envs
                         else "rewheel has recorded no run or snapshot here yet")
    if len(found) > 1:
        raise UsageError(f"{what} is ambiguous: it exists for " + ", ".join(str(f[4]) for f in found),
                         hint=f"give the full snapshot id (`rewheel history --python {found[0][4]}/bin/python` "
                              "lists them)")
    if root is None or not root.frames:
        return
    store, old, new, run_dir, prefix = found[0]
    env = inspect_prefix(prefix)
    d = diffmod.diff_trees(env, old, new, skip={str(store.home)})
    patches: list[suspectsmod.SavedPatch] = []
    patch_files: list[str] = []
    if run_dir is not None and (run_dir / "patches" / "patches.json").is_file():
        import json

        started = RunJournal.load(run_dir).first(Started)
        recipe_path = started.recipe if started else None
        policy = None
        try:
            policy = load_recipe(recipe_path, check_interpreter=False).patch_policy if recipe_path else None
        except Exception:  # a recipe moved or changed since: its patches count as removed
            policy = None
        if policy != "reapply":
            saved = json.loads((run_dir / "patches" / "patches.json").read_text(encoding="utf-8")).get("patches", [])
            patches = [suspectsmod.SavedPatch.from_json(p) for p in saved if isinstance(p, dict)]
            patch_files = [str(p) for p in sorted((run_dir / "patches").glob("*.patch"))]
    root.suspects = suspectsmod.find_suspects(
        root.frames, d.files, diffmod.change_texts(old, new), patches=patches, patch_files=patch_files,
        compare_urls={c.name: c.compare_url for c in d.packages if c.compare_url})
