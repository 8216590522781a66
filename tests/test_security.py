"""Security: index credentials never on uv's command line; rewheel never re-modes a folder it
did not create; terminal control characters from files never reach a terminal raw; a system
interpreter is changed only when the recipe says so."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from support_env import make_venv, uv
from support_index import toy_wheels, write_recipe
from test_bad_inputs import system_python
import support_cli

SECRET = "s3cr3t-T0ken"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return support_cli.rewheel(*args, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}, timeout=300)


@pytest.fixture
def env_v1(tmp_path: Path) -> tuple[Path, Path]:
    wheels = toy_wheels(tmp_path / "wheels")
    python = make_venv(tmp_path / "env")
    uv("pip", "install", "-q", "--python", str(python), "--no-index", "--find-links", str(wheels),
       "toypkg==1.0.0", "toyhelper==1.0.0")
    return python, wheels


# --- credentials ------------------------------------------------------------------------------

def test_index_credentials_never_reach_uvs_command_line(tmp_path: Path, env_v1, monkeypatch) -> None:
    """Every uv rewheel starts (plan, install, the pristine-wheel fetch of `patches`) runs
    through a wrapper that records its argv as `ps` shows it — and the install still
    authenticates, so the credentials did reach uv (through its environment)."""
    from rewheel import installer, patches
    from rewheel.environment import Environment
    from devtools.localindex import serve_index

    python, wheels = env_v1
    real = installer.find_uv()
    log = tmp_path / "uv-argv.log"
    wrapper = tmp_path / "bin" / "uv"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\ntr "\\0" " " < /proc/$$/cmdline >> "{log}"\necho >> "{log}"\n'
                       f'env | grep -c "^UV_INDEX_REWHEEL_.*_PASSWORD=" >> "{log}"\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(installer, "find_uv", lambda: str(wrapper))
    with serve_index(wheels, auth=("rewheel", SECRET)) as idx, \
            serve_index(wheels, auth=("deploy", SECRET + "2")) as extra:
        r = write_recipe(tmp_path / "r", python, install={
            "index_url": idx.with_auth(), "extra_index_urls": [extra.with_auth()]})
        p = installer.plan(r)
        res = installer.install(r, log_path=tmp_path / "install.log")
        assert any(c.name == "toypkg" and c.new == "2.0.0" for c in p.changes)
        dist = next(d for d in Environment.inspect(python).distributions() if d.name == "toypkg")
        fetcher = patches.UvIndexFetcher.for_recipe(r)
        try:
            assert fetcher.unpack(dist) is not None, fetcher.notes
        finally:
            fetcher.close()
    lines = log.read_text().splitlines()
    argvs = [line for line in lines if "pip" in line]
    assert len(argvs) >= 3  # plan, install, fetch
    assert all(n == "2" for n in lines if n.isdigit())  # both indexes' passwords, in the env
    for argv in argvs:
        assert SECRET not in argv and "rewheel:" not in argv and "deploy:" not in argv, argv
        assert "rewheel-index=http://127.0.0.1" in argv and "rewheel-extra-0=http://127.0.0.1" in argv
    assert SECRET not in json.dumps([p.to_json(), res.to_json()]) + (tmp_path / "install.log").read_text()


def test_index_options_keep_plain_urls_and_move_userinfo_to_the_environment() -> None:
    from rewheel.installer import index_options

    assert index_options("https://a.example/simple", ["https://b.example/x"], ["/w"]) == (
        ["--index-url", "https://a.example/simple", "--extra-index-url", "https://b.example/x",
         "--find-links", "/w"], {}, ())
    args, env, drop = index_options("https://a.example/simple",
                                    ["https://tok%40en@b.example/x", "https://c.example/y"])
    assert args == ["--default-index", "rewheel-index=https://a.example/simple",
                    "--index", "rewheel-extra-0=https://b.example/x",
                    "--index", "rewheel-extra-1=https://c.example/y"]
    assert env == {"UV_INDEX_REWHEEL_EXTRA_0_USERNAME": "tok@en"}  # percent-decoded, no password
    assert set(drop) == {"UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_EXTRA_INDEX_URL", "UV_INDEX"}


# --- folders rewheel did not create -----------------------------------------------------------

def test_a_shared_sticky_home_keeps_its_mode_and_gets_private_subfolders(tmp_path: Path, env_v1) -> None:
    python, _ = env_v1
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    cp = cli("history", "--python", str(python), "--json", env={"REWHEEL_HOME": str(shared)})
    assert cp.returncode == 0, cp.stderr
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777  # never re-moded
    made = [shared / "envs", *(shared / "envs").iterdir()]
    assert all(stat.S_IMODE(d.stat().st_mode) == 0o700 for d in made)


def test_a_world_writable_store_without_sticky_bit_is_refused(tmp_path: Path, env_v1) -> None:
    python, _ = env_v1
    store = tmp_path / "open-store"
    store.mkdir()
    store.chmod(0o777)
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[environment]\npython = "{python}"\n[snapshots]\nstore = "{store}"\n')
    cp = cli("history", str(recipe), "--json")
    assert cp.returncode == 2
    doc = json.loads(cp.stdout)
    assert "snapshots.store" in doc["message"] and str(store) in doc["message"]
    assert stat.S_IMODE(store.stat().st_mode) == 0o777 and not any(store.iterdir())


# --- terminal control characters --------------------------------------------------------------

EVIL = "before\x1b]0;pwned\x07\x1b[2Jafter\u202e"


def test_labels_and_messages_are_printed_without_control_characters(env_v1) -> None:
    python, _ = env_v1
    assert cli("snapshot", "--python", str(python), "--label", EVIL, "--json").returncode == 0
    human = cli("history", "--python", str(python), env={"COLUMNS": "400"})
    assert human.returncode == 0, human.stderr
    assert "\x1b" not in human.stdout + human.stderr and "\u202e" not in human.stdout
    assert "before\\x1b]0;pwned\\x07\\x1b[2Jafter\\u202e" in human.stdout  # shown, escaped
    raw = json.loads(cli("history", "--python", str(python), "--json").stdout)
    assert raw["snapshots"][0]["label"] == EVIL  # JSON keeps the raw text
    ref = EVIL + "-no-such-snapshot"
    err = cli("rollback", "--python", str(python), ref, "--yes")
    assert err.returncode == 2 and "\x1b" not in err.stdout + err.stderr and "\\x1b" in err.stderr
    doc = json.loads(cli("rollback", "--python", str(python), ref, "--yes", "--json").stdout)
    assert repr(ref) in doc["message"]  # the message as rewheel writes it, unchanged in JSON


def test_clean_makes_every_control_character_visible() -> None:
    from rewheel.report import clean, escape

    assert clean("a\x1b[2Jb\x07\x9b\x7f") == "a\\x1b[2Jb\\x07\\x9b\\x7f"
    assert clean("x\udcffy") == "x\\xffy"  # a non-UTF-8 byte of a file name
    assert clean("l1\n\tl2") == "l1\n\tl2" and clean("l1\nl2", lines=False) == "l1\\x0al2"
    assert escape("[bold]\x1b") == "\\[bold]\\x1b"


# --- system interpreters ----------------------------------------------------------------------

def test_read_only_commands_work_on_a_system_interpreter() -> None:
    py = system_python()
    cp = cli("history", "--python", py, "--json")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert json.loads(cp.stdout)["snapshots"] == []


def test_environment_system_true_allows_a_system_interpreter(tmp_path: Path) -> None:
    from rewheel.recipe import load_recipe
    from rewheel.commands import open_target, refuse_system_interpreter
    from rewheel.errors import TargetError

    py = system_python()
    off = tmp_path / "off.toml"
    off.write_text(f'[environment]\npython = "{py}"\n')
    on = tmp_path / "on.toml"
    on.write_text(f'[environment]\npython = "{py}"\nsystem = true\n')
    with pytest.raises(TargetError, match="environment.system"):
        refuse_system_interpreter(open_target(load_recipe(off)))
    t = open_target(load_recipe(on))
    assert t.env.kind == "system" and t.recipe.system
    refuse_system_interpreter(t)  # allowed: nothing raised (and nothing run here)
