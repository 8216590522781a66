"""The fault suites' sample (tests/support_killpoints.py `sample`): a spread over the whole
command each run, every point over successive seeds, the same choice for the same seed."""

from __future__ import annotations

import pytest

from support_killpoints import DEFAULT_LIMIT, sample

POINTS = list(range(150))


@pytest.fixture(autouse=True)
def _default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REWHEEL_KILLPOINTS", raising=False)
    monkeypatch.setenv("REWHEEL_FAULT_SEED", "7")


def test_a_sample_is_an_even_spread_ending_at_the_last_point() -> None:
    picked = sample(POINTS, "run-staged-kept")
    k = -(-len(POINTS) // DEFAULT_LIMIT)
    assert picked[-1] == POINTS[-1]
    body = picked[:-1] if picked[-2] + k != picked[-1] else picked
    assert all(b - a == k for a, b in zip(body, body[1:], strict=False))
    assert picked[0] < k and len(picked) <= DEFAULT_LIMIT + 1


def test_the_same_seed_and_scenario_choose_the_same_points(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sample(POINTS, "rollback") == sample(POINTS, "rollback")
    firsts = set()
    for s in range(40):
        monkeypatch.setenv("REWHEEL_FAULT_SEED", str(s))
        firsts.add(sample(POINTS, "rollback")[0])
    assert len(firsts) > 5  # the offset moves with the seed


def test_successive_seeds_reach_every_point(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: set[int] = set()
    for s in range(500):
        monkeypatch.setenv("REWHEEL_FAULT_SEED", str(s))
        seen.update(sample(POINTS, "resume"))
    assert seen == set(POINTS)


def test_the_knob_sets_the_count_or_takes_every_point(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REWHEEL_KILLPOINTS", "3")
    assert len(sample(POINTS, "resume")) <= 4
    monkeypatch.setenv("REWHEEL_KILLPOINTS", "all")
    assert sample(POINTS, "resume") == POINTS
    monkeypatch.delenv("REWHEEL_KILLPOINTS")
    assert sample(POINTS[:DEFAULT_LIMIT], "resume") == POINTS[:DEFAULT_LIMIT]  # no more than the limit: all
