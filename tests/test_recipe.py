"""Recipe validation: every problem names the file and the key path, before anything is touched."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rewheel.errors import RecipeError
from rewheel.recipe import load_recipe
import support_cli

GOOD = """
name = "vllm-kimi-k25"
[environment]
python = "{python}"
[service]
manager = "systemd"
unit = "vllm-kimi-k25"
health_url = "http://127.0.0.1:8000/health"
ready_timeout_s = 900
probe = {{ url = "http://127.0.0.1:8000/v1/models", expect = "moonshotai/Kimi-K2.5-NVFP4" }}
[install]
packages = ["vllm>=0.16.0rc2.dev0"]
extra_index_urls = ["https://wheels.example/nightly"]
prerelease = true
reinstall = "all"
uv_args = ["--torch-backend=auto"]
[smoke]
command = ["{{python}}", "-m", "rewheel.smoke.vllm_init", "--tensor-parallel-size", "8"]
timeout_s = 1200
gpus = 8
[patches]
policy = "report"
[cleanup]
paths = ["/tmp/*.pt"]
[snapshots]
keep = 5
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "recipe.toml"
    p.write_text(text)
    return p


def test_full_recipe_loads(tmp_path: Path) -> None:
    r = load_recipe(write(tmp_path, GOOD.format(python=sys.executable)))
    assert r.name == "vllm-kimi-k25"
    assert r.service and r.service.unit == "vllm-kimi-k25" and r.service.probe
    assert r.service.probe.expect == "moonshotai/Kimi-K2.5-NVFP4"
    assert r.install.reinstall == "all" and r.install.prerelease
    assert r.smoke and r.smoke.gpus == 8
    assert r.expand(r.smoke.command)[0] == sys.executable
    assert r.cleanup_paths == ("/tmp/*.pt",)


@pytest.mark.parametrize("change, key, words", [
    (("timeout_s = 1200", 'timeout_s = "ten"'), "smoke.timeout_s", 'expected an integer, got "ten"'),
    (("keep = 5", "keep = 5\ncolour = 1"), "snapshots.colour", "unknown key"),
    (('manager = "systemd"', 'manager = "upstart"'), "service.manager", '"upstart"'),
    (('unit = "vllm-kimi-k25"\n', ""), "service.unit", "missing required key"),
    (('policy = "report"', 'policy = "merge"'), "patches.policy", '"merge"'),
    (('reinstall = "all"', 'reinstall = "some"'), "install.reinstall", '"some"'),
    (("prerelease = true", 'prerelease = "yes"'), "install.prerelease", "true or false"),
    (('packages = ["vllm>=0.16.0rc2.dev0"]', 'packages = ["vllm>>1"]'), "install.packages[0]", "not a valid requirement"),
    (("gpus = 8", "gpus = -1"), "smoke.gpus", "expected 0 or more"),
    (("gpus = 8", "gpus = 8\ngpu_free_mib = -5"), "smoke.gpu_free_mib", "expected 0 or more"),
    (("gpus = 8", 'gpus = 8\ngpu_free_mib = "20GiB"'), "smoke.gpu_free_mib", "expected an integer"),
    (("timeout_s = 1200", "timeout_s = 1209600"), "smoke.timeout_s", "at most 604800 seconds"),
    (("ready_timeout_s = 900", "ready_timeout_s = 900\nsettle_s = 1e300"), "service.settle_s", "at most 604800 seconds"),
    (('command = ["{{python}}"', 'command = "python -m x" #'), "smoke.command", "argv list"),
    (('health_url = "http://127.0.0.1:8000/health"', 'health_url = "localhost:8000"'), "service.health_url", "http(s) URL"),
])
def test_invalid_recipes_name_file_and_key(tmp_path: Path, change: tuple[str, str], key: str, words: str) -> None:
    text = GOOD.replace(change[0], change[1], 1)
    assert text != GOOD
    path = write(tmp_path, text.format(python=sys.executable))
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    msg = str(err.value)
    assert str(path) in msg and key in msg and words in msg, msg
    assert err.value.exit_code == 2


def test_missing_interpreter(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.format(python="/nonexistent/env/bin/python"))
    with pytest.raises(RecipeError, match=r"environment\.python: interpreter /nonexistent/env/bin/python does not exist"):
        load_recipe(path)


def test_missing_environment_and_syntax_error(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="environment.python: missing required key"):
        load_recipe(write(tmp_path, 'name = "x"\n'))
    with pytest.raises(RecipeError, match="TOML syntax error"):
        load_recipe(write(tmp_path, "[environment\npython = 1\n"))


def test_relative_paths_are_relative_to_the_recipe(tmp_path: Path) -> None:
    env = tmp_path / "envs" / "e" / "bin"
    env.mkdir(parents=True)
    (env / "python").symlink_to(sys.executable)
    sub = tmp_path / "recipes"
    sub.mkdir()
    p = sub / "r.toml"
    p.write_text('[environment]\npython = "../envs/e/bin/python"\n[cleanup]\npaths = ["dumps/*.pt"]\n')
    r = load_recipe(p)
    assert r.python == sub.resolve() / "../envs/e/bin/python"
    assert r.cleanup_paths == (str(sub.resolve() / "dumps/*.pt"),)


def test_cli_check_reports_the_bad_key(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("timeout_s = 1200", 'timeout_s = "ten"').format(python=sys.executable))
    cp = support_cli.rewheel("check", str(path))
    assert cp.returncode == 2
    assert 'smoke.timeout_s: expected an integer, got "ten"' in cp.stderr.replace("\n", "")


def test_run_without_packages_is_refused_before_anything(tmp_path: Path) -> None:
    path = write(tmp_path, f'[environment]\npython = "{sys.executable}"\n')
    cp = support_cli.rewheel("run", str(path), "--yes")
    assert cp.returncode == 2
    assert "install.packages" in cp.stderr and str(path) in " ".join(cp.stderr.split())
