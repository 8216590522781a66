"""The short cuts `rewheel diff` takes on a large upgrade (issue 44), each against the plain
way it replaces, swept with Hypothesis: the lines two versions share cut off before they are
split; a side counted as bytes without decoding it; the manifest read from its columns; the
RECORD that proves a live file, its hash decoded only then. End to end (a real environment,
the walk in a second process): tests/test_diff_counts.py."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rewheel.diff import owners as diff_owners
from rewheel.diff import sides as diff_sides
from rewheel import texts
from rewheel.environment import Distribution, RecordEntry
from rewheel.snapshot import Manifest
from rewheel.snapshot.tree import Root, record_index
from rewheel.texts import as_text, count_changed_lines, splits_like_bytes


def multiset_counts(old: str | bytes | None, new: str | bytes | None) -> tuple[int, int]:
    """(added, removed) by definition: the multiset difference of the two versions' lines."""
    a = Counter(old.splitlines(keepends=True)) if old else Counter()
    b = Counter(new.splitlines(keepends=True)) if new else Counter()
    return sum((b - a).values()), sum((a - b).values())


# Texts made of a few lines that repeat, with every kind of line break str and bytes split at
# (CRLF split across the cut, a form feed, U+0085, U+2028, a last line without one).
PIECES = ["a", "b", "x = 1", "", "é", "\n", "\r", "\r\n", "\x0c", "\x85", "\u2028", "\n\n"]
lines = st.lists(st.sampled_from(PIECES), max_size=30).map("".join)


@st.composite
def versions(draw: st.DrawFn) -> tuple[str, str]:
    """Two versions of a text that share a beginning and an end, as releases do."""
    head, tail, mid_a, mid_b = draw(lines), draw(lines), draw(lines), draw(lines)
    return head + mid_a + tail, head + mid_b + tail


@settings(max_examples=400, deadline=None)
@given(versions())
def test_counts_with_shared_lines_cut_off_are_the_multiset_difference(pair: tuple[str, str]) -> None:
    old, new = pair
    assert count_changed_lines(old, new) == multiset_counts(old, new)
    if splits_like_bytes(old) and splits_like_bytes(new):
        assert count_changed_lines(old.encode(), new.encode()) == multiset_counts(old, new)


@settings(max_examples=300, deadline=None)
@given(lines)
def test_lines_are_counted_as_they_are_split(text: str) -> None:
    """An added or removed file's lines, counted without splitting it."""
    assert texts._nlines(text) == len(text.splitlines())
    if splits_like_bytes(text):
        assert texts._nlines(text.encode()) == len(text.encode().splitlines())


@settings(max_examples=250, deadline=None)
@given(versions())
def test_what_is_cut_off_is_the_same_whole_lines_on_both_sides(pair: tuple[str, str]) -> None:
    for old, new in (pair, (pair[0].encode(), pair[1].encode())):
        mid_old, mid_new = texts._trim_common_lines(old, new)  # type: ignore[type-var]
        cut = len(old) - len(mid_old)
        assert cut == len(new) - len(mid_new)
        nl = old[:0] + ("\n" if isinstance(old, str) else b"\n")  # type: ignore[operator]
        assert any(old[:h] == new[:h] and old[h:h + len(mid_old)] == mid_old and new[h:h + len(mid_new)] == mid_new
                   and old[h + len(mid_old):] == new[h + len(mid_new):]
                   and (h == 0 or old[h - 1:h] == nl) and (h == cut or old[h + len(mid_old) - 1:h + len(mid_old)] == nl)
                   for h in range(cut + 1))


sides = st.one_of(
    st.binary(max_size=200),
    lines.map(lambda t: t.encode()),
    st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"\xff\xfe", b"abc\0def", "ok\x1d".encode(), "é\u2029".encode(), b"\xc3"]),
)


@settings(max_examples=400, deadline=None)
@given(sides)
def test_a_side_is_counted_as_bytes_exactly_where_its_text_splits_like_them(data: bytes) -> None:
    text = as_text(data)
    got = texts.countable(data)
    if text is None:
        assert got is None
    elif splits_like_bytes(text):
        assert got is data
    else:
        assert got == text


def test_a_large_side_or_a_nul_in_its_head_is_binary() -> None:
    assert texts.countable(b"x" * (texts.TEXT_LIMIT + 1)) is None
    assert texts.countable(b"abc\0" + b"x" * 10) is None
    assert texts.countable(b"x" * 9000 + b"\0") == b"x" * 9000 + b"\0"  # only the head is looked at


# --------------------------------------------------------------------------------------
# The manifest's files, from its columns
# --------------------------------------------------------------------------------------
names = st.text(alphabet="abé_.-", min_size=1, max_size=6).filter(lambda n: n not in (".", ".."))


entries = st.tuples(st.integers(0, 1), st.lists(names, min_size=1, max_size=3).map("/".join), st.sampled_from("fffdlo"),
                    st.integers(0, 0o777), st.integers(0, 10**9), st.integers(0, 2**62),
                    st.sampled_from([None, "a" * 64, "b" * 64]), st.sampled_from(["link", "copy", None]),
                    st.sampled_from(["x", "../y"]))
manifests = st.lists(entries, max_size=25, unique_by=lambda e: (e[0], e[1])).map(
    lambda es: Manifest.of([Root("/env", True), Root("/elsewhere/site", True)],
                           [[ri, path, kind, mode, size, mtime, sha if kind == "f" else None, stored,
                             target if kind == "l" else None, None]
                            for ri, path, kind, mode, size, mtime, sha, stored, target in es], None))


@settings(max_examples=150, deadline=None)
@given(manifests)
def test_the_manifest_read_from_its_columns_is_read_from_its_entries(man: Manifest) -> None:
    want, want_mtimes = {}, {}
    for e in man.entries:
        if e.kind in ("f", "l"):
            full = man.roots[e.root].path.rstrip("/") + "/" + e.path
            want[full] = (e.kind, e.mode, e.size, e.sha256, e.target)
            if e.kind == "f":
                want_mtimes[full] = e.mtime_ns
    mtimes: dict[str, int] = {}
    got = diff_sides._manifest_items(man, mtimes)
    assert {p: (i.kind, i.mode, i.size, i.sha, i.target) for p, i in got.items()} == want
    assert mtimes == want_mtimes
    assert diff_owners._record_files(man) == [(e.root, e.path) for e in man.entries
                                              if e.kind == "f" and e.path.endswith(".dist-info/RECORD")]


def test_record_files_are_found_in_their_folders() -> None:
    man = Manifest.of([Root("/env", True)], [
        [0, "lib/site/a-1.dist-info/RECORD", "f", 0o644, 1, 1, "c" * 64, "copy", None, None],
        [0, "lib/site/b-1.dist-info/RECORD", "l", 0o777, 0, 0, None, None, "x", None],  # a symlink: no
        [0, "lib/site/c-1.dist-info/METADATA", "f", 0o644, 1, 1, "c" * 64, "copy", None, None],
        [0, "lib/site/RECORD", "f", 0o644, 1, 1, "c" * 64, "copy", None, None],  # not in a .dist-info
    ], None)
    assert diff_owners._record_files(man) == [(0, "lib/site/a-1.dist-info/RECORD")]


# --------------------------------------------------------------------------------------
# The RECORD that proves a live file
# --------------------------------------------------------------------------------------
def fake_dist(name: str, installed: int, paths: list[str], tag: str) -> Distribution:
    d = Distribution(name=name, display_name=name, version=None, version_text="1", dist_info=Path(f"/x/{name}.dist-info"),
                     site=Path("/x"))
    # (cached properties, set as they would be read: no file behind them)
    d.__dict__["install_time_ns"] = installed
    d.__dict__["record"] = [RecordEntry(p, f"sha256={tag}{i}", i) for i, p in enumerate(paths)]
    return d


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.lists(st.sampled_from("pqrst"), max_size=5, unique=True)),
                max_size=6))
def test_the_owner_installed_last_proves_a_path_as_record_index_says(spec: list[tuple[int, list[str]]]) -> None:
    dists = [fake_dist(f"d{i}", t, [f"/x/{p}" for p in paths], f"D{i}_") for i, (t, paths) in enumerate(spec)]
    got = diff_owners._record_owners(dists)
    want = record_index(dists)
    assert got.keys() == want.keys()
    for path, (entry, installed) in got.items():
        assert (entry.sha256_hex, entry.size, installed) == want[path]


def test_a_tie_goes_to_the_later_distribution() -> None:
    a, b = fake_dist("a", 5, ["/x/p"], "A"), fake_dist("b", 5, ["/x/p"], "B")
    assert diff_owners._record_owners([a, b])["/x/p"][0].hash == "sha256=B0"
    assert diff_owners._record_owners([b, a])["/x/p"][0].hash == "sha256=A0"
    newer = fake_dist("n", 9, ["/x/p"], "N")
    assert all(diff_owners._record_owners(list(order))["/x/p"][0].hash == "sha256=N0"
               for order in itertools.permutations([a, b, newer]))
