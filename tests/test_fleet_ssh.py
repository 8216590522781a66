"""What the network and the hosts do to a rollout, over real SSH (tests/support_fleet.py: each host
its own sshd on its own loopback address, its own /root, venv, model server and rewheel).

- A connection that drops in the middle of `rewheel run` (the session's sshd killed, as a VPN
  blip or a bastion restart does) takes nothing with it: the run, detached on the host, goes on
  to its end, the service is up on the new build, and the next play reports that run's outcome
  (read back and checked against rewheel's journal) instead of starting another.
- A host that cannot be reached stops the rollout where it meets it: at the install play, before
  anything is upgraded; at the start of its wave, after the waves before it; the hosts after it
  are untouched.
- A host whose rewheel is older than the collection, a host whose disk fills in the middle of the
  run, a host with an interrupted run from before: each refused or stopped with a line of its own
  in the fleet's summary (exit 2, 3, 4 named), none of them resumed or retried behind anyone's back.

Each test says the summary line the operator sees."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from support_disk import fill
from support_fleet import (Fleet, SshKeys, make_fleet, old_rewheel_wheel, recap, shared_rewheel, stop_fleet,
                           wait_journal)
from support_standins import wait_for

pytestmark = pytest.mark.slow

ROLLOUT = ("--tags", "rewheel_rollout")  # rewheel is on the hosts already
ONE_WAVE = ("-e", json.dumps({"rewheel_waves": ["100%"]}))


@pytest.fixture(scope="module")
def preinstalled(tmp_path_factory: pytest.TempPathFactory, rewheel_wheel: Path) -> Path:
    """This repository's rewheel, installed once for the hosts of these tests to link (the
    install role has its own test: tests/test_fleet_ansible.py)."""
    return shared_rewheel(tmp_path_factory.mktemp("preinstalled"), rewheel_wheel)


@pytest.fixture
def fleet_of(tmp_path: Path, ansible_home: dict[str, str | None], rewheel_wheel: Path, ssh_keys: SshKeys,
             preinstalled: Path, monkeypatch: pytest.MonkeyPatch):
    """Make a fleet of the hosts named, rewheel on each in `~/.local/bin` (`commands`: another
    rewheel command for a host; `install=False`: none, for the install role to install)."""
    made: list[Fleet] = []

    def make(names: tuple[str, ...], *, commands: dict[str, Path] | None = None, install: bool = True,
             **kw: object) -> Fleet:
        f = make_fleet(tmp_path, names, ssh_keys, ansible_home, rewheel_wheel, monkeypatch, **kw)  # type: ignore[arg-type]
        made.append(f)
        for name in names if install else ():
            f.ssh[name].link_rewheel((commands or {}).get(name, preinstalled))
        return f

    yield make
    for f in made:
        stop_fleet(f, monkeypatch)


def _step(name: str) -> Callable[[list[dict]], bool]:
    return lambda records: any(r.get("event") == "step" and r.get("name") == name for r in records)


def _finished(records: list[dict]) -> bool:
    return any(r.get("event") == "finished" for r in records)


def _summary_lines(out: str) -> list[str]:
    """The plain summary the callback printed at the end of the play."""
    return out.split("REWHEEL FLEET SUMMARY", 1)[1].splitlines()[1:] if "REWHEEL FLEET SUMMARY" in out else []


def test_a_connection_dropped_mid_run_leaves_the_run_going_and_the_next_play_reports_it(fleet_of) -> None:
    f = fleet_of(("gpu-01", "gpu-02", "gpu-03"))
    waves = ("-e", json.dumps({"rewheel_waves": [2, "100%"]}))  # gpu-01 and gpu-02, then gpu-03
    # gpu-01's model init takes a few seconds: the connection is cut while it runs.
    f.hosts["gpu-01"].write_recipe(smoke__command=["{python}", "-c",
                                                   "import time, toypkg.core as c; time.sleep(6); c.init_model()"])
    before = f.states()
    play = f.start_playbook(f.good_lock, *ROLLOUT, *waves)
    run_id, records = wait_journal(f, "gpu-01", _step("smoke"))
    assert not _finished(records)
    cut_at = time.time()
    assert f.ssh["gpu-01"].kill_sessions(), "no sshd process served the controller's connection"
    out, _ = play.communicate(timeout=300)
    (f.root / "cut-playbook.log").write_text(out)

    # The controller lost gpu-01 in the middle of its task; gpu-02, in the same wave, went on;
    # the rollout stopped after that wave: gpu-03 was not reached.
    assert play.returncode != 0, out
    assert re.search(r"fatal: \[gpu-01\]: UNREACHABLE!", out), out
    assert re.search(r"TASK \[Upgrade to the lock[^\n]*\n(?:.*\n)*?changed: \[gpu-02\]", out), out
    assert f.states()["gpu-03"] == before["gpu-03"] and not f.journals("gpu-03")
    lines = _summary_lines(out)
    assert lines[0] == "fleet: 3 host(s): 1 unreachable, 1 not-reached, 1 upgraded", out
    assert re.match(r"gpu-01  unreachable  connection lost during the upgrade: a run it started goes on by itself "
                    r"on the host, and the next rollout reports its outcome \(Failed to connect to the host via "
                    r"ssh: ", lines[1]), lines

    # On gpu-01 the run goes on by itself to its end, after the cut: kept, and serving the new build.
    _, records = wait_journal(f, "gpu-01", _finished)
    end = records[-1]
    assert end["event"] == "finished" and end["status"] == "upgraded" and end["time"] > cut_at, records
    assert f.hosts["gpu-01"].served_version() == "2.0.0"
    assert list(f.journals("gpu-01")) == [run_id]

    # The next play reattaches: gpu-01 reports the run that went on without it, nothing starts
    # again (still one run in its journal); gpu-02 has nothing to do; gpu-03's wave goes.
    f.summary()
    again = f.playbook(f.good_lock, *ROLLOUT, *waves)
    assert again.returncode == 0, again.stdout + again.stderr
    counts = recap(again.stdout)
    assert [counts[h]["changed"] for h in ("gpu-01", "gpu-02")] == [1, 0], counts
    reports = f.reports()
    assert reports["gpu-01"]["status"] == "upgraded" and reports["gpu-01"]["run_id"] == run_id
    assert list(f.journals("gpu-01")) == [run_id]
    assert _summary_lines(again.stdout)[0] == "fleet: 3 host(s): 2 upgraded, 1 unchanged"
    assert "| gpu-01 | ✅ upgraded |" in f.summary()
    (record,) = (f.stage("gpu-01") / "runs").glob("run-*[0-9a-f].json")
    assert json.loads(record.read_text())["reported"] == "reattached"
    assert f.served() == dict.fromkeys(f.hosts, "2.0.0")


def test_a_host_unreachable_stops_the_rollout_where_it_meets_it(fleet_of) -> None:
    f = fleet_of(("gpu-01", "gpu-02", "gpu-03"))
    f.ssh["gpu-02"].stop()  # gpu-02 goes away before the rollout
    before = f.states()

    # The whole playbook: the install play meets gpu-02 and the playbook ends there, nothing upgraded.
    full = f.playbook(f.good_lock)
    assert full.returncode != 0
    assert re.search(r"fatal: \[gpu-02\]: UNREACHABLE!", full.stdout), full.stdout
    assert "TASK [Copy the same lock" not in full.stdout and "TASK [Upgrade" not in full.stdout
    assert f.states() == before and not any(f.journals(n) for n in f.hosts)
    assert _summary_lines(full.stdout)[0] == "fleet: 3 host(s): 1 unreachable, 2 not-reached", full.stdout

    # The rollout (rewheel installed already): the canary's wave goes; gpu-02's wave meets it
    # unreachable at its first task, and the rollout stops; gpu-03 is never touched.
    f.summary()
    roll = f.playbook(f.good_lock, *ROLLOUT)
    assert roll.returncode != 0
    assert f.served() == {"gpu-01": "2.0.0", "gpu-02": "1.0.0", "gpu-03": "1.0.0"}
    after = f.states()
    assert after["gpu-02"] == before["gpu-02"] and after["gpu-03"] == before["gpu-03"]
    assert not f.journals("gpu-03") and not (f.stage("gpu-03") / "pylock.toy.toml").exists()
    lines = _summary_lines(roll.stdout)
    assert lines[0] == "fleet: 3 host(s): 1 unreachable, 1 not-reached, 1 upgraded", roll.stdout
    assert re.match(r"gpu-02  unreachable  unreachable at the task 'Stage folder for the lock': Failed to connect "
                    r"to the host via ssh: .*Connection refused", lines[2]), lines
    assert lines[3] == "gpu-03  not-reached"
    assert "| gpu-02 | 🔌 unreachable |" in f.summary()


def _stopped_rewheel(recipe: Path) -> int | None:
    """The pid of a `rewheel run RECIPE` that stopped itself (state T), if any."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == "T" and b"run" in cmd and str(recipe).encode() in cmd and any(c.endswith(b"rewheel") for c in cmd):
            return int(d.name)
    return None


def test_an_old_rewheel_a_full_disk_and_an_interrupted_run_each_say_so(disk: Path, fleet_of, tmp_path: Path) -> None:
    """One wave of three hosts, each with its own trouble: gpu-01's rewheel is older than the
    collection (refused before anything runs, exit 2), gpu-02's disk fills in the middle of the
    reinstall (stopped where a person must act, exit 3), gpu-03 has an interrupted run from
    before (refused, exit 4, never resumed)."""
    # (not byte-compiled: it only says its version)
    old = shared_rewheel(tmp_path / "old", old_rewheel_wheel(tmp_path / "old-wheel", "0.0.9"), compile_bytecode=False)
    # gpu-02's environment and rewheel's state on a small disk of their own; its rewheel pauses
    # right after the reinstall step is journaled (for the test to fill that disk).
    f = fleet_of(("gpu-01", "gpu-02", "gpu-03"), commands={"gpu-01": old}, env_roots={"gpu-02": disk},
                 host_env={"gpu-02": {"REWHEEL_HOME": str(disk / "rewheel-home"),
                                      "REWHEEL_FAULT_AT": "step:reinstall", "REWHEEL_FAULT_SIGNAL": "STOP"}})
    # gpu-03: an operator's run, killed there (SIGKILL right after its reinstall step is journaled).
    killed = f.ssh["gpu-03"].run("env", "REWHEEL_FAULT_AT=step:reinstall", "/root/.local/bin/rewheel", "run",
                                 str(f.hosts["gpu-03"].recipe), "--lock", str(f.good_lock), "--yes", "--quiet")
    assert killed.returncode == 255 and "snapshot-check done" in killed.stderr, killed.stderr  # (ssh: killed)
    ((interrupted, records),) = f.journals("gpu-03").items()
    assert records[-1]["event"] == "step" and records[-1]["name"] == "reinstall", records
    before = f.states()

    play = f.start_playbook(f.good_lock, *ROLLOUT, *ONE_WAVE)
    pid = wait_for(lambda: _stopped_rewheel(f.hosts["gpu-02"].recipe), timeout=120, interval=0.25)
    fill(disk, 0)
    os.kill(int(pid), signal.SIGCONT)  # type: ignore[call-overload]
    out, _ = play.communicate(timeout=300)
    (f.root / "faults-playbook.log").write_text(out)
    assert play.returncode != 0

    lines = _summary_lines(out)
    assert lines[0] == "fleet: 3 host(s): 1 failed, 2 error", out
    by_host = {line.split("  ", 1)[0]: line for line in lines[1:4]}
    # gpu-01: refused by its version; nothing ran there.
    assert re.fullmatch(r"gpu-01  error  rewheel 0\.0\.9 at /root/\.local/bin/rewheel is older than this collection "
                        r"supports \(rewheel >= 0\.1\.0\) \(exit 2\)", by_host["gpu-01"]), by_host
    assert f.states()["gpu-01"] == before["gpu-01"] and not f.journals("gpu-01")
    # gpu-02: the disk filled in the middle: exit 3, the file named, a person must act.
    assert re.match(r"gpu-02  failed  toypkg 1\.0\.0 → 2\.0\.0  downtime [\d.]+s  NOT restored \(exit 3\): revert "
                    r"failed: could not start service .*: No space left on device \(writing its log or pid record "
                    rf"under {disk}/rewheel-home/envs/\S+\); reinstall failed: \[Errno 28\] No space left on device$",
                    by_host["gpu-02"]), by_host
    assert re.search(r"fatal: \[gpu-02\]: FAILED! => .*NOT restored, a person must act \(rewheel exit 3\)", out), out
    # gpu-03: its interrupted run named and refused; still interrupted, nothing resumed or changed.
    assert re.fullmatch(rf"gpu-03  error  run {interrupted} on \S+ was interrupted \(last step: reinstall\) "
                        r"\(exit 4\)", by_host["gpu-03"]), by_host
    assert list(f.journals("gpu-03")) == [interrupted] and not _finished(f.journals("gpu-03")[interrupted])
    assert f.states()["gpu-03"] == before["gpu-03"]

    # gpu-02, the disk freed: `rewheel resume` there puts the old build back, serving.
    (disk / "filler").unlink()
    resumed = f.ssh["gpu-02"].run("env", "REWHEEL_FAULT_AT=", "/root/.local/bin/rewheel", "resume",
                                  str(f.hosts["gpu-02"].recipe), "--yes", "--json")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f.hosts["gpu-02"].served_version() == "1.0.0"
    assert f.states()["gpu-02"] == before["gpu-02"]


@pytest.mark.skipif(not os.environ.get("REWHEEL_FLEET_BENCH"),
                    reason="a measurement, not a check: REWHEEL_FLEET_BENCH=1 runs it (docs/fleet.md)")
def test_five_hosts_over_ssh_timed(fleet_of) -> None:
    """The times docs/fleet.md quotes: five hosts, the whole playbook from nothing installed
    (the install role, then waves of 1, 30% and the rest), check mode, the rollout, a second
    rollout with nothing to do, and a rollout whose canary's connection is cut mid-run followed by
    the play that reattaches. Printed (pytest -s), and written to $REWHEEL_FLEET_BENCH as JSON
    when that names a file."""
    names = tuple(f"gpu-0{i}" for i in range(1, 6))
    t0 = time.monotonic()
    f = fleet_of(names, install=False)
    times: dict[str, float] = {"hosts made (venv, service, sshd each)": time.monotonic() - t0}

    def timed(label: str, *args: str) -> None:
        t = time.monotonic()
        cp = f.playbook(f.good_lock, *args)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        times[label] = time.monotonic() - t

    timed("install (the role, 5 hosts at once)", "--tags", "rewheel_install")
    timed("check mode (whole playbook)", "--check")
    timed("rollout (whole playbook, waves 1, 1, 3)")
    reports = f.reports()
    assert {h: r["status"] for h, r in reports.items()} == dict.fromkeys(names, "upgraded")
    times["per host: run (sum of rewheel's steps), median"] = sorted(
        sum(st["seconds"] for st in r["steps"]) for r in reports.values())[2]
    times["per host: downtime, median"] = sorted(r["downtime"]["seconds"] for r in reports.values())[2]
    timed("second rollout (nothing to do)")
    # The canary's connection cut mid-run (in its smoke test), then the play that reattaches.
    f.hosts["gpu-01"].write_recipe(smoke__command=["{python}", "-c",
                                                   "import time, toypkg.core as c; time.sleep(4); c.init_model()"])
    t = time.monotonic()
    play = f.start_playbook(f.bad_lock, *ROLLOUT)
    wait_journal(f, "gpu-01", lambda recs: _step("smoke")(recs) and not _finished(recs))
    f.ssh["gpu-01"].kill_sessions()
    play.communicate(timeout=300)
    times["cut rollout: start to the controller's stop"] = time.monotonic() - t
    _, records = wait_journal(f, "gpu-01", lambda recs: recs[-1].get("event") == "finished"
                              and recs[-1].get("status") == "reverted")
    times["cut rollout: start to the run's own end on the host"] = records[-1]["time"] - (time.time() - (
        time.monotonic() - t))
    t = time.monotonic()
    again = f.playbook(f.bad_lock, *ROLLOUT)
    assert again.returncode == 2 and f.reports()["gpu-01"]["status"] == "reverted", again.stdout
    times["the play that reattaches (canary reports its revert)"] = time.monotonic() - t
    width = max(map(len, times))
    print("\n".join(f"{k:<{width}}  {v:6.1f} s" for k, v in times.items()))
    out = os.environ["REWHEEL_FLEET_BENCH"]
    if out not in ("1", "yes", "true"):
        Path(out).write_text(json.dumps(times, indent=2))
