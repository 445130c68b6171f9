"""The bundle processor beside whatever processors the application has (``docs/otel-setups.md``,
"Processors, order and sampling"): scrubbing, batching, sampling.

The bundle is built from the payloads the boundaries hand over in-process, never from the span
attributes another processor may have rewritten, so its order among the processors does not
matter; a run the sampler drops is not recorded at all (no span is recording), and ``record()``
says so."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
)

from stepfork_otel import configure, llm_request, record, trace_tool
from stepfork_otel.trace.checks import verify_integrity
from stepfork_otel.trace.models import Trace


@trace_tool
def search_flights(city: str) -> list[str]:
    return [f"{city}-1", f"{city}-2"]


def agent() -> str:
    search_flights("Paris")
    return llm_request(provider="p", model="m", input={"q": "Paris?"}, call=lambda: "Paris!")


class ScrubbingProcessor(SpanProcessor):
    """What a hand-written scrubbing processor does: rewrite attribute values of ended spans
    (here every mention of Paris) before the exporters after it see them."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        span.set_attribute("app.scrubbed", True)

    def on_end(self, span: ReadableSpan) -> None:
        span._attributes = {  # type: ignore[attr-defined]
            key: value.replace("Paris", "***") if isinstance(value, str) else value
            for key, value in (span.attributes or {}).items()
        }


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    provider = TracerProvider()
    yield provider
    provider.shutdown()


@pytest.mark.parametrize("stepfork_first", [False, True], ids=["after", "before"])
def test_scrubbing_and_batching_processors_leave_the_bundle_whole(
    tmp_path: Path, provider: TracerProvider, stepfork_first: bool
) -> None:
    exporter = InMemorySpanExporter()
    if stepfork_first:
        configure(directory=tmp_path, tracer_provider=provider)
    provider.add_span_processor(ScrubbingProcessor())
    provider.add_span_processor(BatchSpanProcessor(exporter))
    if not stepfork_first:
        configure(directory=tmp_path, tracer_provider=provider)

    with record(tmp_path / "run.sftrace") as run:
        run.set_output(agent())
    provider.force_flush()

    bundle = Trace.load(tmp_path / "run.sftrace")
    assert verify_integrity(bundle) == []
    assert [c.input for c in bundle.calls] == ['{"city":"Paris"}', '{"q":"Paris?"}']
    assert bundle.run.output == '"Paris!"'
    # the exporter behind the scrubber sees every stepfork span scrubbed, wherever stepfork is
    exported = exporter.get_finished_spans()
    assert len(exported) == 3
    for span in exported:
        attributes = span.attributes or {}
        assert attributes["app.scrubbed"] is True
        assert "Paris" not in str(dict(attributes))


class DropRunsNamed(Sampler):
    """A root sampler that drops the traces whose root span has the given name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> SamplingResult:
        if name == self.name:
            return SamplingResult(Decision.DROP)
        # a sampler hands the span its attributes: without them stepfork's span is not a run
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return f"DropRunsNamed({self.name})"


def test_a_sampled_out_run_writes_no_bundle_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    provider = TracerProvider(sampler=ParentBased(DropRunsNamed("invoke_agent dropped")))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    configure(directory=tmp_path / "traces", tracer_provider=provider)

    with caplog.at_level(logging.WARNING, logger="stepfork_otel"):
        with record(tmp_path / "dropped.sftrace", name="dropped") as dropped:
            dropped.set_output(agent())
        with record(tmp_path / "kept.sftrace", name="kept") as kept:
            kept.set_output(agent())

    assert not (tmp_path / "dropped.sftrace").exists()
    assert "the run 'dropped' was not sampled" in caplog.text
    with pytest.raises(RuntimeError, match="not sampled"):
        _ = dropped.trace
    assert verify_integrity(kept.trace) == []
    assert [c.input for c in kept.trace.calls] == ['{"city":"Paris"}', '{"q":"Paris?"}']
    # the sampler decided for the exporter and the bundle alike: nothing of the dropped run
    assert sorted(s.name for s in exporter.get_finished_spans()) == [
        "chat m",
        "execute_tool search_flights",
        "invoke_agent kept",
    ]
    assert not list((tmp_path / "traces").glob("*.sftrace"))
    provider.shutdown()


def test_calls_inside_a_sampled_out_user_span_are_not_recorded(tmp_path: Path) -> None:
    provider = TracerProvider(sampler=ALWAYS_OFF)
    configure(directory=tmp_path, tracer_provider=provider)
    with provider.get_tracer("app").start_as_current_span("handle request"):
        assert agent() == "Paris!"  # the program runs as usual
    assert list(tmp_path.glob("*.sftrace")) == []
    provider.shutdown()


class DecisionOnly(Sampler):
    """A sampler that returns its decision alone: the SDK gives the span no attributes."""

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        return SamplingResult(Decision.RECORD_AND_SAMPLE)

    def get_description(self) -> str:
        return "DecisionOnly"


def test_a_sampler_that_drops_the_attributes_is_named_not_silent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Such a sampler strips stepfork's attributes, so the run and its calls are no longer
    recognised: the bundle holds no call. It is said, once, at the first span."""
    provider = TracerProvider(sampler=DecisionOnly())
    configure(tracer_provider=provider)
    with caplog.at_level(logging.WARNING, logger="stepfork_otel"):
        with record(tmp_path / "run.sftrace") as run:
            run.set_output(agent())
        with record(tmp_path / "again.sftrace"):
            agent()
    warned = [
        r.message for r in caplog.records if "SamplingResult(decision, attributes)" in r.message
    ]
    assert len(warned) == 1, caplog.text
    assert "sampler returned its decision without the span's attributes" in warned[0]
    docs = (Path(__file__).resolve().parent.parent / "docs" / "otel-setups.md").read_text("utf-8")
    assert f"WARNING:stepfork_otel:{warned[0]}\n" in docs  # the page shows it as it is
    assert Trace.load(tmp_path / "run.sftrace").calls == []  # what the warning is about


class DropsEverySecond(Sampler):
    """A sampler that keeps the attributes of every other span only."""

    def __init__(self) -> None:
        self.n = 0

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        self.n += 1
        attributes = args[4] if len(args) > 4 else kwargs.get("attributes")
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes if self.n % 2 else None)

    def get_description(self) -> str:
        return "DropsEverySecond"


def test_a_sampler_that_drops_the_attributes_of_later_spans_only_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The check ran on the first span of each tracer only: a sampler that kept the run span's
    attributes and dropped a call's lost that call silently."""
    configure(tracer_provider=TracerProvider(sampler=DropsEverySecond()))
    with caplog.at_level(logging.WARNING, logger="stepfork_otel"), record(tmp_path / "r.sftrace"):
        agent()
    warned = [
        r.message for r in caplog.records if "SamplingResult(decision, attributes)" in r.message
    ]
    assert len(warned) == 1, caplog.text
