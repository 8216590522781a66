"""Rich's word wrap inside a box, undone: whether a box line goes on with the text of the line
before it, and how the two join.

Rich wraps a line that is wider than its box (`rich._wrap.divide_line`) in two ways:

- at a space: a word that does not fit in what is left of the line starts the next line, the
  space stays behind (`...py:83 in` / `serve`);
- inside a word: a word wider than the whole line is folded into chunks exactly as wide as
  the line (cells, not characters), anywhere in it — after a `/`, between the digits of a line
  number (`...py:10` / `00 in build`).

A line cut inside a word holds nothing but a chunk of it, so a line with a space in it was
broken at a space. Where the box's right border is there, the line's width is known too: a
line goes on with the one before only if its first word did not fit after it, and the two
join without a space only if the line before was full. A line that lost its right border
(a paste) has the width of the box's top border; with neither, a line of one word is joined
without a space, except between a header's `:LINE` and its `in`, and after its `in`.
"""

from __future__ import annotations

import re

from rich.cells import cell_len

# a header broken at the space between its `:LINE` and `in func`
LINE_NUMBER_END_RE = re.compile(r":\d+$")
STARTS_WITH_IN_RE = re.compile(r"in(?: |$)")


def box_content(line: str) -> tuple[str, int, int | None]:
    """A box line's text between its borders (`│ text │`), the cells it takes from the line's
    start (behind the one space of padding: a line begun after a break at a space may start
    with one), and the width Rich wrapped it to (None where the right border is missing)."""
    inner = line[1:].rstrip()
    width = None
    if inner.endswith("│"):
        inner = inner[:-1]
        width = max(cell_len(inner) - 2, 1)     # a space of padding on each side
    return inner.strip(), cell_len(inner[1:].rstrip()), width


def border_width(top: str) -> int:
    """The width of the lines in a box, from its top border (`╭─── Traceback ───╮`)."""
    return max(cell_len(top.rstrip()) - 4, 1)


def cut_in_word(last: str, used: int, width: int | None) -> bool:
    """Whether a line (`last`, its text; `used` cells) may have been cut inside a word: Rich
    folds only a word wider than the line, each chunk on a line of its own and filling it (a
    wide character that did not fit may leave one cell free). Unknown width: any one word."""
    return " " not in last and (width is None or used >= width - 1)


def goes_on(used: int, text: str, width: int | None) -> bool:
    """Whether `text` (a box line's content) can be the rest of the line before it, that took
    `used` cells: its first word did not fit after it. Unknown width: it can."""
    if not text:
        return False
    if width is None:
        return True
    return used + 1 + cell_len(text.split(" ", 1)[0]) > width


def joint(before: str, last: str, used: int, text: str, width: int | None) -> str:
    """What stood between `before` (the text so far; `last`, its last line, took `used` cells)
    and `text`, where Rich broke the line: a space, or nothing inside a folded word."""
    if before.endswith(" in") or (LINE_NUMBER_END_RE.search(before) and STARTS_WITH_IN_RE.match(text)):
        return " "
    if " " in last:
        return " "          # a line cut inside a word holds nothing but that word's chunk
    if width is not None and used + cell_len(text[:1]) <= width:
        return " "          # the first character would have fit: Rich broke at a space
    return ""
