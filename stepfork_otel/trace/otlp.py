"""Rebuild `.sftrace` bundles from spans a collector captured (OTLP JSON), streaming.

Input: what the OpenTelemetry Collector's ``file`` exporter writes (``format: json``): JSON Lines,
one ``TracesData`` object ``{"resourceSpans": [...]}`` per batch, hex ids, 64-bit integers as
strings, ``kvlistValue``/``arrayValue`` attribute values -- and OTLP/HTTP JSON request bodies (a
file that is one JSON object, pretty-printed or not). Also accepted, because some tools write them:
protobuf's own JSON mapping (base64 ids, enum names, snake_case field names) and gzip files.

Log records, for one purpose: a GenAI instrumentation told to keep content off its spans
(opentelemetry-util-genai's ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=EVENT_ONLY``, which
openai-v2 uses) puts a call's messages in a log record,
``gen_ai.client.inference.operation.details``, that carries the call span's trace and span id. Lines
of ``resourceLogs`` (the same file as the spans, or another file of the same import; a ``/v1/logs``
request body too) are read for those records: their content attributes (``gen_ai.input.messages``,
``gen_ai.output.messages``, ``gen_ai.system_instructions``, ``gen_ai.tool.definitions``) are joined
to their span as if they had been its attributes -- the span's own attribute wins where both hold
one -- before the trace goes to :mod:`~stepfork_otel.trace.foreign`. Their values are structured
(``arrayValue``/``kvlistValue``: util-genai writes lists of dicts on events, JSON text on spans) and
are made the compact JSON text a span holds. The body (empty in util-genai's records) and the
record's other attributes (the span has them) are not read. Every other log record is ignored and
its line counted as skipped, as lines of metrics are; a record naming a span that never arrives is
named as a problem.

The one conversion
------------------
Every span becomes a :class:`~stepfork_otel.trace.conversion.SpanRecord` (hex ids, attributes decoded
from OTLP ``AnyValue``) and the spans of one trace go through
:func:`~stepfork_otel.trace.builder.spans_to_trace` -- the builder the live bundle processor
uses. Nothing here builds an event, so a bundle imported from a collector's file equals the bundle
the processor wrote locally for the same run (same events, same fingerprints), except where the
span itself lacks something: a payload left off the span (size cap, capture off) or cut by an
attribute length limit is imported as *missing*, and replay refuses to invent it. The conversion
redacts the application's span names it keeps with the rules it is handed: pass the recording
process's rules (``redactor=``, ``stepfork import --redaction-rules``) and the two bundles are
equal; the default is the built-in rules. Which spans make which bundle is the one grouping rule
(:mod:`stepfork_otel.trace.grouping`) that the processor uses too.

No OpenTelemetry library is needed for any of this: it is JSON in, bundles out, so it lives with
the format (``trace/``), and ``stepfork import`` loads no OpenTelemetry at all.

Streaming, and its honest limits
--------------------------------
The spans of one trace arrive in several batches, out of order, interleaved with other traces,
and one trace may stretch from the first line of a file to the last. Buffering everything until
the end would make memory grow with the file; emitting a trace "when it looks finished" would cut
traces whose last span comes late. So the import reads its input twice:

1. *Index.* A cheap scan (a regular expression over the raw bytes, no JSON parsing) notes, for each
   trace id, the last line it appears on. In valid JSON an unescaped ``"traceId":"…"`` is only ever
   a key, so payload text that happens to mention trace ids cannot confuse it; span links also
   carry trace ids, which at worst makes a trace wait a little longer, never end too early.
2. *Assemble.* The lines are parsed in order; each trace's spans are buffered, and the trace is
   converted and emitted as soon as its last line has been read; its buffer is then freed.

Log records name their trace with the same ``"traceId"`` key, so the index counts a line of log
records as a line of each trace it names: a trace is finished after its last span *or* log line,
whichever comes later, in whatever file of the import, before or after its spans. A GenAI
call-details record costs the index nothing more than a span does (its trace's entry, once per
trace); what the second pass keeps of it until its trace is finished is its content attributes
(the messages a ``SPAN_ONLY`` span would have held: the same bytes, held as long as its trace's
spans; the report's in-flight counts are of spans only), keyed by trace and span id; every other
log record is dropped as it is read. (A record whose trace id the first pass's scan cannot see --
an id written with JSON escapes -- and that comes after its trace's last span is held to the end
of the import and then named as naming a span not in the input.)

Memory is therefore bounded by the spans of the traces *in flight* (seen, last line not yet read)
and the GenAI log content waiting for them, plus the largest single line (one batch), plus the index
-- the one structure that grows with the number of traces: a dict of 16-byte trace ids during the
first pass (about 250 bytes per trace at its end: 2.5 MB for 10,000 traces, 250 MB for a million),
packed into 24 bytes per trace for the second. It is kept in memory instead of writing a sorted copy
of the input to disk because it is small next to the spans themselves. A file in which every trace
stays open until the end (e.g. every run span in the last line) needs memory for all of it: no
streaming scheme can do better without such a sorted copy. The first pass remembers how many bytes
each file had, so lines a collector appends between the passes are not read by the second.
``trace_id=`` needs no index: one pass keeps only that trace's spans.

Inputs that are not paths (text, bytes, a list of lines or parsed objects) are already in memory and
are read from there; an iterator is materialised first, because it cannot be read twice.

Bad input is reported, never silently dropped: a line that is truncated or is not JSON, or JSON that
is not OTLP trace data, is skipped with a :class:`ImportProblem` naming ``file:line`` (so is a GenAI
call-details log record that cannot be read, or that names a span the input lacks); traces whose ids
can still be read in a damaged line are marked incomplete (their bundle says so, with the reason);
an unreadable line that names no trace id could have held spans of any trace, so it marks every run
of the import incomplete (the first pass finds such lines, before anything is emitted). A trace
without any stepfork span is handed to the readers of other instrumentations' spans
(:mod:`stepfork_otel.trace.foreign`: OpenInference, the OpenTelemetry GenAI conventions, logfire,
OpenLLMetry), which make the calls they recognise into the same span records before the one
conversion; a trace that neither stepfork's spans nor any of those readers can use is not a
bundle: it is ignored and counted.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import dataclasses
import gzip
import logging
import os
import re
import typing
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeAlias

import orjson

from stepfork_otel import constants as k
from stepfork_otel.trace import foreign, grouping
from stepfork_otel.trace.builder import spans_to_trace
from stepfork_otel.trace.conversion import (
    SpanRecord,
    call_order,
    is_stepfork_span,
    parents_and_kinds,
    top_level_runs,
)
from stepfork_otel.trace.limits import (
    DEFAULT_LIMITS,
    NotRegularFile,
    ReadLimits,
    json_depth_exceeds,
    open_regular,
    text_depth_exceeds,
)
from stepfork_otel.trace.models import Trace
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR, Redactor

logger = logging.getLogger("stepfork_otel")

#: A file that is one OTLP/HTTP JSON request body is parsed whole up to this size (bytes); larger
#: files are read as JSON Lines (the collector's default ``max_request_body_size`` is 20 MiB).
MAX_WHOLE_FILE_BYTES = 256 * 1024 * 1024
#: How many trace ids an error message lists.
_MAX_IDS_SHOWN = 5

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_OTHER_SIGNALS = (
    *("resourceLogs", "resourceMetrics", "resourceProfiles"),
    *("resource_logs", "resource_metrics", "resource_profiles"),
)
_TRACE_ID_KEY = re.compile(rb'"(?:traceId|trace_id)"\s*:\s*"([^"\\]{1,64})"')

# OTLP ``Span.SpanKind`` numbers / proto-JSON names -> the names the SDK uses (SpanKind.name).
_SPAN_KINDS: dict[int | str, str] = {
    0: "INTERNAL",
    1: "INTERNAL",
    2: "SERVER",
    3: "CLIENT",
    4: "PRODUCER",
    5: "CONSUMER",
    "SPAN_KIND_UNSPECIFIED": "INTERNAL",
    "SPAN_KIND_INTERNAL": "INTERNAL",
    "SPAN_KIND_SERVER": "SERVER",
    "SPAN_KIND_CLIENT": "CLIENT",
    "SPAN_KIND_PRODUCER": "PRODUCER",
    "SPAN_KIND_CONSUMER": "CONSUMER",
}
_STATUS_CODES: dict[int | str, str] = {
    0: "unset",
    1: "ok",
    2: "error",
    "STATUS_CODE_UNSET": "unset",
    "STATUS_CODE_OK": "ok",
    "STATUS_CODE_ERROR": "error",
}


class OtlpImportError(ValueError):
    """Nothing can be imported: an unreadable file, input that is not OTLP JSON, a trace id that is
    not in the input. ``str(error)`` is one line."""


@dataclass(frozen=True)
class ImportProblem:
    """Something in the input that could not be imported as it was."""

    where: str
    """``file:line`` (or ``file``) the problem was found in."""
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class ImportReport:
    """What an import read, emitted, skipped and ignored (filled in while it runs)."""

    files: int = 0
    lines: int = 0
    """Records read: lines of JSON Lines files, or whole request-body files."""
    spans: int = 0
    traces: int = 0
    """Bundles emitted: one per recorded run (a trace may hold several runs)."""
    ignored_traces: int = 0
    """Traces holding neither a stepfork span nor a call that a reader of another
    instrumentation's spans recognises (:mod:`~stepfork_otel.trace.foreign`): nothing to
    import."""
    ignored_spans: int = 0
    """Spans of the ignored traces."""
    other_signals: int = 0
    """Lines holding logs, metrics or profiles rather than traces (skipped); a line of log records
    holding a GenAI call's details is read, not counted here."""
    genai_log_records: int = 0
    """``gen_ai.client.inference.operation.details`` log records whose content (the messages a
    GenAI instrumentation kept off its span) was joined to their span."""
    base64_ids: bool = False
    """Ids were written base64 (protobuf's JSON mapping) and were decoded."""
    problems: list[ImportProblem] = field(default_factory=list)
    skipped_spans: int = 0
    """Spans that could not be decoded (each named in ``problems``; their traces are marked
    incomplete, every other span and run is imported)."""
    max_traces_in_flight: int = 0
    """Most traces buffered at once (the streaming bound, see the module docstring)."""
    max_spans_in_flight: int = 0
    """Most spans buffered at once."""


class _BadSpan(ValueError):
    pass


# --- OTLP JSON values ----------------------------------------------------------------------------


def _as_str(raw: Any) -> str:
    if not isinstance(raw, str):
        raise _BadSpan(f"stringValue is {type(raw).__name__}, not a string")
    return raw


_INT_RANGE = range(-(2**63), 2**64)  # int64 values and uint64 times


def _as_int(raw: Any, what: str = "intValue") -> int:
    # (u)int64 is a decimal string in OTLP JSON; some writers use a JSON number
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise _BadSpan(f"{what} {_short(raw)} is not an integer")
    if isinstance(raw, str) and len(raw) > 21:  # (int() of a huge digit string is quadratic)
        raise _BadSpan(f"{what} {_short(raw)} is not a 64-bit integer")
    try:
        value = int(raw)
    except ValueError:
        raise _BadSpan(f"{what} {_short(raw)} is not an integer") from None
    if value not in _INT_RANGE:
        raise _BadSpan(f"{what} {_short(raw)} is not a 64-bit integer")
    return value


#: A field name an error may quote (a name of the format's kind: letters only, short).
_FIELD_NAME = re.compile(r"[A-Za-z_]{1,40}")


def _short(raw: Any) -> str:
    """A value from the input as an error message names it: a number as it is (at most 80
    characters), anything else by its type and size, never its text -- an attribute value may
    hold a prompt or a secret, and these messages are printed, logged and kept in reports."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        text = repr(raw)
        return text if len(text) <= 80 else text[:79] + "…"
    if isinstance(raw, str):
        return f"(a string of {len(raw):,} characters)"
    return f"(a {type(raw).__name__})" if raw is not None else "null"


def _as_float(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise _BadSpan(f"doubleValue {_short(raw)} is not a number")
    try:
        return float(raw)  # "NaN", "Infinity", "-Infinity" are JSON strings in proto-JSON
    except ValueError:
        raise _BadSpan(f"doubleValue {_short(raw)} is not a number") from None


def _as_bool(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise _BadSpan(f"boolValue {_short(raw)} is not a boolean")
    return raw


def _as_bytes(raw: Any) -> bytes:
    if not isinstance(raw, str):
        raise _BadSpan("bytesValue is not a base64 string")
    try:
        return base64.b64decode(raw, validate=True)
    except binascii.Error:
        raise _BadSpan("bytesValue is not valid base64") from None


def _as_array(raw: Any) -> tuple[Any, ...]:
    values = raw.get("values", []) if isinstance(raw, dict) else None
    if not isinstance(values, list):
        raise _BadSpan("arrayValue has no list of values")
    return tuple(decode_any_value(v) for v in values)  # the SDK keeps sequences as tuples


def _as_kvlist(raw: Any) -> dict[str, Any]:
    values = raw.get("values", []) if isinstance(raw, dict) else None
    if not isinstance(values, list):
        raise _BadSpan("kvlistValue has no list of values")
    return decode_attributes(values)


_DECODERS: dict[str, Callable[[Any], Any]] = {}
for _camel, _snake, _decoder in (
    ("stringValue", "string_value", _as_str),
    ("intValue", "int_value", _as_int),
    ("doubleValue", "double_value", _as_float),
    ("boolValue", "bool_value", _as_bool),
    ("bytesValue", "bytes_value", _as_bytes),
    ("arrayValue", "array_value", _as_array),
    ("kvlistValue", "kvlist_value", _as_kvlist),
):
    _DECODERS[_camel] = _DECODERS[_snake] = _decoder


def decode_any_value(value: Any) -> Any:
    """The Python value of an OTLP JSON ``AnyValue`` (an empty one is None)."""
    if not isinstance(value, dict):
        raise _BadSpan(f"attribute value {_short(value)} is not an OTLP AnyValue object")
    if not value:
        return None
    if len(value) != 1:
        raise _BadSpan(f"AnyValue with {len(value)} fields: {sorted(value)}")
    ((key, raw),) = value.items()
    decoder = _DECODERS.get(key)
    if decoder is None:
        named = repr(key) if isinstance(key, str) and _FIELD_NAME.fullmatch(key) else _short(key)
        raise _BadSpan(f"unknown AnyValue field {named}")
    return decoder(raw)


def decode_attributes(items: Any) -> dict[str, Any]:
    """OTLP JSON ``[{"key": ..., "value": AnyValue}, ...]`` as a dict."""
    if not isinstance(items, list):
        raise _BadSpan("attributes is not a list")
    attributes: dict[str, Any] = {}
    for item in items:
        key = item.get("key") if type(item) is dict else None
        if type(key) is not str:
            raise _BadSpan("attribute without a string key")
        value = item.get("value", {})
        text = value.get("stringValue") if type(value) is dict and len(value) == 1 else None
        # most attributes are strings: skip the general decoder for them (the hot path)
        attributes[key] = text if type(text) is str else decode_any_value(value)
    return attributes


def normalise_id(raw: Any, size: int) -> tuple[str, bool]:
    """(lower-case hex, was base64) of a trace id (``size`` 16) or span id (``size`` 8) written as
    hex (OTLP JSON) or base64 (protobuf's JSON mapping). The lengths cannot be confused: hex needs
    ``2*size`` characters, base64 ``4*ceil(size/3)``."""
    if not isinstance(raw, str):
        raise _BadSpan(f"id {_short(raw)} is not a string")
    if len(raw) == 2 * size:
        try:
            if len(bytes.fromhex(raw)) == size:
                return raw.lower(), False
        except ValueError:
            pass
    else:
        try:
            data = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            data = b""
        if len(data) == size:
            return data.hex(), True
    raise _BadSpan(f"id {_short(raw)} is not a {size}-byte id in hex or base64")


def _get(obj: Mapping[str, Any], camel: str, snake: str) -> Any:
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def _uint64(raw: Any, what: str) -> int:
    value = 0 if raw is None else _as_int(raw, what)
    if value < 0:
        raise _BadSpan(f"{what} {_short(raw)} is negative")
    return value


def _enum(table: Mapping[int | str, str], raw: Any, default: str) -> str:
    """An OTLP enum (a number or its proto-JSON name) looked up in ``table``; anything else in
    its place (a list, an object) is the default, as an unknown number is."""
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        return default
    return table.get(raw, default)


#: Payload attributes: canonical JSON text, which never holds a raw line break. The OpenInference
#: value is the payload's text when the stepfork attribute was not written (they were the same).
#: (Another instrumentation's ``input.value`` is none of stepfork's business: only a span with the
#: payload's fingerprint has its payload there.)
_PAYLOAD_TEXTS = (
    (k.INPUT, k.INPUT_VALUE, k.INPUT_SHA256),
    (k.OUTPUT, k.OUTPUT_VALUE, k.OUTPUT_SHA256),
)


@dataclass(slots=True)
class _Decoded:
    record: SpanRecord
    base64_ids: bool
    dropped_attributes: int
    damaged_payloads: tuple[tuple[str, str], ...] = ()
    """Payload attributes dropped, and why: a bundle holding them would not load (imported as
    missing)."""
    local_parent: bool = False
    """The span says its parent is a span of its own process (OTLP ``flags``: is-remote known and
    not set), so that parent must be in the input too: if it is not, it never arrived."""


#: OTLP ``Span.flags`` bits: whether the parent is remote is known, and it is.
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200


#: The nesting a payload may have for its bundle to load (``Trace.load``'s default limit).
_BUNDLE_DEPTH = DEFAULT_LIMITS.max_json_depth


def _unloadable_payload(payload: str) -> str | None:
    """Why a payload text cannot be written in a bundle that loads (None: it can). What the
    importer writes the loader must read: such a payload is imported as missing, and named."""
    if "\n" in payload or "\r" in payload:
        return "is not canonical JSON text (it holds a line break)"
    if (payload.count("[") + payload.count("{") > _BUNDLE_DEPTH) and text_depth_exceeds(
        payload.encode("utf-8", "surrogatepass"), _BUNDLE_DEPTH
    ):
        return f"is nested deeper than {_BUNDLE_DEPTH} levels (the bundle's nesting limit)"
    return None


def decode_span(span: Any) -> _Decoded:
    """One OTLP JSON span as a :class:`SpanRecord` (the importer's side of the one conversion)."""
    if not isinstance(span, dict):
        raise _BadSpan("a span is not a JSON object")
    trace_id, b64_trace = normalise_id(_get(span, "traceId", "trace_id"), 16)
    span_id, b64_span = normalise_id(_get(span, "spanId", "span_id"), 8)
    raw_parent = _get(span, "parentSpanId", "parent_span_id")
    parent_span_id = None
    b64_parent = False
    if raw_parent:
        parent_span_id, b64_parent = normalise_id(raw_parent, 8)
        if parent_span_id == "0" * 16:
            parent_span_id = None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        raise _BadSpan("all-zero trace or span id")
    kind = _enum(_SPAN_KINDS, span.get("kind", 0), "INTERNAL")
    status = span.get("status") or {}
    code = status.get("code", 0) if isinstance(status, dict) else 0
    end = _uint64(_get(span, "endTimeUnixNano", "end_time_unix_nano"), "endTimeUnixNano")
    name = span.get("name", "")
    attributes = decode_attributes(span.get("attributes", []))
    damaged: list[tuple[str, str]] = []
    for text, value, sha in _PAYLOAD_TEXTS:
        key = text if text in attributes else value if sha in attributes else None
        payload = attributes.get(key) if key is not None else None
        if key is None or not isinstance(payload, str):
            continue
        why = _unloadable_payload(payload)
        if why is not None:
            damaged.append((key, why))
    for key, _ in damaged:
        del attributes[key]
    record = SpanRecord(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent_span_id,
        name=name if isinstance(name, str) else str(name),
        kind=kind,
        start_time_unix_nano=_uint64(
            _get(span, "startTimeUnixNano", "start_time_unix_nano"), "startTimeUnixNano"
        ),
        end_time_unix_nano=end or None,
        status=_enum(_STATUS_CODES, code, "unset"),
        attributes=attributes,
    )
    dropped = _get(span, "droppedAttributesCount", "dropped_attributes_count")
    flags = span.get("flags", 0)
    flags = flags if isinstance(flags, int) and not isinstance(flags, bool) else 0
    return _Decoded(
        record,
        b64_trace or b64_span or b64_parent,
        dropped if isinstance(dropped, int) and not isinstance(dropped, bool) else 0,
        tuple(damaged),
        parent_span_id is not None and flags & (_HAS_IS_REMOTE | _IS_REMOTE) == _HAS_IS_REMOTE,
    )


#: What a GenAI call-details log record contributes to its span: the content attributes only (the
#: span holds the model, parameters, usage and ids itself, and wins where both hold a key).
_GENAI_LOG_KEYS = frozenset(
    {
        k.GEN_AI_INPUT_MESSAGES,
        k.GEN_AI_OUTPUT_MESSAGES,
        k.GEN_AI_SYSTEM_INSTRUCTIONS,
        k.GEN_AI_TOOL_DEFINITIONS,
    }
)


@dataclass(frozen=True, slots=True)
class _LogContent:
    """The content of one GenAI call-details log record, waiting for its span."""

    trace_id: str
    span_id: str
    attributes: dict[str, Any]
    """Content attributes as a span holds them: structured values (``kvlistValue`` /
    ``arrayValue``, what util-genai writes on log records) as compact JSON text, like the
    span attributes of ``SPAN_ONLY``; anything else as it came (the adapter names it)."""


def _event_name(record: Mapping[str, Any]) -> Any:
    """A log record's event name: ``eventName`` (OTLP 1.5+), else the older events API's
    ``event.name`` attribute. Only that attribute is decoded: other records cost a key scan."""
    name = _get(record, "eventName", "event_name")
    if name:
        return name
    attributes = record.get("attributes")
    for item in attributes if isinstance(attributes, list) else ():
        if type(item) is dict and item.get("key") == k.EVENT_NAME_ATTRIBUTE:
            value = item.get("value")
            return value.get("stringValue") if isinstance(value, dict) else None
    return None


def _bytes_as_text(value: Any) -> str:
    if isinstance(value, bytes):  # (util-genai's JSON encoder writes bytes as base64 too)
        return base64.b64encode(value).decode("ascii")
    raise TypeError(type(value).__name__)


def _span_attribute(value: Any) -> Any:
    if not isinstance(value, (tuple, dict)):
        return value
    try:
        return orjson.dumps(value, default=_bytes_as_text).decode("utf-8")
    except orjson.JSONEncodeError as exc:
        raise _BadSpan(f"a content attribute cannot be read as JSON ({exc})") from None


def decode_genai_log_record(record: Any) -> _LogContent | None:
    """The content a ``gen_ai.client.inference.operation.details`` log record holds for its span
    (None: another log record, ignored). Raises on a record of that name that cannot be read."""
    if not isinstance(record, dict) or _event_name(record) != k.GEN_AI_DETAILS_EVENT:
        return None
    raw_trace, raw_span = _get(record, "traceId", "trace_id"), _get(record, "spanId", "span_id")
    if not raw_trace or not raw_span:
        raise _BadSpan("it names no span (no trace id or span id)")
    trace_id, _ = normalise_id(raw_trace, 16)
    span_id, _ = normalise_id(raw_span, 8)
    if trace_id == "0" * 32 or span_id == "0" * 16:
        raise _BadSpan("all-zero trace or span id")
    items = record.get("attributes", [])
    if not isinstance(items, list):
        raise _BadSpan("attributes is not a list")
    wanted = [i for i in items if type(i) is dict and i.get("key") in _GENAI_LOG_KEYS]
    attributes = {key: _span_attribute(v) for key, v in decode_attributes(wanted).items()}
    return _LogContent(trace_id, span_id, attributes)


def _items_of(
    data: Mapping[str, Any],
    resources: tuple[str, str],
    scopes: tuple[tuple[str, str], ...],
    items: tuple[str, str],
) -> Iterator[Any]:
    """The items (spans, log records) of an OTLP request: ``resources`` names the list of
    resources, ``scopes`` the names its scope list may have (the first found is read), ``items``
    each scope's list; each as (OTLP JSON name, protobuf field name). Raises :class:`_BadSpan`
    for a shape that is not OTLP."""
    found = _get(data, *resources)
    if not isinstance(found, list):
        raise _BadSpan(f"{resources[0]} is not a list")
    for resource in found:
        if not isinstance(resource, dict):
            raise _BadSpan(f"a {resources[0]} entry is not an object")
        listed = next((v for names in scopes if (v := _get(resource, *names)) is not None), None)
        if listed is None:
            continue
        if not isinstance(listed, list):
            raise _BadSpan(f"{scopes[0][0]} is not a list")
        for scope in listed:
            # (an empty list is left out of OTLP JSON: a scope without one holds none)
            entries = _get(scope, *items) if isinstance(scope, dict) else None
            entries = [] if isinstance(scope, dict) and entries is None else entries
            if not isinstance(entries, list):
                raise _BadSpan(f"a {scopes[0][0]} entry has no list of {items[0]}")
            yield from entries


def _log_records_of(data: Mapping[str, Any]) -> Iterator[Any]:
    return _items_of(
        data, ("resourceLogs", "resource_logs"), (("scopeLogs", "scope_logs"),), _LOG_RECORDS
    )


def _spans_of(data: Mapping[str, Any]) -> Iterator[Any]:
    return _items_of(data, ("resourceSpans", "resource_spans"), _SCOPE_SPANS, ("spans", "spans"))


_LOG_RECORDS = ("logRecords", "log_records")
#: collectors before OTLP 0.19 wrote instrumentationLibrarySpans
_SCOPE_SPANS = (
    ("scopeSpans", "scope_spans"),
    ("instrumentationLibrarySpans", "instrumentation_library_spans"),
)


# --- sources -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Record:
    where: str
    data: bytes | Mapping[str, Any]


class _Source:
    """Something that can be read twice, record by record."""

    name: str

    def records(self) -> Iterator[_Record]:
        raise NotImplementedError


def _split_text(name: str, data: bytes) -> list[_Record]:
    """Text content: one JSON object (a request body, maybe pretty-printed) or JSON Lines."""
    stripped = data.strip()
    if not stripped:
        return []
    if b"\n" in stripped:
        try:
            if isinstance(orjson.loads(stripped), dict):
                return [_Record(name, stripped)]
        except orjson.JSONDecodeError:
            pass
    return [
        _Record(f"{name}:{n}", line)
        for n, line in enumerate(data.splitlines(), start=1)
        if line.strip()
    ]


class _MemorySource(_Source):
    def __init__(self, name: str, records: list[_Record]) -> None:
        self.name = name
        self._records = records

    def records(self) -> Iterator[_Record]:
        return iter(self._records)


class _Capped:
    """A binary stream read through the caps of :class:`ReadLimits`: lines no longer than
    ``max_line_bytes``, and (gzip) no more than ``max_decompressed_bytes`` expanded in all. Any
    failure of the stream (a truncated or corrupt gzip) is an :class:`OtlpImportError`."""

    def __init__(self, name: str, raw: IO[bytes], limits: ReadLimits, compressed: bool) -> None:
        self.name = name
        self.raw = raw
        self.limits = limits
        self.compressed = compressed
        self.handle: IO[bytes] = (
            typing.cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb")) if compressed else raw
        )
        self.expanded = 0

    def __enter__(self) -> _Capped:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()
        self.raw.close()

    def _count(self, data: bytes) -> bytes:
        self.expanded += len(data)
        if self.compressed and self.expanded > self.limits.max_decompressed_bytes:
            raise OtlpImportError(
                f"{self.name}: expands beyond {self.limits.max_decompressed_bytes} bytes "
                "(the decompressed-size limit)"
            )
        return data

    def _failed(self, exc: Exception) -> OtlpImportError:
        what = "truncated gzip data" if isinstance(exc, EOFError) else f"cannot read: {exc}"
        return OtlpImportError(f"{self.name}: {what}")

    def readline(self) -> bytes:
        cap = self.limits.max_line_bytes
        try:
            line = self.handle.readline(cap + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise self._failed(exc) from None
        if len(line) > cap and not line.endswith(b"\n"):
            raise OtlpImportError(
                f"{self.name}: a line longer than {cap} bytes (the line-length limit)"
            )
        return self._count(line)

    def read(self, size: int) -> bytes:
        try:
            return self._count(self.handle.read(size))
        except (OSError, EOFError, zlib.error) as exc:
            raise self._failed(exc) from None

    def rewind(self) -> None:
        try:
            self.handle.seek(0)
        except (OSError, EOFError, zlib.error) as exc:
            raise self._failed(exc) from None
        self.expanded = 0

    def lines(self) -> Iterator[bytes]:
        while True:
            line = self.readline()
            if not line:
                return
            yield line


class _FileSource(_Source):
    """A file on disk (a regular file only). The first read notes its size; later reads stop
    there, so lines a collector appends meanwhile are not half-seen."""

    def __init__(self, path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> None:
        self.path = path
        self.name = str(path)
        self.limits = limits
        self._limit: int | None = None
        self._whole: bool | None = None

    def _open(self) -> _Capped:
        try:
            handle = open_regular(self.path, self.limits)
        except NotRegularFile as exc:
            if exc.reason.startswith("is a directory"):
                raise OtlpImportError(
                    f"{self.name}: is a directory, not an OTLP JSON file"
                ) from None
            raise OtlpImportError(
                f"{self.name}: {exc.reason}; only regular files are read"
            ) from None
        except FileNotFoundError:
            raise OtlpImportError(f"{self.name}: no such file") from None
        except IsADirectoryError:
            raise OtlpImportError(f"{self.name}: is a directory, not an OTLP JSON file") from None
        except OSError as exc:
            raise OtlpImportError(f"{self.name}: cannot read: {exc.strerror or exc}") from None
        try:
            head = handle.read(64)
            handle.seek(0)
        except OSError as exc:
            handle.close()
            raise OtlpImportError(f"{self.name}: cannot read: {exc.strerror or exc}") from None
        if head.startswith(_ZSTD_MAGIC):
            handle.close()
            raise OtlpImportError(
                f"{self.name}: zstd-compressed (file exporter with compression: zstd); "
                "decompress it first (zstd -d)"
            )
        if head.startswith(k.GZIP_MAGIC):
            return _Capped(self.name, handle, self.limits, compressed=True)
        if b"\x00" in head:  # JSON text never holds a NUL byte
            handle.close()
            raise OtlpImportError(
                f"{self.name}: binary data, not OTLP JSON (a file exporter with format: proto "
                "writes this; configure format: json)"
            )
        return _Capped(self.name, handle, self.limits, compressed=False)

    def records(self) -> Iterator[_Record]:
        with self._open() as handle:
            if self._whole is None:
                self._whole = self._is_whole_body(handle)
                handle.rewind()
            if self._whole:
                cap = min(MAX_WHOLE_FILE_BYTES, self.limits.max_line_bytes)
                data = handle.read(cap + 1 if self._limit is None else self._limit)
                if len(data) > cap:
                    raise OtlpImportError(
                        f"{self.name}: a request body larger than {cap} bytes (the line-length "
                        "limit)"
                    )
                self._limit = len(data)
                yield _Record(self.name, data)
                return
            read = 0
            for n, line in enumerate(handle.lines(), start=1):
                if self._limit is not None and read + len(line) > self._limit:
                    line = line[: self._limit - read]
                read += len(line)
                if line.strip():
                    yield _Record(f"{self.name}:{n}", line)
                if self._limit is not None and read >= self._limit:
                    break
            self._limit = read

    def _is_whole_body(self, handle: _Capped) -> bool:
        """A request body: the first line is not a JSON object by itself but the file is."""
        first = b""
        for line in handle.lines():
            if line.strip():
                first = line
                break
        try:
            if isinstance(orjson.loads(first), dict):
                return False
        except orjson.JSONDecodeError:
            pass
        handle.rewind()
        cap = min(MAX_WHOLE_FILE_BYTES, self.limits.max_line_bytes)
        data = handle.read(cap + 1)
        if len(data) > cap:
            return False
        try:
            return isinstance(orjson.loads(data), dict)
        except orjson.JSONDecodeError:
            return False


OtlpSource: TypeAlias = "str | os.PathLike[str] | bytes | Mapping[str, Any] | Iterable[Any]"
"""A path, OTLP JSON text or bytes, one parsed ``TracesData`` dict, or an iterable of lines (str or
bytes) or parsed dicts."""


def _source(source: OtlpSource, limits: ReadLimits = DEFAULT_LIMITS) -> _Source:
    if isinstance(source, os.PathLike):
        return _FileSource(Path(source), limits)
    if isinstance(source, str):
        if source.lstrip().startswith("{"):
            return _MemorySource("<text>", _split_text("<text>", source.encode("utf-8")))
        return _FileSource(Path(source), limits)
    if isinstance(source, (bytes, bytearray)):
        return _MemorySource("<bytes>", _split_text("<bytes>", bytes(source)))
    if isinstance(source, Mapping):
        return _MemorySource("<object>", [_Record("<object>", source)])
    records: list[_Record] = []
    for n, item in enumerate(source, start=1):
        where = f"<lines>:{n}"
        if isinstance(item, Mapping):
            records.append(_Record(where, item))
        elif isinstance(item, (str, bytes)):
            data = item.encode("utf-8") if isinstance(item, str) else item
            if data.strip():
                records.append(_Record(where, data))
        else:
            raise TypeError(f"cannot read OTLP JSON from an item of type {type(item).__name__}")
    return _MemorySource("<lines>", records)


# --- the two passes ------------------------------------------------------------------------------


def _ids_in(data: bytes | Mapping[str, Any]) -> list[str]:
    """Trace ids named in a record, without parsing JSON (bytes) or by walking it (a dict)."""
    found: list[str] = []
    if isinstance(data, Mapping):
        logs = _get(data, "resourceSpans", "resource_spans") is None
        try:
            raws: Iterable[Any] = [
                _get(s, "traceId", "trace_id")
                for s in (_log_records_of(data) if logs else _spans_of(data))
            ]
        except (_BadSpan, AttributeError):
            raws = []
    else:
        raws = (m.group(1).decode("ascii", "replace") for m in _TRACE_ID_KEY.finditer(data))
    for raw in raws:
        try:
            found.append(normalise_id(raw, 16)[0])
        except _BadSpan:
            continue
    return found


@dataclass
class _Index:
    """Where each trace ends, packed: trace ids (16 bytes each, concatenated) sorted by the
    number of the last record naming them, and those numbers -- 24 bytes per trace."""

    ids: bytes = b""
    ends: array[int] = field(default_factory=lambda: array("Q"))
    anonymous_damage: list[str] = field(default_factory=list)
    """Unreadable records naming no trace id: any trace may have lost spans in them."""

    def closing(self) -> Iterator[tuple[int, str]]:
        """(record number, trace id) in the order the traces end."""
        for n, end in enumerate(self.ends):
            yield end, self.ids[16 * n : 16 * (n + 1)].hex()


def _index(sources: list[_Source]) -> _Index:
    index = _Index()
    # the one structure here that grows with the number of traces: about 120 bytes per trace,
    # during this pass only (packed to 24 bytes per trace below)
    last: dict[bytes, int] = {}
    number = 0
    for source in sources:
        for record in source.records():
            number += 1
            ids = _ids_in(record.data)
            for trace_id in ids:
                last[bytes.fromhex(trace_id)] = number
            if not ids and not isinstance(record.data, Mapping):
                # rare (logs/metrics lines, junk): parse it now, so a damaged one is known before
                # the first bundle is emitted
                try:
                    orjson.loads(record.data)
                except orjson.JSONDecodeError:
                    index.anonymous_damage.append(record.where)
    ordered = sorted(last, key=last.__getitem__)  # stable: first-seen order among equals
    index.ends = array("Q", (last[trace_id] for trace_id in ordered))
    index.ids = b"".join(ordered)
    return index


def _orphans(records: list[SpanRecord], local: set[str]) -> list[SpanRecord]:
    """The spans (runs aside) whose parent is in their own process and never arrived: the
    application's span they were made in was not exported, or was lost on the way."""
    ids = {s.span_id for s in records}
    return [
        s
        for s in records
        if s.span_id in local and s.parent_span_id not in ids and s.stepfork_kind != k.KIND_RUN
    ]


def _first_within(
    spans: list[SpanRecord],
) -> Callable[[SpanRecord | None], SpanRecord | None]:
    """A lookup of the first of ``spans`` (by start time) that may have been part of a run --
    it started while the run was open (any span, for the calls outside runs: None) -- in
    logarithmic time: a trace of many runs and many such spans costs their sum, not product."""
    ordered = sorted(spans, key=lambda s: s.start_time_unix_nano)
    starts = [s.start_time_unix_nano for s in ordered]

    def first(run: SpanRecord | None) -> SpanRecord | None:
        if not ordered:
            return None
        if run is None:
            return ordered[0]
        n = bisect.bisect_left(starts, run.start_time_unix_nano)
        if n == len(ordered):
            return None
        end = run.end_time_unix_nano
        return ordered[n] if not end or starts[n] <= end else None

    return first


def _why_unread(exc: Exception) -> str:
    """Why a span or log record could not be read: the decoder's own words, or the error's
    type only (an unexpected error's text could quote the input)."""
    return str(exc) if isinstance(exc, _BadSpan) else f"unreadable ({type(exc).__name__})"


class _Assembler:
    """Pass 2: parse records in order, buffer spans by trace, hand finished traces on."""

    def __init__(
        self,
        report: ImportReport,
        redactor: Redactor,
        keep: str | None = None,
        limits: ReadLimits = DEFAULT_LIMITS,
    ) -> None:
        self.report = report
        self.limits = limits
        self.redactor = redactor
        self.keep = keep
        self.building: dict[str, dict[str, SpanRecord]] = {}
        self.lost: dict[str, list[str]] = {}
        self.dropped_attributes: dict[str, int] = {}
        self.local_parents: dict[str, set[str]] = {}
        """trace id -> the spans whose parent is in their own process (``_Decoded.local_parent``)."""
        self.seen: dict[str, bool] = {}
        """trace id -> holds a stepfork span (only filled when looking for one trace)."""
        self.in_flight = 0
        self.trace_records = 0
        self.lost_by_all: list[str] = []
        """Unreadable records naming no trace id: every trace is marked incomplete by them."""
        self.log_content: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {}
        """trace id -> span id -> (where, content) of the GenAI call-details log records read
        (until their trace is finished: see the module docstring)."""

    def feed(self, record: _Record) -> None:
        report = self.report
        report.lines += 1
        data = record.data
        depth = self.limits.max_json_depth
        if (
            text_depth_exceeds(data, depth)
            if not isinstance(data, Mapping)
            else json_depth_exceeds(data, depth)
        ):
            self._damaged(record, f"JSON nested deeper than {depth} levels; line skipped")
            return
        if not isinstance(data, Mapping):
            try:
                data = orjson.loads(data)
            except orjson.JSONDecodeError as exc:
                self._damaged(record, f"truncated or not valid JSON ({exc}); line skipped")
                return
        if not isinstance(data, Mapping):
            self._problem(record.where, "not OTLP trace data (not a JSON object); line skipped")
            return
        if _get(data, "resourceSpans", "resource_spans") is None:
            logs = _get(data, "resourceLogs", "resource_logs") is not None
            if logs and self._read_logs(record.where, data):
                return
            if any(key in data for key in _OTHER_SIGNALS):
                report.other_signals += 1
            else:
                self._problem(
                    record.where, "not OTLP trace data (no resourceSpans field); line skipped"
                )
            return
        try:
            spans = list(_spans_of(data))
        except _BadSpan as exc:  # valid JSON in the wrong shape: the traces it names lose spans
            named = _ids_in(record.data) if not isinstance(record.data, Mapping) else []
            self._problem(record.where, f"not OTLP trace data ({exc}); line skipped", lost=named)
            return
        self.trace_records += 1
        for n, raw in enumerate(spans, start=1):
            try:
                decoded = decode_span(raw)
            except Exception as exc:  # one span that cannot be read never stops the others
                why = _why_unread(exc)
                ids = _ids_in({"resourceSpans": [{"scopeSpans": [{"spans": [raw]}]}]})
                self.report.skipped_spans += 1
                self._problem(record.where, f"span {n} skipped: {why}", lost=ids)
                continue
            for key, why in decoded.damaged_payloads:
                self._problem(record.where, f"span {n}: {key} {why}; imported as missing")
            self._add(decoded)
        report.max_traces_in_flight = max(report.max_traces_in_flight, len(self.building))
        report.max_spans_in_flight = max(report.max_spans_in_flight, self.in_flight)

    def _read_logs(self, where: str, data: Mapping[str, Any]) -> bool:
        """Keep the content of the line's GenAI call-details log records for their spans; the
        others are ignored. False: the line held no such record (a skipped line of logs)."""
        try:
            records = list(_log_records_of(data))
        except _BadSpan as exc:
            self._problem(where, f"log records not read ({exc}); line skipped")
            return True
        found = False
        for n, raw in enumerate(records, start=1):
            try:
                content = decode_genai_log_record(raw)
            except Exception as exc:  # one record that cannot be read never stops the others
                why = _why_unread(exc)
                self._problem(
                    where,
                    f"log record {n} ({k.GEN_AI_DETAILS_EVENT}) skipped: {why}; the messages "
                    "of its call are not imported",
                )
                found = True
                continue
            if content is None:
                continue
            found = True
            if self.keep is not None and content.trace_id != self.keep:
                continue
            spans = self.log_content.setdefault(content.trace_id, {})
            spans.setdefault(content.span_id, (where, content.attributes))  # (a retried export)
        return found

    def _with_log_content(
        self, records: list[SpanRecord], content: dict[str, tuple[str, dict[str, Any]]]
    ) -> list[SpanRecord]:
        """The spans with the content of their GenAI call-details log records, as if it had
        been their attributes (a span's own attribute wins)."""
        joined: list[SpanRecord] = []
        for span in records:
            found = content.pop(span.span_id, None)
            if found is not None:
                span = dataclasses.replace(span, attributes={**found[1], **span.attributes})
                self.report.genai_log_records += 1
            joined.append(span)
        return joined

    def _unjoined(self, trace_id: str, content: dict[str, tuple[str, dict[str, Any]]]) -> None:
        for span_id, (where, _) in content.items():
            self._problem(
                where,
                f"a {k.GEN_AI_DETAILS_EVENT} log record names span {span_id} of trace "
                f"{trace_id}, which is not in the input; its messages are not imported",
            )

    def _add(self, decoded: _Decoded) -> None:
        span = decoded.record
        report = self.report
        report.spans += 1
        report.base64_ids = report.base64_ids or decoded.base64_ids
        if self.keep is not None:
            if is_stepfork_span(span):
                self.seen[span.trace_id] = True
            else:
                self.seen.setdefault(span.trace_id, False)
            if span.trace_id != self.keep:
                return
        if decoded.local_parent:
            self.local_parents.setdefault(span.trace_id, set()).add(span.span_id)
        if decoded.dropped_attributes:
            self.dropped_attributes[span.trace_id] = (
                self.dropped_attributes.get(span.trace_id, 0) + decoded.dropped_attributes
            )
        spans_of_trace = self.building.get(span.trace_id)
        if spans_of_trace is None:
            spans_of_trace = self.building[span.trace_id] = {}
        if span.span_id not in spans_of_trace:  # an export retried after a timeout repeats spans
            spans_of_trace[span.span_id] = span
            self.in_flight += 1

    def finish(self, trace_id: str) -> list[Trace]:
        """The bundles of a trace whose spans have all been read: one per top-level run (as the
        processor writes them), or one for a trace whose calls are outside any run."""
        spans = self.building.pop(trace_id, None)
        lost = self.lost.pop(trace_id, None)
        dropped = self.dropped_attributes.pop(trace_id, 0)
        local = self.local_parents.pop(trace_id, set())
        content = self.log_content.pop(trace_id, {})
        if spans is None:
            self._unjoined(trace_id, content)
            return []
        self.in_flight -= len(spans)
        report = self.report
        records = list(spans.values())
        where = f"trace {trace_id}"
        adopted_run = False
        if not any(is_stepfork_span(s) for s in records):
            if content:
                records = self._with_log_content(records, content)
                self._unjoined(trace_id, content)
            adopted = foreign.adopt(records, self.redactor)  # another instrumentation's spans
            if adopted is None:
                report.ignored_traces += 1
                report.ignored_spans += len(records)
                return []
            records = adopted.records
            adopted_run = True  # (no processor wrote them: every call the spans hold is kept)
            for note in adopted.notes:
                self._problem(where, note)
        if dropped:
            self._problem(
                where,
                f"the SDK dropped {dropped} span attributes (attribute count limit); raise "
                "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT -- payloads may be missing",
            )
        reason = None
        lost = (lost or []) + self.lost_by_all
        if lost:
            shown = ", ".join(lost[:3]) + (f" (and {len(lost) - 3} more)" if len(lost) > 3 else "")
            reason = f"spans lost in unreadable input: {shown}"
        runs = top_level_runs(records)
        orphans = _orphans(records, local)
        parents, kinds = parents_and_kinds(records)
        outside = grouping.calls_outside_runs(parents, kinds, [r.span_id for r in runs])
        if runs and outside:
            calls = [s for s in records if s.span_id in outside]
            calls = [s for s in calls if s.stepfork_kind in k.BOUNDARY_KINDS]
            self._problem(
                where,
                f"{len(calls)} calls outside the recorded run(s) were not imported "
                f"(first: {self.redactor.redact_text(calls[0].name)!r})",
            )
        traces: list[Trace] = []
        # one bundle per top-level run, as the processor writes them; a trace holding no run
        # makes one bundle of calls outside runs per top-level span holding calls (what a
        # processor with a directory writes for each local root, or call outside any span)
        roots: list[SpanRecord | None] = list(runs) or list(_tops_with_calls(records, local))
        roots = roots or [None]
        # each bundle is handed its own spans (all of them, one bundle): one pass, not one per root
        bundle_of = grouping.local_roots(parents, {r.span_id for r in roots if r is not None})
        spans_of: dict[str | None, list[SpanRecord]] = {}
        for span in records:
            spans_of.setdefault(bundle_of.get(span.span_id), []).append(span)
        first_orphan = _first_within(orphans)
        for root in roots:
            orphan = first_orphan(root)
            why = reason  # (a lost line is the likelier cause of a missing span: said first)
            if orphan is not None and why is None:
                why = (
                    f"span {orphan.parent_span_id}, which "
                    f"{self.redactor.redact_text(orphan.name)!r} was made in, never "
                    "arrived (spans under it may be missing)"
                )
            try:
                trace = spans_to_trace(
                    records if root is None else spans_of[root.span_id],
                    redactor=self.redactor,
                    complete=why is None,
                    incomplete_reason=why,
                    root_span_id=None if root is None else root.span_id,
                    until_root_ends=not adopted_run,
                )
            except Exception as exc:  # one trace that cannot be converted must not stop the rest
                self._problem(where, f"not imported: {type(exc).__name__}: {exc}")
                continue
            traces.append(trace)
        report.traces += len(traces)
        return traces

    def _problem(self, where: str, message: str, lost: Iterable[str] = ()) -> None:
        self.report.problems.append(ImportProblem(where, message))
        for trace_id in lost:
            if self.keep is None or trace_id == self.keep:
                self.lost.setdefault(trace_id, []).append(where)

    def _damaged(self, record: _Record, message: str) -> None:
        ids = _ids_in(record.data) if not isinstance(record.data, Mapping) else []
        if not ids:
            message += "; it names no trace id, so every run is marked as possibly incomplete"
            if record.where not in self.lost_by_all:
                self.lost_by_all.append(record.where)
        self._problem(record.where, message, lost=dict.fromkeys(ids))


def _tops_with_calls(records: list[SpanRecord], local: set[str]) -> list[SpanRecord]:
    """The local roots of a trace with no run (spans with no parent, or whose parent is in
    another process) that have boundary calls at or under them, in the order they started:
    one bundle each, as the processor writes them. Empty when some call hangs under none of
    them (its parent, in the same process, never arrived: the trace is then one bundle, said
    incomplete). ``local``: the spans whose OTLP flags say their parent is in their process."""
    parents, kinds = parents_and_kinds(records)
    tops = {
        s.span_id: s
        for s in records
        if s.parent_span_id is None or (s.parent_span_id not in parents and s.span_id not in local)
    }
    root_of = grouping.local_roots(parents)
    holding = {root_of.get(i) for i, kind in kinds.items() if kind in k.BOUNDARY_KINDS}
    if not all(top in tops for top in holding):  # (None: a call under a cycle)
        return []
    return sorted((tops[i] for i in holding if i is not None), key=call_order)


def _read_sources(sources: list[_Source], report: ImportReport) -> Iterator[_Record]:
    report.files += len(sources)
    for source in sources:
        yield from source.records()


def _check_any_trace_data(assembler: _Assembler, sources: list[_Source]) -> None:
    if assembler.trace_records == 0 and assembler.report.lines:
        names = ", ".join(s.name for s in sources)
        first = assembler.report.problems[0] if assembler.report.problems else None
        raise OtlpImportError(
            f"{names}: no OTLP trace data" + (f" (first problem: {first})" if first else "")
        )


def _iter_all(
    sources: list[_Source], report: ImportReport, redactor: Redactor, limits: ReadLimits
) -> Iterator[Trace]:
    index = _index(sources)
    assembler = _Assembler(report, redactor, limits=limits)
    assembler.lost_by_all = list(index.anonymous_damage)
    closing = index.closing()
    end, trace_id = next(closing, (0, ""))
    for number, record in enumerate(_read_sources(sources, report), start=1):
        assembler.feed(record)
        while end == number:
            yield from assembler.finish(trace_id)
            end, trace_id = next(closing, (0, ""))
    for trace_id in [*assembler.building, *assembler.log_content]:  # ids the index missed
        yield from assembler.finish(trace_id)  # (not expected)
    _check_any_trace_data(assembler, sources)


def _one_trace(
    sources: list[_Source],
    trace_id: str,
    report: ImportReport,
    redactor: Redactor,
    limits: ReadLimits,
) -> list[Trace]:
    assembler = _Assembler(report, redactor, keep=trace_id, limits=limits)
    for record in _read_sources(sources, report):
        assembler.feed(record)
    _check_any_trace_data(assembler, sources)
    where = ", ".join(s.name for s in sources)
    if trace_id not in assembler.building:
        if trace_id in assembler.lost:
            raise OtlpImportError(
                f"trace {trace_id} appears in {where} only in unreadable lines "
                f"({', '.join(assembler.lost[trace_id][:3])})"
            )
        runs = [t for t, has_run in assembler.seen.items() if has_run]
        shown = ", ".join(runs[:_MAX_IDS_SHOWN]) + (" …" if len(runs) > _MAX_IDS_SHOWN else "")
        raise OtlpImportError(
            f"trace {trace_id} is not in {where}; "
            + (
                f"it holds {len(runs)} trace{'s' if len(runs) != 1 else ''} with stepfork "
                f"spans: {shown}"
                if runs
                else "it holds no stepfork spans at all"
            )
        )
    spans = len(assembler.building[trace_id])
    ignored = report.ignored_traces
    traces = assembler.finish(trace_id)
    if not traces and report.ignored_traces > ignored:
        raise OtlpImportError(
            f"trace {trace_id} in {where} holds no stepfork spans and no calls of an "
            f"instrumentation the importer reads ({spans} spans): nothing to import"
        )
    return traces


def _trace_id_arg(trace_id: str) -> str:
    try:
        return normalise_id(trace_id.strip(), 16)[0]
    except _BadSpan:
        raise OtlpImportError(
            f"{trace_id!r} is not a trace id (32 hex digits, or base64 of 16 bytes)"
        ) from None


def iter_traces_from_otlp_json(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    trace_id: str | None = None,
    report: ImportReport | None = None,
    redactor: Redactor | None = None,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> Iterator[Trace]:
    """Every recorded run in OTLP JSON files, one :class:`Trace` each, streaming (see the module
    docstring): a run is yielded as soon as the last line holding spans of its trace is read.

    A trace holding several runs yields one Trace per run (as the processor writes them).
    ``trace_id`` keeps one trace (:class:`OtlpImportError` if it is not there). ``report`` is
    filled in with counts and the problems met (without one, problems are logged as warnings). A
    file that cannot be read raises :class:`OtlpImportError` before anything is yielded.
    ``redactor``: the redaction rules the recording process used (default: the built-in rules);
    the conversion applies them to the application's span names it keeps as context, so with
    the same rules the imported bundle is the bundle the process wrote. ``limits``: what the
    read may cost (:class:`~stepfork_otel.trace.limits.ReadLimits`; beyond them the import is an
    :class:`OtlpImportError` raised before anything is yielded).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    sources: list[_Source] = [_FileSource(Path(p), limits) for p in paths]
    yield from _iter_sources(
        sources,
        trace_id,
        report,
        redactor or DEFAULT_REDACTOR,
        limits,
        log_problems=report is None,
    )


def _iter_sources(
    sources: list[_Source],
    trace_id: str | None,
    report: ImportReport | None,
    redactor: Redactor,
    limits: ReadLimits = DEFAULT_LIMITS,
    *,
    log_problems: bool,
) -> Iterator[Trace]:
    report = report if report is not None else ImportReport()
    seen_problems = len(report.problems)
    try:
        if trace_id is not None:
            yield from _one_trace(sources, _trace_id_arg(trace_id), report, redactor, limits)
        else:
            yield from _iter_all(sources, report, redactor, limits)
    finally:
        if log_problems:  # a caller with its own report shows the problems itself
            for problem in report.problems[seen_problems:]:
                logger.warning("stepfork_otel import: %s", problem)


def trace_from_otlp_json(
    source: OtlpSource,
    trace_id: str | None = None,
    *,
    redactor: Redactor | None = None,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> Trace:
    """One recorded run from OTLP JSON: a path, the text or bytes of a file or request body, a
    parsed ``TracesData`` dict, or an iterable of lines or dicts.

    Without ``trace_id`` the input must hold exactly one recorded run. Raises
    :class:`OtlpImportError` when it holds none or several, or when ``trace_id`` is not in it.
    Problems in the input are logged; a run that lost spans to them comes back marked incomplete.
    ``redactor``: as for :func:`iter_traces_from_otlp_json`.
    """
    sources = [_source(source, limits)]
    report = ImportReport()
    found: list[Trace] = []
    for trace in _iter_sources(
        sources, trace_id, report, redactor or DEFAULT_REDACTOR, limits, log_problems=True
    ):
        found.append(trace)
        if len(found) > _MAX_IDS_SHOWN:
            break
    name = sources[0].name
    if not found:
        first = f" ({report.problems[0]})" if report.problems else ""
        raise OtlpImportError(f"{name}: no recorded run could be imported{first}")
    if len(found) > 1:
        shown = ", ".join(
            t.trace_id if trace_id is None else f"run span {t.run.span_id}"
            for t in found[:_MAX_IDS_SHOWN]
        )
        more = " …" if len(found) > _MAX_IDS_SHOWN else ""
        hint = "pass trace_id=" if trace_id is None else "use iter_traces_from_otlp_json"
        raise OtlpImportError(f"{name} holds several recorded runs ({shown}{more}); {hint}")
    return found[0]
