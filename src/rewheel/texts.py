"""The text of installed files, for `diff` and `patches`: which files an installer writes
(never a patch, never a source change), when bytes are text, unified diffs and their +/- line
counts, and line counts without a diff in linear time (`count_changed_lines`: a multiset
difference of the two versions' lines), reading a side as bytes where its lines are its
text's (`countable`)."""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, AnyStr

# Files an installer writes into a .dist-info folder at install time; not part of the wheel's
# payload, different on every install (uv_cache.json carries a timestamp).
INSTALLER_FILES = frozenset({"RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json"})
# Larger files are not read for line counts or unified diffs.
TEXT_LIMIT = 4 << 20


def is_install_artifact(path: str) -> bool:
    """Byte-compiled caches and the installer's bookkeeping files: written at install or
    import time, never what a wheel shipped."""
    if path.endswith((".pyc", ".pyo")) or "/__pycache__/" in f"/{path}":
        return True
    parent, _, base = path.rpartition("/")
    return base in INSTALLER_FILES and parent.endswith(".dist-info")


def is_noise(path: str) -> bool:
    """Left out of file diffs: install artifacts and everything in `.dist-info` folders (the
    package table says which distributions changed)."""
    return is_install_artifact(path) or ".dist-info/" in path


def as_text(data: bytes | None) -> str | None:
    """The bytes as text when they are a (UTF-8) text file of reasonable size, else None."""
    if data is None or len(data) > TEXT_LIMIT or b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def unified_diff(old: str | None, new: str | None, path_a: str | None, path_b: str | None) -> str:
    """A git-compatible unified diff (`--- a/p`, `+++ b/p`, `/dev/null` for a missing side,
    `\\ No newline at end of file` markers) between two texts; "" when they are equal."""
    if (old or "") == (new or ""):
        return ""
    a = (old or "").splitlines(keepends=True)
    b = (new or "").splitlines(keepends=True)
    label_a = f"a/{path_a}" if path_a is not None and old is not None else "/dev/null"
    label_b = f"b/{path_b}" if path_b is not None and new is not None else "/dev/null"
    lines: Iterable[str]
    if not a or not b:
        # A whole file added or removed: one hunk, as difflib writes it, without its matcher.
        n = len(a) + len(b)
        rng = "1" if n == 1 else f"1,{n}"
        hunk = f"@@ -0,0 +{rng} @@\n" if not a else f"@@ -{rng} +0,0 @@\n"
        sign = "+" if not a else "-"
        lines = [f"--- {label_a}\n", f"+++ {label_b}\n", hunk, *(sign + x for x in (b or a))]
    else:
        lines = difflib.unified_diff(a, b, label_a, label_b, lineterm="\n")
    out: list[str] = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def count_lines(diff: str) -> tuple[int, int]:
    """(added, removed) lines of a unified diff."""
    added = removed = 0
    lines = diff.splitlines()
    for line in lines[2:]:  # the ---/+++ header
        if line.startswith("+"):
            added += 1
        elif line.startswith("-"):
            removed += 1
    return added, removed


# Where str.splitlines (and so unified_diff) splits a line and bytes.splitlines does not;
# both split at "\n", "\r" and "\r\n".
_STR_ONLY_BREAKS = ("\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")


def splits_like_bytes(text: str) -> bool:
    """Whether `text.splitlines()` cuts the same lines as `bytes.splitlines()` of its UTF-8
    encoding (which is faster to split and to count)."""
    return not any(c in text for c in _STR_ONLY_BREAKS)


def _nlines(text: str | bytes) -> int:
    """len(text.splitlines()), without building the list."""
    if not text:
        return 0
    if isinstance(text, str):
        if "\r" in text or not splits_like_bytes(text):
            return len(text.splitlines())
        return text.count("\n") + (text[-1] != "\n")
    if b"\r" in text:
        return len(text.splitlines())
    # The line feeds, counted as what removing them takes away: bytes.count of one byte is a
    # plain loop, replace finds them with memchr (1.7 times as fast; added files are hundreds
    # of MB on a real upgrade).
    return len(text) - len(text.replace(b"\n", b"")) + (text[-1:] != b"\n")


def _common_run(a: Sequence[Any], b: Sequence[Any], limit: int, direction: int) -> int:
    """How many items, at most `limit`, `a` and `b` begin with (direction 1) or end with
    (direction -1) in common."""
    la, lb = len(a), len(b)
    lo, hi = 0, limit  # a run of lo is common; one longer than hi is not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        same = (a[lo:mid] == b[lo:mid] if direction == 1
                else a[la - mid:la - lo] == b[lb - mid:lb - lo])
        if same:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _trim_common_lines(old: AnyStr, new: AnyStr) -> tuple[AnyStr, AnyStr]:
    """The two texts without the lines they both begin with and both end with, cut right
    after a line feed (a line ends there whichever way the text is split): whole, identical
    lines on both sides, which a multiset difference of the lines cancels anyway."""
    nl = "\n" if isinstance(old, str) else b"\n"
    shorter = min(len(old), len(new))
    head = old.rfind(nl, 0, _common_run(old, new, shorter, 1)) + 1
    same_tail = _common_run(old, new, shorter - head, -1)
    tail = 0
    if same_tail:
        cut = old.find(nl, len(old) - same_tail)
        tail = len(old) - cut - 1 if cut != -1 else 0
    return old[head:len(old) - tail], new[head:len(new) - tail]


def count_changed_lines(old: str | bytes | None, new: str | bytes | None) -> tuple[int, int]:
    """(added, removed) lines between two texts, in linear time: each line (with its line
    ending) counts as added as often as it occurs more often in `new` than in `old`, and as
    removed the other way round — a multiset difference of the two versions' lines.

    For added and removed files, added or deleted lines and edited lines that is exactly
    what a unified diff counts (`unified_diff`, `git diff --stat`). It counts fewer where
    lines moved: a block moved within the file (or lines that swapped places) is neither
    added nor removed here, while a line diff shows it removed in one place and added in
    another; and difflib, which skips lines that are very common in a long file when it
    matches, can count more. Either way a file's count here is at most its diff's.

    Both sides str, or both the UTF-8 bytes of texts that `splits_like_bytes` (the same
    counts, faster).
    """
    if old == new:
        return 0, 0
    if not old:
        return _nlines(new or ""), 0
    if not new:
        return 0, _nlines(old)
    # The lines both versions begin and end with cancel out; counted without them: cut off at
    # line feeds before the texts are split, then at any line break (each a binary search
    # over their lengths, slices compared at C speed).
    if isinstance(old, str) and isinstance(new, str):
        old, new = _trim_common_lines(old, new)
    elif isinstance(old, bytes) and isinstance(new, bytes):
        old, new = _trim_common_lines(old, new)
    if not old or not new:
        return _nlines(new), _nlines(old)
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    head = _common_run(a, b, min(len(a), len(b)), 1)
    tail = _common_run(a, b, min(len(a), len(b)) - head, -1)
    a, b = a[head:len(a) - tail], b[head:len(b) - tail]
    ca, cb = Counter(a), Counter(b)
    if len(ca) > len(cb):
        ca, cb = cb, ca
    get = cb.get
    common = 0
    for line, k in ca.items():
        m = get(line)
        if m:
            common += k if k < m else m
    return len(b) - common, len(a) - common


# The characters str.splitlines breaks a line at and bytes.splitlines does not that are ASCII
# (the other three, U+0085, U+2028 and U+2029, are not).
_ASCII_STR_ONLY_BREAKS = tuple(c.encode() for c in _STR_ONLY_BREAKS if c.isascii())


def countable(data: bytes) -> bytes | str | None:
    """A side of a file change as its lines are counted: None where `as_text` takes it for
    binary (too large, a NUL in its head, not UTF-8); the bytes themselves where their lines
    are their text's (`splits_like_bytes`: counted faster); else the text. ASCII, most source
    files, is told without decoding it."""
    if len(data) > TEXT_LIMIT or b"\0" in data[:8192]:
        return None
    if data.isascii():
        return data if not any(c in data for c in _ASCII_STR_ONLY_BREAKS) else data.decode("ascii")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return data if splits_like_bytes(text) else text


def as_str(side: bytes | str | None) -> str | None:
    """A side `countable` returned, as text."""
    return side.decode("utf-8") if isinstance(side, bytes) else side
