"""`[cleanup] paths` touch debris only, and move it back only through the folders it came from.

Real files and the real CLI: `check` lists what each glob matches today; a stored entry
is matched by the recipe's globs the way `glob` matches (a `*` never crosses a `/`); an
entry goes back through a symlinked folder only when that very link was there when it was
stashed. (The refusals through the CLI are in test_bad_inputs.py.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rewheel import snapshot as snapmod
from rewheel.errors import SnapshotDamaged, UnsafeCleanupPath
from rewheel.recipe import Recipe
from rewheel.commands import open_target, snapshot_now
from rewheel.snapshot.cleanup import cleanup_glob_refusal, glob_matches
from support_env import make_venv
import support_cli


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("env") / "env")


@pytest.mark.parametrize("path, pattern, ok", [
    ("/tmp/d/x.pt", "/tmp/d/*.pt", True),
    ("/tmp/d/sub/x.pt", "/tmp/d/*.pt", False),  # fnmatch's `*` would take the `/`
    ("/tmp/d/a/b/x.pt", "/tmp/d/*/x.pt", False),
    ("/tmp/d/a/x.pt", "/tmp/d/*/x.pt", True),
    ("/tmp/d/.hidden.pt", "/tmp/d/*.pt", False),  # glob leaves dot files to a leading dot
    ("/tmp/d/.hidden.pt", "/tmp/d/.*.pt", True),
])
def test_stored_entries_are_matched_as_glob_matches(path: str, pattern: str, ok: bool) -> None:
    assert glob_matches(path, pattern) is ok


@pytest.mark.parametrize("pattern, refused", [
    ("/tmp/*.pt", False), ("/var/tmp/run-*/*.bin", False), ("/dev/shm/*", False),
    ("/root/.cache/torch/*.pt", False), ("/home/svc/.cache/vllm/*", False), ("/scratch/dumps/*.pt", False),
    ("/etc/*", True), ("/root/*", True), ("/var/lib/*", True), ("/usr/lib/*.so", True), ("/run/lock", True),
    ("/", True), ("/*", True), ("/boot", True), ("/tmp", True), ("/dev/shm", True), ("/root/.cache", True),
    ("/home/*/.cache/*", True), ("/tmp/../etc/*", True), ("tmp/*.pt", True),
])
def test_which_globs_are_refused(pattern: str, refused: bool) -> None:
    assert (cleanup_glob_refusal(pattern) is not None) is refused, cleanup_glob_refusal(pattern)


def test_check_lists_what_each_glob_matches_today(tmp_path: Path, venv: Path) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for name in ("a.pt", "b.pt", "keep.txt"):
        (dumps / name).write_bytes(b"x")
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[environment]\npython = "{venv}"\n[cleanup]\npaths = ["dumps/*.pt", "{tmp_path}/none/*"]\n')
    cp = support_cli.rewheel("check", str(recipe), "--json", stdin=subprocess.DEVNULL, timeout=120)
    doc = json.loads(cp.stdout)
    check = next(c for c in doc["checks"] if c["name"] == "cleanup")
    assert check["ok"], check
    assert f"{dumps}/*.pt: 2 match(es) ({dumps}/a.pt, {dumps}/b.pt)" in check["detail"]
    assert f"{tmp_path}/none/*: 0 match(es)" in check["detail"]
    assert sorted(p.name for p in dumps.iterdir()) == ["a.pt", "b.pt", "keep.txt"]  # nothing moved


def test_check_fails_a_match_inside_a_system_folder_through_a_link(tmp_path: Path, venv: Path) -> None:
    (tmp_path / "dumps").symlink_to("/etc")
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[environment]\npython = "{venv}"\n[cleanup]\npaths = ["dumps/passw?"]\n')
    cp = support_cli.rewheel("check", str(recipe), "--json", stdin=subprocess.DEVNULL, timeout=120)
    assert cp.returncode == 2, cp.stdout + cp.stderr
    check = next(c for c in json.loads(cp.stdout)["checks"] if c["name"] == "cleanup")
    assert not check["ok"] and "/etc/passwd" in check["detail"] and "/etc" in check["detail"]


def _stash(tmp_path: Path, venv: Path, rel: str) -> tuple[snapmod.SnapshotMeta, tuple[str, ...], Path]:
    src = tmp_path / rel
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(b"debug dump")
    globs = (str(src.parent / "*.pt"),)
    snap = snapshot_now(open_target(Recipe.for_python(venv))).result.meta
    assert [m["path"] for m in snapmod.stash_cleanup(snap, globs)] == [str(src)]
    return snap, globs, src


def test_a_folder_that_became_a_link_is_not_written_through(tmp_path: Path, venv: Path) -> None:
    snap, globs, src = _stash(tmp_path, venv, "u/x.pt")
    victim = tmp_path / "victim"
    victim.mkdir()
    src.parent.rmdir()
    src.parent.symlink_to(victim)
    with pytest.raises(UnsafeCleanupPath) as err:
        snapmod.unstash_cleanup(snap, globs)
    assert f"{src.parent} is now a symlink to {victim}" in err.value.message
    assert not any(victim.iterdir()) and snapmod.pending_cleanup(snap) == 1
    # Put back as a folder: the file goes back.
    src.parent.unlink()
    src.parent.mkdir()
    assert snapmod.unstash_cleanup(snap, globs) == 1 and src.read_bytes() == b"debug dump"


def test_a_removed_folder_is_made_again_and_a_link_that_was_there_is_followed(tmp_path: Path, venv: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "via").symlink_to(real)
    snap, globs, src = _stash(tmp_path, venv, "via/sub/x.pt")
    assert snap.cleanup[0]["links"] == {str(tmp_path / "via"): str(real)}
    (real / "sub").rmdir()  # a tmp cleaner took the folder
    assert snapmod.unstash_cleanup(snap, globs) == 1
    assert (real / "sub" / "x.pt").read_bytes() == b"debug dump"
    assert oct((real / "sub").stat().st_mode & 0o777) != oct(0o777)


def test_a_tampered_entry_crossing_a_slash_is_refused(tmp_path: Path, venv: Path) -> None:
    snap, globs, src = _stash(tmp_path, venv, "d/x.pt")
    meta = json.loads((snap.path / "meta.json").read_text())
    meta["cleanup"][0]["path"] = str(src.parent / "deeper" / "x.pt")  # `*.pt` must not match "deeper/x.pt"
    (snap.path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SnapshotDamaged):
        snapmod.unstash_cleanup(snapmod.SnapshotMeta.load(snap.path, snap.home), globs)
    assert not (src.parent / "deeper").exists() and not os.path.exists(src)


def test_a_service_users_cache_is_debris_and_its_home_is_not() -> None:
    """A service user's home may lie in a system folder (www-data: /var/www, a vllm user:
    /var/lib/vllm): its `.cache` holds debris, the rest of the home does not."""
    import pwd

    homes = {p.pw_dir for p in pwd.getpwall() if p.pw_dir.startswith(("/var/", "/usr/"))}
    assert homes, "no user with a home under /var or /usr in this machine's user database"
    for home in homes:
        assert cleanup_glob_refusal(f"{home}/.cache/vllm/*.pt") is None, home
        assert cleanup_glob_refusal(f"{home}/*") is not None, home


def test_uvs_cache_is_never_cleanup_debris(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """uv's cache is one of rewheel's recovery sources: a glob over a cache folder that
    matches it is refused, naming it."""
    from rewheel.errors import UsageError
    from rewheel.snapshot.cleanup import cleanup_matches

    cache = tmp_path / "cache"
    (cache / "uv").mkdir(parents=True)
    (cache / "torch").mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    assert cleanup_matches([f"{cache}/to*"], []) == [str(cache / "torch")]
    with pytest.raises(UsageError, match=f"{cache}/uv"):
        cleanup_matches([f"{cache}/*"], [])
    assert (cache / "uv").is_dir()


@pytest.mark.parametrize("glob_of", ["{base}/*", "{base}/rewheel-locks-*", "{parent}/*"])
def test_the_lock_folder_is_never_cleanup_debris(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, glob_of: str) -> None:
    """Issue 45, item 3: the lock folder (REWHEEL_LOCK_DIR's, /run/lock's or the /tmp
    fallback's `rewheel-locks-<uid>`) is protected as the environment, the state folder and
    uv's cache are: a glob that matches it, or a folder holding it, is refused naming it —
    a run paused at its reinstall would otherwise lose its lock to its own cleanup."""
    from rewheel.errors import UsageError
    from rewheel.paths import lock_dir
    from rewheel.snapshot.cleanup import cleanup_matches

    base = tmp_path / "x" / "locks"
    monkeypatch.setenv("REWHEEL_LOCK_DIR", str(base))
    base.mkdir(parents=True)
    (base / "other.pt").write_bytes(b"x")
    locks = lock_dir(os.geteuid())
    pattern = glob_of.format(base=base, parent=base.parent)
    with pytest.raises(UsageError, match=str(locks)):
        cleanup_matches([pattern], [])
    assert locks.is_dir()
    # Not yet made (no rewheel has locked anything here): protected all the same.
    locks.rmdir()
    with pytest.raises(UsageError, match=str(locks)):
        cleanup_matches([f"{base.parent}/*"], [])
    assert cleanup_matches([f"{base}/*.pt"], []) == [str(base / "other.pt")]


def test_the_fallback_lock_folders_are_protected_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without /run/lock the fallback is /tmp/rewheel-locks-<uid>: among the protected folders
    whichever base is in use, and every user's lock folder there."""
    from rewheel.snapshot.cleanup import lock_folders

    monkeypatch.delenv("REWHEEL_LOCK_DIR", raising=False)
    monkeypatch.setattr("rewheel.paths.LOCK_BASES", ())
    assert f"/tmp/rewheel-locks-{os.geteuid()}" in lock_folders()


def test_run_and_check_refuse_a_cleanup_glob_over_the_lock_folder(tmp_path: Path, venv: Path) -> None:
    base = tmp_path / "x"
    base.mkdir()
    (base / "dump.pt").write_bytes(b"x")
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[environment]\npython = "{venv}"\n[install]\npackages = ["toypkg"]\n'
                      f'[cleanup]\npaths = ["{base}/*"]\n')
    env = {**os.environ, "REWHEEL_LOCK_DIR": str(base)}
    for args in (("check",), ("run", "--yes")):
        cp = support_cli.rewheel(*args, str(recipe), "--json", env=env, stdin=subprocess.DEVNULL, timeout=120)
        assert cp.returncode == 2, cp.stdout + cp.stderr
        assert f"{base}/rewheel-locks-{os.geteuid()}" in cp.stdout, cp.stdout
    assert (base / "dump.pt").exists()
