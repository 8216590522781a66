"""`rewheel ci`'s verdicts, in milliseconds: `qualify` runs its steps through a fake
`CiSteps` (no uv, no virtualenv, no smoke process), and each outcome is checked — which
step failed, which were skipped and why, the status and exit code, what is promoted and
when, and that the throwaway environment is removed whatever happened. The end-to-end
tests (test_ci.py, test_ci_target.py) run the real steps on a real index."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rewheel import qualify
from rewheel.errors import EXIT_OK, EXIT_REVERTED, RewheelError, UsageError
from rewheel.qualify import CiReport, StepFailed
from rewheel.recipe import parse_recipe

LOCK = 'lock-version = "1.0"\ncreated-by = "fake"\n[[packages]]\nname = "toypkg"\nversion = "2.0.0"\n'


class FakeSteps:
    """Records the steps called; `fail` names one to fail (StepFailed), `setup_error` one to
    raise a setup problem (RewheelError)."""

    def __init__(self, fail: str | None = None, setup_error: str | None = None) -> None:
        self.fail, self.setup_error = fail, setup_error
        self.called: list[str] = []
        self.gpus: list[int] = []
        self.env_root: Path | None = None

    def _step(self, name: str, msg: str) -> str:
        self.called.append(name)
        if name == self.setup_error:
            raise UsageError(f"{name}: the interpreter is missing")
        if name == self.fail:
            raise StepFailed(f"{name} broke", [f"{name} log line"])
        return msg

    def require_gpus(self, count: int) -> None:
        self.gpus.append(count)

    def export_target(self, recipe: Any, run_dir: Path, rep: CiReport) -> Path | None:
        rep.base = {"from": None, "reason": "not on this machine"}
        return None

    def environment(self, recipe: Any, env_root: Path, interpreter: str | None, rep: CiReport) -> str:
        env_root.mkdir(parents=True)
        (env_root / "marker").write_text("x")
        self.env_root = env_root
        rep.python_version = "3.11.9"
        return self._step("environment", "Python 3.11.9")

    def resolve(self, scoped: Any, lock: Path, run_dir: Path, rep: CiReport, on_output: Any,
                target: Path | None) -> str:
        lock.write_text(LOCK)
        return self._step("resolve", "1 package(s) locked")

    def install(self, scoped: Any, lock: Path, run_dir: Path, rep: CiReport, on_output: Any) -> str:
        rep.versions = {"toypkg": "2.0.0"}
        return self._step("install", "toypkg 2.0.0")

    def diff(self, scoped: Any, baseline: Path, rep: CiReport) -> str:
        return self._step("diff", "0 change(s)")

    def smoke(self, scoped: Any, name: str, run_dir: Path, rep: CiReport, on_output: Any,
              target_python: Any) -> str:
        return self._step("smoke", "model initialised")


def _recipe(tmp_path: Path, smoke: str = 'command = ["{python}", "-c", "pass"]\n') -> Any:
    import tomllib

    text = ('[environment]\npython = "/nonexistent/bin/python"\n[install]\npackages = ["toypkg"]\n'
            + (f"[smoke]\n{smoke}" if smoke else ""))
    return parse_recipe(tmp_path / "nightly.toml", tomllib.loads(text), check_interpreter=False)


def _qualify(tmp_path: Path, steps: FakeSteps, *, promote: bool = False, **kw: Any) -> CiReport:
    return qualify.qualify(_recipe(tmp_path, **kw), lockfiles=tmp_path / "lockfiles", promote=promote,
                           work_dir=tmp_path / "work", steps=steps)


def test_every_step_passes_and_the_lock_is_promoted(tmp_path: Path) -> None:
    steps = FakeSteps()
    rep = _qualify(tmp_path, steps, promote=True)
    assert (rep.status, rep.exit_code, rep.failure) == ("qualified", EXIT_OK, None)
    assert [(s.name, s.status) for s in rep.steps] == [(n, "passed") for n in qualify.STEPS]
    promoted = tmp_path / "lockfiles" / "pylock.nightly.toml"
    assert rep.promoted == str(promoted)
    text = promoted.read_text()
    assert text.endswith(LOCK) and "toypkg 2.0.0" in text and f"--lock {promoted}" in text
    assert steps.env_root is not None and not steps.env_root.exists()  # the throwaway env is gone
    assert rep.version == "2.0.0" and rep.to_json()["exit_code"] == EXIT_OK


def test_without_promote_nothing_is_written_and_promote_is_not_a_step(tmp_path: Path) -> None:
    rep = _qualify(tmp_path, FakeSteps())
    assert rep.status == "qualified"
    assert [s.name for s in rep.steps] == list(qualify.STEPS[:-1])
    assert not (tmp_path / "lockfiles").exists() and rep.promoted is None


@pytest.mark.parametrize("failing", ["resolve", "install", "diff", "smoke"])
def test_a_failing_step_fails_the_nightly_and_skips_the_rest(tmp_path: Path, failing: str) -> None:
    steps = FakeSteps(fail=failing)
    rep = _qualify(tmp_path, steps, promote=True)
    assert (rep.status, rep.exit_code) == ("failed", EXIT_REVERTED)
    assert rep.failure is not None and (rep.failure.step, rep.failure.message) == (failing, f"{failing} broke")
    at = qualify.STEPS.index(failing)
    assert steps.called == list(qualify.STEPS[:at + 1])  # nothing after the failure ran
    by = {s.name: s for s in rep.steps}
    assert by[failing].status == "failed" and by[failing].output == [f"{failing} log line"]
    for later in qualify.STEPS[at + 1:]:
        assert by[later].status == "skipped" and by[later].message == f"not run: {failing} failed"
    for earlier in qualify.STEPS[:at]:
        assert by[earlier].status == "passed"
    # A failed nightly is never promoted, and its throwaway environment is removed.
    assert rep.promoted is None and not (tmp_path / "lockfiles" / "pylock.nightly.toml").exists()
    assert steps.env_root is not None and not steps.env_root.exists()


def test_a_setup_problem_raises_and_still_removes_the_environment(tmp_path: Path) -> None:
    steps = FakeSteps(setup_error="resolve")
    with pytest.raises(RewheelError, match="the interpreter is missing"):
        _qualify(tmp_path, steps)
    assert steps.env_root is not None and not steps.env_root.exists()


def test_no_smoke_section_is_refused_before_any_step(tmp_path: Path) -> None:
    steps = FakeSteps()
    with pytest.raises(UsageError, match=r"no \[smoke\] section"):
        _qualify(tmp_path, steps, smoke="")
    assert steps.called == [] and not (tmp_path / "work").exists()


def test_a_gpu_smoke_test_asks_for_its_gpus_first(tmp_path: Path) -> None:
    steps = FakeSteps()
    _qualify(tmp_path, steps, smoke='command = ["{python}", "-c", "pass"]\ngpus = 2\n')
    assert steps.gpus == [2]


def test_junit_and_summary_name_the_failed_step(tmp_path: Path) -> None:
    rep = _qualify(tmp_path, FakeSteps(fail="smoke"))
    xml, md = qualify.junit_xml(rep), qualify.summary_markdown(rep)
    assert 'name="smoke"' in xml and "<failure" in xml and "smoke broke" in xml
    assert "smoke" in md and "smoke broke" in md
