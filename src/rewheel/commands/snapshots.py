"""The snapshot commands (snapshot, history, pin and unpin, forget), and what the other
commands ask of the store: which snapshots pruning must keep, which pre-upgrade snapshots
belong to upgrades still in place, whether the live environment already is a snapshot."""

from __future__ import annotations

from rewheel import journal
from rewheel.commands.results import ForgetResult, History, PinResult, SnapshotCommandResult
from rewheel.commands.target import Target
from rewheel.errors import SnapshotDamaged, SnapshotError
from rewheel.journal import EnvLock
from rewheel.snapshot import Progress, RestoreResult, SnapshotMeta, Store, take_snapshot
from rewheel.statuses import Finished


def protected_snapshots(store: Store, keep: int | None = None) -> set[str]:
    """Snapshots retention never prunes (besides the pinned ones and the newest `keep`): those
    a pending rollback may need — of unfinished runs, and the newest pre-upgrade one (the
    default rollback target) — and, given `keep`, every snapshot a run, rollback or resume
    took (and named in its report: the `diff` of a failed build, an undo point) until more
    than `keep` runs have started after it: what a report printed works through the next
    `keep` runs, whatever else is taken meanwhile."""
    runs = journal.list_runs(store.env_dir)
    metas = store.list()
    protect = {j.snapshot_id for j in runs if not j.finished and j.snapshot_id}
    pre = upgrades_in_place(store, metas)
    if pre:
        protect.add(pre[0].id)
    if keep is not None:
        # (every run started after it counts, the one pruning now included)
        started = [j.records[0].time for j in runs if j.kind == "run" and j.records]
        protect |= {m.id for m in metas if m.run_id and sum(t > m.created for t in started) <= keep}
    return {k for k in protect if k}


def pruned_text(store: Store, ids: list[str]) -> str:
    """`3f2a9c1e (before run …), 8d0b7e44 (failed upgrade of run …, a failed build)`."""
    def one(i: str) -> str:
        m = store.pruned_meta.get(i)
        if m is None:
            return i
        return f"{i} ({m.label or m.status}" + (", a failed build)" if m.failed_build else ")")
    return ", ".join(one(i) for i in ids)


def snapshot_now(t: Target, *, label: str = "", progress: Progress | None = None) -> SnapshotCommandResult:
    with EnvLock(t.store.env_dir, "snapshot", prefix=t.env.prefix):
        journal.refuse_if_interrupted(t.store.env_dir, t.cli_ref)
        res = take_snapshot(t.env, t.store, label=label, status="manual", progress=progress,
                            exclude=t.recipe.snapshot_exclude)
        pruned = t.store.prune(t.recipe.keep, protected_snapshots(t.store, t.recipe.keep) | {res.meta.id})
    return SnapshotCommandResult(res, pruned)


KEY_PACKAGES = ("vllm", "torch", "flashinfer-python", "transformers", "triton")


def history(t: Target) -> History:
    names = t.recipe.install.names
    names += [k for k in KEY_PACKAGES if k not in names]
    metas = t.store.list()
    from rewheel.snapshot.integrity import recorded_damage

    # The damage the last check found, not a check per call: one costs about a stat walk of
    # the environment per snapshot (seconds on a real vLLM store); `status` and `verify` check.
    from rewheel.status import running_now

    return History(t.cli_ref, metas, journal.list_runs(t.store.env_dir), names,
                   t.store.damaged(), {m.id: recorded_damage(m) for m in metas}, running_now(t))


# How a run ends whose upgrade is not in place: its pre-upgrade snapshot is what the
# environment already is again (or a rollback replaced it: `rolled-back`), so a plain rollback
# to it would undo nothing.
UNDONE_RUNS = (Finished.REVERTED, Finished.REJECTED, Finished.ABORTED, Finished.ROLLED_BACK)


def reverted_snapshots(store: Store, metas: list[SnapshotMeta]) -> set[str]:
    """The pre-upgrade snapshots of runs whose upgrade was undone (reverted, rejected, aborted,
    or closed by a rollback)."""
    undone = {j.id for j in journal.list_runs(store.env_dir) if j.status in UNDONE_RUNS}
    return {m.id for m in metas if m.status == "pre-upgrade" and m.run_id in undone}


def upgrades_in_place(store: Store, metas: list[SnapshotMeta]) -> list[SnapshotMeta]:
    """Pre-upgrade snapshots, newest first, of upgrades still in place."""
    reverted = reverted_snapshots(store, metas)
    return [m for m in metas if m.status == "pre-upgrade" and m.id not in reverted]


def still_the_snapshot(t: Target, snap: SnapshotMeta) -> bool:
    """Whether the environment still is the snapshot taken of it a moment ago (while its
    service served): one stat walk that compares every entry with what the snapshot recorded
    of it, live inode and ctime included (`capture_walk.unchanged_since`), stopping at the
    first difference; a snapshot from an older rewheel is compared as `verify` does."""
    from rewheel.snapshot.capture_walk import unchanged_since

    same = unchanged_since(t.env, t.store, snap)
    return env_matches(t, snap) if same is None else same


def env_matches(t: Target, snap: SnapshotMeta) -> bool:
    """Whether the live environment already is the snapshot (the comparison `verify` makes:
    type, size, mtime, mode, link target of every entry; no extra, none missing), so that a
    restore would change no byte. Raises what makes the snapshot unusable here (another
    environment's snapshot, a damaged store), before anything is stopped."""
    from rewheel.errors import RestoreError
    from rewheel.snapshot import verify

    try:
        verify(t.env, snap)
    except (SnapshotDamaged, SnapshotError):
        raise
    except RestoreError:
        return False  # it differs: the restore has work to do
    except Exception:
        return False  # unsure: behave as for a restore that changes files
    return True


def restore_changed(res: RestoreResult) -> bool:
    return bool(res.written or res.deleted or res.chmodded or res.folders_rebuilt or res.displaced)


def set_pinned(t: Target, ref: str, pinned: bool) -> PinResult:
    """Pin (or unpin) one snapshot: a pinned one is never pruned by `[snapshots] keep` and
    never forgotten until unpinned. Only its meta.json changes (atomically, under the
    environment's lock, so that no prune runs meanwhile); allowed while a run is
    interrupted, since protecting a snapshot is what an operator may want first."""
    with EnvLock(t.store.env_dir, "unpin" if not pinned else "pin", prefix=t.env.prefix):
        snap = t.store.get(ref)
        changed = snap.pinned != pinned
        if changed:
            if pinned:
                snap.extra["pinned"] = True
            else:
                snap.extra.pop("pinned", None)
            snap.save()
    return PinResult(snap, pinned, changed)


def forget_target(t: Target, ref: str) -> SnapshotMeta:
    """The snapshot `forget` would remove, refused (exit 2, SnapshotError) when it is pinned
    or an unfinished run still needs it: for the question, before anything is deleted."""
    snap = t.store.get(ref)
    if snap.pinned:
        raise SnapshotError(f"snapshot {snap.id} ({snap.label or snap.status}) is pinned: not removed",
                            hint=f"`rewheel unpin {t.cli_ref} {snap.id}` first; nothing was changed")
    needed = {j.snapshot_id for j in journal.list_runs(t.store.env_dir) if not j.finished and j.snapshot_id}
    if snap.id in needed:
        raise SnapshotError(f"snapshot {snap.id} ({snap.label or snap.status}) is the one an interrupted run "
                            "restores: not removed",
                            hint=f"`rewheel resume {t.cli_ref}` or `rewheel rollback {t.cli_ref}` first; "
                                 "nothing was changed")
    return snap


def forget(t: Target, ref: str) -> ForgetResult:
    """Remove one snapshot from the store (an atomic rename, then the delete): its shared
    files stay in the environment and in the other snapshots that link them."""
    with EnvLock(t.store.env_dir, "forget", prefix=t.env.prefix):
        snap = forget_target(t, ref)
        t.store.delete(snap.id)
    return ForgetResult(snap)
