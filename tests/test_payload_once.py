"""A payload travels on the span once (issue 16).

Its text is OpenInference's ``input.value``/``output.value``; ``stepfork.input``/``stepfork.output``
is written beside it only when the canonical text is another text (an output whose keys were not
returned sorted). Checked on the OTLP wire itself (the SDK's protobuf encoder), and through the
import: the collector's copy rebuilds the local bundle, and spans written the old way, with both
attributes, still import to the same bundle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import Recording
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from otlp_receiver import collector_lines

from stepfork_otel import Trace, iter_traces_from_otlp_json, llm_request, record, trace_tool
from stepfork_otel import constants as k
from stepfork_otel.trace.bundle import dump_trace
from stepfork_otel.trace.checks import verify_integrity
from stepfork_otel.trace.otlp import ImportReport, decode_span


@trace_tool
def lookup(city: str, max_results: int = 5) -> dict[str, Any]:
    return {"results": [{"city": city, "n": i} for i in range(max_results)], "zone": "CET"}


@trace_tool
def unsorted(city: str) -> dict[str, Any]:
    return {"zone": "CET", "city": city}  # returned order is not the canonical one


def agent() -> str:
    lookup("Paris")
    unsorted("Rome")
    return llm_request(
        provider="openai",
        model="gpt-4o",
        input={"messages": [{"role": "user", "content": "Book Paris " * 20}]},
        call=lambda: {"choices": [{"message": {"role": "assistant", "content": "done"}}]},
    )


def test_each_text_is_on_the_wire_once(recording: Recording, tmp_path: Path) -> None:
    with record(tmp_path / "run.sftrace", input={"q": "Paris"}) as run:
        run.set_output(agent())
    spans = {s.name: s for s in recording.exporter.get_finished_spans()}
    bundle = Trace.load(tmp_path / "run.sftrace")

    tool = spans["execute_tool lookup"]
    wire = encode_spans([tool]).SerializeToString()
    call = bundle.calls[0]
    assert wire.count(call.input.encode()) == 1  # type: ignore[union-attr]
    output = bundle.outcome_of(call).output  # type: ignore[union-attr]
    assert wire.count(output.encode()) == 1
    assert k.INPUT not in tool.attributes  # type: ignore[operator]
    assert k.OUTPUT not in tool.attributes  # type: ignore[operator]

    # an output returned in another key order: two texts, each once
    other = spans["execute_tool unsorted"]
    attributes = dict(other.attributes or {})
    assert attributes[k.OUTPUT] == '{"city":"Rome","zone":"CET"}'  # what the fingerprint is of
    assert attributes[k.OUTPUT_VALUE] == '{"zone":"CET","city":"Rome"}'  # what replay returns
    assert k.INPUT not in attributes

    llm = spans["chat gpt-4o"]
    prompt = bundle.calls[2].input.encode()  # type: ignore[union-attr]
    assert encode_spans([llm]).SerializeToString().count(prompt) == 1


def as_written_before(line: bytes) -> bytes:
    """A collector line as stepfork wrote it before: the canonical text under ``stepfork.*``
    too, wherever only the OpenInference value carried it."""
    data = json.loads(line)
    for resource in data["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                keys = {a["key"]: a for a in span["attributes"]}
                for text, value in ((k.INPUT, k.INPUT_VALUE), (k.OUTPUT, k.OUTPUT_VALUE)):
                    if text not in keys and value in keys:
                        span["attributes"].append({"key": text, "value": keys[value]["value"]})
    return json.dumps(data).encode() + b"\n"


def test_the_collector_copy_rebuilds_the_local_bundle_and_old_spans_still_import(
    recording: Recording, tmp_path: Path
) -> None:
    with record(tmp_path / "run.sftrace", input={"q": "Paris"}) as run:
        run.set_output(agent())
    local = Trace.load(tmp_path / "run.sftrace")
    spans = recording.exporter.get_finished_spans()
    now = tmp_path / "now.jsonl"
    now.write_bytes(b"".join(collector_lines(spans, batch_size=2)))
    before = tmp_path / "before.jsonl"
    before.write_bytes(b"".join(as_written_before(line) for line in now.read_bytes().splitlines()))

    report = ImportReport()
    (imported,) = iter_traces_from_otlp_json(now, report=report)
    assert report.problems == []
    assert verify_integrity(imported) == []
    assert dump_trace(imported) == dump_trace(local)
    (old,) = iter_traces_from_otlp_json(before)
    assert dump_trace(old) == dump_trace(local)

    # what it saves, on the protobuf wire the OTLP exporters send: each copy left off
    sent = encode_spans(spans).ByteSize()
    twice = encode_spans([copied_back(s) for s in spans]).ByteSize()
    left_off = sum(
        len(s.attributes[value].encode())  # type: ignore[index, union-attr]
        for s in spans
        for text, value in ((k.INPUT, k.INPUT_VALUE), (k.OUTPUT, k.OUTPUT_VALUE))
        if value in s.attributes and text not in s.attributes  # type: ignore[operator]
    )
    assert left_off > 0
    assert twice - sent >= left_off


def copied_back(span: ReadableSpan) -> ReadableSpan:
    """``span`` as stepfork wrote it before: the canonical text under ``stepfork.*`` too."""
    attributes = dict(span.attributes or {})
    for text, value in ((k.INPUT, k.INPUT_VALUE), (k.OUTPUT, k.OUTPUT_VALUE)):
        if value in attributes and text not in attributes:
            attributes[text] = attributes[value]
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes,
        events=span.events,
        links=span.links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def test_an_altered_value_is_imported_as_missing_not_kept(
    recording: Recording, tmp_path: Path
) -> None:
    """The OpenInference value is a key others write to (logfire's scrubbing, a collector's
    masking): a value that no longer matches the fingerprint is never taken as the payload."""
    with record(tmp_path / "run.sftrace"):
        lookup("Paris")
    lines = collector_lines(recording.exporter.get_finished_spans(), batch_size=10)
    data = json.loads(lines[0])
    for resource in data["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for attribute in span["attributes"]:
                    if attribute["key"] == k.INPUT_VALUE and span["name"] == "execute_tool lookup":
                        attribute["value"] = {"stringValue": '{"city":"[MASKED]","max_results":5}'}
    masked = tmp_path / "masked.jsonl"
    masked.write_text(json.dumps(data) + "\n")
    (imported,) = iter_traces_from_otlp_json(masked)
    (call,) = imported.calls
    assert (call.input, call.input_missing) == (None, "truncated")
    assert verify_integrity(imported) == []


def test_another_instrumentations_input_value_is_not_a_payload() -> None:
    """A line break in a foreign span's ``input.value`` (OpenInference instrumentations write
    prompts there) is that span's business: no problem is reported, the attribute is kept."""
    span = {
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": "b7ad6b7169203331",
        "name": "ChatCompletion",
        "attributes": [{"key": k.INPUT_VALUE, "value": {"stringValue": "line one\nline two"}}],
    }
    decoded = decode_span(span)
    assert decoded.damaged_payloads == ()
    assert decoded.record.attributes[k.INPUT_VALUE] == "line one\nline two"
