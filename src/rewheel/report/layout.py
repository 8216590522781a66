"""Layout: `--plain` (one fact per line), tables that fit the console whole or stack (never
cutting a version, hash or id), and the consoles (`fitted_console`): lines wrapped between words
with the indent kept and paths shortened on a terminal, nothing wrapped in a pipe or a file."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rewheel.report.text import clean, show_path

if TYPE_CHECKING:  # rich is imported by the renderers that run, not with this module
    from rich.console import Console


# `--plain` (or stdout not a terminal, e.g. a CI log): one fact per line, greppable. None:
# decided per console. Set once by the CLI.
PLAIN: bool | None = None


def is_plain(console: Console) -> bool:
    """One fact per line instead of tables: asked for (`--plain`), or not a terminal."""
    return PLAIN if PLAIN is not None else not console.is_terminal


def _plain(console: Console, text: str, style: str = "") -> None:
    """One line of text from outside rewheel, as it is: never markup, never cut or folded
    (a long line wraps at the terminal's edge and stays whole for grep and copy)."""
    console.print(clean(text, lines=False), style=style or None, markup=False, highlight=False,
                  soft_wrap=True)


def _table_or_stack(console: Console, title: str, columns: tuple[str, ...], rows: Sequence[tuple[str, ...]],
                    *, head: tuple[int, ...] = (0,), styles: list[str] | None = None,
                    arrow: tuple[int, int] | None = None, wrap: tuple[int, ...] = ()) -> None:
    """A table when it fits the console (no column squeezed, no cell cut or folded); else
    each row stacked: its `head` cells on one line, then one line per other cell (`arrow`:
    two cells shown as `old → new` on one line when that fits). Columns in `wrap` hold
    words (labels, lists of versions), which the table may wrap between words, never inside
    one."""
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    t = Table(title=clean(title, lines=False), title_justify="left")

    # Each column's width: its longest line; a word column (`wrap`) may go down to its
    # longest word. A table only when the table at those widths fits (one space of padding
    # each side, the borders); every column then gets an exact width, so rich never squeezes
    # or cuts one. What is left of the console's width goes to the word columns, up to their
    # longest line.
    def longest(j: int, words: bool) -> int:
        return max(cell_len(clean(piece)) for cell in (columns[j], *(row[j] for row in rows))
                   for piece in (str(cell).split() if words else str(cell).split("\n")))

    natural = [longest(j, False) for j in range(len(columns))]
    widths = [longest(j, True) if j in wrap else natural[j] for j in range(len(columns))]
    spare = console.width - (sum(widths) + 3 * len(columns) + 1)
    if spare >= 0:
        for j in wrap:
            more = min(spare, natural[j] - widths[j])
            widths[j] += more
            spare -= more
        for j, col in enumerate(columns):
            t.add_column(col, width=widths[j], no_wrap=j not in wrap)
        for i, row in enumerate(rows):
            t.add_row(*(Text(clean(cell)) for cell in row), style=(styles[i] if styles else "") or None)
        console.print(t)
        return
    _plain(console, f"{clean(title, lines=False)}:")
    width = console.width
    for i, row in enumerate(rows):
        style = (styles[i] if styles else "") or ""
        _plain(console, "  ".join(row[j] + (" builds" if columns[j] == "builds" else "")
                                  for j in head if row[j]), style=style)
        rest = [j for j in range(len(columns)) if j not in head]
        if arrow is not None:
            a, b = arrow
            both = f"    {row[a]} → {row[b]}"
            if len(both) <= width:
                _plain(console, both)
            else:
                _plain(console, f"    {columns[a]} {row[a]}")
                _plain(console, f"    {columns[b]} {row[b]}")
            rest = [j for j in rest if j not in arrow]
        for j in rest:
            for k, line in enumerate(str(row[j]).split("\n")):
                if line:
                    _plain(console, f"    {columns[j] + ':' if k == 0 else '':<{len(columns[j]) + 1}} {line}")


# A line's indent, with the gutter of a tool's streamed output (`  │ `): kept on the lines a
# long line is wrapped onto.
_INDENT = re.compile(r" *(?:│ )?")


_CONSOLE_CLASS: type | None = None


def fitted_console(**kw: object) -> Console:
    """A rich Console for rewheel's human text. On a terminal every line of text is fitted to
    its width: wrapped between words only, the continuation indented like the line (two more
    spaces), a word or path longer than the room never cut (it gets a line of its own). On
    anything else (a pipe, a file, a CI log) nothing is wrapped: each line is written whole,
    whatever COLUMNS says, so a diff applies and grep finds a path."""
    global _CONSOLE_CLASS
    if _CONSOLE_CLASS is None:
        _CONSOLE_CLASS = _make_console_class()
    return _CONSOLE_CLASS(**kw)  # type: ignore[no-any-return]


def _make_console_class() -> type:
    from rich.console import Console as RichConsole
    from rich.text import Text

    class Fitted(RichConsole):
        def print(self, *objects: object, sep: str = " ", end: str = "\n", style: object = None,  # type: ignore[override]
                  markup: bool | None = None, highlight: bool | None = None, soft_wrap: bool | None = None,
                  **kw: object) -> None:
            if not self.is_terminal:  # never wrapped: each line whole
                super().print(*objects, sep=sep, end=end, style=style, markup=markup,  # type: ignore[arg-type]
                              highlight=highlight, soft_wrap=True, **kw)  # type: ignore[arg-type]
                return
            if not objects or not all(isinstance(o, (str, Text)) for o in objects) or kw.get("width"):
                super().print(*objects, sep=sep, end=end, style=style, markup=markup,  # type: ignore[arg-type]
                              highlight=highlight, soft_wrap=soft_wrap, **kw)  # type: ignore[arg-type]
                return
            text = Text(end="")
            for i, o in enumerate(objects):
                if i:
                    text.append(sep)
                text.append(o if isinstance(o, Text) else self.render_str(
                    shorten_paths(self, str(o)), markup=markup, highlight=False, emoji=False))
            lines = [piece for line in text.split("\n", allow_blank=True)
                     for piece in fit_text(line, self.width)]
            for i, line in enumerate(lines):
                super().print(line, style=style, end=end if i == len(lines) - 1 else "\n",  # type: ignore[arg-type]
                              soft_wrap=True, highlight=False, markup=False, emoji=False)

    return Fitted


# An absolute path in a message: not part of a URL (`http://host/x`) or of another path.
_ABS_PATH = re.compile(r"(?<![\w~.:/\\])/(?:[\w.@+-]+/)*[\w.@+-]+")


def shorten_paths(console: Console, text: str) -> str:
    """The absolute paths in a message, as `show_path` shows them on a terminal (relative to
    the current folder, else `~/…`): what keeps a line's paths whole at 80 columns, and
    still pastes from where the command ran. Elsewhere the text as it is."""
    if not console.is_terminal or "/" not in text:
        return text
    return _ABS_PATH.sub(lambda m: show_path(console, m.group()), text)


def fit_text(line, width: int) -> list:  # rich.text.Text -> list[Text]
    """One line of text wrapped to `width` between words (spaces) only; continuation lines
    carry the line's indent (and its `│ ` gutter) and two more spaces. A word longer than the
    room is never cut: it starts its own line, at the indent when it fits there, else at the
    line's start (only a word longer than the whole width overflows)."""
    from rich.cells import cell_len
    from rich.text import Text

    plain = line.plain
    if cell_len(plain) <= width:
        return [line]
    indent = _INDENT.match(plain).group()  # type: ignore[union-attr]
    cont = indent + "  "
    # The words (after the indent): their [start, end) offsets in `plain`.
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", plain[len(indent):])]
    words = [(s + len(indent), e + len(indent)) for s, e in words]
    out: list[Text] = []
    cur: Text | None = None
    cur_len = 0
    first = True
    prev_end = 0
    for s, e in words:
        piece = line[s:e]
        n = cell_len(piece.plain)
        gap = plain[prev_end:s]  # the spaces as written: columns of a plain line stay apart
        prev_end = e
        if cur is not None and cur_len + len(gap) + n <= width:
            cur.append(gap)
            cur.append(piece)
            cur_len += len(gap) + n
            continue
        if cur is not None:
            out.append(cur)
        lead = indent if first else cont
        if cell_len(lead) + n > width:
            lead = ""
        cur = Text(lead)
        cur.append(piece)
        cur_len = cell_len(lead) + n
        first = False
    if cur is not None:
        out.append(cur)
    return out or [line]
