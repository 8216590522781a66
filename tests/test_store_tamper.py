"""A tampered or odd store, and an odd process setting, never make things worse.

The real CLI on a real venv: a `trash` folder replaced by a link elsewhere, a meta.json that
is a FIFO, a manifest of a version this rewheel does not know, a tampered cleanup entry (all
refused or left alone before anything changes); a umask of 000; an output encoding that
cannot show a label; `why` on /dev/null; a rollback that had nothing to restore."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path

from test_bad_inputs import Ctx, index_url  # noqa: F401 - the fixture, by name

from support_env import tree_state
import support_cli


def cli(*args: str, env: dict[str, str] | None = None, umask: int = -1) -> subprocess.CompletedProcess[str]:
    return support_cli.rewheel(*args, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}, timeout=300,
                               umask=umask)


def _snapshot(py: Path) -> dict:
    cp = cli("snapshot", "--python", str(py), "--json")
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def test_nothing_rewheel_writes_is_world_writable_under_umask_000(tmp_path: Path, index_url: str) -> None:  # noqa: F811
    c = Ctx(tmp_path, index_url)
    py = c.python()
    (c.site / "toypkg" / "local.dat").write_bytes(b"unlisted: copied into the snapshot")
    recipe = c.recipe()
    assert cli("snapshot", "--python", str(py), umask=0).returncode == 0
    cp = cli("run", str(recipe), "--yes", "--json", umask=0)
    assert cp.returncode == 0, cp.stderr
    prefix = c.python().parent.parent
    made = [p for root in (c.home, prefix) for p in [root, *root.rglob("*")] if not p.is_symlink()]
    # (uv makes its own `.lock` in the prefix 0666 under any umask: not rewheel's.)
    open_to_all = [str(p) for p in made if p.lstat().st_mode & stat.S_IWOTH and p != prefix / ".lock"]
    assert not open_to_all, open_to_all[:10]


def test_a_label_the_output_encoding_cannot_show_is_escaped(tmp_path: Path, index_url: str) -> None:  # noqa: F811
    py = Ctx(tmp_path, index_url).python()
    assert cli("snapshot", "--python", str(py), "--label", "café ☕").returncode == 0
    cp = cli("history", "--python", str(py), env={"PYTHONIOENCODING": "ascii:strict"})
    assert cp.returncode == 0, cp.stderr
    assert "internal error" not in cp.stderr and "caf\\xe9 \\u2615" in cp.stdout


def test_why_reads_dev_null_as_an_empty_log() -> None:
    cp = cli("why", "/dev/null", "--json")
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout) == {"root_cause": None}
    assert "not found" not in cp.stderr


def test_a_rollback_that_restored_nothing_says_so(tmp_path: Path, index_url: str) -> None:  # noqa: F811
    py = Ctx(tmp_path, index_url).python()
    snap = _snapshot(py)["id"]
    cp = cli("rollback", "--python", str(py), snap, "--yes", "--no-undo")
    assert cp.returncode == 0, cp.stderr
    assert "nothing needed restoring" in cp.stdout + cp.stderr


def test_a_manifest_of_an_unknown_version_is_refused_before_anything_changes(tmp_path: Path,
                                                                              index_url: str) -> None:  # noqa: F811
    c = Ctx(tmp_path, index_url)
    py = c.python()
    snap = _snapshot(py)
    # As a newer rewheel would write one: its own magic line.
    man = Path(snap["path"]) / "manifest.bin"
    man.write_bytes(man.read_bytes().replace(b"rewheel manifest 3\n", b"rewheel manifest 99\n", 1))
    (c.site / "toypkg" / "added.py").write_text("X = 1\n")
    before = tree_state(py.parent.parent)
    cp = cli("rollback", "--python", str(py), snap["id"], "--yes", "--json")
    assert cp.returncode == 3, cp.stdout + cp.stderr
    assert "manifest version 99" in json.loads(cp.stdout)["message"]
    assert tree_state(py.parent.parent) == before
    assert cli("history", "--python", str(py)).returncode == 0  # no journal left open


def test_a_meta_json_that_is_a_fifo_does_not_hang_anything(tmp_path: Path, index_url: str) -> None:  # noqa: F811
    py = Ctx(tmp_path, index_url).python()
    snap = _snapshot(py)
    meta = Path(snap["path"]) / "meta.json"
    meta.unlink()
    os.mkfifo(meta)
    t0 = time.monotonic()
    hist = cli("history", "--python", str(py), "--json")
    assert hist.returncode == 0, hist.stderr
    assert snap["id"] in json.loads(hist.stdout)["damaged_snapshots"]
    rb = cli("rollback", "--python", str(py), snap["id"], "--yes", "--json")
    assert rb.returncode == 3 and "not a regular file" in json.loads(rb.stdout)["message"], rb.stdout
    assert time.monotonic() - t0 < 120  # answered, not blocked on the FIFO (the calls time out at 300 s)


def test_a_trash_folder_replaced_by_a_link_is_refused(tmp_path: Path, index_url: str) -> None:  # noqa: F811
    """The home's `trash/` a link: refused before the rollback moves anything (LinkInState,
    exit 3, naming it — `rewheel.owned`); nothing is moved into the link's target nor swept there."""
    c = Ctx(tmp_path, index_url)
    py = c.python()
    snap = _snapshot(py)["id"]
    # A new package folder: the rollback moves it out of the environment (displaced).
    new = c.site / "newpkg"
    new.mkdir()
    for i in range(20):
        (new / f"m{i}.py").write_text(f"X = {i}\n")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "restore-old").mkdir(parents=True)
    (elsewhere / "restore-old" / "keep.txt").write_text("not the store's")
    old = time.time() - 7200
    os.utime(elsewhere / "restore-old", (old, old))
    trash = c.home / "trash"
    assert not trash.exists()
    trash.symlink_to(elsewhere)
    cp = cli("rollback", "--python", str(py), snap, "--yes", "--no-undo")
    assert cp.returncode == 3 and f"{trash} is a symlink" in cp.stderr, cp.stderr
    assert sorted(p.name for p in new.iterdir()) == sorted(f"m{i}.py" for i in range(20))  # nothing changed
    time.sleep(1)  # a detached deletion would have begun
    assert (elsewhere / "restore-old" / "keep.txt").read_text() == "not the store's"
    assert [p.name for p in elsewhere.iterdir()] == ["restore-old"]


def test_a_tampered_cleanup_entry_is_refused_before_the_restore(tmp_path: Path, index_url: str) -> None:  # noqa: F811
    c = Ctx(tmp_path, index_url)
    py = c.python()
    (tmp_path / "dumps").mkdir()
    (tmp_path / "dumps" / "a.pt").write_bytes(b"dump")
    recipe = c.recipe(f'[cleanup]\npaths = ["{tmp_path}/dumps/*.pt"]\n')
    run = cli("run", str(recipe), "--yes", "--json")
    assert run.returncode == 0, run.stderr
    snap = json.loads(run.stdout)["snapshot_id"]
    meta_path = next(c.home.rglob(f"snapshots/{snap}/meta.json"))
    meta = json.loads(meta_path.read_text())
    meta["cleanup"][0]["path"] = f"{tmp_path}/dumps/sub/../../../etc-x.pt"
    meta_path.write_text(json.dumps(meta))
    (c.site / "toypkg" / "added.py").write_text("X = 1\n")  # a restore would remove it
    before = tree_state(py.parent.parent)
    cp = cli("rollback", str(recipe), snap, "--yes", "--json")
    assert cp.returncode == 3, cp.stdout + cp.stderr
    assert "cleanup entr" in json.loads(cp.stdout)["message"]
    assert tree_state(py.parent.parent) == before  # refused before the restore
    assert cli("history", "--python", str(py)).returncode == 0  # and no journal left open


def test_a_tampered_cleanup_entry_in_a_resumed_revert_moves_nothing_and_closes_the_run(tmp_path: Path) -> None:
    """A run killed before its smoke test, its snapshot's cleanup entry tampered: `resume`
    finds the entry before it stops or restores anything, still restores the environment's
    files byte for byte and restarts the service (a failed build must not stay live for a
    stray file), moves nothing back, fails with exit 3 naming the entry — and closes the
    run, so no later command is blocked by it."""
    from support_run import make_host

    h = make_host(tmp_path, "2.0.0", "smoke-fails")
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "a.pt").write_bytes(b"dump")
    h.write_recipe(cleanup={"paths": [f"{dumps}/*.pt"]})
    try:
        h.start_service()
        before = h.state()
        cp = h.rewheel("run", str(h.recipe), "--yes", "--quiet", env={"REWHEEL_FAULT_AT": "step:smoke"})
        assert cp.returncode == -9, cp.stderr
        assert not (dumps / "a.pt").exists()  # stashed into the snapshot
        meta_path = next(p for p in (tmp_path / "rewheel-home").rglob("snapshots/*/meta.json")
                         if json.loads(p.read_text()).get("cleanup"))
        meta = json.loads(meta_path.read_text())
        meta["cleanup"][0]["path"] = f"{dumps}/sub/../../../etc-x.pt"
        meta_path.write_text(json.dumps(meta))
        res = h.rewheel("resume", str(h.recipe), "--yes")
        assert res.returncode == 3, res.stdout + res.stderr
        assert "cleanup entr" in res.stderr and "nothing was moved back" in res.stderr, res.stderr
        assert h.state() == before  # the environment's files are the old state, byte for byte
        assert h.served_version() == "1.0.0"  # and the old service is back
        assert not (dumps / "a.pt").exists() and not (tmp_path / "etc-x.pt").exists()  # nothing moved
        assert h.rewheel("history", str(h.recipe)).returncode == 0  # the run is closed
    finally:
        h.stop_service()
        h._index.stop()  # type: ignore[attr-defined]
