"""Nightly builds away from any live environment — what `rewheel ci` and `rewheel bisect` share:
throwaway environments, recipes re-aimed at them, the builds an index offers, vLLM-style
per-commit indexes, the commits between two builds, and PEP 751 locks resolved by uv.

- A throwaway environment is a `uv venv` made with the recipe's interpreter (so it has the same
  Python version), under `$REWHEEL_HOME` (or a given folder), removed afterwards. The recipe's
  `{python}` then means the throwaway interpreter and its `[service]` is dropped: nothing here
  touches a service or a live environment.
- Builds an index offers come from the project page `<index>/<name>/`: PEP 691 JSON when the
  server offers it, PEP 503 HTML otherwise; versions are read from wheel file names and ordered
  by `packaging.version.Version` (dev distance first, as setuptools-scm numbers nightlies).
- vLLM publishes one index per commit at `<base>/<commit-sha>/`; `<base>/nightly/` mirrors only
  the newest. The base is derived from an extra index URL that ends in `/nightly` or in a sha.
- The commits between two shas come from GitHub's compare API
  (`GET /repos/{owner}/{repo}/compare/{base}...{head}`, `commits[].sha`, oldest first) through
  an injected `httpx.Client`, or from a local clone (`git rev-list --reverse A..B`).
"""

from __future__ import annotations

import html.parser
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import httpx
from packaging.requirements import Requirement
from packaging.utils import (InvalidSdistFilename, InvalidWheelFilename, canonicalize_name,
                             parse_sdist_filename, parse_wheel_filename)
from packaging.version import Version

from rewheel import httpclient, proc
from rewheel.errors import PreflightError, UsageError
from rewheel.installer import find_uv
from rewheel.installer.indexes import _ACCEPT, INDEX_TIMEOUT_S, redact
from rewheel.owned import private_dir
from rewheel.paths import state_home
from rewheel.recipe import Recipe

GITHUB_API = "https://api.github.com"
_HEX_SHA = re.compile(r"^[0-9a-f]{7,40}$")
VENV_TIMEOUT_S = 300.0
COMPILE_TIMEOUT_S = 900.0
# uv options that only `uv pip install`/`sync` understand; `uv pip compile` rejects them.
_INSTALL_ONLY_VALUE = ("--link-mode", "--reinstall-package", "--target", "--prefix")
_INSTALL_ONLY_FLAG = ("--compile-bytecode", "--reinstall", "--break-system-packages", "--system",
                      "--strict", "--exact", "--user")


# --- throwaway environments -------------------------------------------------------------------

@contextmanager
def throwaway_env(recipe: Recipe, *, parent: Path | None = None,
                  interpreter: str | None = None) -> Iterator[Path]:
    """A fresh `uv venv` with the recipe's interpreter version; yields its python; removes it.

    `interpreter` overrides the recipe's (a path or a version uv understands, e.g. "3.12"):
    for a CI runner that does not have the host's interpreter path."""
    base = private_dir(parent or state_home() / "throwaway")
    root = Path(tempfile.mkdtemp(prefix="env-", dir=base))
    try:
        yield make_venv(recipe, root / "venv", interpreter=interpreter)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def make_venv(recipe: Recipe, where: Path, *, interpreter: str | None = None) -> Path:
    """`uv venv --python <interpreter> where`; returns where/bin/python. Raises PreflightError."""
    python = interpreter or str(recipe.python)
    if interpreter is None and not Path(python).exists():
        raise PreflightError(f"{recipe.source}: environment.python {python} does not exist on "
                             "this machine, so the throwaway environment has no interpreter",
                             hint="pass --venv-python PATH|VERSION (e.g. 3.12) for the "
                                  "throwaway environment")
    argv = [find_uv(), "venv", "--no-progress", "--color", "never", "--python", python,
            str(where)]
    cp = proc.run(argv, timeout=VENV_TIMEOUT_S)
    if not cp.ok:
        detail = (cp.stderr or cp.stdout).strip()[-600:]
        raise PreflightError(f"cannot create a throwaway environment with {python} "
                             f"(exit {cp.returncode}): {' '.join(argv)}\n  {detail}",
                             hint="check environment.python in the recipe, or pass --venv-python")
    return where / "bin" / "python"


def scoped_recipe(recipe: Recipe, python: Path, *, packages: Sequence[str] | None = None,
                  first_index: str | None = None) -> Recipe:
    """The recipe aimed at a throwaway interpreter: no service, no cleanup, `reinstall = named`
    (a fresh environment has nothing to force-reinstall; `--reinstall` would only make uv
    refetch what its cache holds). `first_index` goes first among the extra indexes, so uv's
    first-index strategy takes the package from it (a per-commit index)."""
    spec = recipe.install
    extra = tuple(spec.extra_index_urls)
    if first_index:
        extra = (first_index, *[u for u in extra if u.rstrip("/") != first_index.rstrip("/")])
    install = replace(spec, packages=tuple(packages) if packages is not None else spec.packages,
                      extra_index_urls=extra, reinstall="named")
    return replace(recipe, python=Path(python), service=None, cleanup_paths=(), install=install)


def pinned_packages(recipe: Recipe, name: str, version: str) -> list[str]:
    """The recipe's packages with `name` pinned to exactly `version` (added when absent)."""
    canon = canonicalize_name(name)
    out: list[str] = []
    for pkg in recipe.install.packages:
        req = Requirement(pkg)
        if canonicalize_name(req.name) == canon:
            extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
            out.append(f"{req.name}{extras}=={version}")
        else:
            out.append(pkg)
    if not any(canonicalize_name(Requirement(p).name) == canon for p in out):
        out.append(f"{name}=={version}")
    return out


def package_name(recipe: Recipe, name: str | None) -> str:
    """The package a command is about: `name`, else the recipe's first package."""
    if name:
        return canonicalize_name(name)
    reqs = recipe.install.requirements
    if not reqs:
        raise UsageError(f"{recipe.source}: install.packages is empty; name the package")
    return canonicalize_name(reqs[0].name)


def import_name(python: Path, dist: str) -> str | None:
    """The top-level import package of `dist` in the environment of `python` (for diagnosis)."""
    from rewheel.environment import Environment

    return Environment.inspect(python).import_name([dist])


# --- what an index offers ---------------------------------------------------------------------

class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href") or ""
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def _version_of(filename: str, name: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            dist, version, _, _ = parse_wheel_filename(filename)
        else:
            dist, version = parse_sdist_filename(filename)
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None
    return version if canonicalize_name(dist) == name else None


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    version: Version

    def to_json(self) -> dict[str, Any]:
        return {"filename": self.filename, "url": redact(self.url), "version": str(self.version)}


def index_files(index_url: str, name: str, client: httpx.Client | None = None) -> list[IndexFile] | None:
    """The files of project `name` on a simple index (PEP 691 JSON where offered, else PEP 503
    HTML), oldest version first; None when the index does not have the project (404).
    Raises PreflightError for an index that is unreachable or fails."""
    canon = canonicalize_name(name)
    page = f"{index_url.rstrip('/')}/{quote(canon)}/"
    own = client is None
    client = client or httpclient.client(timeout=INDEX_TIMEOUT_S, follow_redirects=True)
    try:
        r = client.get(page, headers={"Accept": _ACCEPT})
    except httpx.HTTPError as exc:
        raise PreflightError(f"index {redact(index_url)} is unreachable: "
                             f"{redact(str(exc)) or type(exc).__name__}") from None
    finally:
        if own:
            client.close()
    if r.status_code == 404:
        return None
    if not 200 <= r.status_code < 300:
        raise PreflightError(f"index {redact(index_url)} answered HTTP {r.status_code} for "
                             f"{redact(page)}")
    base = str(r.url)
    entries: list[tuple[str, str]] = []
    if "json" in r.headers.get("content-type", ""):
        for f in r.json().get("files", []):
            entries.append((f.get("filename", ""), urljoin(base, f.get("url", ""))))
    else:
        parser = _Links()
        parser.feed(r.text)
        for href, text in parser.links:
            fn = text or urlsplit(href).path.rsplit("/", 1)[-1]
            entries.append((fn, urljoin(base, href)))
    out = []
    for fn, url in entries:
        v = _version_of(fn, canon)
        if v is not None:
            out.append(IndexFile(fn, url, v))
    return sorted(out, key=lambda f: f.version)


def offered_versions(recipe: Recipe, name: str, client: httpx.Client | None = None) -> tuple[str | None, list[Version]]:
    """(index, versions) of the first configured index that offers `name` — the index uv's
    first-index strategy takes it from (extra indexes before `index_url`). The default index is
    not asked when the recipe sets no `index_url`: uv's own configuration decides it."""
    urls = [*recipe.install.extra_index_urls, *([recipe.install.index_url] if recipe.install.index_url else [])]
    for url in urls:
        if urlsplit(url).scheme not in ("http", "https"):
            continue
        files = index_files(url, name, client)
        if files:
            return url, sorted({f.version for f in files})
    return None, []


def commit_index_base(recipe: Recipe, override: str | None = None) -> str | None:
    """Where per-commit indexes live: `override`, else the parent of an index URL that ends in
    `/nightly` or in a commit sha (vLLM: `<base>/nightly` → `<base>/<sha>/`)."""
    if override:
        return override.rstrip("/")
    for url in [*recipe.install.extra_index_urls, *([recipe.install.index_url] if recipe.install.index_url else [])]:
        path = urlsplit(url).path.rstrip("/")
        last = path.rsplit("/", 1)[-1]
        if last == "nightly" or _HEX_SHA.match(last):
            return url.rstrip("/")[: -len(last)].rstrip("/")
    return None


def commit_index(base: str, sha: str) -> str:
    return f"{base.rstrip('/')}/{sha}"


# --- commits between two builds ---------------------------------------------------------------

def github_repo(spec: str) -> tuple[str, str]:
    """"owner/repo" or a https://github.com/owner/repo URL → (owner, repo)."""
    text = spec.strip()
    if "://" in text:
        segs = [s for s in urlsplit(text).path.split("/") if s]
    else:
        segs = [s for s in text.split("/") if s]
    if len(segs) < 2:
        raise UsageError(f"not a GitHub repository: {spec!r}", hint="give OWNER/REPO, e.g. vllm-project/vllm")
    return segs[0], segs[1].removesuffix(".git")


@dataclass
class CommitRange:
    """The commits after `base` up to and including `head`, oldest first, as full shas."""

    base: str  # full sha of the base (the good build's commit)
    commits: list[str]
    source: str  # "github compare API" | "git"

    def to_json(self) -> dict[str, Any]:
        return {"base": self.base, "commits": self.commits, "source": self.source}


def compare_commits(repo: str, base: str, head: str, *, client: httpx.Client | None = None,
                    api_url: str = GITHUB_API, token: str | None = None,
                    per_page: int = 100, max_pages: int = 50) -> CommitRange:
    """The commits between two shas from GitHub's compare API, paged (`per_page`, `page`)."""
    owner, name = github_repo(repo)
    url = f"{api_url.rstrip('/')}/repos/{quote(owner)}/{quote(name)}/compare/{quote(base)}...{quote(head)}"
    headers = {"Accept": "application/vnd.github+json"}
    token = token if token is not None else os.environ.get("GITHUB_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    own = client is None
    client = client or httpclient.client(timeout=30.0, follow_redirects=True)
    commits: list[str] = []
    base_sha = base
    try:
        for page in range(1, max_pages + 1):
            try:
                r = client.get(url, params={"per_page": per_page, "page": page}, headers=headers)
            except httpx.HTTPError as exc:
                raise PreflightError(f"compare API {url} is unreachable: {type(exc).__name__}: {exc}",
                                     hint="check the network, or give a local clone with --repo PATH") from None
            if r.status_code == 404:
                raise UsageError(f"compare API {url}: HTTP 404 (no such repository, or {base} / "
                                 f"{head} is not a commit of {owner}/{name})",
                                 hint="check --github OWNER/REPO and the shas in --good/--bad")
            if r.status_code != 200:
                raise PreflightError(f"compare API {url} answered HTTP {r.status_code}: "
                                     f"{r.text.strip()[:300]}",
                                     hint="rate-limited? set GITHUB_TOKEN, or use --repo PATH")
            doc = r.json()
            base_sha = (doc.get("base_commit") or {}).get("sha") or base_sha
            got = [c["sha"] for c in doc.get("commits", []) if c.get("sha")]
            commits += [c for c in got if c not in commits]
            total = doc.get("total_commits")
            if len(got) < per_page or (isinstance(total, int) and len(commits) >= total):
                break
    finally:
        if own:
            client.close()
    return CommitRange(base_sha, commits, "github compare API")


def git_commits(repo: str | os.PathLike[str], base: str, head: str) -> CommitRange:
    """The commits between two shas in a local clone (`git rev-list --reverse base..head`)."""
    path = Path(repo)
    if not path.is_dir():
        raise UsageError(f"--repo {path}: no such folder")

    def git(*args: str) -> str:
        argv = ["git", "-C", str(path), *args]
        cp = proc.run(argv, timeout=120)
        if not cp.ok:
            raise UsageError(f"`{' '.join(argv)}` failed (exit {cp.returncode}): "
                             f"{(cp.stderr or cp.stdout).strip()[:300]}",
                             hint="is --repo a clone that contains both commits? (git fetch)")
        return cp.stdout

    full_base = git("rev-parse", "--verify", f"{base}^{{commit}}").strip()
    commits = git("rev-list", "--reverse", f"{base}..{head}").split()
    return CommitRange(full_base, commits, "git")


# --- locks ------------------------------------------------------------------------------------

def compile_argv(recipe: Recipe, requirements: Path, output: Path, *, uv: str | None = None,
                 upgrade_packages: Sequence[str] | None = None, fmt: str = "pylock.toml",
                 no_deps: bool = False) -> list[str]:
    """`uv pip compile` writing a PEP 751 lock (wheel URLs and sha256 hashes from the index) for
    the recipe's packages at their newest versions, for the recipe's interpreter.

    `upgrade_packages`: only these go to their newest versions (`--upgrade-package`); every
    other package keeps the version `output` already pins, where it can (uv's preferences).
    `fmt`: `pylock.toml` or `requirements.txt`. `no_deps`: exactly the requirements (each pinned),
    their dependencies not added — the lock of a set already resolved."""
    from rewheel.installer.indexes import _index_args

    spec = recipe.install
    argv = [uv or find_uv(), "pip", "compile", "--python", str(recipe.python), "--no-progress",
            "--color", "never", "--quiet", "--format", fmt, "-o", str(output)]
    if no_deps:
        argv.append("--no-deps")
    if upgrade_packages is None:
        argv.append("--upgrade")
    else:
        for name in upgrade_packages:
            argv += ["--upgrade-package", name]
    if spec.prerelease and "--prerelease" not in " ".join(spec.uv_args):
        argv += ["--prerelease", "allow"]
    argv += _index_args(recipe)
    args = list(spec.uv_args)
    i = 0
    while i < len(args):
        opt = args[i].split("=", 1)[0]
        if opt in _INSTALL_ONLY_VALUE:
            i += 1 if "=" in args[i] else 2
            continue
        if opt not in _INSTALL_ONLY_FLAG:
            argv.append(args[i])
        i += 1
    argv.append(str(requirements))
    return argv


def read_lock(path: Path) -> list[dict[str, Any]]:
    """The `[[packages]]` of a PEP 751 lock as {name, version, wheels} dicts."""
    import tomllib

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"lock file {path}: cannot be read as TOML: {exc}") from None
    pkgs = data.get("packages")
    if "lock-version" not in data or not isinstance(pkgs, list):
        raise UsageError(f"lock file {path}: not a PEP 751 lock (no lock-version or [[packages]])")
    return [{"name": p.get("name"), "version": p.get("version"),
             "wheels": [w.get("url") or w.get("name") for w in p.get("wheels", [])]}
            for p in pkgs if isinstance(p, dict) and p.get("name")]


def lock_name(recipe: Recipe) -> str:
    """`pylock.<recipe>.toml`: PEP 751 requires `pylock.toml` or `pylock.<name>.toml` with no dots
    in `<name>`, and uv refuses any other file name."""
    safe = re.sub(r"[^A-Za-z0-9_-]+", "-", recipe.name).strip("-") or "recipe"
    return f"pylock.{safe}.toml"


def env_python_version(python: Path) -> str:
    cp = proc.run([str(python), "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"], timeout=60)
    return cp.stdout.strip() if cp.ok else "?"


# --- the upgrade as a lock: what `ci` qualifies and a staged `run` prepares ----------------------

def export_pins(env: Any, upgraded: Sequence[str], where: Path) -> tuple[Path | None, int, list[str]]:
    """An environment's pinned set, written as `target-pins.txt` (`name==version`, one a line)
    in `where`: every distribution but `upgraded` (the upgrade picks those), editable installs
    and ones installed from a URL or a path (no index can give them back). Returns (the file,
    or None when nothing is pinned; how many are pinned; the ones left out, described)."""
    skip = {canonicalize_name(n) for n in upgraded}
    pins, left_out = [], []
    for d in env.distributions():
        doc = d.to_json()
        if canonicalize_name(d.name) in skip:
            continue
        if doc["editable"] or doc["url"]:
            left_out.append(f"{d.name} {d.version_text} ({'editable' if doc['editable'] else doc['url']})")
            continue
        pins.append(f"{canonicalize_name(d.name)}=={d.version_text}")
    path = where / "target-pins.txt"
    path.write_text("".join(p + "\n" for p in sorted(pins)), encoding="utf-8")
    return (path if pins else None), len(pins), left_out


def run_compile(recipe: Recipe, argv: list[str], log: Path, on_output: Any) -> proc.Completed:
    """Run a `compile_argv` command with the recipe's index credentials, logged to `log`."""
    from rewheel.installer import redact_argv, uv_environment

    with open(log, "a", encoding="utf-8") as f:
        f.write(f"[rewheel] $ {' '.join(redact_argv(argv))}\n")
    env = uv_environment(recipe)  # the indexes' credentials: never on uv's command line
    env.setdefault("UV_PREVIEW_FEATURES", "pylock")
    return proc.stream(argv, on_line=on_output, timeout=COMPILE_TIMEOUT_S, env=env,
                       log_path=log, redact=redact)


def resolve_lock(recipe: Recipe, lock: Path, work: Path, log: Path, *, on_output: Any = None) -> proc.Completed:
    """Resolve the recipe's packages alone, at their newest, to an exact PEP 751 lock (wheel
    URLs and sha256 hashes) with `uv pip compile`, for `recipe.python`'s Python version;
    writes `lock`, logs to `log`, keeps its input in `work`. Returns uv's completed process
    (the caller judges it). An upgrade of an existing environment is resolved by
    `resolution.resolve` instead."""
    req = work / "requirements.in"
    req.write_text("".join(p + "\n" for p in recipe.install.packages), encoding="utf-8")
    return run_compile(recipe, compile_argv(recipe, req, lock), log, on_output)
