"""`rewheel status`: where an environment stands, cheaply, without changing anything.

Owns the status report: the live versions of the key packages, which snapshot the live
environment equals — the snapshots with the same distributions (every version and wheel hash,
as `diff` compares them), good builds before failed ones, proven by the stat walk `verify`
makes (type, size, mtime, mode, link target of every entry; a file whose mtime alone moved is
hashed) — or has the same versions as while its files differ, or how far it is from the newest
snapshot, a command running now (the environment's lock) or an interrupted one (its
journal), the service's state and one health request (with a recipe), and the pinned,
failed-build and damaged snapshots. It takes no lock: a run may start meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewheel import journal
from rewheel.records import Started

if TYPE_CHECKING:
    from rewheel.diff import PackageChange
    from rewheel.commands.target import Target
    from rewheel.snapshot import SnapshotMeta

HEALTH_TIMEOUT_S = 3.0  # one request, not a readiness wait: status must answer at once


def _brief(m: SnapshotMeta | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {"id": m.id, "label": m.label, "status": m.status, "created": m.created_iso}


@dataclass
class Status:
    target: str
    prefix: str
    python: str
    key_packages: dict[str, str | None]
    # The snapshot the live environment is, file for file (good builds first, then the newest),
    # and any other one proven so.
    equals: SnapshotMeta | None
    also_equal: list[str]
    newest: SnapshotMeta | None
    # What differs between the newest snapshot and the live environment (when it equals none).
    differs_from_newest: list[PackageChange]
    running: dict[str, Any] | None
    interrupted: dict[str, Any] | None
    last_run: dict[str, Any] | None
    service: dict[str, Any] | None
    pinned: list[str] = field(default_factory=list)
    failed_builds: list[str] = field(default_factory=list)
    # Snapshots whose stored bytes are damaged: filled by `damaged_snapshots`.
    damaged: list[str] = field(default_factory=list)
    snapshots: int = 0
    # Snapshots with the live versions whose files differ: {"id", "label", "failed_build", "differs"}
    # (the first difference; None: not walked, beyond MAX_WALKS).
    same_versions: list[dict[str, Any]] = field(default_factory=list)
    # Files a killed rewheel left inside the environment (snapshot.tree.strays).
    strays: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "prefix": self.prefix, "python": self.python,
                "key_packages": self.key_packages, "equals": _brief(self.equals), "also_equal": self.also_equal,
                "newest": _brief(self.newest),
                "differs_from_newest": [c.to_json() for c in self.differs_from_newest],
                "running": self.running, "interrupted": self.interrupted, "last_run": self.last_run,
                "service": self.service, "pinned": self.pinned, "failed_builds": self.failed_builds,
                "damaged": self.damaged, "snapshots": self.snapshots, "same_versions": self.same_versions,
                **({"strays": self.strays} if self.strays else {})}


def damaged_snapshots(t: Target, snaps: list[SnapshotMeta]) -> list[str]:
    """Snapshots `status` flags as damaged: those whose meta.json cannot be read, and those
    whose stored bytes an edit in place changed (the fast check of `verify`: a stat per
    stored file, as `history` does; no byte read)."""
    from rewheel.snapshot import damaged_files

    edited = damaged_files(snaps)
    return t.store.damaged() + [m.id for m in snaps if edited.get(m.id)]


# Stat walks of the environment `status` makes at most (each about a second on a real vLLM
# environment): the candidates beyond are listed as having the same versions, unproven.
MAX_WALKS = 3


def _difference(t: Target, snap: SnapshotMeta) -> str | None:
    """None when the live environment is the snapshot (what `verify` compares); else its
    first difference (`content differs: …/core.py`)."""
    from rewheel.errors import RestoreError
    from rewheel.snapshot import verify

    try:
        verify(t.env, snap)
    except RestoreError as exc:
        text = exc.message.split(": ", 1)[-1] if "does not match" in exc.message else exc.message
        return text.split("; ")[0]
    except Exception as exc:  # noqa: BLE001 - unsure: never claimed equal
        return f"could not compare: {exc}"
    return None


def _equal_snapshots(t: Target, same: list[SnapshotMeta]) -> tuple[list[SnapshotMeta], list[dict[str, Any]]]:
    """Of the snapshots with the live versions, (those proven equal, the others with their
    first difference): good builds before failed ones, newest first, at most MAX_WALKS walks."""
    ordered = sorted(same, key=lambda m: (m.failed_build, -m.created))
    proven: list[SnapshotMeta] = []
    others: list[dict[str, Any]] = []
    for i, m in enumerate(ordered):
        differs = _difference(t, m) if i < MAX_WALKS else None
        if i < MAX_WALKS and differs is None:
            proven.append(m)
        else:
            others.append({"id": m.id, "label": m.label or m.status, "failed_build": m.failed_build,
                           "differs": differs})
    return proven, others


def _process_started(pid: Any) -> float | None:
    """When a process started (epoch seconds), from /proc; None when unknown."""
    import os

    from rewheel import proc

    try:
        ticks = proc.start_time(int(pid))
        with open("/proc/stat", encoding="ascii") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK") if ticks is not None else None
    except (OSError, ValueError, TypeError, StopIteration):
        return None


def running_now(t: Target) -> dict[str, Any] | None:
    """The rewheel command holding the environment's lock now (read without taking it): its
    pid and purpose, and — for a run, a rollback or a resume — the journal it is writing: its
    id, kind, current step and since when (epoch seconds); `step` is null while a staged run
    still prepares (its journal starts at the stop). None when no live rewheel holds it: an
    unfinished journal is then an interrupted one."""
    holder = journal.EnvLock(t.store.env_dir, "status", prefix=t.env.prefix).holder_now()
    if holder is None:
        return None
    doc: dict[str, Any] = {"pid": holder.get("pid"), "purpose": holder.get("purpose"), "run_id": None,
                           "kind": None, "step": None, "since": _process_started(holder.get("pid"))}
    # The live holder's journal is the newest unfinished one (a rollback or a resume that
    # finishes an interrupted run writes its own, newer).
    live = journal.interrupted_run(t.store.env_dir)
    if live is not None:
        started = live.first(Started)
        doc.update(run_id=live.id, kind=live.kind, step=live.last_step or "start",
                   since=(started.time if started else None) or doc["since"])
    return doc


def interrupted_now(t: Target) -> Any:  # journal.RunJournal | None
    """The interrupted run a read-only command reports (and exits 4 for): an unfinished
    journal whose rewheel is gone — never the one a live rewheel is writing."""
    if running_now(t) is not None:
        return None
    return journal.interrupted_run(t.store.env_dir)


def _service(t: Target) -> dict[str, Any] | None:
    """The service's state (its manager's view) and one request to its health URL."""
    import httpx

    spec = t.recipe.service
    if spec is None:
        return None
    mgr = t.host.manager(spec, t.store.env_dir, t.recipe.python)
    doc: dict[str, Any] = {"describe": mgr.describe()}
    try:
        st = mgr.status()
        doc.update(state=st.state, up=st.up, judged_by=st.judged_by, main_pid=st.main_pid,
                   n_restarts=st.n_restarts)
    except Exception as exc:  # noqa: BLE001 - systemctl missing or failing: say so, go on
        doc.update(state="unknown", up=None, error=getattr(exc, "message", None) or str(exc))
    health: dict[str, Any] | None = None
    if spec.health_url:
        try:
            client = t.host.client or httpx
            r = client.get(spec.health_url, timeout=HEALTH_TIMEOUT_S)
            health = {"url": spec.health_url, "ok": r.status_code == 200, "detail": f"HTTP {r.status_code}"}
        except httpx.HTTPError as exc:
            health = {"url": spec.health_url, "ok": False, "detail": f"{type(exc).__name__}: {exc}"}
    doc["health"] = health
    return doc


def status(t: Target) -> Status:
    """Where the target's environment stands: metadata (dist-info, meta.json, journals, the
    lock file), a stat walk per snapshot with the live versions (at most MAX_WALKS), the
    service's state and one health request."""
    from packaging.utils import canonicalize_name

    from rewheel import diff as diffmod
    from rewheel.commands.snapshots import KEY_PACKAGES
    from rewheel.snapshot.tree import scope_of, strays

    dists = [d.to_json() for d in t.env.distributions()]
    live: dict[str, str] = {canonicalize_name(d["name"]): d["version"] for d in dists}
    wanted = t.recipe.install.names
    names = wanted + [k for k in KEY_PACKAGES if k not in wanted]
    # The recipe's packages always (null: not installed); the usual key packages when present.
    key = {n: live.get(n) for n in names if n in live or n in wanted}
    snaps = t.store.list()
    same = [m for m in snaps if not diffmod.diff_versions(m.distributions, dists)]
    equal, same_versions = _equal_snapshots(t, same)
    newest = snaps[0] if snaps else None
    # How far from the newest snapshot, when no snapshot has the live versions.
    differs = [] if newest is None or same else diffmod.diff_versions(newest.distributions, dists)
    runs = journal.list_runs(t.store.env_dir)
    running = running_now(t)
    # A journal a live rewheel is writing is running, not interrupted.
    interrupted = None if running is not None else next((r for r in runs if not r.finished and r.records), None)
    last = next((r for r in runs if r.finished), None)
    return Status(
        target=t.cli_ref, prefix=str(t.env.prefix), python=str(t.env.python), key_packages=key,
        equals=equal[0] if equal else None, also_equal=[m.id for m in equal[1:]], newest=newest,
        differs_from_newest=differs, running=running,
        interrupted=interrupted.summary() if interrupted else None,
        last_run=last.summary() if last else None, service=_service(t),
        pinned=[m.id for m in snaps if m.pinned], failed_builds=[m.id for m in snaps if m.failed_build],
        damaged=damaged_snapshots(t, snaps), snapshots=len(snaps), same_versions=same_versions,
        strays=strays(scope_of(t.env)))
