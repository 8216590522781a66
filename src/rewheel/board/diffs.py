"""A run's source diff as the board shows it: every changed file with its +/- counts, the
unified diff of each text file, paged (a page holds PAGE_FILES files or PAGE_BYTES of diff
text, whichever comes first) and bounded (FILE_LINES lines of one file, TOTAL_BYTES of one
run's diffs: a release-to-release vLLM upgrade changes 9,000 files and millions of lines,
which no page can hold; the rest is one `rewheel diff` away, and the board says so).

The files and their counts are `diff.diff_trees`'s (as `rewheel diff --stat`), the texts
`diff.change_texts`'s and the diffs `diff.unified_diff`'s: the board reads what `rewheel
diff` reads, it does not compare anything itself."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rewheel import diff as diffmod
from rewheel.board.model import RunView
from rewheel.environment import Environment
from rewheel.snapshot.lanes import fork_child, recv_msg, send_msg

PAGE_FILES = 100
PAGE_BYTES = 1 << 20
FILE_LINES = 2000
TOTAL_BYTES = 4 << 20


@dataclass
class FileDiff:
    """One changed file: its counts, and the lines of its diff shown, each with its kind
    (`h` a hunk header, `a` added, `d` removed, `f` a file header, `c` context or a note)."""

    path: str
    change: str
    distribution: str | None
    added: int | None
    removed: int | None
    page: int
    anchor: str
    lines: list[tuple[str, str]] = field(default_factory=list)
    hidden_lines: int = 0
    note: str | None = None


@dataclass
class SourceDiff:
    """The diff of a run: which states it compares, its files in page order, how many pages."""

    old: str
    new: str
    files: list[FileDiff]
    pages: int
    seconds: float
    shown_bytes: int = 0
    not_shown: int = 0  # text files past TOTAL_BYTES: counted, their diff not shown

    @property
    def by_package(self) -> list[tuple[str, int, int, int]]:
        """(distribution, files, added, removed), most files first."""
        acc: dict[str, list[int]] = {}
        for f in self.files:
            row = acc.setdefault(f.distribution or "(no distribution)", [0, 0, 0])
            row[0] += 1
            row[1] += f.added or 0
            row[2] += f.removed or 0
        return sorted(((k, *v) for k, v in acc.items()), key=lambda r: (-r[1], r[0]))  # type: ignore[misc]

    def page_files(self, n: int) -> list[FileDiff]:
        if not hasattr(self, "_pages"):
            self._pages: dict[int, list[FileDiff]] = {}
            for f in self.files:
                self._pages.setdefault(f.page, []).append(f)
        return self._pages.get(n, [])

    def page_range(self, n: int) -> tuple[str, str]:
        files = self.page_files(n)
        return (files[0].path, files[-1].path) if files else ("", "")


def kinds(text: str) -> list[tuple[str, str]]:
    """A unified diff's lines, each with its kind."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        if line.startswith(("--- ", "+++ ")) and len(out) < 2:
            kind = "f"
        elif line.startswith("@@"):
            kind = "h"
        elif line.startswith("+"):
            kind = "a"
        elif line.startswith("-"):
            kind = "d"
        else:
            kind = "c"
        out.append((kind, line))
    return out


def source_diff(env: Environment, run: RunView, *, skip: set[str] | None = None) -> SourceDiff:
    """The run's source diff between its two sides (`RunView.diff_old`/`diff_new`): the
    changed files from the manifests (`diff_trees`, no file read), then each text file read
    once — its diff made while the budget lasts, its lines counted after — in two processes
    from SPLIT_MIN_FILES files on (a second CPU halves it)."""
    assert run.diff_old is not None
    t0 = time.monotonic()
    new = run.diff_new if not isinstance(run.diff_new, str) else None
    d = diffmod.diff_trees(env, run.diff_old, new, line_counts=False, skip=skip)
    changed = sorted(d.files, key=lambda f: (f.distribution or "~", f.path))
    texts = diffmod.change_texts(run.diff_old, new)
    done = _read_all(changed, texts)
    files: list[FileDiff] = []
    page, in_page, page_bytes, total, not_shown = 1, 0, 0, 0, 0
    for i, fc in enumerate(changed):
        if in_page >= PAGE_FILES or page_bytes >= PAGE_BYTES:
            page, in_page, page_bytes = page + 1, 0, 0
        added, removed, text, note = done[i]
        f = FileDiff(fc.path, fc.change, fc.distribution, added, removed, page, f"f{i}", note=note)
        if text is not None:
            lines = kinds(text)
            f.lines, f.hidden_lines = lines[:FILE_LINES], max(0, len(lines) - FILE_LINES)
            size = sum(len(t) + 1 for _, t in f.lines)
            page_bytes += size
            total += size
        elif note == NOT_SHOWN:
            not_shown += 1
        files.append(f)
        in_page += 1
    new_name = new.id if new is not None else "live"
    return SourceDiff(run.diff_old.id, new_name, files, page if files else 0, round(time.monotonic() - t0, 3),
                      total, not_shown)


SPLIT_MIN_FILES = 200
NOT_SHOWN = "diff not shown: the board shows the first 4 MiB of a run's diffs; `rewheel diff` shows the rest"
Done = tuple[int | None, int | None, str | None, str | None]  # added, removed, diff text, note
Texts = Callable[[diffmod.FileChange], tuple[str | None, str | None]]


def _one(fc: diffmod.FileChange, texts: Texts, budget_left: bool) -> Done:
    if fc.change == "mode":
        return 0, 0, None, f"mode {oct(fc.old_mode or 0)} → {oct(fc.new_mode or 0)}"
    old_t, new_t = texts(fc)
    if (fc.change != "added" and old_t is None) or (fc.change != "removed" and new_t is None):
        return None, None, None, "binary or too large a file (or its stored copy is unreadable): no line diff"
    if budget_left:
        text = diffmod.unified_diff(old_t, new_t, fc.path, fc.path)
        return (*diffmod.count_lines(text), text, None)
    return (*diffmod.count_changed_lines(old_t, new_t), None, NOT_SHOWN)


def _lane(files: list[diffmod.FileChange], idx: range, texts: Texts, budget: int) -> list[tuple[int, Done]]:
    out, used = [], 0
    for i in idx:
        done = _one(files[i], texts, used < budget)
        used += len(done[2] or "")
        out.append((i, done))
    return out


def _read_all(files: list[diffmod.FileChange], texts: Texts) -> list[Done]:
    """Every file's counts and (within TOTAL_BYTES) diff, in file order: the odd files in a
    forked process when there are many (as `diff.trees._fill_split` counts lines); if it dies or
    stays silent long after this one's half is done, its half is done here."""
    if len(files) < SPLIT_MIN_FILES or (os.cpu_count() or 1) < 2:
        return [d for _, d in _lane(files, range(len(files)), texts, TOTAL_BYTES)]
    r, w = os.pipe()

    def body() -> None:
        os.close(r)
        send_msg(w, ("done", _lane(files, range(1, len(files), 2), texts, TOTAL_BYTES // 2)))

    pid = fork_child(body)
    os.close(w)
    msg: tuple[Any, ...] | None = None
    try:
        t0 = time.monotonic()
        mine = _lane(files, range(0, len(files), 2), texts, TOTAL_BYTES // 2)
        if select.select([r], [], [], max(10.0, 3 * (time.monotonic() - t0)))[0]:
            with contextlib.suppress(EOFError, OSError, ValueError):
                msg = recv_msg(r)
    finally:
        if msg is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.close(r)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    theirs = msg[1] if msg is not None and msg[0] == "done" else _lane(files, range(1, len(files), 2), texts,
                                                                        TOTAL_BYTES // 2)
    out: list[Done | None] = [None] * len(files)
    for i, done in [*mine, *theirs]:
        out[i] = tuple(done)  # type: ignore[assignment]  # (marshal hands lists back)
    return [d if d is not None else (None, None, None, "not read") for d in out]
