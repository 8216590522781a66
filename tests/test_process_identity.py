"""rewheel signals only a process whose identity it proved: pid, start time and boot (issue 45,
item 2). A generated sweep: every record that names a process (the service's `service.json`, a
bare `service.pid`, the `child` records of an interrupted run's journal) is written naming a live
bystander — an unrelated `sleep` in a session of its own — as a reused pid (another start time),
a record of another boot, a record that cannot prove its boot, or a malformed one (pid 0, -1, 1,
"abc", 1e30, [1], true, not JSON, not an object) — and every command that signals (`run`,
`rollback`, `resume`) and every one that reads the record (`status`, `check`) is run against
it. The bystander never receives a signal; a malformed service record is exit 3 with a hint that
names the file, before any journal is opened (never 5, never the caller's own group); a record
that proves nothing is "not ours" and the command goes on. Real parts: a venv, a local index,
the toy model server's recipe under the command manager (no health URL, so the record is all
that says whether it runs), real processes.

The expensive cells (a whole `run`, `rollback` or `resume` that goes on) are sampled as the
fault suites are (`support_killpoints.sample`: REWHEEL_KILLPOINTS=all runs every cell); the
refusals, `status` and `check` run in every cell."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rewheel import proc
from support_killpoints import sample
from support_run import Host, make_host

pytestmark = pytest.mark.slow

GOOD_BOOT = getattr(proc, "boot_id", lambda: None)()


@dataclass(frozen=True)
class Variant:
    name: str
    # (bystander pid, its start ticks, its start epoch) -> what to write
    make: Callable[[int, int, float], Any]
    malformed: bool  # a record rewheel did not write: refused, exit 3


def _svc(**fields: Any) -> Callable[[int, int, float], dict]:
    def make(pid: int, ticks: int, epoch: float) -> dict:
        doc = {"pid": pid, "start_ticks": ticks, "boot_id": GOOD_BOOT, "argv": ["x"], "started_at": epoch,
               "log_offset": 0, "stopped": False}
        for k, v in fields.items():
            doc[k] = v(pid, ticks, epoch) if callable(v) else v
            if doc[k] is _DROP:
                del doc[k]
        return doc
    return make


_DROP = object()
# The service's record: names the bystander, but proves it is not rewheel's service.
SERVICE_NOT_OURS = [
    Variant("reused-pid", _svc(start_ticks=lambda p, t, e: t + 1), False),
    Variant("other-boot", _svc(boot_id="00000000-0000-4000-8000-000000000000"), False),
    Variant("no-start-time", _svc(start_ticks=None), False),
    Variant("no-boot-recorded-long-ago", _svc(boot_id=_DROP, started_at=lambda p, t, e: e - 86400), False),
    Variant("no-boot-no-time", _svc(boot_id=_DROP, started_at=_DROP), False),
]
SERVICE_MALFORMED = [Variant(f"pid={v!r}", _svc(pid=v, start_ticks=None), True)
                     for v in (0, -1, 1, "abc", 1e30, [1], True, 2 ** 40)]
SERVICE_MALFORMED += [
    Variant("start_ticks=-5", _svc(start_ticks=-5), True),
    Variant("start_ticks='7'", _svc(start_ticks="7"), True),
    Variant("started_at=1e400-ish", _svc(started_at=float("inf")), True),
    Variant("stopped='no'", _svc(stopped="no"), True),
    Variant("not-an-object", lambda p, t, e: [p], True),
    Variant("not-json", lambda p, t, e: b"{\"pid\": " + str(p).encode() + b",", True),
    Variant("deep", lambda p, t, e: b"[" * 100_000 + b"]" * 100_000, True),
]
# A child record of an interrupted run's journal (uv, the smoke test it had started).
CHILD_NOT_OURS: list[tuple[str, Callable[[int, int], dict]]] = [
    ("reused-pid", lambda p, t: {"pid": p, "pgid": p, "start": t + 1, "boot": GOOD_BOOT}),
    ("other-boot", lambda p, t: {"pid": p, "pgid": p, "start": t, "boot": "00000000-0000-4000-8000-000000000000"}),
    ("no-start-time", lambda p, t: {"pid": p, "pgid": p, "start": None, "boot": GOOD_BOOT}),
    *[(f"pid={v!r}", lambda p, t, v=v: {"pid": v, "pgid": v, "start": 0, "boot": GOOD_BOOT})
      for v in (0, -1, 1, "abc", 1e30, [1])],
    ("pgid=0", lambda p, t: {"pid": p, "pgid": 0, "start": t, "boot": GOOD_BOOT}),
]


class Bystander:
    """An unrelated process in a session (and process group) of its own."""

    def __init__(self) -> None:
        self.p = subprocess.Popen(["sleep", "600"], start_new_session=True)
        st = proc.proc_stat(self.p.pid)
        assert st is not None
        self.pid, self.ticks = self.p.pid, st.start
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        self.epoch = btime + st.start / os.sysconf("SC_CLK_TCK")

    def alive(self) -> bool:
        return self.p.poll() is None

    def close(self) -> None:
        self.p.kill()
        self.p.wait()


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory, uv_cache: Path) -> Iterator[Bench]:
    b = Bench(tmp_path_factory.mktemp("identity"), uv_cache)
    yield b
    b.close()


class Bench:
    """A host whose recipe has a command-manager service without a health URL (stopped), no
    smoke test, two snapshots (toypkg 1.0.0 and 2.0.0) to roll between, and a bystander."""

    def __init__(self, tmp: Path, uv_cache: Path) -> None:
        self.h: Host = make_host(tmp, "2.0.0", "good")
        self.h.write_recipe(service__health_url=None, service__probe=None, smoke=None, install__staged=False,
                           snapshots={"keep": 1000})
        self.ref = str(self.h.recipe)
        self.env = {"REWHEEL_HOME": str(tmp / "home"), "UV_CACHE_DIR": str(uv_cache)}
        self.snaps = {"1.0.0": self.snapshot("one")}
        cp = self.rewheel("run", "--yes", "--quiet")
        assert cp.returncode == 0, cp.stderr
        self.snaps["2.0.0"] = self.snapshot("two")
        self.by = Bystander()
        self.counts: dict[str, int] = {}

    def close(self) -> None:
        self.by.close()
        self.h._index.stop()  # type: ignore[attr-defined]

    def rewheel(self, command: str, *args: str) -> subprocess.CompletedProcess:
        return self.h.rewheel(command, self.ref, *args, env=self.env)

    def snapshot(self, label: str) -> str:
        cp = self.rewheel("snapshot", "--label", label, "--json")
        assert cp.returncode == 0, cp.stderr
        return json.loads(cp.stdout)["id"]

    @property
    def state_dir(self) -> Path:
        from rewheel.paths import env_key

        return Path(self.env["REWHEEL_HOME"]) / "envs" / env_key(self.h.prefix)

    def live_version(self) -> str:
        return next(p for p in (self.h.prefix / "lib").glob("python3*/site-packages/toypkg-*.dist-info")
                    ).name.removesuffix(".dist-info").split("-")[1]

    def other_snapshot(self) -> str:
        return self.snaps["2.0.0" if self.live_version() == "1.0.0" else "1.0.0"]

    def runs(self) -> set[str]:
        d = self.state_dir / "runs"
        return {p.name for p in d.iterdir()} if d.is_dir() else set()

    def write_service(self, doc: Any) -> None:
        (self.state_dir / "service.pid").unlink(missing_ok=True)
        raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        (self.state_dir / "service.json").write_bytes(raw)

    def clear_service(self) -> None:
        for name in ("service.json", "service.pid"):
            (self.state_dir / name).unlink(missing_ok=True)

    def interrupted_run(self, children: list[dict]) -> str:
        """An interrupted run's journal: stopped, snapshotted (the live state's snapshot), its
        reinstall begun, with `children` recorded as started."""
        snap = self.snaps[self.live_version()]
        run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{len(self.runs()):04x}"
        d = self.state_dir / "runs" / run_id
        d.mkdir(parents=True)
        now = time.time()
        lines: list[dict] = [
            {"event": "started", "time": now, "kind": "run", "recipe": self.ref,
             "before": {"toypkg": self.live_version()}},
            {"event": "note", "time": now, "service_was_active": False},
            {"event": "step", "time": now, "name": "stop"},
            {"event": "step", "time": now, "name": "snapshot"},
            {"event": "snapshot", "time": now, "snapshot_id": snap},
            {"event": "step", "time": now, "name": "reinstall"},
            *({"event": "child", "time": now, "name": "uv", **c} for c in children)]
        (d / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        return run_id

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1


def _cell(b: Bench, command: str, args: tuple[str, ...], expect_rc: int, words: tuple[str, ...] = ()) -> None:
    assert b.by.alive()
    runs = b.runs()
    before = b.h.state()
    cp = b.rewheel(command, *args)
    out = cp.stdout + cp.stderr
    assert b.by.alive(), f"{command}: the bystander was signalled\n{out[-3000:]}"
    assert "Traceback" not in out, out[-3000:]
    assert cp.returncode == expect_rc, f"{command} {args}: rc={cp.returncode}\n{out[-3000:]}"
    for w in words:
        assert w in out, f"{command}: {w!r} not said\n{out[-3000:]}"
    if expect_rc == 3:
        assert b.runs() == runs, f"{command}: a journal was opened"
        assert b.h.state() == before, f"{command}: the environment changed"
    b.count(f"{command} rc={cp.returncode}")


# The values the issue met (pid 0, -1, "abc", 1e30, [1]) in every session; the others sampled.
ISSUES = {"pid=0", "pid=-1", "pid='abc'", "pid=1e+30", "pid=[1]"}


def test_a_malformed_service_record_is_refused_by_every_command(bench: Bench) -> None:
    b = bench
    others = [v for v in SERVICE_MALFORMED if v.name not in ISSUES]
    variants = [v for v in SERVICE_MALFORMED if v.name in ISSUES] + sample(others, "identity-malformed")
    assert len(variants) >= len(ISSUES) + min(4, len(others))
    for v in variants:
        b.write_service(v.make(b.by.pid, b.by.ticks, b.by.epoch))
        hint = str(b.state_dir / "service.json")
        for command, args in (("run", ("--yes", "--quiet")), ("rollback", (b.other_snapshot(), "--yes")),
                              ("check", ())):
            _cell(b, command, args, 3, (hint, "hint"))
        run_id = b.interrupted_run([])
        _cell(b, "resume", ("--yes",), 3, (hint,))
        (b.state_dir / "runs" / run_id / "journal.jsonl").unlink()
        (b.state_dir / "runs" / run_id).rmdir()
        # status reports it (and never reads it as a pid to signal)
        cp = b.rewheel("status", "--json")
        assert b.by.alive() and "Traceback" not in cp.stderr and cp.returncode in (0, 3), cp.stderr
        b.count("status")
    b.clear_service()
    print(f"malformed service records: {len(variants)} of {len(SERVICE_MALFORMED)}", b.counts)


def test_a_service_record_that_proves_nothing_is_not_ours(bench: Bench) -> None:
    b = bench
    cells: list[tuple[Variant | None, str]] = []
    for v in [None, *SERVICE_NOT_OURS]:  # None: a bare service.pid naming the bystander
        cells += [(v, "run"), (v, "rollback"), (v, "resume")]
        if v is None:
            b.clear_service()
            (b.state_dir / "service.pid").write_text(f"{b.by.pid}\n")
        else:
            b.write_service(v.make(b.by.pid, b.by.ticks, b.by.epoch))
        cp = b.rewheel("status", "--json")
        assert cp.returncode == 0, cp.stderr
        svc = json.loads(cp.stdout)["service"]
        assert not svc["up"] and svc.get("main_pid") in (0, None), (v, svc)
        _cell(b, "check", (), 0)
    for v, command in sample(cells, "identity-service"):
        if v is None:
            b.clear_service()
            (b.state_dir / "service.pid").write_text(f"{b.by.pid}\n")
        else:
            b.write_service(v.make(b.by.pid, b.by.ticks, b.by.epoch))
        if command == "run":
            _cell(b, "run", ("--yes", "--quiet"), 0)  # stops the service (upgraded or unchanged)
        elif command == "rollback":
            _cell(b, "rollback", (b.other_snapshot(), "--yes"), 0)
        else:
            b.interrupted_run([])
            _cell(b, "resume", ("--yes",), 0)
    b.clear_service()
    print("service records that prove nothing:", len(SERVICE_NOT_OURS) + 1, b.counts)


@pytest.mark.parametrize("command", ["resume", "rollback"])
def test_a_journals_child_record_that_proves_nothing_is_never_signalled(bench: Bench, command: str) -> None:
    b = bench
    b.clear_service()
    for _name, make in CHILD_NOT_OURS:
        b.interrupted_run([make(b.by.pid, b.by.ticks)])
        args = ("--yes",) if command == "resume" else (b.other_snapshot(), "--yes")
        _cell(b, command, args, 0)
    print(f"journal child records x {command}:", len(CHILD_NOT_OURS), b.counts)


def test_the_service_rewheel_started_is_still_stopped(bench: Bench, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proof does not refuse rewheel's own: a service it started (recorded with its start
    time and boot) is stopped by a rollback and started again after it."""
    b = bench
    monkeypatch.setenv("REWHEEL_HOME", b.env["REWHEEL_HOME"])
    b.clear_service()
    b.h.write_recipe(service__probe=None, smoke=None, install__staged=False)  # with its health URL
    try:
        b.h.start_service()
        doc = json.loads((b.state_dir / "service.json").read_text())
        assert doc["boot_id"] == GOOD_BOOT and isinstance(doc["start_ticks"], int)
        old_pid = doc["pid"]
        target = b.other_snapshot()
        cp = b.rewheel("rollback", target, "--yes")
        assert cp.returncode == 0, cp.stderr
        assert not proc.proc_stat(old_pid) or proc.proc_stat(old_pid).state in ("Z", "X")  # type: ignore[union-attr]
        assert b.h.served_version() == b.live_version()
    finally:
        b.h.stop_service()
        b.h.write_recipe(service__health_url=None, service__probe=None, smoke=None, install__staged=False,
                         snapshots={"keep": 1000})
    assert b.by.alive()


def test_a_signal_to_pid_zero_never_reaches_the_callers_group() -> None:
    """The unit of the rule: `Child.from_json` turns no malformed record into a child, and a
    record of another boot or with another start time names no live member."""
    me = os.getpid()
    st = proc.proc_stat(me)
    assert st is not None
    for bad in (0, -1, 1, "abc", 1e30, [1], True, None, 2 ** 40):
        assert proc.Child.from_json({"pid": bad, "pgid": bad, "start": 0}) is None
    assert proc.Child.from_json({"pid": me, "pgid": me, "start": "1"}) is None
    ours = proc.Child(me, st.pgid, st.start, "me", GOOD_BOOT)
    assert proc.Child(me, st.pgid, st.start + 1, "x", GOOD_BOOT).live_members() == []
    assert proc.Child(me, st.pgid, st.start, "x", "another-boot").live_members() == []
    assert proc.Child(me, st.pgid, st.start, "x").live_members() == []  # no boot, no time: unproven
    assert me in ours.live_members() or st.pgid != me
    assert signal.SIGTERM  # (nothing was sent: the assertions above only read /proc)
