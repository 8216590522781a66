"""Readiness: `wait_ready` polls the health URL after a start, fails fast when the service dies or
restart-loops, checks that it stays up for `settle_s`, and runs the recipe's probe."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from rewheel import httpclient, proc
from rewheel.recipe import ServiceSpec
from rewheel.service.common import DOWN_STATES, HealthCheckFailed, HealthResult, ServiceManager


def _get(client: httpx.Client, url: str, timeout: float) -> tuple[int | None, str, str]:
    """(status code or None, body, a short description of the answer)."""
    try:
        r = client.get(url, timeout=timeout)
    except httpx.TimeoutException:
        return None, "", f"no answer within {timeout:g}s"
    except httpx.HTTPError as exc:
        return None, "", f"{type(exc).__name__}: {exc}"
    body = r.text
    snippet = " ".join(body.split())[:200]
    return r.status_code, body, f"HTTP {r.status_code}" + (f": {snippet}" if snippet else "")


def wait_ready(manager: ServiceManager, spec: ServiceSpec, *, client: httpx.Client | None = None,
               started_at: float, on_progress: Callable[[str], None] | None = None,
               poll_s: float = 0.5) -> HealthResult:
    """Wait until the started service is healthy, stays up, and passes its probe.

    `started_at` (epoch seconds) is when `start()` was called: the ready timeout counts from
    there and the log hint points there. Raises HealthCheckFailed (a ServiceError) at once when
    the service becomes inactive/failed or its restart counter grows; after
    `spec.ready_timeout_s` without a 200 from `spec.health_url`; when it dies or restarts
    within `spec.settle_s` after its first 200; or when the probe fails.
    """
    own_client = client is None
    http = client if client is not None else httpclient.client(timeout=10.0)
    mono0 = time.monotonic() - max(0.0, time.time() - started_at)
    deadline = mono0 + spec.ready_timeout_s
    what = manager.describe()
    log_hint = f"the service's log: {manager.log_location(started_at)}"
    last = ""

    def elapsed() -> float:
        return time.monotonic() - mono0

    def progress(text: str) -> None:
        nonlocal last
        if on_progress and text != last:
            on_progress(text)
        last = text

    def fail(message: str, detail: str, n_restarts: int, hint: str = log_hint) -> HealthCheckFailed:
        result = HealthResult(ok=False, seconds=elapsed(), detail=detail, health_url=spec.health_url,
                              probe_url=spec.probe.url if spec.probe else None, n_restarts=n_restarts)
        return HealthCheckFailed(message, result, hint=hint)

    baseline = manager.status().n_restarts

    def liveness(phase: str) -> int:
        st = manager.status()
        if st.n_restarts > baseline:
            raise fail(f"{what} is restart-looping: it restarted {st.n_restarts - baseline} time(s) "
                       f"{phase} (NRestarts {baseline} -> {st.n_restarts}, now {st.state}/{st.sub_state}"
                       f", Result={st.result})", f"restarted {st.n_restarts - baseline} time(s)",
                       st.n_restarts)
        code = f", exit status {st.exit_status}" if st.exit_status not in (None, 0) else ""
        if st.sub_state == "auto-restart":
            raise fail(f"{what} is restart-looping: its main process exited {phase} and it is "
                       f"waiting to be restarted ({st.state}/{st.sub_state}, Result={st.result}"
                       f"{code}, NRestarts={st.n_restarts})", "restart-looping", st.n_restarts)
        # systemd 252 ends a Restart=always unit at its start limit as failed with the last
        # exit's Result (exit-code), not start-limit-hit: a failed unit that restarted gave up.
        if st.result == "start-limit-hit" or (st.state == "failed" and st.n_restarts > 0):
            raise fail(f"{what} is restart-looping: systemd stopped restarting it at its start limit "
                       f"({st.state}/{st.sub_state}, Result={st.result}, NRestarts={st.n_restarts}{code})",
                       "restart-looping", st.n_restarts)
        if st.state in DOWN_STATES:
            tail_of = getattr(manager, "output_tail", None)
            tail = tail_of() if callable(tail_of) else []
            said = f"; its output ended with: {' | '.join(tail)}" if tail else ""
            # Under the command manager in its own words (its process exited), not systemd's.
            how = (f"it is {st.state}/{st.sub_state} (Result={st.result or '?'}{code})"
                   if st.judged_by in ("systemd", "") else
                   f"its process was killed by signal {st.exit_status}" if st.result == "signal" else
                   f"its process ended with exit status {st.exit_status}" if st.exit_status is not None else
                   "its process is gone")
            raise fail(f"{what} died {phase}: {how} {elapsed():.0f}s after start{said}",
                       f"service {st.state}", st.n_restarts)
        return st.n_restarts

    try:
        healthy_detail = "no health_url: liveness only"
        first_healthy: float | None = None
        if spec.health_url:
            gaps = proc.backoff(poll_s)
            while True:
                restarts = liveness("while starting")
                remaining = deadline - time.monotonic()
                code, _body, said = _get(http, spec.health_url, max(0.5, min(10.0, remaining)))
                if code == 200:
                    first_healthy = elapsed()
                    healthy_detail = f"{spec.health_url} answered 200 after {first_healthy:.1f}s"
                    break
                progress(f"waiting for {spec.health_url}: {said}")
                if time.monotonic() >= deadline:
                    raise fail(f"{what} did not become healthy within {spec.ready_timeout_s}s: "
                               f"{spec.health_url} last answered: {said}", f"not healthy: {said}",
                               restarts,
                               hint=f"raise service.ready_timeout_s if the model needs longer to "
                                    f"load; {log_hint}")
                time.sleep(max(0.0, min(next(gaps), deadline - time.monotonic())))
        # Up once is not up: a server that crashes right after binding its port would pass.
        progress(f"{healthy_detail}; watching it for {spec.settle_s:g}s")
        settle_end = time.monotonic() + spec.settle_s
        while True:
            restarts = liveness("right after becoming healthy" if spec.health_url else "while starting")
            if spec.health_url:
                code, _body, said = _get(http, spec.health_url, 10.0)
                if code != 200:
                    # A crash closes the port a moment before systemd records it: name the
                    # crash (or the restart loop) rather than the refused connection.
                    time.sleep(min(poll_s, 1.0))
                    liveness("right after becoming healthy")
                    raise fail(f"{what} stopped being healthy right after its first 200: "
                               f"{spec.health_url} answered: {said}", f"unhealthy: {said}", restarts)
            if time.monotonic() >= settle_end:
                break
            time.sleep(max(0.0, min(poll_s, settle_end - time.monotonic())))
        detail = healthy_detail
        if spec.probe:
            code, body, said = _get(http, spec.probe.url, 60.0)
            if code != 200:
                raise fail(f"probe {spec.probe.url} failed: {said}", f"probe failed: {said}", restarts)
            if spec.probe.expect is not None and spec.probe.expect not in body:
                raise fail(f"probe {spec.probe.url} answered 200 but without {spec.probe.expect!r}: "
                           f"{said}", f"probe: {spec.probe.expect!r} missing", restarts,
                           hint="the service runs, but not what the recipe expects (service.probe.expect)")
            detail += f"; probe {spec.probe.url} ok"
        return HealthResult(ok=True, seconds=elapsed(), detail=detail, health_url=spec.health_url,
                            probe_url=spec.probe.url if spec.probe else None, n_restarts=restarts,
                            first_healthy_s=first_healthy)
    finally:
        if own_client:
            http.close()
