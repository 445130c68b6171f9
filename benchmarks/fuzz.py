"""The fuzz campaign: mutated golden bundles and collector files fed to everything that reads them.

``python -m benchmarks.fuzz [--bundles N] [--otlp N] [--seed S] [--output PATH]`` (defaults:
20,000 bundle mutants, 5,000 OTLP mutants, seed 13, ``benchmarks/FUZZ_RESULTS.md``). The same
mutators and checks run, bounded, in the normal test suite (``tests/test_fuzz.py``, hypothesis).

Every bundle mutant (of the golden bundles, and of a bundle cut short as a killed process leaves
it) is written to a file (a third of them gzipped) and given to what a user runs:
``load_trace`` and ``verify_integrity``, ``stepfork validate``'s check, ``stepfork show``'s tree,
and a frozen replay of the golden agent that recorded it. Every OTLP mutant goes through
``iter_traces_from_otlp_json``; each bundle it yields is saved and loaded back (an imported run
that cannot be written, or written and not read, is a failure).

A case ends in one of:

* ``ok`` -- read (and replayed) without an error;
* ``typed`` -- a :class:`BundleError`, :class:`OtlpImportError` or replay error, one line;
* ``agent`` -- the golden agent's own code raised on a value the mutant fed it (its bug to
  have, not stepfork's: the innermost frame is outside the package);
* ``untyped`` -- anything else raised from inside ``stepfork_otel``, or a typed error whose
  message is not one line: the failures this campaign exists to find;
* ``hang`` -- a case that ran past :data:`CASE_SECONDS` (``SIGALRM`` interrupts it).

Mutations, chosen at random per case (deterministic from the seed): byte-level (flip, delete,
duplicate, insert a hostile token, truncate, swap or drop lines, CRLF), and JSON-aware (a value
anywhere in a line replaced by another type, a huge or 20-digit number, a deep nest, a string with
line breaks or control characters; a key dropped), after which half the bundle mutants get every
fingerprint, size and the end line's ``lines_sha256`` recomputed -- the way a hostile edit gets
past integrity checks into replay. Plus a few built inputs: gzip bombs, very long lines, deep
nests, FIFOs and device files.

``tests/golden/dinner_lisbon.otlp.jsonl`` is the golden agent's Lisbon run as the collector's
file exporter writes it (``python -m benchmarks.fuzz --write-otlp-golden`` regenerates it).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import io
import json
import os
import random
import resource
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
GOLDEN = TESTS / "golden"
OTLP_GOLDEN = GOLDEN / "dinner_lisbon.otlp.jsonl"
for _path in (ROOT, TESTS):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import golden_agent  # noqa: E402

from stepfork_otel.cli import show_cmd, validate_cmd  # noqa: E402
from stepfork_otel.cli._common import Style  # noqa: E402
from stepfork_otel.replay.errors import ReplayError  # noqa: E402
from stepfork_otel.replay.session import ReplaySession  # noqa: E402
from stepfork_otel.trace.bundle import load_trace, save_trace  # noqa: E402
from stepfork_otel.trace.checks import verify_integrity  # noqa: E402
from stepfork_otel.trace.errors import BundleError  # noqa: E402
from stepfork_otel.trace.otlp import (  # noqa: E402
    ImportReport,
    OtlpImportError,
    iter_traces_from_otlp_json,
)

#: Seconds one case may take before it counts as a hang.
CASE_SECONDS = 20.0
TYPED = (BundleError, OtlpImportError, ReplayError)
PACKAGE = str(ROOT / "stepfork_otel")
OUTCOMES = ("ok", "typed", "agent", "untyped", "hang")

GOLDEN_BUNDLES = {
    "dinner_lisbon.sftrace": (golden_agent.run_dinner_agent, golden_agent.LISBON),
    "dinner_porto_failure.sftrace": (golden_agent.run_dinner_agent, golden_agent.PORTO),
    "dinner_lisbon_async.sftrace": (golden_agent.run_dinner_agent_async, golden_agent.LISBON),
    "dinner_dated.sftrace": (golden_agent.run_dated_agent, golden_agent.LISBON),
    "legacy_no_fingerprints.sftrace": (golden_agent.run_dinner_agent, golden_agent.LISBON),
    "missing_result.sftrace": (golden_agent.run_dinner_agent, golden_agent.LISBON),
    # a run written as it goes, cut just before its end: no trailer
    # (--write-cut-golden)
    "dinner_lisbon_cut.sftrace": (golden_agent.run_dinner_agent, golden_agent.LISBON),
}

# --- mutations ---------------------------------------------------------------------------------

_TOKENS = [
    b"\n", b"\r", b"\r\n", b"\x00", b"\xff", b"\xef\xbb\xbf", b'"', b"\\", b"{", b"}", b"[", b"]",
    b",", b":", b"null", b"true", b"-0", b"1e400", b"NaN", b"12345678901234567890",
    b"18446744073709551616", b'{"end":"sftrace","events":0}', b'{"type":"tool_call"}',
    b'{"input":', b'{"output":', b"\xe2\x80\xa8", b"\xed\xa0\x80", b"[" * 300, b"{}" * 50,
]  # fmt: skip


def _nasty_value(rng: random.Random) -> Any:
    choice = rng.randrange(16)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.choice([0, -1, 1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**20])
    if choice == 3:
        return rng.choice([0.5, -0.0, 1e308, 5e-324])
    if choice == 4:
        return ""
    if choice == 5:
        return "x" * rng.choice([1, 80, 1000, 100_000])
    if choice == 6:
        return rng.choice(["a\nb", "\r", "\x00", "\u2028", "tool_call", "call-1", "ok", "error"])
    if choice == 7:
        return []
    if choice == 8:
        return {}
    if choice == 9:
        return [rng.choice([1, "a", None])] * rng.randrange(1, 5)
    if choice == 10:
        return {"a": 1, "stringValue": "x", "intValue": "7"}
    if choice == 11:
        return _Deep(rng.choice([50, 253, 254, 255, 256, 400, 1000, 3000]))
    if choice == 12:
        return _Raw(rng.choice([b"12345678901234567890", b"-99999999999999999999", b"1" * 50]))
    if choice == 13:
        return "0" * 32 if rng.random() < 0.5 else "0" * 16
    if choice == 14:
        return rng.choice(["llm_request", "tool_result", "error", "llm_response", "sftrace"])
    return rng.choice([[1], {"code": 2}, "SPAN_KIND_CLIENT", 3])


@dataclass(frozen=True)
class _Deep:
    depth: int


@dataclass(frozen=True)
class _Raw:
    text: bytes


def _dumps(value: Any) -> bytes:
    """JSON for values orjson cannot write (big integers, deep nests: spliced in as text)."""
    splices: list[bytes] = []

    def walk(item: Any) -> Any:
        if isinstance(item, _Deep):
            splices.append(b"[" * item.depth + b"12345678901234567890" + b"]" * item.depth)
            return f"\x00SPLICE{len(splices) - 1}\x00"
        if isinstance(item, _Raw):
            splices.append(item.text)
            return f"\x00SPLICE{len(splices) - 1}\x00"
        if isinstance(item, dict):
            return {k: walk(v) for k, v in item.items()}
        if isinstance(item, list):
            return [walk(v) for v in item]
        return item

    text = json.dumps(walk(value), separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )
    for n, splice in enumerate(splices):
        text = text.replace(f'"\\u0000SPLICE{n}\\u0000"'.encode(), splice)
    return text


def _random_path(value: Any, rng: random.Random) -> list[Any]:
    path: list[Any] = []
    while isinstance(value, (dict, list)) and value and rng.random() < 0.8:
        key = rng.choice(list(value)) if isinstance(value, dict) else rng.randrange(len(value))
        path.append(key)
        value = value[key]
    return path


def _mutate_json(value: Any, rng: random.Random) -> Any:
    path = _random_path(value, rng)
    if not path:
        return _nasty_value(rng)
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and rng.random() < 0.2:
        del parent[path[-1]]
    elif isinstance(parent, dict) and rng.random() < 0.1:
        parent[rng.choice(["extra", "type", "id", "parent_id", "input", "output"])] = _nasty_value(
            rng
        )
    else:
        parent[path[-1]] = _nasty_value(rng)
    return value


def _mutate_line_json(lines: list[bytes], rng: random.Random) -> None:
    n = rng.randrange(len(lines))
    try:
        lines[n] = _dumps(_mutate_json(json.loads(lines[n]), rng))
    except (ValueError, RecursionError):
        return


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One to three byte-level edits of ``data``."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        if not out:
            out += rng.choice(_TOKENS)
            continue
        op = rng.randrange(9)
        at = rng.randrange(len(out))
        if op == 0:
            out[at] ^= 1 << rng.randrange(8)
        elif op == 1:
            out[at] = rng.randrange(256)
        elif op == 2:
            del out[at : at + rng.randint(1, 64)]
        elif op == 3:
            out[at:at] = rng.choice(_TOKENS)
        elif op == 4:
            end = min(len(out), at + rng.randint(1, 400))
            out[at:at] = out[at:end]
        elif op == 5:
            del out[at:]
        elif op == 6:
            out = bytearray(bytes(out).replace(b"\n", b"\r\n", rng.randint(1, 5)))
        else:
            lines = bytes(out).split(b"\n")
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            if op == 7:
                lines[i], lines[j] = lines[j], lines[i]
            else:
                del lines[i]
            out = bytearray(b"\n".join(lines))
    return bytes(out)


def refingerprint(data: bytes) -> bytes:
    """Every payload's SHA-256 and size, and the end line's ``lines_sha256`` and event count,
    recomputed for whatever the lines now hold (``docs/bundle-format.md``): the hostile edit
    that passes integrity checks. Lines that are not JSON are left as they are."""
    lines = data.split(b"\n")
    trailing = lines and lines[-1] == b""
    if trailing:
        lines.pop()
    parsed: list[Any] = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except (ValueError, RecursionError):
            parsed.append(None)
    owner: int | None = None
    for n, value in enumerate(parsed):
        if not isinstance(value, dict):
            continue
        if n == 0 or "type" in value:
            owner = n
            continue
        key = "input" if lines[n].startswith(b'{"input":') else None
        key = key or ("output" if lines[n].startswith(b'{"output":') else None)
        if key is None or owner is None or not lines[n].endswith(b"}"):
            continue
        text = lines[n][len(key) + 4 : -1]
        target = parsed[owner]
        if owner == 0 and isinstance(target.get("run"), dict):
            target = target["run"]
        if isinstance(target, dict):
            target[f"{key}_sha256"] = hashlib.sha256(text).hexdigest()
            if owner != 0:
                target[f"{key}_size"] = len(text)
        if owner != 0:
            owner = None  # (one payload line per event)
    payload_map = []
    digest = hashlib.sha256()
    events = 0
    for n, value in enumerate(parsed):
        if n == 0 and isinstance(value, dict):
            lines[0] = _dumps(value)
            digest.update(lines[0] + b"\n")
            run = value.get("run") if isinstance(value.get("run"), dict) else {}
            for key in ("input", "output"):
                has = any(line.startswith(b'{"' + key.encode() + b'":') for line in lines[1:3])
                payload_map.append(key[0].encode() if has and key not in run else b"-")
        elif isinstance(value, dict) and "type" in value:
            lines[n] = _dumps(value)
            digest.update(lines[n] + b"\n")
            events += 1
            follows = lines[n + 1][:10] if n + 1 < len(lines) else b""
            payload_map.append(
                b"i" if follows.startswith(b'{"input":') else
                b"o" if follows.startswith(b'{"output":') else b"-"
            )  # fmt: skip
        elif isinstance(value, dict) and "end" in value:
            digest.update(b"".join(payload_map))
            value["lines_sha256"] = digest.hexdigest()
            value["events"] = events
            lines[n] = _dumps(value)
    return b"\n".join(lines) + (b"\n" if trailing else b"")


def bundle_mutant(golden: bytes, rng: random.Random) -> tuple[bytes, bool]:
    """(bundle bytes, gzipped) mutated from ``golden``."""
    lines = golden.rstrip(b"\n").split(b"\n")
    if rng.random() < 0.6:
        for _ in range(rng.randint(1, 3)):
            _mutate_line_json(lines, rng)
        data = b"\n".join(lines) + b"\n"
    else:
        data = golden
    if rng.random() < 0.5:
        data = mutate_bytes(data, rng)
    if rng.random() < 0.5:
        with contextlib.suppress(RecursionError):  # (a line too deep for the stdlib to rewrite)
            data = refingerprint(data)
    compressed = rng.random() < 0.3
    if compressed:
        data = gzip.compress(data, compresslevel=1, mtime=0)
        if rng.random() < 0.3:
            data = mutate_bytes(data, rng)
    return data, compressed


def _mutate_span(data: Any, rng: random.Random) -> bytes:
    spans = data["resourceSpans"][0]["scopeSpans"][0]["spans"]
    span = rng.choice(spans)
    if rng.random() < 0.5 and span.get("attributes"):
        attribute = rng.choice(span["attributes"])
        attribute["value"] = _mutate_json(attribute["value"], rng)
    elif rng.random() < 0.2:
        spans.append(json.loads(json.dumps(span)))  # exported twice
    else:
        _mutate_json(data if rng.random() < 0.2 else span, rng)
    return _dumps(data)


def otlp_mutant(golden: bytes, rng: random.Random) -> tuple[bytes, bool]:
    """(OTLP JSON Lines bytes, gzipped) mutated from ``golden``: spans changed field by field
    (``_mutate_json`` on one span or one attribute value), lines reordered, bytes edited."""
    lines = golden.rstrip(b"\n").split(b"\n")
    for _ in range(rng.randint(1, 3)):
        n = rng.randrange(len(lines))
        try:
            lines[n] = _mutate_span(json.loads(lines[n]), rng)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
            continue  # (a line an earlier edit left unreadable or too deep to edit again)
    if rng.random() < 0.3:
        rng.shuffle(lines)
    out = b"\n".join(lines) + b"\n"
    if rng.random() < 0.4:
        out = mutate_bytes(out, rng)
    compressed = rng.random() < 0.25
    if compressed:
        out = gzip.compress(out, compresslevel=1, mtime=0)
        if rng.random() < 0.4:
            out = mutate_bytes(out, rng) if rng.random() < 0.5 else out[: rng.randrange(len(out))]
    return out, compressed


# --- checks ------------------------------------------------------------------------------------


class Hang(BaseException):
    """Raised by the alarm in a case that ran past its time."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def ring(signum: int, frame: FrameType | None) -> None:
        raise Hang

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Outcome:
    kind: str
    detail: str = ""


def _innermost_file(tb: TracebackType | None) -> str:
    last = ""
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last


def _classify(exc: BaseException) -> Outcome:
    if isinstance(exc, Hang):
        return Outcome("hang")
    if isinstance(exc, TYPED):
        message = str(exc)
        # (a replay error's diagnostics span lines on purpose: expected vs actual)
        if isinstance(exc, (BundleError, OtlpImportError)) and (
            "\n" in message or "\r" in message or len(message) > 2000
        ):
            return Outcome("untyped", f"{type(exc).__name__} message not one short line")
        return Outcome("typed", type(exc).__name__)
    where = _innermost_file(exc.__traceback__)
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f.filename.startswith(PACKAGE)]
    detail = f"{type(exc).__name__}: {str(exc)[:160]}"
    if ours:
        detail += f" at {Path(ours[-1].filename).name}:{ours[-1].lineno}"
    if isinstance(exc, (MemoryError, RecursionError)):
        return Outcome("untyped", detail)
    if where.startswith(PACKAGE):
        # the boundary calling the user's function with the agent's own arguments (a wrong
        # call raises there, as it would undecorated) is the agent's error, not stepfork's
        if frames and "func(*args, **kwargs)" in (frames[-1].line or ""):
            return Outcome("agent", detail)
        return Outcome("untyped", detail)
    if ours and not any(f.filename == golden_agent.__file__ for f in frames):
        return Outcome("untyped", detail)  # raised by a library stepfork called
    return Outcome("agent", detail)


def check_bundle(path: Path, agent: Callable[..., Any], question: str) -> Outcome:
    """Everything a user does with a bundle file: load and verify it, validate it, show it,
    replay the agent that recorded it."""
    try:
        with time_limit(CASE_SECONDS):
            with contextlib.suppress(*TYPED):
                validate_cmd.check(str(path), True)
            trace = load_trace(path)
            verify_integrity(trace)
            style = Style(io.StringIO())
            show_cmd.run_lines(trace, style, False)
            show_cmd.call_tree(show_cmd.call_rows(trace, True), style, True)
            with ReplaySession.from_trace(trace):
                result = agent(question)
                if hasattr(result, "__await__"):
                    import asyncio

                    asyncio.run(result)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        return _classify(exc)
    return Outcome("ok")


def check_otlp(path: Path, out_dir: Path) -> Outcome:
    """Import a collector file; every bundle it yields must save and load back."""
    try:
        with time_limit(CASE_SECONDS):
            for n, trace in enumerate(iter_traces_from_otlp_json(path, report=ImportReport())):
                saved = save_trace(trace, out_dir / f"{n}.sftrace")
                try:
                    load_trace(saved)
                except BundleError as exc:
                    return Outcome("untyped", f"an imported bundle does not load: {exc}")
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        return _classify(exc)
    return Outcome("ok")


# --- built hostile inputs ----------------------------------------------------------------------


def built_bundle_cases(directory: Path) -> Iterator[tuple[str, Path]]:
    """Inputs a byte mutator would not make: bombs, long lines, deep nests, special files."""
    golden = (GOLDEN / "dinner_lisbon.sftrace").read_bytes()
    head = golden.split(b"\n", 1)[0] + b"\n"
    rest = golden.split(b"\n", 1)[1]
    made = {
        "gzip-bomb.sftrace.gz": gzip.compress(head + b" " * 200_000_000, compresslevel=9),
        "one-long-line.sftrace.gz": gzip.compress(b"{" + b"0" * 300_000_000, compresslevel=9),
        "deep-header.sftrace": b'{"format":"sftrace","x":' + b"[" * 300 + b"]" * 300 + b"}\n"
        + rest,
        "deep-payload.sftrace": golden.replace(b'{"input":{"city"', b'{"input":' + b"[" * 5000, 1),
    }  # fmt: skip
    for name, data in made.items():
        path = directory / name
        path.write_bytes(data)
        yield name, path
    zero = directory / "dev-zero.sftrace"
    zero.symlink_to("/dev/zero")
    yield "symlink to /dev/zero", zero
    fifo = directory / "fifo.sftrace"
    os.mkfifo(fifo)
    yield "FIFO", fifo


# --- the campaign ------------------------------------------------------------------------------


@dataclass
class Tally:
    cases: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    typed: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, label: str, outcome: Outcome) -> None:
        self.cases += 1
        self.outcomes[outcome.kind] += 1
        if outcome.kind == "typed":
            self.typed[outcome.detail] += 1
        if outcome.kind in ("untyped", "hang") and len(self.failures) < 50:
            self.failures.append(f"{label}: {outcome.kind} {outcome.detail}")


def run_bundles(count: int, seed: int, work: Path) -> Tally:
    tally = Tally()
    goldens = {name: (GOLDEN / name).read_bytes() for name in GOLDEN_BUNDLES}
    names = sorted(goldens)
    rng = random.Random(seed)
    start = time.perf_counter()
    for name, path in built_bundle_cases(work):
        agent, question = GOLDEN_BUNDLES["dinner_lisbon.sftrace"]
        tally.add(f"built {name}", check_bundle(path, agent, question))
    for n in range(count):
        name = names[n % len(names)]
        data, compressed = bundle_mutant(goldens[name], rng)
        path = work / ("mutant.sftrace.gz" if compressed else "mutant.sftrace")
        path.write_bytes(data)
        agent, question = GOLDEN_BUNDLES[name]
        tally.add(f"bundle {n} ({name})", check_bundle(path, agent, question))
        path.unlink()
    tally.seconds = time.perf_counter() - start
    return tally


def run_otlp(count: int, seed: int, work: Path) -> Tally:
    tally = Tally()
    golden = OTLP_GOLDEN.read_bytes()
    rng = random.Random(seed + 1)
    start = time.perf_counter()
    out_dir = work / "imported"
    out_dir.mkdir()
    for n in range(count):
        data, compressed = otlp_mutant(golden, rng)
        path = work / ("mutant.jsonl.gz" if compressed else "mutant.jsonl")
        path.write_bytes(data)
        tally.add(f"otlp {n}", check_otlp(path, out_dir))
        path.unlink()
        for saved in out_dir.iterdir():
            saved.unlink()
    tally.seconds = time.perf_counter() - start
    return tally


def report(bundles: Tally, otlp: Tally, seed: int, memory_cap: int) -> str:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lines = [
        "# Fuzz campaign: last result",
        "",
        f"`python -m benchmarks.fuzz --bundles {bundles.cases} --otlp {otlp.cases} --seed "
        f"{seed}` (the bundle count includes the built hostile inputs), "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, Python {sys.version.split()[0]}, "
        f"address space capped at {memory_cap >> 20} MiB, {CASE_SECONDS:.0f} s per case.",
        "",
        "| input | cases | ok | typed errors | agent errors | untyped failures | hangs | time |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, tally in (("bundle mutants", bundles), ("OTLP mutants", otlp)):
        o = tally.outcomes
        lines.append(
            f"| {label} | {tally.cases:,} | {o['ok']:,} | {o['typed']:,} | {o['agent']:,} | "
            f"{o['untyped']:,} | {o['hang']:,} | {tally.seconds:.0f} s |"
        )
    lines += ["", f"Peak resident memory of the whole campaign: {peak:.0f} MB.", ""]
    typed = bundles.typed + otlp.typed
    lines.append(
        "Typed errors by class: " + ", ".join(f"{k} {v:,}" for k, v in typed.most_common())
    )
    lines.append("")
    lines.append(
        "*Agent errors* are the golden agent's own code failing on a value a mutant fed it "
        "(e.g. a `KeyError` on a reply without `choices`): the agent's bug to have, raised "
        "outside stepfork_otel."
    )
    failures = bundles.failures + otlp.failures
    if failures:
        lines += ["", "Failures:", "", *(f"- {f}" for f in failures)]
    return "\n".join(lines) + "\n"


def write_otlp_golden(path: Path = OTLP_GOLDEN) -> Path:
    """Record the golden agent's Lisbon run and write its spans as collector lines."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from otlp_receiver import collector_lines

    from stepfork_otel import configure, record

    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with tempfile.TemporaryDirectory() as tmp:
        configure(directory=tmp, tracer_provider=provider)
        with record(Path(tmp) / "run.sftrace", input={"question": golden_agent.LISBON}) as run:
            run.set_output(golden_agent.run_dinner_agent(golden_agent.LISBON))
    path.write_bytes(b"".join(collector_lines(exporter.get_finished_spans(), batch_size=4)))
    provider.shutdown()
    return path


def write_cut_golden(path: Path = GOLDEN / "dinner_lisbon_cut.sftrace") -> Path:
    """Record the golden agent's Lisbon run and keep its bundle as it is just before the run
    ends (what a process killed at that moment leaves: every call, no trailer)."""
    import shutil

    from opentelemetry.sdk.trace import TracerProvider

    from stepfork_otel import configure, record

    provider = TracerProvider()
    with tempfile.TemporaryDirectory() as tmp:
        configure(tracer_provider=provider)
        bundle = Path(tmp) / "dinner_lisbon.sftrace"
        with record(
            bundle, input={"question": golden_agent.LISBON}, name="dinner_agent", flush_interval=0
        ):
            golden_agent.run_dinner_agent(golden_agent.LISBON)
            shutil.copyfile(bundle, path)
    provider.shutdown()
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__)
    parser.add_argument("--bundles", type=int, default=20_000)
    parser.add_argument("--otlp", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--memory-mib", type=int, default=3072, help="address-space cap")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "FUZZ_RESULTS.md")
    parser.add_argument("--write-otlp-golden", action="store_true")
    parser.add_argument("--write-cut-golden", action="store_true")
    args = parser.parse_args(argv)
    if args.write_otlp_golden:
        print(write_otlp_golden())
        return 0
    if args.write_cut_golden:
        print(write_cut_golden())
        return 0
    import logging

    logging.getLogger("stepfork_otel").setLevel(logging.CRITICAL)  # problems are expected here
    cap = args.memory_mib << 20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    with tempfile.TemporaryDirectory(prefix="stepfork-fuzz-") as tmp:
        work = Path(tmp)
        (work / "b").mkdir()
        (work / "o").mkdir()
        bundles = run_bundles(args.bundles, args.seed, work / "b")
        otlp = run_otlp(args.otlp, args.seed, work / "o")
    text = report(bundles, otlp, args.seed, cap)
    args.output.write_text(text)
    print(text)
    failed = bundles.outcomes["untyped"] + bundles.outcomes["hang"]
    failed += otlp.outcomes["untyped"] + otlp.outcomes["hang"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
