"""How the health wait polls (no process: a fake manager, httpx's mock transport, a recorded
sleep): a service that answers at once is seen at once, one that loads for long is asked every
`poll_s`; and the HTTP clients of one process share one TLS context."""

from __future__ import annotations

import itertools
from pathlib import Path

import certifi
import httpx
import pytest

from rewheel import httpclient, proc, service
from rewheel.recipe import ServiceSpec
from rewheel.service import ServiceStatus, wait_ready


class UpManager:
    """A service that stays up (active, never restarted)."""

    def status(self) -> ServiceStatus:
        return ServiceStatus(active=True, state="active", sub_state="running", judged_by="pid")

    def describe(self) -> str:
        return "the toy service"

    def log_location(self, since: float) -> str:
        return "(nowhere)"


def spec() -> ServiceSpec:
    return ServiceSpec(manager="command", start=("x",), health_url="http://127.0.0.1:9/health",
                       ready_timeout_s=900, settle_s=0.0)


def answering_after(n_refused: int) -> tuple[httpx.Client, list[str]]:
    """A client whose health URL answers 503 (loading) `n_refused` times, then 200."""
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(503 if len(asked) <= n_refused else 200)

    return httpx.Client(transport=httpx.MockTransport(handler)), asked


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    gaps: list[float] = []
    monkeypatch.setattr(service.health.time, "sleep", gaps.append)
    return gaps


def test_the_gaps_start_short_and_double_to_the_cap() -> None:
    assert list(itertools.islice(proc.backoff(0.5), 7)) == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.5]
    assert list(itertools.islice(proc.backoff(0.02), 3)) == [0.02, 0.02, 0.02]
    assert list(itertools.islice(proc.backoff(2.0, first_s=0.3), 4)) == [0.3, 0.6, 1.2, 2.0]


def test_a_service_that_answers_at_once_is_not_waited_for(slept: list[float]) -> None:
    client, asked = answering_after(0)
    result = wait_ready(UpManager(), spec(), client=client, started_at=service.health.time.time())
    assert result.ok and asked == ["/health", "/health"]  # the first 200, then the settle check
    assert slept == []


def test_a_service_still_loading_is_asked_soon_then_every_poll_s(slept: list[float]) -> None:
    client, asked = answering_after(7)
    result = wait_ready(UpManager(), spec(), client=client, started_at=service.health.time.time(), poll_s=0.5)
    assert result.ok
    # 7 answers of 503, each followed by a gap: 50 ms first (a service up within a fraction of
    # a second costs no half-second of downtime), then doubling to the half-second cap.
    assert slept == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.5]
    assert len(asked) == 7 + 1 + 1


def test_the_tls_context_is_made_once_per_process_and_per_ca_setting(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    made: list[object] = []
    real = httpx.create_ssl_context

    def counting(*a: object, **kw: object) -> object:
        made.append(1)
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(httpclient.httpx, "create_ssl_context", counting)
    httpclient._tls_context.cache_clear()
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    clients = [httpclient.client(timeout=1.0) for _ in range(4)]
    assert len(made) == 1
    # A CA bundle named later is honoured (its own context), not served from the cache.
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(Path(certifi.where()).read_bytes())
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    clients.append(httpclient.client(timeout=1.0))
    assert len(made) == 2
    # An explicit `verify` is left alone.
    clients.append(httpclient.client(verify=False))
    assert len(made) == 2
    for c in clients:
        c.close()
    httpclient._tls_context.cache_clear()
