"""Reinstalling an environment with uv: the argv, the plan (what uv would do), the streamed
install, the preflight checks (uv, index reachability) — and keeping
credentials that live inside index URLs out of every log, report and terminal line.

This module holds uv itself (`find_uv`, `uv_version`), the argv, the locks, the plan and the
install — what a test points at another uv by replacing `installer.find_uv`; the package's
other modules hold the indexes (`indexes`: credentials, index options, reachability checks)
and what uv's output says (`changes`: planned changes, fetched and error lines, the plan
annotated for a person); their names are re-exported here.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from packaging.utils import canonicalize_name

from rewheel import proc
from rewheel.errors import CommandNotFound, InstallError, PreflightError, UsageError
from rewheel.installer.changes import (PlannedChange, _count, annotate_plan, error_lines, fetched_lines,
                                      parse_changes)
from rewheel.installer.indexes import (INDEX_TIMEOUT_S, IndexCheck, _index_args, check_indexes, index_options, redact,
                                      redact_argv, split_credentials, uv_environment, validate_urls)
from rewheel.recipe import Recipe

__all__ = [
    "FrozenLock",
    "INDEX_TIMEOUT_S",
    "IndexCheck",
    "InstallPlan",
    "InstallResult",
    "LOCK_LIMIT",
    "PLAN_TIMEOUT_S",
    "PlannedChange",
    "annotate_plan",
    "check_indexes",
    "error_lines",
    "fetched_lines",
    "find_uv",
    "freeze_lock",
    "index_options",
    "install",
    "install_argv",
    "parse_changes",
    "plan",
    "raise_for_plan",
    "redact",
    "redact_argv",
    "split_credentials",
    "usable_lock",
    "uv_environment",
    "uv_version",
    "validate_urls",
]


PLAN_TIMEOUT_S = 600.0


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


_PYLOCK_NAME = re.compile(r"^pylock(\.[^.]+)?\.toml$")


def _has_option(args: Sequence[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in args)


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
                         hint="write one with `uv pip compile -o pylock.toml`, or let rewheel's ci command promote a qualified nightly "
                              "(its --promote writes one)")
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
