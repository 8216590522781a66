"""Snapshots survive the edits they exist to protect: an edit written *in place* into a live
file that a snapshot shares by hard link (one inode) rewrites the snapshot's copy too. Only
binaries are shared so (sources and configs are copied: tests/test_hand_edits.py); a binary
patched in place (`patchelf`, a hex editor) is the case here, `_ops.so` of the toy wheels.

Shown with real files and processes: on this machine's ext4 (no reflink) `verify` finds the
damage (fast: stat; `--full`: sha256), `patches` says the patched file shares its inode with
a snapshot, and `rollback` still restores every byte — from uv's cache when its copy is
intact, else from the recipe's (real, local) index — checked before anything is stopped; it
refuses with exit 3, the service untouched and every file of the environment unchanged,
when no source has the bytes. On a loop-mounted XFS and btrfs image the snapshot is made of
reflinks, and the same edit cannot reach it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import support_env
from support_env import make_venv, tree_state, uv_install
from support_run import make_host
import support_cli


def rewheel(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return support_cli.rewheel(*args, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}, timeout=300)


def json_of(cp: subprocess.CompletedProcess[str], code: int) -> dict:
    assert cp.returncode == code, f"exit {cp.returncode}\n{cp.stdout}\n{cp.stderr}"
    return json.loads(cp.stdout)


def site_packages(prefix: Path) -> Path:
    return next(prefix.glob("lib/python3*/site-packages"))


def edit_in_place(path: Path, text: str = "# hand fix, written in place\n") -> None:
    """What `echo >>` or Python's open(..., "a") do: the same inode, new bytes."""
    ino = path.stat().st_ino
    with open(path, "a") as f:
        f.write(text)
    assert path.stat().st_ino == ino


def stored_file(snapshot_path: str, prefix: Path, live: Path) -> Path:
    return support_env.stored_file(snapshot_path, live.relative_to(prefix))


# --------------------------------------------------------------------------------------
# ext4 (this machine's filesystem: hard links, no reflink)
# --------------------------------------------------------------------------------------
def test_edit_in_place_is_found_by_verify_and_patches_and_rollback_restores_from_uv_cache(
        tmp_path: Path, wheelhouse: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A private uv cache; the environment gets copies of its files (uv's copy mode), so the
    # edit below reaches the snapshot but not uv's cache.
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    py = make_venv(tmp_path / "env")
    prefix = py.parent.parent
    uv_install(py, "toypkg==1.0.0", find_links=wheelhouse, extra=("--link-mode", "copy"))
    core = site_packages(prefix) / "toypkg" / "_ops.so"
    snap = json_of(rewheel("snapshot", "--python", str(py), "--json"), 0)
    stored = stored_file(snap["path"], prefix, core)
    assert stored.stat().st_ino == core.stat().st_ino  # shared by a hard link: the hazard
    before = tree_state(prefix)

    assert json_of(rewheel("verify", "--python", str(py), "--json"), 0)["ok"] is True
    edit_in_place(core)
    assert stored.read_bytes().endswith(b"written in place\n")  # the snapshot's copy changed too

    for extra in ((), ("--full",)):
        doc = json_of(rewheel("verify", "--python", str(py), snap["id"], "--json", *extra), 3)
        (res,) = doc["snapshots"]
        assert doc["ok"] is False and res["ok"] is False and res["full"] is bool(extra)
        assert [(d["path"].split("site-packages/")[1], d["problem"], d["shared_inode"]) for d in res["damaged"]] \
            == [("toypkg/_ops.so", "changed", True)]
        assert res["damaged"][0]["live_path"] == str(core)
    human = rewheel("verify", "--python", str(py))
    assert human.returncode == 3 and "toypkg/_ops.so" in human.stdout and "edited in place" in human.stdout

    # `patches` says the patched file shares its inode with the snapshot, and flags it.
    doc = json_of(rewheel("patches", "--python", str(py), "--offline", "--json"), 0)
    (p,) = [p for p in doc["patches"] if p["path"] == "toypkg/_ops.so"]
    assert p["shares_snapshot_inode"] == [snap["id"]]
    assert p["shares_uv_cache_inode"] is False
    assert [d["id"] for d in doc["damaged_snapshots"]] == [snap["id"]]
    # So does `history`.
    hist = json_of(rewheel("history", "--python", str(py), "--json"), 0)
    assert [(s["id"], s["damaged_files"]) for s in hist["snapshots"]] == [(snap["id"], 1)]
    assert "damaged" in rewheel("history", "--python", str(py)).stdout

    doc = json_of(rewheel("rollback", "--python", str(py), snap["id"], "--yes", "--json"), 0)
    assert [(r["path"], r["source"]) for r in doc["recovered"]["recovered"]] == [(str(core), "uv-cache")]
    assert doc["recovered"]["unrecoverable"] == []
    assert tree_state(prefix) == before
    # `history` reads what the last check found: the recovery made the snapshot whole.
    hist = json_of(rewheel("history", "--python", str(py), "--json"), 0)
    assert [s["damaged_files"] for s in hist["snapshots"] if s["id"] == snap["id"]] == [0]
    # The snapshot is whole again, and a second rollback needs nothing recovered.
    assert json_of(rewheel("verify", "--python", str(py), "--full", "--json"), 0)["ok"] is True
    doc = json_of(rewheel("rollback", "--python", str(py), snap["id"], "--yes", "--json"), 0)
    assert doc["recovered"] is None and doc["restore"]["written"] == 0


def test_verify_full_finds_an_edit_that_kept_size_and_mtime(tmp_path: Path, wheelhouse: Path) -> None:
    py = make_venv(tmp_path / "env")
    prefix = py.parent.parent
    uv_install(py, "toypkg==1.0.0", find_links=wheelhouse, extra=("--link-mode", "copy"))
    cfg = site_packages(prefix) / "toypkg" / "_ops.so"
    snap = json_of(rewheel("snapshot", "--python", str(py), "--json"), 0)
    st = cfg.stat()
    data = cfg.read_bytes()
    with open(cfg, "r+b") as f:  # same size, same inode; then the old mtime put back
        f.write(data.replace(b"1.0.0", b"1.0.1"))
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert json_of(rewheel("verify", "--python", str(py), "--json"), 0)["ok"] is True  # stat cannot see it
    doc = json_of(rewheel("verify", "--python", str(py), snap["id"], "--full", "--json"), 3)
    (res,) = doc["snapshots"]
    assert [(d["path"].rpartition("/")[2], d["problem"]) for d in res["damaged"]] == [("_ops.so", "sha256 differs")]
    assert res["bytes_hashed"] > 0


def test_snapshots_sharing_an_inode_are_all_flagged(tmp_path: Path, wheelhouse: Path) -> None:
    """Two snapshots of an unchanged environment hold the same inodes: one edit damages both,
    and the check over the store (which stats a folder they share once) says so for each."""
    from rewheel.recipe import Recipe
    from rewheel.commands import open_target, snapshot_now
    from rewheel.snapshot import damaged_files, verify_snapshot

    py = make_venv(tmp_path / "env")
    uv_install(py, "toypkg==1.0.0", find_links=wheelhouse, extra=("--link-mode", "copy"))
    t = open_target(Recipe.for_python(py))
    a, b = (snapshot_now(t).result.meta for _ in range(2))
    assert damaged_files(t.store.list()) == {a.id: 0, b.id: 0}
    edit_in_place(site_packages(py.parent.parent) / "toypkg" / "_ops.so")
    assert damaged_files(t.store.list()) == {a.id: 1, b.id: 1}
    for m in (a, b):  # each on its own, as `verify SNAPSHOT` checks it
        (d,) = verify_snapshot(m).damaged
        assert d.path.endswith("toypkg/_ops.so") and d.problem == "changed" and d.shared


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    # A private uv cache: uv hard-links the environment's files from it (its default), so
    # the edit in place reaches uv's cached copy as well as the snapshot's.
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    h = make_host(tmp_path, "2.0.0", "good", binary=True)
    h.start_service()
    assert h.served_version() == "1.0.0"
    yield h
    h.stop_service()
    h._index.stop()  # type: ignore[attr-defined]


def _service_pid(h) -> str:
    from rewheel.recipe import load_recipe
    from rewheel.commands import open_target

    return (open_target(load_recipe(h.recipe)).store.env_dir / "service.pid").read_text()


def test_rollback_restores_an_edited_file_from_the_index_with_the_service(host) -> None:
    h = host
    core = site_packages(h.prefix) / "toypkg" / "_ops.so"
    snap = json_of(h.rewheel("snapshot", str(h.recipe), "--json"), 0)
    before = h.state()
    edit_in_place(core)
    cached = [p for p in Path(os.environ["UV_CACHE_DIR"]).glob("archive-v*/*/toypkg/_ops.so")]
    assert cached and all(p.stat().st_ino == core.stat().st_ino for p in cached)  # uv's copy is edited too

    doc = json_of(h.rewheel("rollback", str(h.recipe), snap["id"], "--yes", "--json"), 0)
    assert [(r["path"], r["source"]) for r in doc["recovered"]["recovered"]] == [(str(core), "index")]
    assert h.state() == before
    assert h.served_version() == "1.0.0"
    assert json_of(h.rewheel("verify", str(h.recipe), "--json"), 0)["ok"] is True


def test_rollback_refuses_before_stopping_anything_when_no_source_has_the_bytes(host) -> None:
    h = host
    core = site_packages(h.prefix) / "toypkg" / "_ops.so"
    snap = json_of(h.rewheel("snapshot", str(h.recipe), "--json"), 0)
    edit_in_place(core)
    for wheel in h.wheels.glob("toypkg-1.0.0-*.whl"):  # the index no longer offers the build
        wheel.unlink()
    state, pid = h.state(), _service_pid(h)

    doc = json_of(h.rewheel("rollback", str(h.recipe), snap["id"], "--yes", "--json"), 3)
    assert doc["error"] == "SnapshotDamaged"
    assert str(core) in doc["message"] and "toypkg==1.0.0" in doc["hint"]
    assert "nothing was stopped or changed" in doc["hint"]
    assert h.state() == state  # every file of the environment, hashed, is as it was
    assert _service_pid(h) == pid and h.served_version() == "1.0.0"  # never stopped
    # Nothing left half-done: the next command is not blocked by an unfinished rollback.
    assert h.rewheel("history", str(h.recipe)).returncode == 0


# --------------------------------------------------------------------------------------
# XFS and btrfs on a loop-mounted image: the snapshot is made of reflinks
# --------------------------------------------------------------------------------------
def _loop_mount(tmp_path: Path, fs: str) -> Iterator[Path]:
    mkfs = shutil.which(f"mkfs.{fs}") or (f"/usr/sbin/mkfs.{fs}" if os.path.exists(f"/usr/sbin/mkfs.{fs}") else None)
    if os.geteuid() != 0:
        pytest.skip(f"mounting a {fs} image needs root")
    if mkfs is None:
        pytest.skip(f"mkfs.{fs} is not installed (.ci/run installs it)")
    img, mnt = tmp_path / f"{fs}.img", tmp_path / f"mnt-{fs}"
    with open(img, "wb") as f:
        f.truncate(320 << 20)  # sparse; XFS needs 300 MiB at least
    mnt.mkdir()
    made = subprocess.run([mkfs, "-q", str(img)] if fs == "xfs" else [mkfs, "-q", "-f", str(img)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"mkfs.{fs} failed: {made.stderr.strip()[:200]}")
    mounted = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot loop-mount a {fs} image here: {mounted.stderr.strip()[:200]}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture(params=["xfs", "btrfs"])
def cow_mount(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    yield from _loop_mount(tmp_path, request.param)


def test_on_a_reflink_filesystem_an_edit_in_place_cannot_reach_the_snapshot(
        cow_mount: Path, wheelhouse: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REWHEEL_HOME", str(cow_mount / "rewheel-home"))
    py = make_venv(cow_mount / "env")
    prefix = py.parent.parent
    uv_install(py, "toypkg==1.0.0", find_links=wheelhouse, extra=("--link-mode", "copy"))
    core = site_packages(prefix) / "toypkg" / "core.py"
    snap = json_of(rewheel("snapshot", "--python", str(py), "--json"), 0)
    assert snap["link_mode"] == "reflink" and snap["files_linked"] == 0
    assert stored_file(snap["path"], prefix, core).stat().st_ino != core.stat().st_ino
    before = tree_state(prefix)

    edit_in_place(core)
    assert json_of(rewheel("verify", "--python", str(py), "--full", "--json"), 0)["ok"] is True
    doc = json_of(rewheel("rollback", "--python", str(py), snap["id"], "--yes", "--json"), 0)
    assert doc["recovered"] is None and doc["restore"]["written"] == 1
    assert tree_state(prefix) == before
