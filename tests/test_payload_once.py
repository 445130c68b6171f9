"""A payload travels on the span once (issues 16 and 22).

Its text is OpenInference's ``input.value``/``output.value`` -- an input canonical, an output as
returned, which is also what the bundle stores and its fingerprint is of -- and nothing else of it
rides on the span (``stepfork.input``/``stepfork.output`` are never written). Checked on the OTLP
wire itself (the SDK's protobuf encoder), and through the import: the collector's copy rebuilds
the local bundle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import Recording
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from otlp_receiver import collector_lines

from stepfork_otel import Trace, iter_traces_from_otlp_json, llm_request, record, trace_tool
from stepfork_otel import constants as k
from stepfork_otel.trace.checks import verify_integrity
from stepfork_otel.trace.otlp import ImportReport


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

    # an output returned in another key order: still one text, as returned
    other = spans["execute_tool unsorted"]
    attributes = dict(other.attributes or {})
    assert attributes[k.OUTPUT_VALUE] == '{"zone":"CET","city":"Rome"}'  # what replay returns
    assert attributes[k.OUTPUT_SHA256] == bundle.outcome_of(bundle.calls[1]).output_sha256  # type: ignore[union-attr]
    assert bundle.outcome_of(bundle.calls[1]).output == attributes[k.OUTPUT_VALUE]  # type: ignore[union-attr]
    assert k.INPUT not in attributes
    assert k.OUTPUT not in attributes

    llm = spans["chat gpt-4o"]
    prompt = bundle.calls[2].input.encode()  # type: ignore[union-attr]
    assert encode_spans([llm]).SerializeToString().count(prompt) == 1


def test_the_collector_copy_rebuilds_the_local_bundle(recording: Recording, tmp_path: Path) -> None:
    with record(tmp_path / "run.sftrace", input={"q": "Paris"}) as run:
        run.set_output(agent())
    local = Trace.load(tmp_path / "run.sftrace")
    spans = recording.exporter.get_finished_spans()
    now = tmp_path / "now.jsonl"
    now.write_bytes(b"".join(collector_lines(spans, batch_size=2)))
    report = ImportReport()
    (imported,) = iter_traces_from_otlp_json(now, report=report)
    assert report.problems == []
    assert verify_integrity(imported) == []
    assert imported.events == local.events
    assert imported.run == local.run
