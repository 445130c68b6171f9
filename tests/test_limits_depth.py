"""The nesting-depth cap's fast path (``trace.limits.text_depth_exceeds``) cuts strings out of JSON
text without a regex; a property test holds it to the obvious version (parse, then measure) on
JSON with quotes, backslashes and brackets inside its strings."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from stepfork_otel.trace.limits import text_depth_exceeds

TRICKY = st.text(alphabet='ab"\\[]{}\n\u00e9', max_size=8)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**53), max_value=2**53) | TRICKY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY, inner, max_size=3),
    max_leaves=40,
)


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


@settings(max_examples=400, derandomize=True, deadline=None)
@given(JSON, st.integers(min_value=0, max_value=12))
def test_the_fast_depth_check_agrees_with_parsing(value: Any, limit: int) -> None:
    text = orjson.dumps(value)
    assert text_depth_exceeds(text, limit) == (depth(value) > limit)


def test_deep_nesting_hidden_in_strings_is_not_counted_and_real_nesting_is() -> None:
    assert not text_depth_exceeds(orjson.dumps({"s": "[" * 1000 + '\\"{' * 500}), 10)
    assert text_depth_exceeds(b"[" * 30 + b"]" * 30, 10)
    assert text_depth_exceeds(b'{"a\\\\":' * 12 + b"1" + b"}" * 12, 10)
