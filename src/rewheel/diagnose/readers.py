"""The entry points of `why`: a log file (read fast and bounded), text lines, stdin, and a
systemd unit's journal."""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from rewheel import proc
from rewheel.diagnose.analyser import Analyser
from rewheel.diagnose.errorlines import prefilter
from rewheel.diagnose.limits import CHUNK, CONTEXT_LINES, EARLY_LINES, MAX_LINE_BYTES, TB_NEEDLE
from rewheel.diagnose.ranking import TB_ERROR
from rewheel.diagnose.results import Diagnosis
from rewheel.diagnose.wrappers import journal_message, journal_pid
from rewheel.errors import CommandNotFound, UsageError


def analyse_lines(lines: Iterable[str], *, package: str | None = None, source: str = "") -> Diagnosis:
    """Analyse text lines (any iterable: a file object, stdin, a list). Streaming."""
    an = Analyser(package)
    n = 0
    for n, line in enumerate(lines, 1):
        _feed_prefiltered(an, line, n, early=n <= EARLY_LINES, nxt=n + 1)
    return an.finish(source=source, lines=n)


def _feed_prefiltered(an: Analyser, line: str, n: int, *, early: bool,
                      jpid: int | None = None, ident: str | None = None, node: str | None = None,
                      nxt: int | None = None) -> None:
    if an.busy or early or _worth_feeding(line):
        an.feed(line, n, jpid=jpid, ident=ident, early=early, node=node, nxt=nxt)


def _worth_feeding(line: str) -> bool:
    """Whether a line outside any traceback can matter. Most lines of a healthy log are INFO
    chatter: a few `in` tests settle the common case; the regex only sees the rest."""
    if "INFO" in line and "rror" not in line and "RROR" not in line and "Traceback" not in line \
            and "xception" not in line:
        return False
    return prefilter(line)


def analyse_file(path: str | os.PathLike[str], *, package: str | None = None) -> Diagnosis:
    """Analyse a log file; fast path for large files (see module docstring)."""
    p = Path(path)
    if not p.is_file():
        if p.is_dir():
            raise UsageError(f"{p} is a folder, not a log file", hint="give the path of a log file, or --unit UNIT")
        if not p.exists():
            raise UsageError(f"log file not found: {p}", hint="give the path of a log file, or --unit UNIT")
        # A pipe (`why <(journalctl …)`) or a device (/dev/null): read once, as a stream.
        with open(p, encoding="utf-8", errors="replace", newline="\n") as fh:
            return analyse_lines(fh, package=package, source=str(p))
    an = Analyser(package, error_lines=False)
    with open(p, "rb", buffering=0) as f:
        _scan_fast(f, an)

    def resolve(positions: list[int]) -> dict[int, int]:
        return _offsets_to_lines(p, positions)

    diag = an.finish(resolve, source=str(p))
    if TB_ERROR in an.first and diag.root is not None and diag.root.type is not None:
        return diag
    # No traceback explains it: read every line, error lines included.
    with open(p, encoding="utf-8", errors="replace", newline="\n") as fh:
        return analyse_lines(fh, package=package, source=str(p))


def _scan_fast(f: BinaryIO, an: Analyser) -> None:
    carry = b""         # the unfinished last line of the previous chunk
    base = 0            # file offset of the current chunk's first byte
    lines_seen = 0      # counted only while early
    while True:
        data = f.read(CHUNK)
        if not data:
            break
        first = data.find(b"\n")
        if first < 0:
            carry += data
            if len(carry) > MAX_LINE_BYTES:
                # A monster line: look at its head, drop the rest (an offset inside a line
                # still resolves to that line's number).
                start = base + len(data) - len(carry)
                lines_seen = _scan_block(carry + b"\n", 0, len(carry) + 1, start, an, lines_seen)
                carry = b""
            base += len(data)
            continue
        start = 0
        if carry:
            # The line that straddles two chunks: a small copy, never the whole chunk.
            line = carry + data[:first + 1]
            lines_seen = _scan_block(line, 0, len(line), base - len(carry), an, lines_seen)
            carry = b""
            start = first + 1
        end = data.rfind(b"\n") + 1
        lines_seen = _scan_block(data, start, end, base, an, lines_seen)
        carry = data[end:]
        base += len(data)
    if carry:
        _scan_block(carry + b"\n", 0, len(carry) + 1, base - len(carry), an, lines_seen)


def _scan_block(buf: bytes, pos: int, end: int, base: int, an: Analyser, lines_seen: int) -> int:
    """Feed the lines of buf[pos:end] (end just past a newline) that matter; `base` is the
    file offset of buf[0]."""
    find = buf.find
    while pos < end:
        early = lines_seen < EARLY_LINES
        if not an.busy and not early:
            hit = find(TB_NEEDLE, pos, end)
            if hit < 0:
                return lines_seen
            start = buf.rfind(b"\n", pos, hit) + 1 or pos
            # the lines just before it, as the line-by-line path would have seen them: a
            # record like "[... TP1] Exception in ModelTpServer:", torchrun's summary fields
            # name the traceback's process
            first = start
            for _ in range(CONTEXT_LINES):
                if first <= pos:
                    break
                first = buf.rfind(b"\n", pos, first - 1) + 1 or pos
            while first < start:
                nl = buf.find(b"\n", first, start)
                text = buf[first:nl][:MAX_LINE_BYTES].decode("utf-8", "replace")
                if _worth_feeding(text):
                    an.feed(text, base + first, early=False, nxt=base + nl + 1)
                first = nl + 1
            pos = start
        nl = find(b"\n", pos, end)
        if nl < 0:
            nl = end
        raw = buf[pos:nl]
        if len(raw) > MAX_LINE_BYTES:
            raw = raw[:MAX_LINE_BYTES]
        if early:
            lines_seen += 1
        an.feed(raw.decode("utf-8", "replace"), base + pos, early=early, nxt=base + nl + 1)
        pos = nl + 1
    return lines_seen


def _offsets_to_lines(path: Path, offsets: list[int]) -> dict[int, int]:
    """1-based line numbers of byte offsets (each the start of a line), one counting pass
    that stops at the furthest offset asked for."""
    want = sorted({o for o in offsets if o is not None})
    out: dict[int, int] = {}
    i = 0
    base = 0       # file offset of data[0]
    count = 0      # newlines before `base`
    with open(path, "rb", buffering=0) as f:
        while i < len(want):
            data = f.read(CHUNK)
            if not data:
                break
            top = base + len(data)
            last = 0
            while i < len(want) and want[i] < top:
                rel = want[i] - base
                count += data.count(b"\n", last, rel)
                last = rel
                out[want[i]] = count + 1
                i += 1
            count += data.count(b"\n", last)
            base = top
    return out


def analyse_journal(unit: str, since: str | None, *, package: str | None = None,
                    timeout: float | None = None) -> Diagnosis:
    """Analyse a systemd unit's journal (`journalctl -u UNIT --since SINCE -o json`), streamed."""
    argv = ["journalctl", "-u", unit, "--no-pager", "-o", "json"]
    if since:
        argv[3:3] = ["--since", since]
    an = Analyser(package)
    counter = [0]
    other: list[str] = []

    def on_line(text: str) -> None:
        text = text.strip()
        if not text:
            return
        if not text.startswith("{"):
            if len(other) < 20:
                other.append(text)
            return
        try:
            entry = json.loads(text)
        except ValueError:
            if len(other) < 20:
                other.append(text[:300])
            return
        counter[0] += 1
        msg = journal_message(entry)
        if msg is None:
            return
        jpid = journal_pid(entry, None)
        ident = entry.get("SYSLOG_IDENTIFIER")
        host = entry.get("_HOSTNAME")
        n = counter[0]
        for part in msg.split("\n"):
            _feed_prefiltered(an, part, n, early=n <= EARLY_LINES, jpid=jpid, ident=ident,
                              node=host if isinstance(host, str) else None)

    try:
        done = proc.stream(argv, on_line=on_line, timeout=timeout)
    except CommandNotFound:
        raise CommandNotFound(
            f"journalctl not found: cannot read the journal of unit {unit!r}",
            hint="run on the host that runs the unit, or save the log and run `rewheel why LOGFILE`") from None
    if done.timed_out:
        raise UsageError(f"journalctl -u {unit} timed out after {timeout}s")
    if done.returncode != 0:
        detail = "; ".join(other[-5:]) or f"exit status {done.returncode}"
        raise UsageError(f"journalctl failed for unit {unit!r}: {detail}",
                         hint=f"check the unit name and --since value ({' '.join(argv)})")
    since_txt = f" since {since}" if since else ""
    return an.finish(source=f"journal of {unit}{since_txt}", lines=counter[0])


def analyse_stream(stream: io.TextIOBase | Iterator[str] | None = None, *,
                   package: str | None = None) -> Diagnosis:
    """Analyse stdin (or the given text stream)."""
    if stream is None:
        stream = sys.stdin
        try:
            # Read as a log file is (UTF-8, an undecodable byte replaced, whatever the locale or
            # PYTHONIOENCODING says: a log is bytes from elsewhere); lines end at "\n" only, as in
            # a file: a `\r` progress bar is not a line of its own.
            stream.reconfigure(encoding="utf-8", errors="replace", newline="\n")  # type: ignore[union-attr]
        except (AttributeError, ValueError, io.UnsupportedOperation):
            pass
    return analyse_lines(stream, package=package, source="stdin")
