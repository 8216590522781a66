"""The bisect search alone, with a fake tester: which builds it tests, in what order, and what
it concludes — the ends checked first, halving between the last good and the first bad build,
builds that cannot be installed skipped (and reported when they hide the first bad one)."""

from __future__ import annotations

import pytest

from rewheel.bisection import BisectResult, Build, Verdict, search


class FakeTester:
    """Builds 0..N-1; `bad_from` is the first bad one; `skip` cannot be installed."""

    def __init__(self, n: int, bad_from: int, skip: frozenset[int] = frozenset(), broken_ends: str = "") -> None:
        self.builds = [Build(f"1.0.dev{i}") for i in range(n)]
        self.bad_from, self.skip, self.broken_ends = bad_from, skip, broken_ends
        self.tested: list[int] = []

    def test(self, build: Build) -> Verdict:
        i = self.builds.index(build)
        self.tested.append(i)
        if i in self.skip:
            return Verdict(build, "skip", "uv could not install it")
        return Verdict(build, "bad" if i >= self.bad_from else "good", "smoke test")


def run(t: FakeTester) -> BisectResult:
    res = BisectResult("?", "recipe.toml", "vllm", t.builds[0].label, t.builds[-1].label, "versions")
    search(t, res, t.builds)
    return res


@pytest.mark.parametrize("n, bad_from", [(2, 1), (3, 1), (3, 2), (32, 17), (100, 1), (100, 99), (31, 16)])
def test_the_first_bad_build_is_found_in_log2_tests(n: int, bad_from: int) -> None:
    t = FakeTester(n, bad_from)
    res = run(t)
    assert (res.status, res.first_bad, res.last_good) == ("found", t.builds[bad_from], t.builds[bad_from - 1])
    assert t.tested[:2] == [n - 1, 0]  # the ends first
    assert len(t.tested) <= 2 + (n - 2).bit_length()
    assert len(set(t.tested)) == len(t.tested)  # no build tested twice


def test_an_untestable_build_is_skipped_and_the_search_goes_on() -> None:
    t = FakeTester(16, 12, skip=frozenset({7}))
    res = run(t)
    assert (res.status, res.first_bad, res.last_good) == ("found", t.builds[12], t.builds[11])
    assert t.tested == [15, 0, 7, 8, 11, 13, 12]  # 7 could not be installed: its neighbour instead


def test_skipped_builds_next_to_the_first_bad_one_make_it_ambiguous() -> None:
    t = FakeTester(10, 6, skip=frozenset({4, 5}))
    res = run(t)
    assert res.status == "ambiguous"
    assert res.first_bad == t.builds[6] and res.last_good == t.builds[3]
    assert res.suspects == [t.builds[4], t.builds[5], t.builds[6]]
    assert "could not be installed" in res.message


@pytest.mark.parametrize("bad_from, skip, status", [
    (20, frozenset(), "bad-is-good"),         # the "bad" build passes
    (0, frozenset(), "good-is-bad"),          # the "good" build fails too
    (5, frozenset({9}), "untestable"),        # the bad end cannot be installed
    (5, frozenset({0}), "untestable"),        # the good end cannot be installed
])
def test_ends_that_do_not_hold_stop_the_search(bad_from: int, skip: frozenset[int], status: str) -> None:
    t = FakeTester(10, bad_from, skip=skip)
    res = run(t)
    assert res.status == status and res.first_bad is None
    assert len(t.tested) <= 2
