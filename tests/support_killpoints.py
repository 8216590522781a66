"""The kill-point fault suite's machinery (tests/test_killpoints*.py).

A `Bench` is one scenario on a real host (tests/support_run.py: a real venv, a local index, the
toy model server under the command manager): a command (`run` staged or not, kept or reverted,
`rollback`, `resume`) from one fixed starting state. The starting state — the environment and
rewheel's home, service stopped — is saved once as a template and copied back (`cp -a`, one
call, so the snapshots' hard links into the environment stay links) before every trial, so
every trial starts from the same bytes and the same store.

Kill points come from the reference run of the command, under strace (`points`): every rename,
link, unlink, fsync and write the rewheel process makes from its first line (strace attaches by
pid to the held warm command, tests/support_cli.py; its main thread: strace without -f, so
neither uv, the smoke test nor the service are counted or killed — a `kill -9` of rewheel
leaves them running too, and `resume` must deal with that). A trial re-runs the command with
`strace -e inject=SYSCALL:signal=KILL:when=N` (SIGKILL on entry to the Nth call of that
syscall, so the call never happens), then `rewheel resume`, then `proof` — the environment is
the state before or after the command byte for byte, nothing `.rewheel-*` inside the prefix,
no installed file hard-linked into uv's cache, the service serving what the files say (running,
as it was before), no process of the host left but the service, no interrupted run left.

The polite signals use the journal's fault hook (`REWHEEL_FAULT_AT=KEY#N`, the Nth record of
that key, `REWHEEL_FAULT_SIGNAL`): every record the command writes is a boundary
(`boundaries`).
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewheel.journal import list_runs
import support_cli
from support_env import cmdlines, uv_bin
from support_run import SERVER, Host, make_host

TRACED = ("rename", "renameat", "renameat2", "link", "linkat", "unlink", "unlinkat", "write", "fsync", "fdatasync")
# A write to these is output, not state: a kill there is the same as at the call before it.
_OUTPUT_FD = re.compile(r"^write\((?:1|2)(?:<[^>]*>)?,")
_LINE = re.compile(r"^(\w+)\((\d+)?(?:<([^>]*)>)?")

SIGNALS = ("TERM", "INT", "HUP")


@dataclass(frozen=True)
class Scenario:
    name: str
    command: str  # run | rollback | resume
    variant: str = "good"  # what toypkg 2.0.0 does (support_run.VARIANTS)
    staged: bool = True
    # resume: the fault that interrupted the run it resumes
    interrupted_at: str = ""

    @property
    def exit_code(self) -> int:
        """What the command exits with when nothing interrupts it (a reverted run: 1)."""
        return 1 if self.command == "run" and self.variant != "good" else 0


# The commands the suite interrupts, each from its own starting state.
SCENARIOS = {s.name: s for s in [
    Scenario("run-staged-kept", "run", "good", staged=True),
    Scenario("run-staged-reverted", "run", "service-fails", staged=True),  # the new build's start fails
    Scenario("run-unstaged-kept", "run", "good", staged=False),
    Scenario("run-unstaged-reverted", "run", "smoke-fails", staged=False),
    Scenario("rollback", "rollback", "good", staged=True),  # of a kept upgrade, the service running
    # of a run killed after its smoke test began: a failed-build snapshot, the restore, the start
    Scenario("resume", "resume", "smoke-fails", staged=False, interrupted_at="step:smoke"),
]}


@dataclass(frozen=True)
class KillPoint:
    syscall: str
    n: int  # the nth call of `syscall` by the rewheel process
    what: str  # the path or the kind of call, from the counting run (for the report)

    def __str__(self) -> str:
        return f"{self.syscall}#{self.n} ({self.what})"


@dataclass
class Outcome:
    point: str
    rc: int
    resumed: int | None
    problems: list[str] = field(default_factory=list)
    ended: str = ""  # before | after

    @property
    def exact(self) -> bool:
        return not self.problems


def mode() -> str:
    """`REWHEEL_KILLPOINTS=all`: every kill point and every signal at every boundary;
    otherwise a sample (see `sample`)."""
    return "all" if os.environ.get("REWHEEL_KILLPOINTS", "").lower() == "all" else "sample"


# Trials per scenario by default: a spread of the command's kill points or boundaries. Four
# keep every kind of step in each run's spread, and the fault suites at about a quarter of the
# suite's time; each session's new seed moves the spread (`sample`), `=all` tries every one.
DEFAULT_LIMIT = 4


def limit() -> int:
    """`REWHEEL_KILLPOINTS=N`: at most N trials per scenario (default `DEFAULT_LIMIT`)."""
    value = os.environ.get("REWHEEL_KILLPOINTS", "")
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_LIMIT


def rng(key: str) -> random.Random:
    """The session's draws for `key` (a scenario): from `REWHEEL_FAULT_SEED`, which
    tests/conftest.py sets to a new value per session when it is unset."""
    return random.Random(f"{os.environ.get('REWHEEL_FAULT_SEED', '0')}:{key}")


def describe() -> str:
    """The sample's settings, as a line that repeats it (pytest's header and last line, every
    failure's summary)."""
    return (f"REWHEEL_FAULT_SEED={os.environ.get('REWHEEL_FAULT_SEED', '0')} "
            f"REWHEEL_KILLPOINTS={os.environ.get('REWHEEL_KILLPOINTS') or f'{limit()} (the default)'}")


def sample(items: list[Any], key: str) -> list[Any]:
    """A spread of at most `limit()` items: every k-th one (k = ceil(len/limit)), from an
    offset below k drawn by `rng(key)`, plus the last one. Each run tries points spread over
    the whole command — every kind of step — and successive runs (new seeds) try the others:
    over k runs, every point. `REWHEEL_KILLPOINTS=all` runs them all; `REWHEEL_FAULT_SEED=S`
    repeats a run's choice."""
    n = limit()
    if mode() == "all" or len(items) <= n:
        return list(items)
    k = -(-len(items) // n)
    offset = rng(key).randrange(k)
    picked = items[offset::k]
    if items[-1] not in picked:
        picked.append(items[-1])
    return picked


class Bench:
    def __init__(self, tmp: Path, scenario: Scenario, *, count: bool = False) -> None:
        self.tmp = tmp
        self.s = scenario
        self.uv_cache = tmp / "uv-cache"
        os.environ["UV_CACHE_DIR"] = str(self.uv_cache)
        self.home = Path(os.environ["REWHEEL_HOME"])
        self.h: Host = make_host(tmp, "2.0.0", scenario.variant)
        self.h.write_recipe(service__settle_s=0.1, install__staged=scenario.staged)
        # The old build installed as copies: the one link into uv's cache the proof allows is
        # none at all.
        subprocess.run([uv_bin(), "pip", "install", "-q", "--python", str(self.h.python),
                        "--index-url", self.h.index_url, "--reinstall", "--link-mode", "copy", "toypkg==1.0.0"],
                       check=True, capture_output=True)
        self.template = tmp / "template"
        self.service_before = True
        self._prepare()
        self.before = self.h.state()
        self.before_version = self.version_of_state()
        # What the command does when nothing interrupts it: the reference run, which is also
        # the counting run of the kill points (under strace, with `count`) and the source of
        # the journal boundaries.
        self.reset()
        log = self.tmp / "count.strace"
        t0 = time.time()
        cp = self.rewheel(self.s.command, attach=["strace", "-qq", "-y", "-o", str(log), "-e",
                                                  "trace=" + ",".join(TRACED)] if count else None)
        assert cp.returncode == self.s.exit_code, f"reference {self.s.command}: rc={cp.returncode}\n{cp.stderr[-3000:]}"
        self._points = self._read_points(log) if count else None
        self._boundaries = self._read_boundaries(t0)
        self.after = self.h.state()
        self.after_version = self.served()
        assert self.after_version is not None
        self.reference_problems = self.proof_problems({"before": self.before, "after": self.after}
                                                      if self.s.command != "resume" else {"after": self.after})

    # -- the starting state ---------------------------------------------------------------
    def _prepare(self) -> None:
        h = self.h
        h.start_service()
        if self.s.command == "rollback":
            cp = h.rewheel("run", str(h.recipe), "--yes", "--quiet")
            assert cp.returncode == 0 and h.served_version() == "2.0.0", cp.stderr
        elif self.s.command == "resume":
            cp = h.rewheel("run", str(h.recipe), "--yes", "--quiet", env={"REWHEEL_FAULT_AT": self.s.interrupted_at})
            assert cp.returncode == -signal.SIGKILL, cp.stderr
            # The interrupted run stopped the service: it stays down until the resume.
        self.kill_host_processes()
        self.template.mkdir()
        self._copy([self.h.prefix, self.home], self.template)

    @staticmethod
    def _copy(sources: list[Path], dest: Path) -> None:
        # One cp: hard links among the sources (snapshots <-> environment) stay links.
        subprocess.run(["cp", "-a", *map(str, sources), str(dest)], check=True)

    def reset(self) -> None:
        """Back to the starting state: no process of this host, the template's files, the
        service started as an operator has it (except for `resume`, whose interrupted run had
        stopped it)."""
        self.kill_host_processes()
        for p in (self.h.prefix, self.home):
            shutil.rmtree(p)
        self._copy([self.template / self.h.prefix.name, self.template / self.home.name], self.tmp)
        if self.s.command != "resume":
            self.h.start_service()

    def host_processes(self) -> list[tuple[int, str]]:
        """This host's processes: anything started from its folder, and its service."""
        return [(p, c) for p, c in cmdlines(skip={os.getpid()})
                if str(self.tmp) + "/" in c or f"--port {self.h.port}" in c]

    def kill_host_processes(self) -> None:
        for _ in range(100):
            procs = [p for p, _ in self.host_processes()]
            if not procs:
                return
            for p in procs:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.05)
        raise AssertionError(f"processes survive SIGKILL: {self.host_processes()}")

    # -- commands -------------------------------------------------------------------------
    def argv(self, command: str) -> list[str]:
        return [sys.executable, "-m", "rewheel", command, str(self.h.recipe), "--yes",
                *(["--quiet"] if command == "run" else [])]

    def rewheel(self, command: str, *, attach: list[str] | None = None, env: dict[str, str] | None = None,
                timeout: float = 240) -> subprocess.CompletedProcess:
        # (strace attaches by pid before the command's first line: support_cli)
        return support_cli.rewheel(*self.argv(command)[3:], attach=attach, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **(env or {})}, timeout=timeout)

    def served(self) -> str | None:
        return self.h.served_version()

    def version_of_state(self) -> str:
        text = (self.h.prefix / "lib").glob("python3*/site-packages/toypkg/__init__.py")
        return next(text).read_text().split('"')[1]

    # -- kill points ----------------------------------------------------------------------
    def points(self) -> list[KillPoint]:
        """Every call of the traced syscalls the rewheel process makes, in order (the reference
        run under strace, from the starting state: `Bench(..., count=True)`); writes to stdout
        and stderr left out."""
        assert self._points is not None, "Bench(..., count=True) counts the kill points"
        return self._points

    def _read_points(self, log: Path) -> list[KillPoint]:
        seen: collections.Counter[str] = collections.Counter()
        out: list[KillPoint] = []
        for line in log.read_text(errors="replace").splitlines():
            m = _LINE.match(line)
            if m is None or m.group(1) not in TRACED:
                continue
            name = m.group(1)
            seen[name] += 1
            if _OUTPUT_FD.match(line):
                continue
            path = m.group(3) or ""
            if not path:
                q = re.search(r'"([^"]*)"', line)
                path = q.group(1) if q else ""
            out.append(KillPoint(name, seen[name], _short(path, self.tmp)))
        return out

    def boundaries(self) -> list[str]:
        """Every journal record the command writes, as `KEY#N` for the fault hook (N: the
        how-manieth record of that key this process writes), from the reference run."""
        return self._boundaries

    def _read_boundaries(self, t0: float) -> list[str]:
        recs = []
        for jf in self.home.glob("envs/*/runs/*/journal.jsonl"):
            for line in jf.read_text().splitlines():
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("time", 0) >= t0:
                    recs.append(r)
        recs.sort(key=lambda r: r["time"])
        seen: collections.Counter[str] = collections.Counter()
        out = []
        for r in recs:
            key = f"step:{r.get('name')}" if r["event"] == "step" else r["event"]
            seen[key] += 1
            out.append(f"{key}#{seen[key]}")
        return out

    # -- trials ---------------------------------------------------------------------------
    def kill_at(self, p: KillPoint) -> Outcome:
        self.reset()
        # (only the injected call traced: strace decodes nothing else)
        cp = self.rewheel(self.s.command, attach=["strace", "-qq", "-o", "/dev/null", "-e", f"trace={p.syscall}",
                                                 "-e", f"inject={p.syscall}:signal=KILL:when={p.n}"])
        return self._settle(str(p), cp)

    def signal_at(self, boundary: str, sig: str) -> Outcome:
        self.reset()
        cp = self.rewheel(self.s.command, env={"REWHEEL_FAULT_AT": boundary, "REWHEEL_FAULT_SIGNAL": sig})
        out = self._settle(f"SIG{sig} at {boundary}", cp)
        if sig != "KILL" and cp.returncode not in (0, 1, 3, 4):
            out.problems.append(f"SIG{sig} ended rewheel with rc={cp.returncode} (not 0, 1, 3 or 4): "
                                f"{cp.stderr.strip()[-800:]}")
        return out

    def _settle(self, what: str, cp: subprocess.CompletedProcess) -> Outcome:
        out = Outcome(what, cp.returncode, None)
        if "Traceback" in cp.stderr:
            out.problems.append(f"traceback from the interrupted command: {cp.stderr[-1500:]}")
        res = self.rewheel("resume")
        for _ in range(20):
            if res.returncode != 4 or "LockHeld" not in res.stderr and "holds" not in res.stderr:
                break
            time.sleep(0.5)  # a second restore lane finishing its share still holds the lock
            res = self.rewheel("resume")
        out.resumed = res.returncode
        if res.returncode != 0:
            out.problems.append(f"resume rc={res.returncode}: {res.stderr.strip()[-1500:]}")
        allowed = {"after": self.after} if self.s.command == "resume" else {"before": self.before, "after": self.after}
        out.problems += self.proof_problems(allowed, out)
        return out

    def proof_problems(self, allowed: dict[str, dict], out: Outcome | None = None) -> list[str]:
        problems: list[str] = []
        h = self.h
        state = h.state()
        ended = next((k for k, v in allowed.items() if state == v), None)
        if out is not None:
            out.ended = ended or "neither"
        if ended is None:
            ref = allowed.get("after") if self.s.command == "resume" else self.before
            diff = sorted(k for k in set(state) | set(ref or {}) if state.get(k) != (ref or {}).get(k))
            problems.append(f"the environment is neither state: {len(diff)} entries differ, e.g. {diff[:6]}")
        strays = [k for k in state if ".rewheel-" in k]
        if strays:
            problems.append(f"stray entries inside the prefix: {strays[:6]}")
        linked = self.linked_into_uv_cache()
        if linked:
            problems.append(f"{len(linked)} installed files hard-linked into uv's cache, e.g. {linked[:4]}")
        want = self.before_version if ended == "before" else self.after_version
        served = self.served()
        if self.service_before and served != want:
            problems.append(f"the service serves {served!r}, the files are {want!r}")
        left = self.left_processes()
        if left:
            problems.append(f"processes left: {left[:4]}")
        servers = [p for p, c in self.host_processes() if str(SERVER) in c]
        if len(servers) > 1:
            problems.append(f"{len(servers)} service processes: {servers}")
        open_runs = [j.id for d in self.home.glob("envs/*") for j in list_runs(d) if not j.finished and j.records]
        if open_runs:
            problems.append(f"interrupted runs left after resume: {open_runs}")
        return problems

    def left_processes(self, wait_s: float = 30.0) -> list[tuple[int, str]]:
        """This host's processes but the service. The detached `rm` that deletes what a restore
        moved into the store's trash (outside the environment), and the detached settling of
        what a rollback's undo snapshot took over (`python -m rewheel.snapshot.privatize
        <the store's env folder> [its trash]`), outlive rewheel by design: they are waited for,
        and left only if they do not end."""
        detached = (f"rm -rf -- {self.home}/trash/", f"-m rewheel.snapshot.privatize {self.home}/envs/")
        deadline = time.monotonic() + wait_s
        while True:
            left = [(p, c) for p, c in self.host_processes() if str(SERVER) not in c]
            if not left or time.monotonic() >= deadline or any(not any(d in c for d in detached) for _, c in left):
                return left
            time.sleep(0.1)

    def linked_into_uv_cache(self) -> list[str]:
        cache: set[tuple[int, int]] = set()
        for dirpath, _, files in os.walk(self.uv_cache):
            for f in files:
                try:
                    st = os.lstat(os.path.join(dirpath, f))
                except OSError:
                    continue
                if st.st_nlink > 1:
                    cache.add((st.st_dev, st.st_ino))
        out = []
        for dirpath, _, files in os.walk(self.h.prefix):
            for f in files:
                p = os.path.join(dirpath, f)
                st = os.lstat(p)
                if st.st_nlink > 1 and (st.st_dev, st.st_ino) in cache:
                    out.append(os.path.relpath(p, self.h.prefix))
        return out

    def close(self) -> None:
        self.kill_host_processes()
        self.h._index.stop()  # type: ignore[attr-defined]


def _short(path: str, tmp: Path) -> str:
    path = path.replace(str(tmp) + "/", "")
    return re.sub(r"envs/[^/]+/", "", path)[-90:]


def summary(name: str, outcomes: list[Outcome]) -> str:
    bad = [o for o in outcomes if not o.exact]
    ends = collections.Counter(o.ended for o in outcomes)
    lines = [f"{name} ({describe()}): "
             f"{len(outcomes)} tried, {len(outcomes) - len(bad)} recovered exactly "
             f"(ended before: {ends.get('before', 0)}, after: {ends.get('after', 0)}), {len(bad)} left"]
    lines += [f"  {o.point}: rc={o.rc} resume={o.resumed}: " + " | ".join(o.problems) for o in bad]
    return "\n".join(lines)


def record(name: str, outcomes: list[Outcome]) -> None:
    """Counts for the closing note: `REWHEEL_KILLPOINTS_LOG=FILE` appends one JSON line per
    scenario."""
    path = os.environ.get("REWHEEL_KILLPOINTS_LOG")
    if not path:
        return
    bad = [o for o in outcomes if not o.exact]
    with open(path, "a") as f:
        f.write(json.dumps({"scenario": name, "mode": mode(), "sample": describe(), "tried": len(outcomes),
                            "exact": len(outcomes) - len(bad),
                            "left": [{"point": o.point, "problems": o.problems} for o in bad]}) + "\n")


def prove_scenario(tmp: Path, scenario: Scenario, name: str,
                   trials: Callable[[Bench], list[Outcome]], *, count: bool = False) -> list[Outcome]:
    """One scenario's bench (whose uninterrupted command must pass the proof itself), its
    trials, their counts recorded; every trial recovered exactly, or the summary of those
    that did not."""
    b = Bench(tmp, scenario, count=count)
    try:
        assert not b.reference_problems, b.reference_problems
        outcomes = trials(b)
        record(name, outcomes)
        assert not [o for o in outcomes if not o.exact], summary(name, outcomes)
        return outcomes
    finally:
        b.close()
