"""`rewheel board`: the state rewheel keeps, as a static HTML site people look at — per
environment the timeline of its runs, rollbacks and resumes and its snapshots; per run its
versions, source diff, patches, root cause and step timings; the nightlies `ci` qualified
and the first bad builds `bisect` found; a fleet's rollout from its hosts' run reports.

- `model`  — the page models, read from the state through the modules that own it
- `diffs`  — a run's source diff as pages show it (paged, bounded)
- `charts` — the SVG charts (pygal)
- `render` — the templates (Jinja2, autoescaped; `templates/`) and the board's folder

`write_board` is the entry point (docs/board.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from rewheel.board.model import Board, EnvView, now, read_env, read_fleet
from rewheel.board.render import BoardResult, write
from rewheel.environment import Environment, inspect_prefix
from rewheel.errors import RewheelError
from rewheel.paths import known_environments, state_home
from rewheel.snapshot import Store

if TYPE_CHECKING:
    from rewheel.commands.target import Target

DEFAULT_WAVES = "1,30%,100%"  # the rollout playbook's default `serial`


def write_board(out: Path, *, target: Target | None = None, home: Path | None = None,
                fleet: Path | None = None, expect: list[str] | None = None,
                waves: str = DEFAULT_WAVES) -> BoardResult:
    """Write the board of one target (its environment, the nightlies and bisections of its
    recipe) or, without one, of every environment under the home (`home`, default the state
    home), into `out`. `fleet`: a folder of hosts' run reports (`HOST.json`), with
    `expect`/`waves` as `fleet-report --expect` and the playbook's `rewheel_waves`."""
    from rewheel import bisection, qualify

    envs: list[EnvView] = []
    live: dict[str, Environment | None] = {}
    fleet_view = read_fleet(fleet, expect=expect, waves=waves) if fleet is not None else None
    if target is not None:
        home = target.store.home
        envs.append(read_env(target.store, live_new=True, python=str(target.env.python)))
        live[target.store.env_dir.name] = target.env
        scope = f"{target.recipe.name} ({target.env.prefix})"
    else:
        home = home or state_home()
        for env_dir, prefix in known_environments(home):
            try:
                env: Environment | None = inspect_prefix(prefix)
            except (RewheelError, OSError):
                env = None  # its snapshots and journals still show; its diffs need the interpreter
            envs.append(read_env(Store.of_folder(env_dir, prefix, home), live_new=env is not None,
                                 python=str(env.python) if env else None))
            live[env_dir.name] = env
        scope = f"every environment under {home}"
    nightlies = qualify.verdicts(home)
    bisections = bisection.journaled(home)
    if target is not None:
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", target.recipe.name).strip("-") or "recipe"
        nightlies = [r for r in nightlies if r.recipe_name == target.recipe.name]
        bisections = [b for b in bisections if Path(b.state_dir or "").name.startswith(slug + "-")]
    board = Board(home, now(), scope, envs, nightlies[::-1], bisections[::-1], fleet_view)
    return write(board, out, envs_live=live)


__all__ = ["Board", "BoardResult", "DEFAULT_WAVES", "write_board"]
