"""Hostile input, as an operator met it (issue 13): every failure found by feeding mutated bundles
and collector files to load, validate, replay, show and import is reproduced here, and must now
be a typed one-line error (``BundleError`` / ``OtlpImportError``) in bounded time and memory --
or, for a damaged payload in ``show`` and one bad span in an import, no error at all.

And decorating never breaks a program: what ``@trace_tool`` cannot record it returns unchanged,
with a warning."""

from __future__ import annotations

import asyncio
import functools
import gzip
import hashlib
import logging
import os
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from cli_support import ROOT
from opentelemetry.sdk.trace import ReadableSpan
from otlp_receiver import collector_lines

from stepfork_otel import ReplaySession, record, trace_tool
from stepfork_otel.cli import main
from stepfork_otel.trace.bundle import load_trace, save_trace
from stepfork_otel.trace.errors import BundleError
from stepfork_otel.trace.limits import ReadLimits
from stepfork_otel.trace.models import ToolResult, Trace
from stepfork_otel.trace.otlp import ImportReport, OtlpImportError, iter_traces_from_otlp_json

GOLDEN = ROOT / "tests" / "golden" / "dinner_lisbon.sftrace"


def _bundle_error(path: Path, **kwargs: Any) -> str:
    with pytest.raises(BundleError) as info:
        load_trace(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert len(message) < len(str(path)) + 300
    return message


def _import_error(path: Path, **kwargs: Any) -> str:
    with pytest.raises(OtlpImportError) as info:
        list(iter_traces_from_otlp_json(path, report=ImportReport(), **kwargs))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message


# --- bundles -------------------------------------------------------------------------------------


def test_a_header_nested_deeper_than_the_limit_is_a_bundle_error(tmp_path: Path) -> None:
    rest = GOLDEN.read_bytes().split(b"\n", 1)[1]
    deep = tmp_path / "deep.sftrace"
    deep.write_bytes(b'{"format":"sftrace","x":' + b"[" * 300 + b"]" * 300 + b"}\n" + rest)
    assert "line 1: JSON nested deeper than 254 levels" in _bundle_error(deep)  # was TypeError


def test_an_end_line_with_a_deep_value_is_a_bundle_error(tmp_path: Path) -> None:
    """Found by the fuzz campaign: quoting a 1,000-deep list in the message recursed."""
    lines = GOLDEN.read_bytes().rstrip(b"\n").split(b"\n")
    lines[-1] = b'{"end":"sftrace","events":' + b"[" * 1000 + b"]" * 1000 + b"}"
    deep = tmp_path / "deep-end.sftrace"
    deep.write_bytes(b"\n".join(lines) + b"\n")
    assert "end line does not match: it declares [[[[...]]]] events" in _bundle_error(deep)


def _filler(size: int) -> bytes:
    """``size`` bytes that gzip ~40 times (spaces, one pseudo-random letter in 61): below the
    compression-ratio limit, so a test of another cap reaches that cap first."""
    rng = random.Random(size)
    return b"".join(b" " * 60 + bytes([rng.randrange(97, 123)]) for _ in range(size // 61 + 1))[
        :size
    ]


def test_a_line_longer_than_the_limit_stops_there(tmp_path: Path) -> None:
    head = GOLDEN.read_bytes().split(b"\n", 1)[0] + b"\n"
    long = tmp_path / "long.sftrace.gz"
    with gzip.open(long, "wb", compresslevel=9) as handle:  # ~150 KB on disk, 6 MB of one line
        handle.write(head + b'{"input":"' + _filler(6_000_000))
    assert long.stat().st_size < 200_000
    limits = ReadLimits(max_line_bytes=4 << 20)
    assert "line 2: longer than 4194304 bytes (the line-length limit)" in _bundle_error(
        long, limits=limits
    )


def test_a_small_gzip_costs_bounded_memory_to_load_and_validate(tmp_path: Path) -> None:
    """A 1 MB ``.sftrace.gz`` used to cost 2 GiB to load and 4-6 GiB to validate. In a child
    with a 700 MB address-space cap, both are now a typed error (exit 2, one line)."""
    bomb = tmp_path / "bomb.sftrace.gz"
    head = GOLDEN.read_bytes().split(b"\n", 1)[0] + b"\n"
    with gzip.open(bomb, "wb", compresslevel=9) as handle:
        handle.write(head)
        for _ in range(1024):
            handle.write(b"0" * (1 << 20))  # one line of 1 GiB
    assert bomb.stat().st_size < 1_200_000
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (700 << 20, 700 << 20))\n"
        "from stepfork_otel.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    for command in ("validate", "show"):
        done = subprocess.run(
            [sys.executable, "-c", code, command, str(bomb)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert "(the compression-ratio limit" in line  # (before the line-length limit)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_only_regular_files_are_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.sftrace"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.sftrace"
    zero.symlink_to("/dev/zero")
    outcome: list[str] = []
    reader = threading.Thread(target=lambda: outcome.append(_bundle_error(fifo)), daemon=True)
    reader.start()
    reader.join(10)
    assert outcome, "reading a FIFO blocked"
    assert "is a FIFO (named pipe), not a regular file; only regular files are read" in outcome[0]
    assert "is a character device, not a regular file" in _bundle_error(zero)
    assert "is a FIFO (named pipe)" in _import_error(fifo)
    assert "is a character device" in _import_error(zero)


def _with_output(trace: Trace, call_id: str, text: str) -> Trace:
    """``trace`` with the recorded output of ``call_id`` replaced, its fingerprint recomputed
    (what a hostile editor does to get past integrity checks)."""
    events = []
    for event in trace.events:
        if isinstance(event, ToolResult) and event.parent_id == call_id:
            sha = hashlib.sha256(text.encode()).hexdigest()
            event = event.model_copy(
                update={"output": text, "output_sha256": sha, "output_size": len(text)}
            )
        events.append(event)
    return trace.model_copy(update={"events": events})


def test_a_deep_recorded_output_is_refused_at_load_not_raised_into_the_agent(
    recording: Any, tmp_path: Path
) -> None:
    @trace_tool
    def lookup() -> Any:
        return {"n": 1}

    def agent() -> Any:
        return lookup()

    with record(tmp_path / "run.sftrace"):
        agent()
    trace = Trace.load(tmp_path / "run.sftrace")
    call_id = trace.calls[0].id
    big = "12345678901234567890"  # 20 digits: read by the standard library's recursive parser

    shallow = save_trace(
        _with_output(trace, call_id, "[" * 200 + big + "]" * 200), tmp_path / "ok.sftrace"
    )
    with ReplaySession.from_trace(shallow):
        value = agent()
    for _ in range(200):
        value = value[0]
    assert value == int(big)

    deep = save_trace(
        _with_output(trace, call_id, "[" * 2000 + big + "]" * 2000), tmp_path / "deep.sftrace"
    )
    with pytest.raises(BundleError, match="nested deeper than 254 levels"):  # was RecursionError
        ReplaySession.from_trace(deep)


def test_show_shows_a_damaged_payload_as_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = GOLDEN.read_bytes().split(b"\n")
    llm_input = next(n for n, line in enumerate(lines) if line.startswith(b'{"input":{"messages"'))
    lines[llm_input] = lines[llm_input].replace(b'"role"', b'"ro\x01e"', 1)  # one flipped byte
    damaged = tmp_path / "damaged.sftrace"
    damaged.write_bytes(b"\n".join(lines))
    assert main(["show", str(damaged)]) == 0  # was "internal error"
    out = capsys.readouterr().out
    assert "in  <damaged: " in out
    assert out.count("<damaged: ") == 1


# --- OTLP import ---------------------------------------------------------------------------------


@pytest.fixture
def otlp_line(recording: Any, tmp_path: Path) -> dict[str, Any]:
    """The spans of one recorded run, as one collector line (parsed)."""

    @trace_tool
    def lookup(city: str) -> str:
        return city.upper()

    with record(tmp_path / "local.sftrace"):
        lookup("Lisbon")
        lookup("Porto")
    spans: list[ReadableSpan] = list(recording.exporter.get_finished_spans())
    (line,) = collector_lines(spans, batch_size=len(spans))
    data: dict[str, Any] = orjson.loads(line)
    return data


def _spans(data: dict[str, Any]) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = data["resourceSpans"][0]["scopeSpans"][0]["spans"]
    return spans


def _tool_span(data: dict[str, Any], n: int = 0) -> dict[str, Any]:
    return [s for s in _spans(data) if s["name"].startswith("execute_tool")][n]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("kind", [1]),
        ("status", {"code": {"x": 1}}),
        ("endTimeUnixNano", str(2**64)),
        ("startTimeUnixNano", "-5"),
        ("attributes", {"not": "a list"}),
    ],
)
def test_one_bad_span_is_skipped_and_counted_the_rest_imported(
    otlp_line: dict[str, Any], tmp_path: Path, field: str, value: Any
) -> None:
    good_trace = orjson.loads(orjson.dumps(otlp_line))
    other = "ab" * 16
    for span in _spans(good_trace):
        span["traceId"] = other  # a second run in the same file, untouched
    _tool_span(otlp_line)[field] = value
    path = tmp_path / "in.jsonl"
    path.write_bytes(orjson.dumps(otlp_line) + b"\n" + orjson.dumps(good_trace) + b"\n")
    report = ImportReport()
    traces = {t.trace_id: t for t in iter_traces_from_otlp_json(path, report=report)}
    assert set(traces) == {_spans(otlp_line)[0]["traceId"], other}
    assert traces[other].complete
    for trace in traces.values():  # every bundle can be written
        save_trace(trace, tmp_path / f"{trace.trace_id}.sftrace")
    if field in ("endTimeUnixNano", "startTimeUnixNano", "attributes"):
        assert report.skipped_spans == 1
        assert not traces[_spans(otlp_line)[0]["traceId"]].complete
        assert "span " in report.problems[0].message
    else:  # an enum of the wrong shape reads as the default, as an unknown number does
        assert report.skipped_spans == 0


def test_a_non_list_scope_spans_skips_the_line_not_the_import(
    otlp_line: dict[str, Any], tmp_path: Path
) -> None:
    bad = orjson.loads(orjson.dumps(otlp_line))
    bad["resourceSpans"][0]["scopeSpans"] = 7
    path = tmp_path / "in.jsonl"
    path.write_bytes(orjson.dumps(bad) + b"\n" + orjson.dumps(otlp_line) + b"\n")
    report = ImportReport()
    (trace,) = iter_traces_from_otlp_json(path, report=report)
    assert "not OTLP trace data (scopeSpans is not a list); line skipped" in str(report.problems[0])
    assert trace.complete  # (the skipped line held no span: the run is whole in the next one)


def test_a_payload_with_a_raw_line_break_imports_as_missing_and_saves(
    otlp_line: dict[str, Any], tmp_path: Path
) -> None:
    span = _tool_span(otlp_line)
    text = '"LIS\nBON"'
    for attribute in span["attributes"]:
        if attribute["key"] == "output.value":  # where the payload travels (once)
            attribute["value"] = {"stringValue": text}
        if attribute["key"] == "stepfork.output.sha256":
            attribute["value"] = {"stringValue": hashlib.sha256(text.encode()).hexdigest()}
        if attribute["key"] == "stepfork.output.size":
            attribute["value"] = {"intValue": str(len(text))}
    path = tmp_path / "in.jsonl"
    path.write_bytes(orjson.dumps(otlp_line) + b"\n")
    report = ImportReport()
    (trace,) = iter_traces_from_otlp_json(path, report=report)
    assert "output.value is not canonical JSON text" in str(report.problems[0])
    result = trace.outcome_of(trace.calls[0])
    assert isinstance(result, ToolResult)
    assert result.output is None
    assert Trace.load(save_trace(trace, tmp_path / "out.sftrace")) == trace


def test_a_truncated_gzip_is_an_import_error(otlp_line: dict[str, Any], tmp_path: Path) -> None:
    data = gzip.compress(orjson.dumps(otlp_line) + b"\n" * 2)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    assert "truncated gzip data" in _import_error(path)  # was EOFError
    out = tmp_path / "out"
    assert main(["import", str(path), "-o", str(out)]) == 2
    assert not out.exists() or not list(out.iterdir())
    path.write_bytes(data[:10] + b"\xff" * 40 + data[50:])
    assert "cannot read" in _import_error(path)  # was BadGzipFile


def test_the_importer_caps_decompressed_size_and_line_length(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.jsonl.gz"
    bomb.write_bytes(gzip.compress(b'{"resourceSpans":[' + _filler(3_000_000), compresslevel=9))
    assert bomb.stat().st_size < 100_000
    limits = ReadLimits(max_line_bytes=1 << 20)
    assert "a line longer than 1048576 bytes" in _import_error(bomb, limits=limits)
    lines = tmp_path / "lines.jsonl.gz"
    numbered = b"".join(b'{"resourceSpans":[],"n":%d}\n' % n for n in range(100_000))
    lines.write_bytes(gzip.compress(numbered, compresslevel=9))
    limits = ReadLimits(max_decompressed_bytes=1_000_000)
    assert "expands beyond 1000000 bytes (the decompressed-size limit)" in _import_error(
        lines, limits=limits
    )


def test_a_deeply_nested_record_is_skipped(otlp_line: dict[str, Any], tmp_path: Path) -> None:
    # 1,000 JSON levels: within orjson's reach when parsed, beyond the limit (written by hand:
    # orjson writes at most 254)
    deep = b'{"kvlistValue":{"values":[{"key":"k","value":' * 250
    deep += b'{"stringValue":"x"}' + b"}]}}" * 250
    _tool_span(otlp_line)["attributes"].append({"key": "deep", "value": "DEEP"})
    line = orjson.dumps(otlp_line).replace(b'"DEEP"', deep)
    path = tmp_path / "deep.jsonl"
    path.write_bytes(line + b"\n")
    with pytest.raises(OtlpImportError, match="no OTLP trace data"):
        list(iter_traces_from_otlp_json(path, report=ImportReport()))


# --- decorating never breaks a program -----------------------------------------------------------


class Prices:
    rate = 2

    def __call__(self, amount: int) -> int:
        return amount * self.rate


class Shop:
    @trace_tool
    def price(self, amount: int) -> int:
        return amount + 1

    @trace_tool
    @classmethod
    def tax(cls, amount: int) -> int:
        return amount * 10

    @trace_tool
    @staticmethod
    def fee(amount: int) -> int:
        return amount + 100


class Plain:
    def price(self, amount: int) -> int:
        return amount + 7


def _add(a: int, b: int) -> int:
    return a + b


async def _fetch(city: str) -> str:
    await asyncio.sleep(0)
    return city.lower()


class AsyncPrices:
    async def __call__(self, amount: int) -> int:
        return amount * 3


def test_every_kind_of_callable_is_recorded_and_replayed(recording: Any, tmp_path: Path) -> None:
    add_one = trace_tool(functools.partial(_add, 1))
    prices = trace_tool(Prices())
    bound = trace_tool(Plain().price)
    fetch = trace_tool(functools.partial(_fetch))
    async_prices = trace_tool(AsyncPrices())

    def agent() -> list[Any]:
        return [
            add_one(2),
            prices(5),
            Shop().price(1),
            Shop.tax(2),
            Shop().tax(3),
            Shop.fee(4),
            bound(7),
            asyncio.run(fetch("LISBON")),
            asyncio.run(async_prices(2)),
        ]

    expected = [3, 10, 2, 20, 30, 104, 14, "lisbon", 6]
    with record(tmp_path / "run.sftrace"):
        assert agent() == expected
    trace = Trace.load(tmp_path / "run.sftrace")
    assert [c.name for c in trace.calls] == [  # type: ignore[union-attr]
        *("_add", "Prices", "price", "tax", "tax", "fee", "price", "_fetch", "AsyncPrices"),
    ]
    with ReplaySession.from_trace(trace) as replay:
        assert agent() == expected
    assert [c.action for c in replay.calls] == ["substituted"] * len(expected)
    assert replay.pending == 0


def test_what_cannot_be_a_tool_is_returned_unchanged_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def numbers() -> Any:
        yield 1

    async def stream() -> Any:
        yield 1

    with caplog.at_level(logging.WARNING, logger="stepfork_otel"):
        for thing in (dict, numbers, stream, functools.partial(numbers)):
            assert trace_tool(thing) is thing  # type: ignore[arg-type]
            assert trace_tool(name="x")(thing) is thing  # type: ignore[arg-type]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 8
    assert "'dict' is left undecorated and its calls are not recorded" in messages[0]
    assert "its signature cannot be read" in messages[0]
    assert "it is a generator" in messages[2]
    assert dict(a=1) == {"a": 1}


# --- issue 28: what one tool writes, the others read ----------------------------------------------


def _set_output(span: dict[str, Any], text: str) -> None:
    for attribute in span["attributes"]:
        if attribute["key"] == "output.value":
            attribute["value"] = {"stringValue": text}
        if attribute["key"] == "stepfork.output.sha256":
            attribute["value"] = {"stringValue": hashlib.sha256(text.encode()).hexdigest()}
        if attribute["key"] == "stepfork.output.size":
            attribute["value"] = {"intValue": str(len(text))}


def test_an_import_never_writes_a_bundle_its_loader_refuses(
    otlp_line: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A payload nested 300 deep is within the collector line's nesting limit (it is a string
    there) but beyond the bundle's: the import exited 0 and wrote a bundle ``Trace.load``
    refused. Now the payload imports as missing, the problem named, and the bundle loads."""
    _set_output(_tool_span(otlp_line), "[" * 300 + "]" * 300)
    path = tmp_path / "in.jsonl"
    path.write_bytes(orjson.dumps(otlp_line) + b"\n")
    out = tmp_path / "out"
    assert main(["import", str(path), "-o", str(out)]) == 1  # attention: a payload is missing
    printed = capsys.readouterr().out
    assert "output.value is nested deeper than 254 levels" in printed
    (bundle,) = out.iterdir()
    trace = load_trace(bundle)  # what import writes, load reads
    outcome = trace.outcome_of(trace.calls[0])
    assert isinstance(outcome, ToolResult)
    assert outcome.output is None
    assert trace.outcome_of(trace.calls[1]).output == '"PORTO"'  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("NaN", "unexpected character"),
        ('{"price":1e400}', "infinity"),
        ("1" * 1_000_000, "4300 digits"),
        ('{"a":1,}', "trailing comma"),
    ],
)
def test_validate_rejects_a_payload_replay_cannot_read(
    recording: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, why: str
) -> None:
    """A payload with a matching fingerprint that is no JSON replay reads (NaN, a number beyond
    a double, an integer of a million digits, a trailing comma) passed ``validate
    --verify-integrity`` -- the fingerprint was all it checked -- and replay then refused it."""

    @trace_tool
    def lookup() -> Any:
        return {"n": 1}

    with record(tmp_path / "run.sftrace"):
        lookup()
    trace = Trace.load(tmp_path / "run.sftrace")
    bad = save_trace(_with_output(trace, trace.calls[0].id, text), tmp_path / "bad.sftrace")
    with ReplaySession.from_trace(bad), pytest.raises(Exception, match="not valid JSON"):
        lookup()  # what replay refuses ...
    capsys.readouterr()
    assert main(["validate", "--verify-integrity", str(bad)]) == 1  # ... validate refuses
    printed = capsys.readouterr().out
    assert "INVALID (1 problem)" in printed
    assert f"{trace.calls[0].id}.result: output is not valid JSON (" in printed
    assert why in printed
    assert len(printed) < 1000  # (the message quotes no million digits)
    assert main(["validate", "--no-verify-integrity", str(bad)]) == 0  # (payloads unread)
    assert main(["validate", str(bad)]) == 1  # (verified by default since issue 27)


def _golden_line(prefix: bytes) -> tuple[list[bytes], int]:
    lines = GOLDEN.read_bytes().split(b"\n")
    return lines, next(n for n, line in enumerate(lines) if line.startswith(prefix))


@pytest.mark.parametrize(
    ("where", "edit", "key"),
    [
        # a second replay_policy: orjson and pydantic keep the last, silently
        (
            b'{"type":"tool_call"',
            (b'"status":"ok",', b'"status":"ok","replay_policy":"forbidden",'),
            "replay_policy",
        ),
        (b'{"type":"llm_response"', (b'"usage":{', b'"usage":{"input_tokens":1,'), "input_tokens"),
        (b'{"type":"tool_result"', (b'"seq":2,', b'"seq" : 2 ,"seq":2,'), "seq"),  # (spaces too)
        (b'{"format"', (b'"trace_id":', b'"created_by":"x","trace_id":'), "created_by"),
        (b'{"run"', (b'"complete":', b'"complete":false,"complete":'), "complete"),
    ],
)
def test_a_key_twice_in_a_header_or_event_line_is_a_bundle_error(
    tmp_path: Path, where: bytes, edit: tuple[bytes, bytes], key: str
) -> None:
    """JSON parsers disagree on which of two equal keys counts (orjson and pydantic keep the
    last, others the first): a bundle whose lines hold one twice was loaded silently, the
    second value winning -- ``replay_policy`` included."""
    lines, n = _golden_line(where)
    assert edit[0] in lines[n]
    lines[n] = lines[n].replace(edit[0], edit[1], 1)
    path = tmp_path / "twice.sftrace"
    path.write_bytes(b"\n".join(lines))
    assert f'line {n + 1}: the key "{key}" appears twice in an object' in _bundle_error(path)


def test_colons_in_values_are_no_duplicate_keys(tmp_path: Path) -> None:
    lines, n = _golden_line(b'{"type":"tool_call"')
    lines[n] = lines[n].replace(b'"status":"ok"', b'"status":"ok","name_x":"a:b:c"', 1)
    path = tmp_path / "colons.sftrace"
    path.write_bytes(b"\n".join(lines))
    assert "appears twice" not in _bundle_error(path)  # (an unknown field: refused as such)
    assert load_trace(GOLDEN).run.entrypoint == "golden_agent:run_dinner_agent"  # (a colon)
