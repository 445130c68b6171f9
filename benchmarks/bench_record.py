"""Per-call cost of recording an ``@trace_tool`` call, as a ratio against a bare OTel SDK span.

What is compared (issue 2, "Performance"): a tool whose input and output are both realistic nested
JSON of about 200 B, 2 KB or 20 KB (flight search results and chat-completions requests; one in ten
holds a bearer token, an API key, a cloud key or a password in a URL), called inside a
``record(...)`` run of ``CALLS_PER_RUN`` calls, against the same number of bare SDK spans in a plain
root span on the same kind of provider. The bare span carries the *same* attributes the recorded
span carried (captured from a real recording, so same count, same keys, same value sizes), passed
when the span starts: the comparison isolates stepfork's own work (binding, canonical JSON,
redaction, hashing, call numbering, the extra span API calls) from the SDK's.

Variants: with the bundle processor attached as ``configure()`` attaches it (real use; the
processor queues each span for its writer thread, which builds and writes the run's bundle as it
goes), with the per-run bundle write amortised over the calls or left out, and with no processor
at all. A second baseline mirrors the boundary's own use of the
span API (six attributes at start, the rest with ``set_attribute``) to show how much of the gap is
SDK call pattern rather than stepfork's work.

Then where the time goes: micro-benchmarks of each step on the same payloads, the naive
alternative (stdlib ``json`` and every redaction regex over every value), how often the redaction
pre-check fires on these payloads, and a cProfile of the 2 KB calls.
"""

from __future__ import annotations

import collections
import cProfile
import hashlib
import inspect
import json
import os
import pstats
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from benchmarks._common import (
    Measurement,
    Recorder,
    fmt_us,
    interleave,
    paired_ratio,
    payload_pool,
    per_call,
    recording,
    scratch_dir,
    table,
    verdict,
)
from stepfork_otel import constants as k
from stepfork_otel import record, trace_tool
from stepfork_otel.config import CONFIG
from stepfork_otel.trace.canonical import canonical_bytes, canonical_json
from stepfork_otel.trace.models import ToolCall, Trace
from stepfork_otel.trace.payload import Payload, capture
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR, Redactor

SIZES = (200, 2_000, 20_000)
#: Issue 22: against a bare SDK span with 8 attributes of 16 chars, in the same run.
TARGETS = {200: 1.7, 2_000: 2.2, 20_000: 6.0}
#: Issue 22: a recorded call at most this many times the floor (the necessary work), same run.
FLOOR_TARGET = 1.3
#: Issue 22: a plain span of the application on a provider with stepfork's processor.
TAX_TARGET = 1.1
CALLS_PER_RUN = 100
_ROOT = str(Path(__file__).resolve().parent.parent) + "/"  # profiled paths shown from here
#: Attributes the boundary passes when it starts the span (the rest, known only when the call
#: returns, it sets with one ``set_attributes``).
_START_KEYS = frozenset(
    {
        k.KIND,
        k.REPLAY_POLICY,
        k.GEN_AI_OPERATION_NAME,
        k.GEN_AI_TOOL_NAME,
        k.OPENINFERENCE_SPAN_KIND,
        k.CALL_SEQ,
        k.INPUT,
        k.INPUT_VALUE,
        k.INPUT_SHA256,
        k.INPUT_SIZE,
        k.INPUT_MIME_TYPE,
    }
)


class _NoRedaction(Redactor):
    """Redaction that costs nothing (and does nothing): only to measure what is left without it."""

    def redact_canonical(self, canonical: str, *, keep_order: bool = False) -> str:
        return canonical


_Plan = tuple[str, dict[str, Any], list[tuple[str, Any]], dict[str, Any]]
#: The issue's baseline span: 8 attributes of 16 characters.
_ATTRS8 = {f"bench.attribute.{i}": "x" * 16 for i in range(8)}


class _FloorWriter:
    """The floor's writer thread, batching as stepfork's does: lines handed over by one
    ``deque.append`` (a C call, no wake-up) and written in the background once a second or
    when drained -- a thread woken for every line would make the floor pay a GIL hand-off
    per call that stepfork's writer does not."""

    def __init__(self, path: Path) -> None:
        self._lines: collections.deque[bytes] = collections.deque()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._wake = threading.Event()
        self._drained = threading.Event()
        self.put = self._lines.append
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            woken = self._wake.wait(timeout=1.0)
            pieces = []
            while self._lines:
                pieces.append(self._lines.popleft())
            if pieces:
                os.write(self._fd, b"\n".join(pieces) + b"\n")
            if woken:
                self._wake.clear()
                self._drained.set()

    def drain(self) -> None:
        self._drained.clear()
        self._wake.set()
        self._drained.wait()


class _Workload:
    """One payload size: the inputs, the outputs, the tool, and the bare-span plans."""

    def __init__(self, recorder: Recorder, size: int, calls: int) -> None:
        self.recorder = recorder
        self.size = size
        self.inputs = payload_pool(size, calls, seed=1)
        self.outputs = payload_pool(size, calls, seed=2)
        by_id = {id(i): o for i, o in zip(self.inputs, self.outputs, strict=True)}
        self.by_id = by_id

        @trace_tool
        def search_flights(request: dict[str, Any]) -> dict[str, Any]:
            return by_id[id(request)]

        self.tool = search_flights
        self.tracer = recorder.provider.get_tracer("bench")
        self.bare_tracer = recorder.bare_provider.get_tracer("bench")
        self.plans = self._capture_plans()
        self.path = scratch_dir() / f"record-{size}.sftrace"
        self.signature = inspect.signature(search_flights.__wrapped__)  # type: ignore[attr-defined]
        self.floor_writer = _FloorWriter(scratch_dir() / f"floor-{size}.jsonl")

    def _capture_plans(self) -> list[_Plan]:
        """Record the calls once (on a capturing provider) to learn their exact attributes."""

        def calls() -> None:
            with record(scratch_dir() / "capture.sftrace"):
                for value in self.inputs:
                    self.tool(value)

        spans = [
            s
            for s in self.recorder.capture_spans(calls)
            if (s.attributes or {}).get(k.KIND) == "tool"
        ]
        if len(spans) != len(self.inputs):
            raise RuntimeError(f"expected {len(self.inputs)} tool spans, got {len(spans)}")
        plans: list[_Plan] = []
        for span in spans:
            attrs = dict(span.attributes or {})
            start = {key: v for key, v in attrs.items() if key in _START_KEYS}
            rest = [(key, v) for key, v in attrs.items() if key not in _START_KEYS]
            plans.append((span.name, start, rest, attrs))
        return plans

    @property
    def attribute_count(self) -> int:
        return len(self.plans[0][3])

    # -- candidates (each returns seconds per call) --------------------------------------------

    def stepfork_in_run(self) -> dict[str, float]:
        self.recorder.use(processors=True)
        tool, inputs = self.tool, self.inputs
        t0 = time.perf_counter()
        with record(self.path):
            t1, c1 = time.perf_counter(), time.thread_time()
            for value in inputs:
                tool(value)
            t2, c2 = time.perf_counter(), time.thread_time()
        t3 = time.perf_counter()
        n = len(inputs)
        return {
            "stepfork": (t2 - t1) / n,
            "stepfork+write": (t3 - t0) / n,
            "stepfork_caller_cpu": (c2 - c1) / n,
        }

    def floor(self) -> float:
        """The necessary work of a recorded call, as cheaply as Python does it: bind the
        arguments, one orjson encode of the input (sorted keys) and one of the output, one RE2
        scan of each with the project's rules (and the redaction itself on a hit), SHA-256 of
        each, an SDK span with 8 attributes of 16 chars, and one JSON line handed to a writer
        thread. What a recorded call costs beyond this is implementation."""
        signature, by_id, redactor = self.signature, self.by_id, DEFAULT_REDACTOR
        tracer, attrs, put = self.bare_tracer, _ATTRS8, self.floor_writer.put
        sort, sha = orjson.OPT_SORT_KEYS, hashlib.sha256
        may, redact = redactor.may_contain_secret, redactor.redact_canonical
        with tracer.start_as_current_span("invoke_agent floor"):
            start = time.perf_counter()
            for value in self.inputs:
                bound = signature.bind(value)
                bound.apply_defaults()
                text_in = orjson.dumps(bound.arguments, option=sort).decode()
                if may(text_in):
                    text_in = redact(text_in)
                text_out = orjson.dumps(by_id[id(value)]).decode()
                if may(text_out):
                    text_out = redact(text_out, keep_order=True)
                sha_in = sha(text_in.encode()).hexdigest()
                sha_out = sha(text_out.encode()).hexdigest()
                with tracer.start_as_current_span("execute_tool floor", attributes=attrs):
                    pass
                put(orjson.dumps({"in": sha_in, "out": sha_out, "i": text_in, "o": text_out}))
            elapsed = time.perf_counter() - start
        self.floor_writer.drain()
        return elapsed / len(self.inputs)

    def _plain8(self, tracer: Any) -> float:
        attrs = _ATTRS8
        with tracer.start_as_current_span("request"):
            start = time.perf_counter()
            for _ in self.inputs:
                with tracer.start_as_current_span("work", attributes=attrs):
                    pass
            return (time.perf_counter() - start) / len(self.inputs)

    def bare8(self) -> float:
        """The issue's baseline: a bare SDK span with 8 attributes of 16 chars, on a provider
        with no processor."""
        return self._plain8(self.bare_tracer)

    def plain8_with_stepfork(self) -> float:
        """The same span of the application (not a boundary, outside any run) on the provider
        that has stepfork's bundle processor attached: the tax on every other span."""
        self.recorder.use(processors=True)
        return self._plain8(self.tracer)

    def stepfork_no_flush(self) -> float:
        """The same run with the processor's background flush off (``background_flush=False``: the
        bundle is still written as the run goes, flushed when it ends)."""
        self.recorder.use(processors=True)
        processor = self.recorder.processor
        tool, inputs = self.tool, self.inputs
        processor.background_flush = False
        try:
            with record(scratch_dir() / f"noflush-{self.size}.sftrace"):
                start = time.perf_counter()
                for value in inputs:
                    tool(value)
                return (time.perf_counter() - start) / len(inputs)
        finally:
            processor.background_flush = True

    def stepfork_free_redaction(self) -> float:
        """The same calls with redaction replaced by nothing: what the rest costs."""
        self.recorder.use(processors=True)
        tool, inputs = self.tool, self.inputs
        previous = CONFIG.settings
        CONFIG.update(redactor=_NoRedaction())
        try:
            with record(scratch_dir() / f"unredacted-{self.size}.sftrace"):
                start = time.perf_counter()
                for value in inputs:
                    tool(value)
                return (time.perf_counter() - start) / len(inputs)
        finally:
            CONFIG.update(redactor=previous.redactor)

    def stepfork_no_processor(self) -> float:
        self.recorder.use(processors=False)
        tool, inputs = self.tool, self.inputs
        try:
            with self.bare_tracer.start_as_current_span("invoke_agent bench"):
                start = time.perf_counter()
                for value in inputs:
                    tool(value)
                return (time.perf_counter() - start) / len(inputs)
        finally:
            self.recorder.use(processors=True)

    def _bare(self, tracer: Any, mirror: bool) -> float:
        by_id, plans, inputs = self.by_id, self.plans, self.inputs
        with tracer.start_as_current_span("invoke_agent bench"):
            start = time.perf_counter()
            if mirror:
                for value, (name, first, rest, _) in zip(inputs, plans, strict=True):
                    with tracer.start_as_current_span(name, attributes=first) as span:
                        by_id[id(value)]
                        span.set_attributes(dict(rest))
            else:
                for value, (name, _, _, attrs) in zip(inputs, plans, strict=True):
                    with tracer.start_as_current_span(name, attributes=attrs):
                        by_id[id(value)]
            return (time.perf_counter() - start) / len(inputs)

    def bare(self) -> float:
        return self._bare(self.tracer, mirror=False)

    def bare_mirror(self) -> float:
        return self._bare(self.tracer, mirror=True)

    def bare_no_processor(self) -> float:
        return self._bare(self.bare_tracer, mirror=False)

    def check_bundle(self) -> None:
        """The measured runs really recorded: the last bundle holds every call, whole."""
        trace = Trace.load(self.path)
        calls = [e for e in trace.events if isinstance(e, ToolCall)]
        if len(calls) != len(self.inputs) or any(c.input is None for c in calls):
            raise RuntimeError(f"bundle {self.path} does not hold the {len(self.inputs)} calls")


def _end_to_end(
    recorder: Recorder, size: int, calls: int, rounds: int
) -> tuple[list[str], str, dict[str, float]]:
    work = _Workload(recorder, size, calls)
    series = interleave(
        [
            ("stepfork_in_run", work.stepfork_in_run),
            ("bare8", work.bare8),
            ("floor", work.floor),
            ("plain8_with_stepfork", work.plain8_with_stepfork),
            ("bare", work.bare),
            ("stepfork_no_flush", work.stepfork_no_flush),
            ("bare_mirror", work.bare_mirror),
            ("stepfork_free_redaction", work.stepfork_free_redaction),
            ("stepfork_no_processor", work.stepfork_no_processor),
            ("bare_no_processor", work.bare_no_processor),
        ],
        rounds,
    )
    work.check_bundle()
    ratio = paired_ratio(series, "stepfork", "bare8")
    whole = paired_ratio(series, "stepfork+write", "bare8")
    of_floor = paired_ratio(series, "stepfork", "floor")
    target = TARGETS.get(size)
    row = [
        f"{size:,} B",
        fmt_us(series["bare8"].median),
        f"{fmt_us(series['floor'].median)} ({paired_ratio(series, 'floor', 'bare8'):.2f}x)",
        f"{fmt_us(series['stepfork'].median)}",
        f"**{ratio:.2f}x** (<= {target}x: {verdict(ratio, target)})" if target else f"{ratio:.2f}x",
        f"**{of_floor:.2f}x** (<= {FLOOR_TARGET}x: {verdict(of_floor, FLOOR_TARGET)})",
        f"{whole:.2f}x ({fmt_us(series['stepfork+write'].median)}; "
        f"{verdict(whole, target) if target else '-'})",
        f"{fmt_us(series['stepfork_caller_cpu'].median)}",
        f"{paired_ratio(series, 'stepfork_no_flush', 'bare8'):.2f}x",
        f"{paired_ratio(series, 'stepfork_free_redaction', 'bare8'):.2f}x",
        f"{paired_ratio(series, 'stepfork_no_processor', 'bare_no_processor'):.2f}x "
        f"({fmt_us(series['stepfork_no_processor'].median)} vs "
        f"{fmt_us(series['bare_no_processor'].median)})",
    ]
    tax = paired_ratio(series, "plain8_with_stepfork", "bare8")
    note = f"**{tax:.2f}x** ({verdict(tax, TAX_TARGET)})"
    parts = {
        name: series[name].median
        for name in (
            "bare8",
            "bare",
            "bare_no_processor",
            "stepfork",
            "stepfork_no_flush",
            "stepfork_no_processor",
            "stepfork_caller_cpu",
        )
    }
    parts["attributes"] = work.attribute_count
    return row, note, parts


# --- where the time goes -----------------------------------------------------------------------


def _naive(value: Any, redactor: Redactor) -> str:
    """Stdlib json with sorted keys, every value walked with every redaction regex, then hashed."""
    redacted = redactor.redact(value)
    text = json.dumps(redacted, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _over(fn: Callable[[Any], object], items: list[Any]) -> Measurement:
    """A measurement of ``fn`` applied to each item, in seconds per item."""

    def work() -> None:
        for item in items:
            fn(item)

    return per_call(work, len(items))


def _bind(fn: Callable[..., Any]) -> Callable[[Any], dict[str, Any]]:
    signature = inspect.signature(fn)

    def bind(value: Any) -> dict[str, Any]:
        bound = signature.bind(value)
        bound.apply_defaults()
        return dict(bound.arguments)

    return bind


def _search_signature(request: dict[str, Any], max_results: int = 5) -> None:
    """The shape of a typical tool signature (one payload argument and one default)."""


def _scrub(value: Any) -> Any:
    """The same payload with the words that fire the pre-check spelled differently, to time the
    pre-check when nothing fires (the "secret-free fast path")."""
    text = canonical_json(value)
    for word, other in (
        ("destination", "dest"),
        ("passenger", "pax"),
        ("max_tokens", "max_len"),
        ("function", "fn"),
        ("duration", "length"),
    ):
        text = text.replace(word, other)
    return orjson.loads(text)


def _writer_side(work: _Workload) -> tuple[Measurement, Measurement]:
    """What the writer thread does per call, timed alone on the calls' real spans: taking the
    queued span (``span_record``), the bundle builder's start and end of the call (its number,
    its events: ``span_events``), the event lines (``encode``, ``commit``) -- and the write of
    those bytes."""
    from stepfork_otel.otel.processor import span_record
    from stepfork_otel.trace.builder import BundleBuilder
    from stepfork_otel.trace.bundle import BundleEncoder

    def calls() -> None:
        with record(scratch_dir() / "writer-side.sftrace"):
            for value in work.inputs:
                work.tool(value)

    spans = [s for s in work.recorder.capture_spans(calls) if s.attributes.get(k.KIND) == "tool"]
    # what the boundary hands over in-process with each span (the writer takes the payloads
    # from there, not from the span, so it hashes nothing)
    handed = [
        {
            key: Payload.from_text(s.attributes[value_key])
            for key, value_key in ((k.INPUT, k.INPUT_VALUE), (k.OUTPUT, k.OUTPUT_VALUE))
        }
        for s in spans
    ]
    first = span_record(spans[0])
    run_id = first.parent_span_id
    encoded: list[bytes] = []

    def convert() -> None:
        builder = BundleBuilder(first.trace_id, run_id, DEFAULT_REDACTOR)
        builder.started(run_id or "", None, k.KIND_RUN)
        encoder = BundleEncoder(Trace(trace_id=first.trace_id))
        encoded.clear()
        for span, payloads in zip(spans, handed, strict=True):
            record = span_record(span, payloads, copy=False)
            builder.started(record.span_id, run_id, k.KIND_TOOL, span)
            done = builder.ended(record)
            assert done is not None
            lines = encoder.encode(done.events)
            encoder.commit(lines)
            encoded.append(lines.data)

    convert()
    sink = os.open(scratch_dir() / "writer-side.bytes", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)

    def write() -> None:
        os.lseek(sink, 0, os.SEEK_SET)
        for data in encoded:
            os.write(sink, data)

    return per_call(convert, len(spans)), per_call(write, len(encoded))


def _handoff(work: _Workload) -> Measurement:
    """The hand-off of one call's payloads, alone: keep input and output, read (a copy, as the
    processor does), release."""
    from stepfork_otel.recording.handoff import PayloadHandoff

    handoff = PayloadHandoff()
    handoff.attach()
    payloads = [capture(v, DEFAULT_REDACTOR) for v in work.inputs]

    def run() -> None:
        for n, payload in enumerate(payloads):
            handoff.keep(n, k.INPUT, payload)
            handoff.keep(n, k.OUTPUT, payload)
            handoff.read(n)
            handoff.release(n)

    return per_call(run, len(payloads))


def _breakdown(
    work: _Workload, calls: int, rounds: int, parts: dict[str, float]
) -> tuple[list[list[str]], str]:
    size = work.size
    redactor = DEFAULT_REDACTOR
    values = payload_pool(size, calls, seed=1)
    texts = [canonical_json(v) for v in values]
    data = [t.encode("utf-8") for t in texts]
    clean = [
        v for v in (_scrub(v) for v in values) if not redactor.may_contain_secret(canonical_json(v))
    ]
    clean_texts = [canonical_json(v) for v in clean]
    bind = _bind(_search_signature)
    convert, write = _writer_side(work)

    steps: list[tuple[str, Measurement]] = [
        ("bind", _over(bind, values)),
        ("canonical", _over(canonical_bytes, values)),
        ("precheck", _over(redactor.may_contain_secret, texts)),
        ("redact", _over(redactor.redact_canonical, texts)),
        ("sha256", _over(lambda d: hashlib.sha256(d).hexdigest(), data)),
        ("capture", _over(lambda v: capture(v, redactor), values)),
        ("naive", _over(lambda v: _naive(v, redactor), values)),
        ("convert", convert),
        ("write", write),
        ("handoff", _handoff(work)),
    ]
    if clean_texts:
        steps.append(("precheck_clean", _over(redactor.may_contain_secret, clean_texts)))
    series = interleave(steps, rounds)
    fired = sum(redactor.may_contain_secret(t) for t in texts)
    needed = sum(redactor.redact_canonical(t) != t for t in texts)
    base = parts["bare8"]

    def line(label: str, value: float, where: str) -> list[str]:
        return [label, fmt_us(value), f"{value / base:.2f}x", where]

    def row(label: str, key: str, where: str, per: int = 1) -> list[str]:
        return line(label, series[key].median * per, where)

    call, own = parts["stepfork"], parts["stepfork_no_processor"]
    span = parts["bare_no_processor"]
    boundary_rest = own - span - series["bind"].median - 2 * series["capture"].median
    caller = "caller"
    rows = [
        line("**the whole `@trace_tool` call** (wall time, in a run)", call, caller),
        line("... of it, CPU time of the calling thread", parts["stepfork_caller_cpu"], caller),
        line("baseline: bare SDK span, 8 attributes of 16 chars", base, "-"),
        line(
            "**span**: the SDK span with stepfork's attributes, no processor",
            span,
            caller,
        ),
        row("**arguments**: `signature.bind` + `apply_defaults`", "bind", caller),
        row("**capture** (canonical JSON + redaction + SHA-256), x2", "capture", caller, 2),
        row("... canonical JSON (orjson), x2", "canonical", caller, 2),
        row("... redaction pre-check (one RE2 scan), x2", "precheck", caller, 2),
        row("... redaction as run (pre-check, then splice or walk), x2", "redact", caller, 2),
        row("... SHA-256, x2", "sha256", caller, 2),
        line(
            "**boundary, the rest** = call without processor - span - arguments - capture "
            "(numbering, context, span API calls, replay check, wrappers)",
            boundary_rest,
            caller,
        ),
        line(
            "**processor + hand-off on the caller's thread** = call - call without processor "
            "(on_start, on_end: the hand-off read, two queue appends)",
            call - own,
            caller,
        ),
        row("... of it, the hand-off alone (keep x2, read, release)", "handoff", caller),
        row(
            "**builder** (the span taken, numbered, its events made and encoded), on the writer "
            "thread",
            "convert",
            "writer",
        ),
        row("**write** (`os.write` of the call's lines), on the writer thread", "write", "writer"),
        row("naive: stdlib json + every regex on every value + SHA-256, x2", "naive", "-", 2),
    ]
    if clean_texts:
        rows.append(
            row("pre-check when nothing fires (scrubbed payloads), x2", "precheck_clean", "-", 2)
        )
    note = f"pre-check fired on {fired} of {len(texts)} payloads; {needed} needed redaction" + (
        f"; {len(clean_texts)} scrubbed payloads fire nothing" if clean_texts else ""
    )
    return rows, note


def _profile(recorder: Recorder, size: int, calls: int) -> str:
    work = _Workload(recorder, size, calls)
    work.recorder.use(processors=True)
    profiler = cProfile.Profile()
    with record(work.path):
        profiler.enable()
        for value in work.inputs:
            work.tool(value)
        profiler.disable()
    stats = pstats.Stats(profiler)
    entries: list[tuple[float, int, str]] = []
    for (filename, line, func), (_, ncalls, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = filename.split("site-packages/")[-1].replace(_ROOT, "")
        entries.append((tottime, ncalls, f"`{where}:{line}({func})`"))
    entries.sort(reverse=True)
    total = sum(e[0] for e in entries)
    rows = [
        [name, f"{ncalls / calls:g}", fmt_us(tottime / calls), f"{100 * tottime / total:.0f} %"]
        for tottime, ncalls, name in entries[:12]
    ]
    return table(["function (own time)", "calls per tool call", "per tool call", "share"], rows)


def run(quick: bool = False) -> str:
    calls = 20 if quick else CALLS_PER_RUN
    rounds = 2 if quick else 15
    lines = [
        "## Recording: per-call cost of `@trace_tool` (bench_record.py)",
        "",
        f"A tool called {calls} times inside one `record(...)` run; input and output both of the "
        "given size (realistic nested JSON: flight search results and chat requests, keys not "
        "sorted, as API responses come, 1 in 10 holding a secret). Baseline (issue 22): a bare "
        "SDK span with 8 attributes of 16 chars on a provider with no processor. Floor: the "
        "necessary work of a recorded call done as cheaply as Python does it (binding, one "
        "orjson encode per payload, one RE2 scan each with the project's rules and the "
        "redaction on a hit, SHA-256 of each, an 8-attribute span, one JSON line handed to a "
        "writer thread). "
        f"Ratios are medians over {rounds} interleaved rounds of the per-round ratio; absolute "
        "times are medians per call.",
        "",
    ]
    rows: list[list[str]] = []
    notes: list[str] = []
    budgets: list[tuple[int, list[list[str]], str]] = []
    with recording() as recorder:
        for size in SIZES:
            row, note, parts = _end_to_end(recorder, size, calls, rounds)
            rows.append(row)
            notes.append(note)
            steps, budget_note = _breakdown(_Workload(recorder, size, calls), calls, rounds, parts)
            budgets.append((size, steps, budget_note))
        lines.append(
            table(
                [
                    "payload",
                    "bare span (8 attrs)",
                    "floor (x bare)",
                    "stepfork call",
                    "x bare span (target)",
                    "x floor (target)",
                    "whole run incl. its end, per call (x bare)",
                    "caller's thread CPU",
                    "background flush off",
                    "if redaction cost nothing",
                    "no processors (vs bare span with the same attributes)",
                ],
                rows,
            )
        )
        lines += [
            "",
            f"{int(parts['attributes'])} attributes per stepfork span. A plain "
            "span of the application (8 attributes, not a boundary, outside any run) on the "
            "provider with stepfork's processor, against the same span without it (target "
            f"<= {TAX_TARGET}x), measured in the rounds of each size: " + " / ".join(notes) + ".",
            "",
            "The bundle is written as the run goes: a call's end queues the ended span for the "
            "writer thread, which converts it to its bundle events and writes them (within 1 s, "
            'the background flush). "whole run": the whole `with record(...)` block (root '
            f"span, the writer finishing every call, trailer, fsync) divided by the {calls} "
            "calls: the writer's work is in it. \"caller's thread CPU\": `time.thread_time()` of "
            "the calling thread over the calls -- what an agent waiting on I/O between calls "
            'pays on its own thread. "if redaction cost nothing": redaction replaced by a '
            'no-op. "no processors": stepfork\'s calls on a provider with no span processor '
            "(the hand-off off), against a bare span with the same attributes.",
            "",
        ]
        for size, steps, budget_note in budgets:
            lines += [
                f"### Per-component budget at {size:,} B",
                "",
                table(["component (per tool call)", "time", "x bare span", "thread"], steps),
                "",
                budget_note + ".",
                "",
            ]
        if not quick:
            lines += [
                "### cProfile of the 2,000 B calls (own time per function, top 12)",
                "",
                "Profiling inflates small functions; read shares, not absolute times.",
                "",
                _profile(recorder, 2_000, calls),
                "",
            ]
    return "\n".join(lines)


if __name__ == "__main__":  # python -m benchmarks.bench_record [--quick]
    import sys

    print(run(quick="--quick" in sys.argv))
