"""The guard of rewheel's own folders (`rewheel.owned`), on real folders: a symlink at any
component below a base is refused naming it, before anything is made; the base itself may be
one; `check_state` finds a link at every level of a state folder it walks, and none inside
the folders that keep an environment's own entries. Hypothesis draws the paths and where the
link goes (a folder outside, a file outside, a dangling target)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewheel.errors import EXIT_UNRESTORED, LinkInState
from rewheel.owned import HOME_FOLDERS, check_state, own_dir, refuse_links

NAMES = st.text(alphabet="abcxyz.-_0", min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))


def digest(root: Path) -> list[tuple[str, str]]:
    out = []
    for p in sorted(root.rglob("*")):
        st_ = p.lstat()
        kind = "l" if stat.S_ISLNK(st_.st_mode) else "d" if stat.S_ISDIR(st_.st_mode) else "f"
        body = hashlib.sha256(p.read_bytes()).hexdigest() if kind == "f" else ""
        out.append((str(p.relative_to(root)), kind + body + oct(stat.S_IMODE(st_.st_mode))))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(NAMES, min_size=1, max_size=6), at=st.integers(min_value=0, max_value=5),
       made=st.integers(min_value=0, max_value=6), to=st.sampled_from(["folder", "file", "dangling"]))
def test_a_link_at_any_component_below_the_base_is_refused(parts: list[str], at: int, made: int, to: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = root / "home"
        base.mkdir()
        outside = root / "outside"
        outside.mkdir()
        (outside / "keep.txt").write_text("the user's\n")
        path = base.joinpath(*parts)
        at = at % len(parts)
        made = max(made % (len(parts) + 1), at)  # the folders above the link exist
        if made:
            base.joinpath(*parts[:made]).mkdir(parents=True, exist_ok=True)
        link = base.joinpath(*parts[:at + 1])
        if link.exists():
            shutil.rmtree(link)
        target = {"folder": outside, "file": outside / "keep.txt", "dangling": outside / "nothing"}[to]
        link.symlink_to(target)
        before = digest(outside), digest(base)
        with pytest.raises(LinkInState) as err:
            refuse_links(base, path)
        assert err.value.path == str(link) and err.value.exit_code == EXIT_UNRESTORED
        assert str(link) in err.value.message and "remove the link" in (err.value.hint or "")
        with pytest.raises(LinkInState):
            own_dir(base, path)
        assert (digest(outside), digest(base)) == before  # nothing made, here or there


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(NAMES, min_size=1, max_size=5), made=st.integers(min_value=0, max_value=5))
def test_without_a_link_the_folder_is_made_private(parts: list[str], made: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        real = Path(tmp) / "real-home"
        real.mkdir()
        base = Path(tmp) / "home"
        base.symlink_to(real)  # the base as the person gave it: a link they chose
        path = base.joinpath(*parts)
        made = made % (len(parts) + 1)
        if made:
            base.joinpath(*parts[:made]).mkdir(parents=True, exist_ok=True, mode=0o755)
        assert refuse_links(base, path) == path
        assert own_dir(base, path) == path and path.is_dir() and not path.is_symlink()
        for i in range(made + 1, len(parts) + 1):
            assert stat.S_IMODE(base.joinpath(*parts[:i]).stat().st_mode) == 0o700


def test_a_path_outside_the_base_is_a_caller_bug(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        refuse_links(tmp_path / "home", tmp_path / "elsewhere" / "x")


def _state(home: Path) -> Path:
    """A state folder with every kind of thing rewheel keeps, and the environment's own
    entries (with links among them) where a snapshot or a smoke test keeps them."""
    env = home / "envs" / "env-0123"
    for d in ("objects/ab", "snapshots/s1/tree/0/lib", "snapshots/s1/cleanup/0", "runs/r1/patches",
              "runs/r1/pythonpath", "runs/r1/prepared/logs", "resolution", "prepared/logs", "prepared.new/work/bin",
              "smoke/pythonpath"):
        (env / d).mkdir(parents=True, exist_ok=True)
    for f in ("env.json", "objects/ab/cdef", "snapshots/s1/meta.json", "snapshots/s1/manifest.bin",
              "runs/r1/journal.jsonl", "runs/r1/patches/patches.json", "runs/r1/prepared/logs/build.log",
              "resolution/pylock.toml", "prepared/prepared.json", "prepared/logs/resolve.log", "service.json"):
        (env / f).write_text("x\n")
    # Links that are the environment's (stored in a snapshot, a throwaway venv) or rewheel's own.
    (env / "snapshots/s1/tree/0/lib/lib64").symlink_to("lib")
    (env / "snapshots/s1/cleanup/0/link").symlink_to("/etc")
    (env / "prepared.new/work/bin/python").symlink_to("/usr/bin/python3")
    (env / "runs/r1/pythonpath/rewheel").symlink_to("/nonexistent")
    (env / "smoke/pythonpath/rewheel").symlink_to("/nonexistent")
    for d in HOME_FOLDERS:
        (home / d).mkdir(exist_ok=True)
    (home / "trash" / "restore-x").mkdir()
    (home / "ci" / "toy" / "run" / "env" / "bin").mkdir(parents=True)
    (home / "ci" / "toy" / "run" / "env" / "bin" / "python").symlink_to("/usr/bin/python3")
    return env


def test_check_state_walks_every_level_but_the_environments_own_entries(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = _state(home)
    check_state(home, env)  # the links above are not rewheel's to refuse
    outside = tmp_path / "outside"
    outside.mkdir()
    levels = [p for p in [*home.rglob("*")] if not p.is_symlink()]
    # Inside (not walked): what lies below a folder that keeps the environment's own entries,
    # below an object folder, a trash entry, or the home's other folders.
    walls = ("tree", "cleanup", "work", "pythonpath", "restore-x", "ab", "ci")

    own = [p for p in levels if not any(part in walls for part in p.relative_to(home).parts[:-1])]
    inside = [p for p in levels if p not in own]
    assert len(own) >= 30 and len(inside) >= 8
    for p in levels:
        saved = tmp_path / "saved"
        shutil.move(p, saved)
        p.symlink_to(outside)
        try:
            if p in own:
                with pytest.raises(LinkInState) as err:
                    check_state(home, env)
                assert err.value.path == str(p)
            else:
                check_state(home, env)
        finally:
            p.unlink()
            shutil.move(saved, p)
    assert not any(outside.iterdir())


def test_check_state_refuses_a_linked_environment_folder_and_trash_entry(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = _state(home)
    (home / "trash" / "restore-y").symlink_to(tmp_path)
    with pytest.raises(LinkInState, match="restore-y"):
        check_state(home)
    (home / "trash" / "restore-y").unlink()
    shutil.rmtree(env)
    env.symlink_to(tmp_path)
    with pytest.raises(LinkInState, match="env-0123"):
        check_state(home, env)
    os.unlink(env)
    check_state(home, env)  # not made yet: nothing to refuse


def test_check_lock_refuses_a_linked_lock_folder_or_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rewheel.owned import check_lock
    from rewheel.paths import lock_file_of

    monkeypatch.setenv("REWHEEL_LOCK_DIR", str(tmp_path / "locks"))
    (tmp_path / "locks").mkdir()
    prefix = tmp_path / "venv"
    prefix.mkdir()
    check_lock(prefix)  # nothing made yet: nothing to refuse
    _, lock = lock_file_of(prefix)
    outside = tmp_path / "outside"
    outside.mkdir()
    lock.parent.symlink_to(outside)
    with pytest.raises(LinkInState) as err:
        check_lock(prefix)
    assert err.value.path == str(lock.parent)
    lock.parent.unlink()
    lock.parent.mkdir()
    lock.symlink_to(outside / "x.lock")
    with pytest.raises(LinkInState) as err:
        check_lock(prefix)
    assert err.value.path == str(lock)
    assert not any(outside.iterdir())


def test_env_dir_is_never_made_through_a_link(tmp_path: Path) -> None:
    from rewheel.paths import env_dir, env_key

    home, outside, prefix = tmp_path / "home", tmp_path / "outside", tmp_path / "venv"
    for d in (home, outside, prefix):
        d.mkdir()
    (home / "envs").symlink_to(outside)
    with pytest.raises(LinkInState, match="envs"):
        env_dir(home, prefix)
    (home / "envs").unlink()
    made = env_dir(home, prefix)
    assert made == home / "envs" / env_key(prefix) and (made / "env.json").is_file()
    assert not any(outside.iterdir())


def test_atomic_write_replaces_a_link_rather_than_follow_it(tmp_path: Path) -> None:
    from rewheel.paths import atomic_write

    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (tmp_path / "meta.json").symlink_to(victim)
    atomic_write(tmp_path / "meta.json", "new\n")
    assert victim.read_text() == "keep\n" and not (tmp_path / "meta.json").is_symlink()
    assert (tmp_path / "meta.json").read_text() == "new\n"


def test_only_the_newest_runs_are_walked(tmp_path: Path) -> None:
    """Every run's folder is checked itself, the newest `RECENT_RUNS` walked: an older run's
    journal a link is left to where it is opened (without following a link)."""
    from rewheel.owned import RECENT_RUNS

    home = tmp_path / "home"
    env = home / "envs" / "env-0123"
    ids = [f"20260101-0000{i:02d}-abcd" for i in range(RECENT_RUNS + 2)]
    for rid in ids:
        (env / "runs" / rid).mkdir(parents=True)
    old_journal, new_journal = (env / "runs" / ids[0] / "journal.jsonl", env / "runs" / ids[-1] / "journal.jsonl")
    old_journal.symlink_to(tmp_path)
    check_state(home, env)
    new_journal.symlink_to(tmp_path)
    with pytest.raises(LinkInState, match=ids[-1]):
        check_state(home, env)
    new_journal.unlink()
    old_journal.unlink()
    (env / "runs" / ids[0]).rmdir()
    (env / "runs" / ids[0]).symlink_to(tmp_path)  # an old run's folder itself: refused
    with pytest.raises(LinkInState, match=ids[0]):
        check_state(home, env)
