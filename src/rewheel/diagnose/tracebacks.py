"""Python tracebacks in every shape a log gives them (`TracebackReader`, a part of
`Analyser`): frames and their source lines (also without quotes or indentation), chained
exceptions, exception groups, a traceback begun mid-line after a record's text, a traceback
inside an exception's message (Ray Serve's `RuntimeError: Traceback ...`, DataLoader's
`Original Traceback`, a quoted `_RemoteTraceback`), tracebacks of several ranks interleaved
line by line into one, Ray's remote frames after `RayTaskError(X)`, IPython's and pytest's
forms, a foreign block imitating the header after a message (CANN's `TraceBack`), a structured
logger's rank field after it, and logs cut off at either end. What each line is: `tblines`."""

from __future__ import annotations

import re
from collections.abc import Callable
from collections import deque
from dataclasses import dataclass, field

from rewheel.diagnose.limits import (
    MAX_CHAIN, MAX_FRAMES_KEPT, MAX_MESSAGE_CHARS, MAX_MESSAGE_LINES, MAX_SOURCE_RUN, MAX_STREAMS, MAX_TWINS,
    IDLE_CLOSE_LINES, TAIL_LINES, TB_HEAD)
from rewheel.diagnose.processes import launcher_statement
from rewheel.diagnose.ranking import (
    TB_CASCADE, TB_ERROR, TB_WARN, LOOKUP_TYPES, is_cascade, norm_sig, Occ, exc_line_score)
from rewheel.diagnose.results import Frame
from rewheel.diagnose.tblines import (
    CHAIN_CAUSE, CHAIN_CONTEXT, EXC_RE, FOREIGN_TB_RE, FRAME_RE, GROUP_TYPES, IGNORABLE_IN_TB_RE, IPY_ARROW_RE,
    IPY_FRAME_RE, IPY_SKIP_RE, NESTED_TB_RE, NOT_AN_EXC_LINE_RE, PYTEST_E_RE, PYTEST_LOC_RE, RAY_WRAP_RE,
    RECORD_START_RE, SHUTDOWN_FUNCS, SPAN_FIELD_RE, SPAWN_CHILD_RE, PROSE_TYPE_RE, WRAPPED_FRAME_MIN,
    decoration, exception_line, func_name, in_package, ray_actor)


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
    wraps: bool = False               # its message is the formatted traceback of the real failure

    @property
    def message(self) -> str:
        return "\n".join(self.message_lines).rstrip()


@dataclass
class Stream:
    key: tuple
    label: str | None
    pid: int | None
    jpid: int | None
    ident: str | None
    level: str | None
    state: str = "frames"             # frames | msg | after | chain | group | skip
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
    opened_by: tuple[str | None, int | None] = (None, None)  # a mid-line traceback: its line's prefix
    twins: int = 0                    # tracebacks of other processes read into this one (interleaved)
    opened: int = 0                   # the tick it began at
    partial: str | None = None        # a frame line cut by a hard wrap, awaiting its rest
    lead: re.Pattern[str] | None = None  # a mid-line traceback: the text before it, as a pattern
    rank_source: str | None = None    # what named `label` (see processes.RankSource)
    ignored: bool = False             # Python's "Exception ignored in: ..." before it: never the cause
    merged: bool = False              # several processes' tracebacks read as one (twins)
    lines: int = 0                    # lines of its frames read, and blank ones among them: a paste
    blanks: int = 0                   # with a blank line after every line has as many of each
    msg_blank: bool = False           # ... and there one blank line inside its message goes on with it
    spawned: str | None = None        # torch.multiprocessing.spawn: the child whose traceback follows

    @property
    def blank_paste(self) -> bool:
        return self.blanks >= 2 and self.blanks >= self.lines - self.blanks - 1


class TracebackReader:
    """`Analyser`'s part that reads tracebacks, one stream (process) at a time."""

    # (state set up by Analyser.__init__; `_register` is the ranking's, see ranking.py)
    package: str | None
    _register: Callable[[Occ, int | None, str | None, str | None, int | None], None]
    streams: dict[tuple, Stream]
    tick: int
    tracebacks: int
    bare: Stream | None
    last_def: str | None
    pytest_frames: deque[Frame]
    learned: re.Pattern[str] | None
    cut_frame: tuple[Stream, int] | None
    tail: int
    cut_tick: int

    def _open(self, key: tuple, label: str | None, pid: int | None, jpid: int | None,
              ident: str | None, level: str | None, pos: int, node: str | None = None) -> Stream:
        if len(self.streams) >= MAX_STREAMS:
            oldest = min(self.streams.values(), key=lambda s: s.last_tick)
            self._close(oldest, truncated_end=oldest.state == "frames")
            del self.streams[oldest.key]
        st = Stream(key, label, pid, jpid, ident, level, last_tick=self.tick, node=node, opened=self.tick,
                    rank_source="prefix" if label else None)
        st.cur = _Exc(None, [], pos)
        self.streams[key] = st
        return st

    def _continue(self, st: Stream, line: str, pos: int, header: str = "") -> bool:
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
                if not text or decoration(text):
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
            if "Traceback (most recent call last)" in line and NESTED_TB_RE.match(line.strip()) and (
                    not line.startswith("Traceback") or not exc.message.strip().strip("\"'")):
                # "Original Traceback (most recent call last):" after DataLoader's "Caught X in
                # DataLoader worker process 0.", or a remote traceback quoted in the message
                self._nest(st, pos)
                return True
            if line.startswith("Traceback (most recent call last)"):
                return self._next_traceback(st, pos)
            if self._spawned(st, line):
                return True
            if not line.strip() and st.blank_paste and not st.msg_blank:
                st.msg_blank = True
                return True
            st.msg_blank = False
            if not line.strip().strip("\"'"):
                # (a remote traceback quoted in the message ends with its closing quotes)
                st.state = "after"
                return True
            if line in (CHAIN_CONTEXT, CHAIN_CAUSE):
                st.chained_marker = True
                st.state = "chain"
                return True
            if self._span_field(st, line):
                return True
            if FOREIGN_TB_RE.match(line):
                st.state = "skip"
                return True
            if RECORD_START_RE.match(line) or FRAME_RE.match(line) or launcher_statement(line):
                # (a launcher's word on its child is its own record, not the child's message)
                self._finish_stream(st)
                return False
            if st.twins and exception_line(line):
                # the interleaved twin's exception line: the cleaner of the two is kept
                st.twins -= 1
                m = EXC_RE.match(line)
                if m and exc_line_score(m.group("type"), m.group("msg") or "") > \
                        exc_line_score(exc.type or "", exc.message):
                    exc.type = m.group("type")
                    exc.message_lines = [(m.group("msg") or "").rstrip()]
                    exc.chars = len(exc.message_lines[0])
                return True
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
        if st.state == "skip":
            if not line.strip() or line[:1] in (" ", "\t"):
                return True
            self._finish_stream(st)
            return False
        if st.state in ("after", "chain"):
            if not line.strip():
                return True
            if st.state == "after":
                # (a paste with a blank line after every line: the rank field, DataLoader's
                # "Original Traceback", after a blank line)
                if self._span_field(st, line):
                    return True
                if not line.startswith("Traceback") and NESTED_TB_RE.match(line.strip()):
                    self._nest(st, pos)
                    return True
            if line in (CHAIN_CONTEXT, CHAIN_CAUSE):
                st.chained_marker = True
                st.state = "chain"
                return True
            if line.startswith("Traceback (most recent call last)"):
                return self._next_traceback(st, pos)
            if st.state == "after" and self._spawned(st, line):
                return True
            self._finish_stream(st)
            return False
        return False

    def _frames(self, st: Stream, line: str, pos: int) -> bool:
        exc = st.cur
        assert exc is not None
        st.lines += 1
        if not line.strip():
            st.blanks += 1
        if st.ipython and self._ipython_frame(st, exc, line):
            return True
        if st.pytest:
            return self._pytest_msg(st, line, pos)
        if st.partial is not None:
            # the rest of a frame line a terminal copy hard-wrapped inside its path
            joined, st.partial = st.partial + line, None
            if FRAME_RE.match(joined):
                line = joined
        if line.startswith(" "):
            m = FRAME_RE.match(line)
            if not m and len(line) >= WRAPPED_FRAME_MIN and line.lstrip().startswith("File "):
                st.partial = line
                self.cut_frame = (st, self.tick)
                return True
            if m:
                if st.indent is None:
                    # a traceback that began mid-line: its lines are indented like this one
                    st.indent = max(0, len(line) - len(line.lstrip(" ")) - 2)
                    line = line[st.indent:]
                fr = Frame(m.group("file") or m.group("bare").strip(), int(m.group("line")),
                           func_name(m.group("func")))
                self._add_frame(st, exc, fr)
                return True
            text = line.strip()
            if st.pending is not None and text and not decoration(text):
                st.pending.source = text[:500]
                st.pending = None
            return True
        if not line.strip():
            return True
        if line.startswith("Traceback (most recent call last)"):
            if exc.frames <= 2 and not st.chain and st.twins < MAX_TWINS:
                # Another process's traceback, interleaved line by line with this one (ranks
                # writing to one terminal without prefixes): read as one, its repeated frames
                # once (see _add_frame) and the cleaner exception line of the two.
                st.twins += 1
                st.merged = True
                return True
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
                                               func_name(m.group("func"))))
                return True
        text = line.strip()
        if decoration(text):
            return True
        if (st.pending is not None or 0 < st.source_run < MAX_SOURCE_RUN) and not exception_line(line):
            # ... and so are their source lines (a statement may span several)
            if st.pending is not None:
                st.pending.source = text[:500]
                st.pending = None
            st.source_run += 1
            return True
        ray = RAY_WRAP_RE.match(line) if "ray::" in line else None
        m = EXC_RE.match(line)
        if ray:
            # Ray's wrapper of a remote failure: unwrap to the remote exception; its frames
            # and its own exception line follow, in the remote process (pid, node ip).
            exc.type = ray.group("inner") or ray.group("died") or exc.type or "RayTaskError"
            exc.wrapper = True
            st.remote = (ray_actor(ray.group("call")), int(ray.group("pid")), ray.group("ip"))
            msg = line[line.index(": ") + 2:] if ": " in line else ""
        elif m and exception_line(line):
            exc.type = m.group("type")
            msg = m.group("msg") or ""
            exc.wrapper = False
        elif m:
            # a bare lowercase word where the exception line should be: the traceback was cut
            # off and other output goes on
            self._finish_stream(st, truncated_end=True)
            return False
        elif exc.frames and not st.chain and (NOT_AN_EXC_LINE_RE.match(line) or PROSE_TYPE_RE.search(line)):
            # a sentence where the exception line should be: the traceback was cut off there
            # (its process died, or another writer's output goes on, or a person tells the error)
            self._finish_stream(st, truncated_end=True)
            return False
        else:
            exc.type = None
            msg = line
            exc.wrapper = False
        exc.message_lines = [msg.rstrip()]
        exc.chars = len(msg)
        st.pending = None
        st.state = "msg"
        if msg.startswith(TB_HEAD):
            # "RuntimeError: Traceback (most recent call last):": the message is the traceback
            # of the failure it wraps, which follows
            self._nest(st, pos)
        return True

    def _spawned(self, st: Stream, line: str) -> bool:
        """torch.multiprocessing.spawn's "-- Process 2 terminated with the following error:":
        the exception's message is that child's traceback (read next, as the cause)."""
        m = SPAWN_CHILD_RE.match(line) if line[:3] == "-- " else None
        if m is None:
            return False
        st.spawned = f"rank{m.group('rank')}"
        return True

    def _span_field(self, st: Stream, line: str) -> bool:
        """A structured logger's field after the message (TGI's " rank=0"): the process."""
        span = SPAN_FIELD_RE.match(line)
        if span is None:
            return False
        if not st.label:
            st.label, st.rank_source = f"rank={span.group('rank')}", "field"
        st.state = "after"
        return True

    def _nest(self, st: Stream, pos: int) -> None:
        """The current exception's message goes on with a traceback: the exception it wraps.
        Both stay in the chain; the wrapped one is the cause (see _pick_from_chain)."""
        assert st.cur is not None
        st.cur.wraps = True
        if len(st.chain) < MAX_CHAIN:
            st.chain.append(st.cur)
        st.cur = _Exc(None, [], pos)
        st.state = "frames"
        st.pending = None
        st.chained_marker = False

    def _add_frame(self, st: Stream, exc: _Exc, fr: Frame) -> None:
        if st.twins and any(f.line == fr.line and f.file == fr.file and f.function == fr.function
                            for f in exc.frame_list):
            return    # the interleaved twin's copy of a frame already read
        exc.frames += 1
        exc.last_frame = fr
        exc.frame_list.append(fr)
        st.source_run = 0
        if in_package(fr.file, self.package):
            exc.last_pkg_frame = fr
        if fr.function in SHUTDOWN_FUNCS:
            exc.shutdown = True
        st.pending = fr

    def _ipython_frame(self, st: Stream, exc: _Exc, line: str) -> bool:
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
        self._add_frame(st, exc, Frame(file, int(num) if num else 0, func_name(m.group("func"))))
        return True

    def _pytest_msg(self, st: Stream, line: str, pos: int) -> bool:
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

    def _next_traceback(self, st: Stream, pos: int) -> bool:
        if st.spawned is not None:
            if not st.label:
                st.label, st.rank_source = st.spawned, "launcher"
            st.spawned = None
            self._nest(st, pos)
            return True
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

    def _reopen(self, st: Stream, pos: int) -> None:
        """A new traceback in the place of `st` (same key, identity and form)."""
        new = self._open(st.key, st.label, st.pid, st.jpid, st.ident, st.level, pos, st.node)
        new.indent, new.ipython, new.rank_source = st.indent, st.ipython, st.rank_source
        if self.bare is st:
            self.bare = new

    def _finish_stream(self, st: Stream, truncated_end: bool = False) -> None:
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

    def _close(self, st: Stream, truncated_end: bool) -> None:
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
        self.tail = TAIL_LINES
        pick = _pick_from_chain(chain)
        exc = chain[pick]
        if exc.type is None:
            self.cut_tick = self.tick      # a sentence after it may tell its error (errorlines)
        frame = exc.last_pkg_frame or exc.last_frame
        if frame is None:
            for other in reversed(chain):
                frame = other.last_pkg_frame or other.last_frame
                if frame is not None:
                    break
        message = exc.message
        # An error raised on the way down (an executor's shutdown, a destructor) after
        # another failure is that failure's consequence.
        cascade = is_cascade(exc.type, message) or exc.shutdown or st.ignored
        if cascade:
            category = TB_CASCADE
        elif st.level in ("WARNING", "WARN", "INFO", "DEBUG"):
            category = TB_WARN
        else:
            category = TB_ERROR
        others = [(e.type, e.message, e.pos) for i, e in enumerate(chain) if i != pick]
        rank, pid, node = st.label, st.pid if st.pid is not None else st.jpid, st.node
        source = st.rank_source if rank else None
        if st.remote is not None:
            rank = f"{st.remote[0]} pid={st.remote[1]}"
            pid, node, source = st.remote[1], st.remote[2] or node, "ray-task"
        frames = list(reversed(exc.frame_list)) or next(
            (list(reversed(e.frame_list)) for e in reversed(chain) if e.frame_list), [])
        occ = Occ("traceback", category, exc.type, message, norm_sig(exc.type, message),
                   rank, chain[0].pos, frame, others, cascade, pid, node, frames, span=(st.opened, self.tick),
                   rank_source=source, merged=st.merged)
        self._register(occ, st.jpid, st.ident, st.label, st.pid)


def _pick_from_chain(chain: list[_Exc]) -> int:
    """The original exception of a chain — unless it is a cascade, or a bare lookup failure
    that the code answered with a more telling error (KeyError -> "model type not
    recognised"): then the first later one that is neither."""
    if len(chain) == 1:
        return 0
    for i, exc in enumerate(chain):
        if is_cascade(exc.type, exc.message) or (exc.wraps and i + 1 < len(chain)):
            continue
        base = (exc.type or "").rsplit(".", 1)[-1]
        if (base in LOOKUP_TYPES or base in GROUP_TYPES) and any(
                not is_cascade(e.type, e.message) for e in chain[i + 1:]):
            continue
        return i
    return len(chain) - 1
