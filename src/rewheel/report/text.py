"""Text for a terminal, shared by every renderer: text from outside rewheel made safe (`clean`,
`escape`), paths shown short enough to stay whole (`show_path`), sizes in words (`human_bytes`),
the command line as typed for a hint to retry it (`ARGV`, `typed_line`), an error's lines
(`print_error`), and a run's downtime in words."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rewheel.errors import RewheelError

if TYPE_CHECKING:  # rich is imported by the renderers that run, not with this module
    from rich.console import Console


# What must never reach a terminal raw from text rewheel did not write (labels, paths,
# versions, log lines, file contents, messages quoting them): C0 and C1 control characters
# and DEL (an ESC starts sequences that clear the screen or set the window title), bidi
# overrides (text that reads differently than it is), and surrogate-escaped bytes of
# non-UTF-8 file names (unprintable; an encoding error on a strict stream).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


_UNSAFE_LINES = re.compile("[\n\t]")


def _visible(m: re.Match[str]) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def clean(text: object, *, lines: bool = True) -> str:
    """`text` safe for a terminal: every control character (but newline and tab, unless
    `lines=False`), bidi override and undecodable byte shown as a visible escape (`\\x1b`).
    Every human rendering of text from files goes through this (`escape` does it); JSON
    keeps the raw text."""
    out = _UNSAFE.sub(_visible, str(text))
    return out if lines else _UNSAFE_LINES.sub(_visible, out)


def escape(text: object) -> str:
    """Text from outside rewheel for a rich markup string: control characters made visible
    (`clean`), then markup escaped."""
    from rich.markup import escape as _escape_markup

    return _escape_markup(clean(text))


# The command line as typed (after `rewheel`), set once by the CLI: a hint that retries it with a
# flag changed is this line, pasteable as it is. None (a caller without one): the plain form.
ARGV: list[str] | None = None


def typed_line(fallback: str, *, add: str = "", drop: str = "") -> str:
    """`rewheel` and the command line as typed, `drop` left out and `add` appended; `fallback`
    (the command without the person's other flags) where no command line is known."""
    import shlex

    if ARGV is None:
        return fallback
    return shlex.join(["rewheel", *(a for a in ARGV if a != drop), *([add] if add and add not in ARGV else [])])


def _arg(text: str) -> str:
    """A word of a command line, quoted for the shell where it must be."""
    import shlex

    return shlex.quote(text)


def print_error(console: Console, exc: RewheelError) -> None:
    if getattr(exc, "is_note", False):  # a choice the person made (answered "no"): no red
        console.print(clean(exc.message, lines=False), markup=False, highlight=False)
        return
    console.print(f"[bold red]error:[/] {escape(exc.message)}", markup=True, highlight=False)
    if exc.hint:
        console.print(f"  [yellow]hint:[/] {escape(exc.hint)}", markup=True, highlight=False)


def show_path(console: Console, path: object, base: tuple[object, str] | None = None) -> str:
    """A path as a terminal shows it: short enough to stay whole on a line — relative to
    `base` (a folder, and what to call it: `prepared/pylock.toml in the run's folder`) or to
    the current folder when it lies under one, else `~/…` under the home folder. Anywhere
    else (a pipe, a file) the path as it is: grep and scripts get it whole."""
    import os
    from pathlib import Path

    text = str(path)
    if not text or not console.is_terminal:
        return text
    p = Path(text)
    if base is not None and base[0]:
        try:
            rel = p.relative_to(Path(str(base[0])))
            return base[1] if str(rel) == "." else f"{rel} in {base[1]}"
        except ValueError:
            pass
    try:
        cwd = Path.cwd()
        rel = p.relative_to(cwd)
        if cwd != Path("/") and str(rel) != ".":
            return str(rel)
    except (ValueError, OSError):
        pass
    home = os.path.expanduser("~")
    if home not in ("", "/") and text.startswith(home.rstrip("/") + "/"):
        return "~" + text[len(home.rstrip("/")):]
    return text


def human_bytes(n: int | float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def downtime_text(doc: dict | None) -> str:
    """`12.3s (stop 1.0, snapshot 2.1, install 3.0, smoke 4.0, start 0.1, ready 2.1)`."""
    if not doc:
        return "none (the service was not stopped)"
    parts = ", ".join(f"{k} {v:.1f}" for k, v in doc["parts"].items() if v or k in ("install", "smoke"))
    return f"{doc['seconds']:.1f}s ({parts})"


def render_downtime(console: Console, downtime) -> None:  # results.Downtime | None
    if downtime is not None and downtime.ongoing:
        console.print(f"  [bold red]downtime: ongoing[/] — the service has not answered healthy since its stop; "
                      f"so far {downtime_text(downtime.to_json())}")
    elif downtime is not None:
        console.print(f"  downtime: {downtime_text(downtime.to_json())} — from the stop to the first healthy answer")
