"""The board's page models: what each page shows, read from the state rewheel keeps — the
runs' journals (`journal`), the snapshots' metadata (`snapshot.store`), the verdicts `ci`
kept (`qualify.verdicts`), the bisections' journals (`bisection.journaled`) and the run
reports of a fleet (`fleet`). Plain data: nothing here renders or writes; the source diff
of a run is read by `source_diff` (in `diffs`) when its pages are written."""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from rewheel import journal
from rewheel.bisection import BisectResult
from rewheel.diagnose import RootCause
from rewheel.diff import PackageChange, diff_versions
from rewheel.fleet import CauseGroup, FleetReport, HostResult
from rewheel.qualify import CiReport
from rewheel.records import FailedSnapshot, Finish, Note, Started, Step
from rewheel.snapshot import SnapshotMeta, Store
from rewheel.statuses import Finished

# A journal's status as the timeline says it (the rest say themselves).
_LABELS: dict[tuple[str | None, str], str] = {("rollback", Finished.RESTORED): "rolled back", (None, Finished.ROLLED_BACK): "rolled back",
           (None, Finished.INTERRUPTED): "interrupted", (None, Finished.SUPERSEDED): "superseded"}
# The statuses of a run that failed, whose root cause the timeline shows.
FAILED = frozenset({Finished.REVERTED, Finished.REJECTED, Finished.FAILED})
# The log excerpt around a root cause's line: lines before it and after it, and how long a
# line may be (a model may print a megabyte on one line).
EXCERPT_BEFORE, EXCERPT_AFTER, EXCERPT_LINE_CHARS = 5, 30, 2000
KEY_PACKAGES = ("vllm", "torch", "flashinfer-python", "transformers", "triton")


def safe_name(text: str) -> str:
    """A file-name part from an id: as it is when it is plain (a run id, an env key), else
    its plain characters and a hash (a tampered folder name never becomes a path)."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,80}", text):
        return text
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text)[:40].strip("-") + "-" + hashlib.sha256(text.encode()).hexdigest()[:10]


def env_id(key: str) -> str:
    """An environment's short name in page names: the hash its state folder's name ends in."""
    found = re.search(r"-([0-9a-f]{10})$", key)
    return found.group(1) if found else safe_name(key)


@dataclass
class StepTime:
    """One journaled step: when it began (seconds from the command's start) and how long
    it took (until the next step or the end; None when the command ended during it)."""

    name: str
    offset: float
    seconds: float | None
    detail: str = ""


@dataclass
class LogExcerpt:
    """The lines of a log around its root cause's line (`mark`), `first` the number of the first."""

    path: str
    first: int
    lines: list[str]
    mark: int | None


@dataclass
class PatchView:
    """A local patch the run's snapshot found, and what the upgrade did with it."""

    path: str
    distribution: str
    diff: str
    fate: str


@dataclass
class RunView:
    """One journal of an environment (a run, a rollback; a resume finishes either in place)."""

    env_key: str
    id: str
    kind: str
    status: str
    dir: Path
    started: float | None = None
    finished: float | None = None
    resumed: bool = False
    running: bool = False
    recipe: str | None = None
    before: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)
    attempted: dict[str, str] = field(default_factory=dict)
    changes: list[PackageChange] = field(default_factory=list)
    outage_s: float | None = None
    outage_parts: dict[str, float] = field(default_factory=dict)
    outage_ongoing: bool = False
    root_cause: RootCause | None = None
    reason: str | None = None
    steps: list[StepTime] = field(default_factory=list)
    snapshot_id: str | None = None
    failed_snapshot_id: str | None = None
    by_run: str | None = None
    staged: bool = False
    lock: str | None = None
    damaged_lines: int = 0
    patches: list[PatchView] = field(default_factory=list)
    log: LogExcerpt | None = None
    # The two sides of its source diff (`diffs.source_diff`): snapshots, or the live
    # environment as the new side ("live"); `diff_note` says why there is none.
    diff_old: SnapshotMeta | None = None
    diff_new: SnapshotMeta | str | None = None
    diff_note: str = ""

    @property
    def label(self) -> str:
        if self.running:
            return "running"
        return _LABELS.get((self.kind, self.status)) or _LABELS.get((None, self.status)) or self.status

    @property
    def failed(self) -> bool:
        return self.status in FAILED

    @property
    def smoke_s(self) -> float | None:
        return next((s.seconds for s in self.steps if s.name == "smoke"), None)

    @property
    def page(self) -> str:
        return f"run-{env_id(self.env_key)}-{safe_name(self.id)}.html"

    def diff_page(self, n: int) -> str:
        return self.page.removesuffix(".html") + f"-diff-{n}.html"


@dataclass
class EnvView:
    """One environment: its runs newest first, its snapshots newest first."""

    key: str
    prefix: str
    runs: list[RunView]
    snapshots: list[SnapshotMeta]
    damaged_snapshots: list[str] = field(default_factory=list)
    python: str | None = None

    @property
    def page(self) -> str:
        return f"env-{env_id(self.key)}.html"

    @property
    def last(self) -> RunView | None:
        return self.runs[0] if self.runs else None

    @property
    def versions(self) -> dict[str, str]:
        """The key packages' versions as the newest record knows them: the last finished
        run's versions after it, else the newest snapshot's."""
        done = next((r for r in self.runs if r.finished is not None and (r.after or r.before)), None)
        found = (done.after or done.before) if done else (self.snapshots[0].versions if self.snapshots else {})
        return {k: v for k, v in found.items() if k in KEY_PACKAGES} or dict(list(found.items())[:5])


@dataclass
class HostRow:
    host: HostResult
    wave: int | None  # None: not reached


@dataclass
class FleetView:
    """A rollout: every host, the wave it was in (its order and the playbook's waves), why
    each that failed did."""

    source: str
    hosts: list[HostRow]
    waves: int
    causes: list[CauseGroup]
    counts: dict[str, int]


@dataclass
class Board:
    """Everything the board shows."""

    home: Path
    generated: float
    scope: str  # what it covers: a target, or "every environment under HOME"
    envs: list[EnvView]
    nightlies: list[CiReport]  # newest first
    bisections: list[BisectResult]  # newest first
    fleet: FleetView | None = None

    @property
    def runs(self) -> list[RunView]:
        return [r for e in self.envs for r in e.runs]


# -- reading -------------------------------------------------------------------------------
def read_env(store: Store, *, live_new: bool = False, python: str | None = None) -> EnvView:
    """One environment's page model from its store: every journal and snapshot. `live_new`:
    the live environment can be read, so the newest kept upgrade's source diff may use it."""
    metas = store.list()
    by_id = {m.id: m for m in metas}
    key = store.env_dir.name
    holder = journal.EnvLock(store.env_dir, "board", prefix=store.prefix).holder_now()
    journals = journal.list_runs(store.env_dir)
    running = next((j.id for j in journals if not j.finished), None) if holder is not None else None
    policies: dict[str, str | None] = {}
    runs = [run_view(j, key, policies=policies, running=j.id == running) for j in journals]
    for i, (r, j) in enumerate(zip(runs, journals, strict=True)):
        _diff_sides(r, by_id, metas, newest=i == 0, live=live_new)
        if r.kind == "rollback":
            _rollback_versions(r, j, by_id, runs[i + 1:])
    return EnvView(key, str(store.prefix), runs, metas, store.damaged() if store.snapshots_dir.is_dir() else [],
                   python)


def _rollback_versions(r: RunView, j: journal.RunJournal, by_id: dict[str, SnapshotMeta],
                       older: list[RunView]) -> None:
    """A rollback journals no versions: they are the snapshot it restored (after), and the
    state it replaced (before): its undo snapshot's, else what the command before it left."""
    restored = by_id.get(r.snapshot_id or "")
    undo = next((n.undo_snapshot_id for n in j.all(Note) if n.undo_snapshot_id), None)
    replaced = by_id.get(undo or "")
    if restored is not None and r.status in (Finished.RESTORED, Finished.FAILED):
        r.after = dict(restored.versions)
    if replaced is not None:
        r.before = dict(replaced.versions)
    else:
        prev = next((x for x in older if x.finished is not None and (x.after or x.before)), None)
        if prev is not None:
            r.before = dict(prev.after or prev.before)
    if r.before and r.after:
        r.changes = diff_versions(r.before, r.after)




def run_view(j: journal.RunJournal, env_key: str, *, policies: dict[str, str | None] | None = None,
             running: bool = False) -> RunView:
    """A journal as the timeline and its page show it."""
    start, fin = j.first(Started), j.last(Finish)
    s = j.summary()
    r = RunView(env_key, j.id, j.kind, j.status, j.dir, started=s["started"], finished=s["finished"],
                running=running, recipe=start.recipe if start else None, before=s["before"] or {},
                after=s["after"] or {}, attempted=s["attempted"] or {}, snapshot_id=j.snapshot_id,
                staged=bool(start and start.staged), lock=start.lock if start else None,
                damaged_lines=len(j.damaged))
    r.resumed = any(getattr(rec, "resumed", None) for rec in j.records if isinstance(rec, Step | Note | Finish))
    kept = j.first(FailedSnapshot)
    r.failed_snapshot_id = kept.failed_snapshot_id if kept else None
    new = r.attempted if r.failed or not r.after else r.after
    if r.before and new:
        r.changes = diff_versions(r.before, new)
    if fin is not None:
        r.reason, r.by_run = fin.reason or fin.error, fin.by_run
        if fin.check and not r.reason:
            r.reason = f"the prepared build failed its {fin.check} check"
        down = fin.downtime if isinstance(fin.downtime, dict) else None
        if down and isinstance(down.get("seconds"), int | float):
            r.outage_s = float(down["seconds"])
            r.outage_parts = {str(k): float(v) for k, v in (down.get("parts") or {}).items()
                              if isinstance(v, int | float) and v}
            r.outage_ongoing = bool(down.get("ongoing"))
        if isinstance(fin.root_cause, dict):
            r.root_cause = RootCause.from_json(fin.root_cause)
    r.steps = step_times(j)
    if r.root_cause is not None and r.root_cause.log_line:
        r.log = log_excerpt(_root_cause_log(j.dir, fin), r.root_cause.log_line)
    r.patches = _patches(j.dir, r, _policy(r.recipe, policies if policies is not None else {}))
    return r


def step_times(j: journal.RunJournal) -> list[StepTime]:
    """Each step's start and length, from the journal (a step is written as it begins: it
    lasts until the next step, or the end of the command)."""
    start = j.first(Started)
    t0 = start.time if start else (j.records[0].time if j.records else 0.0)
    marks = [r for r in j.records if isinstance(r, Step | Finish)]
    out = []
    for i, rec in enumerate(marks):
        if not isinstance(rec, Step):
            continue
        end = marks[i + 1].time if i + 1 < len(marks) else None
        detail = " ".join(x for x in (rec.purpose and f"({rec.purpose})", rec.reason, rec.check and f"check {rec.check}",
                                      rec.version, "resumed" if rec.resumed else None) if x)
        out.append(StepTime(str(rec.name), max(0.0, rec.time - t0), None if end is None else max(0.0, end - rec.time),
                            detail))
    return out


def _root_cause_log(run_dir: Path, fin: Finish | None) -> Path | None:
    """The log a run's root cause was read from: a rejected build's check log, else its smoke log."""
    if fin is not None and fin.check:
        logs = sorted(p for p in (run_dir / "prepare").glob("*.log") if fin.check in p.name)
        if logs:
            return logs[0]
    smoke = run_dir / "smoke.log"
    return smoke if smoke.is_file() else None


def log_excerpt(path: Path | None, line: int) -> LogExcerpt | None:
    """The lines around `line` of a log (read up to there, never the whole of a big log)."""
    if path is None:
        return None
    first = max(1, line - EXCERPT_BEFORE)
    lines: list[str] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, text in enumerate(f, 1):
                if n >= first:
                    lines.append(text.rstrip("\n")[:EXCERPT_LINE_CHARS])
                if n >= line + EXCERPT_AFTER:
                    break
    except OSError:
        return None
    return LogExcerpt(str(path), first, lines, line) if lines else None


def _policy(recipe: str | None, cache: dict[str, str | None]) -> str | None:
    """The patch policy of the recipe a run was started from, as it reads now (None: gone)."""
    if not recipe:
        return None
    if recipe not in cache:
        from rewheel.recipe import load_recipe

        try:
            cache[recipe] = load_recipe(recipe, check_interpreter=False).patch_policy
        except Exception:  # noqa: BLE001 - a recipe moved or changed since: the fate is not known
            cache[recipe] = None
    return cache[recipe]


def _patches(run_dir: Path, r: RunView, policy: str | None) -> list[PatchView]:
    """The local patches the run's snapshot saved (`patches/patches.json`), and their fate."""
    path = run_dir / "patches" / "patches.json"
    if not path.is_file():
        return []
    try:
        saved = json.loads(path.read_text(encoding="utf-8")).get("patches") or []
    except (OSError, ValueError, AttributeError):
        return []
    conflicts = {p.name for p in (run_dir / "patches").glob("*.conflict")}
    out = []
    for p in saved:
        if not isinstance(p, dict):
            continue
        name = str(p.get("path") or "?")
        flat = name.replace("/", "__")
        if any(c.startswith(flat) for c in conflicts):
            fate = "dropped: it did not apply to the new version (a .conflict file is in the run's folder)"
        elif policy == "reapply":
            fate = "carried: re-applied onto the new version"
        elif policy == "keep-old-version":
            fate = "kept: its distribution stayed at the old version"
        elif policy == "report":
            fate = "dropped by the reinstall (saved as a .patch file in the run's folder)"
        else:
            fate = "saved as a .patch file in the run's folder (the recipe's patch policy is not known now)"
        if r.status in (Finished.REVERTED, Finished.ROLLED_BACK):
            fate += "; back in place since the environment was restored"
        out.append(PatchView(name, str(p.get("distribution") or ""), str(p.get("diff") or ""), fate))
    return out


def _diff_sides(r: RunView, by_id: dict[str, SnapshotMeta], metas: list[SnapshotMeta], *, newest: bool,
                live: bool) -> None:
    """Which two states a run's source diff compares: its pre-upgrade snapshot against the
    failed build a revert kept, or — for a kept upgrade — against the first snapshot taken
    after it (the next run's pre-upgrade one), or the live environment for the newest."""
    if r.kind != "run":
        r.diff_note = "a rollback restores a snapshot: its versions are above"
        return
    old = by_id.get(r.snapshot_id or "")
    if r.snapshot_id is None:
        r.diff_note = "the run ended before it took a snapshot: nothing was installed"
        return
    if old is None:
        r.diff_note = f"its pre-upgrade snapshot {r.snapshot_id} was pruned ([snapshots] keep): no source diff"
        return
    r.diff_old = old
    if r.failed_snapshot_id:
        r.diff_new = by_id.get(r.failed_snapshot_id)
        if r.diff_new is None:
            r.diff_note = f"the failed build's snapshot {r.failed_snapshot_id} was pruned: no source diff"
        return
    if r.status not in (Finished.UPGRADED, Finished.REINSTALLED) or r.finished is None:
        r.diff_old = None
        r.diff_note = "nothing of this run's install is kept to compare"
        return
    after = [m for m in metas if m.created >= r.finished and m.status != "failed-upgrade"]
    if after:
        r.diff_new = after[-1]  # the first one taken after it (metas are newest first)
    elif newest and live:
        r.diff_new = "live"
    else:
        r.diff_old = None
        r.diff_note = "no snapshot of its result exists: no source diff"


def read_fleet(reports_dir: Path, *, expect: list[str] | None = None, waves: str = "1,30%,100%") -> FleetView:
    """A rollout from the run reports `fleet-report` reads (`HOST.json` in a folder). The
    hosts in the order they were upgraded (their run ids begin with the time they started),
    then those not reached; `expect` (as `fleet-report --expect`) names the order and the
    hosts not reached instead. Waves as the rollout playbook's `serial` batches them."""
    from rewheel import fleet
    from rewheel.errors import UsageError

    files = sorted(str(p) for p in reports_dir.glob("*.json")) if reports_dir.is_dir() else []
    if not files:
        raise UsageError(f"--fleet {reports_dir}: no HOST.json reports there",
                         hint="give the folder the fleet_summary callback writes (rewheel-fleet-reports)")
    rep: FleetReport = fleet.fleet_report(files, expect=expect)
    order = [h.strip() for x in expect or [] for h in x.split(",") if h.strip()]
    reached = [h for h in rep.hosts if h.status != "not-reached"]
    if order:
        rank = {h: i for i, h in enumerate(order)}
        reached.sort(key=lambda h: rank.get(h.host, len(rank)))
    else:
        reached.sort(key=lambda h: (h.run_id or "~", h.host))
    sizes = wave_sizes(waves, len(reached) + sum(1 for h in rep.hosts if h.status == "not-reached"))
    rows: list[HostRow] = []
    wave, left = 1, sizes[0]
    for h in reached:
        if left == 0:
            wave += 1
            left = sizes[min(wave, len(sizes)) - 1]
        rows.append(HostRow(h, wave))
        left -= 1
    rows += [HostRow(h, None) for h in rep.hosts if h.status == "not-reached"]
    return FleetView(str(reports_dir), rows, wave if reached else 0, rep.causes, rep.counts)


def wave_sizes(spec: str, hosts: int) -> list[int]:
    """The batch sizes of Ansible's `serial` list (`1,30%,100%`): a percentage of all hosts,
    rounded down but at least 1; the last size repeats."""
    from rewheel.errors import UsageError

    sizes = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        try:
            n = int(float(part[:-1]) / 100 * hosts) if part.endswith("%") else int(part)
        except ValueError:
            raise UsageError(f"--waves {spec}: {part!r} is neither a number nor a percentage",
                             hint="as the playbook's rewheel_waves: e.g. 1,30%,100%") from None
        sizes.append(max(1, n))
    return sizes or [max(1, hosts)]


def now() -> float:
    return time.time()
