"""Hypothesis strategies shared by the fuzz tests: any JSON/YAML-able value, scalars included."""

from __future__ import annotations

from hypothesis import strategies as st


def documents(text_size: int, branch: int, leaves: int) -> st.SearchStrategy:
    """Nested lists and string-keyed objects over every scalar JSON and YAML can carry, NaN, infinities
    and integers beyond 64 bits included (the values a validator is most likely to mishandle)."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=text_size),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=branch),
            st.dictionaries(st.text(max_size=text_size // 2), inner, max_size=branch),
        ),
        max_leaves=leaves,
    )
