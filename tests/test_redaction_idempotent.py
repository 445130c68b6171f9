"""Redaction is idempotent: redacting redacted text changes nothing (replay feeds recorded,
redacted values back to the agent, and their fingerprints must be the recorded ones). A fuzzing
campaign found 7 of 30,000 inputs where ``redact(redact(x)) != redact(x)``; this property test
plants generated secrets, markers and the separators around them in random text.

Hypothesis runs derandomized, without a deadline or an example database.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from secret_families import CORPUS, FALSE_POSITIVES

from stepfork_otel.trace.canonical import canonical_json
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR, KEY_MARKER, UNSTABLE_MARKER, Redactor

_SETTINGS = settings(
    max_examples=1500,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_MARKERS = (
    KEY_MARKER,
    UNSTABLE_MARKER,
    *{p.marker for p in DEFAULT_REDACTOR.patterns},
    "[REDACTED:generic_secret]",
    "[REDACTED",
    "REDACTED]",
)
_GLUE = (
    *("", " ", "\n", "\t", '"', "'", "`", "\\", "=", ":", ": ", " = ", ",", ";", "&", "?", "@"),
    *("%3D", "%3A%20", "%20", "+", "/", "://", "(", ")", "[", "]", "{", "}", "#", "x", "AC"),
    *("password", "token", "secret_key", "Bearer ", "Basic ", "Authorization: ", "Cookie: "),
    *("auth token ", "api_key", "ticket_ref", "DB_PASS", "eyJ", "sk-", "ghp_", "é"),
)


@st.composite
def _slices(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from([s.text for s in CORPUS]))
    start = draw(st.integers(0, len(text)))
    return text[start : draw(st.integers(start, len(text)))]


_piece = st.one_of(
    st.sampled_from([s.text for s in CORPUS]),
    _slices(),
    st.sampled_from(_MARKERS),
    st.sampled_from(_GLUE),
    st.sampled_from(FALSE_POSITIVES),
    st.text(max_size=4),
)
_texts = st.lists(_piece, max_size=8).map("".join)
_REDACTORS = (DEFAULT_REDACTOR, Redactor().with_rules(keys=["ticket_ref"]))


@_SETTINGS
@given(text=_texts, which=st.sampled_from(range(len(_REDACTORS))))
def test_redacted_text_redacts_to_itself(text: str, which: int) -> None:
    redactor = _REDACTORS[which]
    once = redactor.redact_text(text)
    assert redactor.redact_text(once) == once


@_SETTINGS
@given(
    value=st.recursive(
        _texts,
        lambda children: st.one_of(
            st.lists(children, max_size=3),
            st.dictionaries(
                st.one_of(st.sampled_from(("q", "password", "note")), _texts), children, max_size=3
            ),
        ),
        max_leaves=6,
    )
)
def test_redacted_payloads_redact_to_themselves(value: object) -> None:
    once = DEFAULT_REDACTOR.redact_canonical(canonical_json(value))
    assert DEFAULT_REDACTOR.redact_canonical(once) == once


@_SETTINGS
@given(text=_texts, pad=st.integers(1_900, 2_010))
def test_a_cut_exception_message_redacts_to_itself(text: str, pad: int) -> None:
    # a message longer than the cap is cut; the cut can leave part of a marker where a rule finds
    # a value (`Authorization: Bearer [REDAC…`): found by this test, the message changed again
    # when replay redacted it
    message = "x" * pad + " " + text
    once = DEFAULT_REDACTOR.redact_message(message)
    assert DEFAULT_REDACTOR.redact_message(once) == once


_bytes_piece = st.one_of(
    _piece.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from((b"\xff", b"\x80", b"\xc3", b"\x00", "ſ".encode(), b"K")),
    # keys RE2 reads case-folded in UTF-8 only (ſ is s, K is k), values holding a stray byte
    st.sampled_from(("paſsword=", "to\u212aen: ", "ſecret=")).map(str.encode),
    st.sampled_from((b"token=ab\xffcd1234efgh", b"Bearer 9f\x80a8b7c6d5e4f3 ")),
    st.binary(max_size=3),
)


@_SETTINGS
@given(data=st.lists(_bytes_piece, max_size=8).map(b"".join))
def test_redacted_bytes_redact_to_themselves(data: bytes) -> None:
    # bytes that are not UTF-8 are read as Latin-1; a secret holding the only byte that is not
    # UTF-8 becomes an ASCII marker, and what is left then reads as UTF-8 (found by this test:
    # `paſsword=...` next to such a secret was redacted only the second time)
    once = DEFAULT_REDACTOR.redact_bytes(data)
    assert DEFAULT_REDACTOR.redact_bytes(once) == once
