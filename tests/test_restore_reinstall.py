"""A rollback after a force-reinstall at the same versions (`reinstall = "all"`) leaves the
files it can prove identical in place instead of rewriting every file: real uv-built
environments, real wheels, every file hashed before and after."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from devtools.wheelbuild import build_wheel
from support_env import make_venv, stored_file, tree_state, uv_install
from rewheel.snapshot import restore as restore_mod
from rewheel import patches
from rewheel.environment import Environment
from rewheel.snapshot import ALIASES, Store, restore_snapshot, take_snapshot, verify
from rewheel.snapshot.store import Aliases, Found, read_alias_file

COPY = ("--link-mode", "copy")


@pytest.fixture(params=[1, 2], ids=["one-lane", "two-lanes"])
def lanes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(restore_mod, "auto_lanes", lambda snap: request.param)
    return request.param


def site(py: Path) -> Path:
    return next((py.parent.parent / "lib").glob("python3*/site-packages"))


def listed_files(env: Environment) -> int:
    return sum(1 for d in env.distributions() for e in d.record if e.hash)


@pytest.fixture
def setup(tmp_path: Path, wheelhouse: Path) -> tuple[Path, Environment, Store]:
    py = make_venv(tmp_path / "env")
    uv_install(py, "toypkg==1.0.0", "toyhelper==1.0.0", find_links=wheelhouse, extra=COPY)
    env = Environment.inspect(py)
    return py, env, Store(env.prefix)


def reinstall_all(py: Path, wheelhouse: Path, *specs: str) -> None:
    uv_install(py, *(specs or ("toypkg==1.0.0", "toyhelper==1.0.0")), find_links=wheelhouse,
               extra=("--reinstall", *COPY))


def inodes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.lstat().st_ino for p in root.rglob("*") if p.is_file()}


def test_same_version_files_are_proven_not_rewritten(setup, wheelhouse: Path, lanes: int) -> None:
    py, env, store = setup
    before = tree_state(env.prefix)
    snap = take_snapshot(env, store, label="pre", status="pre-upgrade").meta
    old_inodes = inodes(site(py))
    core = "toypkg/core.py"
    # Held open: its inode (the snapshot has a copy, not a link) cannot be freed and reused
    # for the new file, which would fake the premise below.
    with open(site(py) / core):
        reinstall_all(py, wheelhouse)
    # The premise: every package file is a new inode after the force-reinstall.
    fresh = inodes(site(py))
    assert fresh[core] != old_inodes[core]

    res = restore_snapshot(env, snap)
    assert tree_state(env.prefix) == before  # byte for byte, every file hashed
    n_listed = listed_files(env)
    assert res.proven_same >= n_listed - 2 * 3  # all but each dist-info's own bookkeeping
    assert res.written < res.proven_same
    # Only the installer's bookkeeping (RECORD, INSTALLER, ...) is written, never a package file.
    assert site(py).joinpath(core).lstat().st_ino == fresh[core]
    # Proven files are remembered: the next restore and a full verify accept them.
    _roots, aliases = read_alias_file(snap.path / ALIASES)
    hit = next(k for k in aliases if k.endswith(core))
    st = site(py).joinpath(core).lstat()
    assert aliases[hit][:3] == [st.st_ino, st.st_mtime_ns, st.st_size]
    assert aliases[hit][3] == hashlib.sha256(site(py).joinpath(core).read_bytes()).hexdigest()
    again = restore_snapshot(env, snap)
    assert again.written == 0 and again.deleted == 0 and again.chmodded == 0
    assert verify(env, snap) > 0
    assert tree_state(env.prefix) == before


def test_edited_after_the_reinstall_is_restored(setup, wheelhouse: Path, lanes: int) -> None:
    py, env, store = setup
    before = tree_state(env.prefix)
    snap = take_snapshot(env, store, label="pre", status="pre-upgrade").meta
    reinstall_all(py, wheelhouse)
    core = site(py) / "toypkg" / "core.py"
    with open(core, "a") as f:  # an in-place edit after the install: not provably pristine
        f.write("# edited after the reinstall\n")
    res = restore_snapshot(env, snap)
    assert tree_state(env.prefix) == before
    assert res.written >= 1
    assert "edited" not in core.read_text()


def test_edit_of_an_aliased_file_is_caught_later(setup, wheelhouse: Path) -> None:
    """An alias holds for one inode and mtime: an edit after the rollback is undone by the
    next one, and a full verify reports it."""
    py, env, store = setup
    before = tree_state(env.prefix)
    snap = take_snapshot(env, store, label="pre", status="pre-upgrade").meta
    reinstall_all(py, wheelhouse)
    restore_snapshot(env, snap)
    core = site(py) / "toypkg" / "core.py"
    st = core.stat()
    core.write_text(core.read_text().replace("42", "43"))  # same size
    os.utime(core, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    with pytest.raises(Exception, match="content differs"):
        verify(env, snap)
    restore_snapshot(env, snap)
    assert tree_state(env.prefix) == before


def test_the_next_snapshot_links_proven_files_instead_of_copying_them(setup, wheelhouse: Path,
                                                                    lanes: int) -> None:
    """After such a rollback the proven files are newer than the RECORD put back, so RECORD
    no longer proves them: the next snapshot takes their sha256 from the restore's proof and
    links them (no copy) — except a file edited since, which is copied with its new bytes.
    Each snapshot restores byte for byte."""
    py, env, store = setup
    pristine = take_snapshot(env, store, label="pre", status="pre-upgrade")
    reinstall_all(py, wheelhouse)
    restore_snapshot(env, pristine.meta)
    ops = site(py) / "toypkg" / "_ops.so"
    core = site(py) / "toypkg" / "core.py"
    edited = site(py) / "toypkg" / "__init__.py"
    edited.write_text(edited.read_text() + "# a hand edit\n")
    before = tree_state(env.prefix)
    after = take_snapshot(env, store, label="after-rollback")
    # Only the edit is new content: the proven sources are the first snapshot's objects
    # (stored once, by their bytes), and no proven binary is copied.
    assert after.files_copied == 1
    stored = stored_file(after.meta.path, ops.relative_to(env.prefix))
    assert stored.stat().st_ino == ops.stat().st_ino  # linked, not copied
    stored_core = stored_file(after.meta.path, core.relative_to(env.prefix))
    assert stored_core.stat().st_ino != core.stat().st_ino and stored_core.read_bytes() == core.read_bytes()
    assert stored_core == stored_file(pristine.meta.path, core.relative_to(env.prefix))  # one object
    stored_edit = stored_file(after.meta.path, edited.relative_to(env.prefix))
    assert stored_edit.read_bytes() == edited.read_bytes()
    reinstall_all(py, wheelhouse)
    restore_snapshot(env, after.meta)
    assert tree_state(env.prefix) == before
    assert verify(env, after.meta) > 0


def test_upgrade_files_that_did_not_change_are_proven(setup, wheelhouse: Path, lanes: int) -> None:
    """An upgrade's files whose bytes the new version did not change (its RECORD lists the
    snapshot's sha256 and size, the file is not newer than that RECORD) are left in place;
    those it changed are rewritten, and the new version's dist-info goes."""
    py, env, store = setup
    before = tree_state(env.prefix)
    snap = take_snapshot(env, store, label="pre", status="pre-upgrade").meta
    reinstall_all(py, wheelhouse, "toypkg==2.0.0", "toyhelper==1.1.0")
    unchanged, changed = site(py) / "toypkg/data/config.json", site(py) / "toypkg/core.py"
    new_inodes = {p: p.lstat().st_ino for p in (unchanged, changed)}
    res = restore_snapshot(env, snap)
    assert tree_state(env.prefix) == before  # byte for byte, every file hashed
    assert res.proven_same == 1  # config.json: the one file both versions ship alike
    assert unchanged.lstat().st_ino == new_inodes[unchanged]
    assert changed.lstat().st_ino != new_inodes[changed]
    assert not list(site(py).glob("toypkg-2.0.0.dist-info"))
    again = restore_snapshot(env, snap)  # remembered as an alias once the old RECORD is back
    assert again.written == 0 and again.deleted == 0
    assert verify(env, snap) > 0


def test_upgrade_that_changed_only_a_mode_is_chmodded(tmp_path: Path, lanes: int) -> None:
    """Same bytes, another mode in the new version: proven, and the snapshot's mode put back."""
    wh = tmp_path / "wh"
    body = {"modpkg/__init__.py": "X = 1\n", "modpkg/run.sh": "#!/bin/sh\necho hi\n"}
    build_wheel(wh, "modpkg", "1.0.0", body, executable=["modpkg/run.sh"])
    build_wheel(wh, "modpkg", "1.1.0", body)  # run.sh no longer executable
    py = make_venv(tmp_path / "env")
    uv_install(py, "modpkg==1.0.0", find_links=wh, extra=COPY)
    env = Environment.inspect(py)
    before = tree_state(env.prefix)
    script = site(py) / "modpkg/run.sh"
    assert script.stat().st_mode & 0o111
    snap = take_snapshot(env, Store(env.prefix), label="pre", status="pre-upgrade").meta
    uv_install(py, "modpkg==1.1.0", find_links=wh, extra=COPY)
    assert not script.stat().st_mode & 0o111
    res = restore_snapshot(env, snap)
    assert tree_state(env.prefix) == before
    assert res.proven_same == 2 and res.chmodded >= 1
    assert script.stat().st_mode & 0o111


def test_patches_after_a_proven_rollback_trusts_the_proof(setup, wheelhouse: Path) -> None:
    """After a rollback that left proven files in place (newer than the RECORD it put back),
    `patches` takes the restore's proof instead of hashing them — and still finds an edit."""
    py, env, store = setup
    snap = take_snapshot(env, store, label="pre", status="pre-upgrade").meta
    reinstall_all(py, wheelhouse)
    res = restore_snapshot(env, snap)
    assert res.proven_same > 0
    env = Environment.inspect(py)
    clean = patches.scan(env, store=store, uv_cache=None)
    assert clean.patches == []
    assert clean.stats["files_hashed"] == 0  # every proven file taken on the restore's word
    # No proof to go by: the proven sources are back at the snapshot's mtime (older than the
    # RECORD put back: pristine by their stat alone); the proven binaries keep the reinstall's
    # mtime, newer than that RECORD, and are hashed — and found pristine.
    binaries = [s for s in site(py).rglob("*.so")]
    assert len(binaries) == 2
    without = patches.scan(env, store=None, uv_cache=None)
    assert without.patches == [] and without.stats["files_hashed"] == len(binaries)

    core = site(py) / "toypkg/core.py"
    with open(core, "a") as fh:  # an edit in place: same inode, new mtime
        fh.write("# hand patch\n")
    found = patches.scan(Environment.inspect(py), store=store, uv_cache=None)
    assert [p.path.rsplit("/", 1)[-1] for p in found.patches] == ["core.py"]


def test_alias_file_round_trips_and_a_damaged_one_reads_as_empty(tmp_path: Path) -> None:
    """The columns come back as written (a big inode, a pre-1970 mtime, an unknown size and
    sha256, a path that is not UTF-8); later entries replace earlier ones; any cut of the file,
    or bytes after its end, reads as no aliases at all."""
    sha = hashlib.sha256(b"x").hexdigest()
    first = Found()
    first.add("0/a/b.py", 1, 2, 3, "0" * 64)
    first.add("1/bin/x", 3, 4, 0, hashlib.sha256(b"").hexdigest())
    files = Aliases.empty().merged(first)
    second = Found()
    second.add("0/a/b.py", 2**64 - 1, -5, 10, sha)
    second.add("0/c\udcff.so", 7, 1_700_000_000_000_000_000, -1, "0" * 64)
    files = files.merged(second)
    files.roots = ["/srv/env", "/usr"]
    path = tmp_path / ALIASES
    path.write_bytes(files.to_bytes())
    roots, back = read_alias_file(path)
    assert roots == ["/srv/env", "/usr"]
    assert dict(back.items()) == {"1/bin/x": [3, 4, 0, hashlib.sha256(b"").hexdigest()],
                                  "0/a/b.py": [2**64 - 1, -5, 10, sha],
                                  "0/c\udcff.so": [7, 1_700_000_000_000_000_000, None, None]}
    assert len(back) == 3 and "0/a/b.py" in back and "0/zz" not in back and back.get("0/zz") is None
    raw = path.read_bytes()
    for cut in (1, len(raw) // 3, len(raw) - 1):
        path.write_bytes(raw[:cut])
        assert len(read_alias_file(path)[1]) == 0
    path.write_bytes(raw + b"\0junk")
    assert len(read_alias_file(path)[1]) == 0


def test_a_torn_alias_file_costs_relinks_not_a_wrong_restore(setup, wheelhouse: Path) -> None:
    """A crash may leave the aliases file torn (it is written without an fsync): the next
    restore believes none of it, relinks what it can no longer prove, and is byte-exact."""
    py, env, store = setup
    before = tree_state(env.prefix)
    snap = take_snapshot(env, store, label="pre", status="pre-upgrade").meta
    reinstall_all(py, wheelhouse)
    restore_snapshot(env, snap)
    raw = (snap.path / ALIASES).read_bytes()
    (snap.path / ALIASES).write_bytes(raw[: len(raw) // 2])
    # A proven binary (a proven source has its mtime put back, and needs no alias).
    ops = site(py) / "toypkg" / "_ops.so"
    proven_inode = ops.lstat().st_ino
    again = restore_snapshot(env, snap)
    assert again.written >= 1 and ops.lstat().st_ino != proven_inode  # relinked: no longer proven
    assert tree_state(env.prefix) == before
    assert verify(env, snap) > 0


def test_an_alias_file_from_an_earlier_rewheel_is_read_and_replaced(setup, wheelhouse: Path) -> None:
    """A store written by an earlier rewheel has `aliases.json` (JSON columns): its proofs still
    hold, and the next restore that proves anything writes the new file in its place."""
    py, env, store = setup
    before = tree_state(env.prefix)
    snap = take_snapshot(env, store, label="pre", status="pre-upgrade").meta
    reinstall_all(py, wheelhouse)
    restore_snapshot(env, snap)
    roots, files = read_alias_file(snap.path / ALIASES)
    keys = list(files)
    (snap.path / "aliases.json").write_text(json.dumps({
        "version": 3, "roots": roots, "paths": keys, "inos": [files[k][0] for k in keys],
        "mtimes": [files[k][1] for k in keys], "sizes": [files[k][2] for k in keys],
        "shas": [files[k][3] for k in keys]}))
    (snap.path / ALIASES).unlink()
    assert dict(read_alias_file(snap.path / ALIASES)[1].items()) == dict(files.items())
    again = restore_snapshot(env, snap)  # the proofs from the JSON file: nothing to relink
    assert again.written == 0 and tree_state(env.prefix) == before
    reinstall_all(py, wheelhouse)
    restore_snapshot(env, snap)
    assert (snap.path / ALIASES).exists() and not (snap.path / "aliases.json").exists()
    assert tree_state(env.prefix) == before


def _stale_bytecode(site_dir: Path) -> list[str]:
    """Every .pyc whose header (PEP 552, timestamp-based) does not match its source's mtime
    and size: what the interpreter would recompile at the next import."""
    stale = []
    for pyc in site_dir.rglob("__pycache__/*.pyc"):
        source = pyc.parent.parent / (pyc.name.split(".", 1)[0] + ".py")
        if not source.exists():
            continue
        head = pyc.read_bytes()[:16]
        flags, mtime, size = (int.from_bytes(head[i:i + 4], "little") for i in (4, 8, 12))
        st = source.stat()
        if flags == 0 and (mtime != int(st.st_mtime) & 0xFFFFFFFF or size != st.st_size & 0xFFFFFFFF):
            stale.append(str(pyc.relative_to(site_dir)))
    return stale


def test_proven_sources_get_the_snapshots_mtime_so_their_bytecode_is_current(
        tmp_path: Path, wheelhouse: Path, lanes: int) -> None:
    """A proven source keeps its bytes and inode but not the reinstall's mtime: the restored
    byte-code records the snapshot's mtime, and a source left at another would read as stale
    (the restarted service recompiles it inside the downtime, and rewrites the snapshot's
    byte-code). Its mtime is put back; every .pyc is current after the rollback."""
    py = make_venv(tmp_path / "env")
    bytecode = ("--compile-bytecode", *COPY)
    uv_install(py, "toypkg==1.0.0", "toyhelper==1.0.0", find_links=wheelhouse, extra=bytecode)
    env = Environment.inspect(py)
    assert _stale_bytecode(site(py)) == [] and list(site(py).rglob("core.*.pyc"))
    core = site(py) / "toypkg" / "core.py"
    snapped = core.stat().st_mtime_ns
    snap = take_snapshot(env, Store(env.prefix), label="pre", status="pre-upgrade").meta
    before = tree_state(env.prefix)
    time.sleep(1.1)  # byte-code records whole seconds: the reinstall is a second later
    uv_install(py, "toypkg==1.0.0", "toyhelper==1.0.0", find_links=wheelhouse,
               extra=("--reinstall", *bytecode))
    inode = core.stat().st_ino
    assert core.stat().st_mtime_ns != snapped
    res = restore_snapshot(env, snap)
    assert res.proven_same >= 2 and core.stat().st_ino == inode  # proven, left in place
    assert core.stat().st_mtime_ns == snapped
    assert tree_state(env.prefix) == before
    assert _stale_bytecode(site(py)) == []
    assert verify(env, snap) > 0  # and a plain stat walk finds the environment the snapshot's
