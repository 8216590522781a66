"""`--json` output made faster (issue 44) is still, character for character, what
`json.dumps(doc, indent=2, default=str)` writes: swept with Hypothesis over documents of every
shape, and on the shapes the commands write."""

from __future__ import annotations

import json
import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rewheel.jsonout import dumps

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(),
                    st.sampled_from([Path("/a/b"), math.inf, -0.0, 10**30, "\u2028\0\"\\é"]))
keys = st.one_of(st.text(max_size=8), st.integers(-3, 3), st.booleans(), st.none(), st.floats(width=16))
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.lists(inner, max_size=3).map(tuple),
                            st.dictionaries(st.text(max_size=8), inner, max_size=5),
                            st.dictionaries(keys, inner, max_size=3)),
    max_leaves=40)


def want(doc: object) -> str:
    return json.dumps(doc, indent=2, default=str)


@settings(max_examples=500, deadline=None)
@given(documents)
def test_every_document_is_written_as_json_dumps_writes_it(doc: object) -> None:
    assert dumps(doc) == want(doc)


def test_the_shapes_the_commands_write() -> None:
    diff_file = {"path": "vllm/x.py", "change": "changed", "added_lines": 3, "removed_lines": None,
                 "binary": False, "old_mode": "0o644", "note": None, "diff": "--- a/x\n+++ b/x\n"}
    doc = {"old": "ab12", "new": "live", "packages": [{"name": "vllm", "old": "0.32.0", "new": "0.33.0"}],
           "files": [diff_file] * 3, "unchanged_packages": 187, "stats": {"seconds": 4.2},
           "filters": {"package": None, "path": None}, "empty": [], "nested": {"a": [[], {}, [1, [2, {"b": ()}]]]}}
    assert dumps(doc) == want(doc)
    assert dumps({"patches": [], "damaged_snapshots": [{"id": "x", "files": ["a", "b"]}]}) == want(
        {"patches": [], "damaged_snapshots": [{"id": "x", "files": ["a", "b"]}]})
    assert dumps([Path("/p"), {1: 2}]) == want([Path("/p"), {1: 2}])
