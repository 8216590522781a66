"""What a restore moves out of the environment leaves by the store's trash.

A rollback that removes a folder (the failed build's new dist-info, a package the old set
did not have) renames it out of the environment during the commit. Deleting it, thousands
of unlinks for a real package, is not the rollback's work: the folder goes by one rename
into the store's trash and a detached `rm -rf` deletes it after the command has exited.
The environment is exact when the restore returns, whether or not that deletion has run.
Real venvs, real wheels, real `rm` (behind a wrapper that waits, so that "it did not wait
for the deletion" is something a test can see)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from support_env import make_venv, tree_state, uv_install
from rewheel.environment import Environment
from rewheel.snapshot import Store, restore_snapshot, take_snapshot
from rewheel.snapshot import restore as restore_mod
from rewheel.snapshot.restore import TRASH, TRASH_STALE_S
import support_cli

COPY = ("--link-mode", "copy")


@pytest.fixture(params=[1, 2], ids=["one-lane", "two-lanes"])
def lanes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(restore_mod, "auto_lanes", lambda snap: request.param)
    return request.param


def upgraded(prefix: Path, wheelhouse: Path) -> tuple[Path, Environment, Store, object, dict]:
    """toypkg 1.0.0 snapshotted, then upgraded to 2.0.0: the restore must remove the new
    version's dist-info folder (and so displace it)."""
    py = make_venv(prefix)
    uv_install(py, "toypkg==1.0.0", "toyhelper==1.0.0", find_links=wheelhouse, extra=COPY)
    env = Environment.inspect(py)
    store = Store(env.prefix)
    before = tree_state(env.prefix)
    snap = take_snapshot(env, store, label="pre", status="pre-upgrade").meta
    uv_install(py, "toypkg==2.0.0", find_links=wheelhouse, extra=COPY)
    assert list(env.prefix.glob("lib/python3*/site-packages/toypkg-2.0.0.dist-info"))  # the premise
    return py, env, store, snap, before


def trashed(store: Store) -> list[str]:
    """Every path under the store's trash, relative to it (walked again when the detached rm
    deletes a folder while it is walked)."""
    trash = store.home / TRASH
    while True:
        try:
            return sorted(str(p.relative_to(trash)) for p in trash.rglob("*")) if trash.exists() else []
        except FileNotFoundError:
            continue


def holds_the_new_dist_info(store: Store) -> bool:
    """Whether the trash holds toypkg 2.0.0's dist-info (under a staged name)."""
    trash = store.home / TRASH
    return any("Version: 2.0.0" in m.read_text() and "Name: toypkg" in m.read_text()
               for m in trash.rglob("METADATA"))


def wait_until_empty(store: Store, seconds: float = 30.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while trashed(store) and time.monotonic() < deadline:
        time.sleep(0.05)
    return trashed(store)


@pytest.fixture
def slow_rm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`rm` on PATH that records its arguments, waits for a release file, then runs the real
    rm: while it waits, what it was given is still in the trash for a test to see."""
    bindir = tmp_path / "slow-rm-bin"
    bindir.mkdir()
    real = shutil.which("rm")
    assert real
    gate = tmp_path / "release-rm"
    log = tmp_path / "rm-calls"
    script = bindir / "rm"
    script.write_text(f"""#!/bin/sh
printf '%s\\n' "$*" >> {log}
i=0
while [ ! -e {gate} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
exec {real} "$@"
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return gate


def test_the_restore_returns_exact_before_the_deletion_runs(tmp_path: Path, wheelhouse: Path, lanes: int,
                                                            slow_rm: Path) -> None:
    _py, env, store, snap, before = upgraded(tmp_path / "env", wheelhouse)
    res = restore_snapshot(env, snap)
    assert res.lanes == lanes
    # Exact now (every file hashed): nothing of the new version, no staging folder left inside.
    assert tree_state(env.prefix) == before
    assert res.displaced == []
    # The new dist-info is in the trash, its deletion not yet run (the rm waits for the gate).
    assert holds_the_new_dist_info(store), trashed(store)
    calls = (tmp_path / "rm-calls")
    deadline = time.monotonic() + 30
    # (the shell creates the file for `>>` before printf writes the line: wait for the line)
    while not (calls.exists() and calls.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.05)
    args = calls.read_text().split()
    assert args[:2] == ["-rf", "--"] and Path(args[2]).parent == store.home / TRASH
    slow_rm.touch()
    assert wait_until_empty(store) == []
    assert tree_state(env.prefix) == before  # the deletion touched nothing of the environment


def test_a_cli_rollback_exits_without_waiting_for_the_deletion(tmp_path: Path, wheelhouse: Path,
                                                               slow_rm: Path) -> None:
    py, env, store, snap, before = upgraded(tmp_path / "env", wheelhouse)
    # Output captured through pipes, as scripts run it: the detached rm holds none of them.
    cp = support_cli.rewheel("rollback", "--python", str(py), snap.id, "--yes", "--no-undo", "--json",
                             stdin=subprocess.DEVNULL, timeout=300)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["restore"]["deleted"] >= 1
    assert tree_state(env.prefix) == before
    assert holds_the_new_dist_info(store), trashed(store)  # its deletion still waits on the gate
    slow_rm.touch()
    assert wait_until_empty(store) == []


def test_without_rm_the_restore_deletes_in_place(tmp_path: Path, wheelhouse: Path, lanes: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _py, env, store, snap, before = upgraded(tmp_path / "env", wheelhouse)
    empty = tmp_path / "no-commands"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    restore_snapshot(env, snap)
    assert tree_state(env.prefix) == before
    assert trashed(store) == []  # deleted before the restore returned


def test_on_another_filesystem_than_the_store_the_restore_deletes_in_place(
        tmp_path: Path, wheelhouse: Path, lanes: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(mnt)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()[:200]}")
    try:
        _py, env, store, snap, before = upgraded(mnt / "env", wheelhouse)
        assert os.stat(store.home).st_dev != os.stat(env.prefix).st_dev  # the premise
        restore_snapshot(env, snap)
        assert tree_state(env.prefix) == before
        assert trashed(store) == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_what_a_stopped_deletion_left_is_swept_with_the_next(tmp_path: Path, wheelhouse: Path) -> None:
    _py, env, store, snap, before = upgraded(tmp_path / "env", wheelhouse)
    trash = store.home / TRASH
    old, recent = trash / "restore-left-by-a-reboot", trash / "restore-being-deleted"
    for d in (old, recent):
        (d / "0" / "pkg").mkdir(parents=True)
        (d / "0" / "pkg" / "mod.py").write_text("x = 1\n")
    hours_ago = time.time() - TRASH_STALE_S - 60
    os.utime(old, (hours_ago, hours_ago))
    restore_snapshot(env, snap)
    assert tree_state(env.prefix) == before
    deadline = time.monotonic() + 30
    while sorted(p.name for p in trash.iterdir()) != [recent.name] and time.monotonic() < deadline:
        time.sleep(0.05)
    # This restore's folder and the stale one are gone; another deletion's folder, younger
    # than the limit, is left to that deletion.
    assert sorted(p.name for p in trash.iterdir()) == [recent.name]
    assert (recent / "0" / "pkg" / "mod.py").read_text() == "x = 1\n"
