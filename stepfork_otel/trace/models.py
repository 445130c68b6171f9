"""What a recorded run is: the `.sftrace` data model.

A :class:`Trace` is one run: its input and output, the ordered list of boundary events (every call
followed, in order of start, by the calls made inside it, and each call's outcome) and the user's
own spans around them, kept as context. Events form a discriminated union on ``type`` with one
module-level :class:`~pydantic.TypeAdapter`, so a bundle round-trips through one code path.

Payloads (``input`` / ``output``) are kept as the exact canonical JSON *text* that was hashed:
verifying a fingerprint is then one SHA-256 over the stored string, and loading a large bundle never
re-serialises or even parses the payloads. Use :func:`payload_value` to get the value back.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from stepfork_otel.constants import FORMAT_NAME, FORMAT_VERSION, CapturedKind, ReplayAction
from stepfork_otel.trace.canonical import canonical_json
from stepfork_otel.trace.canonical import loads as canonical_loads
from stepfork_otel.trace.policy import ReplayPolicy

Status = Literal["ok", "error", "skipped"]
"""Outcome of a call: ``skipped`` means it was rejected before its body ran (replay runs)."""
MissingReason = Literal["size_cap", "capture_disabled", "truncated", "not_recorded"]
"""Why a payload is absent: left off the span by the size cap or by disabled content capture,
cut by an OTel attribute length limit (the fingerprint disagreed), or never recorded."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Event(_Model):
    type: str
    """The event type (each event class narrows it to its literal); written first, for readers."""
    id: str
    """Stable id within the bundle: ``call-<n>`` for a call, ``call-<n>.result``/``.error``."""
    parent_id: str | None = None
    """For a call: the enclosing call's id (nesting) or None at run level. For an outcome: its call."""
    trace_id: str
    span_id: str
    parent_span_id: str | None = None
    """The OTel parent span (may be one of the user's own spans, see ``Trace.context``)."""
    seq: int
    """1-based position of the call in the run (outcome events carry their call's number)."""
    status: Status = "ok"
    replay_policy: ReplayPolicy = ReplayPolicy.REPLAYABLE
    input_sha256: str | None = None
    output_sha256: str | None = None
    time_unix_nano: int = 0
    """Start of the call (call events) or its end (outcome events)."""
    replay_action: ReplayAction | None = None
    """Set on events of a replay run: what replay did with the call."""


Fidelity = Literal["exact", "messages-only", "truncated"]
"""How much of a call imported from another instrumentation's spans the bundle holds (see
``docs/collectors.md``): ``exact`` -- the request and response as sent and received;
``messages-only`` -- the request as a form (messages, and the tools and parameters the span held)
matched on what it holds, the response rebuilt from the output messages; ``truncated`` -- the
same with the earliest messages lost."""


class _CallEvent(_Event):
    input: str | None = None
    """Redacted canonical JSON of the input, exactly the text that ``input_sha256`` hashes."""
    input_size: int | None = None
    input_missing: MissingReason | None = None
    fidelity: Fidelity | None = None
    """Set on calls imported from another instrumentation's spans (None: recorded by stepfork).
    ``messages-only`` and ``truncated`` calls hold a request form as input
    (``trace/foreign_request.py``), and replay compares the live request in its terms."""
    unchecked: list[str] | None = None
    """What of the request the imported span did not hold, so replay does not compare it."""


class _OutcomeEvent(_Event):
    output: str | None = None
    """Redacted JSON of the output as the call returned it (its objects' keys in the order they
    came back, not sorted), exactly the text that ``output_sha256`` hashes: what replay hands
    back, decoded once. Inputs are canonical because matching is; outputs are never matched."""
    output_size: int | None = None
    output_missing: MissingReason | None = None
    duration_ns: int = 0


class ToolCall(_CallEvent):
    """A call of an ``@trace_tool`` function; ``input`` holds its normalised arguments."""

    type: Literal["tool_call"] = "tool_call"
    name: str


class ToolResult(_OutcomeEvent):
    """What a tool returned."""

    type: Literal["tool_result"] = "tool_result"
    name: str


class LlmRequest(_CallEvent):
    """An ``llm_request``/``allm_request`` call; ``input`` holds the request payload (the prompt)."""

    type: Literal["llm_request"] = "llm_request"
    provider: str
    model: str
    operation: str = "chat"
    model_fingerprint: str | None = None
    """SHA-256 of the canonical ``{"model", "operation", "provider"}``."""


class LlmResponse(_OutcomeEvent):
    """What an LLM call returned."""

    type: Literal["llm_response"] = "llm_response"
    provider: str
    model: str
    usage: dict[str, int] | None = None


class ErrorEvent(_OutcomeEvent):
    """A call that raised: the exception type and its redacted message. ``output`` holds
    :func:`error_output` of them, so the outcome is fingerprinted like any other."""

    type: Literal["error"] = "error"
    status: Status = "error"
    error_type: str
    message: str


def error_output(error_type: str, message: str) -> str:
    """The ``output`` of an :class:`ErrorEvent`: canonical ``{"error_type", "message"}``."""
    return canonical_json({"error_type": error_type, "message": message})


Event = Annotated[
    ToolCall | ToolResult | LlmRequest | LlmResponse | ErrorEvent, Field(discriminator="type")
]
CallEvent = ToolCall | LlmRequest
OutcomeEvent = ToolResult | LlmResponse | ErrorEvent


class CapturedRead(_Model):
    """One nondeterministic read the run's own code made -- the clock, the global ``random``
    functions, a uuid, random bytes, an environment variable -- with where it was asked for.
    Replay serves ``value`` reads back to each ``thread`` in ``index`` order and checks each live
    read's source and call site against the recorded one (``recording/determinism.py``)."""

    index: int
    """1-based order of the read among the run's captured reads (all its threads')."""
    kind: CapturedKind = "value"
    """``value``: served in replay; ``env``: an environment variable, checked (never served);
    ``audit``: a tally of reads at one site (``capture="audit"``), neither served nor checked."""
    source: str
    """What was read: ``time.time``, ``datetime.now``, ``random.choice``, ``uuid.uuid4``,
    ``os.urandom``, ``secrets.token_hex``, ``os.environ``, ..."""
    module: str
    function: str
    line: int
    """The call site in the run's code: module name, function name, line number."""
    offset: int | None = None
    """The line's distance from the start of its function: what replay compares, so that an edit
    elsewhere in the file (an import added at the top) does not move the site."""
    before_call: int | None = None
    """The ``seq`` of the boundary call the run started next (None: after its last call)."""
    thread: str | None = None
    """Which of the run's threads and tasks made the read: None for the one the run started in;
    ``"2"`` for the second thread or task the run's own code started, ``"2.1"`` for the first
    that one started (numbered in the order each was started, which replays; not in the order
    they read, which need not). Replay serves each thread its own values."""
    value: Any = None
    """The value the read returned, as JSON (see ``docs/replay.md`` for each source's form)."""
    name: str | None = None
    """``env``: the variable's name."""
    sha256: str | None = None
    """``env``: SHA-256 of the variable's value (never the value itself); None: it was unset."""
    count: int | None = None
    """``audit``: how many reads of ``source`` were made at this site."""

    @property
    def site(self) -> str:
        """``module:function:line``, as messages print it."""
        return f"{self.module}:{self.function}:{self.line}"


class ContextSpan(_Model):
    """One of the user's own spans around the boundaries (names and timing only, no attributes:
    they were not redacted by stepfork, so they are not copied into the bundle)."""

    span_id: str
    parent_span_id: str | None = None
    name: str
    kind: str = "INTERNAL"
    start_time_unix_nano: int = 0
    end_time_unix_nano: int = 0
    status: Literal["unset", "ok", "error"] = "unset"


class RunInfo(_Model):
    """The run: the root span opened by ``record(...)`` (or the trace's local root)."""

    name: str | None = None
    span_id: str | None = None
    entrypoint: str | None = None
    """``module:function`` the run was recorded from: a hint to copy, never imported."""
    input: str | None = None
    input_sha256: str | None = None
    input_missing: MissingReason | None = None
    output: str | None = None
    output_sha256: str | None = None
    output_missing: MissingReason | None = None
    status: Literal["ok", "error", "unset"] = "unset"
    error_type: str | None = None
    error_message: str | None = None
    start_time_unix_nano: int = 0
    end_time_unix_nano: int = 0
    replay_mode: str | None = None
    """Set when this run is itself a replay (its spans carried ``stepfork.replay.mode``)."""
    capture: list[str] | None = None
    """The capture sources the run was recorded with (``record(capture=...)``), or ``["audit"]``."""
    untraced_tools: list[str] | None = None
    """An imported run (``stepfork import``): the tools the model called that no span of the
    trace shows running. Replay refuses them in frozen mode; live mode runs those allowed."""


class ForkOrigin(_Model):
    """The run a forked run was forked from (``ReplaySession.from_trace(..., fork_at=N,
    record_to=...)``): the fork's calls before ``at_call`` are that run's own calls, their event
    lines byte for byte; from ``at_call`` on they are the fork's."""

    trace_id: str
    """The trace id of the original run."""
    lines_sha256: str
    """The original bundle's lines fingerprint (its end line's ``lines_sha256``): which bundle,
    exactly, the calls before ``at_call`` were taken from."""
    at_call: int
    """The fork point N: the position of the first call that ran live, as ``stepfork show``
    numbers the original's calls (``call-N``)."""
    span_id: str | None = None
    """The original run's span (what the fork's run span links to)."""
    bundle: str | None = None
    """The original bundle's file name when it was read from a file (a hint)."""


class Trace(_Model):
    """One recorded run, as stored in a `.sftrace` bundle."""

    format: Literal["sftrace"] = FORMAT_NAME
    format_version: int = FORMAT_VERSION
    trace_id: str
    complete: bool = True
    """False when the run did not finish (process shut down, span limit hit)."""
    incomplete_reason: str | None = None
    created_by: str | None = None
    forked_from: ForkOrigin | None = None
    """Set on a fork: the run, bundle and call it was forked from (see :class:`ForkOrigin`)."""
    run: RunInfo = RunInfo()
    events: list[Event] = []
    context: list[ContextSpan] = []
    dropped_spans: int = 0
    """Spans of this trace the processor had to drop (per-trace cap)."""
    captured: list[CapturedRead] = []
    """Clock, randomness, uuid and environment reads of the run, in order."""

    # -- bundle IO: thin delegates -----------------------------------------------------------
    # ``trace/bundle.py`` and ``trace/otlp.py`` import this module, so it cannot import them: the
    # implementations are looked up on call in the package face ``stepfork_otel.trace`` (a PEP 562
    # name there, imported when first used). No import of this module loads them.

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        """Load and validate a bundle (:func:`stepfork_otel.trace.bundle.load_trace`). Raises
        :class:`~stepfork_otel.trace.errors.BundleError`."""
        from stepfork_otel.trace import load_trace

        return load_trace(path)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the bundle atomically, temporary file + rename
        (:func:`stepfork_otel.trace.bundle.save_trace`)."""
        from stepfork_otel.trace import save_trace

        save_trace(self, path)

    @classmethod
    def from_otlp_json(cls, source: Any, trace_id: str | None = None) -> Trace:
        """Rebuild a bundle from OTLP JSON as a collector's file exporter wrote it (see
        :func:`stepfork_otel.trace.otlp.trace_from_otlp_json`)."""
        from stepfork_otel.trace import trace_from_otlp_json

        return trace_from_otlp_json(source, trace_id)

    # -- views -----------------------------------------------------------------------------------

    @property
    def calls(self) -> list[CallEvent]:
        """The call events, in order."""
        return [e for e in self.events if isinstance(e, (ToolCall, LlmRequest))]

    def outcome_of(self, call: CallEvent) -> OutcomeEvent | None:
        """The outcome event paired with ``call`` (None: a missing result). Pairing follows
        ``parent_id``, or the legacy rule for outcomes without one (see :func:`pair_outcomes`)."""
        return _outcome_index(self).get(call.id)


def pair_outcomes(events: Iterable[Event]) -> Iterator[tuple[OutcomeEvent, CallEvent | None]]:
    """Each outcome event with the call it belongs to (None: no such call), in event order.

    An outcome names its call in ``parent_id``. Bundles written before parent links (or by hand)
    are paired the documented legacy way (DESIGN.md): a tool call takes the next unpaired result
    of the same tool name before that tool is called again (an LLM call: of the same model) -- a
    call of the same name made before any result leaves the earlier call without one; an error
    takes the most recent unpaired call. A ``parent_id`` may point at a call that already has an
    outcome (a bundle error the caller can report); a legacy outcome only ever takes a call
    without one.
    """
    calls: dict[str, CallEvent] = {}
    order: list[CallEvent] = []
    paired: set[str] = set()
    legacy: _LegacyPairing | None = None  # built when the first outcome without a link shows up
    for event in events:
        if isinstance(event, (ToolCall, LlmRequest)):
            calls.setdefault(event.id, event)
            if legacy is None:
                order.append(event)
            else:
                legacy.add(event)
            continue
        call: CallEvent | None
        if event.parent_id is not None:
            call = calls.get(event.parent_id)
        else:
            if legacy is None:
                legacy = _LegacyPairing()
                for earlier in order:
                    if earlier.id not in paired:
                        legacy.add(earlier)
            call = legacy.take(event, paired)
        if call is not None:
            paired.add(call.id)
        yield event, call


class _LegacyPairing:
    """The unpaired calls: per tool name / model the one still open for a result (calling the
    same tool again closes the earlier call), and overall (most recent last) for errors."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, str], CallEvent] = {}
        self.recent: list[CallEvent] = []

    def add(self, call: CallEvent) -> None:
        self.open[_legacy_key(call)] = call
        self.recent.append(call)

    def take(self, outcome: OutcomeEvent, paired: set[str]) -> CallEvent | None:
        if isinstance(outcome, ErrorEvent):
            recent = self.recent
            while recent and recent[-1].id in paired:
                recent.pop()
            return recent[-1] if recent else None
        call = self.open.get(_legacy_key(outcome))
        return None if call is None or call.id in paired else call


def _legacy_key(event: ToolCall | LlmRequest | ToolResult | LlmResponse) -> tuple[str, str]:
    if isinstance(event, (ToolCall, ToolResult)):
        return ("tool", event.name)
    return ("llm", event.model)


# One index per Trace object, built on first use: a caller that looks up every call's outcome
# (``stepfork show`` on a 100,000-call bundle) must not rescan the events each time. Keyed by
# id() with a weak reference, because hashing a frozen Trace would hash all of its events.
_outcome_indexes: dict[int, tuple[weakref.ref[Trace], dict[str, OutcomeEvent]]] = {}


def _outcome_index(trace: Trace) -> dict[str, OutcomeEvent]:
    key = id(trace)
    cached = _outcome_indexes.get(key)
    if cached is not None and cached[0]() is trace:
        return cached[1]
    index: dict[str, OutcomeEvent] = {}
    for outcome, call in pair_outcomes(trace.events):
        if call is not None:
            index.setdefault(call.id, outcome)

    def forget(_: weakref.ref[Trace]) -> None:
        _outcome_indexes.pop(key, None)

    _outcome_indexes[key] = (weakref.ref(trace, forget), index)
    return index


def label(kind: str, name: str, provider: str | None = None, model: str | None = None) -> str:
    """How a call is named everywhere people read it: ``tool <name>`` or
    ``llm <provider>/<model>``."""
    return f"llm {provider}/{model}" if kind == "llm" else f"tool {name}"


def call_label(call: CallEvent) -> str:
    """:func:`label` of a recorded call."""
    if isinstance(call, LlmRequest):
        return label("llm", call.model, call.provider, call.model)
    return label("tool", call.name)


def payload_value(text: str | None) -> Any:
    """The JSON value of a stored payload (None when absent). Integers beyond 64 bits stay
    exact (orjson would read them as floats; the stdlib parser keeps them)."""
    return None if text is None else canonical_loads(text)


EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
TRACE_ADAPTER: TypeAdapter[Trace] = TypeAdapter(Trace)
