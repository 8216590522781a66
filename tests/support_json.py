"""Any JSON value, as Hypothesis draws it: what a reader of another program's JSON must survive."""

from __future__ import annotations

from hypothesis import strategies as st

SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
JSON = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                                         max_size=4), max_leaves=10)
