"""The boundaries: ``@trace_tool``, ``llm_request`` and ``allm_request``.

This is the one interception point of stepfork_otel. Recording and replay go through the same
code: a call is normalised, canonicalised, redacted and fingerprinted; the active replay session
(if any) decides whether the body runs, is substituted from the recording, or is refused; *then*
the span is opened -- carrying the input and, in a replay, the decision and a substituted output,
all passed when it starts -- and the body runs in it (or does not). Whatever happens is written on
the span, so a replay run is traced like any other run.

Two error regimes meet here. A failure of stepfork's own recording work (an attribute that cannot
be set, a value that cannot be encoded) is logged (``stepfork_otel._internal``) and the
user's call proceeds -- except inside a replay session, where running the call unmatched
would be a silent live fallback, so it is raised. A replay error (mismatch, policy) is raised on
purpose, before the body runs. The user's own exceptions are recorded -- type and *redacted*
message only, because OTel's ``record_exception`` would copy the raw message, secrets included --
and re-raised unchanged.

Only the OpenTelemetry API is imported here: an application without an SDK pays for no-op spans.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import re
import typing
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Iterator,
)
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, TypeVar, overload

import pydantic
from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from stepfork_otel import constants as k
from stepfork_otel._internal import handle_internal_errors, internal_error, log_internal_error
from stepfork_otel.config import CONFIG
from stepfork_otel.recording.arguments import ToolArguments, tool_arguments, unknown_names
from stepfork_otel.recording.contract import (
    BoundaryCall,
    ReplayDecision,
    Replayer,
    current_session,
)
from stepfork_otel.recording.determinism import mark_body, take_pending
from stepfork_otel.recording.handoff import HANDOFF
from stepfork_otel.recording.integrations.genai import describe_request
from stepfork_otel.recording.spans import (
    CALL_START_LOCK,
    check_attributes_kept,
    end_span,
    first_call_of_trace,
    next_call_number,
    record_failure,
    span_payload_attributes,
    usage_attributes,
)
from stepfork_otel.recording.streams import (
    AsyncLiveStream,
    LiveStream,
    Recorder,
    ReplayedStream,
    StreamStart,
    is_stream_value,
    stream_head,
    stream_value,
)
from stepfork_otel.trace.canonical import (
    UNSERIALISABLE_MARKER,
    model_fingerprint,
    unserialisable_marker,
)
from stepfork_otel.trace.models import label, payload_value
from stepfork_otel.trace.payload import Payload, capture, exception_message, qualified_name
from stepfork_otel.trace.policy import ReplayPolicy

logger = logging.getLogger("stepfork_otel")

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C")

# --- the one interception point ------------------------------------------------------------------


@dataclass(slots=True)
class _Prepared:
    call: BoundaryCall
    span_name: str
    span_kind: SpanKind
    attributes: dict[str, Any]
    session: Replayer | None
    """The replay session the call is made in (None: recording)."""
    kept: int | None = None
    """The span id its payloads are kept under in the hand-off (None: nothing is kept)."""
    view: Callable[[Any], Any] | None = None
    """The recorded form of the body's result (an SDK integration records the HTTP response
    it received, not the response object); None: the result itself."""
    describe: Callable[[str, str, Any], dict[str, Any]] | None = None
    """Span attributes read off the *redacted* recorded input and output texts (an
    integration's GenAI semconv attributes, content included when it is captured), given the
    output's JSON value too when it is at hand (a substituted call's, parsed by the session from
    that text; else None); None: ``usage_attributes`` of the result for an LLM call, nothing for
    a tool."""
    rebuild_error: Callable[[str, str], BaseException | None] | None = None
    """An integration's own exception for a recorded failure ``(error type, message)``, built
    by trusted code from a fixed list (never from a class named in the bundle); None, or
    returning None: the session's :class:`RecordedDependencyError`."""
    restream: Callable[[Any], Any] | None = None
    """A recorded single value as the stream a streaming run reads (an integration's response
    imported from another instrumentation's span, which holds the final message, never the
    chunks); None, or returning None: a streaming run of a call recorded as one value diverges."""
    described: dict[str, Any] | None = None
    """A substituted call's described attributes (see :func:`_described`), known before its
    span starts and passed with the others then, after the input's."""


def _captured_input(value: Any) -> tuple[Payload, Replayer | None]:
    """The call's input as recorded, and the replay session the call is made in (if any)."""
    session = current_session.get()
    recorded = None if session is None else session.expected_input()
    return capture(value, CONFIG.settings.redactor, recorded), session


_warned_unreplayable: set[tuple[str, str, str, str]] = set()
_PARAMETER = re.compile(r"parameter '([^']+)'")
"""A parameter named in a tool input's marker (see :func:`_tool_input`)."""


def _unreplayable(call: BoundaryCall, what: str, payload: Payload) -> dict[str, Any]:
    """A value with no JSON form is recorded as a marker, and the call cannot be replayed from
    it: say so while recording (once per call site and reason), not first at replay, and put
    it on the span (:data:`~stepfork_otel.constants.UNREPLAYABLE`), so that the run's bundle
    does not claim to be complete."""
    why = "no JSON form"
    try:  # (recording: a failure here is logged, and the call goes on)
        # the marker says "<type of the value>: <what could not be encoded>"
        why = _marker_reason(payload).partition(": ")[2]
        key = (call.kind, call.name, what, why)
        if key not in _warned_unreplayable:
            _warned_unreplayable.add(key)
            parameters = _PARAMETER.findall(why) if what == "input" and call.kind == "tool" else []
            advice = (
                f"if {'it is' if len(parameters) == 1 else 'they are'} not the tool's input, leave "
                f"{'it' if len(parameters) == 1 else 'them'} out: "
                f"@trace_tool(exclude={tuple(parameters)!r})"
                if parameters
                else "return JSON-encodable values, pydantic models or dataclasses"
            )
            logger.warning(
                "stepfork_otel: the %s of %s has no JSON form (%s); it is recorded as "
                "unserialisable and this call cannot be replayed -- %s",
                what,
                label(call.kind, call.name, call.provider, call.model),
                why,
                advice,
            )
    except Exception:
        internal_error("describing a value with no JSON form")
    return {k.UNREPLAYABLE: f"{what}: {why}"}


def _tool_input(arguments: dict[str, Any], payload: Payload) -> Payload:
    """A tool input with no JSON form, recorded as the marker naming the parameters at fault
    (the whole input's marker names only the innermost value that failed -- a provider object
    deep inside pydantic-ai's ``RunContext`` -- which says nothing of where it came from)."""
    redactor = CONFIG.settings.redactor
    faults = []
    for name, value in arguments.items():
        part = capture(value, redactor)
        if part.unserialisable:
            kind, _, reason = _marker_reason(part).partition(": ")
            shown = f"{name!r}" if reason in ("", kind) else f"{name!r} ({kind})"
            faults.append(f"parameter {shown}: {reason or kind}")
    if not faults:
        return payload
    marker = unserialisable_marker(arguments, "; ".join(faults))
    return capture(marker, redactor)._replace(unserialisable=True)


def _marker_reason(payload: Payload) -> str:
    return str(payload_value(payload.text).get(UNSERIALISABLE_MARKER, ""))


def _prepare_tool(
    name: str,
    policy: ReplayPolicy,
    arguments: dict[str, Any],
    output_type: Any,
    described: dict[str, Any] | None = None,
) -> _Prepared:
    payload, session = _captured_input(arguments)
    if payload.unserialisable:
        payload = _tool_input(arguments, payload)
    call = BoundaryCall("tool", name, payload, policy, output_type=output_type)
    attributes = {
        **(described or {}),
        k.KIND: k.KIND_TOOL,
        k.REPLAY_POLICY: policy.value,
        k.GEN_AI_OPERATION_NAME: k.OP_EXECUTE_TOOL,
        k.GEN_AI_TOOL_NAME: name,
        k.GEN_AI_TOOL_TYPE: k.TOOL_TYPE_FUNCTION,
        k.OPENINFERENCE_SPAN_KIND: k.OI_KIND_TOOL,
    }
    return _Prepared(call, f"{k.OP_EXECUTE_TOOL} {name}", SpanKind.INTERNAL, attributes, session)


def _prepare_llm(
    provider: str, model: str, operation: str, request: Any, policy: ReplayPolicy, output_type: Any
) -> _Prepared:
    payload, session = _captured_input(request)
    fingerprint = model_fingerprint(provider, model, operation)
    call = BoundaryCall(
        "llm",
        model,
        payload,
        policy,
        provider=provider,
        model=model,
        operation=operation,
        model_fingerprint=fingerprint,
        output_type=output_type,
    )
    attributes = {
        k.KIND: k.KIND_LLM,
        k.REPLAY_POLICY: policy.value,
        k.GEN_AI_OPERATION_NAME: operation,
        k.GEN_AI_PROVIDER_NAME: provider,
        k.GEN_AI_REQUEST_MODEL: model,
        k.MODEL_FINGERPRINT: fingerprint,
        k.OPENINFERENCE_SPAN_KIND: k.OI_KIND_LLM,
    }
    return _Prepared(call, f"{operation} {model}", SpanKind.CLIENT, attributes, session)


def _in_replay() -> bool:
    """Inside a replay session a call that cannot be recorded cannot be matched either; running
    it live instead would be exactly the silent fallback replay promises never to make, so
    stepfork's own failures are raised there (``internal_error(..., strict=True)``)."""
    return current_session.get() is not None


def _open_span(prepared: _Prepared, *, body: bool = True) -> tuple[Span, object | None] | None:
    """Start the boundary span; None (logged) if stepfork itself failed. When the call's body
    will run in it (``body``), the span is made current, so calls made inside are its children
    and continue its trace's numbering; a substituted or refused call runs nothing inside."""
    span: Span | None = None
    token = None
    try:
        parent = trace_api.get_current_span().get_span_context()
        prepared.attributes[k.CALL_SEQ] = 0  # (its place among the attributes; numbered below)
        captured = take_pending()  # the run's clock/random reads since its previous call
        if captured is not None:
            prepared.attributes[k.CAPTURED] = captured
        try:
            prepared.attributes.update(span_payload_attributes(k.INPUT, prepared.call.input))
        except Exception:
            internal_error("writing the call input on its span")
        if prepared.described:
            _add_last(prepared.attributes, prepared.described)
        tracer = CONFIG.tracer()
        with CALL_START_LOCK:  # (the order spans start in is the order of their numbers)
            seq, start = next_call_number(parent.trace_id if parent.is_valid else None)
            prepared.attributes[k.CALL_SEQ] = seq
            span = tracer.start_span(
                prepared.span_name,
                kind=prepared.span_kind,
                attributes=prepared.attributes,
                start_time=start,
                record_exception=False,
                set_status_on_exception=False,
            )
        check_attributes_kept(span, tracer)
        if body:
            if not parent.is_valid:
                first_call_of_trace(span.get_span_context().trace_id)
            token = context_api.attach(mark_body(trace_api.set_span_in_context(span)))
    except Exception:
        if span is not None:  # started, then something failed: end it, nothing runs in it
            with contextlib.suppress(Exception):  # (logged there; the first failure is raised)
                _close_span(span, token, None)
        internal_error("opening a boundary span", strict=_in_replay())
        return None
    try:
        prepared.kept = kept = HANDOFF.kept_id(span)
        if kept is not None:
            HANDOFF.keep(kept, k.INPUT, prepared.call.input)
    except Exception:
        prepared.kept = None
        try:
            internal_error("handing the call input to the bundle processor")
        except BaseException:  # re-raised (tests): the span must not stay open and current
            _close_span(span, token, None)
            raise
    return span, token


def _close_span(span: Span, token: object | None, kept: int | None) -> None:
    try:
        if token is not None:
            context_api.detach(token)  # type: ignore[arg-type]
        end_span(span, kept)
    except Exception:
        internal_error("ending a boundary span")


def _decide(prepared: _Prepared) -> ReplayDecision | None:
    """Ask the active replay session (if any) what to do, before the span opens: the decision --
    and a substituted output -- then go on the span when it starts, with the input, in one call.
    Returns None outside replay. A refused call gets a span of its own (action ``rejected``,
    status ``skipped``, the error recorded) and the refusal is raised."""
    session = prepared.session
    if session is None:
        if prepared.call.input.unserialisable:
            prepared.attributes.update(_unreplayable(prepared.call, "input", prepared.call.input))
        return None
    attributes = prepared.attributes
    attributes[k.REPLAY_MODE] = session.mode.value
    try:
        decision = session.begin_call(prepared.call)
    except BaseException as exc:
        attributes[k.REPLAY_ACTION] = k.ACTION_REJECTED
        _record_refusal(prepared, exc)
        raise
    attributes[k.REPLAY_ACTION] = decision.action
    if decision.substituted:
        if decision.output is not None:
            try:
                attributes.update(span_payload_attributes(k.OUTPUT, decision.output))
            except Exception:
                internal_error("writing a substituted output on its span")
        if decision.error is None:
            attributes[k.STATUS] = k.STATUS_OK
    return decision


def _record_refusal(prepared: _Prepared, exc: BaseException) -> None:
    """The span of a call the session refused; the refusal itself is what the caller raises, so
    a failure to write this span must not replace it."""
    try:
        opened = _open_span(prepared, body=False)
    except Exception:  # inside a session _open_span raises: log it, the refusal matters more
        log_internal_error("recording a refused call")
        return
    if opened is None:
        return
    span, token = opened
    try:
        with handle_internal_errors("recording a refused call"):
            record_failure(span, exc)
            span.set_attribute(k.STATUS, k.STATUS_SKIPPED)
    finally:
        _close_span(span, token, prepared.kept)


def _open_decided(
    prepared: _Prepared, decision: ReplayDecision | None
) -> tuple[Span, object | None] | None:
    """:func:`_open_span` after the decision. Inside a session a span that cannot be opened is
    raised: the session has already consumed the call, so it is told that the call failed --
    its result was not delivered, its body did not run -- and reports it."""
    try:
        if decision is not None and decision.substituted and decision.error is None:
            output = decision.output  # described before the span starts: one SDK call
            if output is not None:
                # The session parsed the recorded text into the value it substitutes: described
                # from that value instead of parsing the text again (when nothing rebuilt it
                # into a type, it is that text's JSON value).
                parsed = decision.value if prepared.call.output_type is None else None
                prepared.described = _unbilled(_described(prepared, decision.value, output, parsed))
        return _open_span(prepared, body=decision is None or not decision.substituted)
    except BaseException as exc:
        if decision is not None:
            decision.abandon(exc)
        raise


def _substituted(span: Span, prepared: _Prepared, decision: ReplayDecision) -> Any:
    """The recorded result of a substituted call (its attributes went on the span at start)."""
    with handle_internal_errors("recording a substituted outcome"):
        if decision.output is not None and prepared.kept is not None:
            HANDOFF.keep(prepared.kept, k.OUTPUT, decision.output)
        if decision.error is not None:
            record_failure(span, decision.error)
        elif prepared.described:  # set when the span started (see _open_decided)
            _set_error_status(span, prepared.described)
    if decision.error is not None:
        raise _recorded_error(prepared, decision.error)
    return decision.value


def _recorded_error(prepared: _Prepared, error: BaseException) -> BaseException:
    """The exception a substituted failure is raised as: the integration's own class when it
    knows the recorded one (:attr:`_Prepared.rebuild_error`), else the session's error."""
    error_type, message = getattr(error, "error_type", None), getattr(error, "message", None)
    if prepared.rebuild_error is None or not isinstance(error_type, str):
        return error
    with handle_internal_errors("rebuilding a recorded SDK error"):
        rebuilt = prepared.rebuild_error(error_type, message if isinstance(message, str) else "")
        if rebuilt is not None:
            rebuilt.__cause__ = error  # the replay error stays reachable, with its position
            return rebuilt
    return error


def _finish_ok(
    span: Span, prepared: _Prepared, result: Any, decision: ReplayDecision | None
) -> None:
    payload: Payload | None = None
    try:
        recorded = result if prepared.view is None else prepared.view(result)
        payload = capture(recorded, CONFIG.settings.redactor, keep_order=True)
        attributes = span_payload_attributes(k.OUTPUT, payload)
        if payload.unserialisable:
            attributes.update(_unreplayable(prepared.call, "output", payload))
        attributes[k.STATUS] = k.STATUS_OK
        described = _described(prepared, recorded, payload)
        _add_last(attributes, described)
        span.set_attributes(attributes)  # output and described attributes in one SDK call
        _set_error_status(span, described)
        if prepared.kept is not None:
            HANDOFF.keep(prepared.kept, k.OUTPUT, payload)
    except Exception:
        internal_error("recording a call output")
    finally:  # the session learns the body returned even if recording its output failed
        if decision is not None:
            decision.end(payload, None)


def _described(
    prepared: _Prepared, recorded: Any, payload: Payload | None, parsed: Any = None
) -> dict[str, Any]:
    """The attributes an outcome adds to its span beyond the payload (logged, never raised).
    ``parsed``: the JSON value of ``payload``'s text when the caller has it (None: parsed by
    the description if it needs it)."""
    with handle_internal_errors("describing a call outcome"):
        if prepared.describe is not None:
            if payload is None:
                return {}
            return prepared.describe(prepared.call.input.text, payload.text, parsed)
        if prepared.call.kind == "llm":
            attributes = usage_attributes(recorded)
            if payload is not None:  # a request and a response of an SDK's shape: as the SDKs'
                provider, text = prepared.call.provider or "", prepared.call.input.text
                attributes.update(describe_request(provider, text, payload.text, parsed))
            return attributes
    return {}


_UNBILLED = {
    k.GEN_AI_USAGE_INPUT_TOKENS: k.USAGE_INPUT_TOKENS,
    k.GEN_AI_USAGE_OUTPUT_TOKENS: k.USAGE_OUTPUT_TOKENS,
    k.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: None,
    k.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS: None,
    k.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: None,
}


def _unbilled(described: dict[str, Any]) -> dict[str, Any]:
    """A substituted call called no model: its span carries no ``gen_ai.usage.*`` (back-ends
    bill tokens and cost from them); the recorded usage stays under stepfork's own keys."""
    kept: dict[str, Any] = {}
    for key, value in described.items():
        if key not in _UNBILLED:
            kept[key] = value
        elif (own := _UNBILLED[key]) is not None:
            kept[own] = value
    return kept


def _add_last(attributes: dict[str, Any], more: dict[str, Any]) -> None:
    """``more`` after ``attributes``, as a later ``set_attributes`` would put them: a key
    given again moves to the end with its new value."""
    for key, value in more.items():
        attributes.pop(key, None)
        attributes[key] = value


def _set_described(span: Span, attributes: dict[str, Any]) -> None:
    """Write described attributes (none: no SDK call); see :func:`_set_error_status`."""
    if attributes:
        span.set_attributes(attributes)
        _set_error_status(span, attributes)


def _set_error_status(span: Span, described: dict[str, Any]) -> None:
    """An outcome described with ``error.type`` (an HTTP error status the SDK will raise for)
    is a failed call for telemetry."""
    error_type = described.get(k.ERROR_TYPE_SEMCONV)
    if error_type is not None:
        span.set_status(Status(StatusCode.ERROR, str(error_type)))


def _finish_error(span: Span, exc: BaseException, decision: ReplayDecision | None) -> None:
    with handle_internal_errors("recording a call failure"):
        record_failure(span, exc)
    if decision is not None:
        decision.end(None, exc)


def _run_sync(prepared: _Prepared | None, body: Callable[[], R]) -> R:
    if prepared is None:
        return body()  # stepfork could not prepare this call (logged): the call still runs
    decision = _decide(prepared)
    opened = _open_decided(prepared, decision)
    if opened is None:
        return body()  # stepfork could not record this call (logged): the call still runs
    span, token = opened
    try:
        if decision is not None and decision.substituted:
            return typing.cast(R, _substituted(span, prepared, decision))
        try:
            result = body()
        except BaseException as exc:
            _finish_error(span, exc, decision)
            raise
        _finish_ok(span, prepared, result, decision)
        return result
    finally:
        _close_span(span, token, prepared.kept)


async def _run_async(prepared: _Prepared | None, body: Callable[[], Awaitable[R]]) -> R:
    if prepared is None:
        return await body()
    decision = _decide(prepared)
    opened = _open_decided(prepared, decision)
    if opened is None:
        return await body()
    span, token = opened
    try:
        if decision is not None and decision.substituted:
            return typing.cast(R, _substituted(span, prepared, decision))
        try:
            result = await body()
        except BaseException as exc:
            _finish_error(span, exc, decision)
            raise
        _finish_ok(span, prepared, result, decision)
        return result
    finally:
        _close_span(span, token, prepared.kept)


# --- streamed calls (see recording/streams.py) ---------------------------------------------------


def _detach(token: object | None) -> None:
    """The stream is read in the caller's context, after the body returned: the span stops
    being current there (it stays open until the stream ends)."""
    if token is not None:
        with handle_internal_errors("leaving a streamed call's span"):
            context_api.detach(token)  # type: ignore[arg-type]


def _finish_stream(
    span: Span,
    prepared: _Prepared,
    decision: ReplayDecision | None,
    recorder: Recorder,
    complete: bool,
    error: BaseException | None,
) -> None:
    """A live stream ended (exhausted, closed, broken or dropped): record it, end its span.
    Runs once, possibly from a garbage-collector finaliser, so it never raises."""
    payload: Payload | None = None
    try:
        with handle_internal_errors("recording a streamed call"):
            redactor = CONFIG.settings.redactor
            value = stream_value(
                recorder.head,
                recorder.chunks,
                complete,
                error,
                None if error is None else qualified_name(type(error)),
                None if error is None else exception_message(error, redactor),
            )
            payload = capture(value, redactor, keep_order=True)
            attributes = span_payload_attributes(k.OUTPUT, payload)
            if payload.unserialisable:
                attributes.update(_unreplayable(prepared.call, "output", payload))
            attributes[k.STATUS] = k.STATUS_OK  # what was streamed is the recorded outcome
            attributes[k.STREAM] = True
            attributes[k.STREAM_CHUNK_COUNT] = len(recorder.chunks)
            span.set_attributes(attributes)
            described = _described(prepared, value, payload)
            if error is not None:  # the call failed for telemetry; the recording keeps the chunks
                described[k.ERROR_TYPE_SEMCONV] = qualified_name(type(error))
            _set_described(span, described)
            if prepared.kept is not None:
                HANDOFF.keep(prepared.kept, k.OUTPUT, payload)
    finally:
        try:
            if decision is not None:
                decision.end(payload, None)
        finally:
            _close_span(span, None, prepared.kept)


def _replayed_stream(
    prepared: _Prepared, decision: ReplayDecision, value: Any
) -> tuple[dict[str, Any], ReplayedStream[Any]]:
    """A substituted streamed call: the recorded chunks, served again."""
    if not is_stream_value(value):
        rebuilt = None if prepared.restream is None else prepared.restream(value)
        if rebuilt is None:
            raise decision.diverged("the recorded call returned a single value, this run streams")
        if rebuilt.get(k.STREAM_CHUNKS):
            decision.note(
                "stream rebuilt from the recorded final message (the trace holds no chunks): one "
                "text delta, one delta per tool call"
            )
        value = rebuilt
    head = stream_head(value)
    chunks: list[Any] = value[k.STREAM_CHUNKS]
    broken = value.get(k.STREAM_ERROR)
    broken_by = None
    if isinstance(broken, dict):
        error_type, message = str(broken.get("error_type")), str(broken.get("message"))

        def broken_by() -> BaseException:
            return _recorded_error(prepared, decision.failure(error_type, message))

    def overrun(count: int) -> BaseException:
        return decision.diverged(
            f"the recorded stream was closed by the agent after {count} chunk(s); "
            "this run reads further"
        )

    stream = ReplayedStream(head, chunks, value[k.STREAM_COMPLETE], overrun, broken_by)
    return head, stream


def _run_stream_sync(
    prepared: _Prepared | None, body: Callable[[], StreamStart[Any]]
) -> tuple[dict[str, Any], Iterator[Any]]:
    """:func:`_run_sync` for a body that returns a stream: ``(head, chunk iterator)``."""
    if prepared is None:
        start = body()
        return start.head, typing.cast(Iterator[Any], start.chunks)
    decision = _decide(prepared)
    opened = _open_decided(prepared, decision)
    if opened is None:
        start = body()
        return start.head, typing.cast(Iterator[Any], start.chunks)
    span, token = opened
    if decision is not None and decision.substituted:
        try:
            value = _substituted(span, prepared, decision)
        finally:
            _close_span(span, token, prepared.kept)
        return _replayed_stream(prepared, decision, value)
    try:
        start = body()
    except BaseException as exc:
        _finish_error(span, exc, decision)
        _close_span(span, token, prepared.kept)
        raise
    _detach(token)
    live = LiveStream(start, functools.partial(_finish_stream, span, prepared, decision))
    return start.head, live


async def _run_stream_async(
    prepared: _Prepared | None, body: Callable[[], Awaitable[StreamStart[Any]]]
) -> tuple[dict[str, Any], AsyncIterator[Any]]:
    """:func:`_run_stream_sync` for an async body and chunk iterator."""
    if prepared is None:
        start = await body()
        return start.head, typing.cast(AsyncIterator[Any], start.chunks)
    decision = _decide(prepared)
    opened = _open_decided(prepared, decision)
    if opened is None:
        start = await body()
        return start.head, typing.cast(AsyncIterator[Any], start.chunks)
    span, token = opened
    if decision is not None and decision.substituted:
        try:
            value = _substituted(span, prepared, decision)
        finally:
            _close_span(span, token, prepared.kept)
        return _replayed_stream(prepared, decision, value)
    try:
        start = await body()
    except BaseException as exc:
        _finish_error(span, exc, decision)
        _close_span(span, token, prepared.kept)
        raise
    _detach(token)
    live = AsyncLiveStream(start, functools.partial(_finish_stream, span, prepared, decision))
    return start.head, live


# --- public API ----------------------------------------------------------------------------------


def _return_type(fn: Callable[..., Any]) -> Any:
    try:
        return typing.get_type_hints(fn).get("return")
    except Exception:  # unresolvable forward references: replay returns plain JSON values
        return None


def _tool_description(
    annotated: Any, signature: inspect.Signature, left_out: frozenset[str]
) -> dict[str, Any]:
    """What a TOOL span says about its tool beyond the name: the docstring
    (``gen_ai.tool.description``, OpenInference ``tool.description``) and the JSON schema of
    its parameters (``tool.parameters``), built once, on the tool's first call. A signature
    pydantic cannot describe (an unresolvable annotation, a default with no JSON form) gets no
    schema; that is not an error.

    Both are redacted like a payload, with the redactor of the first call: a docstring or a
    parameter's default may hold a secret (``api_key: str = "sk-..."``), and these attributes
    go to every exporter. A default is redacted under its parameter's name, so a key rule
    applies to it as it does to the same argument in the call's input."""
    described: dict[str, Any] = {}
    redactor = CONFIG.settings.redactor
    doc = inspect.getdoc(annotated)
    if doc:
        doc = redactor.redact_text(doc)
        described[k.GEN_AI_TOOL_DESCRIPTION] = described[k.OI_TOOL_DESCRIPTION] = doc
    try:
        hints = typing.get_type_hints(annotated)
        fields: dict[str, Any] = {}
        for pname, param in signature.parameters.items():
            if pname in left_out or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            default = ... if param.default is param.empty else param.default
            fields[pname] = (hints.get(pname, Any), default)
        model = pydantic.create_model("Parameters", **fields)
        schema = redactor.redact(_defaults_redacted(redactor, model.model_json_schema()))
        described[k.OI_TOOL_PARAMETERS] = json.dumps(schema, sort_keys=True)
    except Exception:
        pass  # no schema for this signature
    return described


def _defaults_redacted(redactor: Any, schema: Any) -> Any:
    """``schema`` (JSON Schema, as pydantic makes it) with the ``default`` of each property --
    of the parameters and of nested models (``$defs``) -- redacted under the property's name."""
    if isinstance(schema, list):
        return [_defaults_redacted(redactor, item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _defaults_redacted(redactor, value) for key, value in schema.items()}
    properties = out.get("properties")
    if isinstance(properties, dict):
        for name, prop in properties.items():
            if isinstance(prop, dict) and "default" in prop:
                prop["default"] = redactor.redact({name: prop["default"]})[name]
    return out


def _tool_target(func: Any) -> tuple[str, Any, str | None]:
    """``(name, annotated, refusal)`` for a callable given to ``@trace_tool``: the name its calls
    are recorded under, the function whose return annotation types a replayed value (a
    partial's function, a callable instance's ``__call__``), and why it cannot be a tool (None:
    it can). A generator (sync or async) yields its results lazily, after the call returned,
    so it is refused: recording it would record the generator object, not what it yields."""
    target = func
    while isinstance(target, functools.partial):
        target = target.func
    is_instance = not (inspect.isroutine(target) or inspect.isclass(target))
    annotated = type(target).__call__ if is_instance else target
    name = getattr(target, "__name__", None) or type(target).__name__
    for probe in (func, annotated):
        if inspect.isgeneratorfunction(probe) or inspect.isasyncgenfunction(probe):
            return name, annotated, "a generator: what it yields comes after the call returns"
    return name, annotated, None


@overload
def trace_tool(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def trace_tool(
    *,
    name: str | None = None,
    replay_policy: ReplayPolicy | str = ReplayPolicy.REPLAYABLE,
    exclude: str | Collection[str] = (),
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def trace_tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    replay_policy: ReplayPolicy | str = ReplayPolicy.REPLAYABLE,
    exclude: str | Collection[str] = (),
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Record every call of a tool function (sync or ``async def``) as a boundary span.

    Arguments are normalised with ``inspect.signature(fn).bind(...)`` and ``apply_defaults()``, so
    defaulted parameters are part of the recorded input. ``replay_policy`` is recorded with every
    call and enforced during replay (see :class:`~stepfork_otel.trace.policy.ReplayPolicy`).

    Left out of the input -- recorded and matched without them, the tool still gets them: a first
    parameter named ``self`` or ``cls``; the parameters named in ``exclude`` (a name, or names;
    with ``**kwargs``, also keys of it); and framework context, found by the parameter's
    annotation or, without one, by the value's type: pydantic-ai's ``RunContext``, LangChain's
    ``RunnableConfig``, callback handlers and managers, run managers
    (:data:`stepfork_otel.recording.arguments.FRAMEWORK_CONTEXT`). A name in ``exclude`` that is
    not a parameter is a ``ValueError``.
    """
    policy = ReplayPolicy.parse(replay_policy)
    excluded = (exclude,) if isinstance(exclude, str) else tuple(exclude)

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        # A function that cannot be a tool is returned unchanged, with a warning (its calls are
        # then not recorded); only a mistake in the decorator's own arguments -- not a
        # function, an ``exclude`` naming no parameter -- is raised, at import time.
        if isinstance(func, (classmethod, staticmethod)):  # @trace_tool above @classmethod
            return typing.cast(Callable[P, R], type(func)(decorate(func.__func__)))
        if not callable(func):
            raise TypeError(f"@trace_tool expects a function, got {type(func).__name__}")
        target_name, annotated, refusal = _tool_target(func)
        tool_name = name or target_name
        try:
            signature = inspect.signature(func)
        except (TypeError, ValueError) as exc:  # e.g. a builtin without a signature (dict)
            refusal = f"its signature cannot be read ({exc})"
        if refusal is not None:
            logger.warning(
                "@trace_tool: %r is left undecorated and its calls are not recorded: it is %s",
                tool_name,
                refusal if refusal.startswith("a ") else f"not traceable, {refusal}",
            )
            return func
        unknown = unknown_names(signature, excluded)
        if unknown:
            raise ValueError(
                f"@trace_tool(exclude=...): {', '.join(map(repr, unknown))} "
                f"{'is not a parameter' if len(unknown) == 1 else 'are not parameters'} of "
                f"{tool_name} (its parameters: {', '.join(signature.parameters) or 'none'})"
            )
        resolved: list[tuple[ToolArguments, Any, dict[str, Any]]] = []

        def shape() -> tuple[ToolArguments, Any, dict[str, Any]]:
            """(binding, return type, description), resolved on the first call: forward
            references -- and a framework's context classes -- may not exist earlier. Set in
            one step, as threads may make the first call together."""
            if not resolved:
                binding = tool_arguments(annotated, signature, excluded)
                resolved[:] = [
                    (
                        binding,
                        _return_type(annotated),
                        _tool_description(annotated, signature, binding.left_out),
                    )
                ]
            return resolved[0]

        def prepare(args: Any, kwargs: Any) -> _Prepared | None:
            try:
                binding, output_type, described = shape()
            except Exception:
                internal_error("reading a tool's signature", strict=_in_replay())
                return None
            try:
                arguments = binding.bind(args, kwargs)
            except TypeError:
                return None  # the call itself is wrong: let the function raise its TypeError
            try:
                return _prepare_tool(tool_name, policy, arguments, output_type, described)
            except Exception:
                internal_error("preparing a boundary call", strict=_in_replay())
                return None

        if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(annotated):
            call_async = typing.cast(Callable[..., Awaitable[Any]], func)

            @functools.wraps(func)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                return await _run_async(prepare(args, kwargs), lambda: call_async(*args, **kwargs))

            return typing.cast(Callable[P, R], async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            return _run_sync(prepare(args, kwargs), lambda: func(*args, **kwargs))

        return wrapper

    if fn is not None:
        return decorate(fn)
    return decorate


LiveLlmGuard = Callable[[str, str], None]
_live_llm_guard: LiveLlmGuard | None = None


def set_live_llm_guard(guard: LiveLlmGuard | None) -> LiveLlmGuard | None:
    """Install the test switch the pytest plugin uses (returns the previous one): when not None,
    ``guard(provider, model)`` is called before an LLM call would run live outside a replay
    session, and raises to refuse it. None (the default) changes nothing."""
    global _live_llm_guard
    previous, _live_llm_guard = _live_llm_guard, guard
    return previous


def _prepare_llm_call(
    provider: str,
    model: str,
    operation: str,
    request: Any,
    replay_policy: ReplayPolicy | str,
    response_type: Any,
) -> _Prepared | None:
    """What ``llm_request`` and ``allm_request`` share before the call: the policy (a bad one is
    the caller's error), the pytest plugin's live-call guard, and the recorded input."""
    policy = ReplayPolicy.parse(replay_policy)
    guard = _live_llm_guard
    if guard is not None and current_session.get() is None:
        guard(provider, model)
    try:
        return _prepare_llm(provider, model, operation, request, policy, response_type)
    except Exception:
        internal_error("preparing a boundary call", strict=_in_replay())
        return None


def prepare_integration_call(
    provider: str,
    model: str,
    operation: str,
    request: Any,
    *,
    span_name: str | None = None,
    view: Callable[[Any], Any] | None = None,
    describe: Callable[[str, str, Any], dict[str, Any]] | None = None,
    rebuild_error: Callable[[str, str], BaseException | None] | None = None,
    restream: Callable[[Any], Any] | None = None,
    attributes: dict[str, Any] | None = None,
    input_hint: str | None = None,
) -> _Prepared | None:
    """An SDK integration's LLM call (see ``recording/integrations``): the same preparation as
    ``llm_request``, with the integration's hooks; run it with :data:`run_sync` & co."""
    prepared = _prepare_llm_call(provider, model, operation, request, ReplayPolicy.REPLAYABLE, None)
    if prepared is not None:
        prepared.view, prepared.describe, prepared.rebuild_error = view, describe, rebuild_error
        prepared.restream = restream
        prepared.call.input_hint = input_hint
        if span_name is not None:
            prepared.span_name = span_name
        if attributes:
            prepared.attributes.update(attributes)
    return prepared


run_sync = _run_sync
run_async = _run_async
run_stream_sync = _run_stream_sync
run_stream_async = _run_stream_async


@overload
def llm_request(
    *,
    provider: str,
    model: str,
    input: Any,
    call: Callable[[], R],
    operation: str = ...,
    response_type: Any = ...,
    replay_policy: ReplayPolicy | str = ...,
    stream: Literal[False] = ...,
) -> R: ...


@overload
def llm_request(
    *,
    provider: str,
    model: str,
    input: Any,
    call: Callable[[], Iterable[C]],
    operation: str = ...,
    response_type: Any = ...,
    replay_policy: ReplayPolicy | str = ...,
    stream: Literal[True],
) -> Iterator[C]: ...


def llm_request(
    *,
    provider: str,
    model: str,
    input: Any,
    call: Callable[[], Any],
    operation: str = k.OP_CHAT,
    response_type: Any = None,
    replay_policy: ReplayPolicy | str = ReplayPolicy.REPLAYABLE,
    stream: bool = False,
) -> Any:
    """Make one LLM call through a boundary: ``call()`` performs it, ``input`` is the request
    payload (the prompt) that is recorded and matched. In frozen replay ``call`` is never invoked.

    ``response_type`` (optional) is the type a substituted response is rebuilt into (e.g. the
    client's pydantic response model); without it replay returns the recorded JSON value.

    ``stream=True``: ``call()`` returns an iterable of JSON-encodable chunks (a client this
    library has no integration for, streaming). The chunks are passed through as the agent reads
    them and recorded as one outcome; replay yields the recorded chunks, as JSON values
    (``response_type`` does not apply to chunks). Close the returned iterator (or use it as a
    context manager) when stopping early: the recording then says how far the agent read.
    """
    prepared = _prepare_llm_call(provider, model, operation, input, replay_policy, response_type)
    if not stream:
        return _run_sync(prepared, call)

    def body() -> StreamStart[Any]:
        chunks = call()
        return StreamStart(iter(chunks), close=getattr(chunks, "close", None))

    return _run_stream_sync(prepared, body)[1]


@overload
async def allm_request(
    *,
    provider: str,
    model: str,
    input: Any,
    call: Callable[[], Awaitable[R]],
    operation: str = ...,
    response_type: Any = ...,
    replay_policy: ReplayPolicy | str = ...,
    stream: Literal[False] = ...,
) -> R: ...


@overload
async def allm_request(
    *,
    provider: str,
    model: str,
    input: Any,
    call: Callable[[], AsyncIterable[C] | Awaitable[AsyncIterable[C]]],
    operation: str = ...,
    response_type: Any = ...,
    replay_policy: ReplayPolicy | str = ...,
    stream: Literal[True],
) -> AsyncIterator[C]: ...


async def allm_request(
    *,
    provider: str,
    model: str,
    input: Any,
    call: Callable[[], Any],
    operation: str = k.OP_CHAT,
    response_type: Any = None,
    replay_policy: ReplayPolicy | str = ReplayPolicy.REPLAYABLE,
    stream: bool = False,
) -> Any:
    """``llm_request`` for async clients: ``call()`` returns an awaitable. With
    ``stream=True`` it returns an async iterable of chunks (or an awaitable of one, like
    ``await client.create(stream=True)``), and ``allm_request`` returns an async iterator."""
    prepared = _prepare_llm_call(provider, model, operation, input, replay_policy, response_type)
    if not stream:
        return await _run_async(prepared, call)

    async def body() -> StreamStart[Any]:
        chunks = call()
        if inspect.isawaitable(chunks):
            chunks = await chunks
        return StreamStart(aiter(chunks), close=getattr(chunks, "aclose", None))

    return (await _run_stream_async(prepared, body))[1]
