"""Reading, writing and checking `.sftrace` bundles.

A bundle is data, never code: loading parses JSON with orjson/pydantic and nothing else -- no
import, no eval, no pickle. Every failure to read one is a :class:`BundleError` whose message
names the file and the reason on one line.

Layout on disk: one JSON object, UTF-8, with the run header first and then one event per line, so
a bundle reads well in a terminal and diffs well in git::

    {"format":"sftrace","format_version":1,"trace_id":"…","complete":true,…,"run":{…},
    "context":[…],
    "events":[
    {"type":"tool_call","id":"call-1",…},
    …
    ]}

Compression is an explicit separate variant: a file whose name ends in ``.gz`` is written gzipped,
and a gzipped file is recognised on load by its magic bytes.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from stepfork_otel.constants import FORMAT_NAME, FORMAT_VERSION
from stepfork_otel.trace.models import (
    TRACE_ADAPTER,
    ErrorEvent,
    LlmRequest,
    LlmResponse,
    ToolCall,
    ToolResult,
    Trace,
)

_GZIP_MAGIC = b"\x1f\x8b"
#: A gzipped bundle may not expand beyond this many bytes (a hostile "zip bomb" stops here).
MAX_DECOMPRESSED_BYTES = 8 * 1024**3


class BundleError(ValueError):
    """A bundle could not be read or is not valid. ``str(error)`` is one line."""

    def __init__(self, path: str | os.PathLike[str] | None, reason: str) -> None:
        self.path = None if path is None else str(path)
        self.reason = reason
        where = self.path or "<trace>"
        super().__init__(f"{where}: {reason}")


class BundleVersionError(BundleError):
    """The bundle was written by a newer stepfork_otel (a newer format version)."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a bundle, tied to the event it concerns (None: the whole bundle)."""

    event_id: str | None
    message: str

    def __str__(self) -> str:
        return f"{self.event_id}: {self.message}" if self.event_id else self.message


def _read(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise BundleError(path, "is a directory, not a .sftrace bundle") from None
    except FileNotFoundError:
        raise BundleError(path, "no such file") from None
    except OSError as exc:
        raise BundleError(path, f"cannot read: {exc.strerror or exc}") from None
    if data[:2] == _GZIP_MAGIC:
        try:
            decompressor = zlib.decompressobj(wbits=31)
            data = decompressor.decompress(data, MAX_DECOMPRESSED_BYTES)
            if decompressor.unconsumed_tail:
                raise BundleError(path, f"expands beyond {MAX_DECOMPRESSED_BYTES} bytes")
        except zlib.error as exc:
            raise BundleError(path, f"corrupt gzip data ({exc})") from None
    return data


def _describe_validation_error(exc: ValidationError) -> str:
    first = exc.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in first["loc"])
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"invalid bundle at {loc or 'top level'}: {first['msg']}{more}"


def parse_trace(data: bytes | str, path: str | os.PathLike[str] | None = None) -> Trace:
    """Validate bundle bytes into a :class:`Trace` (schema only; see :func:`validate_structure`)."""
    try:
        trace = TRACE_ADAPTER.validate_json(data)
    except ValidationError as exc:
        raise _explain(data, path, exc) from None
    if trace.format_version > FORMAT_VERSION:
        raise BundleVersionError(
            path,
            f"format version {trace.format_version} is newer than this stepfork_otel supports "
            f"({FORMAT_VERSION}); upgrade stepfork-otel",
        )
    return trace


def _explain(
    data: bytes | str, path: str | os.PathLike[str] | None, exc: ValidationError
) -> BundleError:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        if not data.strip():
            return BundleError(path, "empty file, not a .sftrace bundle")
        return BundleError(path, f"not valid JSON (truncated or not a bundle): {err}")
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
        return BundleError(path, 'not a .sftrace bundle (no "format": "sftrace" field)')
    version = obj.get("format_version")
    if isinstance(version, int) and version > FORMAT_VERSION:
        return BundleVersionError(
            path,
            f"format version {version} is newer than this stepfork_otel supports "
            f"({FORMAT_VERSION}); upgrade stepfork-otel",
        )
    return BundleError(path, _describe_validation_error(exc))


def load_trace(source: str | os.PathLike[str]) -> Trace:
    """Read, parse and structurally validate a bundle file. Fingerprints are checked separately
    (:func:`verify_integrity`) because replay and ``validate --verify-integrity`` want it, while
    ``show`` does not."""
    path = Path(source)
    trace = parse_trace(_read(path), path)
    problems = validate_structure(trace)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise BundleError(path, f"inconsistent bundle: {problems[0]}{more}")
    return trace


def dump_trace(trace: Trace) -> bytes:
    """The bundle bytes: header first, one event per line (see the module docstring)."""
    head = trace.model_dump(mode="json", exclude={"events"}, exclude_none=True)
    # keep the declared field order but put the large lists last
    context = head.pop("context", [])
    head_bytes = orjson.dumps(head)[:-1]
    parts = [head_bytes, b',\n"context":', orjson.dumps(context), b',\n"events":[\n']
    lines = [orjson.dumps(_event_dict(e)) for e in trace.events]
    parts.append(b",\n".join(lines))
    parts.append(b"\n]}\n")
    return b"".join(parts)


def _event_dict(event: Any) -> dict[str, Any]:
    data: dict[str, Any] = event.model_dump(mode="json", exclude_none=True)
    return {"type": data.pop("type"), "id": data.pop("id"), **data}  # readable: type and id first


def save_trace(trace: Trace, destination: str | os.PathLike[str]) -> Path:
    """Write a bundle atomically: a temporary file in the same folder, then a rename."""
    path = Path(destination)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = dump_trace(trace)
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def validate_structure(trace: Trace) -> list[Problem]:
    """Structural problems: duplicate ids, dangling parents, outcomes without calls, order."""
    problems: list[Problem] = []
    ids: set[str] = set()
    calls: dict[str, ToolCall | LlmRequest] = {}
    outcomes: set[str] = set()
    last_seq = 0
    for event in trace.events:
        if event.id in ids:
            problems.append(Problem(event.id, "duplicate event id"))
        ids.add(event.id)
        if isinstance(event, (ToolCall, LlmRequest)):
            if event.seq <= last_seq:
                problems.append(Problem(event.id, f"call number {event.seq} out of order"))
            last_seq = event.seq
            if event.parent_id is not None and event.parent_id not in calls:
                problems.append(
                    Problem(event.id, f"parent {event.parent_id!r} is not an earlier call")
                )
            calls[event.id] = event
        else:
            parent = calls.get(event.parent_id or "")
            if parent is None:
                problems.append(Problem(event.id, f"outcome of unknown call {event.parent_id!r}"))
                continue
            if event.parent_id in outcomes:
                problems.append(Problem(event.id, f"second outcome for {event.parent_id}"))
            outcomes.add(event.parent_id or "")
            if isinstance(event, ToolResult) and not isinstance(parent, ToolCall):
                problems.append(Problem(event.id, "tool_result paired with a non-tool call"))
            if isinstance(event, LlmResponse) and not isinstance(parent, LlmRequest):
                problems.append(Problem(event.id, "llm_response paired with a non-LLM call"))
    return problems


def missing_payloads(trace: Trace) -> list[Problem]:
    """Calls that replay cannot serve: no outcome recorded, or a payload left off the span."""
    problems: list[Problem] = []
    paired = {
        e.parent_id for e in trace.events if isinstance(e, (ToolResult, LlmResponse, ErrorEvent))
    }
    for event in trace.events:
        if isinstance(event, (ToolCall, LlmRequest)):
            if event.input is None:
                problems.append(
                    Problem(event.id, f"input missing ({event.input_missing or 'not_recorded'})")
                )
            if event.id not in paired and trace.complete:
                problems.append(Problem(event.id, "no recorded result"))
        elif isinstance(event, (ToolResult, LlmResponse)) and event.output is None:
            problems.append(
                Problem(event.id, f"output missing ({event.output_missing or 'not_recorded'})")
            )
    return problems


def _check(
    text: str | None, expected: str | None, what: str, event_id: str | None
) -> Problem | None:
    if text is None or expected is None:
        return None
    actual = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if actual != expected:
        return Problem(
            event_id,
            f"{what} fingerprint mismatch: stored {expected[:12]}…, payload hashes to {actual[:12]}…",
        )
    return None


def verify_integrity(trace: Trace) -> list[Problem]:
    """Every stored fingerprint checked against its stored payload (one SHA-256 each)."""
    checks: list[Problem | None] = [
        _check(trace.run.input, trace.run.input_sha256, "run input", None),
        _check(trace.run.output, trace.run.output_sha256, "run output", None),
    ]
    for event in trace.events:
        if isinstance(event, (ToolCall, LlmRequest)):
            checks.append(_check(event.input, event.input_sha256, "input", event.id))
        else:
            checks.append(_check(event.output, event.output_sha256, "output", event.id))
    return [p for p in checks if p is not None]


def load_any(source: Trace | str | os.PathLike[str] | Any) -> Trace:
    """A :class:`Trace` from a Trace (returned as is) or a path."""
    if isinstance(source, Trace):
        return source
    if isinstance(source, (str, os.PathLike)):
        return load_trace(source)
    raise TypeError(f"expected a path or a Trace, got {type(source).__name__}")
