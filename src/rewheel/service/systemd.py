"""`SystemdManager(unit)`: a systemd unit, through `systemctl` and `journalctl`, parsing only
their machine forms (`systemctl show`'s `Key=Value` lines, `journalctl -o json`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from rewheel import proc
from rewheel.errors import PreflightError, ServiceError
from rewheel.service.common import (
    JOURNALCTL,
    SHOW_PROPERTIES,
    SYSTEMCTL,
    ServiceStatus,
    _alive,
    _describe_pids,
    _family,
)


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
