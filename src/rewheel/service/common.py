"""What both service managers share: the `ServiceManager` protocol, a service's state
(`ServiceStatus`), a health check's answer (`HealthResult`, `HealthCheckFailed`), the states in
which a started service is gone, and the service's processes as /proc shows them (whether a pid
still runs as the same process, a main process's whole family)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from rewheel import proc
from rewheel.errors import ServiceError

SYSTEMCTL = "systemctl"


JOURNALCTL = "journalctl"


SHOW_PROPERTIES = ("LoadState", "ActiveState", "SubState", "MainPID", "NRestarts", "Result",
                   "ExecMainStatus", "ControlGroup")


# States in which a started service is gone (as opposed to up or on its way up).
DOWN_STATES = ("inactive", "failed", "deactivating")


# Set in the environment of a service the command manager starts: its start's token.
TOKEN_VAR = "REWHEEL_SERVICE_TOKEN"


@dataclass
class ServiceStatus:
    """A service's state in systemd's words (ActiveState, SubState, Result)."""

    active: bool
    state: str
    sub_state: str = ""
    main_pid: int = 0
    n_restarts: int = 0
    result: str = ""
    pids: list[int] = field(default_factory=list)
    exit_status: int | None = None
    # How the state was judged: "systemd" (the unit's ActiveState), "pid" (the process
    # rewheel started and recorded), or "health" (the health URL answers, no live recorded pid).
    judged_by: str = ""

    @property
    def up(self) -> bool:
        """Running or on its way up: what a run or a rollback must leave running."""
        return self.active or self.state in ("activating", "reloading")

    def to_json(self) -> dict[str, object]:
        return {"active": self.active, "state": self.state, "sub_state": self.sub_state,
                "main_pid": self.main_pid, "n_restarts": self.n_restarts, "result": self.result,
                "pids": list(self.pids), "exit_status": self.exit_status, "judged_by": self.judged_by}


@dataclass
class HealthResult:
    """The outcome of `wait_ready`."""

    ok: bool
    seconds: float
    detail: str
    health_url: str | None = None
    probe_url: str | None = None
    n_restarts: int = 0
    # False: a service left running was only health-checked, not restarted (rollback's
    # "no byte changed"); None: not said, and not in the JSON.
    restarted: bool | None = None
    # Seconds from the start to the first 200 of the health URL (before the settle time and
    # the probe): where a run's downtime ends. None without a health URL. Not in the JSON.
    first_healthy_s: float | None = None

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"ok": self.ok, "seconds": round(self.seconds, 3), "detail": self.detail,
                                  "health_url": self.health_url, "probe_url": self.probe_url,
                                  "n_restarts": self.n_restarts}
        if self.restarted is not None:
            doc["restarted"] = self.restarted
        return doc


class HealthCheckFailed(ServiceError):
    """The service died, restart-looped, never became healthy, or failed its probe.
    `result` holds the HealthResult (ok=False) for the run's record."""

    def __init__(self, message: str, result: HealthResult, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.result = result


@runtime_checkable
class ServiceManager(Protocol):
    def describe(self) -> str:
        """A short name for messages: "systemd unit x.service", "command `...`"."""

    def check(self) -> None:
        """Preflight: the manager's tools exist and the service is known. PreflightError."""

    def status(self) -> ServiceStatus: ...

    def stop(self, timeout_s: float) -> None:
        """Block until inactive and every process is gone; ServiceError on timeout."""

    def start(self) -> None:
        """Start and return once the main process is forked (not when it is ready)."""

    def log_lines(self, since_epoch: float) -> Iterator[str]:
        """The service's own output since a moment, for diagnosis."""

    def log_location(self, since_epoch: float) -> str:
        """Where a person reads that log (a command or a file path)."""


def _alive(pid: int, start_ticks: int | None = None) -> bool:
    """Whether `pid` runs (zombies count as gone) and is the same process as recorded."""
    if pid <= 0:
        return False
    p = proc.proc_stat(pid)
    if p is None:
        try:
            os.kill(pid, 0)  # no /proc (or hidden): fall back to signal 0
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if not p.live:
        return False
    return start_ticks is None or p.start == start_ticks


def _describe_pids(pids: Sequence[int]) -> str:
    parts = []
    for pid in sorted(pids):
        p = proc.proc_stat(pid)
        parts.append(f"{pid} ({p.comm})" if p else str(pid))
    return ", ".join(parts)


def _family(main_pid: int, table: list[proc.ProcStat]) -> set[int]:
    """The main process, its descendants, and its process group and session."""
    if main_pid <= 0:
        return set()
    pids = {main_pid}
    for p in table:
        if p.pgid == main_pid or p.sid == main_pid:
            pids.add(p.pid)
    children: dict[int, list[int]] = {}
    for p in table:
        children.setdefault(p.ppid, []).append(p.pid)
    todo = [main_pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in pids:
                pids.add(child)
                todo.append(child)
    return {pid for pid in pids if _alive(pid)}
