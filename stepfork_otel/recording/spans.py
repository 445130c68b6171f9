"""What the boundaries and ``record()`` write on their spans: call numbers and start times,
payloads (on the span, and whole through the hand-off), sanitised failures, the end.

Only the OpenTelemetry API is used here.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from contextvars import ContextVar
from typing import Any

from opentelemetry.trace import Span, Status, StatusCode

from stepfork_otel import constants as k
from stepfork_otel.config import CONFIG
from stepfork_otel.recording.handoff import HANDOFF
from stepfork_otel.trace.payload import (
    Payload,
    exception_message,
    payload_attributes,
    qualified_name,
)

# --- call numbering ------------------------------------------------------------------------------
# Each boundary span carries the number of the call within its trace, taken together with its
# start time under one lock that is held while the span starts (and the processors' ``on_start``
# runs), so "the order in which calls started" is the same whether it is read from timestamps, from
# numbers, or from the order the bundle processor saw the spans start -- across threads and tasks,
# and through batches arriving out of order. Start times come from a clock that never repeats or
# goes back within the process (the wall clock, nudged forward by a nanosecond when it did not
# advance), so two calls never tie.

_seq_lock = threading.RLock()
"""Reentrant: a span processor's ``on_start`` may itself make a boundary call."""
_seq_by_trace: OrderedDict[int, itertools.count[int]] = OrderedDict()
_MAX_TRACKED_TRACES = 4096
_last_start = 0
#: The clock itself: the determinism capture stands in for ``time.time_ns`` while a run captures or
#: a replay serves reads, and stepfork's own timestamps are not the run's reads (nor worth the
#: stand-in's look at who is asking).
_time_ns = getattr(time.time_ns, "__wrapped__", time.time_ns)


def _tick() -> int:
    global _last_start
    now = _time_ns()
    if now <= _last_start:
        now = _last_start + 1
    _last_start = now
    return now


def call_start_time() -> int:
    """A start time (ns) later than every start time handed out before in this process."""
    with _seq_lock:
        return _tick()


CALL_START_LOCK = _seq_lock
"""Held while a boundary takes its call's number (:func:`next_call_number`) and starts its span
(started afresh in a forked child: another thread may have held it at the fork)."""
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_seq_lock._at_fork_reinit)  # type: ignore[attr-defined]


def next_call_number(trace_id: int | None) -> tuple[int, int]:
    """(sequence number, start time in ns) for a new call in the trace ``trace_id`` (None: a
    call that opens a new trace: number 1). The caller holds :data:`CALL_START_LOCK` until the
    call's span has started."""
    with _seq_lock:
        if trace_id is None:
            return 1, _tick()
        counter = _seq_by_trace.get(trace_id)
        if counter is None:
            counter = _seq_by_trace[trace_id] = itertools.count(1)
            if len(_seq_by_trace) > _MAX_TRACKED_TRACES:
                _seq_by_trace.popitem(last=False)
        else:
            _seq_by_trace.move_to_end(trace_id)
        return next(counter), _tick()


def first_call_of_trace(trace_id: int) -> None:
    """A boundary span that opened a new trace took number 1: continue from 2."""
    with _seq_lock:
        _seq_by_trace[trace_id] = itertools.count(2)
        if len(_seq_by_trace) > _MAX_TRACKED_TRACES:
            _seq_by_trace.popitem(last=False)


# --- the run a call belongs to -------------------------------------------------------------------

current_run: ContextVar[Span | None] = ContextVar("stepfork_run_span", default=None)
"""The span of the ``record(...)`` run this context is in (set by ``otel/run.py``)."""


# --- payloads, failures, the end -----------------------------------------------------------------


def span_payload_attributes(key: str, payload: Payload) -> dict[str, Any]:
    """The span attributes of a payload under the settings in force (see
    :func:`~stepfork_otel.trace.payload.payload_attributes`)."""
    settings = CONFIG.settings
    return payload_attributes(
        key, payload, settings.capture_content, settings.max_span_payload_bytes
    )


def write_payload(span: Span, key: str, payload: Payload) -> None:
    """Write a payload on a span and hand it, whole, to the bundle processors."""
    span.set_attributes(span_payload_attributes(key, payload))
    HANDOFF.keep_for(span, key, payload)


def record_failure(span: Span, exc: BaseException) -> None:
    """Mark a span failed with the exception's type and *redacted* message (never the raw one).

    The sanitised ``exception`` event replaces OTel's ``record_exception``, which would copy the
    raw message (secrets included) and the traceback onto the span."""
    error_type = qualified_name(type(exc))
    message = exception_message(exc, CONFIG.settings.redactor)
    HANDOFF.keep_for(span, k.ERROR_MESSAGE, Payload.from_text(message))  # whole, past limits
    span.set_attribute(k.STATUS, k.STATUS_ERROR)
    span.set_attribute(k.ERROR_TYPE, error_type)
    span.set_attribute(k.ERROR_TYPE_SEMCONV, error_type)
    span.set_attribute(k.ERROR_MESSAGE, message)
    span.add_event(k.EXCEPTION_EVENT, {k.EXCEPTION_TYPE: error_type, k.EXCEPTION_MESSAGE: message})
    span.set_status(Status(StatusCode.ERROR, f"{error_type}: {message}"))


_ASK: Any = object()
#: Tracers already warned about (by id: a tracer lives as long as its provider; bounded).
_warned_tracers: set[int] = set()
logger = logging.getLogger("stepfork_otel")


def check_attributes_kept(span: Span, tracer: object) -> None:
    """Warn (once per tracer) when the provider's sampler dropped the attributes stepfork's span
    started with -- a sampler of the user's own that returns ``SamplingResult(decision)`` alone:
    the SDK then gives the span the sampler's attributes, none, and the span is no longer a run or
    a call, so nothing of it is recorded. Checked on every recording span (one lookup: a sampler
    may drop them for some spans only), said once per tracer."""
    if not span.is_recording():
        return
    attributes = getattr(span, "attributes", None)
    if attributes is None or k.KIND in attributes or id(tracer) in _warned_tracers:
        return
    if len(_warned_tracers) < 1024:
        _warned_tracers.add(id(tracer))
    logger.warning(
        "stepfork_otel: the tracer provider's sampler returned its decision without the "
        "span's attributes, so stepfork's spans lose theirs and nothing is recorded; a "
        "sampler must return SamplingResult(decision, attributes), as the SDK's samplers do"
    )


def _set_ok_status(span: Span) -> None:
    """A call or run that succeeded (``stepfork.status`` ok, substituted or live) ends with the
    status ``OK``, not ``Unset``: stepfork owns the operation, and the convention lets its
    instrumentation say it succeeded (Phoenix shows Unset spans as neither). A status already set
    -- ``ERROR`` for an HTTP error the SDK raises for, a stream broken mid-way -- is kept."""
    attributes = getattr(span, "attributes", None)
    if attributes is None or attributes.get(k.STATUS) != k.STATUS_OK:
        return
    status = getattr(span, "status", None)
    if status is not None and status.status_code is StatusCode.UNSET:
        span.set_status(Status(StatusCode.OK))


def end_span(span: Span, kept_id: int | None = _ASK) -> None:
    """End a span that stepfork opened, then release its hand-off entry: by then every
    processor has read it (the SDK calls ``on_end`` before ``end`` returns), whether ``on_end``
    returned or raised. ``kept_id``: the span's :meth:`~PayloadHandoff.kept_id`, when the caller
    asked it already (None: nothing is kept for this span)."""
    if kept_id is _ASK:
        kept_id = HANDOFF.kept_id(span)  # before the end: an ended span is no longer recording
    try:
        _set_ok_status(span)
        span.end()
    finally:
        if kept_id is not None:
            HANDOFF.release(kept_id)


def _field(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


def usage_attributes(response: Any) -> dict[str, Any]:
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
