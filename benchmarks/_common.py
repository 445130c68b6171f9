"""Shared tools of the benchmarks: realistic payloads, interleaved timing, a bundle builder.

Machines here are shared and noisy, so no absolute number is trusted on its own: every benchmark
measures its candidate and a baseline in the same process, in interleaved rounds (A, B, A, B, ...),
and reports the median over rounds of the per-round ratio, with the absolute medians beside it.
A noisy neighbour slows a whole round, not one side of it, so per-round ratios cancel most of it.
"""

from __future__ import annotations

import atexit
import gc
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepfork_otel.trace.canonical import canonical_json, model_fingerprint, sha256_hex

# --- payloads ---------------------------------------------------------------------------------

_AIRLINES = [
    ("AF", "Air France"),
    ("BA", "British Airways"),
    ("LH", "Lufthansa"),
    ("U2", "easyJet"),
    ("KL", "KLM"),
    ("IB", "Iberia"),
    ("FR", "Ryanair"),
]
_AIRPORTS = ["LHR", "CDG", "FRA", "AMS", "MAD", "BCN", "FCO", "MUC", "ZRH", "VIE", "DUB", "LIS"]
_WORDS = [
    "the",
    "flight",
    "leaves",
    "from",
    "terminal",
    "two",
    "and",
    "the",
    "gate",
    "closes",
    "thirty",
    "minutes",
    "before",
    "departure",
    "please",
    "check",
    "the",
    "baggage",
    "allowance",
    "for",
    "your",
    "fare",
    "class",
    "before",
    "booking",
    "a",
    "seat",
    "upgrade",
    "is",
    "available",
    "on",
    "request",
    "meals",
    "are",
    "served",
    "on",
    "routes",
    "longer",
    "than",
    "three",
    "hours",
    "the",
    "customer",
    "asked",
    "for",
    "a",
    "window",
    "seat",
    "and",
    "an",
    "aisle",
    "seat",
    "for",
    "the",
    "second",
    "passenger",
    "if",
    "possible",
    "refunds",
    "follow",
    "the",
    "fare",
    "rules",
    "of",
    "the",
    "ticket",
]

#: Secrets of the kinds agents leak in practice (all fake), and where they end up in a payload.
_SECRETS: tuple[tuple[str, str], ...] = (
    ("header", "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZ2VudC0xMjMifQ.c2lnbmF0dXJlLXZhbHVlLXg"),
    ("text", "sk-proj-Xf3kT9qLmN2pR8sV4wY6zA1bC5dE7gH0jKqW"),
    ("text", "AKIAIOSFODNN7EXAMPLE"),
    ("header", "Bearer ghp_16C7e42F292c6912E7710c838347Ae178B4a"),
    ("text", "postgres://booking:hunter2secret@db.internal:5432/bookings"),
)


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _flight(rng: random.Random, n: int, compact: bool) -> dict[str, Any]:
    code, airline = rng.choice(_AIRLINES)
    origin, destination = rng.sample(_AIRPORTS, 2)
    if compact:
        return {
            "flight_id": f"{code}{rng.randint(100, 9999):04d}",
            "price_eur": rng.randint(39, 420),
            "seats_left": rng.randint(0, 30),
        }
    return {
        "flight_id": f"{code}{rng.randint(100, 9999):04d}",
        "airline": airline,
        "origin": origin,
        "destination": destination,
        "departure": f"2025-06-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{n % 60:02d}:00Z",
        "duration_minutes": rng.randint(55, 240),
        "price": {"amount": round(rng.uniform(39, 420), 2), "currency": "EUR"},
        "seats_left": rng.randint(0, 30),
        "stops": rng.randint(0, 1),
        "fare_rules": _sentence(rng, rng.randint(4, 10)),
    }


def _message(rng: random.Random, n: int) -> dict[str, Any]:
    role = ("user", "assistant", "tool")[n % 3]
    if role == "assistant" and rng.random() < 0.5:
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{rng.getrandbits(48):012x}",
                    "type": "function",
                    "function": {
                        "name": "search_flights",
                        "arguments": f'{{"city":"{rng.choice(_AIRPORTS)}","max_results":5}}',
                    },
                }
            ],
        }
    if role == "tool":
        return {"role": "tool", "tool_call_id": f"call_{n:04d}", "content": _sentence(rng, 12)}
    return {"role": role, "content": _sentence(rng, rng.randint(6, 16))}


def _flight_search(rng: random.Random) -> dict[str, Any]:
    return {
        "query": {
            "origin": rng.choice(_AIRPORTS),
            "destination": rng.choice(_AIRPORTS),
            "date": "2025-06-14",
            "passengers": rng.randint(1, 4),
        },
        "results": [],
    }


def _chat(rng: random.Random) -> dict[str, Any]:
    return {
        "model": "gpt-4.1-mini",
        "temperature": 0.2,
        "max_tokens": 512,
        "messages": [{"role": "system", "content": "You book flights for the user."}],
    }


def _plant_secret(value: dict[str, Any], n: int) -> None:
    where, secret = _SECRETS[n % len(_SECRETS)]
    if where == "header":
        value["request"] = {"headers": {"Authorization": secret}}
    elif "messages" in value:
        value["messages"].append({"role": "user", "content": f"use this: {secret}"})
    else:
        value["note"] = f"debug: {secret}"


def _grow(rng: random.Random, value: dict[str, Any], target: int) -> None:
    """Append flights or messages until the canonical size reaches ``target``, then shorten the
    last free-text field so it lands on ``target`` (compact flights have none: a few bytes over)."""
    while len(canonical_json(value).encode()) < target:
        if "results" in value:
            value["results"].append(_flight(rng, len(value["results"]), compact=target < 1000))
        else:
            value["messages"].append(_message(rng, len(value["messages"])))
    items = value["results"] if "results" in value else value["messages"]
    last = items[-1] if len(items) > 1 else {}
    for field in ("fare_rules", "content"):
        text = last.get(field)
        excess = len(canonical_json(value).encode()) - target
        if isinstance(text, str) and excess > 0 and not text.startswith("use this"):
            last[field] = text[: max(8, len(text) - excess)]


def make_payload(size: int, n: int, *, secret: bool, seed: int = 0) -> dict[str, Any]:
    """A realistic nested JSON payload whose canonical JSON is about ``size`` bytes.

    Half the payloads are flight search results, half chat-completions requests. With
    ``secret=True`` a bearer token, API key, cloud key or URL password is planted (in a header or
    in free text), as agents leak them in practice.
    """
    rng = random.Random(seed * 1_000_003 + n * 7919 + size)
    value = _flight_search(rng) if n % 4 < 2 else _chat(rng)
    if secret:
        _plant_secret(value, n)
    _grow(rng, value, size)
    return value


def payload_pool(
    size: int, count: int, *, seed: int = 0, secret_every: int = 10
) -> list[dict[str, Any]]:
    """``count`` distinct payloads of about ``size`` bytes; one in ``secret_every`` holds a secret."""
    return [
        make_payload(size, n, secret=n % secret_every == secret_every - 1, seed=seed)
        for n in range(count)
    ]


# --- timing -----------------------------------------------------------------------------------


@dataclass
class Series:
    """Per-round measurements of one candidate (seconds per unit of work)."""

    name: str
    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values)


Measurement = Callable[[], "float | dict[str, float]"]


def interleave(
    candidates: Sequence[tuple[str, Measurement]], rounds: int, *, warmup: int = 1
) -> dict[str, Series]:
    """Run every candidate once per round, in rotating order; each returns seconds per unit of
    work, or a dict of several such numbers (each becomes a series under its own name).

    Rotating the order inside a round keeps "always second" effects (caches, GC debt) from
    landing on one side. The garbage collector runs between measurements, not inside them.
    """
    series: dict[str, Series] = {}
    for r in range(warmup + rounds):
        shift = r % len(candidates)
        order = list(candidates[shift:]) + list(candidates[:shift])
        for name, fn in order:
            gc.collect()
            result = fn()
            if r < warmup:
                continue
            values = result if isinstance(result, dict) else {name: result}
            for key, value in values.items():
                series.setdefault(key, Series(key, [])).values.append(value)
    return series


def paired_ratio(series: dict[str, Series], name: str, baseline: str) -> float:
    """Median over rounds of ``name / baseline`` measured in the same round."""
    a, b = series[name].values, series[baseline].values
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def ratio_rows(
    series: dict[str, Series],
    baseline: str,
    rows: Sequence[tuple[str, str]],
    *,
    headline: str | None = None,
    fmt: Callable[[float], str] | None = None,
) -> list[list[str]]:
    """Table rows ``[label, median, ratio]`` for ``(label, series key)`` pairs, each ratio the
    per-round one against ``baseline`` (its own row: ``1.00x``); ``headline``: the key whose
    ratio is shown in bold; ``fmt``: how a median is shown (default :func:`fmt_us`)."""
    show = fmt or fmt_us
    out = []
    for label, key in rows:
        ratio = f"{paired_ratio(series, key, baseline):.2f}x" if key != baseline else "1.00x"
        out.append([label, show(series[key].median), f"**{ratio}**" if key == headline else ratio])
    return out


def per_call(
    fn: Callable[[], None], calls: int, clock: Callable[[], float] = time.perf_counter
) -> Callable[[], float]:
    """Wrap ``fn`` (which makes ``calls`` calls) into a measurement in seconds per call;
    ``clock``: wall time by default, ``time.thread_time`` for the CPU time of this thread."""

    def measure() -> float:
        start = clock()
        fn()
        return (clock() - start) / calls

    return measure


def over(
    fn: Callable[[Any], object],
    items: Sequence[Any],
    clock: Callable[[], float] = time.perf_counter,
) -> Callable[[], float]:
    """A measurement of ``fn`` applied to each item, in seconds per item (a step of a
    per-component budget, timed alone on the payloads the whole call works on)."""

    def work() -> None:
        for item in items:
            fn(item)

    return per_call(work, len(items), clock)


def fmt_us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs"


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:,.2f} ms"


def fmt_mb(n_bytes: float) -> str:
    return f"{n_bytes / 1e6:,.1f} MB"


def verdict(value: float, target: float) -> str:
    return "met" if value <= target else "MISSED"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# --- SDK calls against the loopback fake API (examples/fake_llm.py) ----------------------------


def echo_prompt(size: int) -> str:
    """A user message that the loopback fake API answers with a completion of ``size`` bytes
    (it echoes the last user text after ``"You said: "``): prose, as a chat message is."""
    rng = random.Random(size)
    text = ""
    while len(text) < size:
        text += _sentence(rng, 12) + ". "
    return text[: size - len("You said: ")]


def timed_calls(name: str, work: Callable[[], object], calls: int) -> dict[str, float]:
    """Run ``work`` (which makes ``calls`` calls) and return, per call, its wall time as the
    series ``name`` and the CPU time of the whole process as ``name + " cpu"``: every thread's
    -- the SDK's, the loopback server's, a bundle writer's or a span exporter's -- so that work
    an instrumentation moves to a thread of its own is still counted, and a share is one
    subtraction from the uninstrumented call (whose server work is the same)."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return {
        name: (time.perf_counter() - wall) / calls,
        f"{name} cpu": (time.process_time() - cpu) / calls,
    }


def openai_http_library() -> Any:
    """The HTTP library the installed openai sends through: ``httpx2``, or ``httpx`` (1.x)."""
    import importlib

    import openai

    client_class = next(c for c in openai.DefaultHttpxClient.__mro__[1:] if c.__name__ == "Client")
    return importlib.import_module(client_class.__module__.split(".")[0])


def in_memory_openai(base_url: str, body: bytes, headers: dict[str, str]) -> Any:
    """An OpenAI client whose HTTP library answers every request with ``body`` from memory,
    through its ``MockTransport``: the SDK's own work for a call that sends nothing -- what any
    replay of it cannot avoid."""
    import openai

    http = openai_http_library()

    def answer(request: Any) -> Any:
        return http.Response(200, headers=headers, content=body)

    return openai.OpenAI(
        base_url=base_url,
        api_key="sk-bench",
        max_retries=0,
        http_client=openai.DefaultHttpxClient(transport=http.MockTransport(answer)),
    )


# --- scratch space ----------------------------------------------------------------------------

_scratch: Path | None = None


def scratch_dir() -> Path:
    """One temporary folder per process for bundles the benchmarks write (removed at exit)."""
    global _scratch
    if _scratch is None:
        _scratch = Path(tempfile.mkdtemp(prefix="stepfork-bench-"))
        atexit.register(shutil.rmtree, _scratch, True)
    return _scratch


# --- recording set-up -------------------------------------------------------------------------


@dataclass
class Recorder:
    """An SDK provider with the bundle processor attached as ``configure()`` attaches it, and a
    second provider with no processor at all, for the "bare SDK" variant."""

    provider: Any
    processor: Any
    bare_provider: Any

    def use(self, *, processors: bool) -> None:
        """Send stepfork's spans to the provider with (or without) the bundle processor."""
        from stepfork_otel.config import CONFIG
        from stepfork_otel.recording.handoff import HANDOFF

        CONFIG.use_tracer_provider(self.provider if processors else self.bare_provider)
        # with no bundle processor attached nothing listens on the hand-off
        if processors and self._detached:
            HANDOFF.attach()
        elif not processors and not self._detached:
            HANDOFF.detach()
        self._detached = not processors

    def __post_init__(self) -> None:
        self._detached = False

    def capture_spans(self, work: Callable[[], object]) -> list[Any]:
        """The spans stepfork writes while ``work`` runs, captured on a separate provider with an
        in-memory exporter, so that the measured providers keep exactly their own processors."""
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from stepfork_otel.config import CONFIG

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        CONFIG.use_tracer_provider(provider)
        try:
            work()
        finally:
            self.use(processors=True)
            provider.shutdown()
        return list(exporter.get_finished_spans())


@contextmanager
def recording() -> Iterator[Recorder]:
    """Record through private SDK providers; internal errors raise (a benchmark of a recording
    that silently failed would measure nothing). Restores stepfork's settings afterwards."""
    from opentelemetry.sdk.trace import TracerProvider

    from stepfork_otel import _internal, configure
    from stepfork_otel.otel import setup

    previous_raise = _internal.RAISE_INTERNAL_ERRORS
    _internal.RAISE_INTERNAL_ERRORS = True
    provider, bare = TracerProvider(), TracerProvider()
    processor = configure(tracer_provider=provider)
    recorder = Recorder(provider, processor, bare)
    try:
        yield recorder
    finally:
        recorder.use(processors=True)
        setup.reset()
        provider.shutdown()
        bare.shutdown()
        _internal.RAISE_INTERNAL_ERRORS = previous_raise


# --- large bundles ----------------------------------------------------------------------------

_bundles: dict[tuple[int, int], Path] = {}
_ROOT = Path(__file__).resolve().parent.parent


def build_bundle(calls: int, size: int) -> Path:
    """A bundle of ``calls`` recorded calls (half LLM requests, half tool calls, each with its
    outcome), input and output payloads of about ``size`` bytes, redacted as recording redacts
    them, with real fingerprints; built from the models and written with ``Trace.save``.
    Built once per process and size, in the scratch folder."""
    key = (calls, size)
    if key in _bundles:
        return _bundles[key]

    from stepfork_otel.trace.models import LlmRequest, LlmResponse, RunInfo, ToolCall, ToolResult
    from stepfork_otel.trace.models import Trace as TraceModel
    from stepfork_otel.trace.redaction import DEFAULT_REDACTOR

    sha = sha256_hex
    pool = [DEFAULT_REDACTOR.redact(v) for v in payload_pool(size - 24, 400, seed=7)]
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    run_span = "00f067aa0ba902b7"
    model_fp = model_fingerprint("openai", "gpt-4.1-mini", "chat")
    events: list[Any] = []
    t = 1_750_000_000_000_000_000
    for n in range(1, calls + 1):
        call_id, span_id = f"call-{n}", f"{n:016x}"
        inp = canonical_json({**pool[(2 * n) % len(pool)], "request_id": f"req-{n:08d}"})
        out = canonical_json({**pool[(2 * n + 1) % len(pool)], "response_id": f"resp-{n:08d}"})
        common: dict[str, Any] = dict(trace_id=trace_id, span_id=span_id, seq=n)
        common["parent_span_id"] = run_span
        if n % 2:
            events.append(
                LlmRequest(
                    id=call_id,
                    provider="openai",
                    model="gpt-4.1-mini",
                    model_fingerprint=model_fp,
                    input=inp,
                    input_sha256=sha(inp),
                    input_size=len(inp.encode()),
                    time_unix_nano=t,
                    **common,
                )
            )
            events.append(
                LlmResponse(
                    id=f"{call_id}.result",
                    parent_id=call_id,
                    provider="openai",
                    model="gpt-4.1-mini",
                    usage={"input_tokens": 812, "output_tokens": 64},
                    output=out,
                    output_sha256=sha(out),
                    output_size=len(out.encode()),
                    time_unix_nano=t + 900_000,
                    duration_ns=900_000,
                    **common,
                )
            )
        else:
            events.append(
                ToolCall(
                    id=call_id,
                    name="search_flights",
                    input=inp,
                    input_sha256=sha(inp),
                    input_size=len(inp.encode()),
                    time_unix_nano=t,
                    **common,
                )
            )
            events.append(
                ToolResult(
                    id=f"{call_id}.result",
                    parent_id=call_id,
                    name="search_flights",
                    output=out,
                    output_sha256=sha(out),
                    output_size=len(out.encode()),
                    time_unix_nano=t + 400_000,
                    duration_ns=400_000,
                    **common,
                )
            )
        t += 1_000_000
    run_input = canonical_json({"question": "Book the cheapest flight to Paris for two."})
    trace = TraceModel(
        trace_id=trace_id,
        created_by="stepfork_otel benchmarks",
        run=RunInfo(
            name="booking-agent",
            span_id=run_span,
            input=run_input,
            input_sha256=sha(run_input),
            status="ok",
        ),
        events=events,
    )
    path = scratch_dir() / f"bundle-{calls}-{size}.sftrace"
    trace.save(path)
    _bundles[key] = path
    return path


def run_child(mode: str, path: Path, *extra: str) -> dict[str, Any]:
    """Run ``benchmarks._child`` in a fresh interpreter and return what it measured."""
    return run_module("benchmarks._child", mode, str(path), *extra)


def run_module(module: str, *args: str, python: str | None = None) -> dict[str, Any]:
    """``python -m module args`` in a fresh interpreter (from the project root; ``python``: another
    interpreter than this one); its last line of output is the JSON of what it measured."""
    import json
    import subprocess
    import sys

    result = subprocess.run(
        [python or sys.executable, "-m", module, *args],
        cwd=_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args[:1])} failed: {result.stderr.strip()[-2000:]}")
    measured: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return measured
