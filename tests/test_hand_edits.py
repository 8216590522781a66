"""No edit a person makes in the environment can reach a snapshot (issue 29, item 1).

The files people edit by hand (sources, configs, scripts: `hand_editable`) are never one
inode with the store: a snapshot copies them (env -> store) and a restore copies them back
(store -> env), while binaries stay shared by hard links. Shown with real files, real
editors' write patterns and real processes, end to end through the CLI:

- in place through the file's inode (vim, which writes in place for a file with several
  links; `open(..., "r+")`; `os.pwrite`; truncate and rewrite), and rename-over, after a
  run, a rollback and further snapshots (a pinned one among them): `verify --full` finds
  every snapshot intact and a rollback to the pinned one is byte-exact;
- after a snapshot and after a restore, no hand-editable file of the environment shares
  its inode with the store, and every one a restore wrote has a link count of 1 (links
  into uv's cache, which uv made, are left to uv and to `unshare`);
- a snapshot taken before this rule (sources hard-linked into the store) is made safe by
  the next restore from it, which gives each shared source a copy of its own.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Callable
from typing import Any
from pathlib import Path

import pytest

from support_env import make_venv, tree_state, uv_install
from rewheel.snapshot import hand_editable
import support_cli

MARK = b"\n"  # an edit every kind of text survives (a source, JSON, RECORD, a shell script)


def rewheel(*args: str) -> subprocess.CompletedProcess[str]:
    return support_cli.rewheel(*args, stdin=subprocess.DEVNULL, timeout=300)


def json_of(cp: subprocess.CompletedProcess[str], code: int = 0) -> dict:
    assert cp.returncode == code, f"exit {cp.returncode}\n{cp.stdout}\n{cp.stderr}"
    return json.loads(cp.stdout)


def env_files(prefix: Path) -> list[Path]:
    """Every regular file of the environment (symlinks neither followed nor listed)."""
    out = []
    for dirpath, _, names in os.walk(prefix):
        for n in names:
            p = Path(dirpath) / n
            if stat.S_ISREG(p.lstat().st_mode):
                out.append(p)
    return sorted(out)


def text_files(prefix: Path) -> list[Path]:
    return [p for p in env_files(prefix) if hand_editable(p.name, p.lstat().st_size)]


def store_inodes(home: Path) -> set[tuple[int, int]]:
    """(device, inode) of every file any snapshot of any environment stores: the store's
    objects, and the `tree/` of a snapshot taken before them."""
    found = set()
    for dirpath, _, names in os.walk(home / "envs"):
        if "/tree" not in dirpath and "/objects" not in dirpath:
            continue
        for n in names:
            st = os.lstat(os.path.join(dirpath, n))
            found.add((st.st_dev, st.st_ino))
    return found


def assert_private(prefix: Path, home: Path, *, single: bool) -> int:
    """No hand-editable file shares its inode with the store; `single`: nor with anything
    (an environment uv installed by copies: a restore's copies, or files it unshared). The
    number of files checked."""
    stored = store_inodes(home)
    texts = text_files(prefix)
    shared = [str(p) for p in texts if (p.lstat().st_dev, p.lstat().st_ino) in stored]
    assert shared == []
    if single:
        assert [str(p) for p in texts if p.lstat().st_nlink > 1] == []
    return len(texts)


# Real editors' write patterns. Each returns whether it kept the file's inode (in place).
def vim(p: Path) -> bool:
    """vim, which writes in place into a file with several links (`backupcopy=auto`)."""
    subprocess.run(["vim", "-Es", "-u", "NONE", "-i", "NONE", "-c", "normal Go", "-c", "wq", str(p)],
                   check=True, capture_output=True, timeout=30)
    return True


def r_plus(p: Path) -> bool:
    with open(p, "r+b") as f:
        f.seek(0, os.SEEK_END)
        f.write(MARK)
    return True


def pwrite(p: Path) -> bool:
    fd = os.open(p, os.O_WRONLY)
    try:
        os.pwrite(fd, MARK, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    return True


def truncate_and_rewrite(p: Path) -> bool:
    data = p.read_bytes()
    with open(p, "wb") as f:  # O_TRUNC: the same inode, emptied, written again
        f.write(data + MARK)
    return True


def rename_over(p: Path) -> bool:
    tmp = p.with_name(p.name + ".swp-new")
    tmp.write_bytes(p.read_bytes() + MARK)
    os.chmod(tmp, stat.S_IMODE(p.lstat().st_mode))
    os.replace(tmp, p)
    return False


PATTERNS: list[Callable[[Path], bool]] = [vim, r_plus, pwrite, truncate_and_rewrite, rename_over]


def edit_everything(files: list[Path]) -> dict[str, int]:
    """Edit every file, the patterns taken in turn; how many each pattern edited."""
    used: dict[str, int] = {}
    for i, p in enumerate(files):
        how = PATTERNS[i % len(PATTERNS)]
        ino = p.lstat().st_ino
        in_place = how(p)
        assert (p.lstat().st_ino == ino) is in_place, (how.__name__, p)
        assert p.read_bytes().endswith(MARK)
        used[how.__name__] = used.get(how.__name__, 0) + 1
    return used


def uv_cache_inodes(cache: Path) -> set[tuple[int, int]]:
    """(device, inode) of every file under a folder (a uv cache, an environment)."""
    found = set()
    for dirpath, _, names in os.walk(cache):
        for n in names:
            st = os.lstat(os.path.join(dirpath, n))
            found.add((st.st_dev, st.st_ino))
    return found


def private_uv_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """uv installs by hard links from its cache (its default), so the environment's files
    start with several links, as in the issue; the cache is this test's own, since an edit
    written in place into a linked file would change the cache the other tests share."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))


def upgraded_host(host_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str, dict]:
    """A toy service upgraded 1.0.0 → 2.0.0 by `rewheel run`, on a uv cache of its own (see
    `private_uv_cache`): (the host, its recipe, the run's report)."""
    private_uv_cache(tmp_path, monkeypatch)
    h = host_factory("2.0.0", "good", binary=True)
    code, rep = h.run_json()
    assert code == 0 and rep["status"] == "upgraded", rep["_stderr"]
    return h, str(h.recipe), rep


def test_an_in_place_edit_of_every_text_file_after_a_restore_reaches_no_snapshot(
        host_factory, rewheel_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h, target, rep = upgraded_host(host_factory, tmp_path, monkeypatch)
    pre = rep["snapshot_id"]
    doc = json_of(rewheel("rollback", target, "--yes", "--json"))
    assert doc["snapshot_id"] == pre and h.served_version() == "1.0.0"
    undo = doc["undo_snapshot_id"]
    assert doc["restore"]["written"] > 0
    # After the restore no source is the store's inode; each file it wrote is a copy of its
    # own, or the very inode the environment had before the upgrade, still in uv's cache.
    n = assert_private(h.prefix, rewheel_home, single=False)
    toypkg = [p for p in text_files(h.prefix) if p.parent.name == "toypkg"]
    cached = uv_cache_inodes(tmp_path / "uv-cache")
    assert toypkg and all(p.stat().st_nlink == 1 or (p.stat().st_dev, p.stat().st_ino) in cached for p in toypkg)
    assert doc["restore"]["from_cache"] > 0  # (uv linked the environment's files from its cache)
    names = {p.name for p in text_files(h.prefix)}
    assert {"core.py", "layers.py", "__init__.py", "pyvenv.cfg", "activate", "METADATA", "RECORD"} <= names
    json_of(rewheel("pin", target, pre, "--json"))
    after = json_of(rewheel("snapshot", target, "--label", "after the rollback", "--json"))
    assert after["files_private"] > 0 and after["bytes_private"] > 0
    assert_private(h.prefix, rewheel_home, single=False)  # taking it changed nothing in the env
    assert all(p.stat().st_nlink == 1 or (p.stat().st_dev, p.stat().st_ino) in cached for p in toypkg)
    # Binaries stay shared by a hard link: the rule splits, it does not copy everything.
    ops = next(h.prefix.glob("lib/python3*/site-packages/toypkg/_ops.so"))
    assert (ops.stat().st_dev, ops.stat().st_ino) in store_inodes(rewheel_home)
    assert after["files_linked"] >= 1 and after["link_mode"] == "copy+hardlink"

    before = h.state()
    used = edit_everything(text_files(h.prefix))
    assert set(used) == {p.__name__ for p in PATTERNS} and min(used.values()) >= 3
    assert h.state() != before

    # Every snapshot is intact, byte for byte (sha256 of every stored file).
    doc = json_of(rewheel("verify", target, "--full", "--json"))
    assert doc["ok"] is True and doc["full"] is True
    snaps = {s["snapshot_id"]: s for s in doc["snapshots"]}
    assert {pre, undo, after["id"]} <= set(snaps)
    assert all(s["ok"] and s["damaged"] == [] and s["bytes_hashed"] > 0 for s in snaps.values())
    hist = json_of(rewheel("history", target, "--json"))
    assert [s.get("pinned") for s in hist["snapshots"] if s["id"] == pre] == [True]
    assert all(s["damaged_files"] == 0 for s in hist["snapshots"])

    # The pinned snapshot brings back every byte: nothing to recover, nothing damaged.
    doc = json_of(rewheel("rollback", target, pre, "--yes", "--json"))
    assert doc["recovered"] is None and doc["restore"]["written"] >= n
    assert h.state() == before
    assert h.served_version() == "1.0.0"
    assert_private(h.prefix, rewheel_home, single=False)
    # Every one was edited, so rewritten: a copy of its own, or (an editor that wrote a new
    # file left uv's copy alone) the very inode uv's cache still holds, as before the upgrade.
    cached = uv_cache_inodes(tmp_path / "uv-cache")
    assert all(p.stat().st_nlink == 1 or (p.stat().st_dev, p.stat().st_ino) in cached for p in text_files(h.prefix))


@pytest.mark.parametrize("how", PATTERNS, ids=lambda f: f.__name__)
def test_each_write_pattern_after_snapshot_and_restore(how: Callable[[Path], bool], tmp_path: Path,
                                                       wheelhouse: Path, rewheel_home: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """One pattern at a time, on a venv whose files uv linked from its cache: after the
    snapshot, an edit of a source reaches neither the snapshot nor (after a restore) any
    other name; the rollback puts back the snapshot's bytes."""
    private_uv_cache(tmp_path, monkeypatch)
    py = make_venv(tmp_path / "env")
    prefix = py.parent.parent
    uv_install(py, "toypkg==1.0.0", find_links=wheelhouse)
    core = next(prefix.glob("lib/python3*/site-packages/toypkg/core.py"))
    assert core.stat().st_nlink > 1  # linked from uv's cache
    was = core.stat().st_ino
    snap = json_of(rewheel("snapshot", "--python", str(py), "--json"))
    assert_private(prefix, rewheel_home, single=False)  # uv's links are left alone by a snapshot
    before = tree_state(prefix)
    in_place = how(core)
    assert json_of(rewheel("verify", "--python", str(py), "--full", "--json"))["ok"] is True
    doc = json_of(rewheel("rollback", "--python", str(py), snap["id"], "--yes", "--json", "--no-undo"))
    assert doc["restore"]["written"] == 1 and doc["recovered"] is None
    assert tree_state(prefix) == before
    assert_private(prefix, rewheel_home, single=False)
    if in_place:  # the edit went into uv's cache too (one inode): a copy of the snapshot's own bytes
        assert core.stat().st_nlink == 1 and doc["restore"]["from_cache"] == 0
    else:  # the cache still holds the inode the file was: put back as it was, linked
        assert core.stat().st_ino == was and doc["restore"]["from_cache"] == 1
    how(core)  # and again, now through the restored file
    assert json_of(rewheel("verify", "--python", str(py), "--full", "--json"))["ok"] is True
    json_of(rewheel("rollback", "--python", str(py), snap["id"], "--yes", "--json", "--no-undo"))
    assert tree_state(prefix) == before


def test_a_snapshot_that_shares_sources_is_made_safe_by_the_next_restore(tmp_path: Path, wheelhouse: Path,
                                                                       rewheel_home: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot taken before `hand_editable` was the rule hard-linked every pristine file,
    sources included, and its restores linked them back. The next restore from it (nothing
    else changed) gives each shared source a copy of its own — counted as `unshared`, not as
    written — and from then on an edit in place leaves the snapshot whole."""
    from rewheel.recipe import Recipe
    from rewheel.commands import open_target, snapshot_now
    from rewheel.snapshot import ingest

    py = make_venv(tmp_path / "env")
    prefix = py.parent.parent
    uv_install(py, "toypkg==1.0.0", find_links=wheelhouse, extra=("--link-mode", "copy"))
    with monkeypatch.context() as m:
        m.setattr(ingest, "hand_editable", lambda name, size: False)  # the rule before
        old = snapshot_now(open_target(Recipe.for_python(py))).result.meta
    core = next(prefix.glob("lib/python3*/site-packages/toypkg/core.py"))
    assert (core.stat().st_dev, core.stat().st_ino) in store_inodes(rewheel_home)  # the hazard
    before = tree_state(prefix)

    doc = json_of(rewheel("rollback", "--python", str(py), old.id, "--yes", "--json", "--no-undo"))
    r = doc["restore"]
    assert r["written"] == 0 and r["deleted"] == 0 and r["unshared"] >= 5  # toypkg's and its dist-info's
    assert tree_state(prefix) == before
    assert_private(prefix, rewheel_home, single=True)
    r_plus(core)
    assert json_of(rewheel("verify", "--python", str(py), "--full", "--json"))["ok"] is True
    # The restore now copies it back (the old snapshot's stored inode, checked), never links it.
    doc = json_of(rewheel("rollback", "--python", str(py), old.id, "--yes", "--json", "--no-undo"))
    assert doc["restore"]["written"] == 1 and doc["restore"]["unshared"] == 0
    assert tree_state(prefix) == before
    assert_private(prefix, rewheel_home, single=True)
    # A restore with nothing to do stays one: the copies are recognised by size and mtime.
    doc = json_of(rewheel("rollback", "--python", str(py), old.id, "--yes", "--json", "--no-undo"))
    assert doc["restore"]["written"] == 0 and doc["restore"]["unshared"] == 0



def _paused(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def test_an_edit_between_the_restore_and_the_work_after_it_reaches_no_snapshot(
        host_factory, rewheel_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollback with a service, paused right after its restore (the `start` step durable in
    its journal: the service not started yet, nothing moved to the trash, nothing pruned):
    every file a person may edit is edited then, each real editor's way in turn. The rollback
    then finishes, and every snapshot is still whole — its pre-upgrade snapshot brings back the
    restored bytes exactly, its undo snapshot the upgraded build's."""
    import signal
    import time

    h, target, rep = upgraded_host(host_factory, tmp_path, monkeypatch)
    upgraded = h.state()
    out = tmp_path / "rollback.json"
    with open(out, "w") as fo:
        p = support_cli.start("rollback", target, "--yes", "--json", stdout=fo, stderr=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL,
                              env={**os.environ, "REWHEEL_FAULT_AT": "step:start", "REWHEEL_FAULT_SIGNAL": "STOP"})
        try:
            deadline = time.monotonic() + 120
            while not _paused(p.pid):
                assert p.poll() is None and time.monotonic() < deadline, "the rollback never reached its start"
                time.sleep(0.01)
            # (what the restore moved out waits at a root for the trash, as the service starts)
            restored = {k: v for k, v in h.state().items() if not k.startswith(".rewheel-restore-")}
            used = edit_everything([p for p in text_files(h.prefix) if ".rewheel-restore-" not in str(p)])
            assert min(used.values()) >= 3 and h.state() != restored
            os.kill(p.pid, signal.SIGCONT)
            assert p.wait(timeout=120) == 0
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    doc = json.loads(out.read_text())
    undo = doc["undo_snapshot_id"]
    assert doc["restore"]["written"] > 0 and undo
    check = json_of(rewheel("verify", target, "--full", "--json"))
    assert check["ok"] is True and all(s["damaged"] == [] for s in check["snapshots"])
    # The edits stay in the environment until a rollback puts bytes back: the snapshots have
    # neither them nor anything else changed.
    json_of(rewheel("rollback", target, rep["snapshot_id"], "--yes", "--json"))
    assert h.state() == restored
    json_of(rewheel("rollback", target, undo, "--yes", "--json", "--force"))
    assert h.state() == upgraded
    assert_private(h.prefix, rewheel_home, single=False)
