"""Which process failed: every place a log names it, and which naming the answer takes
(`ProcessNamer`, a part of `Analyser`).

A failing process is named in several places, not all of them on its own lines:

- the prefix of its lines (`(Worker_TP4 pid=N)`, `[rank3]:`, `3: ` of `srun -l`, torchrun's
  `[default3]:`) or its logger header's ranks (sglang's `TP1`) — `prefix`;
- the rank its error's own text names (`[Rank 2] Watchdog caught ...`) — `text`;
- the record just before an unprefixed error or traceback — `nearby`;
- Ray's remote process after `RayTaskError(X): ray::A.f() (pid=N, ip=A)` — `ray-task`;
- the fields under a dead actor's error (`ActorDiedError: The actor died ...`, then `pid: N`,
  `ip: A`, `class_name: ...`) — `actor` — and raylet's `Worker PID: N` about a worker that
  died — `raylet`. The driver that reports a dead actor is not the process that failed;
- a structured logger's field after the message (TGI's ` rank=0`) — `field`;
- what a launcher says after its child failed — `launcher`: torchrun's `ChildFailedError`
  table (`rank : 2 (local_rank: 2)`, the "Root Cause" entry first) and its
  `failed (exitcode: 1) local_rank: 2 (pid: N)`, lmdeploy's `Rank[2] failed.`, DeepSpeed's
  `[... '--local_rank=2' ...] exits with return code = 1`, srun's `srun: error: HOST: task 11:
  Exited with exit code 1`, mpirun's `Process name: [[31226,1],3]`, TGI's `Shard 0 failed to
  start`;
- the same error printed again by a process that is named (TGI prints a shard's traceback
  twice, only the second copy with its rank) — `same-error`.

The root keeps the process its own lines name; a dead actor is named by its error's fields (or
raylet); an unnamed root takes, in this order, the same error named elsewhere, then the
strongest launcher statement after it (within the crash: at most `LAUNCHER_TRACEBACKS`
tracebacks later). Every naming found is reported as evidence, the one taken first.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

from rewheel.diagnose.limits import LAUNCHER_TRACEBACKS, MAX_EVIDENCE
from rewheel.diagnose.ranking import Occ
from rewheel.diagnose.results import Evidence


class RankSource(StrEnum):
    PREFIX = "prefix"
    TEXT = "text"
    NEARBY = "nearby"
    RAY_TASK = "ray-task"
    ACTOR = "actor"
    RAYLET = "raylet"
    FIELD = "field"
    LAUNCHER = "launcher"
    SAME_ERROR = "same-error"


# Launchers' statements about a child that failed, with how sure each is (torchrun's table
# entry under "Root Cause (first observed failure)" is 3, see ErrorLineReader._elastic_field).
LAUNCHER_RES: list[tuple[re.Pattern[str], int]] = [
    # torchrun / accelerate: "failed (exitcode: 1) local_rank: 2 (pid: 48213) of binary: ..."
    (re.compile(r"failed \(exitcode: -?\d+\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)"), 2),
    # lmdeploy: "Rank[2] failed." (its TP processes), "TP process 2 failed with exitcode 1"
    (re.compile(r"\bRank\[(?P<rank>\d+)\] failed\b|\bTP process (?P<rank2>\d+) failed\b"), 2),
    # DeepSpeed's launcher: "[..., '--local_rank=2', ...] exits with return code = 1"
    (re.compile(r"--local_rank=(?P<local>\d+)\b.*\bexits with return code = -?[1-9]"), 2),
    # srun: "srun: error: gpu-node-13: task 11: Exited with exit code 1" (one task, not "tasks 0-3")
    (re.compile(r"srun: error: (?P<host>[^\s:]+): task (?P<rank>\d+): (?:Exited with exit code [1-9]|Killed"
                r"|Segmentation|Aborted|Bus error)"), 2),
    # mpirun: "The first process to do so was:" / "Process name: [[31226,1],3]"
    (re.compile(r"Process name: \[\[\d+,\d+\],(?P<rank>\d+)\]"), 2),
    # TGI: "Shard 0 failed to start", "Shard 1 crashed" (its own field says "rank=0")
    (re.compile(r"\bShard (?P<shard>\d+) (?:failed to start|crashed)"), 2),
]
RAYLET_RE = re.compile(r"Worker PID: (?P<pid>\d+)")
RAYLET_IP_RE = re.compile(r"Worker IP address: (?P<ip>[^\s,]+)")
# A dead actor's error and the fields Ray indents under its first line.
ACTOR_DIED_TYPES = {"ActorDiedError", "RayActorError", "ActorUnavailableError"}
ACTOR_FIELD_RE = re.compile(r"^\s+(?P<key>class_name|pid|ip): (?P<value>\S+)\s*$", re.M)


def launcher_statement(line: str) -> tuple[str, int | None, str | None, int] | None:
    """The child a launcher's line says failed: (name, pid, node, how sure), or None."""
    if "ailed" not in line and "xit" not in line and "crashed" not in line and "Process name" not in line:
        return None
    for rx, weight in LAUNCHER_RES:
        m = rx.search(line)
        if m:
            groups = m.groupdict()
            if groups.get("local"):
                name = f"local_rank{groups['local']}"
            elif groups.get("shard"):
                name = f"rank={groups['shard']}"
            else:
                name = f"rank{groups.get('rank') or groups.get('rank2')}"
            pid = int(groups["pid"]) if groups.get("pid") else None
            return name, pid, groups.get("host"), weight
    return None


def actor_fields(type_: str | None, message: str) -> tuple[str, int | None, str | None] | None:
    """A dead actor's process from the fields under its error: (name, pid, ip), or None."""
    if not type_ or type_.rsplit(".", 1)[-1] not in ACTOR_DIED_TYPES:
        return None
    fields = {m.group("key"): m.group("value") for m in ACTOR_FIELD_RE.finditer(message[:4000])}
    if "pid" not in fields or not fields["pid"].isdigit():
        return None
    cls = fields.get("class_name", "").rsplit(".", 1)[-1]
    name = f"{cls} pid={fields['pid']}" if cls else f"pid={fields['pid']}"
    return name, int(fields["pid"]), fields.get("ip")


@dataclass
class Said:
    """A naming found outside the root's own lines, before we know what the root is."""
    source: RankSource
    rank: str
    pid: int | None
    node: str | None
    pos: int
    tracebacks: int           # tracebacks closed when it was read (keeps it with its crash)
    weight: int = 0


class ProcessNamer:
    """`Analyser`'s part that keeps what names processes outside their own lines, and names
    the root's process with the evidence for it."""

    # (state set up by Analyser.__init__)
    tracebacks: int
    tail: int
    streams: dict
    said: deque[Said]
    raylets: deque[Said]

    def _launcher_line(self, line: str, pos: int) -> None:
        found = launcher_statement(line)
        if found is not None:
            self._tell(found[0], found[1], found[2], pos, found[3])

    def _tell(self, rank: str, pid: int | None, node: str | None, pos: int, weight: int) -> Said | None:
        """A launcher's statement about a failed child, kept when read while a traceback is open
        or just after one (where both readers read every line, so both keep the same)."""
        if self.tail <= 0 and not self.streams:
            return None
        said = Said(RankSource.LAUNCHER, rank, pid, node, pos, self.tracebacks, weight)
        self.said.append(said)
        return said

    def _raylet_line(self, line: str, pos: int) -> None:
        m = RAYLET_RE.search(line)
        if m:
            ip = RAYLET_IP_RE.search(line)
            self.raylets.append(Said(RankSource.RAYLET, f"pid={m.group('pid')}", int(m.group("pid")),
                                      ip.group("ip") if ip else None, pos, self.tracebacks))

    def _name_process(self, occ: Occ, epoch_list: list[Occ]) -> list[Said]:
        """Every naming of the root's process, the one the answer takes first (empty: none)."""
        found: list[Said] = []
        if occ.rank:
            found.append(Said(RankSource(occ.rank_source or RankSource.PREFIX), occ.rank, occ.pid, occ.node, occ.pos,
                               occ.tracebacks))
        actor = actor_fields(occ.type, occ.message)
        if actor is not None:
            found.insert(0, Said(RankSource.ACTOR, actor[0], actor[1], actor[2] or occ.node, occ.pos,
                                  occ.tracebacks))
        if actor is not None or (occ.type or "").rsplit(".", 1)[-1] in ACTOR_DIED_TYPES:
            pids = {s.pid for s in found if s.source == RankSource.ACTOR}
            raylet = [r for r in self.raylets if r.pos <= occ.pos and (not pids or r.pid in pids)]
            if raylet:
                found.insert(0 if not pids else len(found), raylet[-1])
        if occ.merged:
            return found
        for other in epoch_list:
            if other is not occ and other.sig == occ.sig and other.rank and other.kind == occ.kind:
                found.append(Said(RankSource.SAME_ERROR, other.rank, other.pid, other.node, other.pos,
                                   other.tracebacks))
                break
        # (said while the root's traceback was still open, or at most a few tracebacks after it)
        later = [s for s in self.said if s.pos > occ.pos and -1 <= s.tracebacks - occ.tracebacks <= LAUNCHER_TRACEBACKS]
        found += sorted(later, key=lambda s: (-s.weight, s.pos))
        out: list[Said] = []
        for s in found:
            if not any(o.source == s.source and o.rank == s.rank for o in out):
                out.append(s)
        return out[:MAX_EVIDENCE]


def evidence(said: list[Said], mapping: dict[int, int]) -> list[Evidence]:
    return [Evidence(str(s.source), s.rank, s.pid, s.node, mapping.get(s.pos)) for s in said]
