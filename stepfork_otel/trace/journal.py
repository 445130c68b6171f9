"""Run journals of earlier versions: what a run had recorded, kept next to its bundle.

Before bundles were written as their run goes (format 3, see :mod:`stepfork_otel.trace.bundle`),
the processor appended each span of a run to the run's *journal*, ``<bundle>.journal``, as it
started and as it ended, and wrote the bundle when the run ended. Nothing writes one any more;
one left behind by a dead process of such a version is still a bundle in all but form:
:func:`read_journal` turns it into a :class:`~stepfork_otel.trace.models.Trace` with the same
span -> event conversion as the processor, marked ``complete: false``; calls that had started
and not ended are calls without an outcome (replay stops there). ``Trace.load`` / ``stepfork
show`` / ``stepfork replay`` read a journal directly, and the next recording in that directory
turns it into its bundle. :func:`journal_header` and :func:`journal_line` remain its writer's
spelling (tests and the fuzz campaign's golden journal use them).

Format (version 1)::

    {"format":"sftrace-journal","journal_version":1,"bundle":"run.sftrace","pid":123,...}
    {"span":{...SpanRecord...},"payloads":{"stepfork.input":{"text":...,"sha256":...},...}}
    ...

The last line for a span id wins (its end replaces its start). A torn last line (the kill came
mid-write) is ignored; any other damage is a :class:`BundleError`. Span names of the
application's own spans are redacted before they are written (the processor's rules), as in a
bundle.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from stepfork_otel.constants import INPUT_KEYS, JOURNAL_FORMAT, OUTPUT_KEYS
from stepfork_otel.trace.conversion import SpanRecord, spans_to_trace
from stepfork_otel.trace.errors import BundleError, quote
from stepfork_otel.trace.limits import DEFAULT_LIMITS, ReadLimits, json_depth_exceeds
from stepfork_otel.trace.models import Trace
from stepfork_otel.trace.payload import Payload
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR

JOURNAL_VERSION = 1
#: First bytes of every journal (how ``load_trace`` tells one from a bundle).
JOURNAL_MAGIC = b'{"format":"' + JOURNAL_FORMAT.encode() + b'"'
#: Why a bundle recovered from a journal is incomplete.
RECOVERED_REASON = "the process ended before the run did; recovered from its journal"


def journal_header(bundle_name: str, trace_id: str, run_span_id: str, pid: int) -> bytes:
    return (
        orjson.dumps(
            {
                "format": JOURNAL_FORMAT,
                "journal_version": JOURNAL_VERSION,
                "bundle": bundle_name,
                "trace_id": trace_id,
                "run_span_id": run_span_id,
                "pid": pid,
            }
        )
        + b"\n"
    )


#: Left off a started span's line: its payload texts (the ended span's line has them whole).
_PAYLOAD_TEXT_KEYS = frozenset((*INPUT_KEYS[:1], INPUT_KEYS[5], *OUTPUT_KEYS[:1], OUTPUT_KEYS[5]))
_COPIES = {INPUT_KEYS[0]: INPUT_KEYS[5], OUTPUT_KEYS[0]: OUTPUT_KEYS[5]}


def journal_line(record: SpanRecord) -> bytes:
    """One span (started or ended) as a journal line. A started span's line leaves its payload
    texts off (a call that never ends is a call without a result: replay stops there anyway), so
    what a call costs the journal is one short line and one whole one."""
    if record.end_time_unix_nano is None:
        skip: Iterable[str] = _PAYLOAD_TEXT_KEYS
    else:  # a payload handed over whole: its attribute and OpenInference value are copies
        skip = {*record.payloads, *(_COPIES[key] for key in record.payloads if key in _COPIES)}
    span = {
        "trace_id": record.trace_id,
        "span_id": record.span_id,
        "parent_span_id": record.parent_span_id,
        "name": record.name,
        "kind": record.kind,
        "start": record.start_time_unix_nano,
        "end": record.end_time_unix_nano,
        "status": record.status,
        "attributes": {key: v for key, v in record.attributes.items() if key not in skip},
    }
    payloads = {key: p._asdict() for key, p in record.payloads.items()}
    return orjson.dumps({"span": span, "payloads": payloads}) + b"\n"  # (tuples: arrays)


def _record(line: Any) -> SpanRecord:
    span, payloads = line["span"], line.get("payloads") or {}
    attributes = {
        key: tuple(v) if isinstance(v, list) else v for key, v in span["attributes"].items()
    }
    return SpanRecord(
        trace_id=str(span["trace_id"]),
        span_id=str(span["span_id"]),
        parent_span_id=None if span["parent_span_id"] is None else str(span["parent_span_id"]),
        name=str(span["name"]),
        kind=str(span["kind"]),
        start_time_unix_nano=int(span["start"]),
        end_time_unix_nano=None if span["end"] is None else int(span["end"]),
        status=str(span["status"]),
        attributes=attributes,
        payloads={key: Payload(**value) for key, value in payloads.items()},
    )


def read_journal(
    chunks: Iterable[bytes],
    path: str | os.PathLike[str] | None = None,
    *,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> Trace:
    """The run a journal holds, as a bundle's :class:`Trace` (``complete: false``)."""
    data = b"".join(chunks)  # (a journal is bounded by what the run recorded before it died)
    lines = data.split(b"\n")
    torn = lines.pop()  # after the last line break: empty, or a line the kill cut
    del torn
    if not lines:
        raise BundleError(path, "empty run journal")
    records: dict[str, SpanRecord] = {}
    head: Mapping[str, Any] = {}
    for number, line in enumerate(lines, start=1):
        if len(line) > limits.max_line_bytes:
            raise BundleError(path, f"line {number}: longer than {limits.max_line_bytes} bytes")
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise BundleError(path, f"line {number}: run journal line is not JSON: {exc}") from None
        if json_depth_exceeds(value, limits.max_json_depth):
            raise BundleError(path, f"line {number}: JSON nested too deep")
        if number == 1:
            if not (isinstance(value, dict) and value.get("format") == JOURNAL_FORMAT):
                raise BundleError(path, "not a run journal")
            version = value.get("journal_version")
            if version != JOURNAL_VERSION:
                raise BundleError(path, f"run journal version {quote(version)} is not supported")
            head = value
            continue
        try:
            record = _record(value)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BundleError(
                path, f"line {number}: not a span record ({type(exc).__name__}: {quote(exc)})"
            ) from None
        records[record.span_id] = record
    run = str(head.get("run_span_id", ""))
    if run not in records:
        raise BundleError(path, "the run journal holds no record of its run")
    try:
        # (names were redacted with the recording process's rules before they were written)
        return spans_to_trace(
            list(records.values()),
            redactor=DEFAULT_REDACTOR,
            complete=False,
            incomplete_reason=RECOVERED_REASON,
            root_span_id=run,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BundleError(path, f"the run journal cannot be converted: {quote(exc)}") from None
