"""Every hot-path shortcut agrees with the slow, obvious version it stands in for.

* Redaction: the pre-check, the splice of redacted strings into the canonical text and the walk
  with the patterns the pre-check selected all give what decoding the payload, redacting every
  key and string with every rule and re-encoding gives.
* Argument binding: the binder of plain signatures gives what ``inspect.Signature.bind`` +
  ``apply_defaults`` give, and gives up exactly on the calls ``bind`` rejects.
* Bundle structure: whenever the quick consistency check passes a list of events, the full check
  finds no problem in it.

Hypothesis runs derandomized (the same examples every run) with no deadline and no example
database, so a run never depends on timing or on an earlier one.
"""

from __future__ import annotations

import inspect
import re
import sys
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from secret_families import CORPUS
from test_redaction import SECRETS

from stepfork_otel.trace.canonical import as_returned_bytes, canonical_json
from stepfork_otel.trace.canonical import loads as canonical_loads
from stepfork_otel.trace.models import (
    ErrorEvent,
    LlmRequest,
    LlmResponse,
    ToolCall,
    ToolResult,
    Trace,
)
from stepfork_otel.trace.redaction import (
    GENERIC_MARKER,
    KEY_MARKER,
    Redactor,
    SecretPattern,
    looks_random,
    scan_form,
)
from stepfork_otel.trace.redaction.engine import _splice

try:  # where the binder lives after the recording refactor
    from stepfork_otel.recording.arguments import bind_arguments, simple_binder
except ImportError:  # pragma: no cover - before it
    from stepfork_otel.recording.boundaries import _simple_binder as simple_binder
    from stepfork_otel.recording.boundaries import _tool_arguments as bind_arguments

try:  # where the structure checks live after the trace refactor
    from stepfork_otel.trace.checks import _plainly_consistent, validate_structure
except ImportError:  # pragma: no cover - before it
    from stepfork_otel.trace.bundle import _plainly_consistent, validate_structure


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# --- redaction: pre-check, splice and walk against the obvious version ----------------------------

_SECRET_TEXTS = tuple(dict.fromkeys(s.text for s in SECRETS))
_FRAGMENTS = (
    # pieces of every rule: words, prefixes, separators, JSON-significant characters
    *("pass", "word", "pass_word", "pwd", "phrase", "secret", "token", "api", "key", "Key", "KEY"),
    *("access", "private", "credential", "s", "authorization", "cookie", "Cookie", "aws", "AWS"),
    *("_", "-", ".", " ", "\t", "\n", "\r", "\v", "\f", "\\", "\\\\", '"', '\\"', "'", "=", ":"),
    *(";", "@", "/", "://", "?", "#", "&", ",", "{", "}", "[", "]", "\x00", "\x1f", "\x7f"),
    *("https", "postgres", "user", "hunter22", "Bearer ", "bearer", "Basic ", "BASIC", "sk-"),
    *("sk-proj-", "sk-ant-api03-", "AIza", "AKIA", "ASIA", "ghp_", "github_pat_", "xoxb-"),
    *("xapp-", "sk_live_", "rk_test_", "whsec_", "eyJ", ".eyJ", "hooks.slack.com/services/"),
    *("-----BEGIN ", "RSA ", "PRIVATE KEY-----", "-----END ", "EMP-", "123456", "internal ref"),
    *("ABCDEFGHIJKLMNOP", "abcdefghijklmnopqrstuvwxyz0123456789", "0123456789", "dXNlcjpwYXNz"),
    *("QRSTUVWXYZ234567", "Zm9vOmJhcg==", "A1b2C3d4E5f6G7h8", "secret_key", "X-Api-Key", "ssn"),
    *("[REDACTED]", "[REDACTED:aws_access_key_id]", "[REDACTED:jwt]", "#2"),
    *('ref"=', "abcd", "C:\\Users\\", "bob", "PIN\\'", "1234", "pin'"),
    # ordinary text, and text whose case folding is not ASCII's
    *("the flight to Lisbon", "max_tokens", "passengers", "basic information", "task-1"),
    *("\u00a0", "é", "É", "ſ", "K", "İ", "ß", "Ω", "\u2028", "日本", "🔑", "\ufeff"),
)

_unicode = st.text(st.characters(exclude_categories=("Cs",)), max_size=4)


@st.composite
def _secret_slices(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(_SECRET_TEXTS))
    start = draw(st.integers(0, len(text)))
    return text[start : draw(st.integers(start, len(text)))]


_piece = st.one_of(
    st.sampled_from(_SECRET_TEXTS),
    _secret_slices(),
    st.sampled_from(_FRAGMENTS),
    _unicode,
)
_texts = st.lists(_piece, min_size=0, max_size=6).map("".join)
_keys = st.one_of(
    st.sampled_from(
        (
            *("password", "api_key", "X-Api-Key", "Authorization", "client_secret", "token_"),
            *("to ken", "ssn", "my_cookie_jar", "SSN", "set-cookie"),
            *("max_tokens", "key_count", "passengers", "description", "keyboard", "q", "v"),
        )
    ),
    st.sampled_from(_SECRET_TEXTS),  # a secret used as a key
    _texts,
)
_leaves = st.one_of(
    _texts,
    _texts,
    st.integers(-(2**70), 2**70),
    st.sampled_from((None, True, False, 0.5, -2.25, 1e20)),
)
_values = st.recursive(
    _leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(_keys, children, max_size=4)
    ),
    max_leaves=12,
)

_REDACTORS = (
    Redactor(),
    Redactor().with_rules(keys=["ssn", "my-Cookie_Jar"]),
    Redactor().with_rules(  # user patterns: no combined probe, prefixes and triggers of their own
        keys=["ssn"],
        patterns=[
            SecretPattern("employee_id", re.compile(r"EMP-\d{6}"), prefixes=("EMP-",)),
            SecretPattern(
                "ticket_ref",
                re.compile(r"(?ai:internal[ _\-]?ref)\s*[:=]\s*(?P<secret>\w{6,})"),
                triggers=("internal ref",),
            ),
            # needles holding a quote or a backslash: the splice declines when one is found
            SecretPattern("quoted_ref", re.compile(r'ref"=\w{4,}'), prefixes=('ref"=',)),
            SecretPattern("user_dir", re.compile(r"C:\\Users\\\w+"), prefixes=("C:\\Users",)),
            SecretPattern("quoted_pin", re.compile(r"(?ai:pin)\\'\d{4,}"), triggers=("pin\\'",)),
        ],
    ),
)


def _obvious(redactor: Redactor, value: Any) -> Any:
    """Redaction as the documentation states it: every string redacted with every pattern, every
    value under a sensitive key (or pair name) replaced whole, a random-looking string under a
    generic key too, every key redacted -- a redacted key that is
    taken gets the first free ``#<n>`` (n >= 2), in the order of the decoded (sorted) keys."""
    if isinstance(value, str):
        return redactor.redact_text(value)
    if isinstance(value, list):
        if value and all(
            isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) for v in value
        ):
            # [name, value] pairs (headers as tuples): a sensitive name hides its value
            return [
                [redactor.redact_text(n), KEY_MARKER]
                if redactor.is_sensitive_key(n)
                else _obvious(redactor, [n, v])
                for n, v in value
            ]
        return [_obvious(redactor, v) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if redactor.is_sensitive_key(key):
                redacted: Any = KEY_MARKER
            elif isinstance(item, str) and redactor.is_generic_key(key) and looks_random(item):
                redacted = GENERIC_MARKER  # a random-looking value under a generic key
            else:
                redacted = _obvious(redactor, item)
            name = redactor.redact_text(key)
            if name in out:
                n = 2
                while f"{name}#{n}" in out:
                    n += 1
                name = f"{name}#{n}"
            out[name] = redacted
        return out
    return value


def _check_redaction_shortcuts(redactor: Redactor, value: Any) -> str:
    """Check every path on ``value``; return which one ``redact_canonical`` takes."""
    text = canonical_json(value)
    expected = canonical_json(_obvious(redactor, canonical_loads(text)))
    # the public path (pre-check, then splice or walk)
    assert redactor.redact_canonical(text) == expected
    # the walk with every rule (Redactor.redact)
    assert canonical_json(redactor.redact(canonical_loads(text))) == expected
    # the pre-check: "nothing to do" only when redaction changes nothing
    plan = redactor._plan(text)
    assert redactor.may_contain_secret(text) is (plan is not None)
    if expected != text:
        assert plan is not None, f"pre-check missed: {text[:300]}"
    if plan is None:
        return "pre-check: nothing to do"
    # the walk with just the rules the pre-check selected (the splice bypassed)
    walked, changed = redactor._walk(canonical_loads(text), plan)
    assert (canonical_json(walked) if changed else text) == expected
    # the splice on its own, wherever the engine would try it
    if not plan.keys and plan.raw_needles is not None:
        spliced = _splice(text, plan)
        if spliced is not None:
            assert spliced == expected
            return "splice"
        return "walk (the splice declined)"
    return "walk (a sensitive key, or a pattern without needles)"


@_settings(600)
@given(redactor=st.sampled_from(_REDACTORS), value=_values)
def test_redaction_shortcuts_agree_with_the_obvious_walk(redactor: Redactor, value: Any) -> None:
    event(_check_redaction_shortcuts(redactor, value))


_ascii_piece = st.one_of(
    st.sampled_from(_SECRET_TEXTS),
    _secret_slices(),
    st.sampled_from([f for f in _FRAGMENTS if f.isascii()]),
)
_ascii_texts = st.lists(_ascii_piece, min_size=1, max_size=6).map("".join)
_plain_keys = st.sampled_from(("q", "v", "note", "body", "x"))
# mostly plain keys (the splice applies), sometimes a secret used as a key (it must decline)
_ascii_keys = st.one_of(_plain_keys, _plain_keys, _plain_keys, _ascii_texts)


@_settings(600)
@given(
    redactor=st.sampled_from(_REDACTORS),
    value=st.recursive(
        _ascii_texts,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(_ascii_keys, children, max_size=4),
        ),
        max_leaves=8,
    ),
)
def test_splice_agrees_with_the_walk_on_ascii_values(redactor: Redactor, value: Any) -> None:
    # ASCII text, mostly under plain keys: where the splice applies (the test above mostly walks)
    event(_check_redaction_shortcuts(redactor, value))


def test_the_splice_is_taken_by_these_properties() -> None:
    # guard against the properties above passing vacuously: plain payloads with a secret in a
    # string are spliced, not walked
    redactor = _REDACTORS[0]
    for value in ({"q": f"use {SECRETS[0].text} now"}, [{"v": "x"}, {"note": _SECRET_TEXTS[5]}]):
        text = canonical_json(value)
        plan = redactor._plan(text)
        assert plan is not None
        assert not plan.keys
        assert plan.raw_needles is not None
        spliced = _splice(text, plan)
        assert spliced is not None
        assert spliced != text
        assert _check_redaction_shortcuts(redactor, value) == "splice"


# --- argument binding: the plain-signature binder against Signature.bind --------------------------

_POK = inspect.Parameter.POSITIONAL_OR_KEYWORD


@st.composite
def _plain_signatures(draw: st.DrawFn) -> tuple[inspect.Signature, frozenset[str]]:
    names = draw(st.lists(st.sampled_from("abcdef"), max_size=5, unique=True))
    if draw(st.booleans()):
        names = [draw(st.sampled_from(("self", "cls"))), *names]
    with_default = draw(st.integers(0, len(names)))  # defaults only on a suffix
    params = [
        inspect.Parameter(
            name,
            _POK,
            default=inspect.Parameter.empty
            if i < len(names) - with_default
            else draw(st.sampled_from((None, 0, "", ("default", name)))),
        )
        for i, name in enumerate(names)
    ]
    # left out: the first parameter (self/cls) or not, and any others (excluded, framework
    # context), and names that are no parameter at all
    leave_out = set(draw(st.lists(st.sampled_from([*names, "zz"]), max_size=3)))
    if names and draw(st.booleans()):
        leave_out.add(names[0])
    return inspect.Signature(params), frozenset(leave_out)


@st.composite
def _calls(draw: st.DrawFn, signature: inspect.Signature) -> tuple[tuple[Any, ...], dict[str, Any]]:
    n = len(signature.parameters)
    args = tuple(("pos", i) for i in range(draw(st.integers(0, n + 2))))
    # names of parameters (given positionally too, or not), unknown names, "self"
    pool = [*signature.parameters, "zz", "self", "kwargs", "a", "f"]
    names = draw(st.lists(st.sampled_from(pool), max_size=n + 2, unique=True))
    return args, {name: ("kw", name) for name in names}


def _bound(
    signature: inspect.Signature,
    leave_out: frozenset[str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> dict[str, Any] | TypeError:
    """The obvious version: bind, apply the defaults, leave out the parameters left out."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        return exc
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    return {name: value for name, value in arguments.items() if name not in leave_out}


@_settings(1000)
@given(data=st.data(), shape=_plain_signatures())
def test_simple_binder_agrees_with_signature_bind(
    data: st.DataObject, shape: tuple[inspect.Signature, frozenset[str]]
) -> None:
    signature, leave_out = shape
    binder = simple_binder(signature, leave_out)
    assert binder is not None  # every parameter is positional-or-keyword
    for _ in range(4):
        args, kwargs = data.draw(_calls(signature))
        expected = _bound(signature, leave_out, args, kwargs)
        fast = binder(args, dict(kwargs))
        if isinstance(expected, TypeError):
            # not a plain call: the binder gives up, and the fallback raises what bind raises
            assert fast is None
            with pytest.raises(TypeError) as raised:
                bind_arguments(signature, leave_out, args, dict(kwargs))
            assert str(raised.value) == str(expected)
        else:
            # a call bind accepts is a plain call: the binder answers, with the same mapping
            assert fast is not None
            assert list(fast.items()) == list(expected.items())  # key order included
            assert list(bind_arguments(signature, leave_out, args, dict(kwargs)).items()) == list(
                expected.items()
            )


_OTHER_KINDS = (
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.VAR_POSITIONAL,
    inspect.Parameter.KEYWORD_ONLY,
    inspect.Parameter.VAR_KEYWORD,
)


def test_simple_binder_declines_signatures_that_are_not_plain() -> None:
    for kind in _OTHER_KINDS:
        for params in ([("x", kind)], [("self", _POK), ("x", kind)], [("x", kind), ("b", _POK)]):
            params.sort(key=lambda p: p[1])  # the order Signature insists on
            signature = inspect.Signature([inspect.Parameter(n, k) for n, k in params])
            assert simple_binder(signature, False) is None, signature
            assert simple_binder(signature, True) is None, signature
    assert simple_binder(inspect.Signature([]), False) is not None  # no parameters is plain


# --- bundle structure: the quick check against the full one ----------------------------------------


def _call(kind: str, n: int, parent: str | None) -> ToolCall | LlmRequest:
    common: dict[str, Any] = {
        "id": f"call-{n}",
        "parent_id": parent,
        "trace_id": "t",
        "span_id": f"s{n}",
        "seq": n,
    }
    if kind == "tool":
        return ToolCall(name=f"tool{n % 3}", **common)
    return LlmRequest(provider="p", model=f"m{n % 2}", **common)


def _outcome(call: ToolCall | LlmRequest, error: bool) -> ToolResult | LlmResponse | ErrorEvent:
    common: dict[str, Any] = {
        "parent_id": call.id,
        "trace_id": "t",
        "span_id": call.span_id,
        "seq": call.seq,
    }
    if error:
        return ErrorEvent(id=f"{call.id}.error", error_type="E", message="m", **common)
    if isinstance(call, ToolCall):
        return ToolResult(id=f"{call.id}.result", name=call.name, **common)
    return LlmResponse(id=f"{call.id}.result", provider=call.provider, model=call.model, **common)


@st.composite
def _well_formed(draw: st.DrawFn) -> list[Any]:
    """Events as a run writes them: each call, the calls made inside it, then its outcome (or
    none: a call still running when the run ended)."""
    events: list[Any] = []
    stack: list[ToolCall | LlmRequest] = []
    n = 0
    for step in draw(st.lists(st.sampled_from(("open", "open", "close", "drop")), max_size=14)):
        if step == "open":
            n += 1
            call = _call(draw(st.sampled_from(("tool", "llm"))), n, stack[-1].id if stack else None)
            events.append(call)
            stack.append(call)
        elif stack:
            call = stack.pop()
            if step == "close":
                events.append(_outcome(call, draw(st.booleans())))
    while stack:
        call = stack.pop()
        if draw(st.booleans()):
            events.append(_outcome(call, draw(st.booleans())))
    return events


def _update(model: Any, **changes: Any) -> Any:
    return model.model_copy(update=changes)


@st.composite
def _mutated(draw: st.DrawFn) -> list[Any]:
    events = draw(_well_formed())
    for _ in range(draw(st.integers(0, 3))):
        if not events:
            break
        ids = [e.id for e in events]
        calls = [e for e in events if isinstance(e, (ToolCall, LlmRequest))]
        i = draw(st.integers(0, len(events) - 1))
        j = draw(st.integers(0, len(events) - 1))
        target = events[i]
        what = draw(
            st.sampled_from(
                (
                    "duplicate_id",
                    "dangling_parent",
                    "parent_is_outcome",
                    "no_parent",
                    "retarget",
                    "move",
                    "swap",
                    "drop",
                    "copy",
                    "seq",
                    "wrong_kind",
                )
            )
        )
        if what == "duplicate_id":
            events[i] = _update(target, id=ids[j])
        elif what == "dangling_parent":
            events[i] = _update(target, parent_id="call-999")
        elif what == "parent_is_outcome":
            events[i] = _update(target, parent_id=ids[j])
        elif what == "no_parent":  # a call at run level, or a legacy outcome without a link
            events[i] = _update(target, parent_id=None)
        elif what == "retarget" and calls:  # another call's outcome: maybe its second
            events[i] = _update(target, parent_id=draw(st.sampled_from(calls)).id)
        elif what == "move":  # an outcome before its call, a call after its children, ...
            events.insert(j, events.pop(i))
        elif what == "swap":
            events[i], events[j] = events[j], events[i]
        elif what == "drop":  # the parent of later calls, or the call of an outcome
            del events[i]
        elif what == "copy":  # a second outcome (or call) with an id of its own
            events.insert(j, _update(target, id=f"{target.id}.copy"))
        elif what == "seq":
            events[i] = _update(target, seq=draw(st.integers(0, len(events) + 1)))
        elif what == "wrong_kind" and calls:  # a tool result for an LLM call, or vice versa
            outcome = _outcome(draw(st.sampled_from(calls)), False)
            kind = ToolResult if isinstance(outcome, LlmResponse) else LlmResponse
            fields = {"name": "x"} if kind is ToolResult else {"provider": "p", "model": "m"}
            wrong = kind(
                id=f"wrong-{i}",
                parent_id=outcome.parent_id,
                trace_id="t",
                span_id="s",
                seq=outcome.seq,
                **fields,
            )
            events.insert(j, wrong)
    return events


def _full_check(events: list[Any]) -> list[Any]:
    """``validate_structure`` with its quick check forced to say "look closer"."""
    module = sys.modules[validate_structure.__module__]
    assert getattr(module, "_plainly_consistent", None) is _plainly_consistent
    bypassed: list[bool] = []

    def look_closer(_: Any) -> bool:
        bypassed.append(True)
        return False

    with mock.patch.object(module, "_plainly_consistent", look_closer):
        problems = validate_structure(Trace(trace_id="t", events=events))
    assert bypassed, "the quick check was not bypassed"
    return list(problems)


@_settings(300)
@given(events=_well_formed())
def test_well_formed_events_pass_both_structure_checks(events: list[Any]) -> None:
    assert _plainly_consistent(events)
    assert _full_check(events) == []


@_settings(1000)
@given(events=_mutated())
def test_quick_structure_check_passes_only_what_the_full_check_passes(events: list[Any]) -> None:
    quick = _plainly_consistent(events)
    event(f"structure: quick check {'passes' if quick else 'looks closer'}")
    if quick:
        assert _full_check(events) == [], [(e.type, e.id, e.parent_id, e.seq) for e in events]
    assert validate_structure(Trace(trace_id="t", events=events)) == _full_check(events)


def test_quick_structure_check_looks_closer_at_each_kind_of_problem() -> None:
    a = _call("tool", 1, None)
    b = _call("llm", 2, a.id)
    ra, rb = _outcome(a, False), _outcome(b, False)
    good = [a, b, rb, ra]
    assert _plainly_consistent(good)
    broken = {
        "duplicate id": [a, _update(b, id=a.id), rb, ra],
        "dangling parent": [a, _update(b, parent_id="call-9"), rb, ra],
        "outcome before its call": [a, rb, b, ra],
        "two outcomes for one call": [a, b, rb, ra, _update(ra, id="x")],
        "wrong kind": [a, b, _update(ra, id="w", parent_id=b.id), ra],
        "calls out of order": [a, _update(b, seq=1), rb, ra],
    }
    for name, events in broken.items():
        assert not _plainly_consistent(events), name
        assert _full_check(events), name


# --- redaction of an output as returned (keys in the call's order) against the obvious walk -------


@settings(max_examples=600, deadline=None, derandomize=True)
@given(redactor=st.sampled_from(_REDACTORS), value=_values, seed=st.randoms(use_true_random=False))
def test_an_output_is_redacted_in_its_returned_order_as_the_obvious_walk_does(
    redactor: Redactor, value: Any, seed: Any
) -> None:
    """``redact_canonical(text, keep_order=True)`` (one pre-check, then the splice or the walk on
    the text in returned order) gives what the obvious walk of the value gives, encoded with its
    keys in their order -- and its keys keep the returned order."""
    from stepfork_otel.trace.canonical import UnserialisableError

    loads = canonical_loads
    try:
        canonical = canonical_json(value)
    except UnserialisableError:
        return
    returned = as_returned_bytes(_shuffled(loads(canonical), seed)).decode("utf-8")
    redacted = redactor.redact_canonical(returned, keep_order=True)
    assert redacted == as_returned_bytes(_obvious(redactor, loads(returned))).decode("utf-8")
    if redacted == returned:
        assert redacted is returned  # nothing to do: the very text, no copy


def _shuffled(value: Any, rng: Any) -> Any:
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {key: _shuffled(value[key], rng) for key in keys}
    if isinstance(value, list):
        return [_shuffled(item, rng) for item in value]
    return value


# --- the pre-check's gates against one search of every rule, on payloads with planted secrets ---

_FAMILY_SECRETS = tuple(dict.fromkeys(s.text for s in CORPUS))
_API_KEYS = (
    *("model", "messages", "role", "content", "max_tokens", "temperature", "tool_calls", "id"),
    *("arguments", "headers", "Authorization", "X-Api-Key", "url", "passengers", "api_version"),
    *("results", "flight_id", "fare_rules", "note", "password", "key_count", "access", "body"),
)


@st.composite
def _secret_of_any_family(draw: st.DrawFn) -> str:
    """A corpus secret (every family has one), whole or cut, in ordinary words."""
    secret = draw(st.sampled_from(_FAMILY_SECRETS))
    if draw(st.booleans()):
        start = draw(st.integers(0, len(secret) - 1))
        secret = secret[start : draw(st.integers(start + 1, len(secret)))]
    before = draw(st.sampled_from(("", "use this: ", "token=", "Bearer ", '{"key": "', "x")))
    return before + secret + draw(st.sampled_from(("", " now", '"}', "\n", "&next=1")))


_api_texts = st.one_of(
    _secret_of_any_family(),
    st.sampled_from(_FRAGMENTS),
    st.lists(st.sampled_from(_FRAGMENTS), max_size=5).map(" ".join),
)
_api_values = st.recursive(
    st.one_of(_api_texts, st.integers(-5, 2**40), st.sampled_from((None, True, 0.25))),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(_API_KEYS), _api_texts), children, max_size=5),
        # JSON held in a string, as tool-call arguments are
        st.dictionaries(st.sampled_from(_API_KEYS), children, max_size=3).map(
            lambda d: canonical_json(d)
        ),
    ),
    max_leaves=14,
)


@_settings(400)
@given(
    redactor=st.sampled_from(_REDACTORS),
    value=_api_values,
    seed=st.randoms(use_true_random=False),
)
def test_the_gates_select_what_one_search_of_every_rule_selects(
    redactor: Redactor, value: Any, seed: Any
) -> None:
    """Payloads shaped like API traffic, secrets of every family planted in strings, keys and
    JSON held in strings, keys in a random order: the pre-check with the gates (one search of
    the gates, then of the rules they name) finds exactly the rules that one search of every
    rule finds, and the redacted text -- canonical, or in returned order -- is the obvious
    walk's."""
    canonical = canonical_json(value)
    returned = as_returned_bytes(_shuffled(canonical_loads(canonical), seed)).decode("utf-8")
    for text in (canonical, returned):
        scan = scan_form(text.encode("utf-8"))
        every_rule = sorted(redactor._set.Match(scan))
        assert redactor._matched(scan) == every_rule
        assert redactor._matched(scan, first=True) == every_rule[:1]
    event("a rule matched" if every_rule else "no rule matched")
    assert redactor.redact_canonical(canonical) == canonical_json(_obvious(redactor, value))
    expected = as_returned_bytes(_obvious(redactor, canonical_loads(returned))).decode("utf-8")
    assert redactor.redact_canonical(returned, keep_order=True) == expected
