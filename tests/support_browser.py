"""The board's pages in a real browser: Debian's headless Chromium, driven by Playwright
(its own browser builds are never downloaded: it launches the system's `chromium`).

`visit(folder)` opens every page of a board from file:// at a desktop size and a phone width
and records, per page and size: console errors and uncaught exceptions, failed requests,
whether the body is wider than the window (horizontal overflow), every link, and — where
asked — a full-page screenshot. Links are resolved afterwards against the folder: a page
that exists and, for `#anchor`, an element with that id in it.

Without Chromium the tests skip, saying why; `.ci/run` installs it and sets
REWHEEL_TESTS_CHROMIUM=require, which turns the skip into a failure."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

# The flags that work here and in CI (a root user, no GPU, no network but the registries).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DESKTOP = (1280, 800)
PHONE = (390, 844)


def chromium() -> str:
    """The system's Chromium, or a skip (a failure under REWHEEL_TESTS_CHROMIUM=require)."""
    path = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        path = None
    if path is None:
        why = "needs Debian's chromium (apt-get install chromium) and playwright (the test extra)"
        if os.environ.get("REWHEEL_TESTS_CHROMIUM") == "require":
            pytest.fail(why + "; REWHEEL_TESTS_CHROMIUM=require", pytrace=False)
        pytest.skip(why)
    return path


@dataclass
class Visit:
    """One page at one size."""

    name: str
    size: tuple[int, int]
    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    scroll_width: int = 0
    client_width: int = 0
    links: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    screenshot: Path | None = None
    title: str = ""

    @property
    def overflows(self) -> bool:
        return self.scroll_width > self.client_width


def visit(folder: Path, *, sizes: Iterable[tuple[int, int]] = (DESKTOP, PHONE), shots: Path | None = None,
          shoot: set[str] | None = None, pages: list[str] | None = None) -> list[Visit]:
    """Every page of the board in `folder` (or `pages`) at each size; screenshots into
    `shots` of the pages named in `shoot` (all when None)."""
    from playwright.sync_api import sync_playwright

    exe = chromium()
    names = pages if pages is not None else sorted(p.name for p in folder.glob("*.html"))
    out: list[Visit] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
        try:
            for size in sizes:
                out += _at_size(browser, folder, names, size, shots, shoot)
        finally:
            browser.close()
    return out


def _at_size(browser: Any, folder: Path, names: list[str], size: tuple[int, int], shots: Path | None,
             shoot: set[str] | None) -> list[Visit]:
    ctx = browser.new_context(viewport={"width": size[0], "height": size[1]})
    page = ctx.new_page()
    done: list[Visit] = []
    page.on("console", lambda m: done[-1].console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: done[-1].console_errors.append(f"uncaught: {e}"))
    page.on("requestfailed", lambda r: done[-1].failed_requests.append(f"{r.url}: {r.failure}"))
    for name in names:
        v = Visit(name, size)
        done.append(v)
        page.goto((folder / name).resolve().as_uri(), wait_until="load")
        v.title = page.title()
        v.scroll_width, v.client_width = page.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        v.links = page.evaluate("[...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'))")
        v.ids = set(page.evaluate("[...document.querySelectorAll('[id]')].map(e => e.id)"))
        if shots is not None and (shoot is None or name in shoot):
            shots.mkdir(parents=True, exist_ok=True)
            v.screenshot = shots / f"{name.removesuffix('.html')}-{size[0]}.png"
            page.screenshot(path=str(v.screenshot), full_page=True)
    ctx.close()
    return done


def text_of(folder: Path, name: str, selector: str) -> list[str]:
    """The rendered text (innerText) of the elements a selector finds on one page, and the
    number of script elements it has (as the last item)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.goto((folder / name).resolve().as_uri(), wait_until="load")
            texts = page.evaluate(f"[...document.querySelectorAll({selector!r})].map(e => e.innerText)")
            scripts = page.evaluate("document.querySelectorAll('script').length")
            return [*texts, str(scripts)]
        finally:
            browser.close()


def broken_links(folder: Path, visits: list[Visit]) -> list[str]:
    """Links between pages that do not resolve: a page missing from the folder, or an
    anchor missing from its page. Links out (https://) are not followed (no network)."""
    ids = {v.name: v.ids for v in visits}
    bad = []
    for v in visits:
        for href in v.links:
            parts = urlsplit(href)
            if parts.scheme in ("http", "https"):
                continue
            if parts.scheme or parts.netloc or href.startswith("/"):
                bad.append(f"{v.name}: {href} (not a relative link)")
                continue
            target = unquote(parts.path) or v.name
            if not re.fullmatch(r"[A-Za-z0-9._-]+\.html", target) or not (folder / target).is_file():
                bad.append(f"{v.name}: {href} (no such page)")
            elif parts.fragment and target in ids and parts.fragment not in ids[target]:
                bad.append(f"{v.name}: {href} (no such anchor)")
    return sorted(set(bad))
