"""Spans another instrumentation wrote, read as the spans stepfork writes: OpenInference's OpenAI
LLM spans (``openinference-instrumentation-openai``).

The importer hands the spans of a trace that holds no stepfork span to :func:`adopt`. Each span
this module recognises is given the attributes and payloads a span of ``instrument_openai()``
carries (``stepfork.kind`` ``llm``, provider, model, operation, the input as the HTTP exchange
``{"body", "method", "url"}`` and the output as ``{"status", "headers", "body"}``), its trace's
local root becomes the run, and the one conversion
(:func:`~stepfork_otel.trace.builder.spans_to_trace`) builds the bundle: there is no second
converter. Replay then serves the calls to the OpenAI SDK through ``instrument_openai()``.

What an OpenInference OpenAI span holds (``openinference-instrumentation-openai`` 0.1.x, read from
its source): ``input.value`` is the request's ``json_data`` -- the body the SDK sends, except
``extra_body``, which the SDK merges in later -- and ``output.value`` the parsed response as
``model_dump_json(exclude_unset=True)``: every field the server sent, in the model's field order.
The span's name is the response type (``ChatCompletion``, ``Response``), which gives the endpoint.
It holds no response headers (only ``content-type``, which the SDK needs, is put back), no chunks
of a streamed call (OpenInference merges them into one completion) and no response of a failed
call (only an ``exception`` event). The SDK's 128-attribute limit evicts the oldest attributes
first, and ``input.value`` is among the first: a long conversation loses it. Each of these is a
call with a missing input or result, named in the notes :func:`adopt` returns -- never a value
made up.

Pure data in, data out (the format layer): no OpenTelemetry import. The payloads built here go
through :func:`~stepfork_otel.trace.payload.capture` with the importer's redactor, as a recorded
call's do at its boundary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from stepfork_otel import constants as k
from stepfork_otel._version import __version__
from stepfork_otel.trace import grouping
from stepfork_otel.trace.canonical import loads, model_fingerprint
from stepfork_otel.trace.conversion import SpanRecord
from stepfork_otel.trace.limits import text_depth_exceeds
from stepfork_otel.trace.payload import Payload, capture
from stepfork_otel.trace.redaction import Redactor

#: OpenInference's OpenAI span names (the SDK's response type) -> the request URL, relative to
#: the client's base URL, as ``instrument_openai()`` records it.
OPENINFERENCE_OPENAI_URLS: Mapping[str, str] = {
    "ChatCompletion": "chat/completions",
    "Response": "responses",
}
#: The request body field each endpoint cannot be without (recognising ``input.value``).
_BODY_FIELD = {"chat/completions": "messages", "responses": "input"}
#: The response headers an imported response is served with: OpenInference records none, and
#: the SDK needs the content type to parse the body.
IMPORTED_RESPONSE_HEADERS: Mapping[str, str] = {"content-type": k.MIME_JSON}
_EVICTED = (
    "(the SDK's attribute count limit evicts the oldest attributes first: raise "
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT)"
)
#: ``created_by`` of a bundle built from OpenInference spans (the run span's ``SDK_VERSION``).
CREATED_BY_OPENINFERENCE = f"OpenInference spans, imported by stepfork_otel {__version__}"


@dataclass(frozen=True)
class Adopted:
    """The spans of a trace as stepfork's, and what they could not hold (one note per call)."""

    records: list[SpanRecord]
    notes: list[str] = field(default_factory=list)


def _json_object(text: Any) -> dict[str, Any] | None:
    """``text`` parsed, when it is JSON text of an object (None otherwise, hostile depth too)."""
    if not isinstance(text, str) or not text.startswith("{"):
        return None
    if text_depth_exceeds(text.encode("utf-8", "surrogatepass"), k.DEFAULT_MAX_JSON_DEPTH):
        return None
    try:
        value = loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def openinference_openai_url(span: SpanRecord) -> str | None:
    """The endpoint of an OpenInference OpenAI LLM span (None: not one). The provider attribute
    (``llm.provider``/``llm.system``) is among the first the limit evicts: without it the span's
    name (the OpenAI SDK's response type) decides; with it, it must say ``openai``."""
    attrs = span.attributes
    if attrs.get(k.OPENINFERENCE_SPAN_KIND) != k.OI_KIND_LLM:
        return None
    provider = attrs.get(k.OI_LLM_PROVIDER, attrs.get(k.OI_LLM_SYSTEM))
    if provider is not None and provider != k.PROVIDER_OPENAI:
        return None
    return OPENINFERENCE_OPENAI_URLS.get(span.name)


def _model(attrs: Mapping[str, Any], body: Mapping[str, Any] | None) -> str:
    model = body.get("model") if body is not None else None
    if not isinstance(model, str):  # the input was lost: the parameters OpenInference keeps
        params = _json_object(attrs.get(k.OI_INVOCATION_PARAMETERS))
        model = params.get("model") if params is not None else None
    if not isinstance(model, str):
        model = attrs.get(k.OI_MODEL_NAME)
    return model if isinstance(model, str) else ""


def _llm_call(
    span: SpanRecord, n: int, url: str, redactor: Redactor, notes: list[str]
) -> SpanRecord:
    """An OpenInference OpenAI span as the span of an ``instrument_openai()`` call."""
    attrs = span.attributes
    where = f"span {span.span_id} ({span.name}, call {n} of the trace)"
    raw_input = attrs.get(k.INPUT_VALUE)
    body = _json_object(raw_input)
    if body is not None and _BODY_FIELD[url] not in body:
        body = None
    model = _model(attrs, body)
    payloads: dict[str, Payload] = {}
    if body is None:
        why = (
            f"input.value is not on the span {_EVICTED}"
            if raw_input is None
            else "input.value is not a JSON request body"
        )
        notes.append(f"{where}: input missing -- {why}; replay stops at this call")
    else:
        exchange = {"body": body, "method": "POST", "url": url}
        payloads[k.INPUT] = capture(exchange, redactor)
    new: dict[str, Any] = {
        k.KIND: k.KIND_LLM,
        k.GEN_AI_PROVIDER_NAME: k.PROVIDER_OPENAI,
        k.GEN_AI_REQUEST_MODEL: model,
        k.GEN_AI_OPERATION_NAME: k.OP_CHAT,
        k.MODEL_FINGERPRINT: model_fingerprint(k.PROVIDER_OPENAI, model, k.OP_CHAT),
    }
    for key, source in (
        (k.GEN_AI_USAGE_INPUT_TOKENS, k.OI_TOKEN_COUNT_PROMPT),
        (k.GEN_AI_USAGE_OUTPUT_TOKENS, k.OI_TOKEN_COUNT_COMPLETION),
    ):
        value = attrs.get(source)
        if isinstance(value, int) and not isinstance(value, bool):
            new[key] = value
    response = _json_object(attrs.get(k.OUTPUT_VALUE))
    if span.status == "error":
        notes.append(
            f"{where}: the call failed; OpenInference keeps no response of a failed call "
            "(only its exception event); replay stops at this call"
        )
    elif body is not None and body.get("stream") is True:
        notes.append(
            f"{where}: a streamed call; OpenInference keeps the merged completion, not the "
            "chunks the SDK reads; replay stops at this call"
        )
    elif response is None:
        why = (
            f"output.value is not on the span {_EVICTED}"
            if k.OUTPUT_VALUE not in attrs
            else "output.value is not a JSON response body"
        )
        notes.append(f"{where}: result missing -- {why}; replay stops at this call")
    elif span.end_time_unix_nano is not None:
        model_out = response.get("model")
        if isinstance(model_out, str):
            new[k.GEN_AI_RESPONSE_MODEL] = model_out
        new[k.STATUS] = k.STATUS_OK
        record = {"status": 200, "headers": dict(IMPORTED_RESPONSE_HEADERS), "body": response}
        payloads[k.OUTPUT] = capture(record, redactor, keep_order=True)
    # (no other attribute of the foreign span is kept: the conversion reads only these)
    return replace(span, attributes=new, payloads=payloads)


def _run(span: SpanRecord, redactor: Redactor) -> SpanRecord:
    """The local root of the trace as the run: its name (redacted: span names may embed
    credentials), status, and an input/output only when it carries ``input.value``/
    ``output.value`` (a framework's AGENT or CHAIN span)."""
    attrs = span.attributes
    new: dict[str, Any] = {
        k.KIND: k.KIND_RUN,
        k.RUN_NAME: redactor.redact_text(span.name),
        k.SDK_VERSION: CREATED_BY_OPENINFERENCE,
    }
    if span.status == "error":
        new[k.STATUS] = k.STATUS_ERROR
    elif span.end_time_unix_nano is not None:  # ended without an error (OTel's "unset" too)
        new[k.STATUS] = k.STATUS_OK
    payloads: dict[str, Payload] = {}
    for key, value_key, mime_key in (
        (k.INPUT, k.INPUT_VALUE, k.INPUT_MIME_TYPE),
        (k.OUTPUT, k.OUTPUT_VALUE, k.OUTPUT_MIME_TYPE),
    ):
        raw = attrs.get(value_key)
        if not isinstance(raw, str):
            continue
        value: Any = _json_object(raw) if attrs.get(mime_key) == k.MIME_JSON else None
        payloads[key] = capture(
            raw if value is None else value, redactor, keep_order=key == k.OUTPUT
        )
    return replace(span, attributes=new, payloads=payloads)


def adopt(spans: Sequence[SpanRecord], redactor: Redactor) -> Adopted | None:
    """The spans of one trace (none of them stepfork's) with every OpenInference OpenAI LLM span
    made an LLM call and each local root above one made its run; None when the trace holds no
    such span. Other spans are kept as they are (the conversion keeps them as context)."""
    urls = {s.span_id: url for s in spans if (url := openinference_openai_url(s)) is not None}
    if not urls:
        return None
    parent_of = {s.span_id: s.parent_span_id for s in spans}
    roots = [s for s in spans if s.parent_span_id is None or s.parent_span_id not in parent_of]
    runs = {
        r.span_id
        for r in roots
        if r.span_id not in urls
        and not urls.keys().isdisjoint(grouping.subtree(parent_of, r.span_id))
    }
    notes: list[str] = []
    calls = sorted((s for s in spans if s.span_id in urls), key=_start_order)
    made: dict[str, SpanRecord] = {}
    for n, span in enumerate(calls, start=1):
        try:
            made[span.span_id] = _llm_call(span, n, urls[span.span_id], redactor, notes)
        except Exception as exc:  # one hostile span never stops the rest of the trace
            notes.append(
                f"span {span.span_id} ({span.name}, call {n} of the trace): not read as a call "
                f"({type(exc).__name__}); kept as context"
            )
    records = [
        made[s.span_id] if s.span_id in made else _run(s, redactor) if s.span_id in runs else s
        for s in spans
    ]
    return Adopted(records, notes)


def _start_order(span: SpanRecord) -> tuple[int, str]:
    return (span.start_time_unix_nano, span.span_id)
