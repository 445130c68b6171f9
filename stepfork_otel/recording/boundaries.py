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
import logging
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, overload

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.trace import Span, SpanKind

from stepfork_otel import constants as k
from stepfork_otel._internal import handle_internal_errors, internal_error, log_internal_error
from stepfork_otel.config import CONFIG
from stepfork_otel.recording.arguments import bind_arguments, simple_binder
from stepfork_otel.recording.contract import (
    BoundaryCall,
    ReplayDecision,
    Replayer,
    current_session,
)
from stepfork_otel.recording.handoff import HANDOFF
from stepfork_otel.recording.spans import (
    call_start_time,
    end_span,
    first_call_of_trace,
    next_call_number,
    record_failure,
    span_payload_attributes,
    usage_attributes,
)
from stepfork_otel.trace.canonical import UNSERIALISABLE_MARKER, model_fingerprint
from stepfork_otel.trace.models import label, payload_value
from stepfork_otel.trace.payload import Payload, capture
from stepfork_otel.trace.policy import ReplayPolicy

logger = logging.getLogger("stepfork_otel")

P = ParamSpec("P")
R = TypeVar("R")

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


def _captured_input(value: Any) -> tuple[Payload, Replayer | None]:
    """The call's input as recorded, and the replay session the call is made in (if any)."""
    session = current_session.get()
    recorded = None if session is None else session.expected_input()
    return capture(value, CONFIG.settings.redactor, recorded), session


_warned_unreplayable: set[tuple[str, str, str, str]] = set()


def _warn_unreplayable(call: BoundaryCall, what: str, payload: Payload) -> None:
    """A value with no JSON form is recorded as a marker, and the call cannot be replayed from
    it: say so while recording (once per call site and type), not first at replay."""
    # the marker says "<type of the value>: <what could not be encoded>"; the last part names it
    why = str(payload_value(payload.text).get(UNSERIALISABLE_MARKER, "")).rsplit(": ", 1)[-1]
    key = (call.kind, call.name, what, why)
    if key in _warned_unreplayable:
        return
    _warned_unreplayable.add(key)
    logger.warning(
        "stepfork_otel: the %s of %s has no JSON form (%s); it is recorded as unserialisable "
        "and this call cannot be replayed -- return JSON-encodable values, pydantic models or "
        "dataclasses",
        what,
        label(call.kind, call.name, call.provider, call.model),
        why,
    )


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
        if parent.is_valid:
            seq, start = next_call_number(parent.trace_id)
        else:
            seq, start = 1, call_start_time()
        prepared.attributes[k.CALL_SEQ] = seq
        try:
            prepared.attributes.update(span_payload_attributes(k.INPUT, prepared.call.input))
        except Exception:
            internal_error("writing the call input on its span")
        span = CONFIG.tracer().start_span(
            prepared.span_name,
            kind=prepared.span_kind,
            attributes=prepared.attributes,
            start_time=start,
            record_exception=False,
            set_status_on_exception=False,
        )
        if body:
            if not parent.is_valid:
                first_call_of_trace(span.get_span_context().trace_id)
            token = context_api.attach(trace_api.set_span_in_context(span))
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
            _warn_unreplayable(prepared.call, "input", prepared.call.input)
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
    if decision.error is not None:
        raise decision.error
    return decision.value


def _finish_ok(
    span: Span, prepared: _Prepared, result: Any, decision: ReplayDecision | None
) -> None:
    payload: Payload | None = None
    try:
        payload = capture(result, CONFIG.settings.redactor, keep_order=True)
        if payload.unserialisable:
            _warn_unreplayable(prepared.call, "output", payload)
        attributes = span_payload_attributes(k.OUTPUT, payload)
        attributes[k.STATUS] = k.STATUS_OK
        if prepared.call.kind == "llm":
            attributes.update(usage_attributes(result))
        span.set_attributes(attributes)
        if prepared.kept is not None:
            HANDOFF.keep(prepared.kept, k.OUTPUT, payload)
    except Exception:
        internal_error("recording a call output")
    finally:  # the session learns the body returned even if recording its output failed
        if decision is not None:
            decision.end(payload, None)


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


# --- public API ----------------------------------------------------------------------------------


def _return_type(fn: Callable[..., Any]) -> Any:
    try:
        return typing.get_type_hints(fn).get("return")
    except Exception:  # unresolvable forward references: replay returns plain JSON values
        return None


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
        # Decorating never breaks the program: what cannot be a tool is returned unchanged,
        # with a warning (its calls are then not recorded).
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
        params = list(signature.parameters)
        skip_first = bool(params) and params[0] in ("self", "cls")
        resolved: list[Any] = []

        def output_type() -> Any:
            if not resolved:  # resolved on first call: forward references may not exist earlier
                resolved.append(_return_type(annotated))
            return resolved[0]

        simple_bind = simple_binder(signature, skip_first)

        def prepare(args: Any, kwargs: Any) -> _Prepared | None:
            arguments = None if simple_bind is None else simple_bind(args, kwargs)
            if arguments is None:
                try:
                    arguments = bind_arguments(signature, skip_first, args, kwargs)
                except TypeError:
                    return None  # the call itself is wrong: let the function raise its TypeError
            try:
                return _prepare_tool(tool_name, policy, arguments, output_type())
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
