"""`check` reports what `run` will refuse, and `run` refuses it in its preflight: before the
prepare, the snapshot or a journal. Real parts: a real venv whose site-packages is read-only to
a rewheel without the power to override file modes (as root: `setpriv` dropping
CAP_DAC_OVERRIDE, the situation of root on an NFS export with root_squash), and the machine's
own interpreter. (A hand-started service without `[service] stop`: test_service_state.py.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support_env import make_venv, tree_state, uv
from support_index import toy_wheels
from test_bad_inputs import system_python
import support_cli


@pytest.fixture(scope="module")
def index_url(tmp_path_factory: pytest.TempPathFactory):
    from devtools.localindex import start_index

    server = start_index(toy_wheels(tmp_path_factory.mktemp("wheels")))
    yield server.url
    server.stop()


def rewheel(*args: str, unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
    prefix = []
    if unprivileged and os.geteuid() == 0:
        prefix = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
                  "--bounding-set=-dac_override,-dac_read_search"]
    return support_cli.rewheel(*args, prefix=prefix, stdin=subprocess.DEVNULL, timeout=300)


def check_named(doc: dict, name: str) -> dict:
    return next(c for c in doc["checks"] if c["name"] == name)


def test_a_read_only_site_packages_is_reported_by_check_and_refused_by_run(tmp_path: Path, index_url: str) -> None:
    py = make_venv(tmp_path / "env")
    uv("pip", "install", "-q", "--python", str(py), "--index-url", index_url, "toypkg==1.0.0")
    site = next((tmp_path / "env" / "lib").glob("python3*/site-packages"))
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[environment]\npython = "{py}"\n[install]\npackages = ["toypkg"]\n'
                      f'index_url = "{index_url}"\n', encoding="utf-8")
    site.chmod(0o555)
    try:
        before = tree_state(tmp_path / "env")
        cp = rewheel("check", str(recipe), "--json", unprivileged=True)
        assert cp.returncode == 2, cp.stderr
        w = check_named(json.loads(cp.stdout), "writable")
        assert not w["ok"] and str(site) in w["detail"] and "not writable" in w["detail"]
        cp = rewheel("run", str(recipe), "--yes", "--json", unprivileged=True)
        assert cp.returncode == 2, cp.stderr
        doc = json.loads(cp.stdout)
        assert "writable" in doc["message"] and str(site) in doc["message"]
        assert tree_state(tmp_path / "env") == before
        hist = json.loads(rewheel("history", str(recipe), "--json").stdout)
        assert (hist["snapshots"], hist["runs"]) == ([], [])  # refused before the snapshot
    finally:
        site.chmod(0o755)
    # The same environment, writable: `check` passes the writable check.
    cp = rewheel("check", str(recipe), "--json", unprivileged=True)
    assert check_named(json.loads(cp.stdout), "writable")["ok"], cp.stdout


def test_check_refuses_a_system_interpreter_without_system_true_and_counts_dist_packages(tmp_path: Path) -> None:
    py = system_python()
    recipe = tmp_path / "sys.toml"
    recipe.write_text(f'[environment]\npython = "{py}"\n', encoding="utf-8")
    cp = rewheel("check", str(recipe), "--json")
    assert cp.returncode == 2, cp.stderr
    interp = check_named(json.loads(cp.stdout), "interpreter")
    assert not interp["ok"] and "system interpreter" in interp["detail"]
    assert "system = true" in interp["detail"] and str(recipe) in interp["detail"]

    recipe.write_text(f'[environment]\npython = "{py}"\nsystem = true\n', encoding="utf-8")
    cp = rewheel("check", str(recipe), "--json")
    interp = check_named(json.loads(cp.stdout), "interpreter")
    assert interp["ok"], interp
    # Every site folder the interpreter imports from counts: on Debian, apt's packages in
    # /usr/lib/python3/dist-packages (outside the scheme uv installs into).
    probe = subprocess.run([py, "-I", "-c", "import json, site, sysconfig; p = sysconfig.get_paths(); "
                            "print(json.dumps([site.getsitepackages(), [p['purelib'], p['platlib']]]))"],
                           capture_output=True, text=True, check=True)
    sites, scheme = json.loads(probe.stdout)
    others = {s: sum(1 for e in os.listdir(s) if e.endswith((".dist-info", ".egg-info")))
              for s in sites if os.path.isdir(s) and os.path.realpath(s) not in map(os.path.realpath, scheme)}
    others = {s: n for s, n in others.items() if n}
    for s, n in others.items():
        assert f"{n} in {s}" in interp["detail"], interp["detail"]
    if not others:
        assert " in /" not in interp["detail"].split("distributions", 1)[1], interp["detail"]
