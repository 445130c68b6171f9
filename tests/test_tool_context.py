"""Parameters that are not a tool's input (issue 26, item 6): ``@trace_tool(exclude=...)``, and
framework context left out by default -- LangChain's callbacks, run managers and
``RunnableConfig`` here, with the real ``langchain_core`` objects; pydantic-ai's ``RunContext``
in a real agent in ``tests/test_framework_context.py``.

What is left out is left out of the recorded input, of the parameter schema on the span, and --
the replayed call's input being built by the same code -- of what replay matches. An input that
still has no JSON form is said at record time, naming the parameter, and its span says the call
cannot be replayed (``stepfork.unreplayable``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Recording, installed

from stepfork_otel import ReplaySession, Trace, record, trace_tool
from stepfork_otel import constants as k
from stepfork_otel.otel.processor import span_record
from stepfork_otel.replay.errors import ReplayMismatchError
from stepfork_otel.trace.builder import spans_to_trace
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR

REPLAY_DOC = ROOT / "docs" / "replay.md"


class Handle:
    """Something a framework passes beside the arguments: no JSON form, different every run."""

    def __init__(self, n: int) -> None:
        self.n = n


def inputs(bundle: Path) -> list[Any]:
    return [json.loads(call.input or "") for call in Trace.load(bundle).calls]


def tool_spans(recording: Recording) -> list[dict[str, Any]]:
    return [
        dict(s.attributes or {})
        for s in recording.exporter.get_finished_spans()
        if (s.attributes or {}).get(k.KIND) == k.KIND_TOOL
    ]


def test_excluded_parameters_are_left_out_when_recorded_and_when_matched(
    recording: Recording, tmp_path: Path
) -> None:
    ran: list[int] = []

    @trace_tool(exclude=("handle", "trace_id"))
    def lookup(handle: Handle, order_id: int, trace_id: str = "t-0") -> dict[str, Any]:
        ran.append(handle.n)
        return {"order_id": order_id, "status": "shipped"}

    with record(tmp_path / "run.sftrace"):
        first = lookup(Handle(1), 2, trace_id="t-1")
    assert inputs(tmp_path / "run.sftrace") == [{"order_id": 2}]
    (span,) = tool_spans(recording)
    assert json.loads(span[k.OI_TOOL_PARAMETERS])["properties"].keys() == {"order_id"}
    assert k.UNREPLAYABLE not in span

    with ReplaySession.from_trace(tmp_path / "run.sftrace") as replay:  # other handle, other id
        assert lookup(Handle(99), 2, trace_id="t-2") == first
        replay.verify_complete()
    assert ran == [1]  # frozen: the body did not run again
    with (
        pytest.raises(ReplayMismatchError, match="input differs"),
        ReplaySession.from_trace(tmp_path / "run.sftrace"),
    ):
        lookup(Handle(1), 3)  # what is left in the input is still matched


def test_exclude_takes_one_name_and_names_in_kwargs(recording: Recording, tmp_path: Path) -> None:
    @trace_tool(exclude="handle")
    def one(handle: Handle, city: str) -> str:
        return city

    @trace_tool(exclude=("handle",))
    def extra(city: str, **options: Any) -> str:
        return city

    with record(tmp_path / "run.sftrace"):
        one(Handle(1), "Paris")
        extra("Oslo", handle=Handle(2), units="metric")
    assert inputs(tmp_path / "run.sftrace") == [
        {"city": "Paris"},
        {"city": "Oslo", "options": {"units": "metric"}},
    ]


def test_excluding_a_parameter_that_does_not_exist_is_a_clear_error() -> None:
    def tool(ctx: Any, city: str) -> str:
        return city

    with pytest.raises(
        ValueError, match=r"'cxt' is not a parameter of tool \(its parameters: ctx, city\)"
    ):
        trace_tool(exclude=("cxt",))(tool)


def test_an_input_without_json_form_is_said_naming_the_parameter_and_marked_on_its_span(
    recording: Recording, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    @trace_tool
    def lookup(handle: Handle, order_id: int) -> int:
        return order_id

    with caplog.at_level(logging.WARNING, logger="stepfork_otel"), record(tmp_path / "u.sftrace"):
        lookup(Handle(1), 2)
        lookup(Handle(2), 3)  # the same parameter: said once
    said = [r.getMessage() for r in caplog.records if r.name == "stepfork_otel"]
    assert said == [
        "stepfork_otel: the input of tool lookup has no JSON form (parameter 'handle': "
        "test_tool_context.Handle); it is recorded as unserialisable and this call cannot be "
        "replayed -- if it is not the tool's input, leave it out: @trace_tool(exclude=('handle',))"
    ]
    spans = tool_spans(recording)
    assert [s[k.UNREPLAYABLE] for s in spans] == [
        "input: parameter 'handle': test_tool_context.Handle"
    ] * 2
    page = REPLAY_DOC.read_text(encoding="utf-8")  # shown there, for a tool in module myapp
    assert said[0].replace(__name__ + ".", "myapp.") in page
    assert f"`{spans[0][k.UNREPLAYABLE]}`".replace(__name__ + ".", "myapp.") in page
    (first, _) = Trace.load(tmp_path / "u.sftrace").calls
    assert json.loads(first.input or "") == {
        "$unserialisable": "builtins.dict: parameter 'handle': test_tool_context.Handle"
    }
    with (
        pytest.raises(ReplayMismatchError, match="parameter 'handle'"),
        ReplaySession.from_trace(tmp_path / "u.sftrace"),
    ):
        lookup(Handle(1), 2)


def test_an_output_without_json_form_is_marked_on_its_span_too(
    recording: Recording, tmp_path: Path
) -> None:
    @trace_tool
    def opened(path: str) -> Any:
        return Handle(1)

    with record(tmp_path / "o.sftrace"):
        opened("a")
    (span,) = tool_spans(recording)
    assert span[k.UNREPLAYABLE] == "output: test_tool_context.Handle"


# --- LangChain's context, with its real objects --------------------------------------------------


def test_langchain_callbacks_run_managers_and_config_are_left_out(
    recording: Recording, tmp_path: Path
) -> None:
    installed("langchain_core")
    from langchain_core.callbacks import (
        CallbackManager,
        CallbackManagerForToolRun,
        StdOutCallbackHandler,
    )
    from langchain_core.runnables import RunnableConfig

    @trace_tool
    def annotated(
        city: str,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
    ) -> str:
        return city

    @trace_tool
    def unannotated(city, callbacks=None, run_manager=None):  # type: ignore[no-untyped-def]
        return city

    manager = CallbackManager(handlers=[])
    run_manager = CallbackManagerForToolRun(
        run_id=__import__("uuid").uuid4(), handlers=[], inheritable_handlers=[]
    )
    config: RunnableConfig = {"callbacks": manager, "tags": ["x"]}
    with record(tmp_path / "lc.sftrace"):
        annotated("Paris", config, run_manager=run_manager)
        unannotated("Paris", callbacks=manager, run_manager=run_manager)
        unannotated("Oslo", callbacks=[StdOutCallbackHandler()])
        unannotated("Rome")  # no context given: the parameters are plain values
    assert inputs(tmp_path / "lc.sftrace") == [
        {"city": "Paris"},
        {"city": "Paris"},
        {"city": "Oslo", "run_manager": None},
        {"city": "Rome", "callbacks": None, "run_manager": None},
    ]
    assert all(k.UNREPLAYABLE not in span for span in tool_spans(recording))
    assert Trace.load(tmp_path / "lc.sftrace").complete


def test_a_run_holding_a_call_that_cannot_be_replayed_does_not_claim_to_be_complete(
    recording: Recording, tmp_path: Path
) -> None:
    @trace_tool
    def lookup(handle: Handle, order_id: int) -> int:
        return order_id

    @trace_tool
    def plain(n: int) -> int:
        return n

    with record(tmp_path / "r.sftrace"):
        plain(1)
        lookup(Handle(1), 2)
        plain(2)
    reason = (
        "1 call(s) cannot be replayed, a payload having no JSON form: "
        "call-2 (input: parameter 'handle': test_tool_context.Handle)"
    )
    trace = Trace.load(tmp_path / "r.sftrace")  # written as the run went
    assert (trace.complete, trace.incomplete_reason) == (False, reason)
    # the same from the spans alone, as a buffered bundle and the OTLP importer build it
    spans = [span_record(s) for s in recording.exporter.get_finished_spans()]
    rebuilt = spans_to_trace(spans, redactor=DEFAULT_REDACTOR)
    assert (rebuilt.complete, rebuilt.incomplete_reason) == (False, reason)
