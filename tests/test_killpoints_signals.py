"""The kill-point fault suite, polite signals (slow; run by `make test` and CI): SIGTERM,
SIGINT and SIGHUP right after every journal record a revert (staged and not), a rollback and
a resume write (the journal's fault hook, `REWHEEL_FAULT_AT=KEY#N`), then `rewheel resume` and
the proof of tests/support_killpoints.py — the environment byte for byte the state before or
after, the service as it was, nothing left.

By default a sample of the boundaries (`support_killpoints.sample`: a spread of at most 4 per
scenario, drawn by the session's seed), each with one of the three signals in turn (TERM, INT,
HUP, TERM, ...) from an offset the seed draws too; `REWHEEL_KILLPOINTS=all` sends each of the
three at every boundary."""

from __future__ import annotations

from pathlib import Path

import pytest

from support_killpoints import SCENARIOS, SIGNALS, Bench, Outcome, mode, prove_scenario, rng, sample

pytestmark = [pytest.mark.slow, pytest.mark.killpoints]

# A revert (staged and not), a rollback, a resume: every boundary of the whole command.
SIGNALLED = ["run-unstaged-reverted", "run-staged-reverted", "rollback", "resume"]


@pytest.mark.parametrize("name", SIGNALLED)
def test_signal_at_every_journal_boundary_then_resume(tmp_path: Path, name: str) -> None:
    def trials(b: Bench) -> list[Outcome]:
        boundaries = b.boundaries()
        assert boundaries
        turn = rng(f"signals-{name}").randrange(len(SIGNALS))
        return [b.signal_at(at, sig) for i, at in enumerate(sample(boundaries, f"signals-{name}"))
                for sig in (SIGNALS if mode() == "all" else (SIGNALS[(turn + i) % len(SIGNALS)],))]

    prove_scenario(tmp_path, SCENARIOS[name], f"signals-{name}", trials)
