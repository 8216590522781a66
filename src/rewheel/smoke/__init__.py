"""The smoke test: run the recipe's command against the upgraded environment, in its own process
group, with a timeout that kills the whole group, and keep its output as a log file.

A failing or hanging smoke test is a result, not an error: `run_smoke` returns a SmokeResult and
the runner decides what to do (revert). Only a command that cannot be started at all — its
executable does not exist — raises, and `check_smoke` finds that at preflight, before anything
is changed. Model-init commands fork worker processes (one per GPU rank); they all live in the
smoke command's process group, so a timeout takes down every one of them and frees the GPUs.
The package also holds the real smoke modules (`rewheel.smoke.vllm_init`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewheel import proc
from rewheel.errors import CommandNotFound, PreflightError

if TYPE_CHECKING:  # stdlib-only at import: `python -m rewheel.smoke.vllm_init` imports this
    from rewheel.recipe import Recipe  # package under the TARGET env's interpreter

__all__ = ["SmokeResult", "check_smoke", "run_smoke", "smoke_argv", "smoke_cwd"]


@dataclass
class SmokeResult:
    """How the smoke command ended. `returncode` is -9 when it was killed for the timeout."""

    ok: bool
    returncode: int | None
    timed_out: bool
    seconds: float
    log_path: str | None
    argv: list[str] = field(default_factory=list)
    timeout_s: float | None = None
    skipped: bool = False
    tail: list[str] = field(default_factory=list)  # the last output lines, for reports

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "returncode": self.returncode, "timed_out": self.timed_out,
                "seconds": round(self.seconds, 3), "log_path": self.log_path, "argv": self.argv,
                "timeout_s": self.timeout_s, "skipped": self.skipped}

    @property
    def killed_by(self) -> str | None:
        """The signal that ended the smoke test from outside (not rewheel's timeout), by name:
        `SIGTERM`, `SIGKILL`; None when it exited on its own."""
        import signal

        if self.timed_out or self.returncode is None or self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    @property
    def ended(self) -> str:
        """How it ended, in a few words: `timed out after 30s`, `killed by SIGTERM`, `exited 1`."""
        if self.timed_out:
            return f"timed out after {self.timeout_s:g}s"
        if self.killed_by:
            return f"killed by {self.killed_by}"
        return f"exited {self.returncode}"

    @property
    def summary(self) -> str:
        if self.skipped:
            return "no smoke test in the recipe"
        if self.timed_out:
            return (f"smoke test did not finish within {self.timeout_s:g}s; its process group was "
                    f"killed (log: {self.log_path})")
        if self.killed_by:
            return (f"smoke test was killed by {self.killed_by} (from outside: not its own failure, nor "
                    f"rewheel's timeout) (log: {self.log_path})")
        if not self.ok:
            return f"smoke test exited with status {self.returncode} (log: {self.log_path})"
        return f"smoke test passed in {self.seconds:.1f}s"


def smoke_argv(recipe: Recipe) -> list[str]:
    """The recipe's smoke command with `{python}` expanded."""
    if recipe.smoke is None:
        return []
    return recipe.expand(recipe.smoke.command)


def smoke_cwd(recipe: Recipe, fallback: Path) -> Path:
    """Where the smoke command runs: the recipe's folder (so relative arguments mean what they
    mean in the recipe), else `fallback` (the run's folder)."""
    return recipe.path.parent.resolve() if recipe.path is not None else fallback


def check_smoke(recipe: Recipe, env: Mapping[str, str] | None = None, *,
                cwd: Path | None = None) -> list[str]:
    """Preflight: the smoke command's executable exists and is executable. Returns the argv.

    Raises CommandNotFound for an executable that is not on PATH or does not exist, and
    PreflightError for one that exists but cannot be executed."""
    argv = smoke_argv(recipe)
    if not argv:
        return argv
    exe = argv[0]
    if os.sep in exe and not os.path.isabs(exe):
        # Relative paths in a recipe are relative to the recipe's folder, where the command runs.
        exe = argv[0] = str(smoke_cwd(recipe, cwd or Path.cwd()) / exe)
    where = f"{recipe.source}: smoke.command"
    if os.sep not in exe:
        if proc.which(exe, env) is None:
            raise CommandNotFound(f"{where}: command not found: {exe!r} (argv: {' '.join(argv)})",
                                  hint=f"install {exe}, put it on PATH, or give its full path")
        return argv
    if not os.path.exists(exe):
        raise CommandNotFound(f"{where}: {exe} does not exist (argv: {' '.join(argv)})",
                              hint='use "{python}" for the environment\'s interpreter')
    if os.path.isdir(exe) or not os.access(exe, os.X_OK):
        raise PreflightError(f"{where}: {exe} is not an executable file")
    return argv


def _rewheel_path(where: Path) -> Path:
    """A folder holding only a link to this `rewheel` package, for the smoke's PYTHONPATH.

    rewheel is not installed in the target environment, yet recipes run
    `{python} -m rewheel.smoke.vllm_init` there. Putting rewheel's own site-packages on the
    path would leak its dependencies into the target; a folder with just `rewheel` does not
    (and the smoke modules import only the standard library and the target's packages)."""
    pkg = Path(__file__).resolve().parent.parent
    d = where / "pythonpath"
    d.mkdir(parents=True, exist_ok=True)
    link = d / "rewheel"
    if not link.is_symlink():
        link.symlink_to(pkg, target_is_directory=True)
    return d


def run_smoke(recipe: Recipe, *, log_path: str | os.PathLike[str],
              on_line: Callable[[str], None] | None = None,
              env: Mapping[str, str] | None = None,
              timeout_s: float | None = None) -> SmokeResult:
    """Run the smoke command; never raises for a failing or hanging command (see SmokeResult).

    The output (stdout and stderr merged) goes line by line to `on_line` and to `log_path`. The
    command runs in the recipe's folder (relative arguments are relative to the recipe, like
    every path in it), or in the log's folder for a bare `--python` target — never in the
    caller's working directory, where `python -m x` could pick up a stray source tree (`./vllm`)
    instead of the installed package.
    """
    log = Path(log_path)
    log.parent.mkdir(parents=True, exist_ok=True)
    if recipe.smoke is None:
        return SmokeResult(ok=True, returncode=None, timed_out=False, seconds=0.0, log_path=None,
                           skipped=True)
    cwd = smoke_cwd(recipe, log.parent.resolve())
    argv = check_smoke(recipe, env, cwd=cwd)
    timeout = float(timeout_s if timeout_s is not None else recipe.smoke.timeout_s)
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"[rewheel] $ {' '.join(argv)}  (timeout {timeout:g}s, "
                f"started {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
    run_env = dict(env if env is not None else os.environ)
    # Python children buffer stdout when it is a pipe; unbuffered, the log shows where a hang is.
    run_env.setdefault("PYTHONUNBUFFERED", "1")
    run_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (run_env.get("PYTHONPATH"), str(_rewheel_path(log.parent))) if p)
    cp = proc.stream(argv, on_line=on_line, timeout=timeout, env=run_env, cwd=cwd,
                     log_path=log)
    ok = cp.returncode == 0 and not cp.timed_out
    with open(log, "a", encoding="utf-8") as f:
        end = "timed out" if cp.timed_out else f"exit status {cp.returncode}"
        f.write(f"[rewheel] smoke {'passed' if ok else 'failed'}: {end} after {cp.seconds:.1f}s\n")
    return SmokeResult(ok=ok, returncode=cp.returncode, timed_out=cp.timed_out,
                       seconds=cp.seconds, log_path=str(log), argv=argv, timeout_s=timeout,
                       tail=cp.stdout.splitlines()[-40:])
