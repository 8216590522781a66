"""The upgrade's one resolution: what `rewheel run` installs, decided once, before anything is
stopped or built, and shown as the plan (`--dry-run`, the prompt, the report) — the same object
the staged build and the unstaged install then install, never a second resolution that could
disagree ([run-cycle.md](../../docs/run-cycle.md), "The plan is the lock").

`resolve` makes it in three steps:
1. **uv's own answer against the live environment**: `uv pip install --dry-run
   --upgrade-package P … P …` with the recipe's indexes, for the live interpreter. That is what
   `uv pip install -U P` picks: the recipe's packages at their newest, their dependencies moved
   where they must, every other installed distribution kept (uv prefers installed versions).
   The recipe's packages are never built from an sdist (`--only-binary`): a newest release
   that ships only an sdist is held back, not compiled.
2. **the whole environment, locked**: the live distributions with those changes applied, each
   pinned exactly and written by `uv pip compile --no-deps` as a PEP 751 `pylock.toml` (wheel
   URLs and sha256 hashes). Editable and direct-URL installs stay out of the lock (no index gives
   them back); the swap's `uv pip install -r LOCK` leaves them alone.
3. **guards**, still before anything is built: a recipe package the resolution would downgrade,
   or could only build from an sdist, is refused (`ResolutionRefused`, exit 2) with uv's own
   explanation; a newer release the index offers but the resolution did not take is reported
   (`HeldBack`), with uv's explanation of why, from a second dry run that asks for it.

`reinstall = "all"` changes nothing here: it reinstalls every locked distribution at these
versions and upgrades nothing more.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from rewheel import proc
from rewheel.errors import PreflightError, ResolutionRefused
from rewheel.installer import (PLAN_TIMEOUT_S, InstallPlan, PlannedChange, _hint_for, error_lines, install_argv,
                               parse_changes, raise_for_plan, redact, redact_argv, uv_environment, validate_urls)

if TYPE_CHECKING:
    from rewheel.environment import Environment
    from rewheel.recipe import Recipe

Say = Callable[[str], None]
LOCK_NAME = "pylock.toml"
# What makes a failed ask for `P>V` a reason, not just "only P<=V is available": a dependency,
# the Python version, wheels (only an sdist), pre-releases, yanked files.
_REASON = re.compile(r"depends on|requires|Python|wheel|source distribution|pre-?release|yanked|build", re.I)


@dataclass(frozen=True)
class HeldBack:
    """A recipe package whose index offers a newer release than the one resolved: which, and
    uv's explanation of why the resolution kept the older one."""

    name: str
    resolved: str | None
    newest: str | None
    why: tuple[str, ...]

    def summary(self) -> str:
        newer = f"{self.newest}" if self.newest else "a newer release"
        because = self.why[0] if self.why else "uv gave no reason"
        return f"{self.name} stays at {self.resolved}; the index offers {newer}, but uv says: {because}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "resolved": self.resolved, "newest": self.newest, "why": list(self.why)}


@dataclass
class Resolution:
    """The upgrade as decided: the lock the install uses, the plan shown for it, the versions
    before and after (the whole environment), and what the guards found."""

    lock: Path
    plan: InstallPlan
    before: dict[str, str]
    after: dict[str, str]
    # The lock's own versions (what the install pins); `after` adds what it leaves alone.
    locked: dict[str, str]
    left_out: list[str] = field(default_factory=list)
    held_back: list[HeldBack] = field(default_factory=list)
    # Distributions of the lock that have no wheel (built from an sdist at install time).
    sdists: list[str] = field(default_factory=list)

    @property
    def version_changes(self) -> list[PlannedChange]:
        return [c for c in self.plan.changes if c.old != c.new]

    def moved(self, dest: Path) -> None:
        """The lock now lives at `dest` (copied with its run)."""
        self.lock = dest
        self.plan.lock = str(dest)


# --- uv, asked ---------------------------------------------------------------------------------

def _dry_run(recipe: Recipe, python: Path, packages: Sequence[str], log: Path | None,
             on_line: Say | None) -> tuple[proc.Completed, list[str]]:
    """`uv pip install --dry-run` of `packages` against the environment of `python`, the
    recipe's packages upgraded (`--upgrade-package`), never built from an sdist; no reinstall
    flags (they do not change what is picked). Returns uv's process and the redacted argv."""
    spec = recipe.install
    aimed = replace(recipe, python=python, install=replace(spec, packages=tuple(packages)))
    argv = install_argv(aimed, dry_run=True, reinstall_only=[])
    # The upgraded packages' newest release is taken only as a wheel: an sdist (vllm 0.1.2, say,
    # where the resolver backtracked) would be compiled for minutes, CUDA and all.
    no_build: list[str] = []
    for name in spec.names:
        no_build += ["--only-binary", name]
    argv[3:3] = no_build
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"[rewheel] $ {' '.join(redact_argv(argv))}\n")
    cp = proc.stream(argv, on_line=on_line, timeout=PLAN_TIMEOUT_S, env=uv_environment(recipe),
                     log_path=log, redact=redact)
    return cp, redact_argv(argv)


def _refuse_unplannable(recipe: Recipe, cp: proc.Completed, argv: list[str]) -> None:
    def hint(lines: Sequence[str]) -> str | None:
        if re.search(r"no (?:usable )?wheels?|building from source|source distribution", "\n".join(lines), re.I):
            return ("rewheel never builds the packages it upgrades from an sdist (a backtracking resolver "
                    "would compile an ancient release); pin a version that ships wheels, e.g. "
                    f'packages = ["{recipe.install.names[0] if recipe.install.names else "PKG"}==X.Y"]')
        return _hint_for(lines)

    raise_for_plan(recipe, cp, argv, PLAN_TIMEOUT_S, what="the upgrade", hint=hint)


def _explanation(lines: Sequence[str]) -> tuple[str, ...]:
    """uv's reasoning from a failed resolution as sentences (`Because … cannot be used.`),
    without `error:`/`cause:` prefixes, hints and the "No solution found" header."""
    words: list[str] = []
    for line in error_lines(lines, 40):
        text = line.strip()
        if not text or text.startswith(("hint:", "help:", "warning:", "Using Python")):
            continue
        text = re.sub(r"^(?:error:|×|╰─▶|cause:)\s*", "", text)
        text = re.sub(r"^(?:cause:|╰─▶)\s*", "", text)
        if not text or text.rstrip(":").lower() == "no solution found when resolving dependencies":
            continue
        words.append(text)
    joined = " ".join(words)
    sentences = [s.strip() for s in re.split(r"(?<=[.])\s+(?=[A-Z])", joined) if s.strip()]
    return tuple(sentences[:4])


def _named_version(name: str, lines: Sequence[str], above: Version | None) -> str | None:
    """The highest version of `name` that uv's explanation names, above `above`."""
    rx = re.compile(rf"\b{re.escape(name)}(?:\[[^\]]*\])?\s*(?:==|>=)\s*([0-9][^\s,;)]*)", re.I)
    best: Version | None = None
    for line in lines:
        for m in rx.finditer(line.replace("_", "-")):
            try:
                v = Version(m.group(1).rstrip("."))
            except InvalidVersion:
                continue
            if (above is None or v > above) and (best is None or v > best):
                best = v
    return str(best) if best is not None else None


def _with(packages: Sequence[str], name: str, extra: str) -> list[str]:
    """The recipe's packages with `extra` (e.g. `>0.33.0`) added to `name`'s specifier."""
    out = []
    for p in packages:
        try:
            req = Requirement(p)
        except InvalidRequirement:
            out.append(p)
            continue
        if canonicalize_name(req.name) == name:
            spec = ",".join(s for s in (str(req.specifier), extra) if s)
            extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
            marker = f"; {req.marker}" if req.marker else ""
            out.append(f"{req.name}{extras}{spec}{marker}")
        else:
            out.append(p)
    return out


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


# --- the lock ----------------------------------------------------------------------------------

def _read_lock(path: Path) -> tuple[dict[str, str], list[str]]:
    """(name -> version, names without a wheel) of a PEP 751 lock uv wrote."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    versions: dict[str, str] = {}
    sdists: list[str] = []
    for p in data.get("packages", []):
        if not isinstance(p, dict) or not p.get("name"):
            continue
        name = canonicalize_name(p["name"])
        versions[name] = str(p.get("version", ""))
        if not p.get("wheels") and (p.get("sdist") or p.get("archive") or p.get("directory")):
            sdists.append(name)
    return versions, sdists


def _lock_exactly(recipe: Recipe, python: Path, pins: dict[str, str], folder: Path, log: Path,
                  on_line: Say | None) -> Path:
    """`uv pip compile --no-deps` of exactly `pins` into `folder/pylock.toml`."""
    from rewheel import nightly

    req = folder / "resolved.txt"
    req.write_text("".join((f"{n} @ {v}\n" if "://" in v else f"{n}=={v}\n") for n, v in sorted(pins.items())),
                   encoding="utf-8")
    out = folder / LOCK_NAME
    out.unlink(missing_ok=True)
    aimed = replace(recipe, python=python)
    argv = nightly.compile_argv(aimed, req, out, upgrade_packages=[], no_deps=True)
    cp = nightly.run_compile(aimed, argv, log, on_line)
    if cp.timed_out or cp.returncode != 0 or not out.is_file():
        detail = "\n".join("  " + line for line in error_lines(cp.stdout.splitlines()))
        raise PreflightError(f"uv could not lock the resolved set of {len(pins)} distribution(s) "
                             f"(exit {cp.returncode}; log: {log}):\n{detail}",
                             hint="an installed version may no longer be on the recipe's indexes")
    return out


# --- the resolution ----------------------------------------------------------------------------

def resolve(recipe: Recipe, env: Environment, *, folder: Path, on_line: Say | None = None,
            say: Say | None = None, guards: bool = True) -> Resolution:
    """Resolve `recipe`'s upgrade of `env` (see the module's docstring) into `folder`
    (`pylock.toml`, `resolved.txt`, `resolve.log`). Nothing in the environment is touched.
    Raises PreflightError when uv cannot plan or lock it, ResolutionRefused when a guard
    refuses it. `guards=False` (`rewheel ci` and bisect, which pin builds older than the
    installed one on purpose): no downgrade guard and no search for newer releases."""
    say = say or (lambda _: None)
    validate_urls(recipe)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "resolve.log"
    spec = recipe.install
    cp, argv = _dry_run(recipe, env.python, spec.packages, log, on_line)
    _refuse_unplannable(recipe, cp, argv)
    lines = [redact(line) for line in cp.stdout.splitlines()]
    changes = parse_changes(lines)

    before = env.versions()
    pins: dict[str, str] = {}
    left_out: list[str] = []
    for d in env.distributions():
        doc = d.to_json()
        if doc["editable"] or doc["url"]:
            left_out.append(d.name)
            continue
        pins[canonicalize_name(d.name)] = d.version_text
    after = dict(before)
    for c in changes:
        name = canonicalize_name(c.name)
        if c.new is None:
            pins.pop(name, None)
            after.pop(name, None)
        else:
            pins[name] = c.new
            after[name] = c.new
            if name in left_out:
                left_out.remove(name)
    say(f"   resolved: {len([c for c in changes if c.old != c.new])} change(s); locking "
        f"{len(pins)} distribution(s)")
    lock = _lock_exactly(recipe, env.python, pins, folder, log, on_line)
    locked, sdists = _read_lock(lock)
    missing = sorted(set(pins) - set(locked))
    if missing:
        raise PreflightError(f"uv's lock {lock} leaves out {', '.join(missing)}, which the resolution keeps",
                             hint=f"see {log}")
    held: list[HeldBack] = []
    if guards:
        _guard(recipe, env, before, after, sdists, log)
        held = held_back(recipe, env, after, log)

    version_changes = [PlannedChange(c.name, c.old, c.new) for c in changes if c.old != c.new]
    changed = {c.name for c in version_changes}
    again = sorted(locked) if spec.reinstall == "all" else [n for n in spec.names if n in locked]
    reinstalls = [PlannedChange(n, after[n], after[n]) for n in again if n not in changed and n in after]
    plan_changes = sorted(version_changes + reinstalls, key=lambda c: c.name)
    plan = InstallPlan(argv=argv, changes=plan_changes, resolved=len(locked), lock=str(lock), output=lines,
                       held_back=[h.to_json() for h in held])
    return Resolution(lock=lock, plan=plan, before=before, after=after, locked=locked, left_out=left_out,
                      held_back=held, sdists=sdists)


def _guard(recipe: Recipe, env: Environment, before: dict[str, str], after: dict[str, str],
           sdists: list[str], log: Path) -> None:
    """Refuse a resolution that downgrades a recipe package or builds one from an sdist."""
    for name in recipe.install.names:
        old, new = before.get(name), after.get(name)
        vo, vn = _version(old), _version(new)
        if vo is not None and vn is not None and vn < vo:
            cp, _ = _dry_run(recipe, env.python, _with(recipe.install.packages, name, f">={vo.public}"), log, None)
            why = _explanation(cp.stdout.splitlines()) if cp.returncode != 0 else ()
            because = (" uv says: " + " ".join(why)) if why else ""
            raise ResolutionRefused(
                f"the resolution would downgrade {name} {old} → {new}, a package {recipe.source} asks to "
                f"upgrade.{because}",
                hint=f"pin what forces it, or pin {name} (e.g. \"{name}=={old}\"); nothing was changed")
        if name in sdists:
            raise ResolutionRefused(
                f"{name} {new} has no wheel for this environment: the install would build it from an sdist",
                hint=f'pin a version of {name} that ships wheels; nothing was changed')


def held_back(recipe: Recipe, env: Environment, after: dict[str, str], log: Path | None) -> list[HeldBack]:
    """For each recipe package, whether the indexes offer a release newer than `after`'s: a dry
    run asking for `P>V`; its failure is uv's explanation (a newer Python needed, a neighbour's
    pin, only an sdist), its success a newer version uv could have taken."""
    out: list[HeldBack] = []
    for name in recipe.install.names:
        new = after.get(name)
        vn = _version(new)
        if vn is None:
            continue
        # `>V` on the public version: a local label (`+g5719a4e4e`, every vLLM nightly) is not
        # allowed in an ordered comparison, and `>V` already excludes V's local builds.
        cp, _ = _dry_run(recipe, env.python, _with(recipe.install.packages, name, f">{vn.public}"), log, None)
        lines = [redact(line) for line in cp.stdout.splitlines()]
        if cp.timed_out:
            continue
        if cp.returncode == 0:
            newer = next((c.new for c in parse_changes(lines) if c.name == name and c.new), None)
            if newer and newer != new:
                out.append(HeldBack(name, new, newer, (
                    f"uv resolves {name} {newer} when asked for it; the upgrade kept {new} to keep the "
                    "installed versions of its neighbours",)))
            continue
        why = _explanation(lines)
        if not _REASON.search(" ".join(why)):
            continue  # "only P<=V is available": nothing newer is offered
        out.append(HeldBack(name, new, _named_version(name, lines, vn), why))
    return out


def installed_as_planned(planned: dict[str, str], versions: dict[str, str]) -> list[str]:
    """Where the environment (`versions`, after the install) differs from the `planned`
    versions (a lock's), as `name: planned X, installed Y` (empty: the plan is what happened)."""
    wrong = []
    for name, want in sorted(planned.items()):
        have = versions.get(name)
        if have != want and not (_version(have) is not None and _version(have) == _version(want)):
            wrong.append(f"{name}: planned {want}, installed {have or 'nothing'}")
    return wrong
