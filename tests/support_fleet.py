"""The fleet tests' hosts, reached over real SSH (tests/test_fleet_ansible.py, tests/test_fleet_ssh.py).

Each host is its own `sshd` (Debian's openssh-server) listening on its own loopback address
127.0.0.N, with its own host key (pinned in the controller's known_hosts: strict checking), in a
mount namespace of its own where /root is the host's own folder (so `~` is the host's home for
Ansible and rewheel alike), its own environment (sshd's `SetEnv`: the uv settings this machine
reaches its index with), its own venv built by uv on toypkg 1.0.0, its own real model server and
recipe. rewheel lives on each host where a real host has it: installed by uv into
`~/.local/share/uv/tools` (the command in `~/.local/bin`), its state in `~/.local/state/rewheel`,
the rollout's stage in `~/.cache/rewheel-fleet`. The controller logs in as root with a key made
for the session and `become`s root with `su` (a real fleet's `sudo`, with no sudo to install). The tests skip, saying why, where sshd is missing; `REWHEEL_TESTS_SSH=require` (set by
.ci/run as root) fails them instead."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devtools.localindex import start_index
from devtools.wheelbuild import build_wheel
from support_env import REPO, make_venv, uv
from support_run import Host, build_toypkg
from support_standins import free_port, wait_for
from rewheel.installer import find_uv

BIN = Path(sys.executable).parent
COLLECTION = REPO / "ansible" / "rewheel" / "fleet"
SSHD = Path("/usr/sbin/sshd")
# The host's environment passes on how this machine reaches the package index and uv's cache, and
# whether Python writes byte-code (a service that writes its .pyc into the environment makes the
# next rollback delete it: the test's "a second rollback changes nothing" holds where none is written).
PASSED_ON = re.compile(r"^(PYTHONDONTWRITEBYTECODE|UV_[A-Z_]+|SSL_CERT_(FILE|DIR)|(HTTPS?|NO|ALL)_PROXY"
                       r"|(https?|no|all)_proxy)$")


def tool(name: str, *args: str, env: dict[str, str | None] | None = None, cwd: Path | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """An Ansible command; `env` adds to this process's environment (None: left out)."""
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env=_merged(env), cwd=cwd, timeout=timeout)


def _merged(env: dict[str, str | None] | None) -> dict[str, str]:
    return {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}


def recap(out: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP lines: host -> {"ok": n, "changed": n, "failed": n, ...}."""
    found = {}
    for m in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", out, re.M):
        found[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return found


def sshd_or_skip() -> None:
    why = None
    if not SSHD.exists():
        why = f"no {SSHD} (Debian's openssh-server: apt-get install openssh-server)"
    elif os.geteuid() != 0:
        why = "the SSH test hosts log in as root, and sshd must run as root"
    if why and os.environ.get("REWHEEL_TESTS_SSH") == "require":
        pytest.fail(f"the fleet's SSH hosts are required here (REWHEEL_TESTS_SSH=require): {why}")
    if why:
        pytest.skip(why)


def build_collection(root: Path) -> dict[str, str | None]:
    """The collection built and installed into a private collections path; the environment
    every Ansible command of the tests runs with."""
    built = tool("ansible-galaxy", "collection", "build", str(COLLECTION), "--output-path", str(root))
    assert built.returncode == 0, built.stdout + built.stderr
    (tarball,) = root.glob("rewheel-fleet-*.tar.gz")
    # ssh's control sockets need a short path (108 bytes, with ssh's own suffix).
    cp = tempfile.mkdtemp(prefix="rwcp-")
    env: dict[str, str | None] = {
        "ANSIBLE_HOME": str(root / "home"), "ANSIBLE_COLLECTIONS_PATH": str(root / "collections"),
        "ANSIBLE_LOCAL_TEMP": str(root / "tmp"), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_RETRY_FILES_ENABLED": "0", "ANSIBLE_CONFIG": str(root / "none.cfg"),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": cp, "ANSIBLE_PIPELINING": "1", "GITHUB_STEP_SUMMARY": None}
    installed = tool("ansible-galaxy", "collection", "install", str(tarball), "-p", str(root / "collections"),
                     env=env)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return env


def build_rewheel_wheel(out: Path) -> Path:
    """rewheel as a wheel, built from this repository by `uv build`."""
    uv("build", "--wheel", "--out-dir", str(out), str(REPO))
    (wheel,) = out.glob("rewheel-*.whl")
    return wheel


def old_rewheel_wheel(out: Path, version: str) -> Path:
    """This repository's rewheel as a wheel that says it is `version` (an older release's
    stand-in: the module refuses it by its `rewheel --version`)."""
    src = REPO / "src"
    files: dict[str, str | bytes] = {str(p.relative_to(src)): p.read_bytes() for p in src.rglob("*.py")
                                     if "__pycache__" not in p.parts}
    init = "rewheel/__init__.py"
    files[init] = re.sub(rb'__version__ = "[^"]*"', f'__version__ = "{version}"'.encode(), bytes(files[init]))
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return build_wheel(out, "rewheel", version, files, requires=deps,
                       console_scripts={"rewheel": "rewheel.cli:main"})


def _free_address() -> tuple[str, int]:
    """A loopback address of its own (127.0.0.N) and a free port on it."""
    addr = f"127.0.{random.randrange(1, 255)}.{random.randrange(2, 255)}"
    with socket.socket() as s:
        s.bind((addr, 0))
        return addr, s.getsockname()[1]


@dataclass
class SshKeys:
    """The controller's key for the tests, and its known_hosts (every test host's key)."""

    key: Path
    known_hosts: Path

    @classmethod
    def make(cls, folder: Path) -> SshKeys:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rewheel-fleet-tests",
                        "-f", str(folder / "id_ed25519")], check=True)
        (folder / "known_hosts").write_text("")
        return cls(folder / "id_ed25519", folder / "known_hosts")


class SshHost:
    """One host: its sshd on its own loopback address and port, in a mount namespace of its own
    where root's home, /root, is the host's own folder (`home`); root logs in by the test key."""

    def __init__(self, name: str, root: Path, keys: SshKeys, env: dict[str, str]) -> None:
        self.name = name
        self.root = root
        self.home = root / "home"  # /root on the host
        self.home.mkdir(parents=True, exist_ok=True)
        self.keys = keys
        self.env = {**{k: v for k, v in os.environ.items() if PASSED_ON.match(k)}, **env}
        self.address, self.port = _free_address()
        self.proc: subprocess.Popen[bytes] | None = None
        hostkey = root / "ssh_host_ed25519_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hostkey)], check=True)
        (root / "authorized_keys").write_text(Path(f"{keys.key}.pub").read_text())
        with open(keys.known_hosts, "a") as f:
            f.write(f"[{self.address}]:{self.port} {Path(f'{hostkey}.pub').read_text()}")
        setenv = " ".join(json.dumps(f"{k}={v}") for k, v in self.env.items())
        (root / "sshd_config").write_text("\n".join([
            f"ListenAddress {self.address}", f"Port {self.port}", f"HostKey {hostkey}",
            f"PidFile {root / 'sshd.pid'}", f"AuthorizedKeysFile {root / 'authorized_keys'}",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            # No PAM: no logind session that could outlive (or kill) what a test starts.
            "UsePAM no", "StrictModes no", "PrintMotd no", "PrintLastLog no", "Subsystem sftp internal-sftp",
            *([f"SetEnv {setenv}"] if setenv else []), ""]))

    def start(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation folder
        log = open(self.root / "sshd.log", "ab")
        # (exec: the listener keeps the pid Popen knows)
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
             'mount --bind "$1" /root && exec "$2" -D -e -f "$3"', "sh", str(self.home), str(SSHD),
             str(self.root / "sshd_config")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()

        def listening() -> bool:
            assert self.proc is not None and self.proc.poll() is None, (self.root / "sshd.log").read_text()
            with socket.socket() as s:
                return s.connect_ex((self.address, self.port)) == 0

        wait_for(listening, timeout=20)

    def ssh_argv(self) -> list[str]:
        return ["ssh", "-F", "/dev/null", "-i", str(self.keys.key), "-o", "IdentitiesOnly=yes",
                "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={self.keys.known_hosts}",
                "-o", "BatchMode=yes", "-p", str(self.port), f"root@{self.address}"]

    def run(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """A command on the host, over SSH (as an operator types it there)."""
        return subprocess.run([*self.ssh_argv(), "--", shlex.join(argv)], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout)

    def sessions(self) -> list[int]:
        """The sshd processes serving this host's connections (the listener's children)."""
        if self.proc is None:
            return []
        found = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    stat = (d / "stat").read_text()
                except OSError:
                    continue
                comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
                if comm == "sshd" and int(rest[1]) == self.proc.pid:
                    found.append(int(d.name))
        return found

    def kill_sessions(self) -> list[int]:
        """The network drops: SIGKILL to every sshd process serving a connection."""
        pids = self.sessions()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return pids

    def stop(self) -> None:
        """The host goes away: its listener and every connection it serves."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill_sessions()
            self.proc.kill()
            self.proc.wait(10)

    def inventory(self) -> dict[str, Any]:
        return {"ansible_host": self.address, "ansible_port": self.port, "ansible_user": "root",
                "ansible_ssh_private_key_file": str(self.keys.key),
                "ansible_ssh_common_args": f"-F /dev/null -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes "
                                           f"-o UserKnownHostsFile={self.keys.known_hosts}",
                "ansible_python_interpreter": "/usr/bin/python3",
                "ansible_become": True, "ansible_become_method": "su"}

    def link_rewheel(self, command: Path) -> None:
        """rewheel as a host image has it preinstalled: `~/.local/bin/rewheel`, a link to a
        rewheel installed once for many hosts (`shared_rewheel`; each host's own install, by the
        role, is what tests/test_fleet_ansible.py runs)."""
        bin_dir = self.home / ".local" / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        (bin_dir / "rewheel").symlink_to(command)


def shared_rewheel(folder: Path, wheel: Path, *, compile_bytecode: bool = True) -> Path:
    """rewheel installed once by uv into `folder` (its own tool environment, byte-compiled as the
    install role compiles it unless told not to), for hosts to link."""
    env = {**os.environ, "UV_TOOL_DIR": str(folder / "tools"), "UV_TOOL_BIN_DIR": str(folder / "bin")}
    cp = subprocess.run([find_uv(), "tool", "install", *(["--compile-bytecode"] if compile_bytecode else []),
                         "--python", sys.executable, str(wheel)], capture_output=True, text=True, env=env)
    assert cp.returncode == 0, cp.stderr
    return folder / "tools" / "rewheel" / "bin" / "rewheel"


@dataclass
class Fleet:
    root: Path
    hosts: dict[str, Host]
    ssh: dict[str, SshHost]
    homes: dict[str, Path]  # each host's REWHEEL_HOME (rewheel's default under the host's home)
    good_lock: Path
    bad_lock: Path
    env: dict[str, str | None]
    wheel: Path
    index: Any = None
    started: list[subprocess.Popen[str]] = field(default_factory=list)
    times: list[tuple[str, float]] = field(default_factory=list)  # (arguments, seconds) of each playbook

    def _argv(self, lock: Path, args: tuple[str, ...]) -> list[str]:
        # The lock as an operator types it: relative to where ansible-playbook runs.
        return [str(BIN / "ansible-playbook"), "rewheel.fleet.rollout", "-i", str(self.root / "inventory.yml"),
                "-e", f"rewheel_lock={lock.relative_to(self.root)}", "-e", f"rewheel_wheel={self.wheel}", *args]

    def playbook(self, lock: Path, *args: str) -> subprocess.CompletedProcess[str]:
        t0 = time.monotonic()
        cp = subprocess.run(self._argv(lock, args), capture_output=True, text=True, stdin=subprocess.DEVNULL,
                            env=_merged(self.env), cwd=self.root, timeout=600)
        self.times.append((" ".join(args), time.monotonic() - t0))
        (self.root / "last-playbook.log").write_text(cp.stdout + cp.stderr)
        return cp

    def start_playbook(self, lock: Path, *args: str) -> subprocess.Popen[str]:
        """The playbook in the background (its output read at its end by `finish`)."""
        proc = subprocess.Popen(self._argv(lock, args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL, env=_merged(self.env), cwd=self.root)
        self.started.append(proc)
        return proc

    def states(self) -> dict[str, dict[str, tuple]]:
        return {name: h.state() for name, h in self.hosts.items()}

    def served(self) -> dict[str, str | None]:
        return {name: h.served_version() for name, h in self.hosts.items()}

    def summary(self) -> str:
        """The Markdown the last playbook appended (then cleared, for the next one's)."""
        path = self.root / "summary.md"
        text = path.read_text() if path.exists() else ""
        path.unlink(missing_ok=True)
        return text

    def reports(self) -> dict[str, dict]:
        return {p.stem: json.loads(p.read_text()) for p in sorted((self.root / "reports").glob("*.json"))}

    def journals(self, name: str) -> dict[str, list[dict]]:
        """The host's run journals by run id (records as written), oldest first."""
        out = {}
        # (run ids begin with their start time: their names sort them)
        for p in sorted(self.homes[name].glob("envs/*/runs/*/journal.jsonl"), key=lambda p: p.parent.name):
            out[p.parent.name] = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        return out

    def stage(self, name: str) -> Path:
        return self.ssh[name].home / ".cache" / "rewheel-fleet"


def make_fleet(tmp_path: Path, names: tuple[str, ...], keys: SshKeys, ansible_env: dict[str, str | None],
               wheel: Path, monkeypatch: pytest.MonkeyPatch, *, host_env: dict[str, dict[str, str]] | None = None,
               env_roots: dict[str, Path] | None = None) -> Fleet:
    """Hosts on toypkg 1.0.0, each serving it, each its own sshd; locks for toypkg 2.0.0 (good)
    and 3.0.0 (its model init fails: the smoke test breaks). `host_env`: more of a host's
    environment (a REWHEEL_HOME there is its home); `env_roots`: where a host's venv and recipe
    live (default with the rest of its files, tmp_path/NAME), e.g. on a small filesystem."""
    wheels = tmp_path / "wheels"
    build_toypkg(wheels, "1.0.0")
    build_toypkg(wheels, "2.0.0")
    build_toypkg(wheels, "3.0.0", "smoke-fails")
    index = start_index(wheels)
    locks = {}
    for lock_name, version in (("good", "2.0.0"), ("bad", "3.0.0")):
        folder = tmp_path / "lockfiles" / lock_name
        folder.mkdir(parents=True)
        (folder / "req.in").write_text(f"toypkg=={version}\n")
        uv("pip", "compile", "-q", "--index-url", index.url, str(folder / "req.in"),
           "-o", str(folder / "pylock.toy.toml"))
        locks[lock_name] = folder / "pylock.toy.toml"
    fleet = Fleet(tmp_path, {}, {}, {}, locks["good"], locks["bad"], {}, wheel, index)
    inventory: dict[str, Any] = {}
    for name in names:
        d = tmp_path / name
        extra = (host_env or {}).get(name, {})
        ssh = SshHost(name, d, keys, extra)
        e = (env_roots or {}).get(name) or d
        py = make_venv(e / "env")
        uv("pip", "install", "-q", "--python", str(py), "--index-url", index.url, "toypkg==1.0.0")
        h = Host(e, py, free_port(), wheels, index.url, e / "toy.toml")
        h.write_recipe()
        fleet.homes[name] = Path(extra["REWHEEL_HOME"]) if "REWHEEL_HOME" in extra \
            else ssh.home / ".local" / "state" / "rewheel"
        monkeypatch.setenv("REWHEEL_HOME", str(fleet.homes[name]))  # the service's pid file lives there
        h.start_service()
        ssh.start()
        fleet.hosts[name], fleet.ssh[name] = h, ssh
        inventory[name] = {**ssh.inventory(), "rewheel_recipe": str(h.recipe)}
    # JSON is YAML: Ansible's YAML inventory reads it.
    (tmp_path / "inventory.yml").write_text(json.dumps({"gpu_fleet": {
        "hosts": inventory, "vars": {"rewheel_uv": find_uv(), "rewheel_tool_python": sys.executable}}}))
    fleet.env = {**ansible_env, "ANSIBLE_CALLBACKS_ENABLED": "rewheel.fleet.fleet_summary",
                 "REWHEEL_FLEET_REPORTS": str(tmp_path / "reports"), "REWHEEL_FLEET_REWHEEL": str(BIN / "rewheel"),
                 "REWHEEL_FLEET_SUMMARY": str(tmp_path / "summary.md")}
    return fleet


def stop_fleet(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    for proc in fleet.started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    for name, h in fleet.hosts.items():
        fleet.ssh[name].stop()
        monkeypatch.setenv("REWHEEL_HOME", str(fleet.homes[name]))
        h.stop_service()
    if fleet.index is not None:
        fleet.index.stop()


def wait_journal(fleet: Fleet, name: str, predicate: Any, timeout: float = 120) -> tuple[str, list[dict]]:
    """(run id, records) of the newest run journal of host `name`, once `predicate(records)` holds."""
    found: list[tuple[str, list[dict]]] = []

    def ready() -> bool:
        found[:] = list(fleet.journals(name).items())
        return bool(found) and bool(predicate(found[-1][1]))

    wait_for(ready, timeout=timeout, interval=0.1)
    return found[-1]


def control_dir_cleanup(env: dict[str, str | None]) -> None:
    cp = env.get("ANSIBLE_SSH_CONTROL_PATH_DIR")
    if cp:
        shutil.rmtree(cp, ignore_errors=True)



# -- fixtures (imported by name into the fleet test modules) ---------------------------------------
@pytest.fixture(scope="module")
def ansible_home(tmp_path_factory: pytest.TempPathFactory):
    env = build_collection(tmp_path_factory.mktemp("ansible"))
    yield env
    control_dir_cleanup(env)


@pytest.fixture(scope="module")
def rewheel_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_rewheel_wheel(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def ssh_keys(tmp_path_factory: pytest.TempPathFactory) -> SshKeys:
    sshd_or_skip()
    return SshKeys.make(tmp_path_factory.mktemp("ssh"))
