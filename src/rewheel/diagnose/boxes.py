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
may be wrapped over several box lines: the function on the next line, or the path folded
mid-name. The line marked `❱` is the frame's source, behind its indent guides (`│   `).
Locals panels and code around the marked line are not the traceback's. The exception line
follows the box at column 0, as in a plain traceback. A box whose top was cut off (only its
lower half pasted) is a traceback from its first frame header on.

`Boxes.translate` turns one box line into the plain lines it stands for — the header, a
`  File "...", line N, in f` line, a source line, or nothing — which `Analyser` reads as any
traceback, with the prefixes the box line had.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
HEADER_PIECES = 4               # box lines one frame header may be wrapped over
# a folded header goes on without a space, unless the piece so far ends with ":LINE" or " in"
JOIN_WITH_SPACE_RE = re.compile(r"(?::\d+| in)$")


@dataclass
class _Box:
    opened: bool                  # the traceback's header was given (its top border, or a first frame)
    partial: str | None = None    # a frame header wrapped over box lines, so far
    partial_pos: int = 0
    pieces: int = 0


class Boxes:
    """The Rich boxes being read, by the stream (process) whose lines they are."""

    def __init__(self) -> None:
        self.boxes: dict[tuple, _Box] = {}

    def translate(self, key: tuple, line: str, pos: int) -> list[tuple[str, int]] | None:
        """The plain traceback lines one box line stands for (with the position each is read
        at); None where `line` is not part of a box traceback."""
        c = line[:1]
        box = self.boxes.get(key)
        if c in "╭┌":
            m = TOP_RE.match(line)
            if not m:
                return None
            if not (m.group("title") or "").startswith("Traceback"):
                return None if box is None else []
            self._keep(key, _Box(opened=True))
            return [(TB_HEAD + ":", pos)]
        if c in "╰└":
            if box is None or not BOTTOM_RE.match(line):
                return None
            del self.boxes[key]
            return []
        if c != "│":
            return None
        content = line[1:]
        if content.endswith("│"):
            content = content[:-1]
        content = content.strip()
        if content[:1] in BOX_START or HIDDEN_RE.match(content):
            # a locals panel inside the box, Rich's "... 3 frames hidden ..."
            return None if box is None else []
        if box is None:
            # a box cut at the top: it is a traceback from its first frame header on
            if not content or not HEADER_START_RE.match(content) or CODE_RE.match(content):
                return None
            box = self._keep(key, _Box(opened=False))
        if not content:
            box.partial = None
            return []
        code = CODE_RE.match(content) if box.partial is None else None
        if code:
            if not code.group("mark") or not box.opened:
                return []
            source = GUIDES_RE.sub("", code.group("code") or "").strip()
            return [("    " + source, pos)] if source else []
        return self._header(box, content, pos)

    def _header(self, box: _Box, content: str, pos: int) -> list[tuple[str, int]]:
        if box.partial is None:
            if not HEADER_START_RE.match(content):
                return []
            box.partial, box.partial_pos, box.pieces = content, pos, 1
        else:
            sep = " " if JOIN_WITH_SPACE_RE.search(box.partial) else ""
            box.partial += sep + content
            box.pieces += 1
        text = box.partial
        m = HEADER_RE.fullmatch(text) or NOFILE_HEADER_RE.fullmatch(text)
        if m is None:
            if box.pieces >= HEADER_PIECES:
                box.partial = None
            return []
        box.partial = None
        file = m.groupdict().get("file") or "<unknown>"
        out = [] if box.opened else [(TB_HEAD + ":", box.partial_pos)]
        box.opened = True
        out.append((f'  File "{file}", line {m.group("line")}, in {m.group("func")}', box.partial_pos))
        return out

    def _keep(self, key: tuple, box: _Box) -> _Box:
        if len(self.boxes) >= MAX_STREAMS and key not in self.boxes:
            self.boxes.pop(next(iter(self.boxes)))
        self.boxes[key] = box
        return box
