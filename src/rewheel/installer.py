"""Reinstalling an environment with uv: the argv, the plan (what uv would do), the streamed
install, the preflight checks (uv, index reachability) — and keeping
credentials that live inside index URLs out of every log, report and terminal line.

Choices where uv offers several (docs/installing.md says the same to users):
- `packages` get `--upgrade-package NAME`: upgraded to the newest version the indexes offer
  within their specifiers. `reinstall = "all"` adds `--reinstall` (uv then re-resolves and
  re-installs every package of the resolution from the indexes, as in the story — which also
  moves dependencies to the newest versions allowed); `reinstall = "named"` adds
  `--reinstall-package NAME` for the recipe's packages only, and dependencies stay where they
  are unless the new versions need others.
- The index strategy is uv's default, `first-index`: for each package uv uses the first index
  (extra indexes before the default one) that has it at all. That is what vLLM nightlies need —
  `vllm` comes from the nightly extra index even when the default index has a "newer" release —
  and it is the defence against dependency confusion. `uv_args` may override it.
- `--no-progress --color never`: uv's progress bars are for terminals; we stream uv's own
  "Resolved / Prepared / Installed / + name==version" lines instead, which are the progress.
- `--link-mode copy` (unless `uv_args` set a link mode): with uv's default hard links, a file
  patched in place is patched in uv's cache too, and a force-reinstall re-installs the patch.
  A staged swap links instead (`link_mode="hardlink"`: the copy would be downtime) and the
  runner breaks the links once the service answers (`staging.unshare`).
- `run --lock FILE` runs `uv pip sync` on the PEP 751 lock: exactly the lock, extraneous
  distributions removed. uv only accepts files named `pylock.toml` / `pylock.<name>.toml`; other
  names are copied (with relative paths made absolute) into a correctly named temporary file.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import httpx
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from rewheel import httpclient, proc
from rewheel.errors import CommandNotFound, InstallError, PreflightError, RecipeError, UsageError
from rewheel.recipe import Recipe

# Accept header of a PEP 691-aware client: JSON preferred, HTML accepted.
_ACCEPT = ("application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
           "text/html;q=0.01")
INDEX_TIMEOUT_S = 10.0
PLAN_TIMEOUT_S = 600.0


# --- uv ---------------------------------------------------------------------------------------

def find_uv() -> str:
    """The uv that ships with rewheel (the `uv` Python package), else `uv` on PATH."""
    try:
        from uv import find_uv_bin

        found = find_uv_bin()
        if found and os.access(found, os.X_OK):
            return str(found)
    except (ImportError, FileNotFoundError):
        pass
    on_path = proc.which("uv")
    if on_path:
        return on_path
    raise CommandNotFound("uv not found: neither the `uv` Python package that rewheel depends on "
                          "nor a `uv` executable on PATH",
                          hint="reinstall rewheel (it installs uv), or put uv on PATH")


# uv's answer by binary (path, inode, mtime): asked once per process, not by each step that
# records or checks it (a staged run asked twice).
_versions: dict[tuple[str, int, int], str] = {}


def uv_version(uv: str | None = None) -> str:
    """uv's version, e.g. "0.13.9"."""
    uv = uv or find_uv()
    try:
        st = os.stat(uv)
        key: tuple[str, int, int] | None = (uv, st.st_ino, st.st_mtime_ns)
    except OSError:
        key = None
    if key is not None and key in _versions:
        return _versions[key]
    version = _ask_uv_version(uv)
    if key is not None:
        _versions[key] = version
    return version


def _ask_uv_version(uv: str) -> str:
    cp = proc.run([uv, "--version"], timeout=30)
    if not cp.ok:
        raise CommandNotFound(f"{uv} --version failed (exit {cp.returncode}): "
                              f"{(cp.stderr or cp.stdout).strip()[:300]}",
                              hint="reinstall rewheel or uv")
    m = re.search(r"uv\s+(\d+\.\d+\.\d+\S*)", cp.stdout)
    return m.group(1) if m else cp.stdout.strip()


# --- credentials ------------------------------------------------------------------------------

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


# --- argv -------------------------------------------------------------------------------------

_PYLOCK_NAME = re.compile(r"^pylock(\.[^.]+)?\.toml$")


def _has_option(args: Sequence[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in args)


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


def install_argv(recipe: Recipe, *, lock: Path | None = None, dry_run: bool = False,
                 installed: Sequence[str] | None = None, keep: Mapping[str, str] | None = None,
                 also_reinstall: Sequence[str] = (), constraints: Path | None = None,
                 reinstall_only: Sequence[str] | None = None, uv: str | None = None,
                 offline: bool = False, sync: bool = True, link_mode: str | None = None) -> list[str]:
    """The uv command line that upgrades `recipe`'s environment (or syncs it to `lock`).

    `installed`: names of the distributions installed in the environment from an index; with
    `reinstall = "all"` they become requirements too, so that the force-reinstall covers every
    installed distribution (SPEC: "all": every installed package), not only the packages'
    dependency tree. Leave out editable and direct-URL installs: uv would replace them with
    index builds. Ignored with a lock.
    `keep` (name -> version, the `keep-old-version` patch policy): never upgraded nor
    reinstalled; `constraints` is the file pinning them (`install`/`plan` write it).
    `also_reinstall`: `--reinstall-package` for these too (distributions whose uv cache entry a
    patch corrupted) — they are rewritten when they are part of the resolution.
    `reinstall_only`: replaces `--reinstall` by `--reinstall-package` for exactly these names
    (how `reinstall = "all"` leaves `keep` alone; `install`/`plan` compute it).
    `offline`: `--offline`, every wheel from uv's cache (a staged swap).
    `link_mode`: uv's `--link-mode` when `uv_args` sets none (default: `copy`, see below).
    `sync=False` with a lock: `uv pip install -r LOCK` instead of `uv pip sync LOCK` —
    exactly the lock's versions, with the recipe's reinstall setting, leaving alone what the
    lock does not name (the editable and direct-URL installs a staged lock leaves out).
    """
    uv = uv or find_uv()
    spec = recipe.install
    user_args = list(spec.uv_args)
    kept = {canonicalize_name(n) for n in (keep or {})}
    common = ["--python", str(recipe.python), "--no-progress", "--color", "never"]
    names = [canonicalize_name(r.name) for r in spec.requirements]
    if lock is not None:
        argv = [uv, "pip", "sync" if sync else "install", *common]
    else:
        argv = [uv, "pip", "install", *common]
        for name in names:
            if name not in kept:
                argv += ["--upgrade-package", name]
    if reinstall_only is not None:
        again = [canonicalize_name(n) for n in reinstall_only]
    elif spec.reinstall == "all":
        again = []
        argv.append("--reinstall")
    else:
        again = list(names)
    again += [canonicalize_name(n) for n in also_reinstall]
    for name in dict.fromkeys(again):
        if name not in kept:
            argv += ["--reinstall-package", name]
    if constraints is not None and lock is None:
        argv += ["--constraints", str(constraints)]
    # Index options also matter for a lock: uv attaches an index's credentials to the wheel URLs
    # under it.
    argv += _index_args(recipe)
    if not _has_option(user_args, "--link-mode"):
        # uv's default on Linux hard-links installed files to its cache. A hand patch written in
        # place then also changes the cached copy, and a later force-reinstall brings the patch
        # back instead of the pristine file. Copies keep environment and cache independent.
        argv += ["--link-mode", link_mode or "copy"]
    if lock is None and spec.prerelease and not _has_option(user_args, "--prerelease"):
        argv += ["--prerelease", "allow"]
    if dry_run:
        argv.append("--dry-run")
    if offline:
        argv.append("--offline")
    argv += user_args
    if lock is not None:
        argv += [str(lock)] if sync else ["-r", str(lock)]
    else:
        argv += list(spec.packages)
        if spec.reinstall == "all" and installed:
            already: set[str] = set(names) | kept
            for dist_name in installed:
                canon = canonicalize_name(dist_name)
                if canon not in already:
                    already.add(canon)
                    argv.append(canon)
    return argv


def _uv_env(lock: Path | None, recipe: Recipe | None = None) -> dict[str, str]:
    env = uv_environment(recipe) if recipe is not None else dict(os.environ)
    if lock is not None:
        # pylock support is a preview feature in uv; opt in so uv does not warn on every run.
        env.setdefault("UV_PREVIEW_FEATURES", "pylock")
    return env


def _absolutise(node: Any, base: Path) -> Any:
    """A lock's data with its PEP 751 `path` keys (wheels, sdist, archive, directory), which are
    relative to the lock's folder `base`, made absolute: the lock can be copied elsewhere."""
    if isinstance(node, dict):
        return {k: (str(base / v) if k == "path" and isinstance(v, str) and not os.path.isabs(v)
                    else _absolutise(v, base)) for k, v in node.items()}
    if isinstance(node, list):
        return [_absolutise(v, base) for v in node]
    return node


@dataclass(frozen=True)
class FrozenLock:
    """`run --lock FILE` as read once, at the plan: the copy the install uses (in a private
    folder, named `pylock.toml`, its relative paths made absolute), the sha256 of the bytes read,
    and the versions it pins — what the install is checked against."""

    source: str
    path: Path
    sha256: str
    versions: dict[str, str]


LOCK_LIMIT = 64 << 20  # a lock larger than this is not one


def freeze_lock(source: Path | str, folder: Path) -> FrozenLock:
    """Read `source` once — what a later replacement of the file cannot change — check it is a
    PEP 751 lock whose every package has a name, a version and a wheel (an sdist would be built
    at install time, its build code run in the window: refused as a resolution's is,
    ResolutionRefused, exit 2), and write the copy the install uses into `folder`. UsageError
    (exit 2) for a file that is not such a lock, naming it."""
    import hashlib

    path = Path(source).expanduser().absolute()
    try:
        with open(path, "rb") as f:
            raw = f.read(LOCK_LIMIT + 1)
    except OSError as exc:
        raise UsageError(f"--lock {path}: cannot be read: {exc.strerror or exc}") from None
    if len(raw) > LOCK_LIMIT:
        raise UsageError(f"--lock {path}: larger than {LOCK_LIMIT >> 20} MiB: not a lock")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise UsageError(f"--lock {path}: not a valid TOML file: {why}") from None
    packages = data.get("packages")
    if not isinstance(data.get("lock-version"), str) or not isinstance(packages, list):
        raise UsageError(f"--lock {path}: not a PEP 751 lock (no lock-version or [[packages]])",
                         hint="write one with `uv pip compile -o pylock.toml` or `rewheel ci --promote`")
    versions: dict[str, str] = {}
    sdists: list[str] = []
    for i, p in enumerate(packages):
        if not (isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("version"), str)):
            raise UsageError(f"--lock {path}: packages[{i}] has no name and version as strings")
        name = canonicalize_name(p["name"])
        versions[name] = p["version"]
        if not p.get("wheels"):
            sdists.append(name)
    if sdists:
        from rewheel.errors import ResolutionRefused

        raise ResolutionRefused(f"--lock {path}: {', '.join(sdists)} has no wheel in the lock: the install would "
                                "build it from an sdist (its build code run while the service is down)",
                                hint="lock versions that ship wheels; nothing was changed")
    import tomli_w

    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    copy = folder / "pylock.toml"
    copy.write_text(tomli_w.dumps(_absolutise(data, path.parent)), encoding="utf-8")
    return FrozenLock(str(path), copy, hashlib.sha256(raw).hexdigest(), versions)


@contextmanager
def usable_lock(lock: Path | str) -> Iterator[Path]:
    """A path uv accepts for `lock`: the file itself when it is named `pylock[.NAME].toml`,
    otherwise a correctly named temporary copy whose relative paths are made absolute."""
    path = Path(lock).expanduser().absolute()
    if not path.is_file():
        raise UsageError(f"lock file {path} does not exist",
                         hint="give a PEP 751 pylock.toml, e.g. one from lockfiles/")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise UsageError(f"lock file {path}: not a valid TOML file: {why}") from None
    if "lock-version" not in data or not isinstance(data.get("packages"), list):
        raise UsageError(f"lock file {path}: not a PEP 751 lock (no lock-version or [[packages]])",
                         hint="write one with `uv pip compile -o pylock.toml` or `rewheel` itself")
    if _PYLOCK_NAME.match(path.name):
        yield path
        return
    import tomli_w

    tmp = Path(tempfile.mkdtemp(prefix="rewheel-lock-"))
    try:
        target = tmp / "pylock.toml"
        target.write_text(tomli_w.dumps(_absolutise(data, path.parent)), encoding="utf-8")
        yield target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- parsing uv's output ----------------------------------------------------------------------

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


# --- plan -------------------------------------------------------------------------------------

@dataclass
class InstallPlan:
    """What uv would do (`uv pip install --dry-run`), parsed."""

    argv: list[str]  # redacted
    changes: list[PlannedChange]
    resolved: int | None = None
    lock: str | None = None
    output: list[str] = field(default_factory=list)  # redacted
    # Recipe packages the index offers newer than resolved, and uv's reason
    # (resolution.HeldBack.to_json()); only a resolution fills it.
    held_back: list[dict[str, Any]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.changes

    def to_json(self) -> dict[str, Any]:
        return {"argv": self.argv, "lock": self.lock, "resolved": self.resolved,
                "changes": [c.to_json() for c in self.changes], "held_back": self.held_back}


@contextmanager
def _prepared(recipe: Recipe, lock: Path | None, installed: Sequence[str] | None,
              keep: Mapping[str, str] | None, also_reinstall: Sequence[str], dry_run: bool,
              timeout: float | None, offline: bool = False, sync: bool = True,
              link_mode: str | None = None) -> Iterator[tuple[list[str], Path | None]]:
    """The final argv (and the usable lock path) for a plan or an install.

    With `keep` under `reinstall = "all"`, uv has no way to exclude a package from `--reinstall`,
    so a first dry run lists what `--reinstall` would rewrite, and the real command names those
    packages one by one, less the kept ones."""
    kept = {canonicalize_name(n): v for n, v in (keep or {}).items()}
    with ExitStack() as stack:
        lock_path = stack.enter_context(usable_lock(lock)) if lock is not None else None
        constraints = None
        if kept:
            # Made only when it holds something: a rewheel killed mid-uv leaves its temporary
            # folder behind, and most runs keep nothing.
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="rewheel-uv-"))
            constraints = Path(tmp) / "keep-constraints.txt"
            constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(kept.items())))
        kwargs: dict[str, Any] = dict(lock=lock_path, installed=installed, keep=kept,
                                      also_reinstall=also_reinstall, constraints=constraints,
                                      offline=offline, sync=sync, link_mode=link_mode)
        reinstall_only = None
        if kept and recipe.install.reinstall == "all":
            probe = install_argv(recipe, dry_run=True, **kwargs)
            cp = proc.stream(probe, timeout=timeout, env=_uv_env(lock_path, recipe), redact=redact)
            raise_for_plan(recipe, cp, probe, timeout)
            reinstall_only = [c.name for c in parse_changes(cp.stdout.splitlines())
                              if c.name not in kept]
        yield install_argv(recipe, dry_run=dry_run, reinstall_only=reinstall_only,
                           **kwargs), lock_path


def raise_for_plan(recipe: Recipe, cp: proc.Completed, argv: Sequence[str], timeout: float | None, *,
                   what: str = "the install", hint: Callable[[Sequence[str]], str | None] | None = None) -> None:
    """PreflightError for a dry run uv could not finish or plan (`what` it was planning;
    `hint`: the hint for uv's output lines, default `_hint_for`)."""
    shown = redact_argv(argv)
    lines = cp.stdout.splitlines()
    if cp.timed_out:
        raise PreflightError(f"uv did not finish planning {what} within {timeout:.0f}s: "
                             f"{' '.join(shown)}", hint="check that the indexes answer quickly")
    if cp.returncode != 0:
        detail = "\n".join("  " + l for l in error_lines(lines))
        raise PreflightError(f"uv cannot plan {what} for {recipe.source} "
                             f"(exit {cp.returncode}):\n{detail}\n  command: {' '.join(shown)}",
                             hint=(hint or _hint_for)(lines))


def plan(recipe: Recipe, *, lock: Path | None = None, installed: Sequence[str] | None = None,
         keep: Mapping[str, str] | None = None, also_reinstall: Sequence[str] = (),
         client: httpx.Client | None = None, on_line: Callable[[str], None] | None = None,
         timeout: float = PLAN_TIMEOUT_S) -> InstallPlan:
    """Ask uv what it would install (`--dry-run`). Nothing is changed.

    A plan uv cannot make (an unknown package, an index uv cannot use, no version that
    satisfies the specifiers) raises PreflightError with uv's error lines: at preflight nothing
    has been touched yet. `client` is unused (uv does its own HTTP); it is accepted so callers
    can hand the same client to every preflight function.
    """
    del client
    validate_urls(recipe)
    with _prepared(recipe, lock, installed, keep, also_reinstall, True, timeout) as (argv, path):
        cp = proc.stream(argv, on_line=on_line, timeout=timeout, env=_uv_env(path, recipe),
                         redact=redact)
    raise_for_plan(recipe, cp, argv, timeout)
    lines = cp.stdout.splitlines()
    shown = redact_argv(argv)
    return InstallPlan(argv=shown, changes=parse_changes(lines),
                       resolved=_count(lines, r"^Resolved (\d+) packages?"),
                       lock=str(lock) if lock is not None else None, output=lines)


def _hint_for(lines: Sequence[str]) -> str | None:
    text = "\n".join(lines)
    if "not found in the package registry" in text or "not found in the provided package" in text:
        return ("check the package names in [install] packages and that the indexes offer them "
                "(prerelease = true for dev/rc builds)")
    if "401" in text or "403" in text or "authentication" in text.lower():
        return "check the credentials in the index URL"
    if "prerelease" in text.lower() or "pre-release" in text.lower():
        return "set prerelease = true in [install] to allow dev/rc builds"
    return None


# --- install ----------------------------------------------------------------------------------

@dataclass
class InstallResult:
    """A finished `uv pip install`/`sync`: what it changed, how long it took, where its log is."""

    ok: bool
    returncode: int
    seconds: float
    argv: list[str]  # redacted
    changes: list[PlannedChange]
    log_path: str | None = None
    tail: list[str] = field(default_factory=list)  # redacted
    # What uv downloaded ("numpy (16.1MiB)"): nothing, for an install from a warm cache.
    fetched: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "returncode": self.returncode, "seconds": round(self.seconds, 3),
                "argv": self.argv, "log_path": self.log_path,
                "changes": [c.to_json() for c in self.changes], "fetched": self.fetched}


def install(recipe: Recipe, *, lock: Path | None = None, installed: Sequence[str] | None = None,
            keep: Mapping[str, str] | None = None, also_reinstall: Sequence[str] = (),
            on_line: Callable[[str], None] | None = None, log_path: Path | None = None,
            timeout: float | None = None, offline: bool = False, sync: bool = True,
            link_mode: str | None = None) -> InstallResult:
    """Run the upgrade (or the sync to `lock`), streaming uv's redacted output to `on_line` and
    `log_path`. Raises InstallError with uv's error lines when uv fails or times out.
    `installed`, `keep`, `also_reinstall`, `offline`, `sync`, `link_mode`: see `install_argv`."""
    with ExitStack() as stack:
        try:
            argv, lock_path = stack.enter_context(_prepared(
                recipe, lock, installed, keep, also_reinstall, False, timeout or PLAN_TIMEOUT_S,
                offline, sync, link_mode))
        except PreflightError as exc:
            # The first dry run (keep under reinstall = "all") failed: at this point of a run it
            # is the install step that failed.
            raise InstallError(exc.message, hint=exc.hint) from None
        shown = redact_argv(argv)
        if log_path is not None:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(f"[rewheel] $ {' '.join(shown)}\n")
        cp = None
        if lock is not None and not offline and "--offline" not in argv:
            # uv fetches a lock's wheels again by URL when online, though its cache has them
            # (10 GB for a vLLM environment, in the downtime of an unstaged run): first from
            # the cache alone; uv prepares every wheel before it touches the environment, so an
            # attempt that misses one changed nothing, and the online run below takes over.
            first = [*argv[:3], "--offline", *argv[3:]]
            cp = proc.stream(first, on_line=None, timeout=timeout, env=_uv_env(lock_path, recipe),
                             log_path=log_path, redact=redact)
            if cp.returncode != 0 and not cp.timed_out and _offline_miss(cp.stdout):
                cp = None
            elif on_line is not None:
                for line in cp.stdout.splitlines():
                    on_line(redact(line))
        if cp is None:
            cp = proc.stream(argv, on_line=on_line, timeout=timeout, env=_uv_env(lock_path, recipe),
                             log_path=log_path, redact=redact)
    lines = cp.stdout.splitlines()
    tail = [redact(l) for l in lines[-50:]]
    where = f" (full output: {log_path})" if log_path else ""
    if cp.timed_out:
        raise InstallError(f"uv did not finish within {timeout}s and was stopped{where}: "
                           f"{' '.join(shown)}")
    if cp.returncode != 0:
        detail = "\n".join("  " + l for l in error_lines(lines))
        raise InstallError(f"uv failed (exit {cp.returncode}) installing into {recipe.python}"
                           f"{where}:\n{detail}", hint=_hint_for(lines))
    return InstallResult(ok=True, returncode=cp.returncode, seconds=cp.seconds, argv=shown,
                         changes=parse_changes(lines),
                         log_path=str(log_path) if log_path else None, tail=tail,
                         fetched=fetched_lines(lines))


def _offline_miss(output: str) -> bool:
    """uv's `--offline` failing because a wheel or an index page is not in its cache."""
    return bool(re.search(r"offline|network connectivity is disabled|not found in the cache|cache miss",
                          output, re.I))


# --- preflight --------------------------------------------------------------------------------

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


# --- the plan as a person reads it ------------------------------------------------------------

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
