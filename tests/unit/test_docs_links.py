"""The docs hold together: every relative Markdown link in README.md and docs/ points at a file
or folder that exists in the repository, and no page names a file that is not in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# [text](target) — the target up to the first space or closing parenthesis (a title may follow).
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
# Files that live outside this repository; a page naming them sends a reader nowhere. Spelled
# in pieces so that this file does not itself name them (a grep of the repo finds none).
ABSENT = ("SPEC" + ".md", "REFERENCE" + ".md", "../" + "shared")


def _prose(text: str) -> str:
    """The page without its fenced code blocks: `[x](y)` inside code is not a link."""
    kept: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            kept.append(line)
    return "\n".join(kept)


def _relative_links(page: Path) -> list[str]:
    targets = LINK.findall(_prose(page.read_text(encoding="utf-8")))
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]


def test_there_are_pages_and_links() -> None:
    # Guards the test itself: a broken glob or regex would make the checks below vacuous.
    assert (ROOT / "docs").is_dir()
    assert len(PAGES) >= 10
    assert sum(len(_relative_links(p)) for p in PAGES) >= 30


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _relative_links(page):
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert broken == [], f"{page.relative_to(ROOT)} links to missing paths: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_files_outside_the_repository(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert [name for name in ABSENT if name in text] == []


def test_readme_stays_short() -> None:
    # The README is the front door: what rewheel is, set-up, demo, a recipe, the commands, links.
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 220
