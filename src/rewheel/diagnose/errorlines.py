"""Crashes told by lines, not (only) by a traceback (`ErrorLineReader`, a part of
`Analyser`): C++'s `terminate called after throwing ...` and its `what():`, faulthandler's
dump after a fatal error, torchrun's failure summary, strong error lines (OOM killer, CUDA,
NCCL, undefined symbols, unsupported GPUs, fatal signals) and cascades; and the floor: every
`Type: message` line, at a line's start or inside it, scored (`ranking.exc_line_score`), with
its process from its own prefix, the rank its text names, or the prefix of the record just
before it."""

from __future__ import annotations

import re
from collections.abc import Callable

from rewheel.diagnose.limits import MAX_FRAMES_KEPT, MAX_MESSAGE_CHARS
from rewheel.diagnose.ranking import (
    LINE_CASCADE, LINE_ERROR, LINE_EXC, LINE_STRONG, EXC_LINE_RE, is_cascade, norm_sig, Occ, exc_line_score)
from rewheel.diagnose.processes import Said
from rewheel.diagnose.results import Frame
from rewheel.diagnose.tblines import PROSE_TYPE_RE, in_package

# faulthandler's dump after "Fatal Python error: ...": a thread header, then its frames
# innermost first ("  File "x.py", line 12 in f")
FAULT_THREAD_RE = re.compile(r"(?P<current>Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):")
FAULT_FRAME_RE = re.compile(r'\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
# C++: std::terminate's report of an uncaught exception, and its what() on the next line
TERMINATE_RE = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']+)'")
# a C++ exception type in garbled text (ranks' reports run into each other):
# "'c10::DistBackendErrorc10::DistBackendError'" -> c10::DistBackendError
CXX_TYPE_RE = re.compile(r"(?:[A-Za-z_]\w*::)+\w*?(?:Error|Exception|error|exception)|std::\w+")
TERMINATE_WAIT = 12             # lines (fed) within which the what() of a terminate report comes
WRAP_WIDTH = 100                # a longer line cut mid-word was hard-wrapped by a terminal copy
WHAT_RE = re.compile(r"\s*what\(\):\s+(?P<msg>.*)$")
# torchrun's failure summary: the fields that name the failed process.
ELASTIC_RE = re.compile(r"\s+(?P<key>host|rank|exitcode|traceback)\s*: (?P<value>.+)$")
ELASTIC_TB_RE = re.compile(r"\s+traceback\s*: $")
ELASTIC_RANK_RE = re.compile(r"(\d+)")
ELASTIC_PID_RE = re.compile(r"\(pid: (\d+)\)")
ROOT_CAUSE_WEIGHT = 3           # its "Root Cause (first observed failure)" entry: the surest launcher word
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
# (after any letter but an ASCII one: a sentence in another script may run into the type,
# "报错信息是AssertionError: ..."; never a C++ type's tail, "c10::DistBackendError")
EXC_IN_LINE_RE = re.compile(r"(?<![A-Za-z0-9_.])(?<!::)(?P<type>[A-Za-z_][\w.]*(?:Error|Exception)): (?P<msg>\S.*)")
# where an error quoted in prose ends: a full-width stop or comma, a closing corner bracket,
# or the quote that opened it ("`ValueError: ...` and then")
PROSE_END_RE = re.compile(r"[，。；！？」』]")
CLOSING_QUOTE = {"`": "`", "\"": "\"", "“": "”", "「": "」", "『": "』", "«": "»", "„": "“"}
CUT_PROSE_LINES = 12            # lines after a cut traceback where a sentence may name its error
PROSE_SCORE = -5                # ... below every `Type: message` line
# an exception's name alone on its line, without a message (`AssertionError`)
BARE_EXC_RE = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception|Failure|Fault)")
# a rank named in an error's own text: "[Rank 2] Watchdog caught ...", "[PG 0 Rank 1] ..."
# (Lightning: "[rank: 1]"; lmdeploy: "rank[0] failed with error: ...")
RANK_TEXT_RE = re.compile(r"[\[ ][Rr]ank:? ?(?P<rank>\d+)\]|\b[Rr]ank\[(?P<rank2>\d+)\]")
NEAR_TICKS = 10                 # a prefixed line this close names the process of an unprefixed one
# Cheap per-line prefilter when every line passes through (analyse_lines, journals).
PREFILTER_RE = re.compile(
    r"Traceback|File \"|rror|RROR|xception|CRITICAL|[Kk]illed|NCCL|out of memory|dumped|Abort"
    r"|fault|Failed|died unexpectedly|terminated|Interrupt|SystemExit|undefined symbol"
    r"|not compatible|kernel image|oom|terminate called|what\(\)|Current thread|Thread 0x")


def _cxx_type(text: str) -> str | None:
    """The C++ exception type a terminate report names, also where reports of several
    processes ran into each other."""
    t = TERMINATE_RE.search(text)
    if t and " " not in t.group("type") and "terminate" not in t.group("type"):
        found = t.group("type")
        half = len(found) // 2
        return found[:half] if len(found) % 2 == 0 and found[:half] == found[half:] else found
    m = CXX_TYPE_RE.search(text)
    return m.group(0) if m else None


def prefilter(line: str) -> bool:
    """Whether a line can matter outside a traceback: the regex above, or (cheap `in` tests
    first) pytest's `E   ` lines, `def` lines and `path.py:N: in f` locations, and
    torchrun's summary fields."""
    return bool(PREFILTER_RE.search(line)) or line.startswith("E   ") or "def " in line \
        or ": in " in line or " : " in line


class ErrorLineReader:
    """`Analyser`'s part that reads the lines outside tracebacks."""

    # (state set up by Analyser.__init__; `_register` is the ranking's, see ranking.py)
    package: str | None
    _register: Callable[[Occ, int | None, str | None, str | None, int | None], None]
    error_lines: bool
    tick: int
    terminate: tuple[str | None, int, int] | None
    wrapped: Occ | None
    elastic: dict[str, str | None]
    fault: Occ | None
    fault_thread: str | None
    fault_frames: dict[str | None, list[Frame]]
    recent: tuple[str, int | None, str | None, int, int | None] | None
    elastic_root: bool
    cut_tick: int
    elastic_said: Said | None
    _tell: Callable[[str, int | None, str | None, int, int], Said | None]

    def _error_line(self, line: str, pos: int, level: str | None, label: str | None,
                    pid: int | None, jpid: int | None, ident: str | None, node: str | None = None) -> None:
        if not line.strip():
            return      # (a paste with a blank line after every line: what awaits goes on waiting)
        wrapped, self.wrapped = self.wrapped, None
        if wrapped is not None and line[:1].isalnum() and line[:1].islower():
            # the what() line was cut mid-word by a terminal copy ("... caught colle" /
            # "ctive operation timeout ..."): its message goes on here
            wrapped.message = (wrapped.message + line.rstrip())[:MAX_MESSAGE_CHARS]
            if len(line) >= WRAP_WIDTH and line[-1:].isalnum():
                self.wrapped = wrapped
            return
        if self.terminate is not None:
            # C++'s uncaught exception: "terminate called after throwing an instance of
            # 'c10::DistBackendError'" and, soon after, "  what():  <its message>" (several
            # ranks' reports may be garbled into each other in between)
            ttype, tpos, ttick = self.terminate
            w = WHAT_RE.match(line)
            if w:
                self.terminate = None
                msg = w.group("msg").strip()[:MAX_MESSAGE_CHARS]
                ttype = ttype or _cxx_type(msg) or "std::terminate"
                label, pid, node, source = self._near_process(msg, label, pid, node, jpid)
                occ = Occ("error-line", LINE_EXC, ttype, msg, norm_sig(ttype, msg), label, tpos, None,
                           [], False, pid if pid is not None else jpid, node, score=exc_line_score(ttype, msg),
                           rank_source=source)
                self._register(occ, jpid, ident, label, pid)
                if len(line) >= WRAP_WIDTH and line[-1:].isalnum():
                    self.wrapped = occ
                return
            if self.tick - ttick > TERMINATE_WAIT:
                self.terminate = None
            elif "terminate called" in line or ttype is None:
                self.terminate = (ttype or _cxx_type(line), tpos, ttick)
                return
        if self.fault is not None and self._fault_dump(line):
            return
        if "terminate called" in line:
            self.terminate = (_cxx_type(line), pos, self.tick)
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
                category, type_ = LINE_STRONG, name
                break
        cascade = bool(CASCADE_LINE_RE.search(text))
        exc_start = EXC_LINE_RE.match(text)
        # a type in the middle of a line ("... failed: RuntimeError: CUDA error ..."): weaker
        exc_at_start = exc_start or EXC_IN_LINE_RE.search(text)
        bare = exc_at_start is None and category is None and BARE_EXC_RE.fullmatch(text) is not None \
            and not is_cascade(text, "")
        if bare:
            # the name alone, as Python prints an exception without a message: the floor's
            # candidate too (a teardown error after it is not the cause)
            label, pid, node, source = self._near_process(text, label, pid, node, jpid)
            occ = Occ("error-line", LINE_EXC, text, "", norm_sig(text, ""), label, pos, None, [], False,
                       pid if pid is not None else jpid, node, score=exc_line_score(text, ""), rank_source=source)
            self._register(occ, jpid, ident, label, pid)
            return
        if category is None and exc_at_start is None and self.tick - self.cut_tick <= CUT_PROSE_LINES \
                and (prose := PROSE_TYPE_RE.search(text)) is not None:
            # a sentence just after a traceback cut before its exception line, naming the
            # error without its message ("运行后报 ValueError 错误"): the floor's weakest candidate
            label, pid, node, source = self._near_process(text, label, pid, node, jpid)
            occ = Occ("error-line", LINE_EXC, prose.group("type"), text[:MAX_MESSAGE_CHARS],
                       norm_sig(prose.group("type"), text), label, pos, None, [], False,
                       pid if pid is not None else jpid, node, score=PROSE_SCORE, rank_source=source)
            self._register(occ, jpid, ident, label, pid)
            return
        if category is None:
            if cascade:
                category = LINE_CASCADE
            elif level in ("ERROR", "CRITICAL") or exc_at_start:
                category = LINE_ERROR
            else:
                return
        if level in ("WARNING", "WARN") and category == LINE_ERROR:
            return
        m = exc_at_start
        score = 0
        if m and m is not exc_start:
            # an error quoted in prose ends where the prose goes on
            stops = [e.start() for e in [PROSE_END_RE.search(text, m.start("msg"))] if e is not None]
            quote = CLOSING_QUOTE.get(text[m.start() - 1: m.start()])
            if quote is not None and (q := text.find(quote, m.start("msg"))) >= 0:
                stops.append(q)
            if stops:
                text = text[: min(stops)].rstrip()
        if m:
            type_ = m.group("type")
            if category == LINE_ERROR and is_cascade(type_, m.group("msg")):
                category, cascade = LINE_CASCADE, True
            elif category in (LINE_ERROR, LINE_STRONG) and not cascade \
                    and not is_cascade(type_, m.group("msg")) and level not in ("WARNING", "WARN"):
                # a `Type: message` line: what the failing code raised, in its words; the
                # cleanest of them is the answer (see exc_line_score)
                category = LINE_EXC
                score = exc_line_score(type_, m.group("msg"), at_start=m is exc_start)
        elif type_ is None:
            type_ = "error"
        source = "prefix" if label else None
        if category != LINE_CASCADE:
            label, pid, node, source = self._near_process(text, label, pid, node, jpid)
        occ = Occ("error-line", category, type_, text[:MAX_MESSAGE_CHARS], norm_sig(type_, text),
                   label, pos, None, [], category == LINE_CASCADE, pid if pid is not None else jpid, node,
                   score=score, rank_source=source)
        self._register(occ, jpid, ident, label, pid)
        if text.startswith("Fatal Python error"):
            self.fault, self.fault_thread, self.fault_frames = occ, None, {}

    def _near_process(self, text: str, label: str | None, pid: int | None, node: str | None,
                      jpid: int | None = None) -> tuple[str | None, int | None, str | None, str | None]:
        """The process of an error line without a prefix, and what named it: a rank its text
        names, else the prefix of a line just before it (an NCCL abort's `[rank0]:` records,
        then C++'s unprefixed `terminate called ...`)."""
        if label is not None:
            return label, pid, node, "prefix"
        m = RANK_TEXT_RE.search(text[:2000])
        if m:
            return f"rank{m.group('rank') or m.group('rank2')}", pid, node, "text"
        near = self.recent
        if near is not None and self.tick - near[3] <= NEAR_TICKS and near[4] == jpid:
            return near[0], near[1] if pid is None else pid, node or near[2], "nearby"
        return label, pid, node, None

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
        occ.frame = next((f for f in best if in_package(f.file, self.package)), best[0] if best else None)
        return True

    def _elastic_field(self, key: str, value: str, pos: int, jpid: int | None, ident: str | None,
                       node: str | None) -> None:
        """torchrun's summary of the first failed child: its host, rank and pid name the
        process; a `traceback : Signal 9 (SIGKILL) received by PID N` is its error line."""
        if key == "host":
            self.elastic = {"host": value}
        elif key == "rank":
            m = ELASTIC_RANK_RE.match(value)
            self.elastic["rank"] = rank = f"rank{m.group(1)}" if m else value
            # the table's entry names the failed child for an unprefixed traceback before it
            self.elastic_said = self._tell(rank, None, self.elastic.get("host") or node, pos,
                                           ROOT_CAUSE_WEIGHT if self.elastic_root else 1)
        elif key == "exitcode":
            m = ELASTIC_PID_RE.search(value)
            self.elastic["pid"] = m.group(1) if m else None
            if m and self.elastic_said is not None:
                self.elastic_said.pid = int(m.group(1))
        elif key == "traceback" and "received by PID" in value and self.error_lines:
            e, self.elastic = self.elastic, {}
            label = e.get("rank")
            pid = int(pid_text) if (pid_text := e.get("pid")) else None
            self._register(Occ("error-line", LINE_STRONG, "fatal signal", value, norm_sig("fatal signal", value),
                                label, pos, None, [], False, pid, e.get("host") or node), jpid, ident, label, pid)
