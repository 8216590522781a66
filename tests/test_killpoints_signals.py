"""The kill-point fault suite, polite signals (slow; run by `make test` and CI): SIGTERM,
SIGINT and SIGHUP right after every journal record a revert (staged and not), a rollback and
a resume write (the journal's fault hook, `REWHEEL_FAULT_AT=KEY#N`), then `rewheel resume` and
the proof of tests/support_killpoints.py — the environment byte for byte the state before or
after, the service as it was, nothing left.

By default each boundary gets one of the three signals in turn (TERM, INT, HUP, TERM, ...);
`REWHEEL_KILLPOINTS=all` sends each of the three at every boundary."""

from __future__ import annotations

from pathlib import Path

import pytest

from support_killpoints import SIGNALS, Bench, Scenario, mode, record, summary

pytestmark = [pytest.mark.slow, pytest.mark.killpoints]

SCENARIOS = [
    Scenario("revert-unstaged", "run", "smoke-fails", staged=False),
    Scenario("revert-staged", "run", "service-fails", staged=True),
    Scenario("rollback", "rollback", "good", staged=True),
    Scenario("resume", "resume", "smoke-fails", staged=False, interrupted_at="step:smoke"),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_signal_at_every_journal_boundary_then_resume(tmp_path: Path, scenario: Scenario) -> None:
    b = Bench(tmp_path, scenario)
    try:
        assert not b.reference_problems, b.reference_problems
        boundaries = b.boundaries()
        assert boundaries
        trials = [(at, sig) for i, at in enumerate(boundaries)
                  for sig in (SIGNALS if mode() == "all" else (SIGNALS[i % len(SIGNALS)],))]
        outcomes = [b.signal_at(at, sig) for at, sig in trials]
        record(f"signals-{scenario.name}", outcomes)
        assert not [o for o in outcomes if not o.exact], summary(scenario.name, outcomes)
    finally:
        b.close()
