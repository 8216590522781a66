"""The package indexes a recipe names: the credentials inside their URLs kept out of every
argv, log and terminal line (`redact`, `index_options`, `uv_environment`: uv gets them through
its environment), the URLs' validation, and the preflight's reachability checks
(`check_indexes`)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import httpx
from packaging.utils import canonicalize_name

from rewheel import httpclient
from rewheel.errors import PreflightError, RecipeError
from rewheel.recipe import Recipe

# Accept header of a PEP 691-aware client: JSON preferred, HTML accepted.
_ACCEPT = ("application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
           "text/html;q=0.01")


INDEX_TIMEOUT_S = 10.0


# scheme://userinfo@ — userinfo has no "/", whitespace, quote or "@" (an "@" in a password must be
# percent-encoded in a URL). Anything that looks like scheme://X@ is masked, whatever X is.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/\s@'\"<>`]+)@")


def redact(text: str) -> str:
    """Mask the userinfo (`user:password@`, `token@`) of every URL in `text` as `***@`."""
    if "@" not in text:
        return text
    return _USERINFO.sub(lambda m: m.group("scheme") + "***@", text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    return [redact(str(a)) for a in argv]


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """(the URL without its userinfo, username, password), percent-decoded."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, sep, password = userinfo.partition(":")
    return (urlunsplit(parts._replace(netloc=hostport)), unquote(user) or None,
            unquote(password) if sep else None)


def index_options(index_url: str | None, extra_index_urls: Sequence[str],
                  find_links: Sequence[str] = ()) -> tuple[list[str], dict[str, str], tuple[str, ...]]:
    """uv's index options, the environment variables that carry their credentials, and the
    variables to drop from the inherited environment.

    Credentials never go on uv's command line (every user sees it in `ps`; a process's
    environment only its owner and root). Without any, the recipe's URLs become
    `--index-url` / `--extra-index-url` as written. With any, every index of the recipe
    becomes a *named* index — `--default-index rewheel-index=URL`, `--index
    rewheel-extra-N=URL` (same order, same first-index priority) — with its userinfo taken out
    of the URL and given to uv as `UV_INDEX_<NAME>_USERNAME` / `_PASSWORD`. The inherited
    UV_INDEX_URL / UV_DEFAULT_INDEX (UV_EXTRA_INDEX_URL / UV_INDEX) are dropped when the recipe
    sets its own, as a command-line option would override them."""
    urls = ([index_url] if index_url else []) + list(extra_index_urls)
    args: list[str] = []
    env: dict[str, str] = {}
    drop: tuple[str, ...] = ()
    if not any("@" in urlsplit(u).netloc for u in urls):
        if index_url:
            args += ["--index-url", index_url]
        for url in extra_index_urls:
            args += ["--extra-index-url", url]
    else:
        named = ([("--default-index", "rewheel-index", index_url)] if index_url else []) + \
                [("--index", f"rewheel-extra-{i}", u) for i, u in enumerate(extra_index_urls)]
        for option, name, url in named:
            bare, user, password = split_credentials(url)
            args += [option, f"{name}={bare}"]
            var = "UV_INDEX_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()
            if user is not None:
                env[f"{var}_USERNAME"] = user
            if password is not None:
                env[f"{var}_PASSWORD"] = password
        drop = (("UV_INDEX_URL", "UV_DEFAULT_INDEX") if index_url else ()) + \
               (("UV_EXTRA_INDEX_URL", "UV_INDEX") if extra_index_urls else ())
    for link in find_links:
        args += ["--find-links", link]
    return args, env, drop


def uv_environment(recipe: Recipe, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment uv runs with for `recipe`: `base` (default: ours) with the index
    credentials that `index_options` keeps off the command line."""
    spec = recipe.install
    _args, creds, drop = index_options(spec.index_url, spec.extra_index_urls)
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in drop}
    env.update(creds)
    return env


def _index_args(recipe: Recipe) -> list[str]:
    """uv's index options for the recipe, without credentials (see `index_options`): run uv
    with `uv_environment(recipe)`."""
    spec = recipe.install
    return index_options(spec.index_url, spec.extra_index_urls, spec.find_links)[0]


@dataclass(frozen=True)
class IndexCheck:
    """One index (or find-links location) and whether it answered for the recipe's packages."""

    url: str  # redacted
    kind: str  # "index" | "extra-index" | "find-links"
    ok: bool
    status: int | None = None
    found: tuple[str, ...] = ()
    message: str = ""

    def summary(self) -> str:
        return f"{self.kind} {self.url}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "kind": self.kind, "ok": self.ok, "status": self.status,
                "found": list(self.found), "message": self.message}


def _scheme(url: str) -> str:
    return urlsplit(url).scheme.lower() if "://" in url else ""


def validate_urls(recipe: Recipe) -> None:
    """Index URLs must be http(s):// or file:// URLs: anything else is a recipe error."""
    spec = recipe.install
    keys: list[tuple[str, str]] = []
    if spec.index_url:
        keys.append(("install.index_url", spec.index_url))
    keys += [(f"install.extra_index_urls[{i}]", u) for i, u in enumerate(spec.extra_index_urls)]
    for key, url in keys:
        scheme = _scheme(url)
        no_host = scheme != "file" and not urlsplit(url).hostname
        if scheme not in ("http", "https", "file") or no_host:
            raise RecipeError(recipe.source, key,
                              f'expected an http://, https:// or file:// URL, got "{redact(url)}"',
                              hint="e.g. https://mirror.example/simple")
    for i, link in enumerate(spec.find_links):
        scheme = _scheme(link)
        if scheme and scheme not in ("http", "https", "file"):
            raise RecipeError(recipe.source, f"install.find_links[{i}]",
                              "expected a folder, or an http(s):// or file:// URL, "
                              f'got "{redact(link)}"')


def _file_path(url: str) -> Path:
    from urllib.request import url2pathname

    return Path(url2pathname(urlsplit(url).path))


def _check_http(client: httpx.Client, url: str, kind: str, names: Sequence[str]) -> IndexCheck:
    shown = redact(url)
    base = url.rstrip("/")
    found: list[str] = []
    last_status: int | None = None
    try:
        for name in names:
            r = client.get(f"{base}/{quote(name)}/", headers={"Accept": _ACCEPT})
            last_status = r.status_code
            if r.status_code in (401, 403):
                raise PreflightError(f"{kind} {shown} refused access (HTTP {r.status_code})",
                                     hint="check the credentials in the URL")
            if r.status_code >= 500:
                raise PreflightError(f"{kind} {shown} failed (HTTP {r.status_code} for {name})",
                                     hint="the index server has a problem; try again later")
            if 200 <= r.status_code < 300:
                found.append(name)
        if found:
            return IndexCheck(shown, kind, True, last_status, tuple(found),
                              f"offers {', '.join(found)}")
        # An extra index may legitimately hold only dependencies (e.g. torch builds); it counts as
        # reachable when its root answers like an index.
        r = client.get(base + "/", headers={"Accept": _ACCEPT})
        if 200 <= r.status_code < 300:
            return IndexCheck(shown, kind, True, r.status_code, (),
                              f"reachable, but offers none of {', '.join(names)}")
    except httpx.HTTPError as exc:
        why = redact(str(exc)) or type(exc).__name__
        raise PreflightError(f"{kind} {shown} is unreachable: {why}",
                             hint="check the URL and the network (proxy, DNS, firewall)") from None
    raise PreflightError(f"{kind} {shown} does not look like a package index: HTTP {last_status} "
                         f"for {', '.join(names)} and HTTP {r.status_code} for its root",
                         hint="check the URL (a PEP 503 simple index: <base>/simple, or the "
                              "per-commit <base>/<sha> of vLLM's nightly wheels)")


def _check_file_index(url: str, kind: str, names: Sequence[str]) -> IndexCheck:
    shown = redact(url)
    root = _file_path(url)
    if not root.is_dir():
        raise PreflightError(f"{kind} {shown}: folder {root} does not exist")
    found = [n for n in names if (root / n).is_dir()]
    return IndexCheck(shown, kind, True, None, tuple(found),
                      f"offers {', '.join(found)}" if found else "local index folder exists")


def check_indexes(recipe: Recipe, client: httpx.Client | None = None, *,
                  packages: Sequence[str] | None = None) -> list[IndexCheck]:
    """Check that every index and find-links location of the recipe answers.

    Each index is asked for the recipe's packages (`<index>/<name>/`, PEP 503). The default index
    is not checked when the recipe sets no `index_url` (uv's own configuration decides it). Raises
    RecipeError for a URL that is not http(s)/file, PreflightError (naming the redacted URL) for
    an index that is unreachable, refuses access or answers 404 for everything.
    """
    validate_urls(recipe)
    spec = recipe.install
    names = [canonicalize_name(n) for n in packages] if packages is not None else \
        [canonicalize_name(r.name) for r in spec.requirements]
    targets: list[tuple[str, str]] = []
    if spec.index_url:
        targets.append(("index", spec.index_url))
    targets += [("extra-index", u) for u in spec.extra_index_urls]
    own = client is None
    client = client or httpclient.client(timeout=INDEX_TIMEOUT_S, follow_redirects=True)
    checks: list[IndexCheck] = []
    try:
        for kind, url in targets:
            if _scheme(url) == "file":
                checks.append(_check_file_index(url, kind, names))
            else:
                checks.append(_check_http(client, url, kind, names))
        for link in spec.find_links:
            shown = redact(link)
            scheme = _scheme(link)
            if scheme in ("", "file"):
                path = _file_path(link) if scheme else Path(link)
                if not path.exists():
                    raise PreflightError(f"find-links {shown} does not exist",
                                         hint="fix [install] find_links in the recipe")
                checks.append(IndexCheck(shown, "find-links", True, None, (), "exists"))
                continue
            try:
                r = client.get(link)
            except httpx.HTTPError as exc:
                raise PreflightError(f"find-links {shown} is unreachable: "
                                     f"{redact(str(exc)) or type(exc).__name__}") from None
            if not 200 <= r.status_code < 300:
                raise PreflightError(f"find-links {shown} answered HTTP {r.status_code}")
            checks.append(IndexCheck(shown, "find-links", True, r.status_code, (), "reachable"))
    finally:
        if own:
            client.close()
    return checks
