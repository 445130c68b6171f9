"""The boundaries: ``@trace_tool``, ``llm_request`` and ``allm_request``.

This is the one interception point of stepfork_otel. Recording and replay go through the same
code: a call is normalised, canonicalised, redacted and fingerprinted; the active replay session
(if any) decides whether the body runs, is substituted from the recording, or is refused; *then*
the span is opened -- carrying the input and, in a replay, the decision and a substituted output,
all passed when it starts -- and the body runs in it (or does not). Whatever happens is written on
the span, so a replay run is traced like any other run.

Two error regimes meet here. A failure of stepfork's own recording work (an attribute that cannot
be set, a value that cannot be encoded) is logged (``log_or_raise`` / ``handle_internal_errors``)
and the user's call proceeds -- except inside a replay session, where running the call unmatched
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
import itertools
import threading
import time
import typing
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from stepfork_otel import _internal
from stepfork_otel import constants as k
from stepfork_otel._internal import handle_internal_errors, log_internal_error, log_or_raise
from stepfork_otel.recording import settings as _settings
from stepfork_otel.recording.payload import Payload, capture
from stepfork_otel.replay.context import BoundaryCall, ReplayDecision, current_session
from stepfork_otel.trace.canonical import model_fingerprint
from stepfork_otel.trace.policy import ReplayPolicy

if TYPE_CHECKING:
    from stepfork_otel.replay.session import ReplaySession

P = ParamSpec("P")
R = TypeVar("R")

# --- call numbering ------------------------------------------------------------------------------
# Each boundary span carries the number of the call within its trace, taken together with its
# start time under one lock, so "the order in which calls started" is the same whether it is read
# from timestamps or numbers, across threads and tasks, and survives batches arriving out of order.
# Start times come from a clock that never repeats or goes back within the process (the wall clock,
# nudged forward by a nanosecond when it did not advance), so two calls never tie.

_seq_lock = threading.Lock()
_seq_by_trace: OrderedDict[int, itertools.count[int]] = OrderedDict()
_MAX_TRACKED_TRACES = 4096
_last_start = 0


def _tick() -> int:
    global _last_start
    now = time.time_ns()
    if now <= _last_start:
        now = _last_start + 1
    _last_start = now
    return now


def call_start_time() -> int:
    """A start time (ns) later than every start time handed out before in this process."""
    with _seq_lock:
        return _tick()


def next_call_number(trace_id: int) -> tuple[int, int]:
    """(sequence number, start time in ns) for a new call in the existing trace ``trace_id``."""
    with _seq_lock:
        counter = _seq_by_trace.get(trace_id)
        if counter is None:
            counter = _seq_by_trace[trace_id] = itertools.count(1)
            if len(_seq_by_trace) > _MAX_TRACKED_TRACES:
                _seq_by_trace.popitem(last=False)
        else:
            _seq_by_trace.move_to_end(trace_id)
        return next(counter), _tick()


def _first_call_of_trace(trace_id: int) -> None:
    """A boundary span that opened a new trace took number 1: continue from 2."""
    with _seq_lock:
        _seq_by_trace[trace_id] = itertools.count(2)
        if len(_seq_by_trace) > _MAX_TRACKED_TRACES:
            _seq_by_trace.popitem(last=False)


# --- side channel for the local bundle processor -------------------------------------------------
# Payloads above the span size cap (or with capture off) are not on the span, but the local bundle
# must keep them whole. The boundary hands them to the in-process processor through this table,
# keyed by span id; the entry is dropped when the span has ended (``end_span``). Nothing is stored
# when no bundle processor is attached, so nothing can pile up.

_side_lock = threading.Lock()
side_payloads: dict[int, dict[str, Payload]] = {}
#: Incremented by each attached SftraceSpanProcessor (payloads are only kept while one listens).
side_channel_listeners = 0


def _keep_payload(span: Span, key: str, payload: Payload) -> dict[str, Payload] | None:
    """Hand ``payload`` to the bundle processor; returns the span's entry (None: nobody listens).
    The boundary adds the output to that entry itself, without the lock: processors read the
    entry when the span ends (after that), a flush copies it in one step, and ``end_span``
    drops it."""
    # A span a sampler dropped never reaches a processor: keeping its payload would leak it.
    if side_channel_listeners and span.is_recording():
        span_id = span.get_span_context().span_id
        with _side_lock:
            kept = side_payloads.setdefault(span_id, {})
        kept[key] = payload
        return kept
    return None


def end_span(span: Span) -> None:
    """End a span that stepfork opened, then drop its side-channel entry: by then every processor
    has read it (the SDK calls ``on_end`` before ``end`` returns), so two bundle processors on
    one provider both get the payloads."""
    try:
        span.end()
    finally:
        if side_payloads:
            side_payloads.pop(span.get_span_context().span_id, None)


def payload_attributes(key: str, payload: Payload) -> dict[str, Any]:
    """The span attributes of a payload: text, fingerprint and size, or -- over the size cap or
    with capture off -- fingerprint, size and why the text was left off (plus a preview under
    the cap). Built as one dict so a span takes them in one call (or at start, for inputs)."""
    settings = _settings.settings()
    text, sha, size, omitted, preview, value, mime = (
        k.INPUT_KEYS if key == k.INPUT else k.OUTPUT_KEYS
    )
    if not settings.capture_content:
        return {sha: payload.sha256, size: payload.size, omitted: k.OMITTED_CAPTURE_DISABLED}
    if payload.size > settings.max_span_payload_bytes:
        return {
            sha: payload.sha256,
            size: payload.size,
            omitted: k.OMITTED_SIZE_CAP,
            preview: payload.text[: k.PREVIEW_CHARS],
        }
    return {
        sha: payload.sha256,
        size: payload.size,
        text: payload.text,
        value: payload.text,
        mime: k.MIME_JSON,
    }


def set_payload_attributes(span: Span, key: str, payload: Payload) -> None:
    """Write a payload on a span (see :func:`payload_attributes`) and hand it, whole, to the
    local bundle processor."""
    span.set_attributes(payload_attributes(key, payload))
    _keep_payload(span, key, payload)


def record_failure(span: Span, exc: BaseException) -> None:
    """Mark a span failed with the exception's type and *redacted* message (never the raw one).

    The sanitised ``exception`` event replaces OTel's ``record_exception``, which would copy the
    raw message (secrets included) and the traceback onto the span."""
    error_type = qualified_name(type(exc))
    message = exception_message(exc)
    _keep_payload(span, k.ERROR_MESSAGE, Payload.from_text(message))  # whole, past length limits
    span.set_attribute(k.STATUS, k.STATUS_ERROR)
    span.set_attribute(k.ERROR_TYPE, error_type)
    span.set_attribute(k.ERROR_MESSAGE, message)
    span.add_event(k.EXCEPTION_EVENT, {k.EXCEPTION_TYPE: error_type, k.EXCEPTION_MESSAGE: message})
    span.set_status(Status(StatusCode.ERROR, f"{error_type}: {message}"))


def exception_message(exc: BaseException) -> str:
    """The message of ``exc`` as stepfork keeps it anywhere: redacted and bounded. A broken
    ``__str__`` gives a placeholder: it must not hide the exception being recorded."""
    try:
        message = str(exc)
    except Exception:
        message = f"<unprintable {type(exc).__name__}>"
    return _settings.settings().redactor.redact_message(message)


def qualified_name(cls: type) -> str:
    module = cls.__module__
    return (
        cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"
    )


# --- the one interception point ------------------------------------------------------------------


@dataclass(slots=True)
class _Prepared:
    call: BoundaryCall
    span_name: str
    span_kind: SpanKind
    attributes: dict[str, Any]
    session: ReplaySession | None
    """The replay session the call is made in (None: recording)."""
    kept: dict[str, Payload] | None = None
    """The span's entry in the side channel, once the input was handed over."""


def _captured_input(value: Any) -> tuple[Payload, ReplaySession | None]:
    """The call's input as recorded, and the replay session the call is made in (if any)."""
    session = current_session.get()
    recorded = None if session is None else session.expected_input()
    return capture(value, recorded=recorded), session


def _prepare_tool(
    name: str, policy: ReplayPolicy, arguments: dict[str, Any], output_type: Any
) -> _Prepared:
    payload, session = _captured_input(arguments)
    call = BoundaryCall("tool", name, payload, policy, output_type=output_type)
    attributes = {
        k.KIND: k.KIND_TOOL,
        k.REPLAY_POLICY: policy.value,
        k.GEN_AI_OPERATION_NAME: k.OP_EXECUTE_TOOL,
        k.GEN_AI_TOOL_NAME: name,
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


def _fail_or_log(what: str) -> None:
    """Inside a replay session a call that cannot be recorded cannot be matched either; running
    it live instead would be exactly the silent fallback replay promises never to make."""
    if _internal.RAISE_INTERNAL_ERRORS or current_session.get() is not None:
        raise  # always called from an except block
    log_internal_error(what)


def _open_span(prepared: _Prepared, *, body: bool = True) -> tuple[Span, object | None] | None:
    """Start the boundary span; None (logged) if stepfork itself failed. When the call's body
    will run in it (``body``), the span is made current, so calls made inside are its children
    and continue its trace's numbering; a substituted or refused call runs nothing inside."""
    span: Span | None = None
    token = None
    try:
        parent = trace_api.get_current_span().get_span_context()
        if parent.is_valid:
            seq, start = next_call_number(parent.trace_id)
        else:
            seq, start = 1, call_start_time()
        prepared.attributes[k.CALL_SEQ] = seq
        try:
            prepared.attributes.update(payload_attributes(k.INPUT, prepared.call.input))
        except Exception:
            log_or_raise("writing the call input on its span")
        span = _settings.tracer().start_span(
            prepared.span_name,
            kind=prepared.span_kind,
            attributes=prepared.attributes,
            start_time=start,
            record_exception=False,
            set_status_on_exception=False,
        )
        if body:
            if not parent.is_valid:
                _first_call_of_trace(span.get_span_context().trace_id)
            token = context_api.attach(trace_api.set_span_in_context(span))
    except Exception:
        if span is not None:  # started, then something failed: end it, nothing runs in it
            with contextlib.suppress(Exception):  # (logged there; the first failure is raised)
                _close_span(span, token)
        _fail_or_log("opening a boundary span")
        return None
    try:
        prepared.kept = _keep_payload(span, k.INPUT, prepared.call.input)
    except Exception:
        log_or_raise("handing the call input to the bundle processor")
    return span, token


def _close_span(span: Span, token: object | None) -> None:
    try:
        if token is not None:
            context_api.detach(token)  # type: ignore[arg-type]
        end_span(span)
    except Exception:
        log_or_raise("ending a boundary span")


def _decide(prepared: _Prepared) -> ReplayDecision | None:
    """Ask the active replay session (if any) what to do, before the span opens: the decision --
    and a substituted output -- then go on the span when it starts, with the input, in one call.
    Returns None outside replay. A refused call gets a span of its own (action ``rejected``,
    status ``skipped``, the error recorded) and the refusal is raised."""
    session = prepared.session
    if session is None:
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
    if decision.action == k.ACTION_SUBSTITUTED:
        if decision.output is not None:
            try:
                attributes.update(payload_attributes(k.OUTPUT, decision.output))
            except Exception:
                log_or_raise("writing a substituted output on its span")
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
        _close_span(span, token)


def _open_decided(
    prepared: _Prepared, decision: ReplayDecision | None
) -> tuple[Span, object | None] | None:
    """:func:`_open_span` after the decision. Inside a session a span that cannot be opened is
    raised (``_fail_or_log``): the session has already consumed the call, so it is told that the
    call failed -- its result was not delivered, its body did not run -- and reports it."""
    try:
        return _open_span(
            prepared, body=decision is None or decision.action != k.ACTION_SUBSTITUTED
        )
    except BaseException as exc:
        if decision is not None and prepared.session is not None:
            prepared.session.abandon_call(decision, exc)
        raise


def _substituted(span: Span, prepared: _Prepared, decision: ReplayDecision) -> Any:
    """The recorded result of a substituted call (its attributes went on the span at start)."""
    if decision.output is not None and prepared.kept is not None:
        prepared.kept[k.OUTPUT] = decision.output
    if decision.error is not None:
        record_failure(span, decision.error)
        raise decision.error
    return decision.value


def _finish_ok(
    span: Span, prepared: _Prepared, result: Any, decision: ReplayDecision | None
) -> None:
    payload: Payload | None = None
    try:
        payload = capture(result)
        attributes = payload_attributes(k.OUTPUT, payload)
        attributes[k.STATUS] = k.STATUS_OK
        if prepared.call.kind == "llm":
            attributes.update(_usage_attributes(result))
        span.set_attributes(attributes)
        if prepared.kept is not None:
            prepared.kept[k.OUTPUT] = payload
    except Exception:
        log_or_raise("recording a call output")
    if decision is not None and prepared.session is not None:
        prepared.session.end_call(decision, payload, None)


def _finish_error(
    span: Span, prepared: _Prepared, exc: BaseException, decision: ReplayDecision | None
) -> None:
    with handle_internal_errors("recording a call failure"):
        record_failure(span, exc)
    if decision is not None and prepared.session is not None:
        prepared.session.end_call(decision, None, exc)


def _run_sync(prepared: _Prepared | None, body: Callable[[], R]) -> R:
    if prepared is None:
        return body()  # stepfork could not prepare this call (logged): the call still runs
    decision = _decide(prepared)
    opened = _open_decided(prepared, decision)
    if opened is None:
        return body()  # stepfork could not record this call (logged): the call still runs
    span, token = opened
    try:
        if decision is not None and decision.action == k.ACTION_SUBSTITUTED:
            return typing.cast(R, _substituted(span, prepared, decision))
        try:
            result = body()
        except BaseException as exc:
            _finish_error(span, prepared, exc, decision)
            raise
        _finish_ok(span, prepared, result, decision)
        return result
    finally:
        _close_span(span, token)


async def _run_async(prepared: _Prepared | None, body: Callable[[], Awaitable[R]]) -> R:
    if prepared is None:
        return await body()
    decision = _decide(prepared)
    opened = _open_decided(prepared, decision)
    if opened is None:
        return await body()
    span, token = opened
    try:
        if decision is not None and decision.action == k.ACTION_SUBSTITUTED:
            return typing.cast(R, _substituted(span, prepared, decision))
        try:
            result = await body()
        except BaseException as exc:
            _finish_error(span, prepared, exc, decision)
            raise
        _finish_ok(span, prepared, result, decision)
        return result
    finally:
        _close_span(span, token)


def _field(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


def _usage_attributes(response: Any) -> dict[str, Any]:
    """``gen_ai.response.model`` and ``gen_ai.usage.*`` from a dict or object response (OpenAI
    ``prompt_tokens``/``completion_tokens`` or Anthropic ``input_tokens``/``output_tokens``)."""
    attributes: dict[str, Any] = {}
    model = _field(response, "model")
    if isinstance(model, str):
        attributes[k.GEN_AI_RESPONSE_MODEL] = model
    usage = _field(response, "usage")
    if usage is None:
        return attributes
    for attribute, names in (
        (k.GEN_AI_USAGE_INPUT_TOKENS, ("input_tokens", "prompt_tokens")),
        (k.GEN_AI_USAGE_OUTPUT_TOKENS, ("output_tokens", "completion_tokens")),
    ):
        for name in names:
            value = _field(usage, name)
            if isinstance(value, int) and not isinstance(value, bool):
                attributes[attribute] = value
                break
    return attributes


# --- public API ----------------------------------------------------------------------------------


def _tool_arguments(
    signature: inspect.Signature, skip_first: bool, args: Any, kwargs: Any
) -> dict[str, Any]:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    if skip_first:
        arguments.pop(next(iter(signature.parameters)), None)
    return arguments


def _simple_binder(
    signature: inspect.Signature, skip_first: bool
) -> Callable[[Any, Any], dict[str, Any] | None] | None:
    """For a signature of plain parameters (positional-or-keyword, no ``*args``/``**kwargs``),
    a function giving exactly what ``bind`` + ``apply_defaults`` give -- the arguments in
    parameter order, defaults filled in -- or None when the call is not a plain one (a missing
    or unknown argument, one given twice, too many): ``_tool_arguments`` then binds it, and
    raises the same ``TypeError`` as before. None for other signatures."""
    params = list(signature.parameters.values())
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return None
    names = tuple(p.name for p in params)
    defaults = tuple(p.default for p in params)
    empty = inspect.Parameter.empty
    first = names[0] if skip_first and names else None

    def bind(args: Any, kwargs: Any) -> dict[str, Any] | None:
        given = len(args)
        if given > len(names):
            return None
        arguments = dict(zip(names, args, strict=False))
        used = 0
        for name, default in zip(names[given:], defaults[given:], strict=True):
            if name in kwargs:
                arguments[name] = kwargs[name]
                used += 1
            elif default is empty:
                return None
            else:
                arguments[name] = default
        if used != len(kwargs):
            return None
        if first is not None:
            del arguments[first]
        return arguments

    return bind


def _return_type(fn: Callable[..., Any]) -> Any:
    try:
        return typing.get_type_hints(fn).get("return")
    except Exception:  # unresolvable forward references: replay returns plain JSON values
        return None


@overload
def trace_tool(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def trace_tool(
    *, name: str | None = None, replay_policy: ReplayPolicy | str = ReplayPolicy.REPLAYABLE
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def trace_tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    replay_policy: ReplayPolicy | str = ReplayPolicy.REPLAYABLE,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Record every call of a tool function (sync or ``async def``) as a boundary span.

    Arguments are normalised with ``inspect.signature(fn).bind(...)`` and ``apply_defaults()``, so
    defaulted parameters are part of the recorded input. A first parameter named ``self`` or
    ``cls`` is left out. ``replay_policy`` is recorded with every call and enforced during replay
    (see :class:`~stepfork_otel.trace.policy.ReplayPolicy`).
    """
    policy = ReplayPolicy.parse(replay_policy)

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        if not callable(func):
            raise TypeError(f"@trace_tool expects a function, got {type(func).__name__}")
        tool_name = name or func.__name__
        signature = inspect.signature(func)
        params = list(signature.parameters)
        skip_first = bool(params) and params[0] in ("self", "cls")
        resolved: list[Any] = []

        def output_type() -> Any:
            if not resolved:  # resolved on first call: forward references may not exist earlier
                resolved.append(_return_type(func))
            return resolved[0]

        simple_bind = _simple_binder(signature, skip_first)

        def prepare(args: Any, kwargs: Any) -> _Prepared | None:
            arguments = None if simple_bind is None else simple_bind(args, kwargs)
            if arguments is None:
                try:
                    arguments = _tool_arguments(signature, skip_first, args, kwargs)
                except TypeError:
                    return None  # the call itself is wrong: let the function raise its TypeError
            try:
                return _prepare_tool(tool_name, policy, arguments, output_type())
            except Exception:
                _fail_or_log("preparing a boundary call")
                return None

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                return await _run_async(prepare(args, kwargs), lambda: func(*args, **kwargs))

            return typing.cast(Callable[P, R], async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            return _run_sync(prepare(args, kwargs), lambda: func(*args, **kwargs))

        return wrapper

    if fn is not None:
        return decorate(fn)
    return decorate


#: Test switch (set by the pytest plugin, ``stepfork_otel.pytest_plugin``): when not None, it is
#: called with ``(provider, model)`` before an LLM call would run live outside a replay session,
#: and raises to refuse it. None (the default) changes nothing.
live_llm_guard: Callable[[str, str], None] | None = None


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
    if live_llm_guard is not None and current_session.get() is None:
        live_llm_guard(provider, model)
    try:
        return _prepare_llm(provider, model, operation, request, policy, response_type)
    except Exception:
        _fail_or_log("preparing a boundary call")
        return None


def llm_request(
    *,
    provider: str,
    model: str,
    input: Any,
    call: Callable[[], R],
    operation: str = k.OP_CHAT,
    response_type: Any = None,
    replay_policy: ReplayPolicy | str = ReplayPolicy.REPLAYABLE,
) -> R:
    """Make one LLM call through a boundary: ``call()`` performs it, ``input`` is the request
    payload (the prompt) that is recorded and matched. In frozen replay ``call`` is never invoked.

    ``response_type`` (optional) is the type a substituted response is rebuilt into (e.g. the
    client's pydantic response model); without it replay returns the recorded JSON value.
    """
    prepared = _prepare_llm_call(provider, model, operation, input, replay_policy, response_type)
    return _run_sync(prepared, call)


async def allm_request(
    *,
    provider: str,
    model: str,
    input: Any,
    call: Callable[[], Awaitable[R]],
    operation: str = k.OP_CHAT,
    response_type: Any = None,
    replay_policy: ReplayPolicy | str = ReplayPolicy.REPLAYABLE,
) -> R:
    """``llm_request`` for async clients: ``call()`` returns an awaitable."""
    prepared = _prepare_llm_call(provider, model, operation, input, replay_policy, response_type)
    return await _run_async(prepared, call)
