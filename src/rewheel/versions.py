"""Reading what a version string says about a build: dev distance, git sha, variant, and
the link that shows the commits between two builds.

Nightly wheels carry their provenance in the version: `0.16.0rc2.dev313+g5719a4e4e` is
the 313th commit after the `0.16.0rc2` tag, at git commit `5719a4e4e` (setuptools-scm's
`g<sha>` local segment). Other local segments are build variants (`cu130`, `cpu`, a
dirty-tree date `d20260330`): shown to the user, never compared as versions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from packaging.version import InvalidVersion, Version

_SHA = re.compile(r"^g([0-9a-f]{7,40})$")
# Project-URL labels that usually point at the source repository, normalised (lowercase,
# alphanumerics only) as PEP 753 does; checked in this order.
_REPO_LABELS = ("source", "sourcecode", "repository", "code", "github", "gitlab", "git",
                "homepage", "home", "issues", "bugtracker", "tracker", "changelog", "changes",
                "releasenotes", "documentation")
_FORGES = {"github.com": "github", "gitlab.com": "gitlab", "codeberg.org": "gitea"}


@dataclass(frozen=True)
class VersionInfo:
    """A version taken apart. `public` excludes the local label; `sha` and `variant` come from it."""

    text: str
    version: Version | None
    sha: str | None = None
    variant: str | None = None

    @property
    def public(self) -> Version | None:
        return Version(self.version.public) if self.version is not None else None

    @property
    def dev(self) -> int | None:
        return self.version.dev if self.version is not None else None

    def to_json(self) -> dict[str, object]:
        return {"version": self.text, "public": str(self.public) if self.public else None,
                "dev": self.dev, "sha": self.sha, "variant": self.variant}


def parse(text: str) -> VersionInfo:
    """Split a version into its public part, the git sha and the variant of its local label."""
    try:
        v = Version(text)
    except InvalidVersion:
        return VersionInfo(text, None)
    sha = None
    variant: list[str] = []
    for seg in (v.local or "").split(".") if v.local else []:
        m = _SHA.match(seg)
        if m and sha is None:
            sha = m.group(1)
        else:
            variant.append(seg)
    return VersionInfo(text, v, sha, ".".join(variant) or None)


def dev_distance(old: VersionInfo, new: VersionInfo) -> int | None:
    """How many builds apart two dev builds of the same pre-release are
    (`0.16.0rc2.dev313` → `0.16.0rc2.dev344`: 31); None when they are not comparable."""
    a, b = old.version, new.version
    if a is None or b is None or a.dev is None or b.dev is None:
        return None
    if (a.epoch, a.release, a.pre, a.post) != (b.epoch, b.release, b.pre, b.post):
        return None
    return b.dev - a.dev


def repository_url(project_urls: dict[str, str] | None) -> str | None:
    """The source repository among a distribution's Project-URLs: a github/gitlab/codeberg
    `https://host/owner/repo`, preferring labels that name the source."""
    if not project_urls:
        return None
    by_label: dict[str, list[str]] = {}
    for label, url in project_urls.items():
        by_label.setdefault(re.sub(r"[^a-z0-9]", "", label.lower()), []).append(url)
    ordered = [u for lab in _REPO_LABELS for u in by_label.get(lab, [])]
    ordered += [u for u in project_urls.values() if u not in ordered]
    for url in ordered:
        repo = _repo_root(url)
        if repo:
            return repo
    return None


def _repo_root(url: str) -> str | None:
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return None
    host = (parts.hostname or "").lower().removeprefix("www.")
    if parts.scheme not in ("https", "http") or host not in _FORGES:
        return None
    segs = [s for s in parts.path.split("/") if s]
    if len(segs) < 2:
        return None
    owner, repo = segs[0], segs[1].removesuffix(".git")
    return f"https://{host}/{owner}/{repo}"


def compare_url(project_urls: dict[str, str] | None, old_sha: str | None, new_sha: str | None) -> str | None:
    """`<repo>/compare/<old>...<new>` (gitlab: `/-/compare/`) when both builds name a commit."""
    if not old_sha or not new_sha or old_sha == new_sha:
        return None
    repo = repository_url(project_urls)
    if repo is None:
        return None
    host = urlsplit(repo).hostname or ""
    sep = "/-/compare/" if _FORGES.get(host) == "gitlab" else "/compare/"
    return f"{repo}{sep}{old_sha}...{new_sha}"
