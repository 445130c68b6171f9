"""One measurement in a fresh process: ``python -m benchmarks._child MODE BUNDLE`` prints JSON.

Large-bundle measurements run in a child process so that each starts from the same clean heap and
so that its peak resident memory belongs to the work alone. The peak is the kernel's high-water
mark of resident memory: after its imports the child resets the mark to its current RSS (writing
``5`` to ``/proc/self/clear_refs``), reads that RSS (the baseline), does the work, and reads the
mark again (``VmHWM`` in ``/proc/self/status``); the difference is the peak the work added.

Why not ``getrusage(RUSAGE_SELF).ru_maxrss``: on Linux it survives ``fork`` + ``exec``, so a child
of a big parent starts with the parent's peak and a smaller load shows as zero (measured: 125 MB
in a child whose own RSS after its imports is 37 MB). ``ru_maxrss`` is still reported, for
reference. ``tracemalloc`` mode reports the peak of Python allocations instead (slower; it differs
from RSS by allocator overhead and by memory not allocated through Python).
"""

from __future__ import annotations

import gc
import hashlib
import json
import resource
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import orjson

from benchmarks._proc import reset_peak, status
from stepfork_otel.replay.session import ReplaySession
from stepfork_otel.trace.bundle import load_trace
from stepfork_otel.trace.checks import verify_integrity
from stepfork_otel.trace.models import Trace

_PAYLOAD_PREFIXES = (b'{"input":', b'{"output":')


def _payloads(data: bytes) -> list[str]:
    """The payload texts of a bundle: what lies between ``{"input":`` (``{"output":``) and the
    final ``}`` of each payload line (see ``docs/bundle-format.md``)."""
    texts = []
    for line in data.split(b"\n"):
        if line.startswith(_PAYLOAD_PREFIXES):
            texts.append(line[9 if line[2:3] == b"i" else 10 : -1].decode("utf-8"))
    return texts


class _GcClock:
    """Time spent in the cyclic garbage collector, from ``gc.callbacks``. The loader pauses the
    collector while it parses; its first pass over the objects the parse created comes with the
    first allocation after that, which is inside whatever part runs next."""

    def __init__(self) -> None:
        self.total = 0.0
        self._started = 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._started


def _load_verify(path: Path) -> dict[str, Any]:
    clock = _GcClock()
    t0 = time.perf_counter()
    trace = load_trace(path)
    t1 = time.perf_counter()
    problems = verify_integrity(trace)
    t2 = time.perf_counter()
    if problems:
        raise SystemExit(f"integrity problems: {problems[:3]}")
    return {
        "load": t1 - t0,
        "verify": t2 - t1,
        "total": t2 - t0,
        "gc": clock.total,
        "events": len(trace.events),
    }


def _parse_only(path: Path) -> dict[str, Any]:
    """The parts of a load, one by one (read, parse, structure) -- after the full load."""
    from stepfork_otel.trace.bundle import parse_trace
    from stepfork_otel.trace.checks import validate_structure

    clock = _GcClock()
    t0 = time.perf_counter()
    data = path.read_bytes()
    t1 = time.perf_counter()
    trace = parse_trace(data, path)
    t2 = time.perf_counter()
    before = clock.total
    validate_structure(trace)
    t3 = time.perf_counter()
    return {
        "read": t1 - t0,
        "validate_json": t2 - t1,
        "structure": t3 - t2,
        "structure_gc": clock.total - before,
    }


def _read_orjson(path: Path) -> dict[str, Any]:
    """Baseline: read the file and ``orjson.loads`` every line that the loader parses (header,
    events, end line; payload lines are taken verbatim, never parsed)."""
    t0 = time.perf_counter()
    lines = path.read_bytes().split(b"\n")
    parsed = [
        orjson.loads(line) for line in lines if line and not line.startswith(_PAYLOAD_PREFIXES)
    ]
    t1 = time.perf_counter()
    return {"total": t1 - t0, "events": len(parsed) - 2}


def _sha_payloads(path: Path) -> dict[str, Any]:
    texts = _payloads(path.read_bytes())
    gc.collect()
    t0 = time.perf_counter()
    for text in texts:
        hashlib.sha256(text.encode("utf-8")).hexdigest()
    t1 = time.perf_counter()
    return {"total": t1 - t0, "payloads": len(texts), "bytes": sum(len(t) for t in texts)}


def _session_start(path: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    session = ReplaySession.from_trace(path)
    t1 = time.perf_counter()
    return {"total": t1 - t0, "pending": session.pending}


def _session_parts(path: Path) -> dict[str, Any]:
    """Session start split: load, verify, then a session built on the already loaded trace (which
    verifies again, then checks model fingerprints and builds the replay plan)."""
    t0 = time.perf_counter()
    trace: Trace = load_trace(path)
    t1 = time.perf_counter()
    verify_integrity(trace)
    t2 = time.perf_counter()
    ReplaySession.from_trace(trace)
    t3 = time.perf_counter()
    return {"load": t1 - t0, "verify": t2 - t1, "session_on_loaded_trace": t3 - t2}


MODES = {
    "load_verify": _load_verify,
    "parse_only": _parse_only,
    "read_orjson": _read_orjson,
    "sha_payloads": _sha_payloads,
    "session_start": _session_start,
    "session_parts": _session_parts,
}


def main(argv: list[str]) -> None:
    mode, path = argv[0], Path(argv[1])
    use_tracemalloc = len(argv) > 2 and argv[2] == "tracemalloc"
    gc.collect()
    reset = reset_peak()
    baseline = status("VmRSS") if reset else status("VmHWM")
    if use_tracemalloc:
        tracemalloc.start()
    result = MODES[mode](path)
    if use_tracemalloc:
        result["traced_peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    result["rss_baseline"] = baseline
    result["rss_peak_added"] = status("VmHWM") - baseline
    result["peak_reset"] = reset
    result["ru_maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
