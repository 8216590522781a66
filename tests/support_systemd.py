"""Test support: a real systemd, booted from the host's own /usr in a container.

`systemd-nspawn -D / --volatile=yes` boots the host's systemd with a throw-away root (nothing
to download or build; about half a second, some 40 MB). Without a host systemd, machined or
D-Bus it needs `--keep-unit --register=no`, so `systemctl -M` cannot reach it: everything
runs through `nsenter` into all of the container's namespaces (mount, UTS, IPC, network, pid,
cgroup), where MainPID and ControlGroup mean what they mean on a real host. The network is the host's: health
URLs on 127.0.0.1 answer on both sides.

What a unit or rewheel runs must exist inside at the same path: the pytest base folder (venvs,
indexes' wheels, REWHEEL_HOME, uv's cache), the repository (rewheel and its .venv), the Python
the venvs were made from, and /etc/ssl are bound in.

`systemd_machine` (session-scoped, so one per xdist worker) boots it; `real_systemd` hands it
to a test and removes the units the test added at its end. Teardown powers the container off
and removes the cgroups it ran in: the launcher moves itself into a cgroup of its own before
it execs systemd-nspawn, so whatever the container leaves is found there and killed. The
tests skip, saying why, only where systemd-nspawn is missing or not run as root — and fail
instead where `REWHEEL_TESTS_REAL_SYSTEMD=require` (set by .ci/run as root).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from support_env import REPO

CGROUP = Path("/sys/fs/cgroup")
MANAGER_STEPS = Path(__file__).resolve().parent / "services" / "manager_steps.py"
NSENTER_NAMESPACES = ("-m", "-u", "-i", "-n", "-p", "-C")
ENTER_CGROUPS = ("import os, sys\n"
                 "n = int(sys.argv[1])\n"
                 "for cg in sys.argv[2:2 + n]:\n"
                 "    with open(os.path.join(cg, 'cgroup.procs'), 'w') as f:\n"
                 "        f.write(str(os.getpid()))\n"
                 "argv = sys.argv[2 + n:]\n"
                 "os.execvp(argv[0], argv)\n")
# Quiet boot: no machine-id commit (the machine-id is a bound file), no getty on the console.
KERNEL_ARGS = ("systemd.mask=systemd-machine-id-commit.service", "systemd.mask=console-getty.service")


def unit_text(exec_start: Sequence[str] | str, *, restart: str = "no", restart_sec: float | str = 0.1,
              syslog_identifier: str | None = None, start_limit_burst: int | None = None,
              start_limit_interval_s: float | None = None, timeout_stop_s: float | None = None,
              description: str | None = None, environment: dict[str, str] | None = None,
              extra: dict[str, str] | None = None) -> str:
    """A service unit in systemd's ini format."""
    cmd = exec_start if isinstance(exec_start, str) else shlex.join(exec_start)
    unit: list[str] = ["[Unit]"]
    if description:
        unit.append(f"Description={description}")
    if start_limit_burst is not None:
        unit.append(f"StartLimitBurst={start_limit_burst}")
    if start_limit_interval_s is not None:
        unit.append(f"StartLimitIntervalSec={start_limit_interval_s}")
    unit += ["", "[Service]", "Type=simple", f"ExecStart={cmd}", f"Restart={restart}",
             f"RestartSec={restart_sec}"]
    if syslog_identifier:
        unit.append(f"SyslogIdentifier={syslog_identifier}")
    if timeout_stop_s is not None:
        unit.append(f"TimeoutStopSec={timeout_stop_s}")
    if environment:
        unit.append("Environment=" + " ".join(shlex.quote(f"{k}={v}") for k, v in environment.items()))
    for k, v in (extra or {}).items():
        unit.append(f"{k}={v}")
    return "\n".join(unit) + "\n"


def unavailable() -> str | None:
    """Why a real systemd cannot be booted here, or None."""
    if sys.platform != "linux":
        return "real systemd tests need Linux"
    if os.geteuid() != 0:
        return "real systemd tests need root (systemd-nspawn boots a container)"
    for tool in ("systemd-nspawn", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian/Ubuntu: apt-get install systemd-container)"
    if not Path("/usr/lib/systemd/systemd").exists() and not Path("/lib/systemd/systemd").exists():
        return "the host's /usr has no systemd to boot"
    return None


def _cgroup_bases() -> list[Path]:
    """Where a process's own cgroup is made: the unified tree (v2, or hybrid's unified/) and,
    on v1 and hybrid hosts, systemd's named hierarchy, which is where systemd tracks units."""
    if (CGROUP / "cgroup.controllers").exists():
        return [CGROUP]
    return [p for p in (CGROUP / "unified", CGROUP / "systemd") if (p / "cgroup.procs").exists()]


def _cgroup_pids(top: Path) -> set[int]:
    pids: set[int] = set()
    for dirpath, _dirs, files in os.walk(top):
        if "cgroup.procs" in files:
            try:
                pids.update(int(x) for x in Path(dirpath, "cgroup.procs").read_text().split())
            except OSError:
                pass
    return pids


class RealSystemd:
    """A booted container: run commands inside it, add units to it, tear it down."""

    def __init__(self, name: str, workdir: Path, binds: Sequence[Path], ro_binds: Sequence[Path]) -> None:
        self.name = name
        self.workdir = workdir
        self.cgroups = [base / name for base in _cgroup_bases()]
        self.log_path = workdir / "boot.log"
        self.leader = 0
        self.boot_s = 0.0
        self.units: set[str] = set()
        machine_id = workdir / "machine-id"
        machine_id.write_text(os.urandom(16).hex() + "\n")
        argv = ["systemd-nspawn", "-D", "/", "--volatile=yes", "--keep-unit", "--register=no",
                "-M", name, "--console=passive", f"--bind-ro={machine_id}:/etc/machine-id"]
        argv += [f"--bind={p}" for p in binds]
        argv += [f"--bind-ro={p}" for p in ro_binds]
        argv += ["-b", "--", *KERNEL_ARGS]
        self.argv = argv
        t0 = time.monotonic()
        for cg in self.cgroups:
            cg.mkdir(exist_ok=True)
        # The launcher moves itself into the cgroups, then becomes systemd-nspawn: the container
        # and all it spawns live below them (no preexec_fn: this process may have threads).
        enter = [sys.executable, "-c", ENTER_CGROUPS, str(len(self.cgroups)), *map(str, self.cgroups)]
        with open(self.log_path, "wb") as log:
            self.nspawn = subprocess.Popen([*enter, *argv], stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT)
        try:
            self.leader = self._wait_leader(t0 + 60)
            self._wait_running(t0 + 60)
        except BaseException:
            self.close()
            raise
        self.boot_s = time.monotonic() - t0

    # --- boot ---
    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
        except OSError:
            return "(no log)"

    def _wait_leader(self, deadline: float) -> int:
        """The container's pid 1 (systemd) as the host sees it: nspawn's child, once exec'd."""
        while time.monotonic() < deadline:
            if self.nspawn.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self.nspawn.returncode} while booting:\n"
                                   f"{' '.join(self.argv)}\n{self._log_tail()}")
            try:
                pid = self.nspawn.pid
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                children = []
            for child in children:
                try:
                    if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                        return int(child)
                except OSError:
                    continue
            time.sleep(0.02)
        raise RuntimeError(f"systemd-nspawn did not start systemd within 60s:\n{self._log_tail()}")

    def _wait_running(self, deadline: float) -> None:
        state = ""
        while time.monotonic() < deadline:
            cp = self.run(["systemctl", "is-system-running"], timeout=30)
            state = cp.stdout.strip()
            if state in ("running", "degraded"):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the container's systemd did not finish booting within 60s "
                           f"(is-system-running: {state!r}):\n{self._log_tail()}")

    # --- inside ---
    def nsenter(self, cwd: Path | str | None = None) -> list[str]:
        """The argv prefix that runs a command in every namespace of the container."""
        argv = ["nsenter", "-t", str(self.leader), *NSENTER_NAMESPACES]
        if cwd is not None:
            argv.append(f"--wd={cwd}")
        return [*argv, "--"]

    def run(self, argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 120,
            cwd: Path | str | None = None, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run argv inside the container (with this process's environment plus `env`)."""
        return subprocess.run([*self.nsenter(cwd), *argv], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})}, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)

    def systemctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return self.run(["systemctl", *args], timeout=timeout)

    def journalctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return self.run(["journalctl", "--no-pager", *args], timeout=timeout)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        cp = self.systemctl("show", unit, *(f"-p{p}" for p in props))
        assert cp.returncode == 0, cp.stderr
        return dict(line.split("=", 1) for line in cp.stdout.splitlines() if "=" in line)

    def messages(self, unit: str) -> list[str]:
        """The unit's journal (its output and systemd's words about it), message by message."""
        cp = self.journalctl("-u", unit, "-o", "cat")
        return cp.stdout.splitlines()

    def steps(self, unit: str, *steps: Sequence[object], timeout: float = 180) -> list[dict]:
        """Drive rewheel's SystemdManager inside (tests/services/manager_steps.py): one result
        per step, `{"ok", "value"}` or `{"ok": False, "error", "message", "hint"}`."""
        cp = self.run([sys.executable, str(MANAGER_STEPS), unit, json.dumps([list(s) for s in steps])],
                      timeout=timeout, cwd=REPO)
        assert cp.returncode == 0, f"{cp.stdout}\n{cp.stderr}"
        return json.loads(cp.stdout.splitlines()[-1])

    def add_unit(self, name: str, exec_start: Sequence[str] | str, **options: object) -> str:
        """Write a runtime unit (/run/systemd/system) and reload; returns its full name."""
        unit = name if "." in name else f"{name}.service"
        path = Path(f"/proc/{self.leader}/root/run/systemd/system") / unit
        path.write_text(unit_text(exec_start, **options))  # type: ignore[arg-type]
        self.units.add(unit)
        cp = self.systemctl("daemon-reload")
        assert cp.returncode == 0, cp.stderr
        return unit

    def remove_units(self) -> None:
        """Stop and forget every unit added since the last call (a test's end)."""
        for unit in sorted(self.units):
            self.systemctl("kill", "--signal=SIGKILL", unit)
            self.systemctl("stop", unit, timeout=120)
            self.systemctl("reset-failed", unit)
            (Path(f"/proc/{self.leader}/root/run/systemd/system") / unit).unlink(missing_ok=True)
        if self.units:
            self.systemctl("daemon-reload")
        self.units.clear()

    def transient(self, unit: str, argv: Sequence[str]) -> int:
        """Start argv as a transient unit (`systemd-run`), return its MainPID inside."""
        cp = self.run(["systemd-run", f"--unit={unit}", "--collect", "--quiet", *argv])
        assert cp.returncode == 0, cp.stderr
        full = unit if "." in unit else f"{unit}.service"
        self.units.add(full)
        return int(self.show(full, "MainPID")["MainPID"])

    # --- teardown ---
    def leftovers(self) -> set[int]:
        return set().union(*(_cgroup_pids(cg) for cg in self.cgroups if cg.exists()))

    def close(self) -> None:
        """Power off (nspawn turns SIGTERM into a clean shutdown), then kill what is left in
        the container's cgroups and remove them."""
        if self.nspawn.poll() is None:
            self.nspawn.send_signal(signal.SIGTERM)
            try:
                self.nspawn.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 15
        while (left := self.leftovers()) and time.monotonic() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        if self.nspawn.poll() is None:
            self.nspawn.wait(timeout=10)
        for cg in self.cgroups:
            for dirpath, _dirs, _files in sorted(os.walk(cg), key=lambda e: -len(e[0])):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass


def boot(workdir: Path, binds: Sequence[Path]) -> RealSystemd:
    """Boot a container that sees `binds` (read-write) and what rewheel runs from (read-only)."""
    ro = {REPO, Path(sys.base_prefix), Path(sys.prefix)}
    if Path("/etc/ssl").is_dir():
        ro.add(Path("/etc/ssl"))
    ro -= {Path("/")}
    rw = [p.resolve() for p in binds]
    ro_paths = sorted({p.resolve() for p in ro} - set(rw))
    # A folder inside another bound one is already there.
    ro_paths = [p for p in ro_paths if not any(o != p and p.is_relative_to(o) for o in [*ro_paths, *rw])]
    name = f"rewheel-test-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    return RealSystemd(name, workdir, rw, ro_paths)


@pytest.fixture(scope="session")
def systemd_machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealSystemd]:
    why = unavailable()
    if why and os.environ.get("REWHEEL_TESTS_REAL_SYSTEMD") == "require":
        pytest.fail(f"a real systemd is required here (REWHEEL_TESTS_REAL_SYSTEMD=require): {why}")
    if why:
        pytest.skip(why)
    base = tmp_path_factory.getbasetemp()
    machine = boot(tmp_path_factory.mktemp("systemd"), [base])
    try:
        yield machine
    finally:
        machine.close()
        assert not machine.leftovers(), f"the container left processes: {machine.leftovers()}"
        assert not any(cg.exists() for cg in machine.cgroups), f"cgroups left: {machine.cgroups}"


@pytest.fixture
def real_systemd(systemd_machine: RealSystemd) -> Iterator[RealSystemd]:
    """The session's real systemd; the units a test adds are stopped and removed after it."""
    try:
        yield systemd_machine
    finally:
        systemd_machine.remove_units()
