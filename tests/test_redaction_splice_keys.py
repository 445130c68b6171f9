"""Strings that *end* like a sensitive key (``"Enter your password"``, ``"the refresh token"``)
are everywhere in agent traffic; the key detectors find them (a key could end there), and the
splice must tell a key or a ``[name, value]`` pair's name from an object's value or a list's
later item -- redacting as the walk does, without sending every such payload to the walk."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stepfork_otel.trace.canonical import canonical_json
from stepfork_otel.trace.canonical import loads as canonical_loads
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR
from stepfork_otel.trace.redaction.engine import _splice

_ENDINGS = ["the pass", "your password", "a refresh token", "api key", "Cookie", "auth", "x"]
_SECRET = "ghp_" + "16C7e42F292c6912E7710c838347Ae178B4a"  # built in two parts: not a real one
_texts = st.sampled_from([*_ENDINGS, f"use {_SECRET}", "plain words", 'say "pass",', "a\nb"])
_keys = st.sampled_from(["q", "note", "password", "api_key", "X-Api-Key", "pass", "fare_rules"])
_values = st.recursive(
    _texts | st.integers(0, 3),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(_keys | _texts, children, max_size=4),
        st.lists(st.tuples(_keys | _texts, _texts).map(list), min_size=1, max_size=3),
    ),
    max_leaves=10,
)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(value=_values)
def test_the_splice_redacts_as_the_walk_does(value: Any) -> None:
    text = canonical_json(value)
    expected = canonical_json(DEFAULT_REDACTOR.redact(canonical_loads(text)))
    assert DEFAULT_REDACTOR.redact_canonical(text) == expected
    plan = DEFAULT_REDACTOR._plan(text)
    if plan is not None:
        spliced = _splice(text, plan)
        assert spliced is None or spliced == expected


def test_object_values_and_later_items_ending_like_keys_are_spliced_not_walked() -> None:
    for value in (
        {"fare_rules": "the pass", "flight": "KL6064", "note": f"use {_SECRET}"},
        {"help": "Enter your password", "z": 1},
        ["first", "your password", "third"],
        {"q": ["b", "a refresh token", "c"]},
    ):
        text = canonical_json(value)
        plan = DEFAULT_REDACTOR._plan(text)
        assert plan is not None, value
        assert plan.keys, value
        spliced = _splice(text, plan)
        assert spliced is not None, value
        assert spliced == canonical_json(DEFAULT_REDACTOR.redact(value))


def test_a_pair_list_name_still_goes_to_the_walk() -> None:
    value = {"headers": [["X-Api-Key", "k-1234567890"], ["Accept", "json"]]}
    text = canonical_json(value)
    plan = DEFAULT_REDACTOR._plan(text)
    assert plan is not None
    assert _splice(text, plan) is None
    assert DEFAULT_REDACTOR.redact_canonical(text) == canonical_json(
        {"headers": [["X-Api-Key", "[REDACTED]"], ["Accept", "json"]]}
    )
