"""`rewheel bisect`: the first bad nightly between a good and a bad one, as mozregression finds
the first bad browser nightly — and why each tested build failed.

Candidates, oldest first:
- per-commit builds (vLLM publishes `<base>/<commit>/` indexes; `<base>/nightly/` has only the
  newest): when both versions carry a `g<sha>` label and a per-commit base is known, the
  commits between the two shas come from a local clone (`--repo`) or GitHub's compare API
  (`--github OWNER/REPO`, else the repository named in the bad build's Project-URLs). Each
  commit's build is installed from its own index; a commit without a build is skipped.
- otherwise the versions the index offers between good and bad (PEP 691 JSON where offered,
  else PEP 503 HTML), ordered by `packaging.version.Version`.

Good is checked to be good and bad to be bad first; then the middle untested build is tested
until the first bad one is next to the last good one: ⌈log2(n)⌉ + 2 smoke runs for n builds,
or fewer. Each test installs one build into a throwaway environment (uv's cache makes repeats
cheap) and runs the recipe's smoke test there: passed = good, failed = bad, install failed =
skip (and the middle moves). Every verdict is journaled (fsynced) under
`$REWHEEL_HOME/bisect/<recipe>-<hash>/`, so the same command after an interruption resumes
where it stopped and never re-tests a build it has a verdict for; `--restart` forgets them.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx
from packaging.version import InvalidVersion, Version

from rewheel import nightly
from rewheel import versions as vers
from rewheel.errors import EXIT_OK, EXIT_REVERTED, InstallError, RewheelError, UsageError
from rewheel.installer import redact
from rewheel.journal import EnvLock, RunJournal
from rewheel.owned import private_dir
from rewheel.paths import state_home
from rewheel.recipe import Recipe
from rewheel.records import Candidates, Finish, Started, Step, BuildVerdict
from rewheel.statuses import BisectStatus, StepName

if TYPE_CHECKING:
    from rewheel.diagnose import RootCause

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass
class Build:
    """One candidate: a version (None until its per-commit index is asked), the commit it was
    built from, and the per-commit index to install it from (None: the recipe's indexes)."""

    version: str | None
    commit: str | None = None
    index: str | None = None

    @property
    def label(self) -> str:
        return self.version or (self.commit or "?")[:12]

    @property
    def sha(self) -> str | None:
        return self.commit or (vers.parse(self.version).sha if self.version else None)

    def same(self, other: Build | BuildVerdict) -> bool:
        """Whether another build, or a journaled verdict's build, is this build."""
        commit, version = other.commit, other.version
        if self.commit and commit:
            return bool(self.commit == commit)
        return bool(self.version and version and Version(self.version) == Version(str(version)))

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "commit": self.commit,
                "index": redact(self.index) if self.index else None}


@dataclass
class Verdict:
    build: Build
    verdict: str  # "good" | "bad" | "skip"
    reason: str
    root_cause: RootCause | None = None
    log: str | None = None
    seconds: float = 0.0
    resumed: bool = False  # journaled by an earlier, interrupted invocation
    project_urls: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**self.build.to_json(), "verdict": self.verdict, "reason": self.reason,
                "root_cause": self.root_cause.to_json() if self.root_cause else None,
                "log": self.log, "seconds": round(self.seconds, 3),
                "resumed": self.resumed}


@dataclass
class BisectResult:
    status: BisectStatus
    recipe: str
    package: str
    good: str
    bad: str
    mode: str  # "commits" | "versions"
    candidates: list[Build] = field(default_factory=list)
    first_bad: Build | None = None
    last_good: Build | None = None
    suspects: list[Build] = field(default_factory=list)  # with "ambiguous": one of them is it
    compare_url: str | None = None
    steps: list[Verdict] = field(default_factory=list)
    smoke_runs: int = 0
    commit_source: str | None = None
    state_dir: str | None = None
    message: str = ""

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.status == BisectStatus.FOUND else EXIT_REVERTED

    @property
    def first_bad_verdict(self) -> Verdict | None:
        if self.first_bad is None:
            return None
        return next((v for v in self.steps if v.build is self.first_bad), None)

    def to_json(self) -> dict[str, Any]:
        fb = self.first_bad_verdict
        return {"status": self.status, "recipe": self.recipe, "package": self.package,
                "good": self.good, "bad": self.bad, "mode": self.mode,
                "candidates": len(self.candidates),
                "first_bad": self.first_bad.to_json() if self.first_bad else None,
                "last_good": self.last_good.to_json() if self.last_good else None,
                "suspects": [b.to_json() for b in self.suspects],
                "compare_url": self.compare_url,
                "root_cause": fb.root_cause.to_json() if fb and fb.root_cause else None,
                "steps": [v.to_json() for v in self.steps], "smoke_runs": self.smoke_runs,
                "commit_source": self.commit_source, "state_dir": self.state_dir,
                "message": self.message, "exit_code": self.exit_code}


def state_dir_for(recipe: Recipe, package: str, good: str, bad: str) -> Path:
    """Where one bisection's journal, logs and throwaway environments live."""
    key = "\0".join([str(recipe.path.resolve()) if recipe.path else str(recipe.python),
                     package, str(Version(good)), str(Version(bad))])
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", recipe.name).strip("-") or "recipe"
    return state_home() / "bisect" / f"{slug}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


class _Bisection:
    def __init__(self, recipe: Recipe, name: str, state: Path, j: RunJournal, *,
                 interpreter: str | None, say: Say, on_output: Say,
                 client: httpx.Client | None) -> None:
        self.recipe, self.name, self.state, self.j = recipe, name, state, j
        self.interpreter, self.say, self.on_output, self.client = interpreter, say, on_output, client
        self.smoke_runs = 0
        self.steps: list[Verdict] = []
        self.project_urls: dict[str, str] = {}

    # -- the journal --------------------------------------------------------------------------
    def recorded(self, build: Build) -> Verdict | None:
        for rec in self.j.all(BuildVerdict):
            if build.same(rec):
                if build.version is None and rec.version:
                    build.version = rec.version
                self.project_urls = self.project_urls or rec.project_urls
                from rewheel.diagnose import Frame, RootCause

                rc = rec.root_cause  # as the verdict's to_json wrote it
                root = RootCause.from_json(rc) if rc else None
                if root is not None:  # the frames the suspects are found by, kept beside it
                    root.frames = [Frame.from_json(f) for f in rec.frames if isinstance(f, dict)]
                return Verdict(build, rec.verdict, rec.reason, root, rec.log, rec.seconds, True, rec.project_urls)
        return None

    # -- one test -----------------------------------------------------------------------------
    def test(self, build: Build) -> Verdict:
        for done in self.steps:
            if done.build is build or build.same(done.build):
                return done
        v = self.recorded(build)
        if v is not None:
            self.say(f"{build.label}: {v.verdict} (recorded earlier: {v.reason})")
        else:
            v = self._run(build)
            self.j.append(BuildVerdict(**build.to_json(), verdict=v.verdict,
                                       reason=v.reason, root_cause=v.root_cause.to_json() if v.root_cause else None,
                                       frames=[f.to_json() for f in v.root_cause.frames] if v.root_cause else [],
                                       log=v.log, seconds=round(v.seconds, 3), project_urls=v.project_urls))
            self.say(f"{build.label}: {v.verdict.upper()} — {v.reason}")
        self.steps.append(v)
        return v

    def _run(self, build: Build) -> Verdict:
        from rewheel import diagnose
        from rewheel.environment import Environment
        from rewheel.smoke import run_smoke

        t0 = time.monotonic()
        self.j.append(Step(name=StepName.TEST, **build.to_json()))
        if build.version is None:
            assert build.index is not None
            files = nightly.index_files(build.index, self.name, self.client)
            if not files:
                return Verdict(build, "skip", f"no {self.name} build in the per-commit index "
                                              f"{redact(build.index)}",
                               seconds=time.monotonic() - t0)
            vs = sorted({f.version for f in files})
            match = [v for v in vs if build.commit and (vers.parse(str(v)).sha or "-")
                     and build.commit.startswith(vers.parse(str(v)).sha or "-")]
            build.version = str((match or vs)[-1])
        self.say(f"── testing {self.name} {build.label}"
                 + (f" (commit {build.commit[:12]})" if build.commit else ""))
        logs = private_dir(self.state / "logs")
        label = re.sub(r"[^A-Za-z0-9_.+-]+", "-", build.label)
        install_log, smoke_log = logs / f"{label}.install.log", logs / f"{label}.smoke.log"
        for p in (install_log, smoke_log):
            p.unlink(missing_ok=True)  # a build re-tested after an interruption starts afresh
        with nightly.throwaway_env(self.recipe, parent=self.state / "envs",
                                   interpreter=self.interpreter) as python:
            scoped = nightly.scoped_recipe(
                self.recipe, python, first_index=build.index,
                packages=nightly.pinned_packages(self.recipe, self.name, build.version))
            from rewheel.installer import install

            try:
                install(scoped, on_line=self.on_output, log_path=install_log)
            except InstallError as exc:
                return Verdict(build, "skip", "install failed: " + exc.message.splitlines()[0]
                               + (" " + " ".join(l.strip() for l in exc.message.splitlines()[1:3])),
                               log=str(install_log), seconds=time.monotonic() - t0)
            dist = next((d for d in Environment.inspect(python).distributions()
                         if d.name == self.name), None)
            urls = dict(dist.project_urls) if dist else {}
            self.project_urls = self.project_urls or urls
            self.smoke_runs += 1
            res = run_smoke(scoped, log_path=smoke_log, on_line=self.on_output)
            if res.ok:
                return Verdict(build, "good", res.summary, log=str(smoke_log),
                               seconds=time.monotonic() - t0, project_urls=urls)
            try:
                pkg = nightly.import_name(python, self.name)
                rc = diagnose.analyse_file(smoke_log, package=pkg).root
            except (RewheelError, OSError):
                rc = None
            reason = res.summary
            if rc:
                msg = rc.message.strip()
                reason += f"; {rc.type}: {msg.splitlines()[0] if msg else ''}"
            return Verdict(build, "bad", reason, rc, str(smoke_log), time.monotonic() - t0,
                           project_urls=urls)


def bisect(recipe: Recipe, *, good: str, bad: str, package: str | None = None,
           repo: str | None = None, github: str | None = None,
           github_api: str = nightly.GITHUB_API, commit_base: str | None = None,
           interpreter: str | None = None, restart: bool = False, say: Say = _quiet,
           on_output: Say = _quiet, client: httpx.Client | None = None) -> BisectResult:
    """Find the first bad build between `good` and `bad` (see the module docstring).

    Raises UsageError for bad arguments (versions that do not parse or are out of order, a
    recipe without a smoke test, a commit range that does not end at `bad`), PreflightError for
    unreachable indexes or APIs and throwaway environments that cannot be made."""
    if recipe.smoke is None:
        raise UsageError(f"{recipe.source}: no [smoke] section; bisect tells good from bad by the "
                         "smoke test", hint="add [smoke] command = [...] to the recipe")
    try:
        gv, bv = Version(good), Version(bad)
    except InvalidVersion as exc:
        raise UsageError(f"--good/--bad: {exc}", hint="give versions as the index names them, "
                         "e.g. 0.16.0rc2.dev313+g8c1b3f2a0") from None
    if not gv < bv:
        raise UsageError(f"--good {good} is not older than --bad {bad}",
                         hint="the good build must come before the bad one")
    if recipe.smoke.gpus > 0:
        from rewheel import gpu

        gpu.require_gpus(recipe.smoke.gpus)
    name = nightly.package_name(recipe, package)
    state = state_dir_for(recipe, name, good, bad)
    if restart and state.exists():
        shutil.rmtree(state)
    private_dir(state)
    with EnvLock(state, "bisect"):
        # A killed run leaves its throwaway environment behind; nothing in it is needed.
        shutil.rmtree(state / "envs", ignore_errors=True)
        j = RunJournal.load(state)
        if not j.records:
            j.append(Started(kind="bisect", recipe=recipe.source, package=name, good=good, bad=bad))
        else:
            say(f"resuming the bisection journaled in {state}")
        b = _Bisection(recipe, name, state, j, interpreter=interpreter, say=say,
                       on_output=on_output, client=client)
        res = BisectResult(status=BisectStatus.UNTESTABLE, recipe=recipe.source, package=name, good=good,
                           bad=bad, mode="versions", state_dir=str(state))
        builds, mode, source = _candidates(b, res, good, bad, repo=repo, github=github,
                                           github_api=github_api, commit_base=commit_base)
        res.candidates, res.mode, res.commit_source = builds, mode, source
        search(b, res, builds)
        res.steps, res.smoke_runs = b.steps, b.smoke_runs
        if res.first_bad is not None and res.last_good is not None:
            res.compare_url = _compare_url(b.project_urls, github, res.last_good, res.first_bad)
        if res.status == BisectStatus.FOUND:
            _suspects(b, res)
        j.append(Finish(status=res.status, first_bad=res.first_bad.to_json() if res.first_bad else None,
                        last_good=res.last_good.to_json() if res.last_good else None))
        return res


def journaled(home: Path | None = None) -> list[BisectResult]:
    """Every bisection journaled under the state home (`<home>/bisect/*/journal.jsonl`), as
    far as each got, oldest first: for `rewheel board`. A running or interrupted one has
    no `finished` record yet; its status is then UNTESTABLE and its message says so."""
    from rewheel.diagnose import RootCause

    root = (home or state_home()) / "bisect"
    out: list[tuple[float, BisectResult]] = []
    for state in sorted(p for p in root.glob("*") if p.is_dir()) if root.is_dir() else []:
        try:
            j = RunJournal.load(state)
        except RewheelError:
            continue
        start, fin, cand = j.first(Started), j.last(Finish), j.first(Candidates)
        if start is None or start.good is None or start.bad is None:
            continue
        res = BisectResult(status=BisectStatus.UNTESTABLE, recipe=start.recipe or "", package=start.package or "",
                           good=start.good, bad=start.bad, mode=(cand.mode if cand else None) or "versions",
                           commit_source=cand.source if cand else None, state_dir=str(state))
        res.candidates = [Build(b.get("version"), b.get("commit")) for b in (cand.builds if cand else [])
                          if isinstance(b, dict)]
        urls: dict[str, str] = {}
        for rec in j.all(BuildVerdict):
            root_cause = RootCause.from_json(rec.root_cause) if rec.root_cause else None
            res.steps.append(Verdict(Build(rec.version, rec.commit), rec.verdict, rec.reason, root_cause,
                                     rec.log, rec.seconds, True, rec.project_urls))
            urls = urls or rec.project_urls
        if fin is None:
            res.message = "not finished (running, or interrupted: the same command resumes it)"
        else:
            try:
                res.status = BisectStatus(str(fin.status))
            except ValueError:
                res.message = f"ended {fin.status}"
            res.first_bad = _build_of(fin.first_bad)
            res.last_good = _build_of(fin.last_good)
            if res.first_bad is not None:
                # The verdict of the first bad build, so `first_bad_verdict` finds its root cause.
                same = next((v for v in res.steps if res.first_bad.same(v.build)), None)
                if same is not None:
                    res.first_bad = same.build
            if res.first_bad is not None and res.last_good is not None:
                res.compare_url = _compare_url(urls, None, res.last_good, res.first_bad)
        res.smoke_runs = sum(1 for v in res.steps if v.verdict in ("good", "bad"))
        out.append((start.time, res))
    return [r for _, r in sorted(out, key=lambda x: x[0])]


def _build_of(doc: dict[str, Any] | None) -> Build | None:
    return Build(doc.get("version"), doc.get("commit")) if isinstance(doc, dict) else None


def _suspects(b: _Bisection, res: BisectResult) -> None:
    """The changes between the last good and the first bad build that the first bad build's
    root cause points at: both builds installed again side by side (uv's cache has their
    wheels) and compared by RECORD. Best effort: the answer stands without them."""
    fb = res.first_bad_verdict
    rc = fb.root_cause if fb is not None else None
    if rc is None or not rc.frames or res.last_good is None or res.first_bad is None:
        return
    from rewheel import suspects as suspectsmod
    from rewheel.diff import env_change_texts
    from rewheel.environment import Environment
    from rewheel.installer import install

    b.say("── suspects: the changes between the last good and the first bad build on the crash's path")
    try:
        with nightly.throwaway_env(b.recipe, parent=b.state / "envs", interpreter=b.interpreter) as good_py, \
                nightly.throwaway_env(b.recipe, parent=b.state / "envs", interpreter=b.interpreter) as bad_py:
            for build, python in ((res.last_good, good_py), (res.first_bad, bad_py)):
                assert build.version is not None
                install(nightly.scoped_recipe(b.recipe, python, first_index=build.index,
                                              packages=nightly.pinned_packages(b.recipe, b.name, build.version)))
            changes, texts = env_change_texts(Environment.inspect(good_py), Environment.inspect(bad_py))
            rc.suspects = suspectsmod.find_suspects(
                rc.frames, changes, texts, compare_urls={b.name: res.compare_url} if res.compare_url else None)
    except Exception as exc:  # noqa: BLE001 - the suspects inform; the first bad build stands
        b.say(f"(suspects not computed: {exc})")


def _candidates(b: _Bisection, res: BisectResult, good: str, bad: str, *, repo: str | None,
                github: str | None, github_api: str,
                commit_base: str | None) -> tuple[list[Build], str, str | None]:
    """The builds from good to bad, oldest first; journaled once, reused on resume."""
    base = nightly.commit_index_base(b.recipe, commit_base)
    rec = b.j.first(Candidates)
    if rec is not None:
        # Index URLs are not journaled (they may carry credentials): rebuilt from the base.
        if rec.mode == "commits" and not base:
            raise UsageError("this bisection was journaled with per-commit indexes, but no "
                             "per-commit base is known now", hint="pass the same --commit-index-base")
        return [Build(x.get("version"), x.get("commit"),
                      nightly.commit_index(base, x["commit"]) if base and x.get("commit") else None)
                for x in rec.builds], rec.mode or "versions", rec.source
    gi, bi = vers.parse(good), vers.parse(bad)
    listed_by, offered = nightly.offered_versions(b.recipe, b.name, b.client)
    builds: list[Build] | None = None
    mode, source = "versions", None
    if base and gi.sha and bi.sha:
        rng = None
        if repo:
            rng = nightly.git_commits(repo, gi.sha, bi.sha)
        else:
            spec = github
            if spec is None:
                # The repository is named in the bad build's Project-URLs: test bad first
                # (it has to be tested anyway) and read them from its installed metadata.
                b.test(Build(bad))
                url = vers.repository_url(b.project_urls)
                if url and "github.com" in url:
                    spec = url
            if spec:
                rng = nightly.compare_commits(spec, gi.sha, bi.sha, client=b.client, api_url=github_api)
        if rng is not None:
            builds = _commit_builds(rng, base, offered, good, bad)
            mode, source = "commits", rng.source
    if builds is None:
        refuse_unlisted(b.recipe, b.name, listed_by, offered, good, bad)
        # Prereleases (rc, dev: nightlies) are candidates only when the recipe allows them.
        allowed = [v for v in offered if b.recipe.install.prerelease or not v.is_prerelease]
        between = sorted({v for v in allowed if Version(good) < v < Version(bad)})
        builds = [Build(good), *[Build(str(v)) for v in between], Build(bad)]
        if not between:
            res.message = ("the index offers no builds between good and bad"
                           + ("" if base else "; for per-commit indexes name their base with "
                              "--commit-index-base and the commits with --repo or --github"))
    b.j.append(Candidates(mode=mode, source=source,
                          builds=[{"version": x.version, "commit": x.commit} for x in builds]))
    b.say(f"{len(builds)} builds from {good} to {bad} ({mode}"
          + (f", commits from {source}" if source else "") + ")")
    return builds, mode, source


def refuse_unlisted(recipe: Recipe, name: str, index: str | None, offered: list[Version],
                    good: str, bad: str) -> None:
    """A bisection by versions knows the builds between good and bad only from an index that
    lists them — both ends included. Without one (the default index, which is not asked; an
    index without the package; one that does not list good or bad: the nightlies live
    elsewhere) "nothing between" would be a guess that names bad as the first bad build with
    confidence: refused (UsageError, exit 2) before anything is tested. So are good and bad
    that are prereleases when the recipe does not allow them."""
    hint = ("name the index that holds the builds in the recipe ([install] index_url or "
            "extra_index_urls), or bisect by commits (--commit-index-base URL with --repo PATH or "
            "--github OWNER/REPO); nothing was tested")
    gv, bv = Version(good), Version(bad)
    pre = [v for v in (good, bad) if Version(v).is_prerelease]
    if pre and not recipe.install.prerelease:
        raise UsageError(f"--good/--bad {', '.join(pre)}: a prerelease, but {recipe.source} does not allow "
                         "prereleases ([install] prerelease is not true)",
                         hint="set prerelease = true under [install] to bisect nightlies; nothing was tested")
    if index is None:
        asked = [u for u in (*recipe.install.extra_index_urls, *([recipe.install.index_url] if recipe.install.index_url else []))
                 if u.startswith(("http://", "https://"))]
        why = (f"none of the recipe's indexes ({', '.join(redact(u) for u in asked)}) has {name}" if asked
               else "the recipe names no index (the default index is not asked: it cannot be told apart "
                    "from where the nightlies live)")
        raise UsageError(f"cannot bisect {name} from {good} to {bad}: no index lists its builds — {why}; "
                         "the builds between them are unknown, and any first bad build would be a guess",
                         hint=hint)
    missing = [v for v, want in ((good, gv), (bad, bv)) if want not in offered]
    if missing:
        raise UsageError(f"cannot bisect {name} from {good} to {bad}: index {redact(index)} does not list "
                         f"{' or '.join(missing)}, so it cannot list the builds between them (the builds "
                         "live elsewhere)", hint=hint)


def _commit_builds(rng: nightly.CommitRange, base: str, offered: list[Version], good: str,
                   bad: str) -> list[Build]:
    if not rng.commits:
        raise UsageError(f"no commits between {good} and {bad} ({rng.source})")
    bad_sha = vers.parse(bad).sha or ""
    if not rng.commits[-1].startswith(bad_sha):
        raise UsageError(f"the commits from {rng.source} end at {rng.commits[-1][:12]}, not at "
                         f"the bad build's commit {bad_sha}")
    by_sha: dict[str, str] = {}
    for v in offered:
        sha = vers.parse(str(v)).sha
        if sha:
            by_sha[sha] = str(v)

    def version_for(commit: str) -> str | None:
        return next((v for s, v in by_sha.items() if commit.startswith(s)), None)

    builds = [Build(good, rng.base, nightly.commit_index(base, rng.base))]
    builds += [Build(version_for(c), c, nightly.commit_index(base, c)) for c in rng.commits]
    builds[-1].version = bad
    return builds


class Tester(Protocol):
    """What the search asks of a bisection: one build's verdict (installed and smoke-tested
    in a throwaway environment, or read back from the journal)."""

    def test(self, build: Build) -> Verdict: ...


def search(b: Tester, res: BisectResult, builds: list[Build]) -> None:
    """Verify the ends, then halve the range between the last good and the first bad build
    (builds that cannot be tested are skipped; when they sit next to the first bad one, the
    result is `ambiguous`). Pure: every test goes through `b` (the unit tests pass a fake)."""
    lo, hi = 0, len(builds) - 1
    end = b.test(builds[hi])
    if end.verdict != "bad":
        res.status = BisectStatus.BAD_IS_GOOD if end.verdict == "good" else BisectStatus.UNTESTABLE
        res.message = (f"the bad build {builds[hi].label} passes the smoke test: nothing to bisect"
                       if end.verdict == "good" else
                       f"the bad build {builds[hi].label} cannot be tested: {end.reason}")
        return
    start = b.test(builds[lo])
    if start.verdict != "good":
        res.status = BisectStatus.GOOD_IS_BAD if start.verdict == "bad" else BisectStatus.UNTESTABLE
        res.message = (f"the good build {builds[lo].label} fails the smoke test too: {start.reason}"
                       if start.verdict == "bad" else
                       f"the good build {builds[lo].label} cannot be tested: {start.reason}")
        return
    skipped: set[int] = set()
    while True:
        inner = [i for i in range(lo + 1, hi) if i not in skipped]
        if not inner:
            break
        middle = (lo + hi) / 2
        mid = min(inner, key=lambda i: (abs(i - middle), i))
        v = b.test(builds[mid])
        if v.verdict == "good":
            lo = mid
        elif v.verdict == "bad":
            hi = mid
        else:
            skipped.add(mid)
    res.last_good, res.first_bad = builds[lo], builds[hi]
    between = [builds[i] for i in range(lo + 1, hi)]
    if between:
        res.status = BisectStatus.AMBIGUOUS
        res.suspects = [*between, builds[hi]]
        res.message = (f"the first bad build is one of {', '.join(x.label for x in res.suspects)}: "
                       f"{len(between)} build(s) between could not be installed")
    else:
        res.status = BisectStatus.FOUND
        res.message = f"first bad build: {builds[hi].label}; last good build: {builds[lo].label}"


def _compare_url(project_urls: dict[str, str], github: str | None, good: Build,
                 bad: Build) -> str | None:
    a, z = good.sha, bad.sha
    if not a or not z:
        return None
    url = vers.compare_url(project_urls, a, z)
    if url is None and github:
        owner, name = nightly.github_repo(github)
        url = f"https://github.com/{owner}/{name}/compare/{a}...{z}"
    return url
