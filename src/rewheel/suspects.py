"""Suspects: which change of an upgrade a crash points at.

A failed upgrade's real question is "which of the new commits broke it — or was it
something my removed patch was masking?". This module answers it from what rewheel already
has: the root cause's frames (innermost first), the upgrade's file changes (`diff`), the
old and new text of a changed file, and the local patches the reinstall threw away.

- Every frame whose file the upgrade added, removed or changed is a suspect, with the diff
  hunks that cover the failing line or lie nearest to it (`distance_lines`: 0 when a hunk
  covers it), and the compare link of its package. The innermost such frame ranks first.
- A function that a suspect hunk calls, imported from a file the upgrade added or changed,
  is a suspect too (ranked right after the frame that calls it), with the hunk that
  defines it: a crash in code that uses a new helper names the helper.
- A suspect whose file carried a local patch that the reinstall removed says so, with the
  saved `.patch` (`patch_removed`).

Pure: no I/O of its own. The caller passes the changes, a function that gives a changed
file's (old, new) text, the patch records and compare links; everything returned is a
dataclass.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from packaging.utils import canonicalize_name

MAX_SUSPECTS = 8
MAX_HUNKS = 2                # per suspect: the covering hunk, else the nearest ones
MAX_HUNK_LINES = 40          # lines of text kept per hunk
CONTEXT = 3                  # unified-diff context lines
MAX_TEXT = 4 << 20           # larger files are not diffed

HUNK_RE = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
CALL_RE = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
FROM_IMPORT_RE = re.compile(r"^\s*from\s+([\w.]+)\s+import\s+(\(?)([^#\n]*)", re.M)
DEF_RE_TMPL = r"^([ \t]*)(?:async\s+)?(?:def|class)\s+{name}\b"


class FrameLike(Protocol):
    file: str
    line: int
    function: str | None


class PatchLike(Protocol):
    """A local patch the reinstall removed (`patches.Patch`, or `SavedPatch` read back)."""

    @property
    def path(self) -> str: ...
    @property
    def abs_path(self) -> str: ...
    @property
    def added_lines(self) -> int | None: ...
    @property
    def removed_lines(self) -> int | None: ...


@dataclass(frozen=True)
class SavedPatch:
    """A patch as a run's `patches/patches.json` records it (for `why --run`)."""
    path: str
    abs_path: str
    added_lines: int | None = None
    removed_lines: int | None = None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SavedPatch:
        return cls(str(doc.get("path") or ""), str(doc.get("abs_path") or ""), doc.get("added_lines"),
                   doc.get("removed_lines"))


class ChangeLike(Protocol):
    path: str            # relative to site-packages
    abs_path: str
    change: str          # added | removed | changed | mode
    distribution: str | None


@dataclass
class Hunk:
    old_start: int
    old_lines: int
    new_start: int
    new_lines: int
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"old_start": self.old_start, "old_lines": self.old_lines, "new_start": self.new_start,
                "new_lines": self.new_lines, "text": self.text}


@dataclass
class PatchRemoved:
    """A local patch on the suspect's file that the reinstall removed."""
    patch: str | None            # the saved .patch file, when one was saved
    added_lines: int | None
    removed_lines: int | None

    def to_json(self) -> dict[str, Any]:
        return {"patch": self.patch, "added_lines": self.added_lines, "removed_lines": self.removed_lines}


@dataclass
class Suspect:
    path: str                    # relative to site-packages
    package: str | None          # its distribution
    change: str                  # added | removed | changed
    frame: dict[str, Any]        # the crash's frame in this file (or the one that calls into it)
    hunks: list[Hunk] = field(default_factory=list)
    distance_lines: int | None = None   # 0: a hunk covers the frame's line
    patch_removed: PatchRemoved | None = None
    compare_url: str | None = None
    reason: str = "frame"        # "frame" | "called from <file>:<line> (<name>)"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "package": self.package, "change": self.change, "frame": self.frame,
                "hunks": [h.to_json() for h in self.hunks], "distance_lines": self.distance_lines,
                "patch_removed": self.patch_removed.to_json() if self.patch_removed else None,
                "compare_url": self.compare_url, "reason": self.reason}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Suspect:
        """The suspect `to_json` wrote, read back where a root cause was kept as JSON."""
        pr = doc.get("patch_removed")
        return cls(doc.get("path") or "", doc.get("package"), doc.get("change") or "changed",
                   dict(doc.get("frame") or {}),
                   [Hunk(h["old_start"], h["old_lines"], h["new_start"], h["new_lines"], h.get("text", ""))
                    for h in doc.get("hunks") or [] if isinstance(h, dict)],
                   doc.get("distance_lines"),
                   PatchRemoved(pr.get("patch"), pr.get("added_lines"), pr.get("removed_lines"))
                   if isinstance(pr, dict) else None,
                   doc.get("compare_url"), doc.get("reason") or "frame")


Texts = Callable[[Any], tuple[str | None, str | None]]


def _norm(path: str) -> str:
    return path.replace("\\", "/")


def _match(frame_file: str, changes: Sequence[ChangeLike]) -> ChangeLike | None:
    """The change of the file a frame names: the same absolute path, else the same path
    relative to site-packages (a log from another host or container)."""
    f = _norm(frame_file)
    for c in changes:
        if _norm(c.abs_path) == f:
            return c
    for c in changes:
        rel = _norm(c.path)
        if f.endswith("/" + rel) or f == rel:
            return c
    return None


def hunks_of(old: str | None, new: str | None) -> list[Hunk]:
    """The unified-diff hunks between two texts (a whole-file hunk for an added or removed
    file)."""
    a = (old or "").splitlines(keepends=True)
    b = (new or "").splitlines(keepends=True)
    if old is None or not a:
        return [Hunk(0, 0, 1, len(b), "".join("+" + x if x.endswith("\n") else "+" + x + "\n" for x in b))]
    if new is None or not b:
        return [Hunk(1, len(a), 0, 0, "".join("-" + x if x.endswith("\n") else "-" + x + "\n" for x in a))]
    out: list[Hunk] = []
    cur: Hunk | None = None
    body: list[str] = []
    for line in difflib.unified_diff(a, b, n=CONTEXT):
        m = HUNK_RE.match(line)
        if m:
            if cur is not None:
                cur.text = "".join(body)
                out.append(cur)
            cur = Hunk(int(m.group(1)), int(m.group(2) or 1), int(m.group(3)), int(m.group(4) or 1), "")
            body = []
        elif cur is not None:  # the ---/+++ header comes before the first hunk
            body.append(line if line.endswith("\n") else line + "\n")
    if cur is not None:
        cur.text = "".join(body)
        out.append(cur)
    return out


def _changed_lines(h: Hunk, side: str) -> list[int]:
    """Line numbers (on `side`) of a hunk's changed lines; a deletion on the new side (an
    addition on the old) counts at the line it was next to."""
    n = h.new_start if side == "new" else h.old_start
    mine, other = ("+", "-") if side == "new" else ("-", "+")
    out: list[int] = []
    for t in h.text.splitlines():
        if t.startswith(other):
            out.append(max(n, 1))
            continue
        if t.startswith(mine):
            out.append(n)
        if not t.startswith("\\"):
            n += 1
    return out or [h.new_start if side == "new" else h.old_start]


def _distance(h: Hunk, line: int, side: str) -> int:
    """Lines between the failing line and the hunk's nearest changed line (0: it changed)."""
    return min(abs(line - n) for n in _changed_lines(h, side))


def _clip(h: Hunk, line: int | None, side: str) -> Hunk:
    """At most MAX_HUNK_LINES lines of a hunk's text, centred on the failing line."""
    lines = h.text.splitlines(keepends=True)
    if len(lines) <= MAX_HUNK_LINES:
        return h
    centre = 0
    if line is not None:
        n = h.new_start if side == "new" else h.old_start
        for i, t in enumerate(lines):
            if t.startswith("-" if side == "new" else "+"):
                continue  # a line of the other side
            if n >= line:
                centre = i
                break
            n += 1
    lo = max(0, min(centre - MAX_HUNK_LINES // 2, len(lines) - MAX_HUNK_LINES))
    return Hunk(h.old_start, h.old_lines, h.new_start, h.new_lines,
                "".join(lines[lo:lo + MAX_HUNK_LINES]) + ("…\n" if lo + MAX_HUNK_LINES < len(lines) else ""))


def near_hunks(hunks: list[Hunk], line: int | None, side: str = "new") -> tuple[list[Hunk], int | None]:
    """The hunk whose change is nearest to `line` (ties: up to MAX_HUNKS), and the distance
    from `line` to that change in lines (0: the line itself was changed)."""
    if not hunks:
        return [], None
    if line is None or line <= 0:
        return [_clip(h, None, side) for h in hunks[:MAX_HUNKS]], None
    dists = [(_distance(h, line, side), i) for i, h in enumerate(hunks)]
    best = min(d for d, _ in dists)
    chosen = [hunks[i] for d, i in sorted(dists) if d == best][:MAX_HUNKS]
    return [_clip(h, line, side) for h in chosen], best


def _called_names(hunks: Iterable[Hunk], lo: int = 0, hi: int | None = None) -> list[str]:
    """Names called on the added lines of hunks (those numbered lo..hi on the new side), in
    order of appearance."""
    seen: dict[str, None] = {}
    for h in hunks:
        n = h.new_start
        for t in h.text.splitlines():
            if t.startswith("-"):
                continue
            if t.startswith("+") and lo <= n <= (hi if hi is not None else n):
                for m in CALL_RE.finditer(t[1:]):
                    seen.setdefault(m.group(1), None)
            n += 1
    return list(seen)


def _function_start(text: str, line: int, function: str | None) -> int:
    """The line where the function holding `line` starts (its `def`), else `line`."""
    if not function or function.startswith("<"):
        return line
    lines = text.splitlines()
    pat = re.compile(r"\s*(?:async\s+)?def\s+" + re.escape(function) + r"\b")
    for i in range(min(line, len(lines)) - 1, -1, -1):
        if pat.match(lines[i]):
            return i + 1
    return line


def _imports(text: str) -> dict[str, str]:
    """`from a.b import c, d as e` -> {"c": "a.b", "e": "a.b"} (parenthesised lists too)."""
    out: dict[str, str] = {}
    for m in FROM_IMPORT_RE.finditer(text):
        mod, paren, rest = m.group(1), m.group(2), m.group(3)
        if paren:
            end = text.find(")", m.end(2))
            rest = text[m.end(2): end if end >= 0 else m.end(2) + 2000]
        for part in re.sub(r"#[^\n]*", "", rest).replace("\n", " ").replace(")", "").split(","):
            bits = part.split()
            if not bits:
                continue
            name = bits[-1] if len(bits) == 3 and bits[1] == "as" else bits[0]
            out[name] = mod
    return out


def _definition(text: str, name: str) -> Hunk | None:
    """The lines that define `name` in `text` (a def/class and its body), as an added hunk."""
    m = re.search(DEF_RE_TMPL.format(name=re.escape(name)), text, re.M)
    if not m:
        return None
    lines = text.splitlines(keepends=True)
    first = text.count("\n", 0, m.start())
    indent = len(m.group(1).expandtabs())
    end = first + 1
    while end < len(lines):
        t = lines[end]
        if t.strip() and len(t) - len(t.lstrip()) <= indent and not t.lstrip().startswith((")", "#")):
            break
        end += 1
    body = lines[first:end]
    return _clip(Hunk(0, 0, first + 1, len(body), "".join("+" + x if x.endswith("\n") else "+" + x + "\n"
                                                              for x in body)), first + 1, "new")


def _patch_for(c: ChangeLike, patches: Sequence[PatchLike], patch_files: Sequence[str]) -> PatchRemoved | None:
    for p in patches:
        if _norm(p.abs_path or "") == _norm(c.abs_path) or _norm(p.path or "") == _norm(c.path):
            flat = _norm(p.path or "").replace("/", "__") + ".patch"
            saved = next((f for f in patch_files if _norm(f).endswith("/" + flat) or _norm(f) == flat), None)
            return PatchRemoved(saved, p.added_lines, p.removed_lines)
    return None


def find_suspects(frames: Sequence[FrameLike], changes: Sequence[ChangeLike], texts: Texts | None = None, *,
                  patches: Sequence[PatchLike] = (), patch_files: Sequence[str] = (),
                  compare_urls: Mapping[str, str] | None = None,
                  limit: int = MAX_SUSPECTS) -> list[Suspect]:
    """Suspects for a root cause. `frames` innermost first; `changes` the upgrade's file
    changes; `texts(change)` gives a change's (old, new) text (None for a missing side or a
    binary file); `patches` the patch records the reinstall removed (their `path`,
    `abs_path`, `added_lines`, `removed_lines`), `patch_files` the saved `.patch` files;
    `compare_urls` by distribution name."""
    urls = {canonicalize_name(k): v for k, v in (compare_urls or {}).items()}
    changed = [c for c in changes if c.change in ("added", "removed", "changed")]
    out: list[Suspect] = []
    seen: set[str] = set()
    for fr in frames:
        if len(out) >= limit:
            break
        c = _match(fr.file, changed)
        if c is None or c.abs_path in seen:
            continue
        seen.add(c.abs_path)
        old, new = texts(c) if texts is not None else (None, None)
        frame = {"file": fr.file, "line": fr.line, "function": fr.function}
        hunks: list[Hunk] = []
        dist: int | None = None
        if old is not None or new is not None:
            side = "old" if c.change == "removed" else "new"
            hunks, dist = near_hunks(hunks_of(old, new), fr.line, side)
        s = Suspect(c.path, c.distribution, c.change, frame, hunks, dist,
                    _patch_for(c, patches, patch_files), urls.get(canonicalize_name(c.distribution or "")))
        out.append(s)
        # helpers that changed lines of the failing function call (up to the failing line),
        # imported from files the upgrade added or changed
        if new is None or c.change == "removed":
            continue
        imported = _imports(new)
        start = _function_start(new, fr.line, fr.function)
        for name in _called_names(hunks_of(old, new), start, fr.line):
            mod = imported.get(name)
            if mod is None or len(out) >= limit:
                continue
            rel = mod.replace(".", "/")
            target = next((x for x in changed if _norm(x.path) in (rel + ".py", rel + "/__init__.py")), None)
            if target is None or target.abs_path in seen or target.change == "removed":
                continue
            seen.add(target.abs_path)
            _, tnew = texts(target) if texts is not None else (None, None)
            hunk = _definition(tnew, name) if tnew else None
            base = fr.file.replace("\\", "/").rsplit("/", 1)[-1]
            out.append(Suspect(target.path, target.distribution, target.change, frame,
                               [hunk] if hunk else [], None, _patch_for(target, patches, patch_files),
                               urls.get(canonicalize_name(target.distribution or "")),
                               reason=f"called from {base}:{fr.line} ({name})"))
    return out
