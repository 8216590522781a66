"""`make bench`'s knobs read from the environment (devtools/bench/harness.py)."""

from __future__ import annotations

import pytest

from devtools.bench.harness import SKIPPABLE, BenchConfig


@pytest.mark.parametrize("raw, want", [("", set()), ("downtime", {"downtime"}),
                                       ("startup,board", {"startup", "board"}),
                                       (" downtime  board ", {"downtime", "board"})])
def test_bench_skip_names_sections(monkeypatch: pytest.MonkeyPatch, raw: str, want: set[str]) -> None:
    monkeypatch.setenv("BENCH_SKIP", raw)
    assert BenchConfig.from_env().skip == want
    assert want <= SKIPPABLE


@pytest.mark.parametrize("raw", ["rollback", "downtime,snapshot", "all"])
def test_bench_skip_refuses_a_name_it_does_not_know(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    """A row that decides a target is never left out by a typo's luck: the run stops first."""
    monkeypatch.setenv("BENCH_SKIP", raw)
    with pytest.raises(SystemExit, match="BENCH_SKIP"):
        BenchConfig.from_env()
