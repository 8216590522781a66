"""Tracebacks drawn in a box by Rich (`rich.traceback`, typer's pretty exceptions: TGI's
shards, typer and click CLIs), read as the plain traceback they draw (`Boxes`).

    ╭───────────────────── Traceback (most recent call last) ──────────────────────╮
    │ /opt/conda/lib/python3.10/site-packages/text_generation_server/cli.py:83 in  │
    │ serve                                                                        │
    │                                                                              │
    │    82 │   │   )                                                              │
    │ ❱  83 │   server.serve(                                                      │
    │ ╭──────── locals ────────╮                                                   │
    │ │ dtype = None           │                                                   │
    │ ╰────────────────────────╯                                                   │
    │ /opt/conda/lib/python3.10/site-packages/text_generation_server/utils/weights │
    │ .py:64 in get_filename                                                       │
    ╰──────────────────────────────────────────────────────────────────────────────╯
    RuntimeError: weight model.layers.0.self_attn.q_proj.weight does not exist

Each frame's header (`path:LINE in func`, or `in func:LINE` for a file that is not on disk)
may be wrapped over any number of box lines — the function on the next line, the path folded
anywhere, after a `/` or between the digits of the line number — and is joined as Rich broke
it (`boxwrap`). The line marked `❱` is the frame's source, behind its indent guides (`│   `).
Locals panels and code around the marked line are not the traceback's. The exception line
follows the box at column 0, as in a plain traceback. A box whose top was cut off (only its
lower half pasted) is a traceback from its first frame header on (cut inside a wrapped
header, that header is read from the line the paste begins with: its head is gone).

`Boxes.translate` turns one box line into the plain lines it stands for — the header, a
`  File "...", line N, in f` line, a source line, or nothing — which `Analyser` reads as any
traceback, with the prefixes the box line had.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rewheel.diagnose.boxwrap import border_width, box_content, cut_in_word, goes_on, joint
from rewheel.diagnose.limits import MAX_STREAMS, TB_HEAD

BOX_START = "╭┌│╰└"
TOP_RE = re.compile(r"[╭┌]─*(?: (?P<title>[^─]*?) ─*)?[╮┐]?$")
BOTTOM_RE = re.compile(r"[╰└]─*[╯┘]?$")
HEADER_RE = re.compile(r"(?P<file>\S.*?):(?P<line>\d+) in (?P<func>\S+)")
NOFILE_HEADER_RE = re.compile(r"in (?P<func>\S+):(?P<line>\d+)")
# where a header begins: a path (absolute, home, Windows, relative with a folder), or "in f:N"
HEADER_START_RE = re.compile(r"(?:/|~|\.{1,2}/|[A-Za-z]:\\|<|[\w.\-]+/|in \S)")
CODE_RE = re.compile(r"(?P<mark>❱|>)?\s*(?P<num>\d+)(?: (?P<code>.*))?$")
GUIDES_RE = re.compile(r"^(?:│\s*)+")
HIDDEN_RE = re.compile(r"\.\.\. \d+ frames? hidden \.\.\.|\[\.\.\. ")
MAX_HEADER_CHARS = 4096 + 256   # a frame header wrapped over box lines: a path (PATH_MAX), a name


@dataclass
class _Box:
    opened: bool                  # the traceback's header was given (its top border, or a first frame)
    drawn: int | None = None      # the width its top border gives its lines (where that was read)
    partial: str | None = None    # a frame header wrapped over box lines, so far
    partial_pos: int = 0
    last: str = ""                # its last box line's text
    used: int = 0                 # the cells that line took
    width: int | None = None      # the width Rich wrapped that line to (None: not known)
    held: re.Match[str] | None = None   # the header, once whole (its function may go on)


class Boxes:
    """The Rich boxes being read, by the stream (process) whose lines they are."""

    def __init__(self) -> None:
        self.boxes: dict[tuple, _Box] = {}

    def translate(self, key: tuple, line: str, pos: int) -> list[tuple[str, int]] | None:
        """The plain traceback lines one box line stands for (with the position each is read
        at); None where `line` is not part of a box traceback."""
        c = line[:1]
        box = self.boxes.get(key)
        out: list[tuple[str, int]] = []
        if c in "╭┌":
            m = TOP_RE.match(line)
            if not m:
                return None
            if box is not None:
                out = self._end_header(box)
            if not (m.group("title") or "").startswith("Traceback"):
                return None if box is None else out
            self._keep(key, _Box(opened=True, drawn=border_width(line)))
            return out + [(TB_HEAD + ":", pos)]
        if c in "╰└":
            if box is None or not BOTTOM_RE.match(line):
                return None
            del self.boxes[key]
            return self._end_header(box)
        if c != "│":
            return None
        content, used, width = box_content(line)
        if width is None and box is not None:
            width = box.drawn       # a line that lost its right border: the top border's width
        if box is not None and box.partial is not None and not self._goes_on(box, content, width):
            out = self._end_header(box)
        if content[:1] in BOX_START or HIDDEN_RE.match(content):
            # a locals panel inside the box, Rich's "... 3 frames hidden ..."
            return None if box is None else out
        if box is None:
            # a box cut at the top: it is a traceback from its first frame header on
            if not content or not HEADER_START_RE.match(content) or CODE_RE.match(content):
                return None
            box = self._keep(key, _Box(opened=False))
        if not content:
            return out
        code = CODE_RE.match(content) if box.partial is None else None
        if code:
            if not code.group("mark") or not box.opened:
                return out
            source = GUIDES_RE.sub("", code.group("code") or "").strip()
            return out + [("    " + source, pos)] if source else out
        return out + self._header(box, content, used, width, pos)

    @staticmethod
    def _goes_on(box: _Box, content: str, width: int | None) -> bool:
        """Whether a box line is the rest of the frame header read so far."""
        if content[:1] in BOX_START or HIDDEN_RE.match(content):
            return False
        if box.width is not None and width is not None and width != box.width:
            return False            # another box's line
        if not goes_on(box.used, content, box.width):
            return False
        # after a whole header, only the rest of its function
        return box.held is None or _match(_joined(box, content)) is not None

    def _header(self, box: _Box, content: str, used: int, width: int | None, pos: int) -> list[tuple[str, int]]:
        if box.partial is None:
            if not HEADER_START_RE.match(content):
                return []
            text = content
            box.partial_pos = pos
        else:
            text = _joined(box, content)
        box.partial, box.last, box.used, box.width, box.held = text, content, used, width, _match(text)
        if box.held is None:
            if len(text) > MAX_HEADER_CHARS:
                box.partial = None
            return []
        if cut_in_word(content, used, width):
            return []               # a function folded over lines may go on in the next one
        return self._end_header(box)

    @staticmethod
    def _end_header(box: _Box) -> list[tuple[str, int]]:
        """The header read so far is over: the frame it names, if it was whole."""
        m, box.held, box.partial = box.held, None, None
        if m is None:
            return []
        out = [] if box.opened else [(TB_HEAD + ":", box.partial_pos)]
        box.opened = True
        file = m.groupdict().get("file") or "<unknown>"
        out.append((f'  File "{file}", line {m.group("line")}, in {m.group("func")}', box.partial_pos))
        return out

    def _keep(self, key: tuple, box: _Box) -> _Box:
        if len(self.boxes) >= MAX_STREAMS and key not in self.boxes:
            self.boxes.pop(next(iter(self.boxes)))
        self.boxes[key] = box
        return box


def _joined(box: _Box, content: str) -> str:
    """The header so far and its next box line, joined as Rich broke them."""
    before = box.partial or ""
    return before + joint(before, box.last, box.used, content, box.width) + content


def _match(text: str) -> re.Match[str] | None:
    return HEADER_RE.fullmatch(text) or NOFILE_HEADER_RE.fullmatch(text)
