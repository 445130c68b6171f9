"""GenAI content that is not on the span: ``opentelemetry-instrumentation-openai-v2`` with
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=EVENT_ONLY`` (the setting that keeps content
off spans) writes each call's messages in a ``gen_ai.client.inference.operation.details`` log
record carrying the span's ids. ``stepfork import`` joins the record to its span.

As a user meets it: the real ``openai`` client under the real instrumentation against the loopback
fake server, spans and log records written as the collector's file exporter writes them (log
records in the spans' file, or in a file of their own given to the same import), ``stepfork
import`` in a fresh process, the agent replayed frozen in a fresh process with the server stopped.
The bundle holds the very inputs a ``SPAN_ONLY`` run's bundle holds. Then what such files may
also hold: log records before or after their spans, ids in base64, records another instrumentation
wrote, and hostile records -- each named with its ``file:line``, the run still imported -- and a
secret in a record's message, which never reaches the bundle.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from cli_support import stepfork
from conftest import installed
from foreign_support import (
    PROMPT,
    Traced,
    docs_block,
    normalised,
    replay,
    replay_sending_nothing,
    traced,
)

from stepfork_otel import Redactor, Trace
from stepfork_otel.trace import foreign
from stepfork_otel.trace.bundle import dump_trace
from stepfork_otel.trace.models import payload_value
from stepfork_otel.trace.otlp import ImportReport, iter_traces_from_otlp_json

pytest.importorskip("openai")

EVENT = "gen_ai.client.inference.operation.details"
VARIANTS = {"one-file": "openai-v2-events", "two-files": "openai-v2-events-apart"}


_RUNS: dict[str, Traced] = {}


def _traced_once(variant: str, tmp_path_factory: pytest.TempPathFactory) -> Traced:
    if variant not in _RUNS:
        installed("opentelemetry.instrumentation.openai_v2")
        _RUNS[variant] = traced(tmp_path_factory.mktemp(variant), VARIANTS[variant])
    return _RUNS[variant]


@pytest.fixture(scope="module", params=list(VARIANTS))
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Traced:
    return _traced_once(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def one_file(tmp_path_factory: pytest.TempPathFactory) -> Traced:
    """The run with its log records among its spans' lines (what the edits below start from)."""
    return _traced_once("one-file", tmp_path_factory)


@pytest.fixture(scope="module")
def span_only(tmp_path_factory: pytest.TempPathFactory) -> Traced:
    installed("opentelemetry.instrumentation.openai_v2")
    return traced(tmp_path_factory.mktemp("span-only"), "openai-v2")


def _lines(run: Traced) -> list[bytes]:
    """The run's OTLP JSON lines, spans and log records, in the order the import reads them."""
    logs = run.spans.with_name("logs.jsonl")
    text = run.spans.read_bytes() + (logs.read_bytes() if logs.exists() else b"")
    return text.splitlines(keepends=True)


def _is_log(line: bytes) -> bool:
    return line.startswith(b'{"resourceLogs"')


def _import(path: Path, **options: Any) -> tuple[list[Trace], ImportReport]:
    report = ImportReport()
    return list(iter_traces_from_otlp_json(path, report=report, **options)), report


def _inputs(trace: Trace) -> list[Any]:
    return [payload_value(call.input) if call.input else None for call in trace.calls]


def test_the_log_records_give_the_calls_the_inputs_a_span_only_run_holds(
    run: Traced, span_only: Traced
) -> None:
    print(run.imported)
    assert "complete -- weather-agent, 2 calls, ok" in run.imported
    assert "2 GenAI log records joined to their spans" in run.imported
    assert "problems" not in run.imported  # nothing missing, nothing said
    trace, reference = Trace.load(run.bundle), Trace.load(span_only.bundle)
    assert trace.complete
    assert trace.created_by == foreign.created_by([foreign.GENAI])
    assert [(c.fidelity, c.unchecked) for c in trace.calls] == [
        (c.fidelity, c.unchecked) for c in reference.calls
    ]
    # the same fingerprints: the structured values of the log records are read as the JSON
    # text a SPAN_ONLY span holds
    assert [c.input for c in trace.calls] == [c.input for c in reference.calls]
    assert _inputs(trace)[1]["messages"][1]["parts"] == [{"type": "text", "content": PROMPT}]
    outputs = [payload_value(trace.outcome_of(c).output) for c in trace.calls]  # type: ignore[union-attr]
    expected = [payload_value(reference.outcome_of(c).output) for c in reference.calls]  # type: ignore[union-attr]
    for output in (*outputs, *expected):
        output["body"].pop("created")  # (the span's end time)
    assert outputs == expected
    assert trace.run.untraced_tools == ["get_weather"]


def test_the_agent_replays_frozen_with_the_server_stopped_and_sends_nothing(
    run: Traced, tmp_path: Path
) -> None:
    replayed = replay(run.agent, run.bundle, run.live["url"], tmp_path / "replay.json")
    print(replayed["report"])
    assert "error" not in replayed, replayed
    assert replayed["answer"] == run.live["answer"]
    assert replayed["calls"] == [["llm", "substituted"], ["llm", "substituted"]]
    again = replay_sending_nothing(run.agent, run.bundle, tmp_path / "r.json")
    assert again["answer"] == run.live["answer"]


def test_without_its_log_records_the_run_imports_with_inputs_missing_and_says_why(
    run: Traced, tmp_path: Path
) -> None:
    spans = tmp_path / "spans.jsonl"
    spans.write_bytes(b"".join(line for line in _lines(run) if not _is_log(line)))
    done = stepfork("import", "spans.jsonl", "-o", "bundles", cwd=tmp_path)
    print(done.stdout)
    assert done.returncode == 1, done.stderr  # imported, with problems to look at
    assert "complete -- weather-agent, 2 calls, ok" in done.stdout
    assert "missing call-1: input missing" in done.stdout
    assert "GenAI log records" not in done.stdout
    assert done.stdout.count(f"input missing -- the span holds no messages and no {EVENT}") == 2
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY" in done.stdout
    (bundle,) = (tmp_path / "bundles").glob("*.sftrace")
    assert _inputs(Trace.load(bundle)) == [None, None]


def test_log_records_are_joined_wherever_they_come_and_however_ids_are_written(
    run: Traced, tmp_path: Path
) -> None:
    """Before their spans, after them (in later batches), and with protobuf's base64 ids."""
    expected = Trace.load(run.bundle)
    lines = _lines(run)
    logs = [line for line in lines if _is_log(line)]
    spans = [line for line in lines if not _is_log(line)]
    assert len(logs) == 2
    for name, order in {
        "first": logs + spans,
        "last": spans + logs,
        "base64": spans[:1] + [_base64_ids(line) for line in logs] + spans[1:],
    }.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(b"".join(order))
        (trace,), report = _import(path)
        assert report.genai_log_records == 2, name
        assert report.problems == [], name
        assert [c.input for c in trace.calls] == [c.input for c in expected.calls], name


def _two(run: Traced) -> bool:
    return run.spans.with_name("logs.jsonl").exists()


def test_log_records_in_an_otlp_http_request_body_are_read_too(
    one_file: Traced, tmp_path: Path
) -> None:
    """A ``/v1/logs`` body (one JSON object, pretty-printed) given beside the spans."""
    lines = _lines(one_file)
    batches = [orjson.loads(line)["resourceLogs"] for line in lines if _is_log(line)]
    body = tmp_path / "logs.json"
    body.write_text(json.dumps({"resourceLogs": [r for b in batches for r in b]}, indent=2))
    spans = tmp_path / "spans.jsonl"
    spans.write_bytes(b"".join(line for line in lines if not _is_log(line)))
    report = ImportReport()
    (trace,) = iter_traces_from_otlp_json([spans, body], report=report)
    assert (report.genai_log_records, report.problems) == (2, [])
    assert [c.input for c in trace.calls] == [c.input for c in Trace.load(one_file.bundle).calls]


def _base64_ids(line: bytes) -> bytes:
    data = orjson.loads(line)
    for record in _records(data):
        for key in ("traceId", "spanId"):
            record[key] = base64.b64encode(bytes.fromhex(record[key])).decode()
    return orjson.dumps(data) + b"\n"


def _records(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        record
        for resource in data["resourceLogs"]
        for scope in resource["scopeLogs"]
        for record in scope["logRecords"]
    ]


_DEEP = b'{"stringValue":"(deep)"}'


def _edited(line: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    data = orjson.loads(line)
    edit(_records(data)[0])
    deep = b'{"arrayValue":{"values":[' * 300 + _DEEP + b"]}}" * 300
    return orjson.dumps(data).replace(_DEEP, deep) + b"\n"


def _attribute(record: dict[str, Any], key: str) -> dict[str, Any]:
    return next(a for a in record["attributes"] if a["key"] == key)


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(record: dict[str, Any]) -> None:
        _attribute(record, key)["value"] = value

    return edit


def _deep(record: dict[str, Any]) -> None:
    _attribute(record, "gen_ai.input.messages")["value"] = orjson.loads(_DEEP)  # (nested 300 deep)


def _other_span(record: dict[str, Any]) -> None:
    record["spanId"] = "ab" * 8


def _other_trace(record: dict[str, Any]) -> None:
    record["traceId"] = "cd" * 16


def _no_ids(record: dict[str, Any]) -> None:
    del record["traceId"], record["spanId"]


def _huge(record: dict[str, Any]) -> None:
    _attribute(record, "gen_ai.input.messages")["value"] = {"stringValue": "[" + "x" * 4_000_000}


#: (what is done to the first call's log record, what the problem says, the first call's input
#: is then missing)
HOSTILE: dict[str, tuple[Callable[[dict[str, Any]], None], str | None]] = {
    "deep": (_deep, "JSON nested deeper than"),
    "wrong-type": (_set("gen_ai.input.messages", {"stringValue": 5}), "stringValue is int"),
    "not-an-anyvalue": (_set("gen_ai.input.messages", [1, 2]), "not an OTLP AnyValue"),
    "bad-id": (lambda r: r.update(spanId="nope"), "is not a 8-byte id"),
    "no-ids": (_no_ids, "it names no span"),
    "span-never-comes": (_other_span, f"names span {'ab' * 8} of trace"),
    "trace-never-comes": (_other_trace, f"of trace {'cd' * 16}, which is not in the input"),
    "huge-cut-text": (_huge, None),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_log_record_is_named_and_the_run_still_imports(
    one_file: Traced, case: str, tmp_path: Path
) -> None:
    edit, problem = HOSTILE[case]
    lines = _lines(one_file)
    first = next(n for n, line in enumerate(lines) if _is_log(line))
    lines[first] = _edited(lines[first], edit)
    path = tmp_path / "spans.jsonl"
    path.write_bytes(b"".join(lines))
    (trace,), report = _import(path)
    found = [str(p) for p in report.problems]
    print("\n".join(found))
    assert trace.complete or case == "deep"  # (an unreadable line may have held any span)
    assert len(trace.calls) == 2
    inputs = _inputs(trace)
    assert inputs[0] is None
    assert inputs[1] is not None
    if problem is not None:
        assert any(p.startswith(f"{path}:{first + 1}: ") and problem in p for p in found), found
    else:  # a value the adapter cannot read is named by the adapter, as on a span
        assert any("gen_ai.input.messages is cut or not JSON" in p for p in found), found


def test_other_log_records_are_ignored_and_counted(one_file: Traced, tmp_path: Path) -> None:
    lines = _lines(one_file)
    log = next(line for line in lines if _is_log(line))
    other = _edited(log, lambda r: r.update(eventName="gen_ai.choice"))
    path = tmp_path / "spans.jsonl"
    path.write_bytes(b"".join([*lines, other, b'{"resourceLogs": []}\n']))
    (trace,), report = _import(path)
    assert report.problems == []
    assert (report.genai_log_records, report.other_signals) == (2, 2)
    assert all(_inputs(trace))


SECRET = "sk-proj-" + "Q9w8E7r6T5y4U3i2O1p0A9s8D7f6G5h4"


def test_a_secret_in_a_log_records_message_never_reaches_the_bundle(
    one_file: Traced, tmp_path: Path
) -> None:
    """The content of a log record goes through the importer's redaction as a span's does:
    the built-in rules, and the rules the import is given (``--redaction-rules``)."""
    said = f"{PROMPT} my key is {SECRET}, ticket ACME-1234"
    lines = [
        line.replace(PROMPT.encode(), json.dumps(said)[1:-1].encode()) if _is_log(line) else line
        for line in _lines(one_file)
    ]
    path = tmp_path / "spans.jsonl"
    path.write_bytes(b"".join(lines))
    rules = Redactor().with_rules(patterns=[("acme_ticket", r"ACME-\d+")])
    (trace,), report = _import(path, redactor=rules)
    assert report.genai_log_records == 2
    text = dump_trace(trace).decode()
    assert SECRET not in text
    assert "ACME-1234" not in text
    message = _inputs(trace)[0]["messages"][1]["parts"][0]["content"]
    assert message.startswith(f"{PROMPT} my key is [REDACTED")
    assert "[REDACTED:acme_ticket]" in message
    done = stepfork("import", "spans.jsonl", "-o", "bundles", cwd=tmp_path)
    (bundle,) = (tmp_path / "bundles").glob("*.sftrace")
    assert SECRET not in bundle.read_text()
    assert SECRET not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "value",
    [
        f'[{{"role": "user", "content": "my key is {SECRET}"}}]',  # text where an AnyValue goes
        {"doubleValue": f"my key is {SECRET}"},
        {"boolValue": f"my key is {SECRET}"},
        {SECRET.replace("-", ""): 1},  # an unknown AnyValue field
    ],
)
def test_a_value_that_cannot_be_read_is_named_by_its_type_never_quoted(
    one_file: Traced, value: Any, tmp_path: Path
) -> None:
    """Problems are printed, logged and kept in the report: a content value the importer
    cannot read is named without its text, which may hold a prompt or a secret."""
    lines = _lines(one_file)
    first = next(n for n, line in enumerate(lines) if _is_log(line))
    lines[first] = _edited(lines[first], _set("gen_ai.input.messages", value))
    path = tmp_path / "spans.jsonl"
    path.write_bytes(b"".join(lines))
    (trace,), report = _import(path)
    found = [str(p) for p in report.problems]
    assert any(f"{path}:{first + 1}: log record 1" in p for p in found), found
    assert not any(SECRET in p or SECRET.replace("-", "") in p for p in found), found
    assert SECRET not in dump_trace(trace).decode()


def test_the_import_pasted_in_the_docs_is_what_the_command_prints(run: Traced) -> None:
    if not _two(run):
        pytest.skip("the docs show the two files")
    printed = "$ stepfork import spans.jsonl logs.jsonl -o bundles\n" + run.imported
    print(printed)
    assert normalised(docs_block("genai-logs-import")) == normalised(printed)
