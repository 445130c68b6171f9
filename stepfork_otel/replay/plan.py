"""The replay plan: a bundle's recorded calls in the order they started, each paired with its
outcome and with its place in the nesting known.

The plan is built once, when a session starts, in one pass over the events: a session on a
100,000-call bundle must cost little beyond reading and verifying the file.

Each call knows its children. It is tempting to treat a call's descendants as the contiguous run
of calls after it (one ``end`` index), and that holds for sequential code -- but not for
concurrent code: two tasks started together record ``A, B, A's inner call``, so A's descendants are
not contiguous. Skipping the descendants of a substituted call therefore marks them, and the
cursor moves to the next call still pending.

Pairing a call with its outcome is :func:`~stepfork_otel.trace.models.pair_outcomes`: by
``parent_id``, or the documented legacy rule for bundles without parent links. A call with no
outcome is a call with a *missing* result: replay raises at it rather than inventing one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from stepfork_otel.replay.errors import COMPUTED_FROM_TRACE, CallDescription
from stepfork_otel.trace.canonical import sha256_hex, stored_or_sha256
from stepfork_otel.trace.models import (
    LlmRequest,
    OutcomeEvent,
    ToolCall,
    Trace,
    pair_outcomes,
)
from stepfork_otel.trace.policy import ReplayPolicy

CallState = Literal["pending", "consumed", "skipped", "not_reached"]


@dataclass(slots=True)
class RecordedCall:
    """One recorded call in the replay plan."""

    index: int
    """0-based position in the plan (the order calls started in the recorded run)."""
    event: ToolCall | LlmRequest
    outcome: OutcomeEvent | None
    """The paired ``tool_result``/``llm_response``/``error`` event; None: a missing result."""
    parent: int | None
    """Plan index of the enclosing recorded call (None: made at run level)."""
    children: list[int] = field(default_factory=list)
    """Plan indexes of the calls made directly inside this one."""
    input_sha256: str | None = None
    """The stored input fingerprint, or one computed from the stored input (legacy bundles)."""
    fingerprint_source: str = "stored"
    state: CallState = "pending"
    """``pending`` (not reached yet), ``consumed`` (matched: substituted or executed), ``skipped``
    (inside a substituted call, whose body did not run) or ``not_reached`` (inside an executed
    call whose body did not make it)."""

    @property
    def kind(self) -> str:
        return "tool" if isinstance(self.event, ToolCall) else "llm"

    @property
    def name(self) -> str:
        """Tool name, or the model of an LLM call."""
        return self.event.name if isinstance(self.event, ToolCall) else self.event.model

    @property
    def policy(self) -> ReplayPolicy:
        return self.event.replay_policy

    @property
    def output_sha256(self) -> str | None:
        outcome = self.outcome
        if outcome is None:
            return None
        return stored_or_sha256(outcome.output, outcome.output_sha256)

    def describe(self) -> CallDescription:
        event = self.event
        llm = event if isinstance(event, LlmRequest) else None
        return CallDescription(
            kind=self.kind,
            name=self.name,
            provider=llm.provider if llm else None,
            model=llm.model if llm else None,
            input_preview=event.input,
            input_sha256=self.input_sha256,
            model_fingerprint=llm.model_fingerprint if llm else None,
            event_id=event.id,
            fingerprint_source=self.fingerprint_source,
            output_sha256=self.output_sha256,
            operation=llm.operation if llm else None,
        )


def build_plan(trace: Trace) -> list[RecordedCall]:
    """The recorded calls of ``trace`` in start order, paired with outcomes, nesting resolved.
    Outcomes are paired by :func:`~stepfork_otel.trace.models.pair_outcomes`, the one pairing
    rule (``parent_id``, or the legacy rule for bundles without it)."""
    outcome_of: dict[str, OutcomeEvent] = {}
    for outcome, paired_call in pair_outcomes(trace.events):
        if paired_call is not None:
            outcome_of.setdefault(paired_call.id, outcome)
    calls: list[RecordedCall] = []
    by_id: dict[str, RecordedCall] = {}
    for event in trace.events:
        if not isinstance(event, (ToolCall, LlmRequest)):
            continue
        parent = by_id.get(event.parent_id) if event.parent_id else None
        rc = RecordedCall(
            len(calls), event, outcome_of.get(event.id), parent.index if parent else None
        )
        if parent is not None:
            parent.children.append(rc.index)
        if event.input_sha256 is None and event.input is not None:
            rc.input_sha256 = sha256_hex(event.input)
            rc.fingerprint_source = COMPUTED_FROM_TRACE
        else:
            rc.input_sha256 = event.input_sha256
        calls.append(rc)
        by_id[event.id] = rc
    return calls


def descendants(plan: list[RecordedCall], call: RecordedCall) -> Iterator[RecordedCall]:
    """Every call recorded inside ``call``, at any depth."""
    stack = list(reversed(call.children))
    while stack:
        inner = plan[stack.pop()]
        yield inner
        stack.extend(reversed(inner.children))
