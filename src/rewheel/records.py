"""The journal's records: one type per event, with the fields that event carries.

A journal line is `{"event": ..., "time": ..., <fields>}`; these types are what is written and
what is read back, so a misspelt field is a type error where it is written and where it is
read, not a `.get()` that quietly returns None. The line's shape is the one rewheel has always
written (a field that is None is left out), so journals of earlier runs read as before.

Reading is lenient where it must be and strict where it matters: a line that is not a record
(no known event, no time, a step without a name, a `finished` without a status this rewheel
knows) is not one — `RunJournal.load` skips it as damaged. A known record with a field of the
wrong type keeps that field's default, and keys this rewheel does not know are kept in
`extra` (and written back as they were), so nothing read is lost.
"""

from __future__ import annotations

import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from pathlib import PurePath
from typing import Any, ClassVar, TypeVar, Union

from rewheel.statuses import BisectStatus, Event, Finished, StepName

JSONDict = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Record:
    """What every record has: when it was written, and what a newer rewheel added to it."""

    EVENT: ClassVar[Event]
    time: float = 0.0
    extra: JSONDict = field(default_factory=dict, compare=False)

    @property
    def event(self) -> str:
        return str(self.EVENT)

    def to_json(self) -> JSONDict:
        doc: JSONDict = {"event": self.event, "time": self.time}
        for f in fields(self):
            if f.name in ("time", "extra"):
                continue
            value = getattr(self, f.name)
            if value is not None:
                doc[f.name] = _plain(value)
        for key, value in self.extra.items():
            doc.setdefault(key, value)
        return doc


@dataclass(frozen=True, kw_only=True)
class Started(Record):
    """The first record: what kind of command, on what, from which state."""

    EVENT = Event.STARTED
    kind: str = "run"  # run | rollback | bisect
    recipe: str | None = None
    before: dict[str, str] | None = None  # the versions before the run
    lock: str | None = None
    plan: JSONDict | None = None
    staged: bool | None = None
    prepared: str | None = None      # the prepared lock a `--prepared` run installs
    prepare_only: bool | None = None
    snapshot_id: str | None = None   # a rollback: the snapshot it restores
    force: bool | None = None
    package: str | None = None       # a bisection: what it bisects, between which builds
    good: str | None = None
    bad: str | None = None


@dataclass(frozen=True, kw_only=True)
class Step(Record):
    """A step begins: written (and fsynced) before it acts."""

    EVENT = Event.STEP
    name: StepName
    served: bool | None = None       # a snapshot taken while the service still served
    purpose: str | None = None       # "undo": a rollback's own snapshot of what it replaces
    snapshot_id: str | None = None
    packages: list[str] | None = None
    install_ns: int | None = None    # when the reinstall began (unshare finds its files by it)
    service: str | None = None
    reason: str | None = None        # a revert: why
    check: str | None = None         # a rejected prepare: which check failed
    resumed: bool | None = None
    version: str | None = None       # a bisection's test: the build
    commit: str | None = None
    index: str | None = None


@dataclass(frozen=True, kw_only=True)
class Note(Record):
    """A fact a later command needs, written when it becomes known."""

    EVENT = Event.NOTE
    service_was_active: bool | None = None
    service_judged_by: str | None = None
    environment_unchanged: bool | None = None  # a rollback: the environment was the snapshot already
    resumed: bool | None = None
    fetched_after_stop: list[Any] | None = None
    unshare_failed: str | None = None
    failed_snapshot_dropped: str | None = None
    cleanup_refused: str | None = None
    service_start_skipped: str | None = None
    service_not_restarted: str | None = None
    unchanged_but_restored: bool | None = None
    restart_after_abort_failed: str | None = None
    undo_snapshot_id: str | None = None
    undo_snapshot_error: str | None = None
    undo_snapshot_stale: str | None = None
    damaged_lines: list[int] | None = None  # what `load` skipped, noted once by the next writer
    damaged_text: list[str] | None = None
    lock_source: str | None = None   # `run --lock FILE`: the file, as read at the plan,
    lock_sha256: str | None = None   # the sha256 of what was read,
    lock_copy: str | None = None     # and the copy the install used


@dataclass(frozen=True, kw_only=True)
class SnapshotTaken(Record):
    """The pre-upgrade snapshot a revert or `resume` restores."""

    EVENT = Event.SNAPSHOT
    snapshot_id: str


@dataclass(frozen=True, kw_only=True)
class FailedSnapshot(Record):
    """The failed build kept for inspection before a revert."""

    EVENT = Event.FAILED_SNAPSHOT
    failed_snapshot_id: str


@dataclass(frozen=True, kw_only=True)
class Installed(Record):
    """The reinstall finished: the versions it installed."""

    EVENT = Event.INSTALLED
    versions: dict[str, str] | None = None
    install_ns: int | None = None


@dataclass(frozen=True, kw_only=True)
class Healthy(Record):
    EVENT = Event.HEALTHY
    detail: str | None = None


@dataclass(frozen=True, kw_only=True)
class Finish(Record):
    """The last record: how the command ended (a journal without one was interrupted)."""

    EVENT = Event.FINISHED
    status: Finished | BisectStatus
    error: str | None = None          # a run that failed before its reinstall
    reason: str | None = None         # why a run was reverted
    before: dict[str, str] | None = None
    after: dict[str, str] | None = None
    attempted: dict[str, str] | None = None
    downtime: JSONDict | None = None
    root_cause: JSONDict | None = None
    kept_failed_state: bool | None = None
    prepared: str | None = None
    check: str | None = None
    resumed: bool | None = None
    service_error: str | None = None
    snapshot_id: str | None = None
    by_run: str | None = None         # superseded or rolled back by that command
    first_bad: JSONDict | None = None  # a bisection's result
    last_good: JSONDict | None = None


@dataclass(frozen=True, kw_only=True)
class ChildStarting(Record):
    """A process is about to start (its pid is not known yet)."""

    EVENT = Event.CHILD_STARTING
    name: str | None = None


@dataclass(frozen=True, kw_only=True)
class ChildStarted(Record):
    """A process rewheel started (uv, the smoke test): what `resume` stops if it outlived rewheel."""

    EVENT = Event.CHILD
    pid: int | None = None
    pgid: int | None = None
    start: int | None = None  # its /proc start time: a reused pid is not it
    name: str | None = None
    boot: str | None = None   # the boot it started in: a record of another boot names nothing


@dataclass(frozen=True, kw_only=True)
class ChildEnded(Record):
    EVENT = Event.CHILD_ENDED
    pid: int | None = None
    pgid: int | None = None
    name: str | None = None


@dataclass(frozen=True, kw_only=True)
class Candidates(Record):
    """A bisection: the builds it searches."""

    EVENT = Event.CANDIDATES
    mode: str | None = None
    source: str | None = None
    builds: list[JSONDict] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class BuildVerdict(Record):
    """A bisection: one build tested."""

    EVENT = Event.VERDICT
    verdict: str
    version: str | None = None
    commit: str | None = None
    index: str | None = None
    reason: str = ""
    root_cause: JSONDict | None = None
    frames: list[JSONDict] = field(default_factory=list)
    log: str | None = None
    seconds: float = 0.0
    project_urls: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Unrecognised:
    """A record of an event this rewheel does not know (kept, never acted on)."""

    event: str
    data: JSONDict

    @property
    def time(self) -> float:
        t = self.data.get("time")
        return float(t) if isinstance(t, int | float) and not isinstance(t, bool) and 0 <= t < 1e11 else 0.0

    def to_json(self) -> JSONDict:
        return dict(self.data)


AnyRecord = Record | Unrecognised
R = TypeVar("R", bound=Record)

_TYPES: dict[str, type[Record]] = {str(c.EVENT): c for c in (
    Started, Step, Note, SnapshotTaken, FailedSnapshot, Installed, Healthy, Finish,
    ChildStarting, ChildStarted, ChildEnded, Candidates, BuildVerdict)}


def from_json(doc: Any) -> AnyRecord | None:
    """The record a journal line holds, or None when it is not one rewheel wrote."""
    if not isinstance(doc, dict) or not isinstance(doc.get("event"), str):
        return None
    t = doc.get("time", 0)
    if not isinstance(t, int | float) or isinstance(t, bool) or not 0 <= t < 1e11:
        return None  # the history orders runs by it, and shows it: a moment a clock has (not nan, inf, 1e300)
    cls = _TYPES.get(doc["event"])
    if cls is None:
        return Unrecognised(doc["event"], doc)
    kwargs: JSONDict = {"time": float(t)}
    extra: JSONDict = {}
    for name, (allowed, required) in _schema(cls).items():
        if name not in doc:
            if required:
                return None
            continue
        ok, value = _fit(doc[name], allowed)
        if ok:
            kwargs[name] = value
        elif required:
            return None
        else:
            extra[name] = doc[name]  # kept as read; the field keeps its default
    extra.update((k, v) for k, v in doc.items() if k not in kwargs and k not in ("event", "time"))
    return cls(extra=extra, **kwargs)


_SCHEMAS: dict[type[Record], dict[str, tuple[tuple[Any, ...], bool]]] = {}


def _schema(cls: type[Record]) -> dict[str, tuple[tuple[Any, ...], bool]]:
    """Each field's allowed types (the arms of its annotation) and whether it is required."""
    if cls in _SCHEMAS:
        return _SCHEMAS[cls]
    hints = typing.get_type_hints(cls)
    out = _SCHEMAS[cls] = {}
    for f in fields(cls):
        if f.name in ("time", "extra"):
            continue
        tp = hints[f.name]
        arms = typing.get_args(tp) if typing.get_origin(tp) in (Union, types.UnionType) else (tp,)
        out[f.name] = (arms, f.default is MISSING and f.default_factory is MISSING)
    return out


def _fit(value: Any, arms: tuple[Any, ...]) -> tuple[bool, Any]:
    for arm in arms:
        if arm is Any:
            return True, value
        if arm is type(None):
            if value is None:
                return True, None
            continue
        base = typing.get_origin(arm) or arm
        if isinstance(base, type) and issubclass(base, Enum):
            try:
                return True, base(value)
            except ValueError:
                continue
        if base is float and isinstance(value, int | float) and not isinstance(value, bool):
            return True, float(value)
        if base is int and isinstance(value, bool):
            continue
        if isinstance(base, type) and isinstance(value, base):
            return True, value
    return False, None


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, PurePath):
        return str(value)
    return value
