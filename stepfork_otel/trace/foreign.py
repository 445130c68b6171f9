"""Spans another instrumentation wrote, read as the spans stepfork writes, so a team can replay
the traces it already has (``stepfork import``).

The importer hands the spans of a trace that holds no stepfork span to :func:`adopt`. Each span
an adapter recognises is given the attributes and payloads a stepfork boundary span carries, its
trace's local root becomes the run (a call that is the trace's root gets a run made around it),
and the one bundle builder
(:func:`~stepfork_otel.trace.builder.spans_to_trace`) builds the bundle: there is no second
converter. Replay then serves the calls through ``instrument_openai()`` /
``instrument_anthropic()`` and ``@trace_tool``. One adapter per convention:

* :mod:`~stepfork_otel.trace.foreign_openinference` -- OpenInference's OpenAI LLM spans (the
  request and response bodies: fidelity ``exact``) and TOOL spans;
* :mod:`~stepfork_otel.trace.foreign_genai` -- OpenTelemetry GenAI semantic-convention spans
  (openai-v2 / genai-openai, logfire, OpenLLMetry, pydantic-ai): the messages, maybe tools and
  parameters (fidelity ``messages-only``, or ``truncated``), ``execute_tool`` spans.

Every call says its fidelity in the bundle, and what its span could not hold in the import's
notes and the call's ``unchecked`` list: ``stepfork show`` and the replay report print both.
A span an adapter cannot read is named and kept as context; the rest of the trace still imports.

Pure data in, data out (the format layer): no OpenTelemetry import.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import replace

from stepfork_otel import constants as k
from stepfork_otel._version import __version__
from stepfork_otel.trace import foreign_genai, foreign_openinference, grouping
from stepfork_otel.trace.conversion import SpanRecord, call_order
from stepfork_otel.trace.foreign_calls import Adopted, run_record, where
from stepfork_otel.trace.redaction import Redactor

__all__ = ["Adopted", "adopt", "convention_of", "created_by"]

#: The conventions, as ``created_by`` and the docs' table name them.
OPENINFERENCE = foreign_openinference.NAME
GENAI = "OpenTelemetry GenAI"
LOGFIRE = "logfire"
OPENLLMETRY = "OpenLLMetry"

_Make = Callable[[SpanRecord, int, Redactor, list[str]], SpanRecord]


def created_by(conventions: Sequence[str]) -> str:
    """The ``created_by`` of a bundle imported from spans of ``conventions``."""
    return f"{' + '.join(conventions)} spans, imported by stepfork_otel {__version__}"


def convention_of(span: SpanRecord) -> str:
    """Which instrumentation family wrote a span this module reads."""
    attrs = span.attributes
    if k.OPENINFERENCE_SPAN_KIND in attrs:
        return OPENINFERENCE
    if k.LOGFIRE_SPAN_TYPE in attrs:
        return LOGFIRE
    if (
        k.TL_REQUEST_TYPE in attrs
        or k.TL_IS_STREAMING in attrs
        or any(key.startswith(f"{k.TL_PROMPT}.") for key in attrs)
    ):
        return OPENLLMETRY
    return GENAI


def _adapter(span: SpanRecord) -> tuple[str, _Make] | None:
    """``(kind, make)`` for a span some adapter reads: ``llm`` or ``tool``."""
    url = foreign_openinference.openai_url(span)
    if url is not None:

        def openinference_llm(s: SpanRecord, n: int, r: Redactor, notes: list[str]) -> SpanRecord:
            return foreign_openinference.llm_call(s, n, url, r, notes)

        return k.KIND_LLM, openinference_llm
    if foreign_genai.is_llm(span):
        return k.KIND_LLM, foreign_genai.llm_call
    if foreign_openinference.is_tool(span):
        return k.KIND_TOOL, foreign_openinference.tool_call
    if foreign_genai.is_tool(span):
        return k.KIND_TOOL, foreign_genai.tool_call
    return None


def _innermost(llms: dict[str, object], parent_of: dict[str, str | None]) -> set[str]:
    """LLM spans with an LLM span nested in them (a framework's ``chat`` span above the SDK
    instrumentation's): the inner one is the call, closer to the wire. Each ancestor is visited
    once (a walk stops where an earlier one passed), so deep nesting costs linear time and a
    cycle of parent links ends the walk."""
    outer: set[str] = set()
    above: set[str] = set()  # the spans with an LLM span under them
    for span_id in llms:
        parent = parent_of.get(span_id)
        while parent is not None and parent not in above:
            above.add(parent)
            if parent in llms:
                outer.add(parent)
            parent = parent_of.get(parent)
    return outer


def adopt(spans: Sequence[SpanRecord], redactor: Redactor) -> Adopted | None:
    """The spans of one trace (none of them stepfork's) with every span an adapter reads made
    a call and each local root above one made its run -- a call with no parent gets a run made
    around it; None when the trace holds no such span. Other spans are kept as they are (the
    conversion keeps them as context)."""
    adapters = {s.span_id: a for s in spans if (a := _adapter(s)) is not None}
    if not adapters:
        return None
    parent_of = {s.span_id: s.parent_span_id for s in spans}
    llms: dict[str, object] = {i: a for i, a in adapters.items() if a[0] == k.KIND_LLM}
    for span_id in _innermost(llms, parent_of):
        del adapters[span_id]
    by_id = {s.span_id: s for s in spans}
    genai_calls = sorted(
        (by_id[i] for i, a in adapters.items() if a[1] is foreign_genai.llm_call),
        key=call_order,
    )
    outputs = foreign_genai.stream_outputs(genai_calls)
    for follower in outputs.values():  # logfire's stream span: the output of its request span
        adapters.pop(follower.span_id, None)
    notes: list[str] = []
    made: dict[str, SpanRecord] = {}
    calls = sorted((s for s in spans if s.span_id in adapters), key=call_order)
    for n, span in enumerate(calls, start=1):
        make = adapters[span.span_id][1]
        try:
            if span.span_id in outputs:
                made[span.span_id] = foreign_genai.llm_call(
                    span, n, redactor, notes, output_from=outputs[span.span_id]
                )
            else:
                made[span.span_id] = make(span, n, redactor, notes)
        except Exception as exc:  # one hostile span never stops the rest of the trace
            notes.append(
                f"{where(span, n, redactor)}: not read as a call ({type(exc).__name__}); "
                "kept as context"
            )
    root_of = grouping.local_roots(parent_of)
    runs = {root for i in made if (root := root_of.get(i)) is not None and root not in made}
    # a call that is the trace's root (the agent opened no span of its own) gets a run made
    # around it: its bundle too says where it came from and which tools ran untraced
    taken = set(parent_of)
    around = {i: _run_around(by_id[i], taken) for i in made if by_id[i].parent_span_id is None}
    conventions = list(dict.fromkeys(convention_of(by_id[i]) for i in made))
    untraced = _untraced_tools(list(made.values()))

    def run(span: SpanRecord) -> SpanRecord:
        made_run = run_record(span, redactor, created_by(conventions or [GENAI]))
        if not untraced:
            return made_run
        return replace(
            made_run, attributes={**made_run.attributes, k.IMPORT_UNTRACED_TOOLS: untraced}
        )

    records = []
    for s in spans:
        if s.span_id in around:
            records.append(run(around[s.span_id]))
            records.append(replace(made[s.span_id], parent_span_id=around[s.span_id].span_id))
        elif s.span_id in made:
            records.append(made[s.span_id])
        elif s.span_id in runs:
            records.append(run(s))
        else:
            records.append(s)
    return Adopted(records, notes)


def _run_around(call: SpanRecord, taken: set[str]) -> SpanRecord:
    """The span of the run made around a call that is the trace's root: the call's name, times
    and status, nothing of its content, and a span id of its own -- derived from the call's, so
    the same spans give the same bundle, and none of the trace's (``taken``, which it joins)."""
    n = 0
    while (
        span_id := hashlib.sha256(f"run of {call.span_id} {n}".encode()).hexdigest()[:16]
    ) in taken:
        n += 1
    taken.add(span_id)
    return replace(call, span_id=span_id, kind="INTERNAL", attributes={}, payloads={})


def _untraced_tools(calls: list[SpanRecord]) -> list[str]:
    """The tools the model called that no span of the trace shows running (said by ``stepfork
    show``; replay refuses them in frozen mode, ``live`` with an allowlist may run them)."""
    traced = {s.attributes.get(k.GEN_AI_TOOL_NAME) for s in calls if s.stepfork_kind == k.KIND_TOOL}
    llm_calls = [s for s in calls if s.stepfork_kind == k.KIND_LLM]
    return [name for name in foreign_genai.called_tools(llm_calls) if name not in traced]
