"""What uv's output says: the distributions it would change or changed (`PlannedChange`,
`parse_changes`), what it downloaded, its error lines (redacted), and the planned changes
annotated with what their versions say (builds between nightlies, a compare link)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from rewheel.installer.indexes import redact

# " + name==1.2.3", " - name==1.2.3", " ~ name==1.2.3" (reinstalled), also "name @ url" forms.
_CHANGE_LINE = re.compile(r"^\s(?P<op>[+\-~])\s(?P<name>[A-Za-z0-9][A-Za-z0-9._\-]*)"
                          r"(?:\[[^\]]*\])?(?:==(?P<version>[^\s(]+)|\s@\s(?P<url>\S+))?")


def _version(text: str | None) -> Version | None:
    if text is None:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        return None


@dataclass(frozen=True)
class PlannedChange:
    """One distribution uv would change (or did change): old and new versions, None when absent."""

    name: str
    old: str | None
    new: str | None
    # What the versions say, once `annotate_plan` read them (JSON keys only then): builds
    # between two nightlies, and the compare link of the commits between them.
    dev_distance: int | None = None
    compare_url: str | None = None
    annotated: bool = field(default=False, compare=False, repr=False)

    @property
    def change(self) -> str:
        """"install", "remove", "upgrade", "downgrade", "reinstall" or "replace"."""
        if self.old is None:
            return "install"
        if self.new is None:
            return "remove"
        old, new = _version(self.old), _version(self.new)
        if old is None or new is None:
            return "reinstall" if self.old == self.new else "replace"
        if new > old:
            return "upgrade"
        if new < old:
            return "downgrade"
        return "reinstall"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "old": self.old, "new": self.new, "change": self.change}
        if self.annotated:
            doc["dev_distance"], doc["compare_url"] = self.dev_distance, self.compare_url
        return doc


def parse_changes(lines: Sequence[str]) -> list[PlannedChange]:
    """The ` - name==old` / ` + name==new` / ` ~ name==ver` lines of uv's output, paired up."""
    old: dict[str, str | None] = {}
    new: dict[str, str | None] = {}
    order: list[str] = []
    for line in lines:
        m = _CHANGE_LINE.match(line.rstrip())
        if not m:
            continue
        name = canonicalize_name(m.group("name"))
        version = m.group("version") or m.group("url")
        if name not in order:
            order.append(name)
        op = m.group("op")
        if op in "-~":
            old[name] = version
        if op in "+~":
            new[name] = version
    return [PlannedChange(n, old.get(n), new.get(n)) for n in sorted(order)]


_FETCHED = re.compile(r"^\s*Download(?:ing|ed)\s+(?P<what>\S.*?)\s*$")


def fetched_lines(lines: Sequence[str]) -> list[str]:
    """What uv's output says it downloaded (`Downloading numpy (16.1MiB)`), once each."""
    out: list[str] = []
    for line in lines:
        m = _FETCHED.match(redact(line))
        if m and not m.group("what").startswith("and "):
            what = m.group("what")
            name = what.split(" ", 1)[0]
            if not any(o.split(" ", 1)[0] == name for o in out):
                out.append(what)
    return out


def _count(lines: Sequence[str], pattern: str) -> int | None:
    rx = re.compile(pattern)
    for line in lines:
        m = rx.search(line)
        if m:
            return int(m.group(1))
    return None


def error_lines(lines: Sequence[str], limit: int = 25) -> list[str]:
    """uv's meaningful error lines: from its first `error:` line on (causes, hints), else the
    last non-empty lines. Redacted."""
    clean = [redact(l.rstrip()) for l in lines if l.strip()]
    for i, line in enumerate(clean):
        if line.lstrip().startswith("error:"):
            return clean[i:i + limit]
    return [l for l in clean if not l.lstrip().startswith("warning:")][-10:]


def annotate_plan(changes: list[PlannedChange], installed: Sequence[Any]) -> list[PlannedChange]:
    """The planned changes with what their versions say: `dev_distance` (builds between two
    nightlies) and `compare_url` (the commits between them, from the installed
    distribution's Project-URLs). The plan screen shows both before anyone says yes;
    `installed` are the environment's `Distribution`s."""
    from rewheel import versions as vers

    urls = {d.name: d.project_urls for d in installed}
    out = []
    for c in changes:
        dist = url = None
        if c.old and c.new and c.old != c.new:
            va, vb = vers.parse(c.old), vers.parse(c.new)
            dist = vers.dev_distance(va, vb)
            url = vers.compare_url(urls.get(canonicalize_name(c.name)), va.sha, vb.sha)
        out.append(replace(c, dev_distance=dist, compare_url=url, annotated=True))
    return out
