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


# ---------------------------------------------------------------------------------------------
# Issue 45, item 6: one preflight. Every refusal a command makes of its target before it acts,
# in one table: the command(s) refuse it with their exit code, naming it, changing nothing —
# and `check` refuses it too, with the same exit code and the same words.
# ---------------------------------------------------------------------------------------------
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

from rewheel.paths import env_key  # noqa: E402


@pytest.fixture(scope="module")
def toy_env(tmp_path_factory: pytest.TempPathFactory, index_url: str) -> Path:
    py = make_venv(tmp_path_factory.mktemp("refusals") / "env")
    uv("pip", "install", "-q", "--python", str(py), "--index-url", index_url, "toypkg==1.0.0")
    return py


@dataclass
class Case:
    tmp: Path
    python: Path
    index_url: str
    env: dict[str, str] = field(default_factory=dict)
    holding: list = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.tmp / "home"

    @property
    def state_dir(self) -> Path:
        d = self.home / "envs" / env_key(self.python.parent.parent)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        return d

    def recipe(self, extra: str = "", python: str | None = None) -> Path:
        p = self.tmp / "r.toml"
        p.write_text(f'[environment]\npython = "{python or self.python}"\n[install]\npackages = ["toypkg"]\n'
                     f'index_url = "{self.index_url}"\n{extra}', encoding="utf-8")
        return p

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return support_cli.rewheel(*args, env={**os.environ, "REWHEEL_HOME": str(self.home), **self.env},
                                   stdin=subprocess.DEVNULL, timeout=300)

    def snapshot(self) -> None:
        cp = self.cli("snapshot", str(self.tmp / "r.toml"), "--json")
        assert cp.returncode == 0, cp.stderr


SERVICE = '[service]\nmanager = "command"\nstart = ["/bin/sleep", "1000"]\n'


def _store_inside(c: Case) -> None:
    c.recipe(f'[snapshots]\nstore = "{c.python.parent.parent}/rewheel-store"\n')


def _store_is_a_file(c: Case) -> None:
    (c.tmp / "store").write_text("not a folder")
    c.recipe(f'[snapshots]\nstore = "{c.tmp / "store"}"\n')


def _interrupted(c: Case) -> None:
    c.recipe()
    c.snapshot()
    d = c.state_dir / "runs" / "20250101-000000-abcd"
    d.mkdir(parents=True)
    (d / "journal.jsonl").write_text(json.dumps({"event": "started", "time": 1.0, "kind": "run"}) + "\n"
                                     + json.dumps({"event": "step", "time": 2.0, "name": "stop"}) + "\n")


def _service_record(c: Case) -> None:
    c.recipe(SERVICE)
    c.snapshot()
    (c.state_dir / "service.json").write_text(json.dumps({"pid": 0, "start_ticks": 1}))


def _lock_held(c: Case) -> None:
    from rewheel.journal import EnvLock

    c.recipe()
    c.snapshot()
    lock = EnvLock(c.state_dir, "another rewheel (a test)", prefix=c.python.parent.parent)
    lock.__enter__()
    c.holding.append(lock)


def _cleanup_over_lock_folder(c: Case) -> None:
    base = c.tmp / "x"
    base.mkdir()
    c.env["REWHEEL_LOCK_DIR"] = str(base)
    c.recipe(f'[cleanup]\npaths = ["{base}/*"]\n')


def _lanes(c: Case) -> None:
    c.recipe()
    c.snapshot()
    c.env["REWHEEL_RESTORE_LANES"] = "3"


def _system_python(c: Case) -> None:
    from test_bad_inputs import system_python

    c.recipe(python=system_python())


def _smoke_missing(c: Case) -> None:
    c.recipe(f'[smoke]\ncommand = ["{c.tmp}/no-such-smoke"]\n')


def _broken_tls(c: Case) -> None:
    c.recipe(SERVICE + 'health_url = "https://127.0.0.1:9/health"\n')
    c.snapshot()
    c.env["SSL_CERT_FILE"] = str(c.tmp / "no-such-bundle.pem")


R = "{recipe}"
# name, setup, [(command line, exit code)], words each refusal (and check's) names
REFUSALS: list[tuple[str, Callable[[Case], None], list[tuple[tuple[str, ...], int]], list[str]]] = [
    ("store inside the environment", _store_inside,
     [(("snapshot", R), 2), (("run", R, "--yes"), 2), (("history", R), 2)], ["inside the environment"]),
    ("store is a file", _store_is_a_file, [(("snapshot", R), 2), (("run", R, "--yes"), 2)], ["is a file"]),
    ("an interrupted run", _interrupted,
     [(("run", R, "--yes"), 4), (("snapshot", R), 4), (("smoke", R), 4), (("verify", R), 4), (("history", R), 4),
      (("status", R), 4), (("diff", R), 4)], ["20250101-000000-abcd", "interrupted"]),
    ("a malformed service record", _service_record,
     [(("run", R, "--yes"), 3), (("rollback", R, "--yes"), 3), (("resume", R, "--yes"), 3)], ["service.json", "pid = 0"]),
    ("another rewheel holds the environment", _lock_held,
     [(("run", R, "--yes"), 4), (("snapshot", R), 4), (("rollback", R, "--yes"), 4)], ["another rewheel"]),
    ("a cleanup glob over the lock folder", _cleanup_over_lock_folder,
     [(("run", R, "--yes"), 2), (("run", R, "--dry-run"), 2)], ["lock folder"]),
    ("a bad REWHEEL_RESTORE_LANES", _lanes,
     [(("snapshot", R), 2), (("run", R, "--yes"), 2), (("rollback", R, "--yes"), 2)], ["REWHEEL_RESTORE_LANES"]),
    ("a system interpreter", _system_python, [(("run", R, "--yes"), 2)], ["system = true"]),
    ("a smoke command that does not exist", _smoke_missing, [(("run", R, "--yes"), 2)], ["no-such-smoke"]),
    ("a broken SSL_CERT_FILE", _broken_tls,
     [(("run", R, "--yes"), 2), (("rollback", R, "--yes"), 2)], ["SSL_CERT_FILE"]),
]


@pytest.mark.parametrize("name, setup, refused, words", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_check_refuses_what_the_commands_refuse(tmp_path: Path, toy_env: Path, index_url: str, name: str,
                                                setup: Callable[[Case], None],
                                                refused: list[tuple[tuple[str, ...], int]], words: list[str]) -> None:
    c = Case(tmp_path, toy_env, index_url)
    try:
        setup(c)
        recipe = str(tmp_path / "r.toml")
        env_before = tree_state(toy_env.parent.parent)
        runs = sorted(p.name for p in (c.state_dir / "runs").glob("*")) if c.state_dir.is_dir() else []
        codes = set()
        for args, code in refused:
            cp = c.cli(*(recipe if a == R else a for a in args))
            out = cp.stdout + cp.stderr
            assert cp.returncode == code, f"{name}: {args}: rc={cp.returncode}\n{out[-2000:]}"
            assert "Traceback" not in out
            for w in words:
                assert w in out, f"{name}: {args}: {w!r} not said\n{out[-2000:]}"
            codes.add(code)
        assert len(codes) == 1
        assert tree_state(toy_env.parent.parent) == env_before
        assert sorted(p.name for p in (c.state_dir / "runs").glob("*")) == runs  # no journal opened
        cp = c.cli("check", recipe, "--json")
        doc = json.loads(cp.stdout)
        assert cp.returncode == codes.pop() and doc["exit_code"] == cp.returncode and not doc["ok"], cp.stdout
        failed = " ".join(ch["detail"] for ch in doc["checks"] if not ch["ok"])
        for w in words:
            assert w in failed, f"{name}: check does not say {w!r}: {doc}"
    finally:
        for lock in c.holding:
            lock.__exit__()
