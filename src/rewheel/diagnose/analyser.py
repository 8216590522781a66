"""`Analyser`: a log, one line at a time, through what `wrappers`, `tracebacks`,
`errorlines` and `ranking` recognise. Push-based: `feed()` lines, `finish()` for the
`Diagnosis`."""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable

from rewheel.diagnose.boxes import BOX_START, Boxes
from rewheel.diagnose.limits import MAX_FRAMES_KEPT, MAX_MESSAGE_LINES, MAX_SAID, MAX_TWINS, TB_HEAD
from rewheel.diagnose.errorlines import ELASTIC_RE, ELASTIC_TB_RE, ErrorLineReader
from rewheel.diagnose.processes import ProcessNamer, RankSource, Said, evidence
from rewheel.diagnose.ranking import Ranking, Occ
from rewheel.diagnose.results import Diagnosis, Frame, RootCause
from rewheel.diagnose.tblines import FRAME_RE, IPY_HEAD_RE, PYTEST_DEF_RE, PYTEST_E_RE, PYTEST_SHORT_RE, ungroup
from rewheel.diagnose.tracebacks import TracebackReader, Stream
from rewheel.diagnose.wrappers import (
    ESCAPED_TB, KNOWN_INNER_RE, MAX_WRAPPER_CHARS, escaped_traceback, wrapper_pattern, clean, journal_message,
    journal_pid, read_prefixes)


class Analyser(TracebackReader, ErrorLineReader, ProcessNamer, Ranking):
    """Push-based: feed() lines, finish() for the Diagnosis. Positions (`pos`) are opaque
    ints that grow with the input — line numbers, or byte offsets resolved at the end."""

    def __init__(self, package: str | None, *, error_lines: bool = True) -> None:
        # An import name ("vllm", "flashinfer") or a dotted one; distribution-style dashes
        # are read as underscores ("flash-attn" -> "flash_attn").
        self.package = package.replace(".", "/").replace("-", "_") if package else None
        self.error_lines = error_lines
        self.streams: dict[tuple, Stream] = {}
        self.tick = 0
        self.tracebacks = 0
        # epochs (one per service start / crash)
        self.epoch_of_jpid: dict[int, int] = {}
        self.epoch = -1
        self._epochs_seen = -1
        self.epoch_labels: dict[str, int | None] = {}
        self.epoch_terminal = False
        self.epoch_unlabeled_died = False
        self.cur_list: list[Occ] = []
        self.first: dict[int, tuple[int, list[Occ]]] = {}   # category -> (epoch, its list)
        self.lists: dict[int, list[Occ]] = {}
        # signature aggregates
        self.sig_procs: dict[tuple, set] = {}
        self.sig_epochs: dict[tuple, set] = {}
        self.sig_first: dict[tuple, int] = {}
        self.bare: Stream | None = None      # the traceback that began mid-line, if open
        self.last_def: str | None = None      # pytest: the last `def f(` shown
        self.pytest_frames: deque[Frame] = deque(maxlen=MAX_FRAMES_KEPT)  # --tb=short locations
        self.terminate: tuple[str | None, int, int] | None = None  # C++ terminate awaiting its what()
        self.wrapped: Occ | None = None                # a what() line cut mid-word, awaiting the rest
        self.elastic: dict[str, str | None] = {}       # torchrun's summary fields so far
        self.fault: Occ | None = None                  # a fatal error awaiting faulthandler's frames
        self.fault_thread: str | None = None            # "current" | "other": the dump being read
        self.fault_frames: dict[str | None, list[Frame]] = {}
        # the last prefixed line outside a traceback (label, pid, node, tick), and the last
        # logger record naming a process that ended with ":" (label, pid, node, where the next
        # line starts)
        self.recent: tuple[str, int | None, str | None, int, int | None] | None = None
        self.lead: tuple[str, int | None, str | None, int] | None = None
        self.learned: re.Pattern[str] | None = None   # an unknown wrapper seen on every line
        self.cut_frame: tuple[Stream, int] | None = None  # a stream whose frame line a wrap cut, and when
        self.boxes = Boxes()                            # tracebacks drawn in a box (Rich)
        self.tail = 0                                   # lines still to read after a traceback ended
        self.said: deque[Said] = deque(maxlen=MAX_SAID)     # launchers' statements (see processes)
        self.raylets: deque[Said] = deque(maxlen=MAX_SAID)  # raylet's lines about dead workers
        self.elastic_root = False                       # torchrun's table: in its "Root Cause" entry
        self.elastic_said: Said | None = None           # ... and what its entry said so far
        self.ignored_tick = -2                          # when Python's "Exception ignored ..." was read
        self.cut_tick = -1000                           # when a traceback cut before its exception line ended

    @property
    def busy(self) -> bool:
        """Whether the next line matters whatever it says: a traceback is open or just ended
        (a launcher's summary may follow), a C++ report awaits its what() or the rest of a line
        a terminal copy cut, or a record ending with ":" awaits its traceback."""
        return bool(self.streams) or self.tail > 0 or self.terminate is not None or self.wrapped is not None \
            or self.lead is not None

    def feed(self, raw: str, pos: int, *, jpid: int | None = None, ident: str | None = None,
             early: bool = False, node: str | None = None, _escaped: bool = False,
             nxt: int | None = None, _relearn: bool = False) -> None:
        """One line at `pos`; `nxt` is where the next line starts (to know two lines adjacent)."""
        self.tick += 1
        if not _escaped and self.tail > 0:
            self.tail -= 1
        if jpid is None and raw.startswith('{"') and ('"MESSAGE"' in raw or '"log":' in raw):
            # (before any cleaning: colour codes inside are JSON escapes, not yet characters)
            self._feed_json(raw.rstrip(), pos, early, nxt)
            return
        line = clean(raw)
        args = (jpid, ident, node)
        if ESCAPED_TB in line and not _escaped:
            # a traceback inside an escaped string (a JSON log field, a repr, a list of strings):
            # its lines, each behind the prefixes of the line that held it
            p = read_prefixes(line, jpid=jpid, ident=ident, node=node, learned=self.learned)
            prefix = line[: len(line) - len(p.line)] if ESCAPED_TB in p.line else ""
            for part in escaped_traceback(line).split("\n")[:MAX_MESSAGE_LINES * 50]:
                self.feed(prefix + part, pos, jpid=jpid, ident=ident, early=early, node=node, _escaped=True)
            return
        bare = self.bare
        if bare is not None and bare.lead is not None and bare.lead.match(line):
            # the text before a mid-line traceback begins the next line too, before anything
            # else: a wrapper on every line ("120:" of `grep -n`, "gpu-node-3: "), learnt
            self._learn_lead(bare)
        p = read_prefixes(line, jpid=jpid, ident=ident, node=node, learned=self.learned)
        if p.line[:1] in BOX_START or (p.line[:1] == " " and p.line.lstrip(" ")[:1] in BOX_START):
            if self._unbox(line, p.line, pos, args, early, nxt):
                return
        line, jpid, ident, node, label, pid = p.line, p.jpid, p.ident, p.node, p.label, p.pid
        level, header, prefix_label = p.level, p.header, p.prefix_label
        key = (jpid, label, pid, level is not None, node)
        st = self.streams.get(key)
        cut, self.cut_frame = self.cut_frame, None
        if cut is not None and st is None and label is None and not header and cut[1] == self.tick - 1 \
                and cut[0].key in self.streams:
            # the rest of the previous line, which a hard wrap cut: it carries no prefix
            st = cut[0]
        bare = self.bare
        if bare is not None and st is None and not header and (label is None or (label, pid) == bare.opened_by):
            # Lines without a prefix continue the traceback that began mid-line in a
            # prefixed record (sglang prints the whole traceback as one record); so do lines
            # that carry only the process prefix of the line it began on (sglang under Ray:
            # "(WorkerDict pid=N) " before every line of it).
            st = bare if bare.key in self.streams else None
        elif bare is not None and bare.key != key and bare.state in ("msg", "after", "chain") \
                and bare.key in self.streams and (header or label):
            # another writer's record: the message of the mid-line traceback has ended
            self._finish_stream(bare)
        if st is not None and st.lead is not None:
            m = st.lead.match(line)
            if m and self._learn_lead(st):
                # (the same after wrappers we know: "vllm-1  | worker-1: ...")
                line = line[m.end():]
            st.lead = None
        if st is not None and st.indent:
            ind = st.indent
            if line[:ind].isspace() and len(line) > ind:
                line = line[ind:]
        if line[:1] in (" ", "|", "+"):
            line, group_mark = ungroup(line)
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
        lead, self.lead = self.lead, None
        if lead is not None and lead[3] == pos and not line.strip() and nxt is not None:
            # (a paste with a blank line after every line: the traceback is on the next line but one)
            self.lead = (*lead[:3], nxt)
            return
        if label is not None and level not in ("INFO", "DEBUG"):
            self.recent = (label, pid, node, self.tick, jpid)
            if header and line.endswith(":") and nxt is not None:
                self.lead = (label, pid, node, nxt)
        if line.startswith(TB_HEAD):
            source = None
            if label is None and lead is not None and lead[3] == pos:
                # "[... TP1] Exception in ModelTpServer:" and, on the next line, the traceback
                # without a prefix: the record before it names its process
                label, pid, source = lead[0], lead[1], RankSource.NEARBY
            st = self._open(key, label, pid, jpid, ident, level, pos, node)
            st.rank_source = source or st.rank_source
            st.ignored = self.ignored_tick == self.tick - 1
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
                inner = KNOWN_INNER_RE.search(before)
                if inner and 0 < inner.start() <= MAX_WRAPPER_CHARS and not _relearn:
                    # An unknown wrapper before prefixes we know ("host-1: [rank8]: Traceback"):
                    # the collector's, on every line; learnt, and this line read again without it
                    self.learned = wrapper_pattern(before[: inner.start()])
                    self.feed(line, pos, jpid=jpid, ident=ident, early=early, node=node, nxt=nxt,
                              _relearn=True)
                    return
                # "Scheduler hit an exception: Traceback ...", torchrun's "traceback : Traceback
                # ...", " at Traceback ...": the rest follows without the record's prefix and
                # indented by however much the first frame line says.
                e = self.elastic
                source = None
                if label is None and e.get("rank") and ELASTIC_TB_RE.match(before):
                    # torchrun's summary named the child whose traceback this is
                    label, pid = e["rank"], int(pid_text) if (pid_text := e.get("pid")) else pid
                    node, source = e.get("host") or node, RankSource.LAUNCHER
                    self.elastic = {}
                bkey = (jpid, None, None, False, node)
                old = self.streams.get(bkey)
                if old is not None and old is self.bare and old.state == "frames" and old.cur is not None \
                        and old.cur.frames <= 2 and not old.chain and old.twins < MAX_TWINS:
                    # another rank's record began the same way at the same time (sglang's TP
                    # ranks): their tracebacks interleave line by line; read as one
                    old.twins += 1
                    old.merged = True
                    old.last_tick = self.tick
                    return
                if old is not None:
                    self._finish_stream(old, truncated_end=old.state == "frames")
                st = self._open(bkey, label, pid, jpid, ident, level, pos, node)
                st.rank_source = source or st.rank_source
                st.indent = None
                st.opened_by = (prefix_label, pid)
                if 0 < len(before) <= MAX_WRAPPER_CHARS:
                    st.lead = wrapper_pattern(before)
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
        if line[:2] == "  " and ": " in line:
            el = ELASTIC_RE.match(line)
            if el:
                # torchrun's summary: its fields name the failed child (also for a traceback
                # in its `traceback :` field, so read on the fast path too)
                self._elastic_field(el.group("key"), el.group("value").strip(), pos, jpid, ident, node)
                return
        self._other_line(line, pos)
        if self.error_lines:
            self._error_line(line, pos, level, label, pid, jpid, ident, node)

    def _unbox(self, line: str, body: str, pos: int, args: tuple[int | None, str | None, str | None],
               early: bool, nxt: int | None) -> bool:
        """A line of a traceback drawn in a box (Rich): read as the plain lines it stands for,
        behind the same prefixes. False: not a box traceback's line."""
        p = read_prefixes(line, jpid=args[0], ident=args[1], node=args[2], learned=self.learned)
        key = (p.jpid, p.label, p.pid, p.level is not None, p.node)
        indent = len(body) - len(body.lstrip(" "))
        plain = self.boxes.translate(key, body[indent:], pos)
        if plain is None:
            return False
        prefix = line[: len(line) - len(body)]
        for text, at in plain:
            self.feed(prefix + text, at, jpid=args[0], ident=args[1], early=early, node=args[2],
                      _escaped=True, nxt=nxt)
        st = self.streams.get(key)
        if st is not None:
            st.last_tick = self.tick
            if indent:
                # a box drawn in a logger's message column (rich's RichHandler): the exception
                # line after it is indented as much
                st.indent = indent
        return True

    def _other_line(self, line: str, pos: int) -> None:
        """A line outside any traceback that says something about the one before or after it:
        Python's "Exception ignored in: ...", torchrun's table sections, a launcher's summary of
        a failed child, raylet's report of a dead worker."""
        c = line[:1]
        if not c and self.ignored_tick == self.tick - 1:
            self.ignored_tick = self.tick   # (a paste with a blank line after every line)
        elif c == "E" and line.startswith("Exception ignored "):
            self.ignored_tick = self.tick
        elif c == "R" and line.startswith("Root Cause"):
            self.elastic_root = True
        elif c == "F" and line.startswith("Failures:"):
            self.elastic_root = False
        elif "Worker PID: " in line:
            self._raylet_line(line, pos)
        elif self.tail > 0 or self.streams:
            self._launcher_line(line, pos)

    def _learn_lead(self, st: Stream) -> bool:
        """The text before `st`'s mid-line traceback as a wrapper on every line, if nothing of
        the traceback was read yet (then it was a record's text that goes on with it)."""
        learnt = st.state == "frames" and st.cur is not None and not st.cur.frames and st.lead is not None
        if learnt:
            self.learned = st.lead
        st.lead = None
        return learnt

    def _feed_json(self, line: str, pos: int, early: bool, nxt: int | None) -> None:
        """A `journalctl -o json` line in a file: its MESSAGE, with the entry's pid and host;
        or a line of Docker's json-file log (`{"log": "...\\n", "stream": ..., "time": ...}`,
        as saved from a container's log file): its text."""
        try:
            entry = json.loads(line)
        except ValueError:
            return
        if not isinstance(entry, dict):
            return
        if "MESSAGE" not in entry and isinstance(entry.get("log"), str):
            self.feed(entry["log"], pos, early=early, nxt=nxt)
            return
        msg = journal_message(entry)
        if msg is None:
            return
        jpid = journal_pid(entry, 0)
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
        said = self._name_process(occ, epoch_list)
        positions = [occ.pos] + [o.pos for o in epoch_list] + [c[2] for c in occ.chained] + [s.pos for s in said]
        mapping = resolve(positions) if resolve else {p: p for p in positions}
        secondary = self._secondaries(occ, epoch_list, mapping)
        procs = self.sig_procs.get(occ.sig, set())
        epochs = self.sig_epochs.get(occ.sig, set())
        rank, pid, node = occ.rank, occ.pid, occ.node
        count = max(1, len(procs))
        if said:
            named = said[0]
            rank, pid, node = named.rank, named.pid if named.pid is not None else pid, named.node or node
            if named.source == RankSource.SAME_ERROR and count > 1:
                count -= 1      # its unnamed copy was the named process's, not another one's
        rc = RootCause(type=occ.type, message=occ.message, rank=rank, frame=occ.frame,
                       log_line=mapping.get(occ.pos), kind=occ.kind, count=count,
                       restarts=max(1, len(epochs)), secondary=secondary, pid=pid, node=node,
                       frames=occ.frames, rank_source=str(said[0].source) if said else None,
                       evidence=evidence(said, mapping))
        return Diagnosis(rc, source, lines, self.tracebacks)
