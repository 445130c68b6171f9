"""Matching a boundary call against the recorded call under the cursor: small ordered matchers.

Each matcher compares one thing and returns a :class:`Miss` (why it failed, and detail lines) or
None. :data:`MATCHERS` is their order, the order DESIGN.md and ``docs/replay.md`` document:
position (nesting), kind, tool name, LLM provider, LLM model, the redacted canonical input, the
input fingerprint, the model fingerprint. The session takes the first miss and turns it into the
``ReplayMismatchError``; nothing here raises or changes any state.

Why a list of matchers and not one function with a branch per check: the order is part of the
contract (an agent that called the wrong tool must hear "tool name differs", not "input
differs"), and as data it can be read, tested and documented in one place. Each check being a
function of ``(call, expected, context)`` only also means a test can point at the one that fails.

Why the context: two checks depend on more than the two calls. Position needs the recorded call
the session is executing (a call made inside a live body must match a call recorded inside it),
and the input check lets the input of a hybrid call that will run live drift (a changed prompt is
the point of hybrid replay; the drift is reported on the call instead).

Content is also used to *explain* a divergence (:func:`mismatch_error`, :func:`exhausted_error`):
when the call made is recorded later, or its recorded answer was already consumed, the error says
so -- but content never picks a different recorded call, with one exception: among recorded calls
that were concurrent (the session's docstring says why), the session runs the same matchers against
each and takes the first that passes; :func:`concurrent_mismatch_error` explains a call that
passes none, naming the nearest and the first differing path of its input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import NamedTuple

from stepfork_otel import constants as k
from stepfork_otel.recording.contract import BoundaryCall
from stepfork_otel.replay.errors import (
    CallDescription,
    ReplayExhaustedError,
    ReplayMismatchError,
    first_difference,
    first_differing_path,
)
from stepfork_otel.replay.plan import RecordedCall
from stepfork_otel.trace.canonical import canonical_json, loads, sha256_hex
from stepfork_otel.trace.foreign_request import live_arguments, live_form
from stepfork_otel.trace.models import LlmRequest, ToolCall

__all__ = [
    "MATCHERS",
    "MatchContext",
    "Matcher",
    "Miss",
    "compared_input",
    "concurrent_mismatch_error",
    "consumed_earlier",
    "describe_call",
    "exhausted_error",
    "first_miss",
    "input_fingerprint",
    "kind",
    "llm_model",
    "llm_provider",
    "mismatch_error",
    "model_fingerprint",
    "position",
    "recorded_later",
    "redacted_input",
    "same_call",
    "tool_name",
]


@dataclass(frozen=True)
class Miss:
    """Why a call does not match the recorded call: the reason, and detail lines under it."""

    reason: str
    """One line, the ``reason`` of the ``ReplayMismatchError``."""
    details: tuple[str, ...] = ()
    """Shown under the expected/actual descriptions (e.g. where two inputs first differ)."""


class MatchContext(NamedTuple):
    """What a matcher may need beyond the two calls. A named tuple: one is made per call."""

    plan: Sequence[RecordedCall]
    """The replay plan, to name the recorded calls a nesting refers to."""
    cursor: int
    """Plan index of the recorded call under the cursor (the one matched against)."""
    parent: int | None
    """Plan index of the recorded call whose body is running this call (None: run level)."""
    drift_allowed: bool = False
    """The call will run live in hybrid mode: its input may differ from the recording."""


Matcher = Callable[[BoundaryCall, RecordedCall, MatchContext], Miss | None]


def _where(plan: Sequence[RecordedCall], parent: int | None) -> str:
    return "at run level" if parent is None else f"inside {plan[parent].event.id}"


def _a(kind: str) -> str:
    return "an llm" if kind == "llm" else f"a {kind}"


def position(call: BoundaryCall, expected: RecordedCall, ctx: MatchContext) -> Miss | None:
    """The call is made at the nesting the recorded call was: run level, or inside the same call."""
    if expected.parent == ctx.parent:
        return None
    return Miss(
        f"call made {_where(ctx.plan, ctx.parent)}, but the next recorded call was made "
        f"{_where(ctx.plan, expected.parent)}"
    )


def kind(call: BoundaryCall, expected: RecordedCall, ctx: MatchContext) -> Miss | None:
    """A tool call where a tool call was recorded, an LLM call where an LLM call was."""
    if expected.kind == call.kind:
        return None
    return Miss(
        f"kind differs: recorded {_a(expected.kind)} call, this run made {_a(call.kind)} call"
    )


def tool_name(call: BoundaryCall, expected: RecordedCall, ctx: MatchContext) -> Miss | None:
    """The tool called is the tool recorded."""
    event = expected.event
    if not isinstance(event, ToolCall) or event.name == call.name:
        return None
    return Miss(f"tool name differs: recorded {event.name!r}, this run called {call.name!r}")


def llm_provider(call: BoundaryCall, expected: RecordedCall, ctx: MatchContext) -> Miss | None:
    """The LLM provider is the one recorded."""
    event = expected.event
    if not isinstance(event, LlmRequest) or event.provider == call.provider:
        return None
    return Miss(
        f"LLM provider differs: recorded {event.provider!r}, this run used {call.provider!r}"
    )


def llm_model(call: BoundaryCall, expected: RecordedCall, ctx: MatchContext) -> Miss | None:
    """The LLM model is the one recorded."""
    event = expected.event
    if not isinstance(event, LlmRequest) or event.model == call.model:
        return None
    return Miss(f"LLM model differs: recorded {event.model!r}, this run used {call.model!r}")


def compared_input(call: BoundaryCall, expected: RecordedCall) -> tuple[str, str]:
    """The live input (text, fingerprint) in the terms of the recorded one: the call's own
    redacted canonical input, or -- for an LLM call imported from spans that held a projection
    of the request (``fidelity`` messages-only/truncated) -- the live request projected onto the
    recorded form, so that what the trace held is compared and nothing else."""
    event = expected.event
    if (
        event.fidelity not in k.SEMANTIC_FIDELITIES
        or event.input is None
        or call.input.unserialisable
        or call.kind != expected.kind
    ):
        return call.input.text, call.input.sha256
    try:
        live, recorded = loads(call.input.text), loads(event.input)
    except (ValueError, RecursionError):  # (the structure checks refuse such a bundle first)
        return call.input.text, call.input.sha256
    if isinstance(event, LlmRequest):
        text = canonical_json(live_form(event.provider, live, recorded))
    else:
        text = canonical_json(live_arguments(live, recorded))
    return text, sha256_hex(text)


def _same_input(call: BoundaryCall, expected: RecordedCall) -> bool:
    """Same redacted canonical input: the text when it was recorded, else its fingerprint."""
    text, sha = compared_input(call, expected)
    recorded = expected.event.input
    if recorded is not None:
        return recorded == text
    return expected.input_sha256 == sha


def redacted_input(call: BoundaryCall, expected: RecordedCall, ctx: MatchContext) -> Miss | None:
    """The redacted canonical input is the recorded one (a hybrid call that runs live may drift).
    An input with no canonical form, or a recorded input that is missing with no fingerprint to
    stand for it, cannot be matched at all."""
    event = expected.event
    if call.input.unserialisable:
        return Miss(
            "the input of this call has no canonical JSON form, so it cannot be matched "
            f"against the recording ({call.input.text}); make the arguments JSON-encodable"
        )
    if event.input is None and expected.input_sha256 is None:
        return Miss(
            f"the recorded input of {event.id} is missing "
            f"({event.input_missing or 'not recorded'}) and has no fingerprint to match"
        )
    if ctx.drift_allowed or _same_input(call, expected):
        return None
    if event.fidelity in k.SEMANTIC_FIDELITIES and isinstance(event, ToolCall):
        hint = " (an imported tool call: the arguments the model sent are compared)"
    elif event.fidelity in k.SEMANTIC_FIDELITIES:
        hint = (
            f" (an imported call, fidelity {event.fidelity}: the request is compared on what "
            "the trace held -- model, messages"
            + (", tool definitions" if "tool definitions" not in (event.unchecked or ()) else "")
            + ")"
        )
    elif call.input_hint is not None:
        hint = f" ({call.input_hint})"
    elif call.kind == "tool":
        hint = " (arguments are normalised with their defaults: a changed default counts)"
    else:
        hint = " (the prompt payload passed to llm_request is part of the input)"
    compared = compared_input(call, expected)[0]
    details = () if event.input is None else tuple(first_difference(event.input, compared))
    if event.input is not None and event.fidelity in k.SEMANTIC_FIDELITIES:
        # the actual input shown is the request as sent; say where it differs in the form's terms
        path = first_differing_path(event.input, compared)
        details = (f"in the recording's terms: first differing path: {path}", *details)
    return Miss("input differs from the recording" + hint, details)


def input_fingerprint(call: BoundaryCall, expected: RecordedCall, ctx: MatchContext) -> Miss | None:
    """The same input has the recorded fingerprint. Defence in depth: a bundle whose stored
    fingerprint disagrees with its input is rejected when the session starts."""
    if expected.input_sha256 in (None, compared_input(call, expected)[1]) or not _same_input(
        call, expected
    ):
        return None  # a drifted hybrid input has another fingerprint, and says so in its notes
    return Miss("input fingerprint differs from the recorded fingerprint")


def model_fingerprint(call: BoundaryCall, expected: RecordedCall, ctx: MatchContext) -> Miss | None:
    """The model fingerprint (provider, model and operation) is the recorded one: a changed
    operation is caught here, after provider and model matched."""
    event = expected.event
    if (
        not isinstance(event, LlmRequest)
        or event.model_fingerprint is None
        or call.model_fingerprint is None
        or event.model_fingerprint == call.model_fingerprint
    ):
        return None
    return Miss(
        f"model fingerprint differs: recorded operation {event.operation!r}, this run "
        f"used {call.operation!r}"
    )


MATCHERS: tuple[Matcher, ...] = (
    position,
    kind,
    tool_name,
    llm_provider,
    llm_model,
    redacted_input,
    input_fingerprint,
    model_fingerprint,
)
"""The checks of a call against the recorded call under the cursor, in the documented order."""


def first_miss(
    call: BoundaryCall,
    expected: RecordedCall,
    ctx: MatchContext,
    matchers: Sequence[Matcher] = MATCHERS,
) -> Miss | None:
    """The first matcher's miss (None: the call matches the recorded one)."""
    for matcher in matchers:
        miss = matcher(call, expected, ctx)
        if miss is not None:
            return miss
    return None


# --- explaining a divergence -----------------------------------------------------------------------


def describe_call(call: BoundaryCall) -> CallDescription:
    """The call this run made, as diagnostics show it (built only on the way to an error)."""
    return CallDescription(
        kind=call.kind,
        name=call.name,
        provider=call.provider,
        model=call.model,
        input_preview=call.input.text,
        input_sha256=call.input.sha256,
        model_fingerprint=call.model_fingerprint,
        fingerprint_source="live",
        operation=call.operation,
    )


def same_call(call: BoundaryCall, rc: RecordedCall) -> bool:
    """``rc`` is this very call: same kind, same name (or provider and model), same input."""
    if rc.kind != call.kind or rc.input_sha256 != compared_input(call, rc)[1]:
        return False
    event = rc.event
    if isinstance(event, ToolCall):
        return event.name == call.name
    return event.provider == call.provider and event.model == call.model


def recorded_later(
    plan: Sequence[RecordedCall], cursor: int, call: BoundaryCall, parent: int | None
) -> RecordedCall | None:
    """A pending recorded call after the cursor, at the same nesting, equal to ``call``."""
    for rc in plan[cursor + 1 :]:
        if rc.state == "pending" and rc.parent == parent and same_call(call, rc):
            return rc
    return None


def consumed_earlier(
    plan: Sequence[RecordedCall], cursor: int, call: BoundaryCall, parent: int | None
) -> RecordedCall | None:
    """The latest consumed recorded call before the cursor, at the same nesting, equal to
    ``call`` (the agent repeats a call, e.g. a retry, that was recorded once)."""
    for rc in reversed(plan[:cursor]):
        if rc.state == "consumed" and rc.parent == parent and same_call(call, rc):
            return rc
    return None


LiveContext = tuple[CallDescription | None, list[str]]
"""The live LLM call a divergence followed and detail lines about it (``results.after_live``)."""


def mismatch_error(
    call: BoundaryCall,
    position: int,
    expected: RecordedCall,
    miss: Miss,
    ctx: MatchContext,
    after: LiveContext,
) -> ReplayMismatchError:
    """The error of the first miss -- reworded when content explains it better: the call was
    recorded later (the order differs), or its recorded answer was already consumed."""
    exp = expected.describe()
    error_type: type[ReplayMismatchError] = ReplayMismatchError
    reason = miss.reason
    later = recorded_later(ctx.plan, ctx.cursor, call, ctx.parent)
    earlier = (
        None if later is not None else consumed_earlier(ctx.plan, ctx.cursor, call, ctx.parent)
    )
    if later is not None:
        reason = (
            f"call order differs: this call was recorded later, as {later.event.id}, but "
            f"the next recorded call is {exp.label()} ({expected.event.id}) [{reason}]"
        )
    elif earlier is not None:
        error_type = ReplayExhaustedError
        reason = (
            f"recorded call consumed twice: this call's recorded answer ({earlier.event.id})"
            f" was already consumed, and the recording has it once; the next recorded "
            f"call is {exp.label()} ({expected.event.id}) [{reason}]"
        )
    live, live_details = after
    return error_type(
        reason,
        position=position,
        expected=exp,
        actual=describe_call(call),
        details=live_details + list(miss.details),
        after_live_call=live,
    )


def exhausted_error(
    call: BoundaryCall,
    position: int,
    plan: Sequence[RecordedCall],
    after: LiveContext,
) -> ReplayExhaustedError:
    """The error of a call made when no recorded call is left (naming its recorded answer when
    the agent repeats a call that was recorded once)."""
    actual = describe_call(call)
    again = next((rc for rc in plan if rc.state == "consumed" and same_call(call, rc)), None)
    details = [f"its recorded answer ({again.event.id}) was already consumed"] if again else []
    live, live_details = after
    return ReplayExhaustedError(
        f"{actual.label()} was made after the recording was used up "
        f"({len(plan)} recorded calls, all consumed or skipped)",
        position=position,
        actual=actual,
        details=live_details + details,
        after_live_call=live,
    )


def _shared_ends(texts: Sequence[str]) -> tuple[int, int]:
    """How many characters every text shares at its start, and then at its end."""
    shortest = min(len(t) for t in texts)
    first = texts[0]
    head = next((n for n in range(shortest) if any(t[n] != first[n] for t in texts)), shortest)
    rest = shortest - head
    tail = next((n for n in range(rest) if any(t[-1 - n] != first[-1 - n] for t in texts)), rest)
    return head, tail


_COMPARED_CHARS = 2_000
"""How much of the differing middle of two inputs the similarity ratio reads (it is quadratic)."""


def _closeness(
    call: BoundaryCall, rc: RecordedCall, plan: Sequence[RecordedCall], ends: tuple[int, int]
) -> tuple[int, float, int]:
    """How near ``rc`` is to ``call``: how far down the matchers it got, then how alike the parts
    of the inputs are that differ between the calls in flight (what all of them share -- a system
    prompt, the JSON around one argument -- says nothing), then recorded order."""
    ctx = MatchContext(plan, rc.index, rc.parent)
    rank = next((n for n, m in enumerate(MATCHERS) if m(call, rc, ctx) is not None), len(MATCHERS))
    head, tail = ends
    a, b = rc.event.input or "", call.input.text
    middle_a, middle_b = a[head : len(a) - tail], b[head : len(b) - tail]
    ratio = SequenceMatcher(
        None, middle_a[:_COMPARED_CHARS], middle_b[:_COMPARED_CHARS], autojunk=False
    ).ratio()
    return rank, ratio, -rc.index


def concurrent_mismatch_error(
    call: BoundaryCall,
    position: int,
    plan: Sequence[RecordedCall],
    misses: Sequence[tuple[RecordedCall, Miss]],
    parent: int | None,
    after: LiveContext,
) -> ReplayMismatchError:
    """The error of a call that matches none of the recorded calls in flight (concurrent
    siblings that may come in any order): it names the nearest of them, and where its input
    differs. When content explains it better, it says so: the call was recorded later (after
    the calls in flight), or its recorded answer was already consumed."""
    ends = _shared_ends([call.input.text, *(rc.event.input or "" for rc, _ in misses)])
    nearest, miss = max(misses, key=lambda item: _closeness(call, item[0], plan, ends))
    ids = ", ".join(rc.event.id for rc, _ in misses)
    in_flight = f"the recorded calls in flight here ({ids})"
    error_type: type[ReplayMismatchError] = ReplayMismatchError
    flying = {rc.index for rc, _ in misses}
    later = next(
        (
            rc
            for rc in plan[min(flying) :]
            if rc.state == "pending"
            and rc.parent == parent
            and rc.index not in flying
            and same_call(call, rc)
        ),
        None,
    )
    earlier = None if later is not None else _consumed(plan, call, parent)
    if later is not None:
        reason = (
            f"call order differs: this call was recorded later, as {later.event.id}, after "
            f"{in_flight}; the nearest of them is {nearest.event.id} [{miss.reason}]"
        )
    elif earlier is not None:
        error_type = ReplayExhaustedError
        reason = (
            f"recorded call consumed twice: this call's recorded answer ({earlier.event.id}) "
            f"was already consumed, and the recording has it once; this call matches none of "
            f"{in_flight}, the nearest is {nearest.event.id} [{miss.reason}]"
        )
    else:
        reason = f"{miss.reason}: this call matches none of {in_flight}; the nearest is " + (
            nearest.event.id
        )
    details = list(miss.details)
    recorded = nearest.event.input
    if recorded is not None and not call.input.unserialisable:
        path = first_differing_path(recorded, call.input.text)
        if path is not None:
            details.insert(0, f"first differing path: {path}")
    live, live_details = after
    return error_type(
        reason,
        position=position,
        expected=nearest.describe(),
        actual=describe_call(call),
        details=live_details + details,
        after_live_call=live,
    )


def _consumed(
    plan: Sequence[RecordedCall], call: BoundaryCall, parent: int | None
) -> RecordedCall | None:
    """The latest consumed recorded call at this nesting equal to ``call``."""
    for rc in reversed(plan):
        if rc.state == "consumed" and rc.parent == parent and same_call(call, rc):
            return rc
    return None
