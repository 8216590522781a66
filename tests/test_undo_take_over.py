"""A rollback's undo snapshot takes over the files its restore replaces (`privatize`).

The build a rollback replaces holds files whose bytes the store lacks; the undo snapshot
links their live inodes instead of copying them, and settles them once the restore is done:
nothing to copy where the store then holds the only link (a run's copy-mode install), a copy
where uv's cache still links the inode (`uv pip install`), a copy where the environment still
does (the restore never came), and nothing kept where the bytes changed meanwhile. Shown end to
end with real uv installs, real editors' write patterns and the detached settling process:
no edit, in any of these orders, reaches a snapshot.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from support_env import make_venv, tree_state, uv_install
from test_hand_edits import (edit_everything, json_of, private_uv_cache, r_plus, rewheel, text_files,
                             upgraded_host, uv_cache_inodes)
from rewheel.commands import open_target, rollback, snapshot_now
from rewheel.recipe import Recipe
from rewheel.snapshot import Manifest, SnapshotMeta, hand_editable, privatize, restore as restore_mod
from rewheel.snapshot.integrity import verify_store

COPY = ("--link-mode", "copy")


def snapshot_dir(home: Path, snap_id: str) -> Path:
    found = list(home.glob(f"envs/*/snapshots/{snap_id}"))
    assert len(found) == 1, found
    return found[0]


def taken_over(home: Path, snap_id: str) -> list[tuple[Path, int, str]]:
    """(object, the live inode the snapshot recorded, its path) of every hand-editable file
    the snapshot holds by a linked object: what it took over."""
    path = snapshot_dir(home, snap_id)
    snap = SnapshotMeta.load(path, path.parent)
    man = Manifest.load(snap, validate=False)
    return [(Path(man.stored_path(snap, e)), e.ino or 0, e.path) for e in man.entries
            if e.kind == "f" and e.stored == "link" and hand_editable(e.path.rpartition("/")[2], e.size)]


def settled(home: Path, timeout: float = 120.0) -> None:
    """Wait for the detached process that settles what an undo snapshot took over."""
    deadline = time.monotonic() + timeout
    while any(privatize.pending(d) for d in home.glob("envs/*")):
        assert time.monotonic() < deadline, "the undo snapshot was never settled"
        time.sleep(0.05)


def test_a_runs_build_is_taken_over_without_a_copy_and_no_edit_reaches_it(
        host_factory, rewheel_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # rewheel's run installs by copies: once the restore replaced them, the store holds the
    # new build's files alone, and settling them copies nothing.
    h, target, _ = upgraded_host(host_factory, tmp_path, monkeypatch)
    upgraded = h.state()
    doc = json_of(rewheel("rollback", target, "--yes", "--json"))
    undo = doc["undo_snapshot_id"]
    meta = json.loads((snapshot_dir(rewheel_home, undo) / "meta.json").read_text())
    assert meta["extra"]["files_taken_over"] > 0
    objs = taken_over(rewheel_home, undo)
    assert len(objs) >= meta["extra"]["files_taken_over"]
    settled(rewheel_home)
    live = uv_cache_inodes(h.prefix)
    for obj, ino, _ in objs:
        st = obj.lstat()
        # The very inode the build had (no copy made), now the store's alone.
        assert st.st_ino == ino and st.st_nlink == 1 and (st.st_dev, st.st_ino) not in live, obj
    used = edit_everything(text_files(h.prefix))
    assert min(used.values()) >= 3
    check = json_of(rewheel("verify", target, "--full", "--json"))
    assert check["ok"] is True and all(s["damaged"] == [] for s in check["snapshots"])
    json_of(rewheel("rollback", target, undo, "--yes", "--json", "--force"))
    assert h.state() == upgraded


def test_a_by_hand_upgrade_linked_from_uvs_cache_is_copied_after_the_rollback(
        tmp_path: Path, wheelhouse: Path, rewheel_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `uv pip install` links the new build from uv's cache: after the restore the cache still
    # links each taken-over inode, and a later install would link it into an environment
    # again. Settling gives each its own copy; an edit through such a later install reaches
    # no snapshot.
    private_uv_cache(tmp_path, monkeypatch)
    py = make_venv(tmp_path / "env")
    prefix = py.parent.parent
    uv_install(py, "toypkg==1.0.0", "toyhelper==1.0.0", find_links=wheelhouse)
    pre = json_of(rewheel("snapshot", "--python", str(py), "--json"))["id"]
    uv_install(py, "toypkg==2.0.0", "toyhelper==1.1.0", find_links=wheelhouse)
    upgraded = tree_state(prefix)
    doc = json_of(rewheel("rollback", "--python", str(py), pre, "--yes", "--json"))
    undo = doc["undo_snapshot_id"]
    objs = taken_over(rewheel_home, undo)
    assert objs
    settled(rewheel_home)
    cache = uv_cache_inodes(tmp_path / "uv-cache")
    for obj, ino, rel in objs:
        st = obj.lstat()
        # The store's alone: a copy where uv's cache linked it (the packages' sources), the
        # very inode where the install wrote it itself (RECORD, INSTALLER...).
        assert st.st_nlink == 1 and (st.st_dev, st.st_ino) not in cache, obj
        if rel.endswith(".py") and ".dist-info" not in rel:
            assert st.st_ino != ino, rel
    assert any(rel.endswith(".py") for _, _, rel in objs)
    # uv links its cache's inodes in again; every text file is edited in place or over.
    uv_install(py, "toypkg==2.0.0", "toyhelper==1.1.0", find_links=wheelhouse, extra=("--reinstall",))
    assert any(p.stat().st_nlink > 1 for p in text_files(prefix) if "toypkg" in str(p))
    edit_everything([p for p in text_files(prefix) if "site-packages/toy" in str(p)])
    check = json_of(rewheel("verify", "--python", str(py), "--full", "--json"))
    assert check["ok"] is True and all(s["damaged"] == [] for s in check["snapshots"])
    json_of(rewheel("rollback", "--python", str(py), undo, "--yes", "--json", "--no-undo"))
    assert tree_state(prefix) == upgraded


@pytest.fixture
def upgraded_by_copies(tmp_path: Path, wheelhouse: Path, rewheel_home: Path) -> tuple[Path, str]:
    py = make_venv(tmp_path / "env")
    uv_install(py, "toypkg==1.0.0", "toyhelper==1.0.0", find_links=wheelhouse, extra=COPY)
    pre = snapshot_now(open_target(Recipe.for_python(py))).result.meta.id
    uv_install(py, "toypkg==2.0.0", "toyhelper==1.1.0", find_links=wheelhouse, extra=("--reinstall", *COPY))
    return py, pre


def _commit_fails(how: type[BaseException]):  # noqa: ANN202 - a stand-in method
    def commit(self, **kw):  # noqa: ANN001, ANN003, ANN202
        self.discard()
        raise how("stopped before the commit")
    return commit


def test_a_rollback_that_stops_before_its_restore_settles_by_copies(
        upgraded_by_copies: tuple[Path, str], rewheel_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The restore never came: the environment still links every taken-over inode, so each is
    # copied before the rollback reports its error, and an edit after it reaches nothing.
    py, pre = upgraded_by_copies
    prefix = py.parent.parent
    before = tree_state(prefix)
    with monkeypatch.context() as m, pytest.raises(RuntimeError):
        m.setattr(restore_mod.PreparedRestore, "commit", _commit_fails(RuntimeError))
        rollback(open_target(Recipe.for_python(py)), pre)
    assert tree_state(prefix) == before
    assert not any(privatize.pending(d) for d in rewheel_home.glob("envs/*"))
    undo = [m for m in open_target(Recipe.for_python(py)).store.list() if m.status == "pre-rollback"]
    assert len(undo) == 1
    objs = taken_over(rewheel_home, undo[0].id)
    assert objs
    live = uv_cache_inodes(prefix)
    assert all(o.lstat().st_nlink == 1 and (o.lstat().st_dev, o.lstat().st_ino) not in live for o, _, _ in objs)
    edit_everything([p for p in text_files(prefix) if "site-packages/toy" in str(p)])
    # (In this process: the rollback stopped by an error is still open in its journal.)
    check = verify_store(open_target(Recipe.for_python(py)).store, None, full=True)
    assert check.ok and len(check.results) == 2 and all(r.damaged == [] for r in check.results)


def test_an_edit_after_a_rollback_killed_before_its_restore_is_kept_by_no_snapshot(
        upgraded_by_copies: tuple[Path, str], rewheel_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Killed (here: interrupted) between the undo snapshot and the restore, nothing is settled;
    # a person then edits a taken-over file in place. The next restore settles first: that
    # object's bytes are not its name's any more, so it is removed (the undo snapshot then
    # names that file as damaged) — the edit is in no snapshot.
    py, pre = upgraded_by_copies
    prefix = py.parent.parent
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(restore_mod.PreparedRestore, "commit", _commit_fails(KeyboardInterrupt))
        rollback(open_target(Recipe.for_python(py)), pre)
    assert any(privatize.pending(d) for d in rewheel_home.glob("envs/*"))
    undo = next(m for m in open_target(Recipe.for_python(py)).store.list() if m.status == "pre-rollback").id
    objs = taken_over(rewheel_home, undo)
    by_ino = {ino: obj for obj, ino, _ in objs}
    edited = next(p for p in text_files(prefix) if p.lstat().st_ino in by_ino and p.name.endswith(".py"))
    obj = by_ino[edited.lstat().st_ino]
    r_plus(edited)
    assert obj.read_bytes() == edited.read_bytes()  # one inode, until it is settled
    res = rollback(open_target(Recipe.for_python(py)), pre)  # finishes the interrupted one
    assert res.restore.written > 0
    assert not obj.exists()
    others = [o for o, _, _ in objs if o != obj]
    assert others and all(o.lstat().st_nlink == 1 for o in others)
    check = json_of(rewheel("verify", "--python", str(py), "--json"), code=3)
    bad = {s["snapshot_id"]: s for s in check["snapshots"]}[undo]
    rel = str(edited.relative_to(prefix))
    assert [d["path"] for d in bad["damaged"]] == [rel]
