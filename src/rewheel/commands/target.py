"""What every command acts on: a `Target` (a recipe, or a bare `--python` interpreter, with
its environment, its snapshot store and the host the commands act through), and the
refusals a command that changes the environment makes before it touches anything."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rewheel.environment import Environment
from rewheel.host import Host
from rewheel.paths import state_home
from rewheel.recipe import Recipe
from rewheel.snapshot import Store, restore_lanes_setting


Say = Callable[[str], None]


def quiet(_: str) -> None:
    pass


@dataclass
class Target:
    recipe: Recipe
    env: Environment
    store: Store
    # What the commands act through (service manager, uv, smoke runner, fetcher, GPU probe).
    host: Host = field(default_factory=Host.real)

    @property
    def label(self) -> str:
        return self.recipe.source

    @property
    def cli_ref(self) -> str:
        """The target as a command line names it, quoted for the shell (hints are pasted)."""
        import shlex

        return shlex.quote(str(self.recipe.path)) if self.recipe.path else f"--python {shlex.quote(str(self.recipe.python))}"


def open_target(recipe: Recipe, host: Host | None = None) -> Target:
    """The recipe's environment, its store, and the host the commands act through (the
    real one unless a caller hands another). A symlink in the environment's state folder, the
    home's own folders or its lock folder is refused here, before any command writes
    (`owned`: LinkInState, exit 3)."""
    restore_lanes_setting()  # a bad value is refused before any command acts
    from rewheel.owned import check_lock

    env = Environment.inspect(recipe.python)
    store = Store(env.prefix, _checked_home(recipe, env.prefix))  # its state folder: no link (`owned`)
    check_lock(env.prefix)
    return Target(recipe, env, store, host or Host.real())


def _checked_home(recipe: Recipe, prefix: Path) -> Path:
    """The store's folder, refused (exit 2, naming where it came from) when it is a file,
    on a pseudo-filesystem (/proc, /sys), or a world-writable folder without the
    sticky bit; created private (0700) when it does not exist."""
    import os

    from rewheel.paths import ensure_private_dir, refuse_home_inside

    if recipe.store is not None:
        home, what = recipe.store, f"{recipe.source}: snapshots.store"
    else:
        home = state_home()
        what = "REWHEEL_HOME" if os.environ.get("REWHEEL_HOME") else "the state folder"
    refuse_home_inside(home, prefix, what=what)
    return ensure_private_dir(home, what=what)


def refuse_system_interpreter(t: Target) -> None:
    """run, rollback and resume change the environment: a system interpreter's (not a venv,
    not a conda env) only when the recipe says `[environment] system = true`. Exit 2 before
    anything is touched; read-only commands are not asked."""
    refused = t.env.system_refusal(t.recipe)
    if refused is not None:
        raise refused


def refuse_broken_tls(t: Target) -> None:
    """A service's health check needs an HTTP client, and httpx cannot make one while
    SSL_CERT_FILE names nothing: refused (exit 2, naming it) before anything is stopped."""
    if t.recipe.service is not None and t.recipe.service.health_url:
        from rewheel.httpclient import check_tls_env

        check_tls_env()


def service_record(t: Target) -> str:
    """The record of the service rewheel started is one rewheel wrote (ServiceRecordDamaged,
    exit 3, before anything is signalled or a journal opened): what `run`, `rollback` and
    `resume` refuse before they act, and `check` with them (`preflight.target_checks`)."""
    spec = t.recipe.service
    if spec is None:
        return "no service"
    mgr = t.host.manager(spec, t.store.env_dir, t.recipe.python)
    check = getattr(mgr, "check_record", None)
    return str(check()) if check is not None else "kept by its manager"


def target_refusals(t: Target) -> None:
    """The refusals of `preflight.target_checks` a command that reclaims the environment
    (rollback, resume) makes before it takes the lock: a service record rewheel did not write
    (exit 3), before anything is signalled or a journal opened. (An interrupted run is what
    they finish; the state folder was checked by `open_target`.)"""
    service_record(t)
