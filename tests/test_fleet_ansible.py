"""The rewheel.fleet Ansible collection, driven by real `ansible-galaxy`, `ansible-doc` and
`ansible-playbook` over an inventory of three hosts reached over real SSH
(`ansible_connection: ssh`, tests/support_fleet.py): each host its own sshd on its own loopback
address, home, venv built by uv, recipe and real model server; rewheel installed on each by the
collection's role from a wheel built from this repository into the host's own uv tool
environment; one real local index and PEP 751 locks compiled from it.

A good lock reaches every host, check mode and a second run change nothing, and a lock that
breaks on the canary is reverted there and reaches no other host; the fleet summary names the
canary's root cause. (What the network does to a rollout: tests/test_fleet_ssh.py.)"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from support_fleet import Fleet, SshKeys, make_fleet, recap, stop_fleet, tool
from support_index import installed_version

pytestmark = pytest.mark.slow

HOSTS = ("gpu-01", "gpu-02", "gpu-03")


@pytest.fixture
def fleet(tmp_path: Path, ansible_home: dict[str, str | None], rewheel_wheel: Path, ssh_keys: SshKeys,
          monkeypatch: pytest.MonkeyPatch):
    """Three hosts on toypkg 1.0.0, each serving it; locks for toypkg 2.0.0 (good) and 3.0.0
    (its model init fails: the smoke test breaks)."""
    f = make_fleet(tmp_path, HOSTS, ssh_keys, ansible_home, rewheel_wheel, monkeypatch)
    yield f
    print("playbooks (arguments, seconds):", f.times)  # (shown when a test failed)
    stop_fleet(f, monkeypatch)


def test_a_good_lock_reaches_every_host_and_check_mode_and_a_second_run_change_nothing(fleet: Fleet) -> None:
    install = fleet.playbook(fleet.good_lock, "--tags", "rewheel_install")
    assert install.returncode == 0, install.stdout + install.stderr
    for name in HOSTS:  # each host's own uv tool environment, from the wheel, where uv puts it
        home = fleet.ssh[name].home  # (/root there: the command's link names the tool by that path)
        assert (home / ".local" / "share" / "uv" / "tools" / "rewheel" / "bin" / "rewheel").exists()
        assert os.readlink(home / ".local" / "bin" / "rewheel") == "/root/.local/share/uv/tools/rewheel/bin/rewheel"
    before = fleet.states()

    # Check mode: every host would change; no environment nor service does.
    check = fleet.playbook(fleet.good_lock, "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert fleet.states() == before
    assert fleet.served() == dict.fromkeys(HOSTS, "1.0.0")
    assert {h: r["status"] for h, r in fleet.reports().items()} == dict.fromkeys(HOSTS, "planned")
    summary = fleet.summary()
    assert "3 planned" in summary and "toypkg 1.0.0 → 2.0.0" in summary
    for name in HOSTS:
        assert not (fleet.homes[name] / "envs").exists() or not list(fleet.homes[name].glob("envs/*/runs/*"))

    # The rollout: canary, then the waves; every host serves the locked build.
    run = fleet.playbook(fleet.good_lock)
    assert run.returncode == 0, run.stdout + run.stderr
    assert fleet.served() == dict.fromkeys(HOSTS, "2.0.0")
    for h in fleet.hosts.values():
        assert installed_version(h.python, "toypkg") == "2.0.0"
    assert all(r["changed"] >= 1 and r["failed"] == 0 for r in recap(run.stdout).values())
    # One host per wave (1, 30% of 3, the rest), in inventory order.
    assert re.findall(r"TASK \[Upgrade to the lock[^\n]*\s+changed: \[(gpu-\d+)\]\s+TASK \[Stop the rollout[^\n]*"
                      r"\s+skipping: \[gpu-\d+\]\s+PLAY", run.stdout) == list(HOSTS), run.stdout
    reports = fleet.reports()
    assert {h: r["status"] for h, r in reports.items()} == dict.fromkeys(HOSTS, "upgraded")
    summary = fleet.summary()
    assert "3 upgraded" in summary and "| gpu-02 | ✅ upgraded | toypkg 1.0.0 → 2.0.0 |" in summary
    assert "REWHEEL FLEET SUMMARY" in run.stdout and "3 upgraded" in run.stdout
    after = fleet.states()

    # The same lock again: rewheel's dry run says there is nothing to do; nothing is touched.
    again = fleet.playbook(fleet.good_lock)
    assert again.returncode == 0, again.stdout + again.stderr
    counts = recap(again.stdout)
    assert set(counts) == set(HOSTS)
    assert all(c["changed"] == 0 and c["failed"] == 0 for c in counts.values()), counts
    assert fleet.states() == after
    assert "3 unchanged" in fleet.summary()

    # The module's other states on the canary, in one play: a rollback (predicted by check mode
    # first) to the snapshot before the upgrade, a second one with nothing to do (check mode
    # agrees), a labelled snapshot taken once, the status.
    h = fleet.hosts["gpu-01"]
    common = {"recipe": str(h.recipe)}  # rewheel and its home found where they are by default
    steps = [("predict", "rolled_back", {}, True), ("back", "rolled_back", {}, False),
             ("again", "rolled_back", {}, False), ("predict_again", "rolled_back", {}, True),
             ("snap", "snapshot", {"label": "fleet-test"}, False),
             ("snap_again", "snapshot", {"label": "fleet-test"}, False), ("status", "status", {}, False)]
    tasks = [{"name": name, "rewheel.fleet.rewheel": {"state": state, **common, **extra}, "register": name,
              "check_mode": check} for name, state, extra, check in steps]
    tasks.append({"name": "results", "ansible.builtin.copy": {
        "content": "{{ {%s} | to_json }}" % ", ".join(f"'{n}': {n}" for n, *_ in steps),
        "dest": str(fleet.root / "states.json")}, "delegate_to": "localhost"})
    (fleet.root / "states.yml").write_text(json.dumps([{"hosts": "gpu-01", "gather_facts": False,
                                                        "tasks": tasks}]))
    play = tool("ansible-playbook", "-i", str(fleet.root / "inventory.yml"), str(fleet.root / "states.yml"),
                env=fleet.env, cwd=fleet.root)
    assert play.returncode == 0, play.stdout + play.stderr
    res = json.loads((fleet.root / "states.json").read_text())
    assert [res[n]["changed"] for n, *_ in steps] == [True, True, False, False, True, False, False]
    assert res["back"]["status"] == "restored" and res["back"]["report"]["restore"]["written"] > 0
    assert h.served_version() == "1.0.0" and h.state() == before["gpu-01"]
    assert res["snap_again"]["snapshot_id"] == res["snap"]["snapshot_id"]
    st = res["status"]["report"]
    assert st["key_packages"] == {"toypkg": "1.0.0"} and st["equals"]["label"] == "fleet-test"


def test_a_lock_that_breaks_on_the_canary_is_reverted_there_and_reaches_no_other_host(fleet: Fleet) -> None:
    before = fleet.states()
    run = fleet.playbook(fleet.bad_lock)
    out = run.stdout + run.stderr
    assert run.returncode == 2, out
    # The canary: reverted, byte for byte, serving the old build; the task's message is the cause.
    assert fleet.states()["gpu-01"] == before["gpu-01"]
    assert fleet.served() == dict.fromkeys(HOSTS, "1.0.0")
    assert re.search(r"fatal: \[gpu-01\]: FAILED! => .*reverted to snapshot \w+: ValueError: q_lora_rank 1536 "
                     r"must divide num_heads 7", out), out
    # The rest: never reached — environments identical, no lock staged, no run journaled.
    assert fleet.states() == before
    counts = recap(run.stdout)
    assert counts["gpu-01"]["failed"] == 1
    for name in HOSTS[1:]:
        assert counts[name]["failed"] == 0
        assert not (fleet.stage(name) / "pylock.toy.toml").exists()
        assert not list(fleet.homes[name].glob("envs/*/runs/*"))
    # The summary, on the play's output and as Markdown: the canary's root cause, grouped.
    reports = fleet.reports()
    assert list(reports) == ["gpu-01"] and reports["gpu-01"]["status"] == "reverted"
    assert "REWHEEL FLEET SUMMARY" in run.stdout
    assert re.search(r"gpu-01\s+reverted\s+toypkg 1\.0\.0 → 3\.0\.0\s+downtime [\d.]+s", run.stdout), run.stdout
    assert "gpu-02  not-reached" in run.stdout and "gpu-03  not-reached" in run.stdout
    summary = fleet.summary()
    assert "1 reverted, 2 not-reached" in summary
    assert ("- **1 host(s)** (gpu-01): `ValueError: q_lora_rank 1536 must divide num_heads 7 on rank 4 at "
            "toypkg/layers.py:5 in __init__`") in summary


def test_ansible_doc_and_the_argument_spec(ansible_home: dict[str, str | None], tmp_path: Path) -> None:
    doc = tool("ansible-doc", "rewheel.fleet.rewheel", env=ansible_home)
    assert doc.returncode == 0, doc.stderr
    for word in ("state", "upgraded", "rolled_back", "lock", "snapshot", "executable", "RETURN VALUES"):
        assert word in doc.stdout
    cb = tool("ansible-doc", "-t", "callback", "rewheel.fleet.fleet_summary", env=ansible_home)
    assert cb.returncode == 0 and "reports_dir" in cb.stdout, cb.stderr
    role = tool("ansible-doc", "-t", "role", "rewheel.fleet.install", env=ansible_home)
    assert role.returncode == 0 and "rewheel_wheel" in role.stdout, role.stderr

    def adhoc(args: str) -> str:
        cp = tool("ansible", "localhost", "-m", "rewheel.fleet.rewheel", "-a", args,
                  "-e", f"ansible_python_interpreter={sys.executable}", env=ansible_home, cwd=tmp_path)
        assert cp.returncode == 2, cp.stdout + cp.stderr
        return cp.stdout + cp.stderr

    assert "state is upgraded but all of the following are missing: recipe" in adhoc("state=upgraded python=/x")
    assert "value of state must be one of: upgraded, rolled_back, snapshot, status" in adhoc("state=bogus recipe=/x")
    assert "mutually exclusive: recipe|python" in adhoc("state=status recipe=/x python=/y")
    assert "lock: only with state=upgraded" in adhoc("state=status recipe=/x lock=/l")
    assert "rewheel is not installed on this host" in adhoc("state=status recipe=/x executable=not-rewheel-here")
