"""The table in ``docs/collectors.md`` of what each instrumentation's spans allow is this test's
output: each row is read off a bundle imported from that instrumentation's real spans (traced
here over OTLP/HTTP, or the recorded fixtures of the instrumentations that are not installed in
this environment), so the table cannot claim more than the import does."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import stepfork
from conftest import installed
from foreign_support import docs_block, traced

from stepfork_otel import Trace
from stepfork_otel.trace.models import LlmRequest, ToolCall, payload_value

pytest.importorskip("openai")

FIXTURES = Path(__file__).with_name("fixtures")
HEADER = (
    "| spans written by | fidelity | request held | tool definitions | request parameters "
    "compared | response | tool runs |\n"
    "| --- | --- | --- | --- | --- | --- | --- |\n"
)


def _traced(instrumentation: str, agent: str, module: str) -> Callable[[Path], Path]:
    def bundle(directory: Path) -> Path:
        installed(module)
        return traced(directory, instrumentation, agent, otlp=True).bundle

    return bundle


def _with_logs(instrumentation: str, module: str) -> Callable[[Path], Path]:
    """Spans and log records in files, both given to the import."""

    def bundle(directory: Path) -> Path:
        installed(module)
        return traced(directory, instrumentation).bundle

    return bundle


def _fixture(name: str) -> Callable[[Path], Path]:
    def bundle(directory: Path) -> Path:
        directory.mkdir(parents=True)
        shutil.copy(FIXTURES / name, directory / "spans.jsonl")
        done = stepfork("import", "spans.jsonl", "-o", "bundles", cwd=directory)
        assert done.returncode == 0, done.stdout
        (found,) = (directory / "bundles").glob("*.sftrace")
        return found

    return bundle


ROWS: list[tuple[str, Callable[[Path], Path]]] = [
    (
        "openinference-instrumentation-openai",
        _traced("openinference", "weather", "openinference.instrumentation.openai"),
    ),
    (
        "opentelemetry-instrumentation-openai-v2 (`SPAN_ONLY`)",
        _traced("openai-v2", "weather", "opentelemetry.instrumentation.openai_v2"),
    ),
    (
        "opentelemetry-instrumentation-openai-v2 (`EVENT_ONLY`, its log records imported too)",
        _with_logs("openai-v2-events-apart", "opentelemetry.instrumentation.openai_v2"),
    ),
    ("logfire `instrument_openai()`", _traced("logfire", "weather", "logfire")),
    ("OpenLLMetry 0.62 (recorded fixture)", _fixture("openllmetry/weather.jsonl")),
    ("pydantic-ai's own instrumentation", _traced("pydantic-ai", "pydantic-ai", "pydantic_ai")),
    (
        "openinference-instrumentation-pydantic-ai (recorded fixture)",
        _fixture("openinference-pydantic-ai/pydantic-ai.jsonl"),
    ),
]


def row(name: str, bundle: Path) -> str:
    """What the bundle imported from one instrumentation's spans holds, as a table row."""
    trace = Trace.load(bundle)
    llm = [c for c in trace.calls if isinstance(c, LlmRequest)]
    fidelity = ", ".join(sorted({c.fidelity or "?" for c in llm}))
    first = payload_value(llm[-1].input or "null")
    exact = all(c.fidelity == "exact" for c in llm)
    if exact:
        request, tools, params = "the whole body", "yes", "all"
        response = "the body as received"
    else:
        request = "the messages (parts)"
        tools = "yes" if "tools" in first else "no"
        held = sorted(key.rsplit(".", 1)[-1] for key in first.get("params", {}))
        params = ", ".join(held) or "none"
        response = "rebuilt from the output messages"
    tool_calls = [c for c in trace.calls if isinstance(c, ToolCall)]
    if tool_calls:
        runs = "tool spans: recorded, served"
    else:
        runs = "not traced: " + ", ".join(trace.run.untraced_tools or ["-"])
    return f"| {name} | {fidelity} | {request} | {tools} | {params} | {response} | {runs} |"


def test_the_docs_table_is_what_the_imports_hold(tmp_path: Path) -> None:
    rows = [row(name, make(tmp_path / str(n))) for n, (name, make) in enumerate(ROWS)]
    table = HEADER + "\n".join(rows) + "\n"
    print(table)
    assert docs_block("foreign-table") == table
