"""Secrets corpus, end to end: an agent whose tool arguments, nested tool outputs, bytes, LLM
requests and responses, exception messages, run input and run output carry every secret family is
recorded through a real SDK ``TracerProvider``; no secret may reach the bundle file, any span
attribute or span event attribute seen by an exporter, a span status description, the OTLP wire
to a loopback receiver, or the bundles imported from what that receiver got.

``SECRETS`` (tests/test_redaction.py) are hand-written; ``CORPUS`` (tests/secret_families.py) is
generated: at least 150 secrets across every covered family.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

import pydantic
import pytest
from conftest import Recording
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from otlp_receiver import running_receiver
from secret_families import CORPUS
from secret_families import Secret as GeneratedSecret
from test_redaction import SECRETS, Secret

from stepfork_otel import Trace, allm_request, cli, configure, llm_request, record, trace_tool
from stepfork_otel.trace.checks import verify_integrity


def _in_the_wild(secret: Secret) -> str:
    return f"debug dump: {secret.text} (from env)"


@dataclasses.dataclass
class Credentials:
    service: str
    note: str


class Profile(pydantic.BaseModel):
    name: str
    notes: list[str]


@trace_tool
def load_settings(service: str, note: str, headers: dict[str, str], api_key: Any) -> dict[str, Any]:
    """Arguments carry secrets (one under a sensitive key, others in free text); the output holds
    them nested in dicts, lists, a dataclass and a pydantic model."""
    return {
        "service": service,
        "settings": {"connection": [note, {"deep": {"deeper": note}}]},
        "credentials": Credentials(service, note),
        "profile": Profile(name=service, notes=[note, note.upper()]),
        "as_key": {note: "value"},
    }


@trace_tool
def connect(dsn: str) -> None:
    raise ConnectionError(f"cannot connect to {dsn}; last credential tried: {dsn}")


@trace_tool
async def fetch_async(note: str) -> list[str]:
    return [note]


def _llm(secret: Secret) -> dict[str, Any]:
    return llm_request(
        provider="openai",
        model="gpt-4.1-mini",
        input={
            "messages": [
                {"role": "system", "content": "You are a deployment assistant."},
                {"role": "user", "content": f"Why does this fail? {_in_the_wild(secret)}"},
            ],
            "max_tokens": 256,
        },
        call=lambda: {
            "choices": [{"message": {"role": "assistant", "content": f"You leaked {secret.text}"}}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 9},
        },
    )


async def _allm(secret: Secret) -> dict[str, Any]:
    async def call() -> dict[str, Any]:
        return {"output_text": _in_the_wild(secret)}

    return await allm_request(
        provider="anthropic",
        model="claude-sonnet",
        input={"prompt": _in_the_wild(secret), "headers": {"x-api-key": secret.text}},
        call=call,
    )


async def run_agent(secret: Secret) -> None:
    note = _in_the_wild(secret)
    load_settings(
        "billing",
        note,
        {"Authorization": secret.text, "User-Agent": note},
        api_key=secret.text,
    )
    _llm(secret)
    await _allm(secret)
    await fetch_async(note)
    with pytest.raises(ConnectionError):
        connect(note)


def _span_texts(span: ReadableSpan) -> list[str]:
    texts = [span.name, str(dict(span.attributes or {}))]
    for event in span.events:
        texts += [event.name, str(dict(event.attributes or {}))]
    if span.status.description:
        texts.append(span.status.description)
    return texts


def _assert_no_secret(secret: Secret, where: str, text: str) -> None:
    assert secret.secret not in text, f"{secret.family} secret reached {where}"
    for line in secret.secret.splitlines():  # PEM bodies: no line of the key either
        assert line not in text, f"{secret.family} secret line reached {where}"


@pytest.mark.parametrize("secret", SECRETS, ids=lambda s: s.family)
async def test_no_secret_reaches_bundle_spans_or_statuses(
    recording: Recording, tmp_path: Path, secret: Secret
) -> None:
    configure(max_span_payload_bytes=100_000)
    path = tmp_path / "run.sftrace"

    async def agent() -> None:
        with record(path, input={"task": _in_the_wild(secret)}) as run:
            await run_agent(secret)
            run.set_output({"answer": f"done, used {secret.text}", "nested": [{"k": secret.text}]})
            raise RuntimeError(f"agent gave up holding {secret.text}")

    with pytest.raises(RuntimeError, match="agent gave up"):
        await agent()

    data = path.read_bytes()
    _assert_no_secret(secret, "the bundle file", data.decode("utf-8"))
    trace = Trace.load(path)
    assert verify_integrity(trace) == []
    assert {e.type for e in trace.events} == {
        "tool_call",
        "tool_result",
        "llm_request",
        "llm_response",
        "error",
    }
    assert trace.run.input is not None
    assert trace.run.output is not None
    assert trace.run.error_message is not None
    assert "[REDACTED" in trace.run.error_message

    spans = recording.exporter.get_finished_spans()
    assert len(spans) == 6  # run + 5 boundaries, all seen by the exporter
    for span in spans:
        for text in _span_texts(span):
            _assert_no_secret(secret, f"span {span.name!r}", text)


@pytest.mark.parametrize("secret", SECRETS[::6], ids=lambda s: s.family)
async def test_no_secret_in_previews_of_payloads_over_the_span_cap(
    recording: Recording, tmp_path: Path, secret: Secret
) -> None:
    configure(max_span_payload_bytes=64)  # every payload is left off the span: previews only
    path = tmp_path / "big.sftrace.gz"
    with record(path, input={"task": _in_the_wild(secret)}) as run:
        await run_agent(secret)
        run.set_output(_in_the_wild(secret))
    _assert_no_secret(secret, "the gzipped bundle", gzip.decompress(path.read_bytes()).decode())
    for span in recording.exporter.get_finished_spans():
        for text in _span_texts(span):
            _assert_no_secret(secret, f"span {span.name!r}", text)


def test_user_span_names_are_redacted_in_the_bundle(recording: Recording) -> None:
    """Context spans keep only names and timing; a name that embeds credentials is redacted
    (found in review: `GET https://user:pass@host/?token=...` span names)."""
    from stepfork_otel import record, trace_tool

    @trace_tool
    def lookup(city: str) -> str:
        return city

    secret_url = "GET https://bob:hunter2pass@db.example.com/?api_key=sk-proj-" + "B" * 40
    tracer = recording.provider.get_tracer("user")
    path = recording.directory / "ctx.sftrace"
    with record(path), tracer.start_as_current_span(secret_url):
        lookup("Paris")
    text = path.read_text()
    assert "hunter2pass" not in text
    assert "B" * 40 not in text


# --- the generated corpus: every family, every position, every place a span can reach ------------


@trace_tool
def corpus_tool(note: str, config: dict[str, Any], blob: bytes, raw: bytes) -> dict[str, Any]:
    """A secret as a tool argument, a nested argument, bytes (UTF-8 and not) -- and back in the
    output: nested, and as bytes."""
    return {"result": [{"detail": {"text": note}}], "echo": blob, "raw": raw}


@trace_tool
def corpus_failing_tool(note: str) -> None:
    raise ValueError(f"lookup failed for {note}")


def _corpus_agent(secret: GeneratedSecret, path: Path) -> None:
    note = f"debug dump: {secret.text} (from env)"
    with record(path, input={"task": note}) as run:
        corpus_tool(
            note,
            {"servers": [{"primary": {"connection": note}}]},
            note.encode("utf-8"),
            b"\xff\xfe" + note.encode("utf-8") + b"\x00",
        )
        with pytest.raises(ValueError, match="lookup failed"):
            corpus_failing_tool(note)
        llm_request(
            provider="openai",
            model="gpt-4.1-mini",
            input={"messages": [{"role": "user", "content": f"Why does this fail? {note}"}]},
            call=lambda: {"choices": [{"message": {"role": "assistant", "content": note}}]},
        )
        run.set_output({"answer": note, "nested": [{"k": note}]})


def _forms(secret: GeneratedSecret) -> list[str]:
    """What must not appear: the secret, each line of it (PEM bodies), and its JSON-escaped form."""
    forms = [line for line in secret.secret.splitlines() if len(line) >= 6] or [secret.secret]
    return [*forms, *(json.dumps(f)[1:-1] for f in forms)]


def _leaks(secret: GeneratedSecret, text: str) -> bool:
    return any(form in text for form in _forms(secret))


def _decoded_blobs(trace: Trace) -> list[str]:
    """The bytes a bundle holds (base64 in the payloads), decoded."""
    out = []
    for event in trace.events:
        for text in (getattr(event, "input", None), getattr(event, "output", None)):
            if text and ('"blob"' in text or '"echo"' in text):
                value = json.loads(text)
                for key in ("blob", "raw", "echo"):
                    if isinstance(value, dict) and isinstance(value.get(key), str):
                        out.append(base64.b64decode(value[key]).decode("latin-1"))
    return out


def test_generated_corpus_never_leaves_the_process(
    recording: Recording, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """At least 150 generated secrets, across every covered family, each in every position (tool
    argument, nested argument, nested output, bytes both ways, exception message, LLM input and
    output, run input and output): none reaches the bundle bytes (base64 decoded too), any
    exported span attribute, event or status, the OTLP wire to a loopback receiver, or the bundles
    ``stepfork import`` rebuilds from what the receiver got."""
    assert len(CORPUS) >= 150
    configure(max_span_payload_bytes=100_000)
    with running_receiver(tmp_path / "collector" / "traces.jsonl") as receiver:
        wire = BatchSpanProcessor(HttpSpanExporter(endpoint=receiver.http_endpoint, timeout=10))
        recording.provider.add_span_processor(wire)
        leaks: list[str] = []
        for n, secret in enumerate(CORPUS):
            path = tmp_path / "local" / f"{n:03d}.sftrace"
            recording.exporter.clear()
            _corpus_agent(secret, path)
            data = path.read_text("utf-8")
            trace = Trace.load(path)
            assert verify_integrity(trace) == []
            assert len(trace.calls) == 3, secret.family
            if _leaks(secret, data) or any(_leaks(secret, b) for b in _decoded_blobs(trace)):
                leaks.append(f"{secret.family}: bundle")
            for span in recording.exporter.get_finished_spans():
                if any(_leaks(secret, t) for t in _span_texts(span)):
                    leaks.append(f"{secret.family}: span {span.name!r}")
        assert wire.force_flush(30_000)
        assert receiver.spans == 4 * len(CORPUS)  # the run and its three calls
        received = receiver.output.read_text("utf-8")
    for secret in CORPUS:
        if _leaks(secret, received):
            leaks.append(f"{secret.family}: OTLP wire")
    capsys.readouterr()
    out = tmp_path / "imported"
    assert cli.main(["import", str(receiver.output), "-o", str(out)]) == 0
    imported = sorted(out.glob("*.sftrace"))
    assert len(imported) == len(CORPUS)
    texts = [p.read_text("utf-8") for p in imported]
    for secret in CORPUS:
        if any(_leaks(secret, t) for t in texts):
            leaks.append(f"{secret.family}: imported bundle")
    assert leaks == []
