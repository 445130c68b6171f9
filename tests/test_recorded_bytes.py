"""The bytes a recording writes are pinned: the same calls give the same bundle, byte for byte,
whatever the recording path does to be fast.

A fixed run -- tools and LLM calls with clean and secret-holding payloads (sorted and unsorted
keys, JSON escapes, non-ASCII text, bytes, sensitive and generic keys, header pairs, a failure
whose message holds a token, and the benchmarks' realistic payloads) -- is recorded with
``record(...)``; its bundle, with what differs between two runs taken out (trace and span ids,
timestamps, durations), must equal ``golden/recorded_run.jsonl``, and the attributes of the
exported spans (payloads as returned included, which only spans carry) must equal
``golden/recorded_run_spans.jsonl`` (in the order they were set). The run is then replayed
(frozen) from its bundle, the replay recorded too: the replay's bundle and spans are pinned the
same way (``golden/replayed_run*.jsonl``). Payload lines and every fingerprint stay in: a change
to canonical JSON, redaction, substitution or the span -> event conversion changes them. The golden was written by the code before the recording path was optimised
(issue 12, item 3); regenerate it only for a deliberate format change::

    python tests/test_recorded_bytes.py --write
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent / "golden" / "recorded_run.jsonl"
GOLDEN_SPANS = GOLDEN.with_name("recorded_run_spans.jsonl")
GOLDEN_REPLAY = GOLDEN.with_name("replayed_run.jsonl")
GOLDEN_REPLAY_SPANS = GOLDEN.with_name("replayed_run_spans.jsonl")

#: Event and header fields that differ between two recordings of the same calls.
_VOLATILE = frozenset(
    {
        "trace_id",
        "span_id",
        "parent_span_id",
        "time_unix_nano",
        "start_time_unix_nano",
        "end_time_unix_nano",
        "duration_ns",
        "lines_sha256",  # the end line's hash of every line, ids and timestamps included
    }
)

#: Span attributes that differ between two recordings (the trace a replay replays).
_VOLATILE_ATTRIBUTES = frozenset({"stepfork.replay.of"})

# Fake secrets, built from parts so that no scanner takes this file for a leak.
_TOKEN = "ghp_" + "16C7e42F292c6912E7710c838347Ae178B4a"
_OPENAI = "sk-proj-" + "Xf3kT9qLmN2pR8sV4wY6zA1bC5dE7gH0jKqW"
_AWS = "AKIA" + "IOSFODNN7EXAMPLE"
_JWT = "eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiJhZ2VudC0xMjMifQ.c2lnbmF0dXJlLXZhbHVlLXg"


def _values() -> list[tuple[Any, Any]]:
    """(input, output) pairs of the tool calls."""
    pairs: list[tuple[Any, Any]] = [
        ({"city": "Lisbon", "when": "2025-06-01"}, {"temp_c": 24, "sky": "clear"}),
        ({"z": 1, "a": "b"}, {"zeta": [3, 2, 1], "alpha": {"y": None, "x": 1.5}}),
        ({"note": 'line one\nline two "quoted" \\ back'}, {"ok": True, "text": "tab\there"}),
        ({"name": "Café Zürich ☕", "emoji": "🙂"}, {"reply": "naïve façade"}),
        ({"query": f"use {_TOKEN} please"}, {"z_last": f"key {_OPENAI}", "a_first": "clean"}),
        ({"headers": {"Authorization": f"Bearer {_JWT}", "X-Trace": "abc"}}, {"status": 200}),
        ({"api_key": _OPENAI, "password": "hunter2", "nested": {"client_secret": 12}}, {}),
        ({"pairs": [["X-Api-Key", "k-123456"], ["Accept", "json"]]}, ["done"]),
        ({"access_key": "Zk8q2LmN4pR7sT1vW3xY5zA9"}, {"db": "postgres://u:s3cretPW@db:5432/x"}),
        ({"blob": b"Authorization: Bearer " + _TOKEN.encode()}, {"raw": b"\x00\x01\xfe"}),
        ({"aws": f"id={_AWS}\nother"}, {"msg": "the key \\n " + _AWS, "b": "x\u0001y"}),
    ]
    from benchmarks._common import payload_pool

    inputs = payload_pool(2_000, 10, seed=11)
    outputs = payload_pool(2_000, 10, seed=12)
    pairs += list(zip(inputs, outputs, strict=True))
    small, large = payload_pool(200, 10, seed=13), payload_pool(20_000, 10, seed=14)
    pairs += list(zip(small, large, strict=True))[-2:]  # a clean one, one holding a secret
    return pairs


class _Refused(Exception):
    __module__ = "fixed_run"  # recorded as `fixed_run._Refused`, however this file is run


def record_fixed_run(path: Path, replayed: Path | None = None) -> None:
    """Record the fixed run into ``path``; with ``replayed``, replay it (frozen) from ``path``
    instead, recording the replay into ``replayed``."""
    from stepfork_otel import ReplaySession, llm_request, record, trace_tool

    if replayed is not None:
        with ReplaySession.from_trace(path) as session:
            record_fixed_run(replayed)
            session.verify_complete()
        return

    pairs = _values()
    outputs = {n: out for n, (_, out) in enumerate(pairs)}

    @trace_tool
    def lookup(request: Any, n: int, limit: int = 5) -> Any:
        return outputs[n]

    @trace_tool
    def book(table: str) -> str:
        raise _Refused(f"no table for {table}; token {_TOKEN} was rejected")

    with record(path, input={"question": f"plan with {_OPENAI}"}, name="fixed") as run:
        for n, (value, _) in enumerate(pairs):  # (replayed: the recorded outcomes, not these)
            if n % 3 == 1:
                llm_request(
                    provider="openai",
                    model="gpt-4.1-mini",
                    input=value,
                    call=lambda n=n: {  # type: ignore[misc]
                        "model": "gpt-4.1-mini-2025",
                        "usage": {"prompt_tokens": 10 + n, "completion_tokens": 3},
                        "choices": [{"message": {"content": outputs[n]}}],
                    },
                )
            else:
                lookup(value, n)
        with contextlib.suppress(Exception):  # _Refused; replayed: the recorded failure
            book("Taberna")
        run.set_output({"answer": "booked", "z": [1, 2], "a": f"Bearer {_JWT}"})


def normalised(path: Path) -> str:
    """The bundle's lines, with what differs between two recordings removed."""
    lines: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        value = json.loads(line)
        if isinstance(value, dict) and value.keys() & {"type", "format", "end", "run"}:
            # (``run``: the trailer of a bundle written as its run went)
            value = {key: v for key, v in value.items() if key not in _VOLATILE}
            if isinstance(value.get("run"), dict):
                value["run"] = {key: v for key, v in value["run"].items() if key not in _VOLATILE}
            line = json.dumps(value, ensure_ascii=False, sort_keys=True)
        lines.append(line)  # payload lines are kept verbatim
    return "\n".join(lines) + "\n"


def normalised_spans(spans: Any) -> str:
    """Each exported span's name, kind and attributes (in the order they were set), one line
    per span, in the order the spans ended; attributes naming a recorded trace are left out."""
    lines = [
        json.dumps(
            {
                "name": s.name,
                "kind": s.kind.name,
                "attributes": [
                    [key, list(v) if isinstance(v, tuple) else v]
                    for key, v in (s.attributes or {}).items()
                    if key not in _VOLATILE_ATTRIBUTES
                ],
            },
            ensure_ascii=False,
            sort_keys=True,
        )
        for s in spans
    ]
    return "\n".join(lines) + "\n"


def test_a_fixed_run_records_the_same_bytes_as_before(recording: Any, tmp_path: Path) -> None:
    path = tmp_path / "fixed.sftrace"
    record_fixed_run(path)
    assert normalised(path) == GOLDEN.read_text(encoding="utf-8")
    spans = recording.exporter.get_finished_spans()
    assert normalised_spans(spans) == GOLDEN_SPANS.read_text(encoding="utf-8")
    recording.exporter.clear()
    replayed = tmp_path / "replayed.sftrace"
    record_fixed_run(path, replayed)
    assert normalised(replayed) == GOLDEN_REPLAY.read_text(encoding="utf-8")
    spans = recording.exporter.get_finished_spans()
    assert normalised_spans(spans) == GOLDEN_REPLAY_SPANS.read_text(encoding="utf-8")


def test_the_golden_holds_redacted_payloads_and_every_kind_of_call() -> None:
    """The golden is worth pinning: it holds both kinds of call, the failure, unsorted keys
    kept as returned, and redacted secrets -- never a raw one."""
    text = GOLDEN.read_text(encoding="utf-8") + GOLDEN_SPANS.read_text(encoding="utf-8")
    for secret in (_TOKEN, _OPENAI, _AWS, _JWT, "hunter2", "s3cretPW"):
        assert secret not in text
    for needle in (
        '"type": "tool_call"',
        '"type": "llm_request"',
        '"type": "llm_response"',
        '"type": "tool_result"',
        "[REDACTED:",
        '"[REDACTED]"',
        "fixed_run._Refused",
        # as returned: the recorded text, its fingerprint's and output.value's
        '{\\"z_last\\":\\"key [REDACTED:openai_api_key]\\",\\"a_first\\"',
    ):
        assert needle in text, needle


if __name__ == "__main__":  # python tests/test_recorded_bytes.py --write
    if "--write" not in sys.argv:
        raise SystemExit("usage: python tests/test_recorded_bytes.py --write")
    import tempfile

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from stepfork_otel import configure

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))
    with tempfile.TemporaryDirectory() as scratch:
        provider, exporter = TracerProvider(), InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        configure(directory=Path(scratch) / "traces", tracer_provider=provider)
        target = Path(scratch) / "fixed.sftrace"
        record_fixed_run(target)
        GOLDEN.write_text(normalised(target), encoding="utf-8")
        GOLDEN_SPANS.write_text(normalised_spans(exporter.get_finished_spans()), encoding="utf-8")
        exporter.clear()
        replayed = Path(scratch) / "replayed.sftrace"
        record_fixed_run(target, replayed)
        GOLDEN_REPLAY.write_text(normalised(replayed), encoding="utf-8")
        spans = exporter.get_finished_spans()
        GOLDEN_REPLAY_SPANS.write_text(normalised_spans(spans), encoding="utf-8")
    print(f"wrote {GOLDEN.name}, {GOLDEN_SPANS.name} and the replay's, in {GOLDEN.parent}")
