"""The environment lock belongs to the environment, not to a state home (issue 14, item 4):
machine-wide, keyed by the prefix's device and inode, so two homes (or a recipe `store` and
a `--python` command) never both act on one environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from support_env import make_venv
from rewheel.errors import LinkInState, LockHeld
from rewheel.journal import EnvLock
import support_cli


def _target(python: Path):
    from rewheel.recipe import load_target
    from rewheel.commands import open_target

    return open_target(load_target(None, str(python)))


def _rewheel(*args: str, home: Path) -> subprocess.CompletedProcess:
    return support_cli.rewheel(*args, stdin=subprocess.DEVNULL, env={**os.environ, "REWHEEL_HOME": str(home)},
                               timeout=180)


def test_two_homes_on_one_environment_the_second_gets_4(tmp_path: Path) -> None:
    py = make_venv(tmp_path / "env")
    t = _target(py)  # the home of this test (REWHEEL_HOME from conftest)
    other_home = tmp_path / "other-home"
    store = tmp_path / "recipe-store"
    recipe = tmp_path / "r.toml"
    recipe.write_text(tomli_w.dumps({"name": "r", "environment": {"python": str(py)},
                                     "snapshots": {"store": str(store)}}))
    with EnvLock(t.store.env_dir, "test holds it", prefix=t.env.prefix):
        for args, home in ((("snapshot", "--python", str(py), "--json"), other_home),
                           (("snapshot", str(recipe), "--json"), other_home)):
            cp = _rewheel(*args, home=home)
            assert cp.returncode == 4, cp.stderr
            doc = json.loads(cp.stdout)
            assert doc["error"] == "LockHeld"
            # It names the holder: this test's process and what it does.
            assert f"pid {os.getpid()}: test holds it" in doc["message"], doc
        # Through a symlink to the prefix: still the same environment.
        link = tmp_path / "link-env"
        link.symlink_to(t.env.prefix)
        cp = _rewheel("snapshot", "--python", str(link / "bin" / "python"), home=other_home)
        assert cp.returncode == 4, cp.stderr
    # Released: both homes work again, one after the other.
    assert _rewheel("snapshot", "--python", str(py), home=other_home).returncode == 0
    assert _rewheel("snapshot", str(recipe), home=other_home).returncode == 0
    assert any(store.iterdir())  # the recipe's store holds its snapshot


def test_the_lock_file_is_machine_wide_and_removed_on_release(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REWHEEL_LOCK_DIR", str(tmp_path / "locks"))
    (tmp_path / "locks").mkdir()
    prefix = tmp_path / "env"
    prefix.mkdir()
    st = prefix.stat()
    with EnvLock(tmp_path / "home-a", "a", prefix=prefix) as lk:
        assert lk.path == tmp_path / "locks" / f"rewheel-locks-{os.geteuid()}" / \
            f"env-{st.st_dev:x}-{st.st_ino}.lock"
        assert (lk.path.parent.stat().st_mode & 0o777) == 0o700
        holder = json.loads(lk.path.read_text().splitlines()[0])
        assert holder["pid"] == os.getpid() and holder["purpose"] == "a"
        with pytest.raises(LockHeld, match="another rewheel process"):
            with EnvLock(tmp_path / "home-b", "b", prefix=prefix):
                pass
        path = lk.path
    assert not path.exists()  # lock files do not pile up in /run/lock
    with EnvLock(tmp_path / "home-b", "b", prefix=prefix):
        pass


def test_a_symlinked_lock_file_or_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "locks"
    base.mkdir()
    monkeypatch.setenv("REWHEEL_LOCK_DIR", str(base))
    prefix = tmp_path / "env"
    prefix.mkdir()
    st = prefix.stat()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    folder = base / f"rewheel-locks-{os.geteuid()}"
    folder.mkdir(mode=0o700)
    (folder / f"env-{st.st_dev:x}-{st.st_ino}.lock").symlink_to(victim)
    with pytest.raises(LinkInState, match="is a symlink"):  # exit 3, as any link in rewheel's folders
        with EnvLock(tmp_path / "home", "x", prefix=prefix):
            pass
    assert victim.read_text() == "precious\n"

    (folder / f"env-{st.st_dev:x}-{st.st_ino}.lock").unlink()
    folder.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder.symlink_to(elsewhere)
    with pytest.raises(LinkInState, match=f"{folder} is a symlink"):
        with EnvLock(tmp_path / "home", "x", prefix=prefix):
            pass
    assert not any(elsewhere.iterdir())


def _leftover_holding(lock: Path, holder_pid: int) -> subprocess.Popen:
    """A process that holds the lock file the way a child a killed rewheel started does: the
    file locked, the gone rewheel's record in it; it lets go when its stdin closes."""
    code = ("import fcntl, json, os, sys\n"
            f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            f"os.write(fd, json.dumps({{'pid': {holder_pid}, 'start': 1, 'purpose': 'bisect'}}).encode() + b'\\n')\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "held\n"
    return p


def test_a_leftover_that_ends_while_the_lock_is_asked_for_leaves_it_free(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The rewheel that held the lock was killed and a process it started still held it when a
    new command asked — then ended before the command looked for it (a smoke test outliving
    its rewheel by milliseconds): the command takes the lock instead of refusing for "unknown
    processes". One that is still there is named, and the command refused (exit 4)."""
    py = make_venv(tmp_path / "env")
    t = _target(py)
    lock_path = EnvLock(t.store.env_dir, "probe", prefix=t.env.prefix)._lock_path()[0]
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has now: the killed rewheel's

    still = _leftover_holding(lock_path, gone.pid)
    try:
        with pytest.raises(LockHeld) as held:
            with EnvLock(t.store.env_dir, "second", prefix=t.env.prefix):
                pass
        assert f"(pid {gone.pid}: bisect) is gone" in held.value.message
        assert f"hold its lock: {still.pid} (" in held.value.message, held.value.message
    finally:
        assert still.stdin is not None
        still.stdin.close()
        still.wait(10)

    from rewheel import proc

    ending = _leftover_holding(lock_path, gone.pid)
    looked = proc.fd_holders

    def ends_first(path: Path) -> list[int]:
        assert ending.stdin is not None
        ending.stdin.close()
        ending.wait(10)  # it ends between the first ask and the look for who holds it
        return looked(path)

    monkeypatch.setattr(proc, "fd_holders", ends_first)
    with EnvLock(t.store.env_dir, "third", prefix=t.env.prefix) as lock:
        assert lock.path == lock_path
    assert ending.returncode == 0
