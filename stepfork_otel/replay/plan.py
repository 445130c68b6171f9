"""The replay plan: a bundle's recorded calls in the order they started, each paired with its
outcome and with its place in the nesting known.

The plan is built once, when a session starts, in one pass over the events: a session on a
100,000-call bundle must cost little beyond reading and verifying the file.

Each call knows its children. It is tempting to treat a call's descendants as the contiguous run
of calls after it (one ``end`` index), and that holds for sequential code -- but not for
concurrent code: two tasks started together record ``A, B, A's inner call``, so A's descendants are
not contiguous. Skipping the descendants of a substituted call therefore marks them, and the
cursor moves to the next call still pending.

Which recorded calls may be matched next is the :class:`Frontier`. Calls recorded one after the
other (one had ended before the next started) are matched in that order; calls that were open
together under one parent -- siblings whose spans overlapped, ``a`` started before ``b`` ended and
``b`` before ``a`` ended -- are matched by their inputs, in whatever order the replayed code starts
them (task scheduling is not part of the recording). The rule is pairwise: a recorded call may be
matched once every earlier sibling that had *ended* before it started is settled (matched, and its
body finished or skipped). For sequential code that is exactly the one call under the cursor.

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

CallState = Literal["pending", "consumed", "skipped", "not_reached", "after_fork"]


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
    (inside a substituted call, whose body did not run), ``not_reached`` (inside an executed
    call whose body did not make it) or ``after_fork`` (at or after the fork point of a fork,
    which runs live from there: nothing after it is replayed)."""
    start_ns: int = 0
    """When the call started in the recorded run (``time_unix_nano`` of the call event)."""
    end_ns: int = 0
    """When it ended (its outcome's time); its start when it has no outcome, so that a call
    without one is never taken for a concurrent one."""
    concurrent: bool = False
    """The call overlapped at least one sibling (same parent) in the recorded run."""
    sibling_position: int = 0
    """Its place among its parent's calls (or the run-level calls), in start order."""
    settled: bool = False
    """Done with, for the order of its siblings: matched and substituted, an executed body that
    ended, or a call skipped or not reached inside one."""

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
    run_level = 0
    latest_end: dict[int | None, RecordedCall] = {}  # per parent: the sibling that ends last
    for event in trace.events:
        if not isinstance(event, (ToolCall, LlmRequest)):
            continue
        parent = by_id.get(event.parent_id) if event.parent_id else None
        rc = RecordedCall(
            len(calls), event, outcome_of.get(event.id), parent.index if parent else None
        )
        if parent is not None:
            rc.sibling_position = len(parent.children)
            parent.children.append(rc.index)
        else:
            rc.sibling_position, run_level = run_level, run_level + 1
        if event.input_sha256 is None and event.input is not None:
            rc.input_sha256 = sha256_hex(event.input)
            rc.fingerprint_source = COMPUTED_FROM_TRACE
        else:
            rc.input_sha256 = event.input_sha256
        rc.start_ns = start = event.time_unix_nano
        ended = rc.outcome
        rc.end_ns = max(start, ended.time_unix_nano) if ended is not None else start
        # a sweep in start order: a call that starts before the latest end among its earlier
        # siblings overlapped the sibling that ends then
        latest = latest_end.get(rc.parent)
        if latest is None or rc.end_ns > latest.end_ns:
            latest_end[rc.parent] = rc
        if latest is not None and overlapped(latest, rc):
            rc.concurrent = latest.concurrent = True
        calls.append(rc)
        by_id[event.id] = rc
    return calls


def overlapped(a: RecordedCall, b: RecordedCall) -> bool:
    """``a`` and ``b`` were open together in the recorded run (strictly: a call that ended at the
    instant the other started did not overlap it; calls without times never overlap)."""
    return a.start_ns < b.end_ns and b.start_ns < a.end_ns


class Frontier:
    """The pending recorded calls that may be matched next, per parent (see the module
    docstring for the rule). Each parent's siblings are kept in start order with a pointer
    structure that jumps over settled ones, so finding the calls in flight costs the number of
    unsettled calls looked at -- one for sequential code -- not the length of the plan. A
    parent's structure is made when a call is first made under it: the calls recorded inside a
    substituted call never are."""

    __slots__ = ("_jump", "_plan", "_run_level")

    def __init__(self, plan: list[RecordedCall]) -> None:
        self._plan = plan
        self._run_level = [rc.index for rc in plan if rc.parent is None]
        self._jump: dict[int | None, list[int]] = {}
        """Per parent: ``jump[p]`` is a position at or before the first unsettled sibling at or
        after ``p`` (the last entry, one past the siblings, stands for none)."""

    def _siblings(self, parent: int | None) -> list[int]:
        return self._run_level if parent is None else self._plan[parent].children

    def _jumps(self, parent: int | None) -> list[int]:
        jump = self._jump.get(parent)
        if jump is None:
            plan = self._plan
            siblings = self._siblings(parent)
            jump = [p + 1 if plan[i].settled else p for p, i in enumerate(siblings)]
            jump.append(len(siblings))
            self._jump[parent] = jump
        return jump

    @staticmethod
    def _first_unsettled(jump: list[int], position: int) -> int:
        root = position
        while jump[root] != root:
            root = jump[root]
        while jump[position] != root:  # compress the path walked
            jump[position], position = root, jump[position]
        return root

    def settle(self, rc: RecordedCall) -> None:
        """``rc`` is done with: later siblings no longer wait for it."""
        if rc.settled:
            return
        rc.settled = True
        jump = self._jump.get(rc.parent)
        if jump is not None:
            jump[rc.sibling_position] = rc.sibling_position + 1

    def ready(self, parent: int | None) -> list[RecordedCall]:
        """The pending calls recorded under ``parent`` that may be matched now, in recorded
        order: each overlapped every earlier unsettled sibling (the first unsettled one always
        qualifies). Empty when a call recorded there is still running or none is left."""
        siblings, jump = self._siblings(parent), self._jumps(parent)
        plan, out = self._plan, []
        earliest_end = latest_start = 0  # of the unsettled siblings looked at so far
        position = self._first_unsettled(jump, 0)
        first = True
        while position < len(siblings):
            rc = plan[siblings[position]]
            if first:
                if rc.state == "pending":
                    out.append(rc)
                earliest_end, latest_start, first = rc.end_ns, rc.start_ns, False
            else:
                if rc.start_ns >= earliest_end:
                    break  # it started after an unsettled sibling ended: so did every later one
                if rc.state == "pending" and latest_start < rc.end_ns:
                    out.append(rc)  # it overlapped every unsettled sibling before it
                earliest_end = min(earliest_end, rc.end_ns)
                latest_start = max(latest_start, rc.start_ns)
            position = self._first_unsettled(jump, position + 1)
        return out


def descendants(plan: list[RecordedCall], call: RecordedCall) -> Iterator[RecordedCall]:
    """Every call recorded inside ``call``, at any depth."""
    stack = list(reversed(call.children))
    while stack:
        inner = plan[stack.pop()]
        yield inner
        stack.extend(reversed(inner.children))
