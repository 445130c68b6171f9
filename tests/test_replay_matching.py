"""The matchers (``replay/matching.py``), one row each: a small hand-built bundle and a call that
passes every earlier matcher and fails exactly that one.

Each row is checked twice: by calling the matchers directly, in order, on the very call the
boundary made (captured on its way into the session) -- the first that misses is the row's; and
through the public API (``@trace_tool`` / ``llm_request`` inside ``ReplaySession.from_trace``),
where that miss is the ``reason`` of the ``ReplayMismatchError``. Rows that pass every matcher
(the same call; a hybrid call whose prompt drifted) are served, not raised."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from stepfork_otel import ReplayMismatchError, ReplaySession, llm_request, trace_tool
from stepfork_otel.recording.contract import BoundaryCall
from stepfork_otel.replay.matching import MATCHERS, MatchContext, first_miss
from stepfork_otel.trace.canonical import canonical_json, model_fingerprint, sha256_hex
from stepfork_otel.trace.models import Event, LlmRequest, LlmResponse, ToolCall, ToolResult, Trace

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
DOC = Path(__file__).resolve().parent.parent / "docs" / "replay.md"

# DESIGN.md section 2, Replay: "Each call is checked, in this order, before any body runs:
# position, kind, tool name, LLM provider and model, redacted canonical input, recorded
# fingerprints" -- the recorded input fingerprint, then the model fingerprint (docs/replay.md).
DOCUMENTED_ORDER = (
    "position",
    "kind",
    "tool_name",
    "llm_provider",
    "llm_model",
    "redacted_input",
    "input_fingerprint",
    "model_fingerprint",
)


# --- the recorded run ------------------------------------------------------------------------------


def _ids(n: int) -> dict[str, Any]:
    return {"trace_id": TRACE_ID, "span_id": f"{n:016x}", "seq": n, "time_unix_nano": n}


def _tool(n: int, name: str, args: Any, output: Any, **call: Any) -> list[Event]:
    """A recorded tool call ``call-<n>`` and its result (``call`` overrides the call's fields)."""
    text, out = canonical_json(args), canonical_json(output)
    fields = {"input": text, "input_sha256": sha256_hex(text), **call}
    return [
        ToolCall(id=f"call-{n}", **_ids(n), name=name, **fields),
        ToolResult(
            id=f"call-{n}.result",
            parent_id=f"call-{n}",
            **_ids(n),
            name=name,
            output=out,
            output_sha256=sha256_hex(out),
        ),
    ]


def _llm(n: int, provider: str, model: str, prompt: str, answer: Any) -> list[Event]:
    """A recorded ``chat`` LLM call ``call-<n>`` and its response."""
    text, out = canonical_json({"messages": prompt}), canonical_json(answer)
    return [
        LlmRequest(
            id=f"call-{n}",
            **_ids(n),
            provider=provider,
            model=model,
            input=text,
            input_sha256=sha256_hex(text),
            model_fingerprint=model_fingerprint(provider, model, "chat"),
        ),
        LlmResponse(
            id=f"call-{n}.result",
            parent_id=f"call-{n}",
            **_ids(n),
            provider=provider,
            model=model,
            output=out,
            output_sha256=sha256_hex(out),
        ),
    ]


# --- the agent's side ------------------------------------------------------------------------------


@trace_tool
def lookup(city: str, days: int = 1) -> str:
    return f"live weather in {city}"


@trace_tool
def search(city: str) -> str:
    return f"live search for {city}"


@trace_tool
def outer(x: int) -> str:
    return inner(x)  # run live, its body makes a call the recording made at run level


@trace_tool
def inner(x: int) -> str:
    return "live inner"


@trace_tool
def opaque(handle: object) -> str:
    return "live opaque"


class Handle:
    """No canonical JSON form."""


def ask(
    prompt: str = "hi", *, provider: str = "openai", model: str = "gpt-4.1", operation: str = "chat"
) -> Any:
    return llm_request(
        provider=provider,
        model=model,
        input={"messages": prompt},
        call=lambda: {"content": "live answer"},
        operation=operation,
    )


def _tamper_input_fingerprint(session: ReplaySession) -> None:
    # Defence in depth: a bundle whose stored fingerprint disagrees with its input is rejected
    # when the session starts, so only an edit of the plan the session holds reaches the check.
    session.recorded_calls[0].input_sha256 = "0" * 64


@dataclass(frozen=True)
class Row:
    id: str
    matcher: str | None
    """The first matcher that misses (None: every matcher passes)."""
    events: list[Event]
    run: Callable[[], Any]
    reason: str | Callable[[BoundaryCall], str] | None = None
    """The mismatch reason (a function of the call made when it quotes the call's input)."""
    session: dict[str, Any] = field(default_factory=dict)
    cursor: int = 0
    parent: int | None = None
    drift_allowed: bool = False
    tamper: Callable[[ReplaySession], None] | None = None
    returns: Any = None


ROWS = [
    Row(
        "position",
        "position",
        [*_tool(1, "outer", {"x": 1}, "recorded outer"), *_tool(2, "inner", {"x": 1}, "in")],
        lambda: outer(1),
        "call made inside call-1, but the next recorded call was made at run level",
        session={"mode": "live", "allow_live_tools": {"outer"}},
        cursor=1,
        parent=0,
    ),
    Row(
        "kind",
        "kind",
        _llm(1, "openai", "gpt-4.1", "hi", {"content": "hello"}),
        lambda: lookup("Lisbon"),
        "kind differs: recorded an llm call, this run made a tool call",
    ),
    Row(
        "tool_name",
        "tool_name",
        _tool(1, "lookup", {"city": "Lisbon", "days": 1}, "sunny"),
        lambda: search("Lisbon"),
        "tool name differs: recorded 'lookup', this run called 'search'",
    ),
    Row(
        "llm_provider",
        "llm_provider",
        _llm(1, "openai", "gpt-4.1", "hi", {"content": "hello"}),
        lambda: ask(provider="anthropic"),
        "LLM provider differs: recorded 'openai', this run used 'anthropic'",
    ),
    Row(
        "llm_model",
        "llm_model",
        _llm(1, "openai", "gpt-4.1", "hi", {"content": "hello"}),
        lambda: ask(model="gpt-4.1-mini"),
        "LLM model differs: recorded 'gpt-4.1', this run used 'gpt-4.1-mini'",
    ),
    Row(
        "redacted_input",
        "redacted_input",
        _tool(1, "lookup", {"city": "Lisbon", "days": 1}, "sunny"),
        lambda: lookup("Lisbon", days=2),
        "input differs from the recording (arguments are normalised with their defaults: a "
        "changed default counts)",
    ),
    Row(
        "redacted_input-no-canonical-form",
        "redacted_input",
        _tool(1, "opaque", {"handle": "h-1"}, "ok"),
        lambda: opaque(Handle()),
        lambda call: (
            "the input of this call has no canonical JSON form, so it cannot be matched against "
            f"the recording ({call.input.text}); make the arguments JSON-encodable"
        ),
    ),
    Row(
        "redacted_input-recorded-input-missing",
        "redacted_input",
        _tool(1, "lookup", {}, "sunny", input=None, input_sha256=None, input_missing="size_cap"),
        lambda: lookup("Lisbon"),
        "the recorded input of call-1 is missing (size_cap) and has no fingerprint to match",
    ),
    Row(
        "input_fingerprint",
        "input_fingerprint",
        _tool(1, "lookup", {"city": "Lisbon", "days": 1}, "sunny"),
        lambda: lookup("Lisbon"),
        "input fingerprint differs from the recorded fingerprint",
        tamper=_tamper_input_fingerprint,
    ),
    Row(
        "model_fingerprint",
        "model_fingerprint",
        _llm(1, "openai", "gpt-4.1", "hi", {"content": "hello"}),
        lambda: ask(operation="responses"),
        "model fingerprint differs: recorded operation 'chat', this run used 'responses'",
    ),
    Row(
        "matches",
        None,
        _tool(1, "lookup", {"city": "Lisbon", "days": 1}, "sunny"),
        lambda: lookup("Lisbon"),
        returns="sunny",
    ),
    Row(
        "matches-hybrid-input-drift",
        None,
        _llm(1, "openai", "gpt-4.1", "hi", {"content": "hello"}),
        lambda: ask("hello there"),
        session={"mode": "hybrid", "live_llms": {"openai/gpt-4.1"}},
        drift_allowed=True,
        returns={"content": "live answer"},
    ),
]


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[BoundaryCall]:
    """Every call the boundaries hand to a session, as they hand it."""
    calls: list[BoundaryCall] = []
    begin = ReplaySession.begin_call

    def spy(self: ReplaySession, call: BoundaryCall) -> Any:
        calls.append(call)
        return begin(self, call)

    monkeypatch.setattr(ReplaySession, "begin_call", spy)
    return calls


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_the_first_miss_is_the_rows_matcher(row: Row, made: list[BoundaryCall]) -> None:
    trace = Trace(trace_id=TRACE_ID, events=row.events)
    raised: ReplayMismatchError | None = None
    returned: Any = None
    with ReplaySession.from_trace(trace, **row.session) as replay:
        if row.tamper is not None:
            row.tamper(replay)
        try:
            returned = row.run()
        except ReplayMismatchError as error:
            raised = error

    call = made[-1]  # the call that diverged (or the only one)
    ctx = MatchContext(replay.recorded_calls, row.cursor, row.parent, row.drift_allowed)
    expected = replay.recorded_calls[row.cursor]
    misses = [(m.__name__, m(call, expected, ctx)) for m in MATCHERS]
    first = next((name for name, miss in misses if miss is not None), None)
    assert first == row.matcher
    miss = first_miss(call, expected, ctx)

    if row.matcher is None:
        assert miss is None
        assert raised is None
        assert returned == row.returns
        assert [c.recorded_id for c in replay.matched] == [expected.event.id]
        return
    reason = row.reason(call) if callable(row.reason) else row.reason
    assert raised is not None
    assert type(raised) is ReplayMismatchError
    assert miss is not None
    assert raised.reason == miss.reason == reason
    assert raised.position == len(made)
    assert expected.state == "pending"  # a mismatch never consumes the recorded answer


def test_hybrid_drift_is_reported_on_the_call(made: list[BoundaryCall]) -> None:
    row = next(r for r in ROWS if r.id == "matches-hybrid-input-drift")
    with ReplaySession.from_trace(Trace(trace_id=TRACE_ID, events=row.events), **row.session) as r:
        row.run()
    assert [c.action for c in r.calls] == ["executed"]
    assert r.calls[0].notes[0].startswith("input drift (hybrid)")


def test_every_matcher_has_a_row() -> None:
    assert {row.matcher for row in ROWS} == {m.__name__ for m in MATCHERS} | {None}


def test_matchers_run_in_the_documented_order() -> None:
    assert tuple(m.__name__ for m in MATCHERS) == DOCUMENTED_ORDER


def test_the_user_docs_list_the_same_order() -> None:
    section = DOC.read_text(encoding="utf-8").split("## Matching: one strict cursor", 1)[1]
    items = re.findall(r"^\d+\. \*\*(.+?)\*\*", section.split("\n## ", 1)[0], re.MULTILINE)
    assert items == [
        "position",
        "kind",
        "tool name",
        "LLM provider, then model",
        "the redacted canonical input",
        "fingerprints",
    ]
