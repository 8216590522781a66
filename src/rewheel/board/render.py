"""The board's pages: Jinja2 templates (package data under `templates/`), autoescaped, and
the folder they are written to.

Everything a page shows that came from outside rewheel — a crash log, a model's output, a
patch, a package name — goes through the engine's escaping, and through `plain`, which
takes out terminal escape sequences (ANSI colours) and shows other control characters as
their visible symbols. Each page carries its stylesheet and its charts inline and a
Content-Security-Policy that allows no script and no request: it opens from `file://`, from
a CI artifact, or from any static host, alone or with the others.

The folder: a new or empty one, or one a board was written to before (its `.rewheel-board`
lists what it wrote); anything else is refused before a file is written. Pages are replaced
one by one (written beside, renamed over), and those of the last board that this one no
longer has are removed."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2

from rewheel.board import charts
from rewheel.board.diffs import SourceDiff, kinds, source_diff
from rewheel.board.model import KEY_PACKAGES, Board, EnvView, RunView, env_id, safe_name
from rewheel.diagnose import first_line, short_path
from rewheel.environment import Environment
from rewheel.errors import UsageError
from rewheel.paths import atomic_write

MARKER = ".rewheel-board"
TIMELINE_PAGE = 250  # runs per page of an environment's timeline
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def plain(text: Any) -> str:
    """Text as a page shows it: terminal escape sequences taken out, other control characters
    as their visible symbols (␛, ␀, …). Escaping for HTML is the engine's."""
    s = str(text)
    if not _CONTROL.search(s):
        return s  # (most lines: one search, no copy)
    s = _ANSI.sub("", s)
    return _CONTROL.sub(lambda m: chr(0x2400 + ord(m.group())) if m.group() != "\x7f" else "\u2421", s)


def when(epoch: float | None) -> str:
    if not epoch:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def secs(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 60:
        return f"{value:.1f} s"
    m, s = divmod(round(value), 60)
    return f"{m} min {s:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("rewheel.board", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(plain=plain, when=when, secs=secs, short=short_path, first_line=first_line,
                       diff_kinds=kinds, env_page=lambda key: f"env-{env_id(key)}.html")
    env.globals["key_packages"] = KEY_PACKAGES
    return env


@dataclass
class BoardResult:
    """What `rewheel board` wrote: where, how many pages, how large, how long it took."""

    out: Path
    pages: int = 0
    bytes: int = 0
    largest: tuple[str, int] = ("", 0)
    seconds: float = 0.0
    environments: int = 0
    runs: int = 0
    nightlies: int = 0
    bisections: int = 0
    fleet_hosts: int = 0
    removed: list[str] = field(default_factory=list)
    diffs: dict[str, str] = field(default_factory=dict)  # run page -> why it has no source diff

    @property
    def index(self) -> Path:
        return self.out / "index.html"

    def to_json(self) -> dict[str, Any]:
        return {"out": str(self.out), "index": str(self.index), "pages": self.pages, "bytes": self.bytes,
                "largest_page": {"name": self.largest[0], "bytes": self.largest[1]},
                "seconds": round(self.seconds, 3), "environments": self.environments, "runs": self.runs,
                "nightlies": self.nightlies, "bisections": self.bisections, "fleet_hosts": self.fleet_hosts,
                "removed": self.removed}


class _Writer:
    """Writes pages into the board's folder, counting them."""

    def __init__(self, out: Path, result: BoardResult) -> None:
        self.out, self.result = out, result
        self.written: list[str] = []
        self.jinja = _env()

    def page(self, name: str, template: str, **context: Any) -> None:
        html = self.jinja.get_template(template).render(page=name, **context)
        data = html.encode("utf-8")
        atomic_write(self.out / name, data, mode=0o644, durable=False)
        self.written.append(name)
        self.result.pages += 1
        self.result.bytes += len(data)
        if len(data) > self.result.largest[1]:
            self.result.largest = (name, len(data))


def prepare_folder(out: Path) -> list[str]:
    """The folder the board goes to, made when missing; the files the last board there wrote.
    Refused (exit 2, nothing written) when it is a file or a folder with other things in it."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file, not a folder", hint="give a new or empty folder, or an earlier board's")
    marker = out / MARKER
    if out.is_dir() and not marker.is_file() and any(out.iterdir()):
        raise UsageError(f"--out {out}: has files that are not a board rewheel wrote: nothing written",
                         hint="give a new or empty folder (or the folder of an earlier board, which is replaced)")
    previous: list[str] = []
    if marker.is_file():
        try:
            previous = [str(f) for f in json.loads(marker.read_text(encoding="utf-8")).get("files", [])]
        except (OSError, ValueError, AttributeError):
            previous = []
    out.mkdir(parents=True, exist_ok=True)
    return previous


def write(board: Board, out: Path, *, envs_live: dict[str, Environment | None]) -> BoardResult:
    """Every page of `board` into `out` (see the module docstring). `envs_live`: per
    environment key, its Environment where it can be read (for the diffs of its runs)."""
    t0 = time.monotonic()
    previous = prepare_folder(out)
    res = BoardResult(out, environments=len(board.envs), runs=len(board.runs), nightlies=len(board.nightlies),
                      bisections=len(board.bisections),
                      fleet_hosts=len(board.fleet.hosts) if board.fleet else 0)
    w = _Writer(out, res)
    common = {"board": board, "nav": _nav(board)}
    w.page("index.html", "index.html.j2", **common, title="rewheel board")
    for env in board.envs:
        _env_pages(w, env, common)
        for run in env.runs:
            _run_pages(w, run, envs_live.get(env.key), common, board.home)
    w.page("nightlies.html", "nightlies.html.j2", **common, title="Nightlies",
           chart=_nightly_chart(board))
    if board.fleet is not None:
        w.page("fleet.html", "fleet.html.j2", **common, title="Fleet", fleet=board.fleet)
    keep = set(w.written)
    for name in previous:
        if name not in keep and "/" not in name and name.endswith(".html") and (out / name).is_file():
            (out / name).unlink()
            res.removed.append(name)
    atomic_write(out / MARKER, json.dumps({"generated": board.generated, "files": w.written}) + "\n",
                 mode=0o644, durable=False)
    res.seconds = time.monotonic() - t0
    return res


def _nav(board: Board) -> list[tuple[str, str]]:
    links = [("index.html", "Board"), ("nightlies.html", "Nightlies")]
    if board.fleet is not None:
        links.append(("fleet.html", "Fleet"))
    return links


def _env_pages(w: _Writer, env: EnvView, common: dict[str, Any]) -> None:
    chart = charts.trend("Outage and smoke test per run", {
        "outage": [(datetime.fromtimestamp(r.started), r.outage_s) for r in env.runs if r.started],
        "smoke test": [(datetime.fromtimestamp(r.started), r.smoke_s) for r in env.runs if r.started]})
    pages = max(1, -(-len(env.runs) // TIMELINE_PAGE))
    for n in range(1, pages + 1):
        name = env.page if n == 1 else env.page.removesuffix(".html") + f"-{n}.html"
        w.page(name, "env.html.j2", **common, title=f"Environment {env.prefix}", env=env,
               runs=env.runs[(n - 1) * TIMELINE_PAGE:n * TIMELINE_PAGE], chart=chart if n == 1 else None,
               pager=_pager(env.page, n, pages, "-"))


def _pager(first: str, n: int, pages: int, sep: str) -> list[tuple[int, str, bool]]:
    """(number, page, is this one) for each page of a paged list."""
    stem = first.removesuffix(".html")
    return [(i, first if i == 1 else f"{stem}{sep}{i}.html", i == n) for i in range(1, pages + 1)] if pages > 1 else []


def _run_pages(w: _Writer, run: RunView, env: Environment | None, common: dict[str, Any], home: Path) -> None:
    diff: SourceDiff | None = None
    note = run.diff_note
    if run.diff_old is not None and run.diff_new is not None:
        if env is None:
            note = "the environment's interpreter cannot be run here: its source diff is not read"
        else:
            try:
                diff = source_diff(env, run, skip={str(home)})
            except Exception as exc:  # noqa: BLE001 - a page without its diff beats no board
                note = f"the source diff could not be read: {exc}"
    if diff is None and note:
        w.result.diffs[run.page] = note
    longest = max((s.seconds or 0.0 for s in run.steps), default=0.0)
    pager = [(i, run.page if i == 1 else run.diff_page(i), False) for i in range(1, diff.pages + 1)] if diff else []
    w.page(run.page, "run.html.j2", **common, title=f"{run.kind} {run.id}", run=run, diff=diff, diff_note=note,
           longest=longest, files=diff.page_files(1) if diff else [], pager=_mark(pager, 1))
    for n in range(2, diff.pages + 1 if diff else 0):
        assert diff is not None
        w.page(run.diff_page(n), "diff.html.j2", **common, title=f"Source diff of {run.id}, page {n}",
               run=run, diff=diff, files=diff.page_files(n), n=n, pager=_mark(pager, n))


def _mark(pager: list[tuple[int, str, bool]], n: int) -> list[tuple[int, str, bool]]:
    return [(i, p, i == n) for i, p, _ in pager] if len(pager) > 1 else []


def _nightly_chart(board: Board) -> str | None:
    smoke: list[tuple[datetime, float | None]] = [
        (datetime.fromtimestamp(r.started), s.seconds) for r in board.nightlies for s in r.steps
        if s.name == "smoke" and s.status != "skipped" and r.started]
    # The upgrades over the nightlies' own period (all of them when there are none).
    since = min((r.started for r in board.nightlies if r.started), default=0.0)
    outage: list[tuple[datetime, float | None]] = [
        (datetime.fromtimestamp(r.started), r.outage_s) for r in board.runs
        if r.started and r.started >= since and r.outage_s is not None]
    return charts.trend("Smoke test of each nightly, outage of each upgrade", {"nightly smoke test": smoke,
                                                                              "upgrade outage": outage})


def page_names(out: Path) -> Iterator[Path]:
    """The pages a board folder holds (for tests and the bench)."""
    yield from sorted(out.glob("*.html"))


__all__ = ["BoardResult", "MARKER", "page_names", "plain", "prepare_folder", "safe_name", "write"]
