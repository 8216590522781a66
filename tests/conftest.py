"""Shared fixtures only: real wheels, a private uv cache, a private REWHEEL_HOME per test.
Helpers live in tests/support_*.py (virtualenvs and uv in support_env.py), imported by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
# The repository root, for `devtools` (the wheel builder, the local index, the demo, the
# benchmarks): not installed with rewheel, and not on sys.path when pytest runs as a script.
if str(TESTS.parent) not in sys.path:
    sys.path.insert(0, str(TESTS.parent))
# The support modules (tests/support_*.py), for the unit layer in tests/unit/ too.
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from devtools.wheelbuild import build_wheel  # noqa: E402

# A test suite started in the background of a non-interactive shell inherits SIGINT ignored,
# and so would every rewheel it starts: the Ctrl-C tests would then test nothing. Python's
# own handler here means a child starts with the default disposition (an exec resets a
# handled signal, never an ignored one).
import signal as _signal  # noqa: E402

if _signal.getsignal(_signal.SIGINT) is _signal.SIG_IGN:
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)


# The folder where every process of the session records the hints it ran (tests/support_hints.py).
_HINT_LOG = pytest.StashKey[str]()
_HINT_LOG_MADE = pytest.StashKey[bool]()


# -- the fault suites' sample (tests/support_killpoints.py) -------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    """One seed for the session, drawn here (in xdist's controller, before its workers start,
    so they inherit it) unless REWHEEL_FAULT_SEED is set to repeat an earlier session's."""
    import os
    import secrets

    os.environ.setdefault("REWHEEL_FAULT_SEED", str(secrets.randbelow(10**6)))
    config.pluginmanager.register(_GroupsReachXdist(), "rewheel-groups-reach-xdist")
    if not hasattr(config, "workerinput"):  # the controller's folder, which its workers inherit
        if "REWHEEL_TESTS_HINT_LOG" not in os.environ:
            import tempfile

            os.environ["REWHEEL_TESTS_HINT_LOG"] = tempfile.mkdtemp(prefix="rewheel-hints-")
            config.stash[_HINT_LOG_MADE] = True
        config.stash[_HINT_LOG] = os.environ["REWHEEL_TESTS_HINT_LOG"]


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    if config.stash.get(_HINT_LOG_MADE, False):
        shutil.rmtree(config.stash[_HINT_LOG], ignore_errors=True)


def pytest_report_header(config: pytest.Config) -> str:
    from support_killpoints import describe

    return f"fault sample: {describe()}"


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    import os

    # Also under -q (no header): the line that repeats this session's fault sample.
    terminalreporter.write_line(pytest_report_header(config))
    # The hints the session's commands printed, each run as typed (tests/support_hints.py).
    log = config.stash.get(_HINT_LOG, None)
    if log is not None and os.path.isdir(log) and os.listdir(log):
        from support_hints import summary

        terminalreporter.write_line(summary(log))


# -- scheduling on xdist workers (`make test`: --dist loadgroup --no-loadscope-reorder) -----------
# Tests that share a module-scoped fixture (a built environment, a fleet of hosts) run on one
# worker, so it is built once; every other test is handed out on its own. The long ones go
# first, in this order, so no worker is left running a one-minute test alone at the end (what
# `--dist loadfile` did with the kill-point file). A stale list costs minutes, never a result.
LONG_FIRST = ("test_fleet_ansible.py", "test_fleet_ssh.py", "test_bench.py", "test_killpoints.py", "test_crash_records.py",
              "test_full_disk.py", "test_killpoints_signals.py", "test_real_upgrade.py", "test_crash.py",
              "test_run.py", "test_gpu_check.py", "test_pipes.py", "test_patches.py", "test_demo_parts.py",
              "test_board.py", "test_process_identity.py", "test_safety3.py", "test_output_lost.py",
              "test_record_mutation.py",
              "test_signal_revert.py")


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d.scope in ("module", "class", "package") for ds in defs for d in ds)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.path.name))
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest as found


class _GroupsReachXdist:
    """Under `--dist loadgroup`, a test whose group did not reach xdist fails at its setup,
    saying why: its module's fixtures would be built on every worker and torn down between its
    tests (a pytest whose ids xdist cannot extend did that silently, for minutes a run)."""

    def __init__(self) -> None:
        self.lost: set[str] = set()

    @pytest.hookimpl(trylast=True)  # after xdist's own hook has put each group into the ids
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if getattr(config.option, "loadgroup", False):  # (no such option without xdist)
            self.lost = {item.nodeid for item in items
                         if item.get_closest_marker("xdist_group") and "@" not in item.nodeid}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if item.nodeid in self.lost:
            pytest.fail(f"pytest-xdist did not group this test with its module's: pytest {pytest.__version__} keeps "
                        "ids that xdist's --dist loadgroup cannot extend; install the pytest that "
                        "pyproject.toml's test extra names", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _no_process_left(tmp_path_factory: pytest.TempPathFactory):
    """At the end of the session (of each xdist worker), no process started from this
    session's temporary folders is left running: a service a test's own teardown missed (one
    that daemonized, one started outside rewheel and restarted by it) is killed here."""
    yield
    import os
    import signal

    from support_env import cmdlines

    base = str(tmp_path_factory.getbasetemp()) + "/"  # not pytest-12 for pytest-1
    for pid, cmdline in cmdlines(skip={os.getpid(), os.getppid()}):
        if base in cmdline:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture(autouse=True)
def rewheel_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "rewheel-home"
    monkeypatch.setenv("REWHEEL_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def uv_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A uv cache private to this test session: tests neither use nor pollute the user's."""
    return tmp_path_factory.mktemp("uv-cache")


@pytest.fixture(autouse=True)
def _uv_env(uv_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))
    monkeypatch.setenv("UV_NO_PROGRESS", "1")
    monkeypatch.delenv("UV_INDEX_URL", raising=False)
    monkeypatch.delenv("UV_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)


def toy_files(version: str, *, body: str = "", extra: dict[str, str] | None = None) -> dict[str, str | bytes]:
    files = {
        "toypkg/__init__.py": f'__version__ = "{version}"\n',
        "toypkg/core.py": f"def answer():\n    return 42\n{body}",
        "toypkg/data/config.json": '{"layers": 2}\n',
        # A compiled extension's stand-in (never imported): what snapshots still share by a
        # hard link, where the sources above are copied (`hand_editable`).
        "toypkg/_ops.so": b"\x7fELF\x02\x01\x01\x00toy kernels " + version.encode() + b"\x00" * 64,
    }
    files.update(extra or {})
    return files


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real wheels: two versions of toypkg and a helper package, as a find-links folder."""
    d = tmp_path_factory.mktemp("wheelhouse")
    build_wheel(d, "toypkg", "1.0.0", toy_files("1.0.0"), requires=["toyhelper>=1"],
                project_urls={"Source": "https://example.invalid/toy/toypkg"},
                console_scripts={"toypkg-serve": "toypkg.core:answer"})
    build_wheel(d, "toypkg", "2.0.0", toy_files("2.0.0", body="def new():\n    return 2\n",
                                                extra={"toypkg/added.py": "ADDED = True\n"}),
                requires=["toyhelper>=1"], project_urls={"Source": "https://example.invalid/toy/toypkg"},
                console_scripts={"toypkg-serve": "toypkg.core:answer"})
    for version, help_ in (("1.0.0", 1), ("1.1.0", 2)):
        build_wheel(d, "toyhelper", version, {"toyhelper/__init__.py": f"HELP = {help_}\n",
                                              "toyhelper/_speedups.so": b"\x7fELF\x02\x01\x01\x00" + version.encode()})
    return d


# Stand-in systemctl / journalctl / nvidia-smi on PATH (see tests/support_standins.py).
from support_standins import fake_gpus, fake_host  # noqa: E402,F401
# A real systemd in a container (tests/support_systemd.py).
from support_systemd import real_systemd, systemd_machine  # noqa: E402,F401
# The run cycle's fake world (tests/support_cycle.py).
from support_cycle import world  # noqa: E402,F401
# A small real filesystem to fill (tests/support_disk.py).
from support_disk import disk  # noqa: E402,F401
# The fleet's collection, rewheel's wheel and the SSH key (tests/support_fleet.py).
from support_fleet import ansible_home, rewheel_wheel, ssh_keys  # noqa: E402,F401


# -- real hosts: a venv, a local index, the toy model server (tests/support_run.py) --------------
@pytest.fixture
def host_factory(tmp_path: Path):
    """Make hosts (`make(new_version, variant, start=True)`) whose service runs under the
    command manager; each is stopped, with its index, at the end."""
    from support_run import Host, make_host

    hosts: list[Host] = []

    def make(new_version: str = "2.0.0", variant: str = "good", start: bool = True, binary: bool = False) -> Host:
        h = make_host(tmp_path, new_version, variant, binary)
        hosts.append(h)
        if start:
            h.start_service()
            assert h.served_version() == "1.0.0"
        return h

    yield make
    for h in hosts:
        h.stop_service()
        h._index.stop()  # type: ignore[attr-defined]


@pytest.fixture
def systemd_host(tmp_path: Path, real_systemd, fake_gpus):  # noqa: F811 - fixtures, by name
    """Make hosts whose service is the toy server as a unit of a real systemd (booted in a
    container; rewheel runs inside it), on two stand-in GPUs: `make(new_version, variant,
    start=True)`. The unit is `vllm-toy`, started by systemctl (outside rewheel) unless
    start=False; units and indexes are gone at the end."""
    from support_run import SERVER, make_host
    from support_standins import wait_for

    def make(new_version: str, variant: str, start: bool = True):
        h = make_host(tmp_path, new_version, variant)
        h.exec_prefix = real_systemd.nsenter()
        real_systemd.add_unit("vllm-toy", [str(h.python), str(SERVER), "--port", str(h.port)],
                              restart="always", restart_sec=0.2, syslog_identifier="vllm-toy",
                              start_limit_burst=5, start_limit_interval_s=10)
        fake_gpus.set_gpus(2)
        h.write_recipe(service={"manager": "systemd", "unit": "vllm-toy",
                                "health_url": f"http://127.0.0.1:{h.port}/health",
                                "ready_timeout_s": 30, "stop_timeout_s": 10, "settle_s": 1.0,
                                "probe": {"url": f"http://127.0.0.1:{h.port}/v1/models", "expect": "toy/model"}},
                       smoke__gpus=2, smoke__gpu_release_timeout_s=3)
        made.append(h)
        if start:
            cp = real_systemd.systemctl("start", "vllm-toy")
            assert cp.returncode == 0, cp.stderr
            wait_for(lambda: h.served_version() == "1.0.0", timeout=20)
        return h

    made: list = []
    yield make
    real_systemd.remove_units()
    for h in made:
        h._index.stop()  # type: ignore[attr-defined]
