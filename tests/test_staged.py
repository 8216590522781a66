"""Staged runs end to end: real wheels on a real local index, a real venv, the toy model
server as a real process with a real health endpoint (tests/support_run.py). The build is
prepared and checked beside the live environment while the service serves; only the swap
stops it, and the swap installs from uv's cache with the index gone."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import httpx

from devtools.wheelbuild import build_wheel
import support_cli
from support_env import uv_bin


class HealthPoller:
    """GETs the service's /health every 50 ms from a background thread for as long as it
    runs: every request that did not answer 200 is a failed request."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/health"
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        with httpx.Client(timeout=2.0) as client:
            while not self._stop.is_set():
                try:
                    r = client.get(self.url)
                    if r.status_code == 200:
                        self.ok += 1
                    else:
                        self.failed.append(f"HTTP {r.status_code}")
                except httpx.HTTPError as exc:
                    self.failed.append(type(exc).__name__)
                time.sleep(0.05)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_a_build_that_cannot_be_imported_is_rejected_while_the_service_serves(host_factory) -> None:
    h = host_factory("2.0.0", "import-fails")
    before = h.state()
    with HealthPoller(h.port) as poll:
        code, rep = h.run_json()
    assert code == 1, rep["_stderr"]
    assert rep["status"] == "rejected" and rep["downtime"] is None and rep["snapshot_id"] is None
    assert poll.failed == [] and poll.ok >= 10, (poll.failed, poll.ok)  # answered throughout
    assert h.state() == before and h.served_version() == "1.0.0"
    rc = rep["root_cause"]
    assert rc["type"] == "ImportError" and "libcudart.so.13" in rc["message"]
    assert rc["frame"]["file"].endswith("toypkg/__init__.py")
    assert [c["name"] for c in rep["prepared"]["checks"]] == ["resolve", "build", "imports"]
    assert [(c["name"], c["old"], c["new"]) for c in rep["changes"]] == [("toypkg", "1.0.0", "2.0.0")]
    # The lock the report names is kept with the run (its prepare folder is gone).
    lock = Path(rep["prepared"]["lock"])
    assert lock.is_file() and lock.is_relative_to(rep["run_dir"]) and "toypkg" in lock.read_text()
    hist = h.rewheel("history", str(h.recipe), "--json")
    assert '"status": "rejected"' in hist.stdout and '"snapshots": []' in hist.stdout


def test_a_precheck_catches_what_imports_do_not(host_factory) -> None:
    """The recipe's `[smoke] precheck` runs in the prepared environment, on the CPU: this
    build imports, but its model init raises — rejected, the service never stopped."""
    h = host_factory("3.0.0", "smoke-fails")
    h.write_recipe(smoke__precheck=["{python}", "-c", "import toypkg.core as c; c.init_model()"])
    code, rep = h.run_json()
    assert code == 1 and rep["status"] == "rejected", rep["_stderr"]
    assert rep["root_cause"]["type"] == "ValueError" and rep["failure"]["step"] == "prepare"
    assert rep["prepared"]["checks"][-1]["name"] == "precheck" and not rep["prepared"]["checks"][-1]["ok"]
    assert h.served_version() == "1.0.0"
    human = h.rewheel("run", str(h.recipe), "--yes")
    text = " ".join(human.stdout.split())
    assert human.returncode == 1, human.stderr
    assert "FAILED precheck" in text and "what would have changed" in text and "rejected before the stop" in text
    assert "ValueError" in text and "downtime" not in text


def test_a_build_that_passes_the_precheck_but_fails_the_smoke_is_reverted(host_factory) -> None:
    h = host_factory("3.0.0", "smoke-fails")
    h.write_recipe(smoke__precheck=["{python}", "-c", "import toypkg.core"])
    before = h.state()
    code, rep = h.run_json()
    assert code == 1 and rep["status"] == "reverted", rep["_stderr"]
    assert all(c["ok"] for c in rep["prepared"]["checks"]) and rep["prepared"]["checks"][-1]["name"] == "precheck"
    assert rep["failure"]["step"] == "smoke" and rep["root_cause"]["type"] == "ValueError"
    assert h.state() == before and h.served_version() == "1.0.0"
    down = rep["downtime"]
    assert down["parts"]["revert"] > 0 and down["seconds"] >= down["parts"]["smoke"] + down["parts"]["revert"]


def test_prepare_only_then_prepared_with_the_index_gone(host_factory) -> None:
    h = host_factory("2.0.0", "good")
    with HealthPoller(h.port) as poll:
        code, rep = h.run_json("--prepare-only")
    assert code == 0 and rep["status"] == "prepared", rep["_stderr"]
    assert poll.failed == [] and h.served_version() == "1.0.0"
    assert rep["prepared"]["after"]["toypkg"] == "2.0.0" and Path(rep["prepared"]["lock"]).is_file()
    h._index.stop()  # type: ignore[attr-defined] # the network is cut: the swap needs only uv's cache
    code, rep = h.run_json("--prepared")
    assert code == 0 and rep["status"] == "upgraded", rep["_stderr"]
    assert h.served_version() == "2.0.0"
    install_log = Path(rep["logs"]["install"]).read_text()
    assert "--offline" in install_log and "--link-mode hardlink" in install_log
    # Linked from uv's cache in the window; copied to inodes of their own once it answered.
    site = next((h.prefix / "lib").glob("python3*/site-packages"))
    assert [(site / "toypkg" / f).stat().st_nlink for f in ("__init__.py", "core.py")] == [1, 1]
    assert [s["name"] for s in rep["steps"]][-1] == "unshare"
    # Snapshotted while the real service served; the stat walk after its stop found it unchanged.
    names = [s["name"] for s in rep["steps"]]
    assert names[names.index("snapshot"):names.index("snapshot") + 3] == ["snapshot", "stop", "snapshot-check"]
    assert names.count("snapshot") == 1
    down = rep["downtime"]
    assert down["seconds"] > 0 and set(down["parts"]) == {"stop", "snapshot", "install", "smoke", "start", "ready"}
    human = h.rewheel("history", str(h.recipe))
    assert "downtime" in human.stdout and "prepared" in human.stdout


def test_a_stale_prepared_build_is_refused(host_factory, tmp_path: Path) -> None:
    h = host_factory("2.0.0", "good")
    before = h.state()

    def prepared() -> tuple[int, dict]:
        return h.run_json("--prepared")

    assert h.run_json("--prepare-only")[0] == 0
    h.write_recipe(service__settle_s=0.4)  # the recipe changed
    code, rep = prepared()
    assert code == 2 and "recipe" in rep["message"] and "--prepare-only" in rep["hint"], rep
    assert h.run_json("--prepare-only")[0] == 0
    extra = tmp_path / "extra"
    build_wheel(extra, "toyextra", "1.0.0", {"toyextra/__init__.py": ""})
    subprocess.run([uv_bin(), "pip", "install", "-q", "--python", str(h.python),
                    "--no-index", "--find-links", str(extra), "toyextra"], check=True)
    code, rep = prepared()
    assert code == 2 and "live environment" in rep["message"], rep
    subprocess.run([uv_bin(), "pip", "uninstall", "-q", "--python", str(h.python), "toyextra"],
                   check=True)
    assert h.state() == before
    assert h.run_json("--prepare-only")[0] == 0
    subprocess.run([uv_bin(), "cache", "clean", "toypkg"], check=True, capture_output=True)
    code, rep = prepared()
    assert code == 2 and "offline" in rep["message"] and "cache" in rep["hint"], rep
    assert h.state() == before and h.served_version() == "1.0.0"


def test_a_run_killed_during_prepare_changed_nothing(host_factory) -> None:
    """SIGKILL while the prepared build's precheck runs: the live environment and the service
    are as they were, no journal is left to resume, and the next run clears the leftover."""
    import os
    import signal

    from rewheel.recipe import load_recipe
    from rewheel.commands import open_target
    from support_standins import wait_for

    h = host_factory("2.0.0", "good")
    h.write_recipe(smoke__precheck=["{python}", "-c", "import time; time.sleep(2)"])
    env_dir = open_target(load_recipe(h.recipe)).store.env_dir
    before = h.state()
    p = support_cli.start("run", str(h.recipe), "--yes", "--json",
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    leftover = env_dir / "prepared.new"
    wait_for(lambda: (leftover / "logs" / "precheck.log").is_file(), timeout=60)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    time.sleep(2.5)  # the precheck, in its own process group, finishes on its own
    assert h.state() == before and h.served_version() == "1.0.0" and leftover.is_dir()
    hist = h.rewheel("history", str(h.recipe), "--json")
    assert hist.returncode == 0 and '"interrupted_run": null' in hist.stdout, hist.stdout
    h.write_recipe()
    code, rep = h.run_json("--prepare-only")
    assert code == 0 and rep["status"] == "prepared", rep["_stderr"]
    assert not leftover.exists() and h.state() == before
