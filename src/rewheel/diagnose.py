"""The root cause of a crash, from its log: `rewheel why` and every failed run's report.

A vLLM crash buries its real error under cascades: the worker that raised is followed by
"WorkerProc was terminated" on every other rank, the engine core's "WorkerProc
initialization failed ... See stack trace for root cause", the API server's "Engine core
initialization failed. See root cause above", and with `Restart=always` the same again for
every restart. This module reads such a log as users have it — plain vLLM output, journald
lines (`Feb 20 23:31:36 host vllm-kimi[216054]: ...` or `journalctl -o json`), process
prefixes (`(Worker_TP4 pid=216061) `), ANSI colours, a logger header on every traceback
line, several processes' tracebacks interleaved, chained exceptions, truncated logs — and
names the root exception, the failing rank, the deepest frame inside the upgraded package,
where in the log it starts, how often it repeats, and the secondary errors it caused.

It also reads logs as people collect and paste them: collector wrappers on every line
(docker compose, `kubectl logs --prefix`, CI timestamps, journald's output modes, syslog,
`srun -l`, `\r` progress bars) are stripped and what they name kept as the process's node;
damaged pastes (colour codes that lost ESC, right padding, frame lines without quotes);
other runtimes' shapes (sglang's mid-line tracebacks, Ray's RayTaskError wrappers unwrapped
to the remote exception and its frames, IPython, pytest's `E   ` lines, torchrun).

Design:
- Streaming and bounded. Lines are demultiplexed into streams (journald pid, process
  label and pid, logger-header or raw); each stream holds at most one traceback in flight,
  capped in frames and message size; completed tracebacks are folded into per-signature
  aggregates and per-crash ("epoch") lists that are capped too. The whole log is never held.
- Fast on large files. `analyse_file` reads 1 MiB binary chunks and jumps between
  occurrences of "Traceback (most recent call last)" with `bytes.find` (C speed); only
  lines near an in-flight traceback are decoded and parsed. Line numbers are resolved at
  the end by one newline-counting pass up to the furthest reported position. Only when no
  traceback explains the crash does it re-read the file line by line for error lines
  (CUDA/NCCL/OOM/undefined-symbol/...), which tracebacks make unnecessary otherwise.
- Ranking. Cascade exceptions (see `CASCADE_*`) are secondary. The root is the earliest
  non-cascade exception logged at error level (or raw) in the first crash that has one;
  within a chain the original exception, unless it is a cascade or a bare lookup failure
  (KeyError, StopIteration, IndexError) that the code turned into a more telling error.
  Failing that: the strongest error line, then warning-level tracebacks, then cascades.
"""

from __future__ import annotations

import io
import json
from collections import deque
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from rewheel import proc
from rewheel.errors import CommandNotFound, UsageError

# ---------------------------------------------------------------------------------------
# Limits: what keeps memory bounded however large or hostile the log is.
MAX_MESSAGE_LINES = 40          # continuation lines of one exception message
MAX_MESSAGE_CHARS = 8000
MAX_CHAIN = 8                   # exceptions in one chain
MAX_FRAMES_KEPT = 64            # innermost frames kept of one exception (for the suspects)
MAX_SOURCE_RUN = 20             # unindented lines read as one frame's source, at most
MAX_STREAMS = 512               # concurrent in-flight tracebacks
MAX_EPOCH_OCCURRENCES = 400     # occurrences kept for one crash
MAX_SIGNATURES = 5000
MAX_PROCS_PER_SIG = 10000
MAX_SECONDARY = 20
IDLE_CLOSE_LINES = 1000         # an in-flight traceback untouched this long is closed
EARLY_LINES = 1000              # a traceback cut off at the log's start is recognised here
CHUNK = 1 << 20
MAX_LINE_BYTES = 1 << 20        # longer "lines" are cut (journald's own LineMax is 48 KiB)

TB_NEEDLE = b"Traceback (most recent call last)"

# ---------------------------------------------------------------------------------------
# Line anatomy.
ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# Colour codes whose ESC byte was lost on the way into a paste ("[1;36m(VllmWorker ...)").
BARE_SGR_RE = re.compile(r"\[[0-9;]{0,15}m")
JOURNAL_RE = re.compile(
    r"(?:<\d{1,3}>)?"                                        # a syslog priority, in syslog files
    r"(?:[A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d(?:\.\d+)?"     # short, short-precise, syslog
    # short-iso(-precise): journald writes the offset (+0000); a bare Z is a CI runner's stamp
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:?\d\d)?"
    r"|\[ *\d+\.\d+\]|\d{9,11}\.\d+"                         # short-monotonic, short-unix
    r"|[A-Z][a-z]{2} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? [A-Z][A-Za-z0-9+\-]{0,5})"  # short-full, with-unit
    # (a host is never a log level: "2025-08-12 07:37:57,002 INFO x.py:21 -- ..." is a logger's line)
    r" (?!(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b)(?P<host>[^\s:()\[\]]+)"
    r" (?P<ident>[^\s\[\]:()]+)(?:\[(?P<pid>\d+)\])?: ?")
# Collector wrappers: what a log collector puts before each line of a process's output.
# Each is stripped (any mix, in any order) and what it names is kept as the line's node.
WRAPPER_RE = re.compile(
    # RFC 5424 syslog: <PRI>1 TIMESTAMP HOST APP PID MSGID SD MSG
    r"<\d{1,3}>1 \S+ (?P<s_host>\S+) (?P<s_app>\S+) (?P<s_pid>\d+|-) \S+ (?:-|\[.*?\]) "
    # CI runners: 2025-07-28T15:07:00.9685040Z (GitLab adds a stream tag, 00O / 01E+)
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z(?: \d\d[OE]\+?)?(?: |$)"
    # kubectl logs --prefix: [pod/NAME/CONTAINER]
    r"|\[pod/(?P<k_pod>[^/\]\s]+)/(?P<k_container>[^\]\s]+)\](?: |$)"
    # docker compose: service-1  | (padded to the longest service name)
    r"|(?P<d_service>[A-Za-z0-9][\w.\-]*) +\|(?: |$)"
    # srun -l: the task number
    r"|(?P<task>\d{1,5}):(?: |$)"
    # a log quoted in a reply (markdown / e-mail): "> ", "> > "
    r"|(?P<quote>(?:> ?)+)")
PROC_RE = re.compile(r"\((?:(?P<label>[A-Za-z][^()]*?) )?pid=(?P<pid>\d+)(?:, ip=(?P<ip>[^,)\s]*)[^)]*)?\) ?")
# Ray's de-duplication of lines printed by many workers
RAY_REPEAT_RE = re.compile(r"\s*\[repeated \d+x across cluster\]$")
# faulthandler's dump after "Fatal Python error: ...": a thread header, then its frames
# innermost first ("  File "x.py", line 12 in f")
FAULT_THREAD_RE = re.compile(r"(?P<current>Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):")
FAULT_FRAME_RE = re.compile(r'\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
# C++: std::terminate's report of an uncaught exception, and its what() on the next line
TERMINATE_RE = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']+)'")
WHAT_RE = re.compile(r"\s*what\(\):\s+(?P<msg>.*)$")
# pytest --tb=short: `path.py:LINE: in func` before each frame's source line
PYTEST_SHORT_RE = re.compile(r"(?P<file>[^\s:][^:]*\.py):(?P<line>\d+): in (?P<func>[\w<>.]+)$")
RANK_RE = re.compile(r"\[rank(?P<rank>\d+)\]: ?")
# sglang's logger header: [2025-07-28 15:07:00 DP0 TP1] (ranks absent in the main process)
SGLANG_RE = re.compile(r"\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:\.\d+)?(?P<ranks>(?: (?:DP|TP|PP|EP|CP)\d+)*)\] ")
HEADER_RE = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) +\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?"
    r" (?:\[[^\]]*\]|[\w.\-]+:\d+\]) ?")
# A frame line; pastes that lost the quotes ("File /x.py, line 5, in f") are frames too.
# (Pastes that lost their indentation have them at column 0: read there only inside a traceback.)
FRAME_RE = re.compile(r'\s*File (?:"(?P<file>[^"]+)"|(?P<bare>[^\s",][^",]*)), line (?P<line>\d+)(?:, in (?P<func>.+))?$')
# Statements that can be a frame's source line but look like a bare exception name
NOT_EXCEPTIONS = {"return", "pass", "break", "continue", "raise", "yield", "else", "try", "finally"}
TB_HEAD = "Traceback (most recent call last)"
ESCAPED_TB = TB_HEAD + ":\\n"     # the same, inside an escaped string: its newlines are "\n"
# Ray's wrapper of a remote task's exception; the remote frames and exception follow it.
RAY_WRAP_RE = re.compile(
    r"(?:ray\.exceptions\.)?Ray(?:Task|Actor)Error(?:\((?P<inner>[\w.]+)\))?: ray::(?P<actor>[\w.]+?)"
    r"(?:\.(?P<method>[\w]+)\(\))? \(pid=(?P<pid>\d+)(?:, ip=(?P<ip>[^,)\s]+))?")
# A tqdm bar that another writer's line was glued to ("...| 5/10 [00:01<00:01, 3.2it/s]ERROR ...").
TQDM_TAIL_RE = re.compile(r".*?\d+%(?:\|[^|]*\|| Completed \|)[^\[\]]*\[[^\]]*\]")
# IPython / Jupyter tracebacks.
IPY_HEAD_RE = re.compile(r"(?P<type>[A-Za-z_][\w.]*)\s{2,}$")
IPY_FRAME_RE = re.compile(
    r"(?:\[(?P<f1>[^\]]+)\]\([^)]*\)|File (?P<f2>\S.*?):(?P<l2>\d+),|(?P<f3>(?:/|~|[A-Za-z]:\\|<ipython-input)\S*)"
    r"|Input In \[\d+\],)"
    r" in (?P<func>[^(]+)\(|Cell In ?\[\d+\], line (?P<l4>\d+)")
IPY_SKIP_RE = re.compile(r"\d+ frames?$|\[\.\.\. skipping|\.\.\.$")
IPY_ARROW_RE = re.compile(r"-*> ?(?P<line>\d+) ?(?P<src>.*)$")
# pytest: the exception's `E   ` lines and the `path.py:LINE: Type` location after them.
PYTEST_E_RE = re.compile(r"E(?: {3,}|\t)(?P<text>.*)$")
PYTEST_LOC_RE = re.compile(r"(?P<file>[^\s:][^:]*\.py):(?P<line>\d+): (?P<what>.*)$")
PYTEST_DEF_RE = re.compile(r"\s*(?:async )?def (?P<name>\w+)\(")
# torchrun's failure summary: the fields that name the failed process.
ELASTIC_RE = re.compile(r"\s+(?P<key>host|rank|exitcode|traceback)\s*: (?P<value>.+)$")
ELASTIC_RANK_RE = re.compile(r"(\d+)")
ELASTIC_PID_RE = re.compile(r"\(pid: (\d+)\)")
# Functions of a shutdown or clean-up path: a traceback through them after a failure is its
# consequence, not its cause.
SHUTDOWN_FUNCS = {"shutdown", "_shutdown", "__del__", "cleanup", "_cleanup", "close_all", "atexit_handler",
                  "_exit_function", "destroy_process_group", "destroy_model_parallel",
                  "destroy_distributed_environment", "_python_exit", "terminate"}
EXC_RE = re.compile(r"(?P<type>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?::(?: (?P<msg>.*))?)?$")
CHAIN_CONTEXT = "During handling of the above exception, another exception occurred:"
CHAIN_CAUSE = "The above exception was the direct cause of the following exception:"
# Lines that start a new record, so they end an exception message instead of continuing it.
RECORD_START_RE = re.compile(
    r"(?:Process [\w\-]+:$|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL):\s|\[[WEIF]\d{4} |\[rank\d+\]:\["
    r"|\S+\.py:\d+: \w*Warning|\s*warnings\.warn\(|\d{4}-\d\d-\d\d[ T]\d\d:\d\d|\[\d{4}-\d\d-\d\d"
    r"|Exception ignored in|Fatal Python error|Current thread 0x|Thread 0x|\S+ \[\d+\] NCCL "
    # rewheel's own annotations in the logs it keeps (smoke.log: "[rewheel] smoke failed: ...")
    r"|\[rewheel\] "
    # torchrun's failure summary, drawn between rules
    r"|={20,}$"
    # the smoke runner's own status lines after the error it reports ("vllm_init: FAILED ...")
    r"|\w+: (?:FAILED\b|timings |OK: )"
    # systemd's own lines about the unit, when journald prefixes were stripped (`-o cat`)
    r"|[\w@.\-]+\.service: |(?:Started|Stopped|Starting|Stopping|Failed to start) [\w@.\-]+\.service)")
IGNORABLE_IN_TB_RE = re.compile(r"(?:INFO|WARNING|DEBUG):\s|\S+:\s+\d+%\|")
# Python 3.11+ exception groups (asyncio.TaskGroup): the group's traceback is drawn inside
# `| ` margins, `+ Exception Group Traceback` opens it, `+-+---- 1 ----` / `+---- 2 ----`
# separate the sub-exceptions and `+------` closes the group.
EG_START_RE = re.compile(r"\s*\+ Exception Group Traceback \(most recent call last\):?\s*$")
EG_MARGIN_RE = re.compile(r"\s*\|(?: |$)")
EG_SEP_RE = re.compile(r"\s*\+(?:-\+)?-+ (?:\d+|\.\.\.) -+\s*$")
EG_END_RE = re.compile(r"\s*\+-{8,}\s*$")
GROUP_TYPES = {"ExceptionGroup", "BaseExceptionGroup"}

# ---------------------------------------------------------------------------------------
# What is a cascade (a consequence of another failure, never the root).
CASCADE_TYPES = {
    "SystemExit", "KeyboardInterrupt", "EOFError", "BrokenPipeError", "ConnectionResetError",
    "ConnectionAbortedError", "CancelledError", "asyncio.CancelledError",
    "asyncio.exceptions.CancelledError", "concurrent.futures._base.CancelledError",
    "EngineDeadError", "EngineGenerateError", "AsyncEngineDeadError",
    # torchrun's summary of a child that failed: the child's own error is the cause
    "ChildFailedError",
}
CASCADE_MESSAGE_RE = re.compile(
    r"WorkerProc initialization failed|Engine core initialization failed|See root cause above"
    r"|See stack trace for root cause|stack trace above for the (?:root|actual) cause"
    r"|See stack trace \(above\) for the root cause|EngineCore encountered (?:an issue|a fatal error)"
    r"|^Executor failed\.?$|Background loop has errored already|Task finished unexpectedly"
    r"|died unexpectedly|WorkerProc was terminated|Engine process failed to start"
    r"|Context was terminated|Socket operation on non-socket", re.I)
LOOKUP_TYPES = {"KeyError", "StopIteration", "IndexError"}

# Error lines (no traceback). Scores: 3 strong evidence, 2 an error, 1 a cascade symptom.
STRONG_LINE_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"killed by the OOM killer|oom-kill|Out of memory: Killed process", re.I), "out of memory (OOM killer)"),
    (re.compile(r"CUDA out of memory|OutOfMemoryError|No available memory for the cache blocks"
                r"|larger than the available KV cache memory|cudaErrorMemoryAllocation", re.I), "out of memory"),
    (re.compile(r"undefined symbol", re.I), "undefined symbol"),
    (re.compile(r"no kernel image is available|is not compatible with the current PyTorch installation"
                r"|cudaErrorNoKernelImageForDevice|unsupported GPU architecture|sm_\d+ is not supported", re.I),
     "unsupported GPU architecture"),
    (re.compile(r"\bNCCL (?:WARN|error)|nccl\w*Error|ncclSystemError|NCCL_ERROR"
                r"|Watchdog caught collective operation timeout|ProcessGroupNCCL.*terminated with exception", re.I),
     "NCCL error"),
    (re.compile(r"CUDA error|illegal memory access|CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|cudaError\w+", re.I), "CUDA error"),
    (re.compile(r"Segmentation fault|Fatal Python error|core dumped|code=dumped|status=\d+/(?:SEGV|ABRT|BUS|ILL|KILL)"
                r"|Signal \d+ \(SIG\w+\) received by PID"
                r"|Failed with result '(?:signal|core-dump)'|Bus error|Aborted \(core", re.I), "fatal signal"),
]
CASCADE_LINE_RE = re.compile(
    r"died unexpectedly|WorkerProc was terminated|WorkerProc failed to start|WorkerProc failed\.?$"
    r"|WorkerProc hit an exception|EngineCore failed to start|Engine core initialization failed"
    r"|EngineCore encountered|Main process exited|Failed with result|Start request repeated too quickly"
    r"|Failed to start|Scheduled restart job|: FAILED during |ChildFailedError", re.I)
EXC_LINE_RE = re.compile(r"(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Fault)): (?P<msg>.+)")
# Cheap per-line prefilter when every line passes through (analyse_lines, journals).
PREFILTER_RE = re.compile(
    r"Traceback|File \"|rror|RROR|xception|CRITICAL|[Kk]illed|NCCL|out of memory|dumped|Abort"
    r"|fault|Failed|died unexpectedly|terminated|Interrupt|SystemExit|undefined symbol"
    r"|not compatible|kernel image|oom|terminate called|what\(\)|Current thread|Thread 0x")


def _prefilter(line: str) -> bool:
    """Whether a line can matter outside a traceback: the regex above, or (cheap `in` tests
    first) pytest's `E   ` lines, `def` lines and `path.py:N: in f` locations, and
    torchrun's summary fields."""
    return bool(PREFILTER_RE.search(line)) or line.startswith("E   ") or "def " in line \
        or ": in " in line or " : " in line


# ---------------------------------------------------------------------------------------
# Results.
@dataclass
class Frame:
    file: str
    line: int
    function: str | None
    source: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function, "source": self.source}

    def short(self) -> str:
        return f"{short_path(self.file)}:{self.line}" + (f" in {self.function}" if self.function else "")

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Frame:
        """The frame `to_json` wrote (a bisection's journaled verdict keeps it so)."""
        return cls(doc["file"], doc["line"], doc.get("function"), doc.get("source"))


@dataclass
class Secondary:
    type: str | None
    message: str
    rank: str | None
    log_line: int | None
    count: int
    relation: str  # "chained" | "cascade" | "later" | "earlier"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "rank": self.rank,
                "log_line": self.log_line, "count": self.count, "relation": self.relation}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Secondary:
        return cls(doc.get("type"), doc.get("message") or "", doc.get("rank"), doc.get("log_line"),
                   doc.get("count", 1), doc.get("relation", "later"))


@dataclass
class RootCause:
    type: str | None
    message: str
    rank: str | None
    frame: Frame | None
    log_line: int | None
    kind: str  # "traceback" | "error-line"
    count: int
    restarts: int
    secondary: list[Secondary] = field(default_factory=list)
    # The failing process as the log names it: its pid, and the node it ran on (an IP, a
    # host, a pod or container from a collector's wrapper); None where the log has none.
    pid: int | None = None
    node: str | None = None
    # The root exception's frames, innermost first (bounded); not serialised: the frame
    # above is the one reported, these feed the suspects.
    frames: list[Frame] = field(default_factory=list, repr=False, compare=False)
    # Which changes of an upgrade the crash points at (`rewheel.suspects`), when known.
    suspects: list[Any] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "rank": self.rank,
                "frame": self.frame.to_json() if self.frame else None, "log_line": self.log_line,
                "kind": self.kind, "count": self.count, "restarts": self.restarts,
                "secondary": [s.to_json() for s in self.secondary],
                "pid": self.pid, "node": self.node,
                "suspects": [s.to_json() if hasattr(s, "to_json") else s for s in self.suspects]}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RootCause:
        """The root cause `to_json` wrote, read back where it was kept as JSON (a bisection's
        journal): `from_json(rc.to_json()).to_json() == rc.to_json()`. Keys an older rewheel
        did not write take their defaults."""
        frame = doc.get("frame")
        return cls(doc.get("type"), doc.get("message") or "", doc.get("rank"),
                   Frame.from_json(frame) if frame else None, doc.get("log_line"),
                   doc.get("kind", "traceback"), doc.get("count", 1), doc.get("restarts", 1),
                   [Secondary.from_json(s) for s in doc.get("secondary") or [] if isinstance(s, dict)],
                   pid=doc.get("pid"), node=doc.get("node"),
                   suspects=[_suspect_from_json(s) for s in doc.get("suspects") or [] if isinstance(s, dict)])


def _suspect_from_json(doc: dict[str, Any]) -> Any:  # suspects.Suspect
    from rewheel.suspects import Suspect

    return Suspect.from_json(doc)


@dataclass
class Diagnosis:
    root: RootCause | None
    source: str = ""
    lines: int | None = None        # lines read, when known (files analysed fast: None)
    tracebacks: int = 0             # tracebacks seen (duplicates included)

    def to_json(self) -> dict[str, Any]:
        return {"root_cause": self.root.to_json() if self.root else None}

    def summary(self) -> str:
        """One line for run reports."""
        r = self.root
        if r is None:
            where = f" in {self.source}" if self.source else ""
            return f"no error found{where}"
        head = f"{r.type}: {first_line(r.message)}" if r.type else first_line(r.message)
        if r.kind == "error-line":
            head = f"error line: {first_line(r.message)}"
        bits = []
        if r.rank:
            bits.append(r.rank)
        if r.frame:
            bits.append(r.frame.short())
        if r.log_line:
            bits.append(f"log line {r.log_line}")
        if r.count > 1:
            bits.append(f"seen in {r.count} processes")
        if r.restarts > 1:
            bits.append(f"{r.restarts} restarts")
        return head + (f" ({'; '.join(bits)})" if bits else "")


def first_line(text: str, limit: int = 240) -> str:
    line = text.split("\n", 1)[0].strip()
    return line if len(line) <= limit else line[: limit - 1] + "…"


def short_path(path: str) -> str:
    """`/root/ml-env/lib/python3.12/site-packages/vllm/x.py` -> `vllm/x.py`."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return path


# ---------------------------------------------------------------------------------------
# Internal state.
@dataclass
class _Exc:
    type: str | None
    message_lines: list[str]
    pos: int                          # where this exception's traceback starts
    frames: int = 0
    last_frame: Frame | None = None
    last_pkg_frame: Frame | None = None
    chars: int = 0
    shutdown: bool = False            # a frame of a shutdown / clean-up path
    frame_list: deque[Frame] = field(default_factory=lambda: deque(maxlen=MAX_FRAMES_KEPT))
    wrapper: bool = False             # Ray's RayTaskError line: the remote frames follow

    @property
    def message(self) -> str:
        return "\n".join(self.message_lines).rstrip()


@dataclass
class _Stream:
    key: tuple
    label: str | None
    pid: int | None
    jpid: int | None
    ident: str | None
    level: str | None
    state: str = "frames"             # frames | msg | after | chain | group
    chain: list[_Exc] = field(default_factory=list)
    cur: _Exc | None = None
    pending: Frame | None = None      # frame awaiting its source line
    chained_marker: bool = False
    last_tick: int = 0
    truncated_start: bool = False
    msg_header: str = ""              # logger header of the exception line
    node: str | None = None
    indent: int | None = 0            # leading spaces of this traceback (None: not known yet)
    ipython: bool = False             # IPython/Jupyter frames ("---> 15")
    pytest: bool = False              # pytest's `E   ` lines
    remote: tuple[str, int, str | None] | None = None  # Ray's remote process: name, pid, ip
    source_run: int = 0               # unindented source lines in a row (a paste without indentation)


@dataclass
class _Occ:
    kind: str                         # "traceback" | "error-line"
    category: int                     # lower is better, see _CATEGORY_*
    type: str | None
    message: str
    sig: tuple
    rank: str | None
    pos: int
    frame: Frame | None
    chained: list[tuple[str | None, str, int]]  # other chain members: (type, message, pos)
    cascade: bool
    pid: int | None = None
    node: str | None = None
    frames: list[Frame] = field(default_factory=list)


# Categories, in order of preference for the root.
# A clean `Type: message` line (no traceback) beats a keyword found in prose.
_TB_ERROR, _LINE_EXC, _LINE_STRONG, _TB_WARN, _TB_CASCADE, _LINE_ERROR, _LINE_CASCADE = range(7)


def _norm_sig(type_: str | None, message: str) -> tuple:
    text = first_line(message, 400)
    text = re.sub(r"0x[0-9a-fA-F]+", "0x", text)
    text = re.sub(r"\d+(?:\.\d+)?", "N", text)
    return (type_ or "", text)


def _is_cascade(type_: str | None, message: str) -> bool:
    if type_:
        if type_ in CASCADE_TYPES or type_.rsplit(".", 1)[-1] in CASCADE_TYPES:
            return True
    return bool(CASCADE_MESSAGE_RE.search((message or "")[:2000]))


def _in_package(path: str, package: str | None) -> bool:
    if not package:
        return False
    return f"/{package}/" in path.replace("\\", "/")


class _Analyser:
    """Push-based: feed() lines, finish() for the Diagnosis. Positions (`pos`) are opaque
    ints that grow with the input — line numbers, or byte offsets resolved at the end."""

    def __init__(self, package: str | None, *, error_lines: bool = True) -> None:
        # An import name ("vllm", "flashinfer") or a dotted one; distribution-style dashes
        # are read as underscores ("flash-attn" -> "flash_attn").
        self.package = package.replace(".", "/").replace("-", "_") if package else None
        self.error_lines = error_lines
        self.streams: dict[tuple, _Stream] = {}
        self.tick = 0
        self.tracebacks = 0
        # epochs (one per service start / crash)
        self.epoch_of_jpid: dict[int, int] = {}
        self.epoch = -1
        self._epochs_seen = -1
        self.epoch_labels: dict[str, int | None] = {}
        self.epoch_terminal = False
        self.epoch_unlabeled_died = False
        self.cur_list: list[_Occ] = []
        self.first: dict[int, tuple[int, list[_Occ]]] = {}   # category -> (epoch, its list)
        self.lists: dict[int, list[_Occ]] = {}
        # signature aggregates
        self.sig_procs: dict[tuple, set] = {}
        self.sig_epochs: dict[tuple, set] = {}
        self.sig_first: dict[tuple, int] = {}
        self.bare: _Stream | None = None      # the traceback that began mid-line, if open
        self.last_def: str | None = None      # pytest: the last `def f(` shown
        self.pytest_frames: deque[Frame] = deque(maxlen=MAX_FRAMES_KEPT)  # --tb=short locations
        self.terminate: tuple[str, int] | None = None  # C++ terminate awaiting its what()
        self.elastic: dict[str, str | None] = {}       # torchrun's summary fields so far
        self.fault: _Occ | None = None                  # a fatal error awaiting faulthandler's frames
        self.fault_thread: str | None = None            # "current" | "other": the dump being read
        self.fault_frames: dict[str | None, list[Frame]] = {}

    # -- public --------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self.streams)

    def feed(self, raw: str, pos: int, *, jpid: int | None = None, ident: str | None = None,
             early: bool = False, node: str | None = None, _escaped: bool = False) -> None:
        self.tick += 1
        # Right padding (terminal copies), CRLF, and `\r` progress bars: what a terminal shows
        # is the text after the last carriage return.
        line = raw.rstrip()
        if "\r" in line:
            line = _after_carriage(line)
        if line.endswith("across cluster]"):
            line = RAY_REPEAT_RE.sub("", line)
        if "\x1b" in line:
            line = ANSI_RE.sub("", line)
        if "m" in line and "[" in line:
            line = BARE_SGR_RE.sub("", line)
        if jpid is None and line.startswith('{"') and '"MESSAGE"' in line:
            self._feed_json(line, pos, early)
            return
        if ESCAPED_TB in line and not _escaped:
            # a traceback inside one escaped string (a JSON log field, a repr): its lines
            for part in _escaped_traceback(line).split("\n")[:MAX_MESSAGE_LINES * 50]:
                self.feed(part, pos, jpid=jpid, ident=ident, early=early, node=node, _escaped=True)
            return
        task: str | None = None
        for _ in range(6):
            c = line[:1]
            if not (c.isalnum() or c in "<[>"):
                break
            if jpid is None:
                m = JOURNAL_RE.match(line)
                if m:
                    ident = m.group("ident")
                    jpid = int(m.group("pid")) if m.group("pid") else None
                    node = node or m.group("host")
                    line = line[m.end():]
                    continue
            m = WRAPPER_RE.match(line)
            if not m:
                break
            if m.group("task") is not None:
                task = task or m.group("task")
            elif m.group("quote") is not None:
                pass
            else:
                node = m.group("k_pod") or m.group("d_service") or m.group("s_host") or node
                if m.group("s_pid") and m.group("s_pid") != "-" and jpid is None:
                    jpid = int(m.group("s_pid"))
            line = line[m.end():]
        label: str | None = None
        pid: int | None = None
        for _ in range(2):
            if line.startswith("("):
                m = PROC_RE.match(line)
                if m:
                    name = (m.group("label") or "").strip()
                    label = _rank_name(name, m.group("pid"), m.group("ip")) if name else f"pid={m.group('pid')}"
                    pid = int(m.group("pid"))
                    node = m.group("ip") or node
                    line = line[m.end():]
                    continue
            break
        if line.startswith("[rank"):
            m = RANK_RE.match(line)
            if m:
                label = label or f"rank{m.group('rank')}"
                line = line[m.end():]
        level: str | None = None
        header = ""
        if line[:1] in ("D", "I", "W", "E", "C"):
            m = HEADER_RE.match(line)
            if m:
                level = m.group("level")
                header = m.group(0)
                line = line[m.end():]
        elif line.startswith("[") and line[1:2].isdigit():
            m = SGLANG_RE.match(line)
            if m:
                header = m.group(0)
                label = label or (m.group("ranks").strip() or None)
                line = line[m.end():]
        if task is not None and label is None:
            label = f"rank{task}"
        key = (jpid, label, pid, level is not None, node)
        st = self.streams.get(key)
        bare = self.bare
        if bare is not None and st is None and not header and label is None:
            # Lines without a prefix continue the traceback that began mid-line in a
            # prefixed record (sglang prints the whole traceback as one record).
            st = bare if bare.key in self.streams else None
        elif bare is not None and bare.key != key and bare.state in ("msg", "after", "chain") \
                and bare.key in self.streams and (header or label):
            # another writer's record: the message of the mid-line traceback has ended
            self._finish_stream(bare)
        if st is not None and st.indent:
            ind = st.indent
            if line[:ind].isspace() and len(line) > ind:
                line = line[ind:]
        if line[:1] in (" ", "|", "+"):
            line, group_mark = _ungroup(line)
            if group_mark and st is not None:
                st.last_tick = self.tick
                if group_mark == "sep":
                    # the next sub-exception: chained after the group (and its siblings)
                    st.chained_marker = True
                    st.state = "group"
                return
        if st is not None:
            st.last_tick = self.tick
            if self._continue(st, line, pos, header):
                self._expire()
                return
            st = None
        if line.startswith(TB_HEAD):
            self._open(key, label, pid, jpid, ident, level, pos, node)
            self._expire()
            return
        if TB_HEAD in line:
            before = line[: line.index(TB_HEAD)]
            ipy = IPY_HEAD_RE.match(before)
            if ipy:
                # IPython: "ValueError        Traceback (most recent call last)"
                st = self._open(key, label, pid, jpid, ident, level, pos, node)
                st.ipython = True
                assert st.cur is not None
                st.cur.type = ipy.group("type")
            else:
                # "Scheduler hit an exception: Traceback ...", torchrun's "traceback : Traceback
                # ...", " at Traceback ...": the rest follows without the record's prefix and
                # indented by however much the first frame line says.
                bkey = (jpid, None, None, False, node)
                old = self.streams.get(bkey)
                if old is not None:
                    self._finish_stream(old, truncated_end=old.state == "frames")
                st = self._open(bkey, label, pid, jpid, ident, level, pos, node)
                st.indent = None
                self.bare = st
            self._expire()
            return
        if early and FRAME_RE.match(line) and line.startswith("  File "):
            st = self._open(key, label, pid, jpid, ident, level, pos, node)
            st.truncated_start = True
            self._continue(st, line, pos, header)
            self._expire()
            return
        if line[:1] == "E" and PYTEST_E_RE.match(line):
            st = self._open(key, label, pid, jpid, ident, level, pos, node)
            st.pytest = True
            self._continue(st, line, pos, header)
            self._expire()
            return
        if line[:1] in (" ", "a", "d") and "def " in line:
            m = PYTEST_DEF_RE.match(line)
            if m:
                self.last_def = m.group("name")
        elif ": in " in line:
            m = PYTEST_SHORT_RE.match(line)
            if m:
                self.pytest_frames.append(Frame(m.group("file"), int(m.group("line")), m.group("func")))
        if self.streams:
            self._expire()
        if self.error_lines:
            self._error_line(line, pos, level, label, pid, jpid, ident, node)

    def _feed_json(self, line: str, pos: int, early: bool) -> None:
        """A `journalctl -o json` line in a file: its MESSAGE, with the entry's pid and host."""
        try:
            entry = json.loads(line)
        except ValueError:
            return
        if not isinstance(entry, dict):
            return
        msg = entry.get("MESSAGE")
        if isinstance(msg, list):  # journald's form for messages that are not UTF-8
            try:
                msg = bytes(msg).decode("utf-8", "replace")
            except (TypeError, ValueError):
                return
        if not isinstance(msg, str):
            return
        try:
            jpid = int(entry["_PID"]) if entry.get("_PID") is not None else 0
        except (TypeError, ValueError):
            jpid = 0
        ident = entry.get("SYSLOG_IDENTIFIER")
        host = entry.get("_HOSTNAME")
        for part in msg.split("\n")[:MAX_MESSAGE_LINES * 50]:
            self.feed(part, pos, jpid=jpid, ident=ident if isinstance(ident, str) else None,
                      early=early, node=host if isinstance(host, str) else None)

    def finish(self, resolve: Callable[[list[int]], dict[int, int]] | None = None,
               source: str = "", lines: int | None = None) -> Diagnosis:
        for st in list(self.streams.values()):
            self._close(st, truncated_end=st.state == "frames")
        self.streams.clear()
        root = self._choose()
        if root is None:
            return Diagnosis(None, source, lines, self.tracebacks)
        occ, epoch_list = root
        positions = [occ.pos] + [o.pos for o in epoch_list] + [c[2] for c in occ.chained]
        mapping = resolve(positions) if resolve else {p: p for p in positions}
        secondary = self._secondaries(occ, epoch_list, mapping)
        procs = self.sig_procs.get(occ.sig, set())
        epochs = self.sig_epochs.get(occ.sig, set())
        rc = RootCause(type=occ.type, message=occ.message, rank=occ.rank, frame=occ.frame,
                       log_line=mapping.get(occ.pos), kind=occ.kind, count=max(1, len(procs)),
                       restarts=max(1, len(epochs)), secondary=secondary, pid=occ.pid, node=occ.node,
                       frames=occ.frames)
        return Diagnosis(rc, source, lines, self.tracebacks)

    # -- tracebacks -------------------------------------------------------------------
    def _open(self, key: tuple, label: str | None, pid: int | None, jpid: int | None,
              ident: str | None, level: str | None, pos: int, node: str | None = None) -> _Stream:
        if len(self.streams) >= MAX_STREAMS:
            oldest = min(self.streams.values(), key=lambda s: s.last_tick)
            self._close(oldest, truncated_end=oldest.state == "frames")
            del self.streams[oldest.key]
        st = _Stream(key, label, pid, jpid, ident, level, last_tick=self.tick, node=node)
        st.cur = _Exc(None, [], pos)
        self.streams[key] = st
        return st

    def _continue(self, st: _Stream, line: str, pos: int, header: str = "") -> bool:
        """Feed one line of this stream's traceback. False: the line is not part of it
        (the traceback was closed and the caller treats the line afresh)."""
        if st.state == "frames":
            if self._frames(st, line, pos):
                if st.state == "msg":
                    st.msg_header = header
                return True
            return False
        if st.state == "msg":
            if st.pytest:
                return self._pytest_msg(st, line, pos)
            exc = st.cur
            assert exc is not None
            if exc.wrapper and header == st.msg_header:
                # Ray: carets under the wrapper line, then the remote process's frames
                text = line.strip()
                if not text or _decoration(text):
                    return True
                if FRAME_RE.match(line):
                    st.cur = _Exc(exc.type, [], exc.pos)
                    st.state = "frames"
                    return self._frames(st, line, pos)
            if header != st.msg_header:
                # Every line of one logger record carries the same header; another header
                # is another record, so the message has ended.
                self._finish_stream(st)
                return False
            if line.startswith("Traceback (most recent call last)"):
                return self._next_traceback(st, pos)
            if not line.strip():
                st.state = "after"
                return True
            if line in (CHAIN_CONTEXT, CHAIN_CAUSE):
                st.chained_marker = True
                st.state = "chain"
                return True
            if RECORD_START_RE.match(line) or FRAME_RE.match(line):
                self._finish_stream(st)
                return False
            if len(exc.message_lines) < MAX_MESSAGE_LINES and exc.chars < MAX_MESSAGE_CHARS:
                exc.message_lines.append(line.rstrip())
                exc.chars += len(line)
                return True
            self._finish_stream(st)
            return False
        if st.state == "group":
            # After a sub-exception separator: its traceback, or (none) its exception line.
            if not line.strip():
                return True
            self._next_traceback(st, pos)
            if line.startswith("Traceback (most recent call last)"):
                return True
            return self._frames(st, line, pos)
        if st.state in ("after", "chain"):
            if not line.strip():
                return True
            if line in (CHAIN_CONTEXT, CHAIN_CAUSE):
                st.chained_marker = True
                st.state = "chain"
                return True
            if line.startswith("Traceback (most recent call last)"):
                return self._next_traceback(st, pos)
            self._finish_stream(st)
            return False
        return False

    def _frames(self, st: _Stream, line: str, pos: int) -> bool:
        exc = st.cur
        assert exc is not None
        if st.ipython and self._ipython_frame(st, exc, line):
            return True
        if st.pytest:
            return self._pytest_msg(st, line, pos)
        if line.startswith(" "):
            m = FRAME_RE.match(line)
            if m:
                if st.indent is None:
                    # a traceback that began mid-line: its lines are indented like this one
                    st.indent = max(0, len(line) - len(line.lstrip(" ")) - 2)
                    line = line[st.indent:]
                fr = Frame(m.group("file") or m.group("bare").strip(), int(m.group("line")),
                           _func(m.group("func")))
                self._add_frame(st, exc, fr)
                return True
            text = line.strip()
            if st.pending is not None and text and not _decoration(text):
                st.pending.source = text[:500]
                st.pending = None
            return True
        if not line.strip():
            return True
        if line.startswith("Traceback (most recent call last)"):
            # A traceback restarted before this one ended: keep what we had, start anew.
            self._finish_stream(st, truncated_end=True)
            self._reopen(st, pos)
            return True
        if IGNORABLE_IN_TB_RE.match(line):
            return True
        if line.lstrip("\t").startswith("File "):
            # a paste that lost its indentation (or has tabs for it): frames at column 0 ...
            m = FRAME_RE.match(line)
            if m:
                self._add_frame(st, exc, Frame(m.group("file") or m.group("bare").strip(), int(m.group("line")),
                                               _func(m.group("func"))))
                return True
        text = line.strip()
        if _decoration(text):
            return True
        if (st.pending is not None or 0 < st.source_run < MAX_SOURCE_RUN) and not _exception_line(line):
            # ... and so are their source lines (a statement may span several)
            if st.pending is not None:
                st.pending.source = text[:500]
                st.pending = None
            st.source_run += 1
            return True
        ray = RAY_WRAP_RE.match(line) if "Ray" in line[:40] else None
        m = EXC_RE.match(line)
        if ray:
            # Ray's wrapper of a remote failure: unwrap to the remote exception; its frames
            # and its own exception line follow, in the remote process (pid, node ip).
            exc.type = ray.group("inner") or exc.type or "RayTaskError"
            exc.wrapper = True
            st.remote = (ray.group("actor"), int(ray.group("pid")), ray.group("ip"))
            msg = line[line.index(": ") + 2:] if ": " in line else ""
        elif m:
            exc.type = m.group("type")
            msg = m.group("msg") or ""
            exc.wrapper = False
        else:
            exc.type = None
            msg = line
            exc.wrapper = False
        exc.message_lines = [msg.rstrip()]
        exc.chars = len(msg)
        st.pending = None
        st.state = "msg"
        return True

    def _add_frame(self, st: _Stream, exc: _Exc, fr: Frame) -> None:
        exc.frames += 1
        exc.last_frame = fr
        exc.frame_list.append(fr)
        st.source_run = 0
        if _in_package(fr.file, self.package):
            exc.last_pkg_frame = fr
        if fr.function in SHUTDOWN_FUNCS:
            exc.shutdown = True
        st.pending = fr

    def _ipython_frame(self, st: _Stream, exc: _Exc, line: str) -> bool:
        """IPython's frame lines: `[path](url) in f(...)`, `path in f(...)`, `File path:N, in
        f(...)`, `Cell In[3], line 15`; the `---> 15 code` arrow gives the line. True: used."""
        text = line.strip()
        if not text or text.startswith("---------") or IPY_SKIP_RE.match(text):
            return True
        if text[:1] == "-" and st.pending is not None:
            m = IPY_ARROW_RE.match(text)
            if m:
                st.pending.line = int(m.group("line"))
                st.pending.source = m.group("src").strip()[:500] or None
                return True
        if line[:1] == " ":
            return True           # the context lines around the arrow
        m = IPY_FRAME_RE.match(text)
        if not m:
            return False
        file = m.group("f1") or m.group("f2") or m.group("f3") or text.split(",", 1)[0]
        num = m.group("l2") or m.group("l4")
        self._add_frame(st, exc, Frame(file, int(num) if num else 0, _func(m.group("func"))))
        return True

    def _pytest_msg(self, st: _Stream, line: str, pos: int) -> bool:
        """pytest's `E   ` lines: the exception, then `path.py:LINE: Type` names the frame
        (its function is the last `def` pytest showed)."""
        exc = st.cur
        assert exc is not None
        m = PYTEST_E_RE.match(line) if line[:1] == "E" else None
        if m:
            text = m.group("text").rstrip()
            if st.state != "msg":
                for fr in self.pytest_frames:   # --tb=short: the frames came before
                    self._add_frame(st, exc, fr)
                self.pytest_frames.clear()
                em = EXC_RE.match(text)
                exc.type = em.group("type") if em and "." not in text[:1] else None
                first = (em.group("msg") or "") if exc.type and em else text
                exc.message_lines = [first]
                exc.chars = len(first)
                st.state = "msg"
            elif len(exc.message_lines) < MAX_MESSAGE_LINES and exc.chars < MAX_MESSAGE_CHARS:
                exc.message_lines.append(text.strip())
                exc.chars += len(text)
            return True
        if not line.strip():
            return True
        loc = PYTEST_LOC_RE.match(line)
        if loc:
            what = loc.group("what").strip()
            self._add_frame(st, exc, Frame(loc.group("file"), int(loc.group("line")), self.last_def))
            if exc.type is None and re.fullmatch(r"[A-Za-z_][\w.]*", what):
                exc.type = what
            self._finish_stream(st)
            return True
        self._finish_stream(st)
        return False

    def _next_traceback(self, st: _Stream, pos: int) -> bool:
        if st.chained_marker and st.cur is not None and len(st.chain) < MAX_CHAIN:
            st.chain.append(st.cur)
            st.cur = _Exc(None, [], pos)
            st.state = "frames"
            st.chained_marker = False
            st.pending = None
            return True
        # A new, independent traceback in the same stream (e.g. vLLM's add_note copy).
        self._finish_stream(st)
        self._reopen(st, pos)
        return True

    def _reopen(self, st: _Stream, pos: int) -> None:
        """A new traceback in the place of `st` (same key, identity and form)."""
        new = self._open(st.key, st.label, st.pid, st.jpid, st.ident, st.level, pos, st.node)
        new.indent, new.ipython = st.indent, st.ipython
        if self.bare is st:
            self.bare = new

    def _finish_stream(self, st: _Stream, truncated_end: bool = False) -> None:
        self._close(st, truncated_end=truncated_end)
        if self.streams.get(st.key) is st:
            del self.streams[st.key]
        if self.bare is st:
            self.bare = None

    def _expire(self) -> None:
        if not self.streams:
            return
        limit = self.tick - IDLE_CLOSE_LINES
        for st in [s for s in self.streams.values() if s.last_tick < limit]:
            self._finish_stream(st, truncated_end=st.state == "frames")

    def _close(self, st: _Stream, truncated_end: bool) -> None:
        chain = list(st.chain)
        if st.cur is not None:
            cur = st.cur
            if truncated_end and cur.type is None and not cur.message_lines:
                cur.message_lines = ["(traceback cut off before its exception line: the log is truncated)"]
            if cur.frames or cur.message_lines:
                chain.append(cur)
        if not chain:
            return
        self.tracebacks += 1
        pick = _pick_from_chain(chain)
        exc = chain[pick]
        frame = exc.last_pkg_frame or exc.last_frame
        if frame is None:
            for other in reversed(chain):
                frame = other.last_pkg_frame or other.last_frame
                if frame is not None:
                    break
        message = exc.message
        # An error raised on the way down (an executor's shutdown, a destructor) after
        # another failure is that failure's consequence.
        cascade = _is_cascade(exc.type, message) or exc.shutdown
        if cascade:
            category = _TB_CASCADE
        elif st.level in ("WARNING", "WARN", "INFO", "DEBUG"):
            category = _TB_WARN
        else:
            category = _TB_ERROR
        others = [(e.type, e.message, e.pos) for i, e in enumerate(chain) if i != pick]
        rank, pid, node = st.label, st.pid if st.pid is not None else st.jpid, st.node
        if st.remote is not None:
            rank = f"{st.remote[0]} pid={st.remote[1]}"
            pid, node = st.remote[1], st.remote[2] or node
        frames = list(reversed(exc.frame_list)) or next(
            (list(reversed(e.frame_list)) for e in reversed(chain) if e.frame_list), [])
        occ = _Occ("traceback", category, exc.type, message, _norm_sig(exc.type, message),
                   rank, chain[0].pos, frame, others, cascade, pid, node, frames)
        self._register(occ, st.jpid, st.ident, st.label, st.pid)

    # -- error lines ----------------------------------------------------------------
    def _error_line(self, line: str, pos: int, level: str | None, label: str | None,
                    pid: int | None, jpid: int | None, ident: str | None, node: str | None = None) -> None:
        if self.terminate is not None:
            # C++'s uncaught exception: "terminate called after throwing an instance of
            # 'c10::DistBackendError'" and, next, "  what():  <its message>"
            ttype, tpos = self.terminate
            self.terminate = None
            w = WHAT_RE.match(line)
            if w:
                msg = w.group("msg").strip()[:MAX_MESSAGE_CHARS]
                self._register(_Occ("error-line", _LINE_EXC, ttype, msg, _norm_sig(ttype, msg), label, tpos, None,
                                    [], False, pid if pid is not None else jpid, node), jpid, ident, label, pid)
                return
        if self.fault is not None and self._fault_dump(line):
            return
        if line[:2] == "  " and " : " in line:
            el = ELASTIC_RE.match(line)
            if el:
                self._elastic_field(el.group("key"), el.group("value").strip(), pos, jpid, ident, node)
                return
        if "terminate called" in line:
            t = TERMINATE_RE.search(line)
            if t:
                self.terminate = (t.group("type"), pos)
                return
        if level in ("INFO", "DEBUG") or not line or line[0] == " " and not level:
            return
        if not PREFILTER_RE.search(line):
            return
        text = line.strip()
        if not text or text.startswith(("INFO:", "DEBUG:")):
            return
        category: int | None = None
        type_: str | None = None
        for rx, name in STRONG_LINE_PATTERNS:
            if rx.search(text):
                category, type_ = _LINE_STRONG, name
                break
        cascade = bool(CASCADE_LINE_RE.search(text))
        if category is None:
            if cascade:
                category = _LINE_CASCADE
            elif level in ("ERROR", "CRITICAL") or EXC_LINE_RE.match(text):
                category = _LINE_ERROR
            else:
                return
        if level in ("WARNING", "WARN") and category == _LINE_ERROR:
            return
        m = EXC_LINE_RE.match(text)
        if m:
            type_ = m.group("type")
            if category == _LINE_ERROR and _is_cascade(type_, m.group("msg")):
                category, cascade = _LINE_CASCADE, True
            elif category in (_LINE_ERROR, _LINE_STRONG) and not cascade \
                    and not _is_cascade(type_, m.group("msg")) and level not in ("WARNING", "WARN"):
                # a clean `Type: message` line: what the failing code raised, in its words
                category = _LINE_EXC
        elif type_ is None:
            type_ = "error"
        occ = _Occ("error-line", category, type_, text[:MAX_MESSAGE_CHARS], _norm_sig(type_, text),
                   label, pos, None, [], category == _LINE_CASCADE, pid if pid is not None else jpid, node)
        self._register(occ, jpid, ident, label, pid)
        if text.startswith("Fatal Python error"):
            self.fault, self.fault_thread, self.fault_frames = occ, None, {}

    def _fault_dump(self, line: str) -> bool:
        """faulthandler's dump after a fatal error: the first frame of the current thread (else
        of the first thread shown) is where the process died. True: the line was the dump's."""
        occ = self.fault
        assert occ is not None
        t = FAULT_THREAD_RE.search(line)
        if t:
            if self.fault_thread != "current":
                self.fault_thread = "current" if t.group("current").startswith("Current") else "other"
            return True
        if self.fault_thread is None:
            return False
        m = FAULT_FRAME_RE.match(line)
        if not m:
            if line.strip() and not line.startswith(" "):
                self.fault = None
            return False
        fr = Frame(m.group("file"), int(m.group("line")), m.group("func"))
        frames = self.fault_frames.setdefault(self.fault_thread, [])
        if len(frames) < MAX_FRAMES_KEPT:
            frames.append(fr)   # innermost first, as faulthandler prints them
        best = self.fault_frames.get("current") or self.fault_frames.get("other") or []
        occ.frames = list(best)
        occ.frame = next((f for f in best if _in_package(f.file, self.package)), best[0] if best else None)
        return True

    def _elastic_field(self, key: str, value: str, pos: int, jpid: int | None, ident: str | None,
                       node: str | None) -> None:
        """torchrun's summary of the first failed child: its host, rank and pid name the
        process; a `traceback : Signal 9 (SIGKILL) received by PID N` is its error line."""
        if key == "host":
            self.elastic = {"host": value}
        elif key == "rank":
            m = ELASTIC_RANK_RE.match(value)
            self.elastic["rank"] = f"rank{m.group(1)}" if m else value
        elif key == "exitcode":
            m = ELASTIC_PID_RE.search(value)
            self.elastic["pid"] = m.group(1) if m else None
        elif key == "traceback" and "received by PID" in value:
            e, self.elastic = self.elastic, {}
            label = e.get("rank")
            pid = int(e["pid"]) if e.get("pid") else None
            self._register(_Occ("error-line", _LINE_STRONG, "fatal signal", value, _norm_sig("fatal signal", value),
                                label, pos, None, [], False, pid, e.get("host") or node), jpid, ident, label, pid)

    # -- crashes, aggregates ----------------------------------------------------------
    def _epoch_for(self, jpid: int | None, ident: str | None, label: str | None,
                   pid: int | None, terminal: bool) -> int:
        if ident == "systemd" or (jpid == 1):
            return max(self.epoch, 0) if self.epoch >= 0 else self._new_epoch()
        if jpid is not None:
            e = self.epoch_of_jpid.get(jpid)
            if e is None:
                e = self._new_epoch()
                if len(self.epoch_of_jpid) < 100000:
                    self.epoch_of_jpid[jpid] = e
            elif e != self.epoch:
                self._switch(e)
            return e
        if self.epoch < 0:
            self._new_epoch()
        if terminal and label is None and self.epoch_unlabeled_died:
            # Without journald or process prefixes, a main process dies once per start:
            # a second uncaught traceback at top level is the next start's.
            self._new_epoch()
        if label is not None:
            known = self.epoch_labels.get(label, pid)
            if known != pid and self.epoch_terminal:
                self._new_epoch()
            self.epoch_labels[label] = pid
        if terminal:
            self.epoch_terminal = True
            if label is None:
                self.epoch_unlabeled_died = True
        return self.epoch

    def _new_epoch(self) -> int:
        self._epochs_seen += 1
        self.epoch = self._epochs_seen
        self.epoch_labels = {}
        self.epoch_terminal = False
        self.epoch_unlabeled_died = False
        self.cur_list = []
        self.lists = {k: v for k, v in self.lists.items()
                      if any(v is lst for _, lst in self.first.values())}
        self.lists[self.epoch] = self.cur_list
        return self.epoch

    def _switch(self, epoch: int) -> None:
        # Back to an earlier crash's pid (rare: overlapping shutdown): keep its list if kept.
        self.epoch = epoch
        self.cur_list = self.lists.setdefault(epoch, [])

    def _register(self, occ: _Occ, jpid: int | None, ident: str | None, label: str | None,
                  pid: int | None) -> None:
        terminal = occ.kind == "traceback" and (
            label is None or label == "APIServer" or label.startswith("EngineCore"))
        epoch = self._epoch_for(jpid, ident, label, pid, terminal)
        proc_key = (epoch, jpid, label, pid)
        procs = self.sig_procs.get(occ.sig)
        if procs is None:
            if len(self.sig_procs) >= MAX_SIGNATURES:
                return
            procs = self.sig_procs[occ.sig] = set()
            self.sig_epochs[occ.sig] = set()
        if proc_key in procs:
            return  # the same exception printed twice by one process (logger + multiprocessing)
        if len(procs) < MAX_PROCS_PER_SIG:
            procs.add(proc_key)
        epochs = self.sig_epochs[occ.sig]
        if len(epochs) < MAX_PROCS_PER_SIG:
            epochs.add(epoch)
        lst = self.lists.setdefault(epoch, self.cur_list if epoch == self.epoch else [])
        if len(lst) < MAX_EPOCH_OCCURRENCES:
            lst.append(occ)
        if occ.category not in self.first:
            self.first[occ.category] = (epoch, lst)

    def _choose(self) -> tuple[_Occ, list[_Occ]] | None:
        for category in (_TB_ERROR, _LINE_EXC, _LINE_STRONG, _TB_WARN, _TB_CASCADE, _LINE_ERROR, _LINE_CASCADE):
            if category in self.first:
                _, lst = self.first[category]
                cands = [o for o in lst if o.category == category]
                if cands:
                    return min(cands, key=lambda o: o.pos), lst
        return None

    def _secondaries(self, root: _Occ, epoch_list: list[_Occ], mapping: dict[int, int]) -> list[Secondary]:
        out: list[Secondary] = []
        seen: set[tuple] = {root.sig}
        for type_, message, pos in root.chained:
            out.append(Secondary(type_, message, root.rank, mapping.get(pos), 1, "chained"))
        only_tracebacks = root.kind == "traceback"
        for o in sorted(epoch_list, key=lambda o: o.pos):
            if o.sig in seen or (only_tracebacks and o.kind != "traceback"):
                continue
            if o.category in (_TB_WARN,) and o.pos < root.pos:
                continue
            seen.add(o.sig)
            relation = "cascade" if o.cascade else ("later" if o.pos >= root.pos else "earlier")
            out.append(Secondary(o.type, o.message, o.rank, mapping.get(o.pos),
                                 max(1, len(self.sig_procs.get(o.sig, ()))), relation))
            if len(out) >= MAX_SECONDARY:
                break
        return out


def _decoration(text: str) -> bool:
    """Python 3.11+ caret/tilde markers and 3.13's elided-lines marker: not source."""
    return (not text.strip("^~ ")) or (text.startswith("...<") and text.endswith(">...")) \
        or text.startswith("[Previous line repeated")


def _ungroup(line: str) -> tuple[str, str | None]:
    """An exception-group line as a plain traceback line: margins stripped, the group's
    header as a traceback header; separators come back as "sep", the closing rule as "end"."""
    while True:
        m = EG_MARGIN_RE.match(line)
        if not m:
            break
        line = line[m.end():]
    if EG_START_RE.match(line):
        return "Traceback (most recent call last):", None
    if EG_SEP_RE.match(line):
        return line, "sep"
    if EG_END_RE.match(line):
        return line, "end"
    return line, None


def _exception_line(line: str) -> bool:
    """Whether an unindented line inside a traceback is its exception line rather than a
    frame's source line that lost its indentation: `Type: message`, `pkg.Type`, `Type`."""
    m = EXC_RE.match(line)
    if not m:
        return bool(RAY_WRAP_RE.match(line))
    t = m.group("type")
    return t not in NOT_EXCEPTIONS and (":" in line or "." in t or t[:1].isupper())


def _escaped_traceback(line: str) -> str:
    """The traceback held in one escaped string of `line` (a JSON field, a repr), unescaped:
    from its start to the string's closing quote (the rest of the line is not its)."""
    start = line.index(ESCAPED_TB)
    quote = line[start - 1] if start and line[start - 1] in "\"'" else None
    end = len(line)
    if quote:
        i = start
        while True:
            i = line.find(quote, i)
            if i < 0:
                break
            if line[i - 1] != "\\":
                end = i
                break
            i += 1
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": ""}.get(m.group(1), m.group(1)),
                  line[start:end])


def _func(name: str | None) -> str | None:
    """A frame's function: `PreTrainedModel.to` (IPython, 3.11 qualified names) -> `to`."""
    if not name:
        return None
    name = name.strip()
    if name.startswith("<"):
        return name
    return name.rsplit(".", 1)[-1] or name


def _rank_name(label: str, pid: str, ip: str | None) -> str:
    """The process a prefix names. A label with a rank in it (`Worker_TP4`, `VllmWorker
    rank=3`) names one process; a pool's label (`RayWorkerWrapper`, `VllmWorkerProcess`,
    anything on another node) does not, so its pid is part of the name."""
    if (ip or "Worker" in label or label.startswith("Ray")) and not any(ch.isdigit() for ch in label):
        return f"{label} pid={pid}"
    return label


def _after_carriage(line: str) -> str:
    """What a terminal shows of a line with `\r` progress bars: the text after the last
    carriage return, without a progress bar that a logger line was written straight after."""
    parts = [p for p in line.split("\r") if p.strip()]
    if not parts:
        return ""
    last = parts[-1]
    m = TQDM_TAIL_RE.match(last)
    if m and m.end() < len(last):
        last = last[m.end():]
    return last


def _pick_from_chain(chain: list[_Exc]) -> int:
    """The original exception of a chain — unless it is a cascade, or a bare lookup failure
    that the code answered with a more telling error (KeyError -> "model type not
    recognised"): then the first later one that is neither."""
    if len(chain) == 1:
        return 0
    for i, exc in enumerate(chain):
        if _is_cascade(exc.type, exc.message):
            continue
        base = (exc.type or "").rsplit(".", 1)[-1]
        if (base in LOOKUP_TYPES or base in GROUP_TYPES) and any(
                not _is_cascade(e.type, e.message) for e in chain[i + 1:]):
            continue
        return i
    return len(chain) - 1


# ---------------------------------------------------------------------------------------
# Entry points.
def analyse_lines(lines: Iterable[str], *, package: str | None = None, source: str = "") -> Diagnosis:
    """Analyse text lines (any iterable: a file object, stdin, a list). Streaming."""
    an = _Analyser(package)
    n = 0
    for n, line in enumerate(lines, 1):
        _feed_prefiltered(an, line, n, early=n <= EARLY_LINES)
    return an.finish(source=source, lines=n)


def _feed_prefiltered(an: _Analyser, line: str, n: int, *, early: bool,
                      jpid: int | None = None, ident: str | None = None, node: str | None = None) -> None:
    # Most lines of a healthy log are INFO chatter: skip them unless a traceback is open.
    # A few `in` tests settle the common case; the regex only sees the rest.
    if an.busy or early:
        an.feed(line, n, jpid=jpid, ident=ident, early=early, node=node)
    elif "INFO" in line and "rror" not in line and "RROR" not in line and "Traceback" not in line \
            and "xception" not in line:
        return
    elif _prefilter(line):
        an.feed(line, n, jpid=jpid, ident=ident, early=early, node=node)


def analyse_file(path: str | os.PathLike[str], *, package: str | None = None) -> Diagnosis:
    """Analyse a log file; fast path for large files (see module docstring)."""
    p = Path(path)
    if not p.is_file():
        if p.is_dir():
            raise UsageError(f"{p} is a folder, not a log file", hint="give the path of a log file, or --unit UNIT")
        if not p.exists():
            raise UsageError(f"log file not found: {p}", hint="give the path of a log file, or --unit UNIT")
        # A pipe (`why <(journalctl …)`) or a device (/dev/null): read once, as a stream.
        with open(p, encoding="utf-8", errors="replace", newline="\n") as fh:
            return analyse_lines(fh, package=package, source=str(p))
    an = _Analyser(package, error_lines=False)
    with open(p, "rb", buffering=0) as f:
        _scan_fast(f, an)

    def resolve(positions: list[int]) -> dict[int, int]:
        return _offsets_to_lines(p, positions)

    diag = an.finish(resolve, source=str(p))
    if _TB_ERROR in an.first:
        return diag
    # No traceback explains it: read every line, error lines included.
    with open(p, encoding="utf-8", errors="replace", newline="\n") as fh:
        return analyse_lines(fh, package=package, source=str(p))


def _scan_fast(f: BinaryIO, an: _Analyser) -> None:
    carry = b""         # the unfinished last line of the previous chunk
    base = 0            # file offset of the current chunk's first byte
    lines_seen = 0      # counted only while early
    while True:
        data = f.read(CHUNK)
        if not data:
            break
        first = data.find(b"\n")
        if first < 0:
            carry += data
            if len(carry) > MAX_LINE_BYTES:
                # A monster line: look at its head, drop the rest (an offset inside a line
                # still resolves to that line's number).
                start = base + len(data) - len(carry)
                lines_seen = _scan_block(carry + b"\n", 0, len(carry) + 1, start, an, lines_seen)
                carry = b""
            base += len(data)
            continue
        start = 0
        if carry:
            # The line that straddles two chunks: a small copy, never the whole chunk.
            line = carry + data[:first + 1]
            lines_seen = _scan_block(line, 0, len(line), base - len(carry), an, lines_seen)
            carry = b""
            start = first + 1
        end = data.rfind(b"\n") + 1
        lines_seen = _scan_block(data, start, end, base, an, lines_seen)
        carry = data[end:]
        base += len(data)
    if carry:
        _scan_block(carry + b"\n", 0, len(carry) + 1, base - len(carry), an, lines_seen)


def _scan_block(buf: bytes, pos: int, end: int, base: int, an: _Analyser, lines_seen: int) -> int:
    """Feed the lines of buf[pos:end] (end just past a newline) that matter; `base` is the
    file offset of buf[0]."""
    find = buf.find
    while pos < end:
        early = lines_seen < EARLY_LINES
        if not an.busy and not early:
            hit = find(TB_NEEDLE, pos, end)
            if hit < 0:
                return lines_seen
            pos = buf.rfind(b"\n", pos, hit) + 1 or pos
        nl = find(b"\n", pos, end)
        if nl < 0:
            nl = end
        raw = buf[pos:nl]
        if len(raw) > MAX_LINE_BYTES:
            raw = raw[:MAX_LINE_BYTES]
        if early:
            lines_seen += 1
        an.feed(raw.decode("utf-8", "replace"), base + pos, early=early)
        pos = nl + 1
    return lines_seen


def _offsets_to_lines(path: Path, offsets: list[int]) -> dict[int, int]:
    """1-based line numbers of byte offsets (each the start of a line), one counting pass
    that stops at the furthest offset asked for."""
    want = sorted({o for o in offsets if o is not None})
    out: dict[int, int] = {}
    i = 0
    base = 0       # file offset of data[0]
    count = 0      # newlines before `base`
    with open(path, "rb", buffering=0) as f:
        while i < len(want):
            data = f.read(CHUNK)
            if not data:
                break
            top = base + len(data)
            last = 0
            while i < len(want) and want[i] < top:
                rel = want[i] - base
                count += data.count(b"\n", last, rel)
                last = rel
                out[want[i]] = count + 1
                i += 1
            count += data.count(b"\n", last)
            base = top
    return out


def analyse_journal(unit: str, since: str | None, *, package: str | None = None,
                    timeout: float | None = None) -> Diagnosis:
    """Analyse a systemd unit's journal (`journalctl -u UNIT --since SINCE -o json`), streamed."""
    argv = ["journalctl", "-u", unit, "--no-pager", "-o", "json"]
    if since:
        argv[3:3] = ["--since", since]
    an = _Analyser(package)
    counter = [0]
    other: list[str] = []

    def on_line(text: str) -> None:
        text = text.strip()
        if not text:
            return
        if not text.startswith("{"):
            if len(other) < 20:
                other.append(text)
            return
        try:
            entry = json.loads(text)
        except ValueError:
            if len(other) < 20:
                other.append(text[:300])
            return
        counter[0] += 1
        msg = entry.get("MESSAGE")
        if isinstance(msg, list):  # journald's form for messages that are not UTF-8
            try:
                msg = bytes(msg).decode("utf-8", "replace")
            except (TypeError, ValueError):
                return
        if not isinstance(msg, str):
            return
        try:
            jpid = int(entry.get("_PID")) if entry.get("_PID") is not None else None
        except (TypeError, ValueError):
            jpid = None
        ident = entry.get("SYSLOG_IDENTIFIER")
        host = entry.get("_HOSTNAME")
        n = counter[0]
        for part in msg.split("\n"):
            _feed_prefiltered(an, part, n, early=n <= EARLY_LINES, jpid=jpid, ident=ident,
                              node=host if isinstance(host, str) else None)

    try:
        done = proc.stream(argv, on_line=on_line, timeout=timeout)
    except CommandNotFound:
        raise CommandNotFound(
            f"journalctl not found: cannot read the journal of unit {unit!r}",
            hint="run on the host that runs the unit, or save the log and run `rewheel why LOGFILE`") from None
    if done.timed_out:
        raise UsageError(f"journalctl -u {unit} timed out after {timeout}s")
    if done.returncode != 0:
        detail = "; ".join(other[-5:]) or f"exit status {done.returncode}"
        raise UsageError(f"journalctl failed for unit {unit!r}: {detail}",
                         hint=f"check the unit name and --since value ({' '.join(argv)})")
    since_txt = f" since {since}" if since else ""
    return an.finish(source=f"journal of {unit}{since_txt}", lines=counter[0])


def analyse_stream(stream: io.TextIOBase | Iterator[str] | None = None, *,
                   package: str | None = None) -> Diagnosis:
    """Analyse stdin (or the given text stream)."""
    if stream is None:
        stream = sys.stdin
        try:
            # lines end at "\n" only, as in a file: a `\r` progress bar is not a line of its own
            stream.reconfigure(newline="\n")  # type: ignore[union-attr]
        except (AttributeError, ValueError, io.UnsupportedOperation):
            pass
    return analyse_lines(stream, package=package, source="stdin")
