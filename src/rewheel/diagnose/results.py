"""What `why` answers: the root cause (`RootCause`), its frame, the secondary errors it
caused, and the `Diagnosis` around them; their JSON, both ways."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Frame:
    file: str
    line: int
    function: str | None
    source: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function, "source": self.source}

    def short(self) -> str:
        return f"{short_path(self.file)}:{self.line}" + (f" in {self.function}" if self.function else "")

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Frame:
        """The frame `to_json` wrote (a bisection's journaled verdict keeps it so)."""
        return cls(doc["file"], doc["line"], doc.get("function"), doc.get("source"))


@dataclass
class Secondary:
    type: str | None
    message: str
    rank: str | None
    log_line: int | None
    count: int
    relation: str  # "chained" | "cascade" | "later" | "earlier"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "rank": self.rank,
                "log_line": self.log_line, "count": self.count, "relation": self.relation}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Secondary:
        return cls(doc.get("type"), doc.get("message") or "", doc.get("rank"), doc.get("log_line"),
                   doc.get("count", 1), doc.get("relation", "later"))


@dataclass
class Evidence:
    """One place the log names the failing process (see `diagnose.processes`): how it named
    it (`source`: prefix, text, nearby, ray-task, actor, raylet, field, launcher, same-error),
    and the name, pid and node it gave."""
    source: str
    rank: str | None
    pid: int | None
    node: str | None
    log_line: int | None

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "rank": self.rank, "pid": self.pid, "node": self.node,
                "log_line": self.log_line}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Evidence:
        return cls(doc.get("source") or "", doc.get("rank"), doc.get("pid"), doc.get("node"), doc.get("log_line"))


@dataclass
class RootCause:
    type: str | None
    message: str
    rank: str | None
    frame: Frame | None
    log_line: int | None
    kind: str  # "traceback" | "error-line"
    count: int
    restarts: int
    secondary: list[Secondary] = field(default_factory=list)
    # The failing process as the log names it: its pid, and the node it ran on (an IP, a
    # host, a pod or container from a collector's wrapper); None where the log has none.
    pid: int | None = None
    node: str | None = None
    # The root exception's frames, innermost first (bounded); not serialised: the frame
    # above is the one reported, these feed the suspects.
    frames: list[Frame] = field(default_factory=list, repr=False, compare=False)
    # Which changes of an upgrade the crash points at (`rewheel.suspects`), when known.
    suspects: list[Any] = field(default_factory=list)
    # What named the failing process (`rank_source`: the source of `evidence[0]`), and every
    # place the log names it, the one taken first; empty where nothing names it.
    rank_source: str | None = None
    evidence: list[Evidence] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "rank": self.rank,
                "frame": self.frame.to_json() if self.frame else None, "log_line": self.log_line,
                "kind": self.kind, "count": self.count, "restarts": self.restarts,
                "secondary": [s.to_json() for s in self.secondary],
                "pid": self.pid, "node": self.node,
                "suspects": [s.to_json() if hasattr(s, "to_json") else s for s in self.suspects],
                "rank_source": self.rank_source, "evidence": [e.to_json() for e in self.evidence]}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RootCause:
        """The root cause `to_json` wrote, read back where it was kept as JSON (a bisection's
        journal): `from_json(rc.to_json()).to_json() == rc.to_json()`. Keys an older rewheel
        did not write take their defaults."""
        frame = doc.get("frame")
        return cls(doc.get("type"), doc.get("message") or "", doc.get("rank"),
                   Frame.from_json(frame) if frame else None, doc.get("log_line"),
                   doc.get("kind", "traceback"), doc.get("count", 1), doc.get("restarts", 1),
                   [Secondary.from_json(s) for s in doc.get("secondary") or [] if isinstance(s, dict)],
                   pid=doc.get("pid"), node=doc.get("node"),
                   suspects=[_suspect_from_json(s) for s in doc.get("suspects") or [] if isinstance(s, dict)],
                   rank_source=doc.get("rank_source"),
                   evidence=[Evidence.from_json(e) for e in doc.get("evidence") or [] if isinstance(e, dict)])


def _suspect_from_json(doc: dict[str, Any]) -> Any:  # suspects.Suspect
    from rewheel.suspects import Suspect

    return Suspect.from_json(doc)


@dataclass
class Diagnosis:
    root: RootCause | None
    source: str = ""
    lines: int | None = None        # lines read, when known (files analysed fast: None)
    tracebacks: int = 0             # tracebacks seen (duplicates included)

    def to_json(self) -> dict[str, Any]:
        return {"root_cause": self.root.to_json() if self.root else None}

    def summary(self) -> str:
        """One line for run reports."""
        r = self.root
        if r is None:
            where = f" in {self.source}" if self.source else ""
            return f"no error found{where}"
        head = f"{r.type}: {first_line(r.message)}" if r.type else first_line(r.message)
        if r.kind == "error-line":
            head = f"error line: {first_line(r.message)}"
        bits = []
        if r.rank:
            bits.append(r.rank)
        if r.frame:
            bits.append(r.frame.short())
        if r.log_line:
            bits.append(f"log line {r.log_line}")
        if r.count > 1:
            bits.append(f"seen in {r.count} processes")
        if r.restarts > 1:
            bits.append(f"{r.restarts} restarts")
        return head + (f" ({'; '.join(bits)})" if bits else "")


def first_line(text: str, limit: int = 240) -> str:
    line = text.split("\n", 1)[0].strip()
    return line if len(line) <= limit else line[: limit - 1] + "…"


def short_path(path: str) -> str:
    """`/root/ml-env/lib/python3.12/site-packages/vllm/x.py` -> `vllm/x.py`."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return path
