"""The service an environment serves: stopping it, starting it, and proving it healthy.

Two managers share one protocol (`ServiceManager`):

- `SystemdManager(unit)` drives `systemctl` and reads `journalctl`, parsing only their
  machine forms (`systemctl show`'s `Key=Value` lines, `journalctl -o json`).
- `CommandManager(start, stop, state_dir)` runs the recipe's own argv lists: it starts the
  service detached in its own session, appends its output to `state_dir/service.log`, and
  records its pid durably in `state_dir/service.json` so a later rewheel process (resume,
  rollback) can still stop it — and, before the start, the token the service's environment
  carries (`REWHEEL_SERVICE_TOKEN`), by which it is found when rewheel died in between. A service it did not start (or whose start command
  daemonized) is judged by its health URL answering, and stopped through the recipe's `stop`.

"Stopped" means inactive and every process of the service gone (a vLLM server's worker
processes hold GPU memory until they exit). "Started" is not "ready": `wait_ready` polls the
health URL, fails fast when the service dies or restart-loops, checks that it stays up for
`settle_s`, and runs the recipe's probe.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import httpx

from rewheel import httpclient, proc
from rewheel.errors import PreflightError, ServiceError, ServiceRecordDamaged
from rewheel.paths import atomic_write
from rewheel.recipe import ServiceSpec

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


# --- processes, from /proc -------------------------------------------------------------------

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


# --- systemd ---------------------------------------------------------------------------------

class SystemdManager:
    """A systemd unit, through `systemctl` and `journalctl`."""

    def __init__(self, unit: str, *, start_timeout_s: float = 900.0,
                 cgroup_root: Path = Path("/sys/fs/cgroup")) -> None:
        self.unit = unit if "." in unit else f"{unit}.service"
        self.start_timeout_s = start_timeout_s
        self.cgroup_root = cgroup_root

    def describe(self) -> str:
        return f"systemd unit {self.unit}"

    def _systemctl(self, *args: str, timeout: float = 60.0) -> proc.Completed:
        return proc.run([SYSTEMCTL, *args], timeout=timeout)

    def show(self, properties: Sequence[str] = SHOW_PROPERTIES) -> dict[str, str]:
        """`systemctl show UNIT -p ...` as a dict (systemd prints them in its own order)."""
        args = ["show", self.unit]
        for prop in properties:
            args += ["-p", prop]
        r = self._systemctl(*args)
        if r.timed_out or r.returncode != 0:
            why = "timed out" if r.timed_out else f"exit {r.returncode}"
            raise ServiceError(f"`systemctl show {self.unit}` failed ({why}): "
                               f"{(r.stderr or r.stdout).strip() or '(no output)'}")
        values: dict[str, str] = {}
        for line in r.stdout.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip()
        return values

    def check(self) -> None:
        if proc.which(SYSTEMCTL) is None:
            raise PreflightError(f"service.manager = \"systemd\" but systemctl is not on PATH "
                                 f"(unit {self.unit})",
                                 hint='use manager = "command" with start/stop argv lists on '
                                      "hosts without systemd")
        try:
            load = self.show(("LoadState",)).get("LoadState", "")
        except ServiceError as exc:
            raise PreflightError(exc.message) from None
        if load != "loaded":
            raise PreflightError(f"systemd unit {self.unit} is not loaded (LoadState={load or '?'})",
                                 hint=f"check service.unit in the recipe; `systemctl list-unit-files "
                                      f"'{self.unit.rsplit('.', 1)[0]}*'` lists similar units")

    def _cgroup_pids(self, control_group: str) -> set[int] | None:
        """Every pid in the unit's cgroup (and its sub-cgroups), or None when unreadable."""
        if not control_group:
            return None
        rel = control_group.lstrip("/")
        # cgroup v2 (unified), hybrid (unified/), v1 (systemd/ named hierarchy).
        for base in (self.cgroup_root, self.cgroup_root / "unified", self.cgroup_root / "systemd"):
            top = base / rel
            if not (top / "cgroup.procs").is_file():
                continue
            pids: set[int] = set()
            try:
                for dirpath, _dirs, files in os.walk(top):
                    if "cgroup.procs" in files:
                        text = Path(dirpath, "cgroup.procs").read_text()
                        pids.update(int(x) for x in text.split() if x.strip().isdigit())
            except OSError:
                return None
            return {p for p in pids if _alive(p)}
        return None

    def _status_from(self, v: dict[str, str]) -> ServiceStatus:
        def num(key: str) -> int:
            try:
                return int(v.get(key, "0") or 0)
            except ValueError:
                return 0
        main = num("MainPID")
        pids = self._cgroup_pids(v.get("ControlGroup", ""))
        if pids is None:
            pids = _family(main, proc.process_table())
        state = v.get("ActiveState", "")
        exit_status = num("ExecMainStatus") if v.get("ExecMainStatus") else None
        return ServiceStatus(active=state == "active", state=state, sub_state=v.get("SubState", ""),
                             main_pid=main, n_restarts=num("NRestarts"), result=v.get("Result", ""),
                             pids=sorted(pids), exit_status=exit_status, judged_by="systemd")

    def status(self) -> ServiceStatus:
        return self._status_from(self.show())

    def stop(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        before = self.show()
        if before.get("LoadState") == "not-found":
            raise ServiceError(f"cannot stop {self.unit}: the unit is not loaded (LoadState=not-found)",
                               hint="check service.unit in the recipe")
        # Remember the processes (with their start times, against pid reuse) before stopping:
        # once stopped, MainPID is 0 and leftovers outside a readable cgroup are invisible.
        tracked = {pid: proc.proc_stat(pid) for pid in self._status_from(before).pids}
        r = self._systemctl("stop", self.unit, timeout=max(1.0, timeout_s))
        if r.timed_out:
            raise ServiceError(f"`systemctl stop {self.unit}` did not finish within {timeout_s:g}s",
                               hint=f"see `systemctl status {self.unit}`; raise service.stop_timeout_s "
                                    "if the service needs longer to shut down")
        if r.returncode == 5:
            raise ServiceError(f"cannot stop {self.unit}: {r.stderr.strip() or 'unit not loaded'} "
                               "(systemctl exit 5)", hint="check service.unit in the recipe")
        if r.returncode != 0:
            raise ServiceError(f"`systemctl stop {self.unit}` failed (exit {r.returncode}): "
                               f"{(r.stderr or r.stdout).strip() or '(no output)'}")
        gaps = proc.backoff(0.2)
        while True:
            st = self.status()
            for pid in st.pids:
                tracked.setdefault(pid, proc.proc_stat(pid))
            left = [pid for pid, info in tracked.items()
                    if _alive(pid, info.start if info else None)]
            if st.state in ("inactive", "failed") and not left:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(next(gaps))
        what = f"processes still running: {_describe_pids(left)}" if left else "no process left"
        raise ServiceError(
            f"{self.unit} did not stop within {timeout_s:g}s (ActiveState={st.state}, "
            f"SubState={st.sub_state}; {what})",
            hint=(f"end them (`kill -9 {' '.join(map(str, sorted(left)))}`) and run the command again"
                  if left else f"see `systemctl status {self.unit}`"))

    def start(self) -> None:
        # A unit that hit its start limit (a crash-looping build) refuses `start` until its
        # failed state is reset; a revert must be able to start the old build right after.
        self._systemctl("reset-failed", self.unit)
        r = self._systemctl("start", self.unit, timeout=self.start_timeout_s)
        if r.timed_out:
            raise ServiceError(f"`systemctl start {self.unit}` did not finish within "
                               f"{self.start_timeout_s:g}s")
        if r.returncode == 5:
            raise ServiceError(f"cannot start {self.unit}: {r.stderr.strip() or 'unit not found'} "
                               "(systemctl exit 5)", hint="check service.unit in the recipe")
        if r.returncode != 0:
            raise ServiceError(f"`systemctl start {self.unit}` failed (exit {r.returncode}): "
                               f"{(r.stderr or r.stdout).strip() or '(no output)'}",
                               hint=f"see `journalctl -u {self.unit} -n 100 --no-pager`")

    @staticmethod
    def log_since_arg(since_epoch: float) -> str:
        """journalctl's `--since` form for a moment: `@EPOCH` (whole seconds, rounded down)."""
        return f"@{int(since_epoch)}"

    def log_location(self, since_epoch: float) -> str:
        return f"journalctl -u {self.unit} --since {self.log_since_arg(since_epoch)} --no-pager"

    def log_lines(self, since_epoch: float) -> Iterator[str]:
        argv = [JOURNALCTL, "-u", self.unit, "--since", self.log_since_arg(since_epoch),
                "--no-pager", "-o", "json"]
        r = proc.run(argv, timeout=120)
        if r.timed_out or r.returncode != 0:
            why = "timed out" if r.timed_out else f"exit {r.returncode}"
            raise ServiceError(f"`{' '.join(argv)}` failed ({why}): "
                               f"{(r.stderr or r.stdout).strip() or '(no output)'}")
        for line in r.stdout.splitlines():
            if not line.startswith("{"):
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            msg = rec.get("MESSAGE", "")
            if isinstance(msg, list):  # journald's form for messages that are not UTF-8
                msg = bytes(msg).decode("utf-8", errors="replace")
            yield str(msg)


# --- command ---------------------------------------------------------------------------------

class CommandManager:
    """A service started and stopped by the recipe's argv lists.

    Contract: `start` runs the service in the foreground (like systemd's Type=simple), or
    daemonizes — forks the server and exits 0 at once (like Type=forking). rewheel starts it
    in its own session and process group and owns that group. `stop`, when given, asks the
    service to stop; rewheel then makes sure the whole process group is gone (SIGTERM,
    SIGKILL after the timeout) and, with a health URL, that nothing answers there any more.

    The service is up when the recorded main process lives (`judged_by="pid"`) or, failing
    that, when its health URL answers (`judged_by="health"`): a server started by something
    else, or one that left the group (setsid, double fork). Such a server can only be
    stopped through `stop`.
    """

    def __init__(self, start_argv: Sequence[str], stop_argv: Sequence[str] = (),
                 state_dir: Path | str = ".", *, env: dict[str, str] | None = None,
                 cwd: Path | str | None = None, health_url: str | None = None,
                 ready_timeout_s: float = 900.0) -> None:
        if not start_argv:
            raise ServiceError("service.start is empty: the command manager needs an argv list")
        self.start_argv = [str(a) for a in start_argv]
        self.stop_argv = [str(a) for a in stop_argv]
        self.state_dir = Path(state_dir)
        self.env = env
        self.cwd = cwd
        self.health_url = health_url or None
        self.ready_timeout_s = float(ready_timeout_s)
        self._popen: subprocess.Popen[bytes] | None = None  # ours only while this process lives

    @property
    def pid_file(self) -> Path:
        return self.state_dir / "service.pid"

    @property
    def info_file(self) -> Path:
        return self.state_dir / "service.json"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "service.log"

    def describe(self) -> str:
        return f"service command `{' '.join(self.start_argv)}`"

    def check(self) -> None:
        for key, argv in (("service.start", self.start_argv), ("service.stop", self.stop_argv)):
            if not argv:
                continue
            exe = argv[0]
            found = os.path.exists(exe) if os.sep in exe else proc.which(exe, self.env) is not None
            if not found:
                raise PreflightError(f"{key}: command not found: {exe!r}")

    def _record(self) -> dict | None:
        """service.json as rewheel wrote it, or None when there is none. A record that is not
        one rewheel wrote (not JSON, a field of the wrong type, a pid that names no process
        rewheel could have started: 0, -1, 1, a float, a string, a list) raises
        ServiceRecordDamaged (exit 3) before anything is signalled or changed. A bare
        `service.pid` (no service.json) proves nothing — a number any process may hold — and
        is never read."""
        try:
            text = self.info_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise self._damaged(f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
        try:
            info = json.loads(text)
        except (ValueError, RecursionError):
            raise self._damaged("is not JSON") from None
        problem = record_problem(info)
        if problem is not None:
            raise self._damaged(problem)
        return info

    def check_record(self) -> str:
        """What the record says, or ServiceRecordDamaged (exit 3) for one rewheel did not write."""
        info = self._record()
        if info is None:
            return f"no record in {self.info_file}"
        if info.get("pid") is None:
            return f"{self.info_file}: a start under way"
        proven = self._child(info) is not None
        return f"{self.info_file}: pid {info['pid']}" + ("" if proven else " (not provably this boot's: not ours)")

    def _damaged(self, problem: str) -> ServiceRecordDamaged:
        return ServiceRecordDamaged(
            f"{self.info_file} {problem}: not a record rewheel wrote, so no process is signalled by it",
            hint=f"check whether the service runs (its health URL, `ps`) and stop it yourself if so; then "
                 f"remove {self.info_file} (and {self.pid_file}), and run the command again; nothing was changed")

    def _info(self) -> dict | None:
        """The record of a service rewheel started in this boot, with its pid and start time
        (what proves a live process is that service), or None: no record, a start that never
        happened, or a record that cannot prove which process it names (another boot, no start
        time): "not ours", never signalled."""
        info = self._record()
        if info is None:
            return None
        if info.get("pid") is None:
            # A start rewheel was killed in before it recorded the pid (see `start`): the
            # process is found by the token it was started with, or never started.
            return self._started_by_token(info)
        if self._child(info) is None:
            return None
        return info

    @staticmethod
    def _child(info: dict) -> proc.Child | None:
        """The recorded service as a `proc.Child` (its process group, start time, boot), or None
        when the record cannot prove which process it names."""
        ticks = info.get("start_ticks")
        if ticks is None:
            return None
        child = proc.Child(info["pid"], info["pid"], ticks, "service", info.get("boot_id"),
                           info.get("started_at"))
        if not proc.same_boot(child.boot, child.around, ticks):
            return None
        return child

    @staticmethod
    def _started_by_token(info: dict) -> dict | None:
        """The intent `start` recorded, completed with the pid of the process group leader
        whose environment carries its token; None when no such process runs (the start never
        happened, or what it started has ended: nothing of it to stop)."""
        token = info.get("starting")
        if not isinstance(token, str) or not token:
            return None
        needle = f"{TOKEN_VAR}={token}".encode()
        for p in proc.process_table():
            if p.pid != p.pgid:
                continue
            try:
                with open(f"/proc/{p.pid}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:
                continue
            if needle in environ:
                return {**info, "pid": p.pid, "start_ticks": p.start, "boot_id": proc.boot_id()}
        return None

    def _save(self, info: dict) -> None:
        atomic_write(self.info_file, json.dumps(info, indent=1) + "\n")

    def _poll_child(self, pid: int) -> int | None:
        """Reap our own child if it exited; its exit status, or None."""
        p = self._popen
        if p is not None and p.pid == pid:
            return p.poll()
        return None

    def _main_alive(self, info: dict) -> bool:
        pid = int(info["pid"])
        if self._poll_child(pid) is not None:
            return False
        return self._child(info) is not None and _alive(pid, info.get("start_ticks"))

    def _group(self, info: dict) -> list[int]:
        """Live members of the service's process group (its leader is the main pid), each
        proven the service's (see `proc.Child.live_members`): nothing for a reused pid, a
        record of another boot or one without a start time."""
        child = self._child(info)
        if child is None:
            return []
        self._poll_child(child.pid)
        return child.live_members()

    # -- the health URL: how a server rewheel has no live process of is seen -----------------
    def _answers(self) -> bool:
        """Whether something answers at the health URL. Any HTTP status counts (a server
        still loading its model answers 503), and so does a connection that is accepted
        but not answered in time."""
        if not self.health_url:
            return False
        # A broken SSL_CERT_FILE raises (named) here rather than passing as "nothing answers".
        with httpclient.client(timeout=2.0) as http:
            try:
                http.get(self.health_url)
            except httpx.TimeoutException as exc:
                return not isinstance(exc, httpx.ConnectTimeout)
            except Exception:  # refused, reset, a bad URL: nothing answers
                return False
        return True

    def _listening(self) -> bool:
        """Whether the health URL's port still accepts connections (is not yet released)."""
        if not self.health_url:
            return False
        try:
            url = httpx.URL(self.health_url)
            host, port = url.host, url.port or (443 if url.scheme == "https" else 80)
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except Exception:
            return False

    def _wait_released(self, until: float) -> bool:
        """Until nothing answers at the health URL and its port is free; False on timeout."""
        while True:
            if not self._answers() and not self._listening():
                return True
            if time.monotonic() >= until:
                return False
            time.sleep(0.1)

    def _no_stop_error(self) -> PreflightError:
        return PreflightError(
            f"{self.describe()}: the service is running (its health URL {self.health_url} answers) "
            "but not as a process rewheel started and recorded, so it can only be stopped through "
            "the recipe's `[service] stop`, which is not set; nothing was changed",
            hint='add `stop = ["...", "..."]` (an argv that stops the server) to [service] in the '
                 "recipe, or stop the service yourself and run the command again")

    def check_stoppable(self, st: ServiceStatus | None = None) -> None:
        """PreflightError when the service runs outside rewheel's reach and the recipe has no
        `stop` argv: call before changing anything."""
        st = st if st is not None else self.status()
        if st.active and st.judged_by == "health" and not st.pids and not self.stop_argv:
            raise self._no_stop_error()

    def output_tail(self, n: int = 5) -> list[str]:
        """The last `n` non-empty lines the service wrote since its last start."""
        try:
            lines = [line for line in self.log_lines(0) if line.strip()]
        except OSError:
            return []
        return [line[:300] for line in lines[-n:]]

    def status(self) -> ServiceStatus:
        info = self._info()
        if info is not None and not info.get("stopped") and self._main_alive(info):
            pid = int(info["pid"])
            return ServiceStatus(active=True, state="active", sub_state="running", main_pid=pid,
                                 pids=self._group(info) or [pid], judged_by="pid")
        group = self._group(info) if info is not None else []
        if self._answers():
            # Up, but not as the process rewheel recorded: started by something else, or by
            # a start command that daemonized (forked the server and exited).
            return ServiceStatus(active=True, state="active", sub_state="running", pids=group,
                                 judged_by="health")
        judged = "health" if self.health_url else "pid"
        if info is None:
            return ServiceStatus(active=False, state="inactive", sub_state="dead", judged_by=judged)
        pid = int(info["pid"])
        rc = self._poll_child(pid)
        if rc is None:
            rc = info.get("returncode")
        if info.get("stopped"):
            return ServiceStatus(active=False, state="inactive", sub_state="dead", result="success",
                                 pids=group, exit_status=rc, judged_by=judged)
        if (rc == 0 and self.health_url
                and time.time() - float(info.get("started_at") or 0) < self.ready_timeout_s):
            # The start command exited 0: it daemonized (like systemd's Type=forking). The
            # server counts as starting until its health URL answers, within the ready timeout.
            return ServiceStatus(active=False, state="activating", sub_state="start",
                                 result="success", pids=group, exit_status=0, judged_by="health")
        exit_status: int | None
        if rc is not None and rc < 0:
            result, exit_status = "signal", -rc
        elif rc == 0:
            result, exit_status = "success", 0
        else:
            result, exit_status = "exit-code", rc
        # It ended without being asked to: like a systemd unit whose main process died.
        return ServiceStatus(active=False, state="failed" if rc != 0 else "inactive",
                             sub_state="failed" if rc != 0 else "dead", result=result, pids=group,
                             exit_status=exit_status, judged_by=judged)

    def start(self) -> None:
        if self.status().up:
            return  # already running (or on its way up): like `systemctl start`, a no-op
        self.state_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(f"[rewheel] {stamp} starting: {' '.join(self.start_argv)}\n")
        offset = self.log_path.stat().st_size
        started_at = time.time()
        # The intent first, with a token the service's environment carries: a rewheel killed
        # between the start and the record of its pid leaves a service the next command still
        # recognises as its own (found by the token) and can stop.
        token = secrets.token_hex(8)
        intent = {"pid": None, "starting": token, "argv": self.start_argv, "started_at": started_at,
                  "log_offset": offset, "stopped": False}
        self._save(intent)
        env = dict(self.env) if self.env is not None else dict(os.environ)
        env[TOKEN_VAR] = token
        child = proc.spawn_detached(self.start_argv, log_path=self.log_path, env=env, cwd=self.cwd)
        self._popen = child
        try:
            me = proc.proc_stat(child.pid)
            self._save({**intent, "pid": child.pid, "start_ticks": me.start if me else None,
                        "boot_id": proc.boot_id()})
            atomic_write(self.pid_file, f"{child.pid}\n")  # for people and scripts; service.json rules
        except OSError:
            # Not recorded (a full disk): no later command could find it to stop it, so the
            # start is undone now and fails.
            try:
                os.killpg(child.pid, signal.SIGKILL)  # our own child, this moment: its group is ours
            except (ProcessLookupError, PermissionError):
                pass
            child.wait()
            raise

    def _signal_group(self, info: dict, sig: int) -> None:
        """Signal the members of the service's group proven its own (`_group`), one by one,
        never a process group by number: a record's pid that names anything else is never
        reached."""
        for pid in self._group(info):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _wait_group_gone(self, info: dict, until: float) -> list[int]:
        while True:
            left = self._group(info)
            if not left or time.monotonic() >= until:
                return left
            time.sleep(0.05)

    def _mark_stopped(self, info: dict | None) -> None:
        if info is None:
            return
        rc = self._poll_child(int(info["pid"]))
        try:
            self._save({**info, "stopped": True,
                        "returncode": rc if rc is not None else info.get("returncode")})
        except OSError:
            # A full disk: the record of a process that is gone goes instead (an unlink needs
            # no space), which reads as stopped too; only its exit status is lost.
            for f in (self.info_file, self.pid_file):
                f.unlink(missing_ok=True)

    def stop(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        info = self._info()
        st = self.status()
        group = self._group(info) if info is not None else []
        # Up only as far as the health URL shows (started outside rewheel, or daemonized):
        # only the recipe's `stop` can reach it. Refused before anything is done.
        outside = st.judged_by == "health" and st.up and not group
        if outside and st.active and not self.stop_argv:
            raise self._no_stop_error()
        if self.health_url and not group and (not st.up or (outside and not self.stop_argv)):
            # Nothing runs (no live recorded process, nothing answers), or only a daemonized
            # start that has not answered yet and that no `stop` could reach: nothing to stop.
            if info is not None and not info.get("stopped"):
                self._mark_stopped(info)
            return
        stop_note = ""
        if self.stop_argv:
            r = proc.run(self.stop_argv, timeout=max(1.0, timeout_s))
            if not r.ok:
                said = (r.stderr or r.stdout).strip().splitlines()
                stop_note = (f"`{' '.join(self.stop_argv)}` "
                             f"{'timed out' if r.timed_out else f'exited {r.returncode}'}"
                             f"{': ' + said[-1] if said else ''}")
        if info is None and not self.health_url:
            if stop_note:
                # Nothing recorded to check: the stop command's word is all there is.
                raise ServiceError(f"cannot stop the service: {stop_note}",
                                   hint=f"no service started by rewheel is recorded in {self.pid_file}")
            return
        if info is not None:
            pgid = int(info["pid"])
            if self.stop_argv:
                left = self._wait_group_gone(info, deadline)
                if left:
                    self._signal_group(info, signal.SIGTERM)
                    left = self._wait_group_gone(info, time.monotonic() + min(10.0, max(1.0, timeout_s)))
            else:
                self._signal_group(info, signal.SIGTERM)
                left = self._wait_group_gone(info, deadline)
            if left:
                self._signal_group(info, signal.SIGKILL)
                left = self._wait_group_gone(info, time.monotonic() + 5.0)
            if left:
                raise ServiceError(
                    f"the service did not stop within {timeout_s:g}s: processes of its group "
                    f"{pgid} survived SIGKILL: {_describe_pids(left)}"
                    + (f" ({stop_note})" if stop_note else ""),
                    hint="they may be stuck in the kernel (state D); check `ps -o pid,stat,cmd -g "
                         f"{pgid}`")
        if self.health_url and not self._wait_released(max(deadline, time.monotonic() + 2.0)):
            how = f"`{' '.join(self.stop_argv)}`" if self.stop_argv else "stopping its process group"
            raise ServiceError(
                f"the service did not stop within {timeout_s:g}s: {self.health_url} still answers "
                f"(or its port is still taken) after {how}" + (f" ({stop_note})" if stop_note else ""),
                hint="check that [service] stop stops the server the health URL reaches; raise "
                     "service.stop_timeout_s if it needs longer to shut down")
        self._mark_stopped(info)

    def log_location(self, since_epoch: float) -> str:
        if not self.log_path.exists():
            return f"none yet ({self.log_path} is written once rewheel starts the service)"
        return str(self.log_path)

    def log_lines(self, since_epoch: float) -> Iterator[str]:
        """service.log from the offset recorded at the last start (`since_epoch` unused: the
        log has no timestamps of its own)."""
        info = self._record() or {}
        offset = info.get("log_offset") or 0
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return
        for raw in data.splitlines():
            yield raw.decode("utf-8", errors="replace")


# service.json's fields and the types rewheel writes them with (None allowed for each).
_RECORD_FIELDS: dict[str, tuple[type, ...]] = {
    "pid": (int,), "start_ticks": (int,), "boot_id": (str,), "starting": (str,), "argv": (list,),
    "started_at": (int, float), "log_offset": (int,), "stopped": (bool,), "returncode": (int,)}


def record_problem(info: object) -> str | None:
    """What makes a service.json not one rewheel wrote, or None. Checked before any field is
    used: a pid must be a pid (`proc.valid_pid`), a count a non-negative int, a time a finite
    number; keys rewheel does not know are left alone."""
    import math

    if not isinstance(info, dict):
        return f"holds {type(info).__name__}, not a JSON object"
    for key, types in _RECORD_FIELDS.items():
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            return f"has {key} = {_shown(value)}, not {' or '.join(t.__name__ for t in types)}"
    pid = info.get("pid")
    if pid is not None and not proc.valid_pid(pid):
        return f"has pid = {_shown(pid)}, which names no process rewheel started"
    for key in ("start_ticks", "log_offset"):
        if (info.get(key) or 0) < 0:
            return f"has {key} = {_shown(info[key])}, a negative count"
    started_at = info.get("started_at")
    if started_at is not None and not (math.isfinite(started_at) and started_at >= 0):
        return f"has started_at = {_shown(started_at)}, not a moment"
    if pid is None and info.get("starting") is None and not info.get("stopped"):
        return "names neither a pid nor a start under way"
    return None


def _shown(value: object) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def make_manager(spec: ServiceSpec, state_dir: Path, *, python: Path | str | None = None) -> ServiceManager:
    """The manager a recipe's [service] asks for. `python` fills the `{python}` template in
    the command manager's argv lists."""
    if spec.manager == "systemd":
        if not spec.unit:
            raise ServiceError('service.unit is required with manager = "systemd"')
        return SystemdManager(spec.unit, start_timeout_s=float(spec.ready_timeout_s))
    if spec.manager == "command":
        def expand(argv: Sequence[str]) -> list[str]:
            return [a.replace("{python}", str(python)) if python is not None else a for a in argv]
        return CommandManager(expand(spec.start), expand(spec.stop), state_dir,
                              health_url=spec.health_url,
                              ready_timeout_s=float(spec.ready_timeout_s))
    raise ServiceError(f'service.manager: expected "systemd" or "command", got "{spec.manager}"')


# --- readiness -------------------------------------------------------------------------------

def _get(client: httpx.Client, url: str, timeout: float) -> tuple[int | None, str, str]:
    """(status code or None, body, a short description of the answer)."""
    try:
        r = client.get(url, timeout=timeout)
    except httpx.TimeoutException:
        return None, "", f"no answer within {timeout:g}s"
    except httpx.HTTPError as exc:
        return None, "", f"{type(exc).__name__}: {exc}"
    body = r.text
    snippet = " ".join(body.split())[:200]
    return r.status_code, body, f"HTTP {r.status_code}" + (f": {snippet}" if snippet else "")


def wait_ready(manager: ServiceManager, spec: ServiceSpec, *, client: httpx.Client | None = None,
               started_at: float, on_progress: Callable[[str], None] | None = None,
               poll_s: float = 0.5) -> HealthResult:
    """Wait until the started service is healthy, stays up, and passes its probe.

    `started_at` (epoch seconds) is when `start()` was called: the ready timeout counts from
    there and the log hint points there. Raises HealthCheckFailed (a ServiceError) at once when
    the service becomes inactive/failed or its restart counter grows; after
    `spec.ready_timeout_s` without a 200 from `spec.health_url`; when it dies or restarts
    within `spec.settle_s` after its first 200; or when the probe fails.
    """
    own_client = client is None
    http = client if client is not None else httpclient.client(timeout=10.0)
    mono0 = time.monotonic() - max(0.0, time.time() - started_at)
    deadline = mono0 + spec.ready_timeout_s
    what = manager.describe()
    log_hint = f"the service's log: {manager.log_location(started_at)}"
    last = ""

    def elapsed() -> float:
        return time.monotonic() - mono0

    def progress(text: str) -> None:
        nonlocal last
        if on_progress and text != last:
            on_progress(text)
        last = text

    def fail(message: str, detail: str, n_restarts: int, hint: str = log_hint) -> HealthCheckFailed:
        result = HealthResult(ok=False, seconds=elapsed(), detail=detail, health_url=spec.health_url,
                              probe_url=spec.probe.url if spec.probe else None, n_restarts=n_restarts)
        return HealthCheckFailed(message, result, hint=hint)

    baseline = manager.status().n_restarts

    def liveness(phase: str) -> int:
        st = manager.status()
        if st.n_restarts > baseline:
            raise fail(f"{what} is restart-looping: it restarted {st.n_restarts - baseline} time(s) "
                       f"{phase} (NRestarts {baseline} -> {st.n_restarts}, now {st.state}/{st.sub_state}"
                       f", Result={st.result})", f"restarted {st.n_restarts - baseline} time(s)",
                       st.n_restarts)
        code = f", exit status {st.exit_status}" if st.exit_status not in (None, 0) else ""
        if st.sub_state == "auto-restart":
            raise fail(f"{what} is restart-looping: its main process exited {phase} and it is "
                       f"waiting to be restarted ({st.state}/{st.sub_state}, Result={st.result}"
                       f"{code}, NRestarts={st.n_restarts})", "restart-looping", st.n_restarts)
        # systemd 252 ends a Restart=always unit at its start limit as failed with the last
        # exit's Result (exit-code), not start-limit-hit: a failed unit that restarted gave up.
        if st.result == "start-limit-hit" or (st.state == "failed" and st.n_restarts > 0):
            raise fail(f"{what} is restart-looping: systemd stopped restarting it at its start limit "
                       f"({st.state}/{st.sub_state}, Result={st.result}, NRestarts={st.n_restarts}{code})",
                       "restart-looping", st.n_restarts)
        if st.state in DOWN_STATES:
            tail_of = getattr(manager, "output_tail", None)
            tail = tail_of() if callable(tail_of) else []
            said = f"; its output ended with: {' | '.join(tail)}" if tail else ""
            # Under the command manager in its own words (its process exited), not systemd's.
            how = (f"it is {st.state}/{st.sub_state} (Result={st.result or '?'}{code})"
                   if st.judged_by in ("systemd", "") else
                   f"its process was killed by signal {st.exit_status}" if st.result == "signal" else
                   f"its process ended with exit status {st.exit_status}" if st.exit_status is not None else
                   "its process is gone")
            raise fail(f"{what} died {phase}: {how} {elapsed():.0f}s after start{said}",
                       f"service {st.state}", st.n_restarts)
        return st.n_restarts

    try:
        healthy_detail = "no health_url: liveness only"
        first_healthy: float | None = None
        if spec.health_url:
            gaps = proc.backoff(poll_s)
            while True:
                restarts = liveness("while starting")
                remaining = deadline - time.monotonic()
                code, _body, said = _get(http, spec.health_url, max(0.5, min(10.0, remaining)))
                if code == 200:
                    first_healthy = elapsed()
                    healthy_detail = f"{spec.health_url} answered 200 after {first_healthy:.1f}s"
                    break
                progress(f"waiting for {spec.health_url}: {said}")
                if time.monotonic() >= deadline:
                    raise fail(f"{what} did not become healthy within {spec.ready_timeout_s}s: "
                               f"{spec.health_url} last answered: {said}", f"not healthy: {said}",
                               restarts,
                               hint=f"raise service.ready_timeout_s if the model needs longer to "
                                    f"load; {log_hint}")
                time.sleep(max(0.0, min(next(gaps), deadline - time.monotonic())))
        # Up once is not up: a server that crashes right after binding its port would pass.
        progress(f"{healthy_detail}; watching it for {spec.settle_s:g}s")
        settle_end = time.monotonic() + spec.settle_s
        while True:
            restarts = liveness("right after becoming healthy" if spec.health_url else "while starting")
            if spec.health_url:
                code, _body, said = _get(http, spec.health_url, 10.0)
                if code != 200:
                    # A crash closes the port a moment before systemd records it: name the
                    # crash (or the restart loop) rather than the refused connection.
                    time.sleep(min(poll_s, 1.0))
                    liveness("right after becoming healthy")
                    raise fail(f"{what} stopped being healthy right after its first 200: "
                               f"{spec.health_url} answered: {said}", f"unhealthy: {said}", restarts)
            if time.monotonic() >= settle_end:
                break
            time.sleep(max(0.0, min(poll_s, settle_end - time.monotonic())))
        detail = healthy_detail
        if spec.probe:
            code, body, said = _get(http, spec.probe.url, 60.0)
            if code != 200:
                raise fail(f"probe {spec.probe.url} failed: {said}", f"probe failed: {said}", restarts)
            if spec.probe.expect is not None and spec.probe.expect not in body:
                raise fail(f"probe {spec.probe.url} answered 200 but without {spec.probe.expect!r}: "
                           f"{said}", f"probe: {spec.probe.expect!r} missing", restarts,
                           hint="the service runs, but not what the recipe expects (service.probe.expect)")
            detail += f"; probe {spec.probe.url} ok"
        return HealthResult(ok=True, seconds=elapsed(), detail=detail, health_url=spec.health_url,
                            probe_url=spec.probe.url if spec.probe else None, n_restarts=restarts,
                            first_healthy_s=first_healthy)
    finally:
        if own_client:
            http.close()
