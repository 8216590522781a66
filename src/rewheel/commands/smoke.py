"""`smoke`: only the smoke test and the health check, against the live environment; nothing
is changed."""

from __future__ import annotations

import time

from rewheel import journal
from rewheel.commands.results import SmokeReport
from rewheel.commands.target import Say, Target, quiet


def smoke_only(t: Target, *, on_output: Say = quiet, say: Say = quiet) -> SmokeReport:
    from rewheel import diagnose
    from rewheel.errors import ServiceError

    journal.refuse_if_interrupted(t.store.env_dir, t.cli_ref)
    rep = SmokeReport(ok=True)
    package = t.env.import_name(t.recipe.install.names)
    if t.recipe.smoke is not None:
        logs = t.store.env_dir / "smoke"
        logs.mkdir(exist_ok=True)
        log = logs / (time.strftime("%Y%m%d-%H%M%S") + ".log")
        res = t.host.smoke(t.recipe, log_path=log, on_line=on_output)
        rep.smoke = res
        if not res.ok:
            rep.ok = False
            rep.root_cause = diagnose.analyse_file(log, package=package).root
    if t.recipe.service is not None:
        mgr = t.host.manager(t.recipe.service, t.store.env_dir, t.recipe.python)
        st = mgr.status()
        if not st.up:
            # Simply not running: said so, never "died while starting" with the lines of its
            # last (normal) stop, nor a hint naming a log that may not exist.
            from rewheel.service import HealthResult

            rep.ok = False
            ended = (f"; its last run ended with exit status {st.exit_status}"
                     if st.state == "failed" and st.exit_status not in (None, 0) else "")
            rep.error = (f"{mgr.describe()} is not running ({st.state}{ended}): its health was not checked; "
                         "`rewheel smoke` checks the service as it runs — start it, then run it again")
            spec = t.recipe.service
            rep.health = HealthResult(ok=False, seconds=0.0, detail=f"not running ({st.state}): not checked",
                                      health_url=spec.health_url, probe_url=spec.probe.url if spec.probe else None)
            return rep
        try:
            rep.health = t.host.wait_ready(mgr, t.recipe.service, client=t.host.client,
                                           started_at=time.time(), on_progress=say)
        except ServiceError as exc:
            rep.ok = False
            rep.error = str(exc)
            result = getattr(exc, "result", None)  # HealthCheckFailed carries what it saw
            rep.health = result
    return rep
