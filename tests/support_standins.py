"""Test support: a fake host with stand-in `journalctl` and `nvidia-smi`.

systemd itself is real in the tests (tests/support_systemd.py). What stays stood in: the GPUs
(`nvidia-smi`: there is no GPU), and a `journalctl` that replays recorded crash logs with
their original timestamps, which a real journald cannot be fed.

`fake_host` (a pytest fixture, registered in conftest.py) puts `tests/standins` first on
PATH, points `REWHEEL_FAKE_ROOT` at a fresh folder, and returns a `FakeHost` with helpers to
define GPUs and GPU-holding processes, write the journal, read the stand-ins' calls, and
start real processes; at teardown it kills every process it spawned. `fake_gpus` is the
same with only `nvidia-smi`, for tests against a real systemd and its real journal.

Also here: `free_port()`, `http_service_argv(port, ...)` (the tiny real HTTP server in
tests/services/http_service.py) and `wait_for(predicate)`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
STANDINS = TESTS / "standins"
HTTP_SERVICE = TESTS / "services" / "http_service.py"
TOOLS = ("journalctl", "nvidia-smi")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_service_argv(port: int, *, model: str = "tiny/model", python: str | None = None,
                      **options: object) -> list[str]:
    """argv for the tiny HTTP service; options map to flags (crash=True -> --crash,
    workers=2 -> --workers 2, ready_after_s=1 -> --ready-after-s 1)."""
    argv = [python or sys.executable, str(HTTP_SERVICE), "--port", str(port), "--model", model]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value not in (None, False):
            argv += [flag, str(value)]
    return argv


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, interval: float = 0.05) -> object:
    """Poll until predicate() is truthy; fail the test (not hang) after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                f = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(f[2]) == pgid and f[0] != "Z":
                members.append(int(entry))
    return members


class FakeHost:
    def __init__(self, root: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.bin = bin_dir
        self._monkeypatch = monkeypatch
        self._spawned: list[subprocess.Popen] = []
        self._groups: set[int] = set()
        for sub in ("journal",):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "calls.jsonl").touch()

    # --- the journal the journalctl stand-in reads ---
    def add_journal(self, unit: str, records: Sequence[dict]) -> None:
        """Append records (journald's field names) to the unit's journal."""
        path = self.root / "journal" / f"{unit.removesuffix('.service')}.jsonl"
        with open(path, "a", encoding="utf-8") as fh:
            for rec in records:
                fh.write(json.dumps(rec) + "\n")

    def journalctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / "journalctl"), *args], capture_output=True, text=True,
                              timeout=timeout)

    def nvidia_smi(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / "nvidia-smi"), *args], capture_output=True, text=True,
                              timeout=timeout)

    # --- GPUs ---
    def set_gpus(self, count: int, *, name: str = "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                 memory_total: int = 97887) -> list[dict]:
        gpus = [{"index": i, "name": name, "uuid": f"GPU-{i:08x}-8b7d-4c21-9e0a-1d2b3c4d5e6f",
                 "memory_total": memory_total} for i in range(count)]
        (self.root / "gpus.json").write_text(json.dumps(gpus))
        return gpus

    def gpu_uuid(self, index: int) -> str:
        gpus = json.loads((self.root / "gpus.json").read_text())
        return next(g["uuid"] for g in gpus if g["index"] == index)

    def hold_gpu(self, pid: int, *, gpu_index: int = 0, used_memory: int = 88210,
                 process_name: str | None = None, foreign: bool = False) -> None:
        """Record that `pid` holds GPU memory (shown while the pid lives)."""
        path = self.root / "gpu-procs.json"
        procs = json.loads(path.read_text()) if path.exists() else []
        procs.append({"pid": pid, "process_name": process_name or self._exe(pid),
                      "used_memory": used_memory, "gpu_uuid": self.gpu_uuid(gpu_index),
                      **({"foreign": True} if foreign else {})})
        path.write_text(json.dumps(procs))

    def set_no_driver(self, on: bool = True) -> None:
        marker = self.root / "no-driver"
        if on:
            marker.touch()
        else:
            marker.unlink(missing_ok=True)

    @staticmethod
    def _exe(pid: int) -> str:
        try:
            return os.readlink(f"/proc/{pid}/exe")
        except OSError:
            return "[Not Found]"

    # --- tools on PATH ---
    def hide(self, tool: str) -> None:
        """Make `tool` absent: drop the stand-in and every PATH folder holding a real one."""
        (self.bin / tool).unlink(missing_ok=True)
        keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
                if d == str(self.bin) or not os.access(os.path.join(d, tool), os.X_OK)]
        self._monkeypatch.setenv("PATH", os.pathsep.join(keep))

    # --- calls ---
    def calls(self, tool: str | None = None) -> list[list[str]]:
        lines = (self.root / "calls.jsonl").read_text().splitlines()
        argvs = [json.loads(line) for line in lines if line.strip()]
        return [a for a in argvs if tool is None or a[0] == tool]

    # --- real processes ---
    def spawn(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen:
        """Start a process in its own group; killed (with its group) at teardown."""
        p = subprocess.Popen(list(argv), start_new_session=True, stdin=subprocess.DEVNULL,
                             **kwargs)  # type: ignore[arg-type]
        self._spawned.append(p)
        self._groups.add(p.pid)
        return p

    def track_group(self, pgid: int) -> None:
        """Kill this process group at teardown too (e.g. a service a test started)."""
        self._groups.add(pgid)

    def cleanup(self) -> None:
        for pgid in self._groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self._spawned:
            try:
                p.kill()
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def make_fake_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   tools: Sequence[str] = TOOLS) -> FakeHost:
    root = tmp_path / "fakehost"
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    for tool in tools:
        (bin_dir / tool).symlink_to(STANDINS / tool)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("REWHEEL_FAKE_ROOT", str(root))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return FakeHost(root, bin_dir, monkeypatch)


@pytest.fixture
def fake_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHost]:
    host = make_fake_host(tmp_path, monkeypatch)
    try:
        yield host
    finally:
        host.cleanup()


@pytest.fixture
def fake_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHost]:
    """Only the nvidia-smi stand-in (for tests against a real systemd)."""
    host = make_fake_host(tmp_path, monkeypatch, tools=("nvidia-smi",))
    try:
        yield host
    finally:
        host.cleanup()
