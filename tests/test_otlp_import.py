"""Import from captured spans: OTLP JSON as the collector's file exporter writes it (and the other
JSON forms tools write) must rebuild exactly the bundle the processor wrote locally, streaming,
and report every piece of input it could not use."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_receiver import collector_lines

import examples.booking_agent as booking
from stepfork_otel import ReplayMismatchError, ReplaySession, configure, record, trace_tool
from stepfork_otel.trace.bundle import dump_trace
from stepfork_otel.trace.checks import missing_payloads
from stepfork_otel.trace.models import Trace
from stepfork_otel.trace.otlp import (
    ImportReport,
    OtlpImportError,
    iter_traces_from_otlp_json,
    trace_from_otlp_json,
)

QUESTIONS = {
    "failure": "Book me the cheapest flight to Paris.",
    "success": "Book me the cheapest flight to London.",
}


def record_example(directory: Path) -> dict[str, Trace]:
    """Record the example agent's failing and succeeding runs; the local bundles by name."""
    booking.main(str(directory))
    return {name: Trace.load(directory / f"{name}.sftrace") for name in QUESTIONS}


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def assert_same(imported: Trace, local: Trace) -> None:
    assert imported == local
    assert dump_trace(imported) == dump_trace(local)


def by_trace_id(traces: list[Trace]) -> dict[str, Trace]:
    return {t.trace_id: t for t in traces}


@pytest.fixture
def example(recording: Any, tmp_path: Path) -> tuple[dict[str, Trace], list[ReadableSpan]]:
    local = record_example(tmp_path / "local")
    return local, list(recording.exporter.get_finished_spans())


# --- the rule: imported == local ------------------------------------------------------------------


def test_shuffled_batches_of_two_interleaved_runs_rebuild_the_local_bundles(
    example: tuple[dict[str, Trace], list[ReadableSpan]], tmp_path: Path
) -> None:
    local, spans = example
    random.Random(5).shuffle(spans)  # out of order, both runs mixed in every batch
    lines = collector_lines(spans, batch_size=3)
    assert any(
        local["failure"].trace_id in line.decode() and local["success"].trace_id in line.decode()
        for line in lines
    )
    report = ImportReport()
    imported = list(
        iter_traces_from_otlp_json(write_lines(tmp_path / "c.jsonl", lines), report=report)
    )
    assert len(imported) == 2
    found = by_trace_id(imported)
    for bundle in local.values():
        assert_same(found[bundle.trace_id], bundle)
    assert report.problems == []
    assert report.spans == len(spans)
    assert report.lines == len(lines)


def test_spans_of_one_trace_spread_over_several_files(
    example: tuple[dict[str, Trace], list[ReadableSpan]], tmp_path: Path
) -> None:
    local, spans = example
    lines = collector_lines(spans[::-1], batch_size=2)
    files = [
        write_lines(tmp_path / f"part{n}.jsonl", lines[n::3]) for n in range(3)
    ]  # every file holds spans of both traces
    found = by_trace_id(list(iter_traces_from_otlp_json(files)))
    for bundle in local.values():
        assert_same(found[bundle.trace_id], bundle)


def test_a_span_exported_twice_is_kept_once(
    example: tuple[dict[str, Trace], list[ReadableSpan]], tmp_path: Path
) -> None:
    local, spans = example
    lines = collector_lines(spans, batch_size=4) + collector_lines(spans[:5], batch_size=5)
    found = by_trace_id(list(iter_traces_from_otlp_json(write_lines(tmp_path / "d.jsonl", lines))))
    for bundle in local.values():
        assert_same(found[bundle.trace_id], bundle)


def test_request_body_proto_json_with_base64_ids_and_enum_names(
    example: tuple[dict[str, Trace], list[ReadableSpan]], tmp_path: Path
) -> None:
    local, spans = example
    failure = [s for s in spans if f"{s.context.trace_id:032x}" == local["failure"].trace_id]
    # protobuf's own JSON mapping, pretty-printed: base64 ids, "SPAN_KIND_CLIENT", one object
    body = json_format.MessageToJson(encode_spans(failure), indent=2)
    assert '"kind": "SPAN_KIND_CLIENT"' in body
    path = tmp_path / "body.json"
    path.write_text(body)
    report = ImportReport()
    (imported,) = iter_traces_from_otlp_json(path, report=report)
    assert_same(imported, local["failure"])
    assert report.base64_ids
    assert report.lines == 1
    assert_same(Trace.from_otlp_json(body), local["failure"])


def test_snake_case_proto_json_lines(
    example: tuple[dict[str, Trace], list[ReadableSpan]], tmp_path: Path
) -> None:
    local, spans = example
    lines = [
        json.dumps(
            json_format.MessageToDict(
                encode_spans(spans[i : i + 3]), preserving_proto_field_name=True
            )
        ).encode()
        + b"\n"
        for i in range(0, len(spans), 3)
    ]
    assert b'"resource_spans"' in lines[0]
    found = by_trace_id(list(iter_traces_from_otlp_json(write_lines(tmp_path / "s.jsonl", lines))))
    for bundle in local.values():
        assert_same(found[bundle.trace_id], bundle)


def test_gzip_file(example: tuple[dict[str, Trace], list[ReadableSpan]], tmp_path: Path) -> None:
    local, spans = example
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(collector_lines(spans, batch_size=4))))
    found = by_trace_id(list(iter_traces_from_otlp_json(path)))
    for bundle in local.values():
        assert_same(found[bundle.trace_id], bundle)


def test_python_api_accepts_text_bytes_lines_and_objects(
    example: tuple[dict[str, Trace], list[ReadableSpan]],
) -> None:
    local, spans = example
    failure_id = local["failure"].trace_id
    lines = collector_lines(spans, batch_size=3)
    text = b"".join(lines).decode()
    assert_same(Trace.from_otlp_json(text, trace_id=failure_id), local["failure"])
    assert_same(trace_from_otlp_json(text.encode(), trace_id=failure_id.upper()), local["failure"])
    assert_same(trace_from_otlp_json(iter(lines), trace_id=failure_id), local["failure"])
    objects = [orjson.loads(line) for line in lines]
    assert_same(trace_from_otlp_json(objects, trace_id=failure_id), local["failure"])
    only_failure = [s for s in spans if f"{s.context.trace_id:032x}" == failure_id]
    one = orjson.loads(collector_lines(only_failure, batch_size=100)[0])
    assert_same(trace_from_otlp_json(one), local["failure"])
    with pytest.raises(OtlpImportError, match=r"several recorded runs .*pass trace_id="):
        trace_from_otlp_json(text)


# --- streaming -------------------------------------------------------------------------------------


def test_memory_holds_only_the_traces_in_flight(recording: Any, tmp_path: Path) -> None:
    @trace_tool
    def step(n: int) -> int:
        return n * 2

    for run_number in range(30):
        with record(tmp_path / "local" / f"{run_number}.sftrace"):
            for n in range(4):
                step(n)
    spans = list(recording.exporter.get_finished_spans())  # in the order they ended
    assert len(spans) == 30 * 5
    path = write_lines(tmp_path / "many.jsonl", collector_lines(spans, batch_size=3))
    report = ImportReport()
    count = sum(1 for _ in iter_traces_from_otlp_json(path, report=report))
    assert count == 30
    # each line holds spans of at most two runs, and a run is emitted at its last line
    assert report.max_traces_in_flight <= 2
    assert report.max_spans_in_flight <= 2 * 5

    # the honest limit: when every run span arrives in the last line, every trace waits for it
    held = [s for s in spans if s.parent is not None] + [s for s in spans if s.parent is None]
    report = ImportReport()
    path = write_lines(tmp_path / "held.jsonl", collector_lines(held, batch_size=3))
    assert sum(1 for _ in iter_traces_from_otlp_json(path, report=report)) == 30
    assert report.max_traces_in_flight == 30


def test_lines_appended_after_the_index_are_not_read(
    example: tuple[dict[str, Trace], list[ReadableSpan]], tmp_path: Path
) -> None:
    local, spans = example
    failure_id = local["failure"].trace_id
    first = [s for s in spans if f"{s.context.trace_id:032x}" == failure_id]
    second = [s for s in spans if f"{s.context.trace_id:032x}" != failure_id]
    path = write_lines(tmp_path / "growing.jsonl", collector_lines(first, batch_size=2))
    traces = iter_traces_from_otlp_json(path)
    assert_same(next(traces), local["failure"])  # both passes have started
    with path.open("ab") as handle:  # a collector still writing to the file
        handle.write(b"".join(collector_lines(second, batch_size=2)))
    assert list(traces) == []


# --- payloads the spans do not carry -----------------------------------------------------------


def _record_one(tmp_path: Path, name: str, argument: str) -> Trace:
    @trace_tool
    def fetch_page(url: str) -> str:
        return argument * 3

    @trace_tool
    def summarise(text: str) -> str:
        return text[:10]

    with record(tmp_path / f"{name}.sftrace", input={"url": "https://example.org"}) as run:
        run.set_output(summarise(fetch_page(argument)))
    return Trace.load(tmp_path / f"{name}.sftrace")


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"max_span_payload_bytes": 200}, "size_cap"),
        ({"capture_content": False}, "capture_disabled"),
    ],
)
def test_payloads_left_off_the_span_import_as_missing_and_replay_stops_there(
    recording: Any, tmp_path: Path, options: dict[str, Any], reason: str
) -> None:
    configure(**options)
    local = _record_one(tmp_path, "big", "x" * 500)
    assert missing_payloads(local) == []  # the local bundle kept every payload whole
    lines = collector_lines(list(recording.exporter.get_finished_spans()), batch_size=2)
    imported = Trace.from_otlp_json(b"".join(lines))
    assert [c.input_sha256 for c in imported.calls] == [c.input_sha256 for c in local.calls]
    problems = [str(p) for p in missing_payloads(imported)]
    assert f"call-1: input missing ({reason})" in problems
    assert f"call-1.result: output missing ({reason})" in problems

    @trace_tool
    def fetch_page(url: str) -> str:
        raise AssertionError("a frozen replay never runs the body")

    with ReplaySession.from_trace(imported), pytest.raises(ReplayMismatchError) as caught:
        fetch_page("x" * 500)
    # the input matched by its fingerprint; the result cannot be invented
    assert f"the recorded result of call-1 is missing ({reason})" in str(caught.value)


def test_payloads_cut_by_an_attribute_length_limit_import_as_truncated(tmp_path: Path) -> None:
    provider = TracerProvider(span_limits=SpanLimits(max_attribute_length=120))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    configure(directory=tmp_path / "traces", tracer_provider=provider)
    local = _record_one(tmp_path, "cut", "y" * 300)
    imported = Trace.from_otlp_json(b"".join(collector_lines(exporter.get_finished_spans(), 10)))
    assert imported.calls[0].input is None
    assert imported.calls[0].input_missing == "truncated"
    assert local.calls[0].input is not None
    assert imported.calls[0].input_sha256 == local.calls[0].input_sha256
    provider.shutdown()


# --- bad input ---------------------------------------------------------------------------------


def test_truncated_line_marks_the_traces_it_names_incomplete(
    example: tuple[dict[str, Trace], list[ReadableSpan]], tmp_path: Path
) -> None:
    local, spans = example
    failure_id = local["failure"].trace_id
    first = [s for s in spans if f"{s.context.trace_id:032x}" == failure_id]
    second = [s for s in spans if f"{s.context.trace_id:032x}" != failure_id]
    lines = collector_lines(first, batch_size=3) + collector_lines(second, batch_size=4)
    cut = lines[-1][: len(lines[-1]) // 2]  # the collector died mid-write
    path = write_lines(tmp_path / "cut.jsonl", [*lines[:-1], cut])
    report = ImportReport()
    found = by_trace_id(list(iter_traces_from_otlp_json(path, report=report)))
    assert_same(found[failure_id], local["failure"])
    damaged = found[local["success"].trace_id]
    assert not damaged.complete
    where = f"{path}:{len(lines)}"
    assert damaged.incomplete_reason == f"spans lost in unreadable input: {where}"
    (problem,) = report.problems
    assert problem.where == where
    assert problem.message.startswith("truncated or not valid JSON")


def test_lines_that_are_not_otlp_are_skipped_and_named(
    example: tuple[dict[str, Trace], list[ReadableSpan]], tmp_path: Path
) -> None:
    local, spans = example
    lines = collector_lines(spans, batch_size=5)
    junk = [
        b'{"hello": "world"}\n',
        b"[1, 2, 3]\n",
        b'{"resourceLogs": []}\n',
        b'{"resourceSpans": "nope"}\n',
    ]
    path = write_lines(tmp_path / "mixed.jsonl", [lines[0], *junk, *lines[1:]])
    report = ImportReport()
    found = by_trace_id(list(iter_traces_from_otlp_json(path, report=report)))
    for bundle in local.values():
        assert_same(found[bundle.trace_id], bundle)
    assert [(p.where, p.message.split(" (")[0]) for p in report.problems] == [
        (f"{path}:2", "not OTLP trace data"),
        (f"{path}:3", "not OTLP trace data"),
        (f"{path}:5", "not OTLP trace data"),
    ]
    assert "no resourceSpans field" in report.problems[0].message
    assert report.other_signals == 1


def test_an_unreadable_line_naming_no_trace_marks_every_run_incomplete(
    example: tuple[dict[str, Trace], list[ReadableSpan]], tmp_path: Path
) -> None:
    local, spans = example
    lines = collector_lines(spans, batch_size=5)
    path = write_lines(tmp_path / "mixed.jsonl", [*lines, b'{"resourceSpans":[{"resource":{"attr'])
    report = ImportReport()
    found = by_trace_id(list(iter_traces_from_otlp_json(path, report=report)))
    where = f"{path}:{len(lines) + 1}"
    (problem,) = report.problems
    assert problem.where == where
    assert problem.message.endswith(
        "it names no trace id, so every run is marked as possibly incomplete"
    )
    for bundle in local.values():  # emitted before that line was reached, and still marked
        imported = found[bundle.trace_id]
        assert not imported.complete
        assert imported.incomplete_reason == f"spans lost in unreadable input: {where}"
        assert imported.events == bundle.events


def test_invalid_span_is_skipped_and_its_trace_marked_incomplete(
    example: tuple[dict[str, Trace], list[ReadableSpan]], tmp_path: Path
) -> None:
    _, spans = example
    lines = collector_lines(spans, batch_size=50)
    data = orjson.loads(lines[0])
    victim = data["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    victim["spanId"] = "not-an-id"
    path = write_lines(tmp_path / "bad.jsonl", [orjson.dumps(data) + b"\n"])
    report = ImportReport()
    found = by_trace_id(list(iter_traces_from_otlp_json(path, report=report)))
    (problem,) = report.problems
    assert problem.message == (
        "span 1 skipped: id (a string of 9 characters) is not a 8-byte id in hex or base64"
    )
    assert found[victim["traceId"]].complete is False


def test_spans_without_stepfork_attributes_are_ignored_and_counted(
    recording: Any, tmp_path: Path
) -> None:
    tracer = recording.provider.get_tracer("the.app")
    with tracer.start_as_current_span("GET /health"), tracer.start_as_current_span("db.query"):
        pass

    @trace_tool
    def lookup(key: str) -> str:
        return key.upper()

    # the user's own span inside the run is kept as context
    with record(tmp_path / "run.sftrace"), tracer.start_as_current_span("app.step"):
        lookup("a")
    local = Trace.load(tmp_path / "run.sftrace")
    lines = collector_lines(recording.exporter.get_finished_spans(), batch_size=2)
    report = ImportReport()
    (imported,) = iter_traces_from_otlp_json(
        write_lines(tmp_path / "a.jsonl", lines), report=report
    )
    assert_same(imported, local)
    assert [c.name for c in imported.context] == ["app.step"]
    assert (report.ignored_traces, report.ignored_spans, report.traces) == (1, 2, 1)


def test_trace_id_not_in_the_input(
    example: tuple[dict[str, Trace], list[ReadableSpan]], tmp_path: Path
) -> None:
    local, spans = example
    path = write_lines(tmp_path / "c.jsonl", collector_lines(spans, batch_size=3))
    absent = "0123456789abcdef0123456789abcdef"
    with pytest.raises(OtlpImportError) as caught:
        list(iter_traces_from_otlp_json(path, trace_id=absent))
    message = str(caught.value)
    assert message.startswith(f"trace {absent} is not in {path}; it holds 2 traces with stepfork")
    assert local["failure"].trace_id in message
    assert local["success"].trace_id in message
    with pytest.raises(OtlpImportError, match="'xyz' is not a trace id"):
        list(iter_traces_from_otlp_json(path, trace_id="xyz"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"hello": 1}\n{"world": 2}\n', "no OTLP trace data"),
        (b"\x28\xb5\x2f\xfd\x00\x00", "zstd-compressed"),
        (b"\x0a\x00\x12\x00binary proto\n", "binary data, not OTLP JSON"),
    ],
)
def test_unreadable_inputs(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "in.json"
    path.write_bytes(content)
    with pytest.raises(OtlpImportError, match=message):
        list(iter_traces_from_otlp_json(path))


def test_missing_file_fails_before_anything_is_yielded(
    example: tuple[dict[str, Trace], list[ReadableSpan]], tmp_path: Path
) -> None:
    _, spans = example
    good = write_lines(tmp_path / "good.jsonl", collector_lines(spans, batch_size=3))
    with pytest.raises(OtlpImportError, match=r"missing\.jsonl: no such file"):
        next(iter_traces_from_otlp_json([good, tmp_path / "missing.jsonl"]))
    with pytest.raises(OtlpImportError, match="is a directory"):
        next(iter_traces_from_otlp_json(tmp_path))


def test_two_runs_in_one_trace_become_two_bundles(recording: Any, tmp_path: Path) -> None:
    tracer = recording.provider.get_tracer("the.app")

    @trace_tool
    def lookup(key: str) -> str:
        return key.upper()

    with tracer.start_as_current_span("batch job"):
        for name in ("first", "second"):
            with record(tmp_path / f"{name}.sftrace", name=name):
                lookup(name)
    locals_ = [Trace.load(tmp_path / f"{name}.sftrace") for name in ("first", "second")]
    assert locals_[0].trace_id == locals_[1].trace_id
    lines = collector_lines(recording.exporter.get_finished_spans(), batch_size=2)
    imported = list(iter_traces_from_otlp_json(write_lines(tmp_path / "two.jsonl", lines)))
    assert [t.run.name for t in imported] == ["first", "second"]
    for got, want in zip(imported, locals_, strict=True):
        assert_same(got, want)
