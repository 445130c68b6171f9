"""The pre-check's gate (``trace/redaction/prefilter.py``) is a necessary condition of every rule:
wherever a rule or key detector matches a payload's scan form, its gate matches too -- so a
payload the gates find nothing in is one that no rule matches, and the pre-check may stop there.

Proved three ways: strings generated from every rule's own regular expression (hypothesis) are
found by its gate; every secret of the corpus, in the contexts payloads put it in, fires the gate
of each rule that matches it; and the pre-check with the gates selects exactly the rules that
one search of every rule selects (``tests/test_shortcuts.py`` checks the redacted output).
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from re2 import _re2
from secret_families import CORPUS, FALSE_POSITIVES
from test_redaction import SECRETS

from stepfork_otel.trace.canonical import canonical_json
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR, Redactor, SecretPattern, scan_form
from stepfork_otel.trace.redaction.engine import _detectors, _quote_anchored, _uncaptured
from stepfork_otel.trace.redaction.prefilter import gate_of

_UNANCHORED = _re2.RE2.Anchor.UNANCHORED

#: What the pre-check searches: each rule as it runs on the scan form, then the key detectors.
_NAMES = [p.name for p in DEFAULT_REDACTOR.patterns] + [
    "sensitive key",
    "segment key",
    "generic key",
]
_SOURCES = [_uncaptured(_quote_anchored(p.source)) for p in DEFAULT_REDACTOR.patterns] + list(
    _detectors(DEFAULT_REDACTOR.sensitive_keys)
)
assert len(_NAMES) == len(_SOURCES)

#: The rules that are their own gate, and why: nothing every match has is more distinctive than
#: the rule itself.
_WHOLE = {
    # [MNO] + 23-25 token characters + "." + ...: no literal run in any match
    "discord_bot_token",
    # a sensitive word spelled with separators between its letters ("p_a_s_s_w_o_r_d")
    "sensitive key",
}


def _re2_compile(source: str) -> Any:
    options = _re2.RE2.Options()
    options.log_errors = False
    options.never_capture = True
    regex = _re2.RE2(source.encode("utf-8"), options)
    assert regex.ok(), regex.error()
    return regex


def _finds(regex: Any, data: bytes) -> bool:
    return bool(regex.Match(_UNANCHORED, data, 0, len(data))[0][0] >= 0)


def test_every_rule_has_a_gate_but_those_listed() -> None:
    whole = {name for name, source in zip(_NAMES, _SOURCES, strict=True) if gate_of(source) is None}
    assert whole == _WHOLE
    for source in _SOURCES:
        gate = gate_of(source)
        if gate is not None:
            _re2_compile(gate)  # RE2 accepts every gate


def _python_regex(source: str) -> re.Pattern[str] | None:
    """``source`` for hypothesis' ``from_regex``, or None when Python cannot read it."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            return re.compile(source)
        except (re.error, FutureWarning):
            return None


_GENERATED = [
    (name, source)
    for name, source in zip(_NAMES, _SOURCES, strict=True)
    if _python_regex(source) is not None
]


def test_every_rule_is_generated_from() -> None:
    assert len(_GENERATED) == len(_SOURCES)  # none is skipped by the test below


@pytest.mark.parametrize(("name", "source"), _GENERATED, ids=[n for n, _ in _GENERATED])
def test_strings_generated_from_a_rule_are_found_by_its_gate(name: str, source: str) -> None:
    gate = gate_of(source)
    if gate is None:
        return
    rule, relaxed = _re2_compile(source), _re2_compile(gate)
    pattern = _python_regex(source)
    assert pattern is not None

    @settings(
        max_examples=60,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(
        before=st.text(max_size=3),
        match=st.from_regex(pattern, fullmatch=True),
        after=st.text(max_size=3),
    )
    def check(before: str, match: str, after: str) -> None:
        data = (before + match + after).encode("utf-8", "surrogatepass")
        if _finds(rule, data):  # (Python and RE2 read a class or a case fold alike: nearly always)
            assert _finds(relaxed, data), (name, data)

    check()


def _contexts(text: str) -> list[bytes]:
    """``text`` as payloads hold it, each in its scan form: a value, a key, in JSON held in a
    string, after a sensitive key, among other text."""
    values: list[Any] = [
        {"q": text},
        {text: 1},
        {"note": f"see {text} here"},
        {"body": json.dumps({"token": text})},
        {"headers": [["Authorization", f"Bearer {text}"]]},
        [f"api_key={text}", {"password": text}],
    ]
    return [scan_form(canonical_json(value).encode("utf-8")) for value in values]


_TEXTS = [s.text for s in CORPUS] + [s.text for s in SECRETS] + list(FALSE_POSITIVES)


def test_every_secret_fires_the_gate_of_each_rule_that_matches_it() -> None:
    redactor = DEFAULT_REDACTOR
    fired = 0
    for text in _TEXTS:
        for scan in _contexts(text):
            exact = sorted(redactor._set.Match(scan))
            assert set(exact) <= set(redactor._gate.Match(scan)), (text, exact)
            assert redactor._matched(scan) == exact
            assert redactor._matched(scan, first=True) == exact[:1]
            fired += bool(exact)
    assert fired > len(CORPUS)  # the corpus does fire rules: the checks above are not vacuous


#: Ordinary agent traffic without a secret, with the words that make rules look twice
#: (``max_tokens``, ``passengers``, ``api_version``, ``key_count``, a URL, a base64 image).
_ORDINARY: list[Any] = [
    {"model": "gpt-4.1-mini", "max_tokens": 512, "temperature": 0.2, "messages": []},
    {"passengers": 2, "seats_left": 4, "fare_rules": "the gate closes thirty minutes before"},
    {"api_version": "2024-06-01", "key_count": 3, "access": "public", "author": "ada"},
    {"url": "https://example.com/search?q=flights&page=2", "image": "iVBORw0KGgoAAAANSUhEUgAA"},
    {"tool_calls": [{"function": {"arguments": json.dumps({"city": "LIS", "max_results": 5})}}]},
    {"content": "I forgot my password. How do I reset it? The keyboard and the monkey are fine."},
]


@pytest.mark.parametrize("value", _ORDINARY)
def test_ordinary_payloads_stop_at_the_gates(value: Any) -> None:
    # not a guarantee (a gate may fire where its rule does not: the rule then decides), but
    # what makes the gates worth having: ordinary traffic is answered by them alone
    scan = scan_form(canonical_json(value).encode("utf-8"))
    assert DEFAULT_REDACTOR._gate.Match(scan) == []


# --- user rules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "found", "missed"),
    [
        (r"EMP-\d{6}", "id EMP-123456.", "EMP-12345"),
        (r"(?i:internal[ _\-]?ref)\s*[:=]\s*(?P<secret>\w{6,})", "Internal_Ref = abc123", "ref="),
        (r"(?:ticket|order)-[A-Z]{3}\d{4}", "order-ABC1234", "order-1234"),
        (r"(?i)paſsword=\w+", "PASSWORD=x", "pass=x"),  # RE2's case folding: ſ is s
        (r"(?i)key-\w{4}", "\u212aEY-abcd", "ke\u017f-abcd"),  # KELVIN SIGN
    ],
)
def test_a_user_rule_gets_a_gate_that_finds_what_it_finds(
    source: str, found: str, missed: str
) -> None:
    gate = gate_of(_uncaptured(source))
    assert gate is not None
    rule, relaxed = _re2_compile(_uncaptured(source)), _re2_compile(gate)
    for text in (found, found.upper(), found.lower(), missed):
        data = text.encode("utf-8")
        if _finds(rule, data):
            assert _finds(relaxed, data), (source, text)
    assert _finds(rule, found.encode("utf-8"))


@pytest.mark.parametrize(
    "source",
    [
        r"\d{9}",  # nothing distinctive: the rule is its own gate
        r"[[:alpha:]]{3}=\d+",  # a POSIX class: Python's parser reads it differently
        r"a{,3}bcd",  # RE2 reads {,3} as text, Python as a repeat
        r"\pL{3}secret",  # a Unicode class Python does not know
        r"(?U)ab+c",  # RE2's ungreedy flag
        r"\x{41}BCD",  # RE2's hex escape
    ],
)
def test_a_user_rule_the_gate_cannot_read_is_its_own_gate(source: str) -> None:
    assert gate_of(source) is None


def test_a_huge_alternation_is_its_own_gate_or_a_correct_one() -> None:
    words = [f"w{n:05d}x" for n in range(3000)]
    source = "(?:" + "|".join(words) + r")=\d+"
    gate = gate_of(source)
    if gate is not None:
        assert _finds(_re2_compile(gate), b"w01234x=5")


def test_a_user_rule_without_a_gate_is_still_found_by_the_precheck() -> None:
    redactor = Redactor().with_rules(
        patterns=[SecretPattern("badge", r"(?:^|[^0-9])(?P<secret>\d{9})(?:[^0-9]|$)")]
    )
    text = canonical_json({"q": "badge 123456789 issued"})
    assert redactor.may_contain_secret(text)
    assert "123456789" not in redactor.redact_canonical(text)
    assert not redactor.may_contain_secret(canonical_json({"q": "badge 12345 issued"}))


def test_a_rule_nested_deeper_than_the_stack_or_growing_when_distributed_stays_whole() -> None:
    # never an exception out of building a redactor: such a rule is simply its own gate
    deep = "(?:" * 2000 + "secret" + ")" * 2000
    assert gate_of(deep) in (None, "secret")
    branches = "".join(f"(?:a{n}|b{n})" for n in range(40)) + "x"  # 2^40 distributions
    assert gate_of(branches) is None
    redactor = Redactor().with_rules(patterns=[("branches", branches)])
    text = canonical_json({"q": "".join(f"a{n}" for n in range(40)) + "x"})
    assert redactor.redact_canonical(text) != text
