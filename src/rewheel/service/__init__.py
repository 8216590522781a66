"""The service an environment serves: stopping it, starting it, and proving it healthy; a package
whose files name their parts (`common`: the protocol, the states and the service's processes;
`systemd`, `command`: the two managers; `health`: readiness). `make_manager` is here.

Two managers share one protocol (`ServiceManager`):

- `SystemdManager(unit)` drives `systemctl` and reads `journalctl`, parsing only their
  machine forms (`systemctl show`'s `Key=Value` lines, `journalctl -o json`).
- `CommandManager(start, stop, state_dir)` runs the recipe's own argv lists: it starts the
  service detached in its own session, appends its output to `state_dir/service.log`, and
  records its pid durably in `state_dir/service.json` so a later rewheel process (resume,
  rollback) can still stop it — and, before the start, the token the service's environment
  carries (`REWHEEL_SERVICE_TOKEN`), by which it is found when rewheel died in between. A
  service it did not start (or whose start command daemonized) is judged by its health URL answering, and stopped through the recipe's `stop`.

"Stopped" means inactive and every process of the service gone (a vLLM server's worker
processes hold GPU memory until they exit). "Started" is not "ready": `wait_ready` polls the
health URL, fails fast when the service dies or restart-loops, checks that it stays up for
`settle_s`, and runs the recipe's probe.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rewheel.errors import ServiceError
from rewheel.recipe import ServiceSpec
from rewheel.service.command import CommandManager, record_problem
from rewheel.service.common import (
    DOWN_STATES,
    JOURNALCTL,
    SHOW_PROPERTIES,
    SYSTEMCTL,
    TOKEN_VAR,
    HealthCheckFailed,
    HealthResult,
    ServiceManager,
    ServiceStatus,
)
from rewheel.service.health import wait_ready
from rewheel.service.systemd import SystemdManager

__all__ = [
    "CommandManager",
    "DOWN_STATES",
    "HealthCheckFailed",
    "HealthResult",
    "JOURNALCTL",
    "SHOW_PROPERTIES",
    "SYSTEMCTL",
    "ServiceManager",
    "ServiceStatus",
    "SystemdManager",
    "TOKEN_VAR",
    "make_manager",
    "record_problem",
    "wait_ready",
]


def make_manager(spec: ServiceSpec, state_dir: Path, *, python: Path | str | None = None) -> ServiceManager:
    """The manager a recipe's [service] asks for. `python` fills the `{python}` template in
    the command manager's argv lists."""
    if spec.manager == "systemd":
        if not spec.unit:
            raise ServiceError('service.unit is required with manager = "systemd"')
        return SystemdManager(spec.unit, start_timeout_s=float(spec.ready_timeout_s))
    if spec.manager == "command":
        def expand(argv: Sequence[str]) -> list[str]:
            return [a.replace("{python}", str(python)) if python is not None else a for a in argv]
        return CommandManager(expand(spec.start), expand(spec.stop), state_dir,
                              health_url=spec.health_url,
                              ready_timeout_s=float(spec.ready_timeout_s))
    raise ServiceError(f'service.manager: expected "systemd" or "command", got "{spec.manager}"')
