"""The RE2 engine's paths agree, on random payloads with generated secrets planted in them: the
scan form holds every string verbatim; the one-scan pre-check never skips a payload that
redaction changes; the splice, the walk and ``Redactor.redact`` give the same bytes; redacted
output redacts to itself. (``tests/test_shortcuts.py`` does the same against the obvious version
with the hand-written secrets.)

Hypothesis runs derandomized, without a deadline or an example database.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from secret_families import CORPUS, FALSE_POSITIVES

from stepfork_otel.trace.canonical import canonical_json
from stepfork_otel.trace.canonical import loads as canonical_loads
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR, scan_form
from stepfork_otel.trace.redaction.engine import _splice

_SETTINGS = settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_glue = st.sampled_from(["", " ", "\n", "\t", '"', "\\", "\\n", "'", "=", ": ", ",", "\x00", "é"])
_piece = st.one_of(
    st.sampled_from([s.text for s in CORPUS]),
    st.sampled_from(FALSE_POSITIVES),
    st.text(max_size=6),
    _glue,
)
_texts = st.lists(_piece, max_size=4).map("".join)
# secrets at a word boundary: a short-prefix token glued to a word (`parissk-...`) is a documented
# limit (the boundary is what keeps `task-...` and `risk-...` from being taken for keys)
_spaced = st.lists(_piece, max_size=4).map(" ".join)
_keys = st.one_of(
    st.sampled_from(["q", "note", "body", "password", "api_key_id", "headers", "X-Api-Key"]),
    _texts,
)
_values = st.recursive(
    st.one_of(_texts, st.integers(), st.none(), st.booleans()),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(_keys, children, max_size=4),
        st.lists(st.tuples(_keys, _texts).map(list), min_size=1, max_size=3),  # header pairs
    ),
    max_leaves=10,
)


@_SETTINGS
@given(text=st.text())
def test_the_scan_form_holds_a_string_verbatim(text: str) -> None:
    encoded = canonical_json(text).encode("utf-8")
    decoded = canonical_loads(canonical_json(text))
    assert scan_form(encoded) == b'"' + decoded.encode("utf-8") + b'"'


@_SETTINGS
@given(value=_values)
def test_precheck_splice_and_walk_agree(value: Any) -> None:
    redactor = DEFAULT_REDACTOR
    text = canonical_json(value)
    walked = canonical_json(redactor.redact(canonical_loads(text)))
    assert redactor.redact_canonical(text) == walked
    plan = redactor._plan(text)
    if walked != text:
        assert plan is not None, text[:300]
    if plan is not None:
        spliced = _splice(text, plan)
        if spliced is not None:
            assert spliced == walked
    # idempotent: what redaction wrote is left as it is
    assert redactor.redact_canonical(walked) == walked


_spaced_values = st.recursive(
    _spaced,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(_keys.filter(str.isidentifier), _spaced), children, max_size=4),
    ),
    max_leaves=10,
)


@_SETTINGS
@given(value=_spaced_values)
def test_no_generated_secret_survives_in_any_shape(value: Any) -> None:
    redacted = DEFAULT_REDACTOR.redact_canonical(canonical_json(value))
    plain = json.loads(redacted)
    flat = json.dumps(plain, ensure_ascii=False)
    for secret in CORPUS:
        if secret.text in canonical_json(value) or json.dumps(secret.text)[1:-1] in flat:
            for line in secret.secret.splitlines():
                if len(line) >= 12:
                    assert line not in flat, secret.family
