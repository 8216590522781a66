"""`rewheel ci`: qualify tonight's nightly in a throwaway environment, report it for a CI job
(JUnit XML, a Markdown summary, JSON) and, once proven, promote it as a PEP 751 lock.

The steps, each one JUnit test case:
  environment  `uv venv` with the recipe's interpreter (same Python version), under
               `$REWHEEL_HOME/ci/<recipe>/<run-id>/`, removed at the end
  resolve      `uv pip compile --format pylock.toml --upgrade`: the newest nightly per the
               recipe's packages, indexes, prerelease and uv_args, with wheel URLs and sha256
               hashes — the exact set, written before anything is installed
  install      `uv pip sync` of that lock into the throwaway environment, then a check that the
               environment holds exactly the locked versions
  diff         versions against the last qualified lock `lockfiles/pylock.<recipe>.toml`
               (before the smoke test, so a failing nightly's report says what changed)
  smoke        the recipe's smoke command with `{python}` = the throwaway interpreter
  promote      (`--promote`, only when everything passed) the lock, copied atomically to
               `lockfiles/pylock.<recipe>.toml` so `rewheel run RECIPE --lock` installs exactly it

Every qualification's verdict is kept in its run folder as `verdict.json` (what `--json`
prints, and when it started), so that `rewheel board` shows the nightlies over time
(`verdicts` reads them back). No service and no live environment is touched. Exit codes: 0 qualified; 1 the nightly failed
(resolve, install or smoke); 2 usage or setup problems (recipe, interpreter, no smoke test).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from packaging.utils import canonicalize_name

from rewheel import nightly
from rewheel.errors import EXIT_OK, EXIT_REVERTED, InstallError, PreflightError, RewheelError, UsageError
from rewheel.installer import error_lines, install
from rewheel.journal import new_run_id
from rewheel.owned import private_dir
from rewheel.paths import atomic_write, pseudo_fs_of, state_home
from rewheel.recipe import Recipe

if TYPE_CHECKING:
    from rewheel.diagnose import RootCause
    from rewheel.diff import PackageChange

Say = Callable[[str], None]
STEPS = ("environment", "resolve", "install", "diff", "smoke", "promote")


def _quiet(_: str) -> None:
    pass


@dataclass
class CiStep:
    name: str
    status: str  # "passed" | "failed" | "skipped"
    seconds: float = 0.0
    message: str = ""
    output: list[str] = field(default_factory=list)  # tail of the step's output, redacted

    @property
    def ok(self) -> bool:
        return self.status == "passed"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "status": self.status,
                "seconds": round(self.seconds, 3), "message": self.message}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> CiStep:
        return cls(str(doc.get("name") or "?"), str(doc.get("status") or "skipped"),
                   _number(doc.get("seconds")), str(doc.get("message") or ""))


@dataclass
class CiFailure:
    """The step that failed the nightly, and why."""

    step: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CiReport:
    status: str  # "qualified" | "failed"
    recipe: str
    recipe_name: str
    package: str
    python_version: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    lock: str | None = None            # the resolved lock kept in the run folder
    baseline: str | None = None        # the last qualified lock compared against
    changes: list[PackageChange] = field(default_factory=list)
    root_cause: RootCause | None = None
    failure: CiFailure | None = None
    promoted: str | None = None
    steps: list[CiStep] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)
    run_dir: str | None = None
    started: float = field(default_factory=time.time)
    junit: str | None = None
    summary: str | None = None
    # What the throwaway environment starts from: the target environment's pinned set
    # ({"from", "pinned", "pins", "left_out"}), or why only the recipe's packages
    # ({"from": null, "reason"}).
    base: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.status == "qualified" else EXIT_REVERTED

    @property
    def version(self) -> str | None:
        return self.versions.get(self.package)

    def step(self, name: str) -> CiStep | None:
        return next((s for s in self.steps if s.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "recipe": self.recipe, "package": self.package,
                "version": self.version, "python_version": self.python_version,
                "versions": self.versions, "lock": self.lock, "baseline": self.baseline,
                "changes": [c.to_json() for c in self.changes],
                "root_cause": self.root_cause.to_json() if self.root_cause else None,
                "failure": self.failure.to_json() if self.failure else None,
                "promoted": self.promoted, "steps": [s.to_json() for s in self.steps],
                "logs": self.logs, "run_dir": self.run_dir, "junit": self.junit,
                "summary": self.summary, "base": self.base, "exit_code": self.exit_code}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> CiReport:
        """A kept verdict (`to_json`, with `recipe_name` and `started`: see `save_verdict`) read
        back; a field of the wrong type keeps its default. (The steps' output tails are not kept.)"""
        from rewheel.diagnose import RootCause
        from rewheel.diff import PackageChange

        def dicts(key: str) -> list[dict[str, Any]]:
            return [d for d in doc.get(key) or [] if isinstance(d, dict)] if isinstance(doc.get(key), list) else []

        def text(key: str) -> str | None:
            return str(doc[key]) if isinstance(doc.get(key), str) else None

        rc, failure = doc.get("root_cause"), doc.get("failure")
        versions: dict[str, Any] = doc["versions"] if isinstance(doc.get("versions"), dict) else {}
        logs: dict[str, Any] = doc["logs"] if isinstance(doc.get("logs"), dict) else {}
        return cls(status=str(doc.get("status") or "failed"), recipe=text("recipe") or "",
                   recipe_name=text("recipe_name") or "", package=text("package") or "",
                   python_version=text("python_version"),
                   versions={str(k): str(v) for k, v in versions.items()},
                   lock=text("lock"), baseline=text("baseline"),
                   changes=[PackageChange(str(c.get("name")), c.get("old"), c.get("new"), str(c.get("change")),
                                          dev_distance=c.get("dev_distance"), old_sha=c.get("old_sha"),
                                          new_sha=c.get("new_sha"), compare_url=c.get("compare_url"))
                            for c in dicts("changes")],
                   root_cause=RootCause.from_json(rc) if isinstance(rc, dict) else None,
                   failure=CiFailure(str(failure.get("step")), str(failure.get("message") or ""))
                   if isinstance(failure, dict) else None,
                   promoted=text("promoted"), steps=[CiStep.from_json(st) for st in dicts("steps")],
                   logs={str(k): str(v) for k, v in logs.items()},
                   run_dir=text("run_dir"), started=_number(doc.get("started")), junit=text("junit"),
                   summary=text("summary"), base=doc.get("base") if isinstance(doc.get("base"), dict) else None)


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


VERDICT = "verdict.json"  # in a qualification's run folder


def save_verdict(rep: CiReport) -> None:
    """Keep the verdict in its run folder (the state, not the CI job's files): written once
    the qualification has ended, atomically, so a board never reads half of one."""
    if rep.run_dir:
        doc = {**rep.to_json(), "recipe_name": rep.recipe_name, "started": rep.started}
        atomic_write(Path(rep.run_dir) / VERDICT, json.dumps(doc, indent=1, default=str))


def verdicts(home: Path | None = None) -> list[CiReport]:
    """Every kept verdict under the state home (`<home>/ci/<recipe>/<run>/verdict.json`),
    oldest first; one that cannot be read is left out (a board shows what it can)."""
    from rewheel.snapshot.store import read_regular

    root = (home or state_home()) / "ci"
    out: list[CiReport] = []
    for path in sorted(root.glob(f"*/*/{VERDICT}")):
        try:
            doc = json.loads(read_regular(path))
        except (OSError, ValueError, UnicodeDecodeError, RecursionError):
            continue
        if isinstance(doc, dict):
            out.append(CiReport.from_json(doc))
    return sorted(out, key=lambda r: r.started)


class CiSteps(Protocol):
    """What `qualify` acts through, one method per step (`UvCiSteps` is the real one: uv, the
    smoke command, nvidia-smi). A step returns its one-line message, raises `StepFailed` for
    the nightly's failure, and `RewheelError` for a setup problem (exit 2)."""

    def require_gpus(self, count: int) -> None: ...
    def export_target(self, recipe: Recipe, run_dir: Path, rep: CiReport) -> Path | None: ...
    def environment(self, recipe: Recipe, env_root: Path, interpreter: str | None, rep: CiReport) -> str: ...
    def resolve(self, scoped: Recipe, lock: Path, run_dir: Path, rep: CiReport, on_output: Say,
                target: Path | None) -> str: ...
    def install(self, scoped: Recipe, lock: Path, run_dir: Path, rep: CiReport, on_output: Say) -> str: ...
    def diff(self, scoped: Recipe, baseline: Path, rep: CiReport) -> str: ...
    def smoke(self, scoped: Recipe, name: str, run_dir: Path, rep: CiReport, on_output: Say,
              target_python: str | Path | None) -> str: ...


class UvCiSteps:
    """The real steps: a uv virtualenv, uv's resolution and sync, the recipe's smoke command."""

    def require_gpus(self, count: int) -> None:
        from rewheel import gpu

        gpu.require_gpus(count)

    def export_target(self, recipe: Recipe, run_dir: Path, rep: CiReport) -> Path | None:
        return export_target(recipe, run_dir, rep)

    def environment(self, recipe: Recipe, env_root: Path, interpreter: str | None, rep: CiReport) -> str:
        return _environment(recipe, env_root, interpreter, rep)

    def resolve(self, scoped: Recipe, lock: Path, run_dir: Path, rep: CiReport, on_output: Say,
                target: Path | None) -> str:
        return _resolve(scoped, lock, run_dir, rep, on_output, target)

    def install(self, scoped: Recipe, lock: Path, run_dir: Path, rep: CiReport, on_output: Say) -> str:
        return _install(scoped, lock, run_dir, rep, on_output)

    def diff(self, scoped: Recipe, baseline: Path, rep: CiReport) -> str:
        return _diff(scoped, baseline, rep)

    def smoke(self, scoped: Recipe, name: str, run_dir: Path, rep: CiReport, on_output: Say,
              target_python: str | Path | None) -> str:
        return _smoke(scoped, name, run_dir, rep, on_output, target_python)


class StepFailed(Exception):
    def __init__(self, message: str, output: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.output = output or []


def qualify(recipe: Recipe, *, lockfiles: Path = Path("lockfiles"), promote: bool = False,
            interpreter: str | None = None, package: str | None = None, say: Say = _quiet,
            on_output: Say = _quiet, work_dir: Path | None = None, from_target: bool = True,
            steps: CiSteps | None = None) -> CiReport:
    """Install the newest nightly per `recipe` into a throwaway environment, smoke-test it, diff
    it against the last qualified lock in `lockfiles`, and promote it there when asked and
    everything passed. A failing nightly is a result (status "failed"), not an exception;
    usage and setup problems raise RewheelError (exit 2).

    `from_target`: when the recipe's environment exists here, the throwaway environment
    starts from its pinned set (every distribution at the version it has, exported as
    `target-pins.txt`) and the recipe's upgrade is applied on top: the smoke test sees the
    neighbours the host has, not only `[install] packages`. `steps`: what each step acts
    through (default `UvCiSteps`)."""
    do = steps or UvCiSteps()
    if recipe.smoke is None:
        raise UsageError(f"{recipe.source}: no [smoke] section; rewheel ci qualifies a nightly by "
                         "its smoke test", hint="add [smoke] command = [...] to the recipe")
    if recipe.smoke.gpus > 0:
        do.require_gpus(recipe.smoke.gpus)
    if promote:
        _check_lockfiles(lockfiles)
    name = nightly.package_name(recipe, package)
    rep = CiReport(status="failed", recipe=recipe.source, recipe_name=recipe.name, package=name)
    run_dir = private_dir(work_dir or state_home() / "ci" / _slug(recipe.name)) / new_run_id()
    run_dir.mkdir(parents=True)
    rep.run_dir = str(run_dir)
    baseline = lockfiles / nightly.lock_name(recipe)
    pending = list(STEPS if promote else STEPS[:-1])
    env_root = run_dir / "env"
    pins = do.export_target(recipe, run_dir, rep) if from_target else None
    if not from_target:
        rep.base = {"from": None, "reason": "--packages-only: the recipe's packages alone"}
    if rep.base and rep.base.get("from"):
        say(f"starting from {rep.base['from']}: {rep.base['pinned']} distribution(s) at their versions")

    def run_step(step: str, fn: Callable[[], str | None]) -> None:
        pending.remove(step)
        say(f"── {step}")
        t0 = time.monotonic()
        try:
            msg = fn() or ""
        except StepFailed as exc:
            rep.steps.append(CiStep(step, "failed", time.monotonic() - t0, exc.message, exc.output))
            rep.failure = CiFailure(step, exc.message)
            raise
        rep.steps.append(CiStep(step, "passed", time.monotonic() - t0, msg))

    try:
        run_step("environment", lambda: do.environment(recipe, env_root, interpreter, rep))
        scoped = nightly.scoped_recipe(recipe, env_root / "bin" / "python")
        lock = run_dir / "pylock.toml"
        rep.lock = str(lock)
        target = Path(recipe.python) if pins is not None else None
        run_step("resolve", lambda: do.resolve(scoped, lock, run_dir, rep, on_output, target))
        run_step("install", lambda: do.install(scoped, lock, run_dir, rep, on_output))
        run_step("diff", lambda: do.diff(scoped, baseline, rep))
        run_step("smoke", lambda: do.smoke(scoped, name, run_dir, rep, on_output, recipe.python))
        if promote:
            run_step("promote", lambda: _promote(lock, baseline, rep))
        rep.status = "qualified"
    except StepFailed:
        rep.status = "failed"
    finally:
        shutil.rmtree(env_root, ignore_errors=True)
    for step in pending:
        rep.steps.append(CiStep(step, "skipped", 0.0,
                                f"not run: {rep.failure.step} failed" if rep.failure else "not run"))
    save_verdict(rep)
    return rep


def _first(message: Any) -> str:
    """An exception message's first line: the message as the exception printed it (a log line
    that follows it is not part of it)."""
    return str(message or "").strip().splitlines()[0] if str(message or "").strip() else ""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "recipe"


def _environment(recipe: Recipe, env_root: Path, interpreter: str | None, rep: CiReport) -> str:
    # Setup problems (no interpreter, uv venv failing) are not the nightly's fault: exit 2.
    python = nightly.make_venv(recipe, env_root, interpreter=interpreter)
    rep.python_version = nightly.env_python_version(python)
    return f"Python {rep.python_version} at {env_root}"


def export_target(recipe: Recipe, run_dir: Path, rep: CiReport) -> Path | None:
    """The target environment's pinned set, exported as `target-pins.txt` (`name==version`,
    one a line) in the run folder: every distribution but the recipe's own packages (the
    upgrade picks those), editable installs and ones installed from a URL or a path (no index
    can give them back; listed in `left_out`). None, with the reason in `rep.base`, when the
    recipe's environment is not on this machine or is a system interpreter's."""
    from rewheel.environment import Environment

    if not Path(recipe.python).exists():
        rep.base = {"from": None, "reason": f"{recipe.python} is not on this machine: the recipe's packages alone"}
        return None
    try:
        env = Environment.inspect(recipe.python)
    except RewheelError as exc:
        rep.base = {"from": None, "reason": f"{recipe.python} cannot be inspected ({exc.message}): "
                                            "the recipe's packages alone"}
        return None
    if env.kind == "system":
        rep.base = {"from": None, "reason": f"{recipe.python} is a system interpreter, not a service's "
                                            "environment: the recipe's packages alone"}
        return None
    path, pinned, left_out = nightly.export_pins(env, recipe.install.names, run_dir)
    rep.base = {"from": str(env.prefix), "pinned": pinned, "pins": str(run_dir / "target-pins.txt"),
                "left_out": left_out}
    return path


def _resolve(scoped: Recipe, lock: Path, run_dir: Path, rep: CiReport, on_output: Say,
             target: Path | None = None) -> str:
    """The nightly's lock. From a target environment (`target`, its interpreter): the same
    resolution `rewheel run` makes against it (resolution.resolve: what `uv pip install -U`
    would pick there, the whole environment locked), without the run's guards (a bisect pins
    older builds on purpose). Without: the recipe's packages alone, at their newest."""
    log = run_dir / "resolve.log"
    rep.logs["resolve"] = str(log)
    if target is not None:
        from rewheel.environment import Environment
        from rewheel.resolution import resolve

        env = Environment.inspect(target)
        try:
            res = resolve(scoped, env, folder=run_dir / "resolution", guards=False)
        except PreflightError as exc:
            lines = exc.message.splitlines()
            raise StepFailed(lines[0], lines[1:]) from None
        shutil.copyfile(res.lock, lock)
        shutil.copyfile(res.lock.parent / "resolve.log", log)
        return (f"{len(res.locked)} package(s) locked, {len(res.version_changes)} version change(s) "
                f"against {env.prefix}")
    cp = nightly.resolve_lock(scoped, lock, run_dir, log, on_output=on_output)
    lines = cp.stdout.splitlines()
    if cp.timed_out:
        raise StepFailed(f"uv could not resolve the nightly within {nightly.COMPILE_TIMEOUT_S:g}s",
                          lines[-20:])
    if cp.returncode != 0 or not lock.is_file():
        raise StepFailed(f"uv could not resolve {', '.join(scoped.install.packages)} "
                          f"(exit {cp.returncode}): " + " ".join(error_lines(lines, 3)),
                          error_lines(lines))
    pkgs = nightly.read_lock(lock)
    return f"{len(pkgs)} package(s) locked"


def _install(scoped: Recipe, lock: Path, run_dir: Path, rep: CiReport, on_output: Say) -> str:
    from rewheel.environment import Environment

    log = run_dir / "install.log"
    rep.logs["install"] = str(log)
    try:
        install(scoped, lock=lock, on_line=on_output, log_path=log)
    except InstallError as exc:
        raise StepFailed(exc.message.splitlines()[0], exc.message.splitlines()[1:]) from None
    rep.versions = Environment.inspect(scoped.python).versions()
    locked = {canonicalize_name(p["name"]): p["version"] for p in nightly.read_lock(lock)}
    wrong = {n: (v, rep.versions.get(n)) for n, v in locked.items() if rep.versions.get(n) != v}
    if wrong:
        raise StepFailed("the environment does not hold the locked versions: " +
                          ", ".join(f"{n} {got} (locked {want})" for n, (want, got) in wrong.items()))
    return f"{rep.package} {rep.versions.get(rep.package, '?')}"


def _smoke(scoped: Recipe, name: str, run_dir: Path, rep: CiReport, on_output: Say,
           target_python: str | Path | None = None) -> str:
    from rewheel import diagnose
    from rewheel.smoke import run_smoke

    log = run_dir / "smoke.log"
    rep.logs["smoke"] = str(log)
    res = run_smoke(scoped, log_path=log, on_line=on_output)
    if res.ok:
        return res.summary
    try:
        pkg = nightly.import_name(scoped.python, name)
        rep.root_cause = diagnose.analyse_file(log, package=pkg).root
    except (RewheelError, OSError):  # a diagnosis never hides the failure itself
        rep.root_cause = None
    _suspects(scoped, rep, target_python)
    cause = ""
    if rep.root_cause:
        cause = f": {rep.root_cause.type}: {_first(rep.root_cause.message)}"
        if rep.root_cause.rank:
            cause += f" in {rep.root_cause.rank}"
    raise StepFailed(res.summary + cause, res.tail[-40:])


def _suspects(scoped: Recipe, rep: CiReport, target_python: str | Path | None) -> None:
    """The changes of the upgrade that the root cause's frames point at: the throwaway
    environment started from the target environment's pinned set, so each upgraded file's
    old side is the target's installed copy (compared by RECORD). Nothing without a target."""
    rc = rep.root_cause
    if rc is None or not rc.frames or target_python is None or not (rep.base or {}).get("from"):
        return
    from rewheel import suspects as suspectsmod
    from rewheel.diff import env_change_texts
    from rewheel.environment import Environment

    try:
        changes, texts = env_change_texts(Environment.inspect(target_python), Environment.inspect(scoped.python))
        rc.suspects = suspectsmod.find_suspects(
            rc.frames, changes, texts, compare_urls={c.name: c.compare_url for c in rep.changes if c.compare_url})
    except Exception:  # noqa: BLE001 - the suspects inform; they never mask the failure itself
        rc.suspects = []


def _diff(scoped: Recipe, baseline: Path, rep: CiReport) -> str:
    from rewheel.diff import diff_versions
    from rewheel.environment import Environment

    if not baseline.is_file():
        return f"no qualified lock at {baseline} yet: nothing to compare"
    rep.baseline = str(baseline)
    old = [{"name": p["name"], "version": p["version"]} for p in nightly.read_lock(baseline)]
    new = [d.to_json() for d in Environment.inspect(scoped.python).distributions()]
    rep.changes = diff_versions(old, new)
    return f"{len(rep.changes)} change(s) since {baseline}"


def _check_lockfiles(folder: Path) -> None:
    """`--promote` writes into `--lockfiles`: a folder that cannot hold the lock (a
    pseudo-filesystem, a file, one this user cannot write) is refused before the nightly is
    installed, not after it qualified (UsageError, exit 2)."""
    hint = "give a folder of the repository, e.g. --lockfiles lockfiles"
    pseudo = pseudo_fs_of(folder)
    if pseudo is not None:
        raise UsageError(f"--lockfiles {folder}: is under {pseudo}, a pseudo-filesystem: a qualified lock "
                         "cannot be kept there", hint=hint)
    existing = next((p for p in (folder, *folder.absolute().parents) if os.path.lexists(p)), None)
    if existing is not None and not os.path.isdir(existing):
        raise UsageError(f"--lockfiles {folder}: {existing} is not a folder", hint=hint)
    if existing is not None and not os.access(existing, os.W_OK):
        raise UsageError(f"--lockfiles {folder}: {existing} is not writable by this user", hint=hint)


def _promote(lock: Path, target: Path, rep: CiReport) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = (f"# Qualified by `rewheel ci {rep.recipe}` on {stamp}: {rep.package} "
            f"{rep.version}, Python {rep.python_version}; smoke test passed.\n"
            f"# Install exactly this set: rewheel run {rep.recipe} --lock {target}\n")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, head + lock.read_text(encoding="utf-8"), mode=0o644)
    except OSError as exc:
        raise UsageError(f"--lockfiles {target.parent}: cannot write {target.name}: {exc.strerror or exc}",
                         hint=f"the qualified lock is still at {lock}") from None
    rep.promoted = str(target)
    return f"promoted to {target}"


# --- reports for CI ---------------------------------------------------------------------------

# XML 1.0 forbids most control characters (ANSI colour codes are common in logs).
_XML_BAD = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _xml_text(text: str) -> str:
    return _XML_BAD.sub("", _ANSI.sub("", text))


def junit_xml(rep: CiReport) -> str:
    """JUnit XML: one test suite, one test case per step (failed: <failure>, not run: <skipped>)."""
    failures = sum(1 for s in rep.steps if s.status == "failed")
    skipped = sum(1 for s in rep.steps if s.status == "skipped")
    total = sum(s.seconds for s in rep.steps)
    stamp = datetime.fromtimestamp(rep.started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    suites = ET.Element("testsuites", name="rewheel ci", tests=str(len(rep.steps)),
                        failures=str(failures), errors="0", skipped=str(skipped), time=f"{total:.3f}")
    suite = ET.SubElement(suites, "testsuite", name=f"rewheel ci {rep.recipe_name}",
                          tests=str(len(rep.steps)), failures=str(failures), errors="0",
                          skipped=str(skipped), time=f"{total:.3f}", timestamp=stamp,
                          hostname=socket.gethostname())
    props = ET.SubElement(suite, "properties")
    for key, value in (("recipe", rep.recipe), ("package", rep.package),
                       ("version", rep.version or ""), ("python", rep.python_version or ""),
                       ("status", rep.status)):
        ET.SubElement(props, "property", name=key, value=_xml_text(value))
    for s in rep.steps:
        case = ET.SubElement(suite, "testcase", classname=f"rewheel.ci.{_slug(rep.recipe_name)}",
                             name=s.name, time=f"{s.seconds:.3f}")
        if s.status == "failed":
            fail = ET.SubElement(case, "failure", message=_xml_text(s.message)[:1000],
                                 type=f"{s.name}-failed")
            body = [s.message]
            if s.name == "smoke" and rep.root_cause:
                rc = rep.root_cause
                fr = rc.frame
                body.append(f"root cause: {rc.type}: {_first(rc.message)}"
                            + (f" (in {rc.rank})" if rc.rank else "")
                            + (f" at {fr.file}:{fr.line} in {fr.function}" if fr and fr.file else ""))
            fail.text = _xml_text("\n".join(body))
        elif s.status == "skipped":
            ET.SubElement(case, "skipped", message=_xml_text(s.message))
        if s.output:
            ET.SubElement(case, "system-out").text = _xml_text("\n".join(s.output))
        elif s.message and s.status == "passed":
            ET.SubElement(case, "system-out").text = _xml_text(s.message)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def summary_markdown(rep: CiReport) -> str:
    """A Markdown report fit for a CI job summary ($GITHUB_STEP_SUMMARY)."""
    ok = rep.status == "qualified"
    out = [f"## {'✅' if ok else '❌'} rewheel ci: `{rep.package}` "
           f"{rep.version or '(not installed)'} {'qualified' if ok else 'failed'}", ""]
    out.append(f"Recipe `{rep.recipe}`, Python {rep.python_version or '?'}.")
    if rep.promoted:
        out.append(f"Promoted to `{rep.promoted}`: `rewheel run {rep.recipe} --lock {rep.promoted}` "
                   "installs exactly this set.")
    elif ok:
        out.append("Not promoted (run with `--promote` to write the lock).")
    out += ["", "| step | result | seconds | detail |", "| --- | --- | ---: | --- |"]
    icons = {"passed": "✅ passed", "failed": "❌ failed", "skipped": "⏭️ skipped"}
    for s in rep.steps:
        out.append(f"| {s.name} | {icons[s.status]} | {s.seconds:.1f} | {_md(s.message)[:300]} |")
    if rep.root_cause:
        rc = rep.root_cause
        fr = rc.frame
        out += ["", "### Root cause", "", "```",
                f"{rc.type}: {_first(rc.message)}"]
        if rc.rank:
            out.append(f"in process {rc.rank}")
        if fr and fr.file:
            out.append(f"at {fr.file}:{fr.line} in {fr.function}")
        out.append("```")
    out += ["", "### Changes since the last qualified lock", ""]
    if rep.baseline is None:
        out.append("No qualified lock to compare with yet.")
    elif not rep.changes:
        out.append(f"None: the same versions as `{rep.baseline}`.")
    else:
        out += ["| package | old | new | change | builds | compare |", "| --- | --- | --- | --- | ---: | --- |"]
        for c in rep.changes:
            dist = c.dev_distance
            link = f"[compare]({c.compare_url})" if c.compare_url else ""
            out.append(f"| {_md(c.name)} | {_md(c.old or '')} | {_md(c.new or '')} | "
                       f"{c.change} | {'' if dist is None else f'{dist:+d}'} | {link} |")
    if rep.versions:
        out += ["", "<details><summary>Installed versions "
                f"({len(rep.versions)})</summary>", "", "| package | version |", "| --- | --- |"]
        out += [f"| {_md(n)} | {_md(v)} |" for n, v in sorted(rep.versions.items())]
        out += ["", "</details>"]
    return "\n".join(out) + "\n"


def write_reports(rep: CiReport, *, junit: Path | None, summary: Path | None) -> None:
    """Write the JUnit XML and the Markdown summary where asked (appending to a summary file
    that exists, as $GITHUB_STEP_SUMMARY expects)."""
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
        junit.write_text(junit_xml(rep), encoding="utf-8")
        rep.junit = str(junit)
    if summary is not None:
        summary.parent.mkdir(parents=True, exist_ok=True)
        with open(summary, "a", encoding="utf-8") as f:
            f.write(summary_markdown(rep))
        rep.summary = str(summary)
