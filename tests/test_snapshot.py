"""Snapshots and rollback on real uv-built virtualenvs with real wheels: byte-exact, offline."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from support_env import (make_venv, manifest_doc, stored_file, to_tree_layout, tree_state, uv_install,
                         write_manifest_doc)
from rewheel import snapshot as snapmod
from rewheel.snapshot import restore as restore_mod
from rewheel.snapshot import restore_apply, restore_scan
from rewheel.environment import Environment
from rewheel.errors import RestoreError, SnapshotDamaged
from rewheel.recipe import Recipe
from rewheel.proc import proc_stat
from rewheel.commands import open_target, rollback, snapshot_now
import support_cli


COPY = ("--link-mode", "copy")


@pytest.fixture(params=[1, 2], ids=["one-lane", "two-lanes"])
def lanes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Restores in this test run in one process, then in two (the default for a large
    environment on two CPUs): the same checks must hold either way."""
    monkeypatch.setattr(restore_mod, "auto_lanes", lambda snap: request.param)
    return request.param


@pytest.fixture
def venv(tmp_path: Path, wheelhouse: Path) -> Path:
    py = make_venv(tmp_path / "env")
    # Copies, not uv's default hard links into its cache: these tests edit installed and
    # stored files in place, which would otherwise patch the cache every test shares.
    uv_install(py, "toypkg==1.0.0", "toyhelper==1.0.0", find_links=wheelhouse, extra=COPY)
    # A hand-made patch, as left by debugging (the story's deepseek_v2.py).
    core = site_packages(py) / "toypkg" / "core.py"
    core.write_text(core.read_text() + "# local patch: keep attention on rank 4 alive\n")
    return py


def site_packages(py: Path) -> Path:
    return next((py.parent.parent / "lib").glob("python3*/site-packages"))


def damage(py: Path, wheelhouse: Path) -> None:
    """Everything an upgrade and a debugging session do to an environment."""
    uv_install(py, "toypkg==2.0.0", "toyhelper==1.1.0", find_links=wheelhouse, extra=("--reinstall", *COPY))
    sp = site_packages(py)
    (sp / "toypkg" / "data" / "config.json").unlink(missing_ok=True)
    (sp / "toypkg" / "debug_dump.pt").write_bytes(os.urandom(4096))
    (py.parent.parent / "stray-dir" / "deep").mkdir(parents=True)
    (py.parent.parent / "stray-dir" / "deep" / "f.txt").write_text("stray")
    (sp / "toyhelper" / "__init__.py").chmod(0o600)
    subprocess.run([str(py), "-c", "import toypkg, toyhelper"], check=True)  # writes __pycache__


def manifest_entries(snap_path: Path) -> list[list]:
    """Every entry of a snapshot's manifest (stored by folder, as columns, since version 2)."""
    return _entries(manifest_doc(snap_path))


def needed_by_restore(entries: list[list]) -> list:
    """A shared file that `damage` replaces (toypkg is reinstalled), so a restore needs its
    stored copy."""
    return next(e for e in entries if e[2] == "f" and e[7] == "link" and e[1].endswith("/toypkg/_ops.so"))


def no_byte_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An empty uv cache (and no index: a `--python` target names none), so that a rollback
    cannot recover a damaged stored file's bytes and must refuse (tests/test_snapshot_safety.py
    shows the recovery)."""
    empty = tmp_path / "empty-uv-cache"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("UV_CACHE_DIR", str(empty))


def block_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("restore tried to use the network")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_snapshot_damage_rollback_is_byte_exact_offline(lanes: int, venv: Path, wheelhouse: Path, uv_cache: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = venv.parent.parent
    before = tree_state(prefix)
    t = open_target(Recipe.for_python(venv))
    snap = snapshot_now(t, label="before").result
    assert snap.meta.files == sum(1 for v in before.values() if v[0] == "f")
    # The patched file was copied, not linked: editing the live file in place later
    # must not reach the snapshot.
    core_rel = str((site_packages(venv) / "toypkg" / "core.py").relative_to(prefix))
    stored = stored_file(snap.meta.path, core_rel)
    assert stored.stat().st_ino != (prefix / core_rel).stat().st_ino
    assert snap.meta.versions == {"toypkg": "1.0.0", "toyhelper": "1.0.0"}

    damage(venv, wheelhouse)
    assert tree_state(prefix) != before

    # Offline, and with the uv cache gone: a restore needs neither.
    shutil.rmtree(uv_cache)
    uv_cache.mkdir()
    block_network(monkeypatch)
    res = rollback(open_target(Recipe.for_python(venv)), snap.meta.id)
    assert res.restore.written > 0 and res.restore.deleted > 0
    assert res.restore.lanes == lanes
    assert tree_state(prefix) == before
    # The environment works again on the old versions.
    out = subprocess.run([str(venv), "-c", "import toypkg, toyhelper; print(toypkg.__version__, toyhelper.HELP)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1.0.0", "1"]


def test_pristine_files_are_shared_patched_files_copied(venv: Path) -> None:
    t = open_target(Recipe.for_python(venv))
    res = snapshot_now(t).result
    prefix = venv.parent.parent
    ops_rel = str((site_packages(venv) / "toypkg" / "_ops.so").relative_to(prefix))
    assert stored_file(res.meta.path, ops_rel).stat().st_ino == (prefix / ops_rel).stat().st_ino
    # A pristine source is a copy of its own: an edit in place cannot reach it.
    init_rel = str((site_packages(venv) / "toypkg" / "__init__.py").relative_to(prefix))
    assert stored_file(res.meta.path, init_rel).stat().st_ino != (prefix / init_rel).stat().st_ino
    assert res.meta.link_mode == "copy+hardlink"
    assert res.files_linked > 0 and res.files_copied > 0
    # Only what could not be proven pristine costs disk.
    assert res.meta.bytes_copied < res.meta.bytes_total


@pytest.mark.parametrize("how", ["other-filesystem", "links-fail"])
def test_store_where_links_fail(lanes: int, venv: Path, wheelhouse: Path, tmp_path: Path, how: str,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    if how == "other-filesystem":
        shm = Path("/dev/shm")
        if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
            how = "links-fail"  # no second filesystem here: make links fail instead
        else:
            store_home = Path(os.environ.get("TMPDIR_SHM", "/dev/shm")) / f"rewheel-test-{os.getpid()}-{tmp_path.name}"
            monkeypatch.setenv("REWHEEL_HOME", str(store_home))
            request_cleanup = store_home
    if how == "links-fail":
        real_link = os.link

        def no_link(src, dst, *a, **k):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        monkeypatch.setattr(os, "link", no_link)
        request_cleanup = None
    try:
        prefix = venv.parent.parent
        before = tree_state(prefix)
        t = open_target(Recipe.for_python(venv))
        res = snapshot_now(t).result
        assert res.files_linked == 0
        assert "hardlink" not in res.meta.link_mode
        # Every byte is copied once: a content two files share (an empty __init__.py) is one object.
        j = res.to_json()
        assert res.meta.bytes_copied + j["bytes_reused"] == res.meta.bytes_total and res.meta.bytes_linked == 0
        if how == "links-fail":
            monkeypatch.setattr(os, "link", real_link)
        damage(venv, wheelhouse)
        rollback(open_target(Recipe.for_python(venv)), res.meta.id)
        assert tree_state(prefix) == before
    finally:
        if request_cleanup is not None:
            shutil.rmtree(request_cleanup, ignore_errors=True)


def _to_version_1(doc: dict) -> dict:
    """The flat layout snapshots were written in before manifest version 2."""
    return {"version": 1, "roots": doc["roots"], "real_roots": doc["real_roots"],
            "fields": ["root", "path", "type", "mode", "size", "mtime_ns", "sha256", "stored", "target"],
            "entries": [e[:9] for e in _entries(doc)]}


def _to_version_2(doc: dict) -> dict:
    """By folder, as columns, without live ctimes; an inode only for a hard-linked file."""
    folders = []
    for item in doc["folders"]:
        item = list(item[:10])
        item[8] = [ino if code == "L" else None for ino, code in zip(item[8], item[7], strict=True)]
        folders.append(item)
    return {**doc, "version": 2, "folder_fields": doc["folder_fields"][:10], "folders": folders}


def _entries(doc: dict) -> list[list]:
    return [e for item in doc["folders"] for e in snapmod.Folder(*item[2:]).entries(item[0], item[1])]


def _add_to_root(doc: dict, name: str, kind: str) -> None:
    """One more entry in the root folder's columns, named as given."""
    root = next(item for item in doc["folders"] if item[1] == "")
    names, types, modes, sizes, mtimes, stored, inos = range(2, 9)
    root[names].append(name)
    root[types] += kind
    root[modes].append(0o755)
    root[sizes].append(1)
    root[mtimes].append(0)
    root[stored] += "C" if kind == "f" else "-"
    root[inos].append(None)
    root[9] = None
    if len(root) > 10 and root[10] is not None:  # version 3: the live ctimes column
        root[10].append(0)


def _tamper(doc: dict, how: str) -> dict:
    evil = [0, "../../etc/evil", "f", 0o644, 1, 0, None, "copy", None, None]
    if how == "folder outside the prefix":
        doc["folders"].append(snapmod.Folder.of([evil]).to_json(0, "../../etc"))
    elif how == "name that climbs":
        _add_to_root(doc, "..", "d")
    elif how == "name with a slash":
        _add_to_root(doc, "../../etc/evil", "f")
    elif how == "columns that do not line up":
        doc["folders"][0][4].pop()  # one mode short
    elif how == "version 1":
        doc = _to_version_1(doc)
        doc["entries"].append(evil[:9])
    return doc


@pytest.mark.parametrize("how,message", [
    ("folder outside the prefix", "escapes the prefix"), ("name that climbs", "escapes the prefix"),
    ("name with a slash", "escapes the prefix"), ("version 1", "escapes the prefix"),
    ("columns that do not line up", "is unreadable")])
def test_tampered_manifest_is_refused_before_anything_changes(lanes: int, venv: Path, wheelhouse: Path, how: str,
                                                             message: str) -> None:
    t = open_target(Recipe.for_python(venv))
    snap = snapshot_now(t).result.meta
    damage(venv, wheelhouse)
    damaged = tree_state(venv.parent.parent)
    write_manifest_doc(snap.path, _tamper(manifest_doc(snap.path), how))
    with pytest.raises(SnapshotDamaged, match=message):
        rollback(open_target(Recipe.for_python(venv)), snap.id)
    assert tree_state(venv.parent.parent) == damaged  # never half-applied


def test_a_shared_file_replaced_with_the_same_size_and_mtime_is_put_back(lanes: int, venv: Path) -> None:
    """A file swapped for other bytes of the same size, its mtime copied over (`cp -p`, a
    careful editor): a stat cannot tell, but it is no longer the inode the snapshot shares,
    so the restore puts the original back."""
    prefix = venv.parent.parent
    before = tree_state(prefix)
    snap = snapshot_now(open_target(Recipe.for_python(venv))).result.meta
    victim = prefix / needed_by_restore(manifest_entries(snap.path))[1]
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[0] ^= 0xFF
    tmp = victim.with_name("swap.tmp")
    tmp.write_bytes(bytes(data))
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.chmod(tmp, stat.S_IMODE(st.st_mode))
    os.replace(tmp, victim)
    assert victim.stat().st_size == st.st_size and victim.stat().st_mtime_ns == st.st_mtime_ns
    res = rollback(open_target(Recipe.for_python(venv)), snap.id)
    assert res.restore.written == 1
    assert tree_state(prefix) == before


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_snapshot_still_restores_byte_for_byte(lanes: int, venv: Path, wheelhouse: Path,
                                                        version: int) -> None:
    """Snapshots taken before the store's objects: their own `tree/`, and a manifest of
    version 1 (flat entries, no inode numbers) or 2 (by folder, no live ctimes). The objects
    are swept away first, so only the tree can bring the bytes back."""
    prefix = venv.parent.parent
    before = tree_state(prefix)
    t = open_target(Recipe.for_python(venv))
    snap = snapshot_now(t).result.meta
    to_tree_layout(snap.path)
    old = _to_version_1 if version == 1 else _to_version_2
    write_manifest_doc(snap.path, old(manifest_doc(snap.path)))
    assert t.store.collect()[0] > 0  # no snapshot names an object now
    assert not [p for p in (t.store.env_dir / "objects").rglob("*") if p.is_file()]
    damage(venv, wheelhouse)
    res = rollback(open_target(Recipe.for_python(venv)), snap.id)
    assert res.restore.written > 0 and res.restore.deleted > 0
    assert tree_state(prefix) == before


@pytest.mark.parametrize("kind", ["missing", "changed-copy", "changed-shared"])
def test_damaged_store_is_refused_before_anything_changes(lanes: int, venv: Path, wheelhouse: Path, kind: str,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When no source holds the bytes (`no_byte_sources`)."""
    t = open_target(Recipe.for_python(venv))
    snap = snapshot_now(t).result.meta
    files = [e for e in manifest_entries(snap.path) if e[2] == "f"]
    if kind == "missing":
        victim = needed_by_restore(files)
        stored_file(snap.path, victim[1]).unlink()
    elif kind == "changed-copy":
        victim = next(e for e in files if e[7] == "copy" and e[1].endswith("core.py"))
        p = stored_file(snap.path, victim[1])
        data = bytearray(p.read_bytes())
        data[0] ^= 0xFF
        st = p.stat()
        p.write_bytes(bytes(data))
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # a careful tamperer keeps the mtime
    else:
        victim = needed_by_restore(files)  # one `damage` changes: the environment no longer has its bytes
        with open(stored_file(snap.path, victim[1]), "ab") as f:  # in-place edit: shared inode
            f.write(b"# edited in place\n")
    damage(venv, wheelhouse)
    damaged = tree_state(venv.parent.parent)
    no_byte_sources(monkeypatch, tmp_path)
    with pytest.raises(SnapshotDamaged) as err:
        rollback(open_target(Recipe.for_python(venv)), snap.id)
    assert err.value.exit_code == 3
    assert tree_state(venv.parent.parent) == damaged


def test_damage_to_a_stored_file_the_restore_does_not_need_does_not_block_it(lanes: int, venv: Path, wheelhouse: Path) -> None:
    """The restore checks what it uses. A stored file whose live twin is untouched is not
    needed: the environment still comes back byte for byte."""
    prefix = venv.parent.parent
    before = tree_state(prefix)
    t = open_target(Recipe.for_python(venv))
    snap = snapshot_now(t).result.meta
    files = [e for e in manifest_entries(snap.path) if e[2] == "f"]
    untouched = next(e for e in files if e[1] == "bin/activate")  # stored as a copy; damage() leaves it
    stored_file(snap.path, untouched[1]).unlink()
    damage(venv, wheelhouse)
    res = rollback(open_target(Recipe.for_python(venv)), snap.id)
    assert res.restore.written > 0
    assert tree_state(prefix) == before


def test_restore_is_idempotent_and_noop_when_unchanged(lanes: int, venv: Path) -> None:
    t = open_target(Recipe.for_python(venv))
    snap = snapshot_now(t).result.meta
    res = rollback(open_target(Recipe.for_python(venv)), snap.id)
    assert res.restore.written == 0 and res.restore.deleted == 0
    assert res.restore.verified > 0


def test_verify_catches_a_difference(venv: Path) -> None:
    t = open_target(Recipe.for_python(venv))
    snap = snapshot_now(t).result.meta
    core = site_packages(venv) / "toypkg" / "core.py"
    core.write_text("changed after the snapshot\n")
    with pytest.raises(RestoreError, match="content differs"):
        snapmod.verify(Environment.inspect(venv), snap)


def test_symlinks_modes_and_empty_dirs(lanes: int, venv: Path, wheelhouse: Path) -> None:
    prefix = venv.parent.parent
    (prefix / "share" / "empty").mkdir(parents=True)
    os.symlink("../lib", prefix / "share" / "lib-link")
    tool = prefix / "bin" / "tool.sh"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o750)
    before = tree_state(prefix)
    snap = snapshot_now(open_target(Recipe.for_python(venv))).result.meta
    (prefix / "share" / "empty").rmdir()
    (prefix / "share" / "lib-link").unlink()
    (prefix / "share" / "lib-link").write_text("now a file")
    tool.chmod(0o644)
    rollback(open_target(Recipe.for_python(venv)), snap.id)
    assert tree_state(prefix) == before
    assert stat.S_IMODE(tool.stat().st_mode) == 0o750


def test_retention_keeps_newest_and_protects_pre_upgrade(venv: Path, tmp_path: Path) -> None:
    recipe_path = tmp_path / "r.toml"
    recipe_path.write_text(f'[environment]\npython = "{venv}"\n[snapshots]\nkeep = 2\n')
    from rewheel.recipe import load_recipe

    t = open_target(load_recipe(recipe_path))
    first = snapshot_now(t).result.meta
    # Mark the first as the pre-upgrade snapshot a pending rollback would need.
    first.status = "pre-upgrade"
    first.save()
    # What a snapshot and a deletion killed midway leave behind.
    for leftover in (".tmp-deadbeef", ".deleting-cafebabe"):
        (t.store.snapshots_dir / leftover / "tree").mkdir(parents=True)
    ids = [snapshot_now(t).result.meta.id for _ in range(3)]
    left = [m.id for m in t.store.list()]
    # The newest `keep` (2), and besides them the protected pre-upgrade one (docs/snapshots.md#retention).
    assert left == [ids[-1], ids[-2], first.id]
    assert sorted(p.name for p in t.store.snapshots_dir.iterdir()) == sorted(left)


def test_state_home_is_private(venv: Path, rewheel_home: Path) -> None:
    snapshot_now(open_target(Recipe.for_python(venv)))
    assert stat.S_IMODE(rewheel_home.stat().st_mode) == 0o700


def test_cli_snapshot_history_rollback(venv: Path, wheelhouse: Path) -> None:
    prefix = venv.parent.parent
    before = tree_state(prefix)
    snap = json.loads(support_cli.rewheel("snapshot", "--python", str(venv), "--label", "good", "--json",
                                          check=True).stdout)
    assert snap["files"] > 0 and snap["id"]
    hist = json.loads(support_cli.rewheel("history", "--python", str(venv), "--json", check=True).stdout)
    assert hist["snapshots"][0]["id"] == snap["id"]
    assert hist["snapshots"][0]["versions"]["toypkg"] == "1.0.0"
    assert hist["snapshots"][0]["label"] == "good"
    damage(venv, wheelhouse)
    # Without a terminal and without --yes: exit 2, nothing changed.
    damaged = tree_state(prefix)
    cp = support_cli.rewheel("rollback", "--python", str(venv), stdin=subprocess.DEVNULL)
    assert cp.returncode == 2, cp.stderr
    assert "--yes" in cp.stderr
    assert tree_state(prefix) == damaged
    cp = support_cli.rewheel("rollback", "--python", str(venv), snap["id"], "--yes", "--json")
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["snapshot_id"] == snap["id"]
    assert json.loads(cp.stdout)["restore"]["lanes"] == 1  # a small environment: one process
    assert tree_state(prefix) == before
    # Two lanes from the command line (the default for a large environment on two CPUs).
    damage(venv, wheelhouse)
    two = {**os.environ, "REWHEEL_RESTORE_LANES": "2"}
    cp = support_cli.rewheel("rollback", "--python", str(venv), snap["id"], "--yes", "--json", env=two)
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["restore"]["lanes"] == 2
    assert tree_state(prefix) == before
    # A value that is neither 1 nor 2 is a usage error naming the variable; nothing changes.
    damage(venv, wheelhouse)
    damaged = tree_state(prefix)
    cp = support_cli.rewheel("rollback", "--python", str(venv), snap["id"], "--yes",
                             env={**os.environ, "REWHEEL_RESTORE_LANES": "8"})
    assert cp.returncode == 2 and "REWHEEL_RESTORE_LANES='8'" in cp.stderr, cp.stderr
    assert tree_state(prefix) == damaged


def test_cli_unknown_snapshot_is_a_usage_error(venv: Path) -> None:
    cp = support_cli.rewheel("rollback", "--python", str(venv), "nope", "--yes")
    assert cp.returncode == 2
    assert "no snapshot 'nope'" in cp.stderr


def test_a_restore_killed_while_staging_is_finished_by_the_next(lanes: int, venv: Path, wheelhouse: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = venv.parent.parent
    before = tree_state(prefix)
    snap = snapshot_now(open_target(Recipe.for_python(venv))).result.meta
    damage(venv, wheelhouse)
    calls = {"n": 0}
    real = snapmod.copy_hashed

    def dies_midway(src: str, dst: str):
        calls["n"] += 1
        if calls["n"] == (3 if lanes == 1 else 1):  # each lane counts its own copies
            raise KeyboardInterrupt  # as a kill would, while staging
        return real(src, dst)

    monkeypatch.setattr(restore_apply, "copy_hashed", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        rollback(open_target(Recipe.for_python(venv)), snap.id)
    monkeypatch.setattr(restore_apply, "copy_hashed", real)
    # Simulate what a SIGKILL leaves behind: the staging folder.
    (prefix / f"{snapmod.STAGING_PREFIX}deadbeef").mkdir()
    (prefix / f"{snapmod.STAGING_PREFIX}deadbeef" / "0").write_text("half")
    from rewheel.journal import list_runs

    store_env = open_target(Recipe.for_python(venv)).store.env_dir
    assert any(not j.finished for j in list_runs(store_env))
    res = rollback(open_target(Recipe.for_python(venv)), snap.id)
    assert res.finished_run is not None
    assert tree_state(prefix) == before


def test_names_like_a_restores_staging_are_a_persons_files_at_every_level(lanes: int, venv: Path) -> None:
    # Only a folder at a root named as a restore names its staging (8 hex digits) is passed
    # over; a file or folder a person named `.rewheel-restore-*` anywhere else is captured,
    # removed by a rollback as any file added since, and put back by undoing that rollback.
    prefix = venv.parent.parent
    folders = [prefix, site_packages(venv), site_packages(venv) / "toypkg"]
    snap = snapshot_now(open_target(Recipe.for_python(venv))).result.meta
    planted: list[Path] = []
    for i, folder in enumerate(folders):
        for name in (f"{snapmod.STAGING_PREFIX}notes", f"{snapmod.STAGING_PREFIX}0a1b2c3d"):
            f = folder / name
            if folder == prefix and name.endswith("0a1b2c3d"):
                f.write_text(f"a file, not a folder, at level {i}")  # a root's staging is a folder
            else:
                f.mkdir()
                (f / "kept.txt").write_text(f"level {i}")
            planted.append(f)
    with_them = tree_state(prefix)
    assert all(str(p.relative_to(prefix)) in with_them for p in planted)
    res = rollback(open_target(Recipe.for_python(venv)), snap.id)
    assert res.restore.deleted >= len(planted)
    assert not [p for p in planted if os.path.lexists(p)]
    assert res.undo_snapshot_id is not None
    rollback(open_target(Recipe.for_python(venv)), res.undo_snapshot_id)
    assert tree_state(prefix) == with_them


def test_label_with_a_slash_and_markup_is_found_and_shown_verbatim(venv: Path) -> None:
    # A label is free text: "cu12.8/torch2.7" names a snapshot as well as its id does, and
    # rich markup in it is printed as typed, not interpreted.
    label = "cu12.8/torch2.7 [bold]x[/bold]"
    cp = support_cli.rewheel("snapshot", "--python", str(venv), "--label", label, check=True)
    assert f"label {label!r}" in " ".join(cp.stdout.split())
    t = open_target(Recipe.for_python(venv))
    assert t.store.get(label).label == label
    with pytest.raises(snapmod.SnapshotError, match="no snapshot"):
        t.store.get("../x")


def test_snapshot_through_a_symlinked_prefix_restores_by_the_real_path(lanes: int, venv: Path, wheelhouse: Path,
                                                                      tmp_path: Path) -> None:
    prefix = venv.parent.parent
    link = tmp_path / "env-link"
    link.symlink_to(prefix)
    before = tree_state(prefix)
    snap = snapshot_now(open_target(Recipe.for_python(link / "bin" / "python")), label="via-link").result.meta
    damage(venv, wheelhouse)
    # The same environment by its real path (and the symlink gone): restored, byte-exact.
    link.unlink()
    res = rollback(open_target(Recipe.for_python(venv)), "via-link")
    assert res.snapshot.id == snap.id
    assert tree_state(prefix) == before
    assert snapmod.verify(Environment.inspect(venv), snap) > 0


def test_rollback_through_the_symlink_the_recipe_names(lanes: int, tmp_path: Path, wheelhouse: Path) -> None:
    """`/srv/env -> /data/env`, and every command names the link: the restore walks the
    real folder (its root is opened without following links) and comes back byte-exact."""
    real = tmp_path / "data" / "env"
    real.parent.mkdir()
    py = make_venv(real)
    uv_install(py, "toypkg==1.0.0", "toyhelper==1.0.0", find_links=wheelhouse, extra=COPY)
    link = tmp_path / "srv-env"
    link.symlink_to(real)
    via_link = link / "bin" / "python"
    before = tree_state(real)
    snap = snapshot_now(open_target(Recipe.for_python(via_link))).result.meta
    damage(py, wheelhouse)
    res = rollback(open_target(Recipe.for_python(via_link)), snap.id)
    assert res.restore.written > 0
    assert tree_state(real) == before
    assert link.is_symlink()
    assert snapmod.verify(Environment.inspect(via_link), snap) > 0


def test_refused_restore_leaves_no_interrupted_run(venv: Path, wheelhouse: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from rewheel import journal

    no_byte_sources(monkeypatch, tmp_path)
    t = open_target(Recipe.for_python(venv))
    snap = snapshot_now(t).result.meta
    victim = needed_by_restore(manifest_entries(snap.path))
    stored_file(snap.path, victim[1]).unlink()
    damage(venv, wheelhouse)
    with pytest.raises(SnapshotDamaged):
        rollback(open_target(Recipe.for_python(venv)), snap.id)
    # Nothing was changed, so nothing is pending: later commands are not refused with exit 4.
    assert journal.interrupted_run(t.store.env_dir) is None
    cp = support_cli.rewheel("history", "--python", str(venv), "--json")
    assert cp.returncode == 0, cp.stderr
    assert [r["status"] for r in json.loads(cp.stdout)["runs"]] == ["refused"]


@pytest.mark.parametrize("args", [["history", "--bogus"], ["rollback", "a", "b", "c"], ["run"]])
def test_usage_errors_with_json_are_one_json_document(args: list[str]) -> None:
    cp = support_cli.rewheel(*args, "--json")
    assert cp.returncode == 2
    doc = json.loads(cp.stdout)
    assert doc["error"] == "UsageError" and doc["exit_code"] == 2 and doc["message"]
    assert doc["message"] in cp.stderr


def test_history_names_a_damaged_snapshot(venv: Path) -> None:
    t = open_target(Recipe.for_python(venv))
    good = snapshot_now(t).result.meta
    bad = snapshot_now(t).result.meta
    (bad.path / "meta.json").write_text("{ not json")
    cp = support_cli.rewheel("history", "--python", str(venv), "--json")
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert [s["id"] for s in doc["snapshots"]] == [good.id]
    assert doc["damaged_snapshots"] == [bad.id]
    human = support_cli.rewheel("history", "--python", str(venv))
    assert f"snapshot {bad.id} is damaged" in " ".join(human.stdout.split())


def test_import_name_of_the_upgraded_distribution(venv: Path) -> None:
    env = Environment.inspect(venv)
    assert env.import_name(["ToyPkg"]) == "toypkg"  # any spelling of the distribution name
    assert env.import_name(["flashinfer-python"]) == "flashinfer_python"  # not installed
    assert env.import_name([]) is None


def shared_file_in_lane(venv: Path, snap: snapmod.SnapshotMeta, lane: int, *under: str,
                        stored: tuple[str, ...] = ("link",), gone: bool = False) -> list:
    """A stored file of site-packages (linked, or a hand-editable one's copy), under one of
    `under`, in a folder that is lane `lane`'s share of a two-lane restore. `gone`: one whose
    bytes no other file of the snapshot, nor any live file, holds (objects are stored by
    their bytes: a copy the environment still has would be stored again by the rollback's
    own undo snapshot)."""
    shares = restore_scan.share_folders(snapmod.Manifest.load(snap, validate=False), 2)
    sp = str(site_packages(venv).relative_to(venv.parent.parent))
    entries = manifest_entries(snap.path)
    live = {hashlib.sha256(p.read_bytes()).hexdigest() for p in venv.parent.parent.rglob("*")
            if p.is_file() and not p.is_symlink()} if gone else set()
    twice = {e[6] for e in entries if e[2] == "f" and sum(x[6] == e[6] for x in entries) > 1}
    return next(e for e in entries if e[2] == "f" and e[7] in stored
                and e[1].startswith(tuple(f"{sp}/{u}" for u in under))
                and (0, e[1].rpartition("/")[0]) in shares[lane]
                and not (gone and (e[6] in live or e[6] in twice)))


@pytest.mark.parametrize("lane", [0, 1])
def test_damage_either_lane_needs_stops_both_lanes_before_anything_changes(venv: Path, wheelhouse: Path,
                                                                          lane: int, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two lanes (processes) restore their own folders; a stored file one of them needs is
    damaged: neither commits, the environment is as the damage left it, neither leaves a
    staging folder, and the second process is gone."""
    monkeypatch.setattr(restore_mod, "auto_lanes", lambda snap: 2)
    no_byte_sources(monkeypatch, tmp_path)
    prefix = venv.parent.parent
    snap = snapshot_now(open_target(Recipe.for_python(venv))).result.meta
    # damage() reinstalls toypkg and toyhelper: the restore needs every stored file of theirs.
    damage(venv, wheelhouse)
    victim = shared_file_in_lane(venv, snap, lane, "toypkg", "toyhelper", stored=("link", "copy"), gone=True)
    stored_file(snap.path, victim[1]).unlink()
    damaged = tree_state(prefix)
    children = own_children()  # an earlier test on this worker may have left its service
    with pytest.raises(SnapshotDamaged) as err:
        rollback(open_target(Recipe.for_python(venv)), snap.id)
    assert err.value.exit_code == 3 and victim[1] in str(err.value)
    assert tree_state(prefix) == damaged
    assert not [p for p in os.listdir(prefix) if p.startswith(snapmod.STAGING_PREFIX)]
    assert own_children() <= children  # the second lane was waited for: not even a zombie


def own_children() -> set[int]:
    """This process's children, zombies included (read by rewheel's /proc reader)."""
    procs = (proc_stat(int(d)) for d in os.listdir("/proc") if d.isdigit())
    return {p.pid for p in procs if p is not None and p.ppid == os.getpid()}


@pytest.mark.parametrize("lane", [0, 1])
def test_a_lane_failing_midway_is_reported_and_the_next_restore_finishes(venv: Path, wheelhouse: Path, lane: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(restore_mod, "auto_lanes", lambda snap: 2)
    # The package folders fall to the second lane in this small environment; swapping the
    # shares gives them to the first (this process) for the other case.
    real_share = snapmod.share_folders
    monkeypatch.setattr(restore_scan, "share_folders", lambda man, n: real_share(man, n)[::1 if lane else -1])
    prefix = venv.parent.parent
    before = tree_state(prefix)
    snap = snapshot_now(open_target(Recipe.for_python(venv))).result.meta
    # A file of the package folders, which stay: the commit relinks it in place.
    victim = shared_file_in_lane(venv, snap, lane, "toypkg/", "toyhelper/")
    name = victim[1].rpartition("/")[2]
    damage(venv, wheelhouse)
    real_link = os.link

    def disk_error(src, dst, *args, **kwargs):  # the lane's process inherits this (fork)
        if str(dst) == name or str(dst).endswith(f"/{name}"):  # relinked in place, or in a rebuilt folder
            raise OSError(errno.EIO, "Input/output error (injected)")
        return real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", disk_error)
    with pytest.raises(RestoreError, match="failed midway.*Input/output error"):
        rollback(open_target(Recipe.for_python(venv)), snap.id)
    monkeypatch.setattr(os, "link", real_link)
    res = rollback(open_target(Recipe.for_python(venv)), snap.id)
    assert res.restore.lanes == 2
    assert tree_state(prefix) == before
    assert not [p for p in os.listdir(prefix) if p.startswith(snapmod.STAGING_PREFIX)]


@pytest.mark.parametrize("lanes", [1, 2])
def test_restore_with_a_full_walk_afterwards(venv: Path, wheelhouse: Path, lanes: int) -> None:
    """`full_verify` walks the whole environment again once every lane has committed."""
    prefix = venv.parent.parent
    before = tree_state(prefix)
    snap = snapshot_now(open_target(Recipe.for_python(venv))).result.meta
    damage(venv, wheelhouse)
    res = snapmod.restore_snapshot(Environment.inspect(venv), snap, full_verify=True, lanes=lanes)
    assert res.lanes == lanes and res.written > 0
    assert res.verified == len(before)  # every entry walked and matched
    assert tree_state(prefix) == before
    assert not [p for p in os.listdir(prefix) if p.startswith(snapmod.STAGING_PREFIX)]


def test_nested_environments_are_left_alone(lanes: int, venv: Path, wheelhouse: Path, tmp_path: Path) -> None:
    """A prefix holding another environment (a venv's `pyvenv.cfg`, a conda env's
    `conda-meta`) or, in a conda base, the package cache `pkgs/`: the snapshot leaves them
    out and says so, and a rollback neither reverts nor removes them."""
    prefix = venv.parent.parent
    other = prefix / "envs" / "other"
    (other / "conda-meta").mkdir(parents=True)
    (other / "lib.py").write_text("v1\n")
    inner = prefix / "tools" / "inner-venv"
    inner.mkdir(parents=True)
    (inner / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (inner / "data.txt").write_text("inner v1\n")
    t = open_target(Recipe.for_python(venv))
    res = snapshot_now(t).result
    assert sorted(res.to_json()["nested_skipped"]) == sorted([str(other), str(inner)])
    assert not any("inner-venv/" in e[1] or "envs/other/" in e[1] for e in manifest_entries(res.meta.path))
    before = tree_state(prefix)
    damage(venv, wheelhouse)
    # The other environments change meanwhile; a new one appears.
    (other / "lib.py").write_text("v2 of the other env\n")
    (inner / "data.txt").write_text("inner v2\n")
    newer = prefix / "envs" / "newer"
    (newer / "conda-meta").mkdir(parents=True)
    rollback(open_target(Recipe.for_python(venv)), res.meta.id)
    after = tree_state(prefix)
    assert (other / "lib.py").read_text() == "v2 of the other env\n"
    assert (inner / "data.txt").read_text() == "inner v2\n"
    assert newer.is_dir()
    ours = {k: v for k, v in after.items() if not k.startswith(("envs/", "tools/inner-venv/"))}
    assert ours == {k: v for k, v in before.items() if not k.startswith(("envs/", "tools/inner-venv/"))}
    assert snapmod.verify(Environment.inspect(venv), res.meta) > 0


def test_site_packages_linked_out_of_the_prefix(lanes: int, tmp_path: Path, wheelhouse: Path) -> None:
    """site-packages moved to another disk and linked back: the snapshot captures what the
    interpreter imports (the linked folder), and the rollback restores it byte for byte."""
    py = make_venv(tmp_path / "env")
    uv_install(py, "toypkg==1.0.0", "toyhelper==1.0.0", find_links=wheelhouse, extra=COPY)
    sp = site_packages(py)
    moved = tmp_path / "other-disk" / "site-packages"
    moved.parent.mkdir()
    shutil.move(str(sp), moved)
    sp.symlink_to(moved)
    env = Environment.inspect(py)
    assert [str(r) for r in env.roots] == [str(env.prefix), str(moved)]
    prefix = py.parent.parent
    before = (tree_state(prefix), tree_state(moved))
    res = snapshot_now(open_target(Recipe.for_python(py))).result
    assert res.meta.files > 17  # the packages themselves, not only the prefix's own files
    # An upgrade of a package without scripts (uv itself cannot place scripts through such a
    # link: it resolves `site-packages/../../../bin` from the real folder), and debris.
    uv_install(py, "toyhelper==1.1.0", find_links=wheelhouse, extra=("--reinstall", *COPY))
    tmp = moved / "toypkg" / "core.py.new"  # an editor's save: a new file renamed over
    tmp.write_text("patched\n")
    tmp.replace(moved / "toypkg" / "core.py")
    (moved / "toypkg" / "debug_dump.pt").write_bytes(os.urandom(4096))
    assert tree_state(moved) != before[1]
    rb = rollback(open_target(Recipe.for_python(py)), res.meta.id)
    assert rb.restore.written > 0
    assert (tree_state(prefix), tree_state(moved)) == before
    assert sp.is_symlink()


def test_sparse_unlisted_file_is_stored_sparse_and_once(venv: Path, wheelhouse: Path) -> None:
    """A sparse model cache (256 MiB here, gigabytes in life) written into a package folder (no RECORD lists it): the
    snapshot keeps it sparse, the next snapshot shares the first one's copy instead of
    copying it again, and a rollback brings it back byte for byte (and sparse) even after
    the first snapshot is deleted."""
    big = site_packages(venv) / "toypkg" / "model-cache.bin"
    with open(big, "wb") as f:
        f.truncate(256 << 20)
        f.seek(128 << 20)
        f.write(os.urandom(70_000))
    t = open_target(Recipe.for_python(venv))
    first = snapshot_now(t).result
    stored = stored_file(first.meta.path, big.relative_to(venv.parent.parent))
    assert stored.stat().st_size == 256 << 20
    assert stored.stat().st_blocks * 512 < 8 << 20  # sparse, not 256 MiB of zeros
    assert first.to_json()["bytes_copied"] < 8 << 20  # what it occupies, not its length
    second = snapshot_now(open_target(Recipe.for_python(venv))).result
    j = second.to_json()
    # Nothing changed: every file is the first snapshot's object, nothing copied again.
    assert j["files_unchanged"] == j["files"] and j["files_copied"] == 0 and j["bytes_copied"] == 0
    stored2 = stored_file(second.meta.path, big.relative_to(venv.parent.parent))
    assert stored2 == stored and stored2.stat().st_ino == stored.stat().st_ino
    before = tree_state(venv.parent.parent)
    open_target(Recipe.for_python(venv)).store.delete(first.meta.id)
    big.unlink()
    damage(venv, wheelhouse)
    rollback(open_target(Recipe.for_python(venv)), second.meta.id)
    assert tree_state(venv.parent.parent) == before
    assert big.stat().st_blocks * 512 < 8 << 20


def test_snapshots_exclude_leaves_caches_out_and_alone(lanes: int, venv: Path, wheelhouse: Path,
                                                       tmp_path: Path) -> None:
    """`[snapshots] exclude`: a glob with a slash matches the path from the prefix, one
    without a name at any depth. Excluded files are not captured, and a rollback neither
    reverts nor removes them."""
    sp = site_packages(venv)
    cache = sp / "toypkg" / ".cache"
    cache.mkdir()
    (cache / "kernels.bin").write_bytes(os.urandom(100_000))
    (sp / "toypkg" / "dump.pt").write_bytes(b"old dump")
    prefix = venv.parent.parent
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[environment]\npython = "{venv}"\n'
                      '[snapshots]\nexclude = ["lib/python3*/site-packages/*/.cache", "*.pt"]\n')
    from rewheel.recipe import load_recipe
    t = open_target(load_recipe(recipe))
    res = snapshot_now(t).result
    paths = [e[1] for e in manifest_entries(res.meta.path)]
    assert not any(".cache" in p or p.endswith(".pt") for p in paths)
    assert any(p.endswith("toypkg/core.py") for p in paths)
    before = {k: v for k, v in tree_state(prefix).items() if ".cache" not in k and not k.endswith(".pt")}
    damage(venv, wheelhouse)  # adds toypkg/debug_dump.pt, among the rest
    (cache / "kernels.bin").write_bytes(b"rebuilt by the new build")
    rollback(open_target(load_recipe(recipe)), res.meta.id)
    after = tree_state(prefix)
    assert {k: v for k, v in after.items() if ".cache" not in k and not k.endswith(".pt")} == before
    assert (cache / "kernels.bin").read_bytes() == b"rebuilt by the new build"
    assert (sp / "toypkg" / "debug_dump.pt").exists() and (sp / "toypkg" / "dump.pt").exists()
    assert snapmod.verify(Environment.inspect(venv), res.meta) > 0


@pytest.mark.parametrize("glob", ["", "/etc/*", "../x", "*", "**/", "?*", "*.py", "*.so", "RECORD", "*.dist-info",
                                  "lib/*", "lib/python3*/site-packages/*", "*-info/*", "[!x]*"])
def test_snapshots_exclude_refuses_globs_that_take_everything(glob: str, venv: Path, tmp_path: Path) -> None:
    from rewheel.errors import RecipeError
    from rewheel.recipe import load_recipe
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[environment]\npython = "{venv}"\n[snapshots]\nexclude = ["{glob}"]\n')
    with pytest.raises(RecipeError, match="snapshots.exclude"):
        load_recipe(recipe)


def test_cleanup_entries_in_meta_are_not_trusted(venv: Path, tmp_path: Path) -> None:
    """A `cleanup` entry in a snapshot's meta.json moves a file back only where the recipe's
    `[cleanup] paths` globs allow; a tampered entry is refused before anything moves, and a
    rollback by `--python` alone moves nothing back."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "a.pt").write_bytes(b"debug dump")
    globs = (str(dumps / "*.pt"),)
    t = open_target(Recipe.for_python(venv))
    snap = snapshot_now(t).result.meta
    moved = snapmod.stash_cleanup(snap, globs)
    assert [m["path"] for m in moved] == [str(dumps / "a.pt")] and not (dumps / "a.pt").exists()
    assert snapmod.unstash_cleanup(snap, ()) == 0 and snapmod.pending_cleanup(snap) == 1
    # Tampered: the entry now points into /etc.
    meta = json.loads((snap.path / "meta.json").read_text())
    meta["cleanup"][0]["path"] = "/etc/cron.d/evil"
    (snap.path / "meta.json").write_text(json.dumps(meta))
    tampered = snapmod.SnapshotMeta.load(snap.path, snap.home)
    with pytest.raises(SnapshotDamaged, match="match no \\[cleanup\\] paths glob"):
        snapmod.unstash_cleanup(tampered, globs)
    assert not Path("/etc/cron.d/evil").exists()
    meta["cleanup"][0]["path"] = str(dumps / "a.pt")
    (snap.path / "meta.json").write_text(json.dumps(meta))
    assert snapmod.unstash_cleanup(snapmod.SnapshotMeta.load(snap.path, snap.home), globs) == 1
    assert (dumps / "a.pt").read_bytes() == b"debug dump"


@pytest.mark.parametrize("which", ["prefix", "home", "system", "holds-prefix"])
def test_cleanup_globs_that_match_protected_places_are_refused(which: str, venv: Path, tmp_path: Path,
                                                               rewheel_home: Path) -> None:
    from rewheel.errors import UsageError
    prefix = venv.parent.parent
    glob = {"prefix": str(prefix / "lib"), "home": str(rewheel_home), "system": "/etc",
            "holds-prefix": str(prefix.parent)}[which]
    t = open_target(Recipe.for_python(venv))
    snap = snapshot_now(t).result.meta
    with pytest.raises(UsageError, match="refusing to move it"):
        snapmod.stash_cleanup(snap, (glob,))
    assert snap.cleanup == [] and prefix.exists()


@pytest.mark.parametrize("tamper", ["setuid", "symlink-nul"])
def test_manifest_modes_and_link_targets_are_checked(tamper: str, venv: Path, wheelhouse: Path) -> None:
    """A manifest asking for a set-id file, or a symlink target no filesystem can hold, is
    refused before anything changes (exit 3 path: SnapshotDamaged)."""
    prefix = venv.parent.parent
    if tamper == "symlink-nul":
        os.symlink("toypkg", site_packages(venv) / "toy-link")
    snap = snapshot_now(open_target(Recipe.for_python(venv))).result.meta
    doc = manifest_doc(snap.path)
    for folder in doc["folders"]:
        names = folder[2]
        if tamper == "setuid" and folder[1].endswith("site-packages/toypkg") and "__init__.py" in names:
            folder[4][names.index("__init__.py")] |= 0o4000
        if tamper == "symlink-nul" and "toy-link" in names:
            cold = json.loads(folder[9])
            cold["target"][names.index("toy-link")] = "toy\x00pkg"
            folder[9] = json.dumps(cold)
    write_manifest_doc(snap.path, doc)
    damage(venv, wheelhouse)
    if tamper == "symlink-nul":
        (site_packages(venv) / "toy-link").unlink()
    before = tree_state(prefix)
    with pytest.raises(SnapshotDamaged):
        rollback(open_target(Recipe.for_python(venv)), snap.id)
    assert tree_state(prefix) == before


def test_diff_leaves_out_what_the_snapshot_excluded(venv: Path, tmp_path: Path) -> None:
    from rewheel.diff import diff_trees
    from rewheel.recipe import load_recipe
    sp = site_packages(venv)
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[environment]\npython = "{venv}"\n[snapshots]\nexclude = ["*.pt"]\n')
    t = open_target(load_recipe(recipe))
    snap = snapshot_now(t).result.meta
    (sp / "toypkg" / "dump.pt").write_bytes(b"a dump")
    (sp / "toypkg" / "new.py").write_text("NEW = 1\n")
    files = [f.path for f in diff_trees(t.env, snap).files]
    assert "toypkg/new.py" in files and not any(p.endswith(".pt") for p in files)


def test_a_snapshot_in_two_processes_is_the_one_one_process_takes(venv: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The packages of site-packages shared out between two processes (the second sending its
    folders back): the same entries and objects as one process finds, for a first snapshot into
    an empty store, for one with nothing changed, and for one where files changed on both sides."""
    from rewheel.snapshot import capture_walk

    monkeypatch.setattr(capture_walk, "_LANES_MIN_ENTRIES", 1)  # the toy environment is small
    env = Environment.inspect(venv)

    def take(lanes: int, home: Path) -> list[tuple]:
        monkeypatch.setenv("REWHEEL_RESTORE_LANES", str(lanes))
        res = snapmod.take_snapshot(env, snapmod.Store(env.prefix, home))
        return sorted((e.root, e.path, e.kind, e.mode, e.size, e.mtime_ns, e.sha256, e.stored, e.target)
                      for e in snapmod.Manifest.load(res.meta).entries)

    one, two = tmp_path / "one", tmp_path / "two"
    assert take(2, two) == take(1, one)  # the first snapshot of a store
    split = capture_walk.CaptureWalk(env, snapmod.Store(env.prefix, two), capture_walk.Dists(env, None), (),
                                     None)._split()
    assert split is not None and split[2]  # the second process had packages of its own
    assert take(2, two) == take(1, one)  # nothing changed
    for pkg in ("toypkg", "toyhelper"):  # files of both processes' shares change
        (site_packages(venv) / pkg / "added.py").write_text(f"# added to {pkg}\n")
    assert take(2, two) == take(1, one)
    # Nothing changed since a snapshot one process took: the next, in two, writes that manifest's
    # bytes again, not encoded anew, although its folders came together in another order.
    take(1, two)
    take(2, two)
    newest, last = snapmod.Store(env.prefix, two).list()[:2]
    assert (newest.path / "manifest.bin").read_bytes() == (last.path / "manifest.bin").read_bytes()
    for home in (one, two):
        check = verify_store_of(env, home)
        assert check.ok, [d.to_json() for r in check.results for d in r.damaged]


def verify_store_of(env: Environment, home: Path) -> snapmod.StoreVerify:
    return snapmod.verify_store(snapmod.Store(env.prefix, home), None, full=True)


def test_the_window_check_sees_any_change_since_the_snapshot(venv: Path) -> None:
    """`unchanged_since`, the one stat walk a command makes once its service is stopped: the
    environment as the snapshot recorded it, or not — an edit that put the mtime back (the
    ctime moved), a new byte-code cache, a mode, a symlink's target; another environment
    created inside is not this one's, so no difference."""
    from rewheel.snapshot.capture_walk import unchanged_since

    env = Environment.inspect(venv)
    store = snapmod.Store(env.prefix)
    snap = snapmod.take_snapshot(env, store).meta
    assert unchanged_since(env, store, snap) is True
    core = site_packages(venv) / "toypkg" / "core.py"
    st = core.stat()
    with open(core, "r+b") as f:  # in place, then the mtime put back: size and mtime as they were
        f.write(b"#")
    os.utime(core, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (core.stat().st_size, core.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert unchanged_since(env, store, snap) is False
    changes = [lambda: (site_packages(venv) / "toypkg" / "__pycache__").mkdir(exist_ok=True),
               lambda: (site_packages(venv) / "toypkg" / "_ops.so").chmod(0o700)]
    for change in changes:
        snap = snapmod.take_snapshot(env, store).meta
        assert unchanged_since(env, store, snap) is True
        change()
        assert unchanged_since(env, store, snap) is False
    snap = snapmod.take_snapshot(env, store).meta
    inner = venv.parent.parent / "other-env"
    inner.mkdir()
    (inner / "pyvenv.cfg").write_text("home = /usr\n")
    (inner / "more.txt").write_text("not this environment's\n")
    assert unchanged_since(env, store, snap) is True  # as a snapshot leaves it out, so does the check
    (venv.parent.parent / "stray.txt").write_text("this environment's\n")
    assert unchanged_since(env, store, snap) is False


@pytest.mark.parametrize("take_over", [False, True])
def test_two_files_with_the_same_bytes_are_each_found_unchanged(tmp_path: Path, take_over: bool) -> None:
    """Two installed files with the same bytes and mtime under two inodes (a wheel's duplicate
    kernels, uv's copies): the store links the first and has the second's bytes already. The
    manifest records each one's own inode, so the next snapshot finds every file unchanged
    and the window's check (`unchanged_since`) finds the environment is still the snapshot —
    it once recorded the object's inode for the second and took the undo snapshot again in
    the window. Sweeps the plain snapshot and the undo snapshot's take-over."""
    from devtools.wheelbuild import build_wheel
    from rewheel.snapshot.capture import take_snapshot
    from rewheel.snapshot.capture_walk import unchanged_since

    blob = os.urandom(3 << 20)  # a binary: linked, never copied (not hand-editable)
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "twins", "1.0.0", {"twins/__init__.py": "", "twins/_a.so": blob, "twins/_b.so": blob})
    py = make_venv(tmp_path / "venv")
    uv_install(py, "twins==1.0.0", find_links=wheels, extra=COPY)
    pkg = site_packages(py) / "twins"
    a, b = pkg / "_a.so", pkg / "_b.so"
    old = a.stat().st_mtime_ns - 10**9  # older than RECORD: proven by it, not read
    for p in (a, b):
        os.utime(p, ns=(old, old))
    assert a.stat().st_ino != b.stat().st_ino
    t = open_target(Recipe.for_python(py))
    first = take_snapshot(t.env, t.store, take_over=take_over)
    linked = {stored_file(first.meta.path, p.relative_to(py.parent.parent)).stat().st_ino for p in (a, b)}
    assert len(linked) == 1  # one object holds both files' bytes
    assert unchanged_since(t.env, t.store, first.meta) is True
    if not take_over:  # (a take-over is settled first: its copies change the live ctimes)
        again = take_snapshot(t.env, t.store).to_json()
        assert again["files_unchanged"] == again["files"] and again["files_copied"] == 0
    os.truncate(b, 0)  # a real change is still seen
    assert unchanged_since(t.env, t.store, first.meta) is False


def test_collect_reads_each_distinct_manifest_once_and_keeps_what_any_names(venv: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Three snapshots of an unchanged environment (one manifest, three copies of its bytes),
    then a change and a fourth. Deleting the one holding the changed file's object: the
    sweep reads two manifests, not three, removes exactly that object and keeps every object
    the others name; a manifest it cannot read stops it from removing anything."""
    from rewheel.snapshot.manifest import Manifest

    t = open_target(Recipe.for_python(venv))
    same = [snapmod.take_snapshot(t.env, t.store).meta for _ in range(3)]
    assert len({(m.path / "manifest.bin").read_bytes() for m in same}) == 1
    (site_packages(venv) / "toypkg" / "notes.txt").write_text("only in the fourth snapshot\n")
    fourth = snapmod.take_snapshot(t.env, t.store).meta
    objects = t.store.env_dir / "objects"
    before = {p for p in objects.rglob("*") if p.is_file()}
    t.store.delete(fourth.id, collect=False)
    loads: list[str] = []
    real_load = Manifest.load.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(Manifest, "load", classmethod(lambda cls, snap, **kw: (loads.append(snap.id),
                                                                               real_load(cls, snap, **kw))[1]))
    removed, _ = t.store.collect()
    assert len(loads) == 1  # the three copies read once
    after = {p for p in objects.rglob("*") if p.is_file()}
    assert removed == 1 and len(before - after) == 1 and after < before
    man = Manifest.load(same[0], validate=False)
    assert {objects / n for n in man.objects()} <= after  # everything the others name is kept
    # An unreadable manifest (a link in its place) might name anything: nothing is removed.
    (site_packages(venv) / "toypkg" / "notes.txt").write_text("again, another object\n")
    fifth = snapmod.take_snapshot(t.env, t.store).meta
    t.store.delete(fifth.id, collect=False)
    victim = same[1].path / "manifest.bin"
    victim.unlink()
    victim.symlink_to(same[0].path / "manifest.bin")
    assert t.store.collect() == (0, 0)
