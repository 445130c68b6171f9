"""Reading, writing and checking `.sftrace` bundles.

A bundle is data, never code: loading parses JSON with orjson/pydantic and nothing else -- no
import, no eval, no pickle. Every failure to read one is a :class:`BundleError` whose message
names the file and the reason on one line.

Layout on disk: JSON Lines, UTF-8, every line one JSON value (see ``docs/bundle-format.md``)::

    {"format":"sftrace","format_version":3,"trace_id":"…",…,"run":{…},"context":[…],…}
    {"input":<canonical JSON of the run input>}          (only if there is one)
    {"output":<canonical JSON of the run output>}        (only if there is one)
    {"type":"llm_request","id":"call-1",…}                (no "input" field)
    {"input":<canonical JSON>}                            (only if the call has an input)
    {"type":"llm_response","id":"call-1.result",…}
    {"output":<canonical JSON>}
    …
    {"end":"sftrace","events":N}

A payload line holds the payload's canonical JSON *verbatim*: the bytes between ``{"input":``
and the final ``}`` are exactly the text the fingerprint hashes. Loading never parses them (it
decodes them straight from the file), and verification is one SHA-256 each. A payload without a
fingerprint is parsed once at load to make sure it is JSON; a fingerprinted one is checked by
:func:`verify_integrity`. The end line tells a truncated bundle from a complete one.

A run recorded with ``record(...)`` is written *as it goes* (:class:`BundleEncoder`):
a header that says ``"complete": false, "trailer": true`` and holds what is known at the start,
each call's events as the call ends (a nested call before the one it is nested in), then a
trailer line ``{"run":{…},"complete":…,"context":[…],…}``, the run's output line and the end
line. Such a file may end anywhere (a killed process): it loads as far as it goes, and its
events are put in the conversion's order (:func:`~stepfork_otel.trace.conversion.order_events`).

Compression is an explicit separate variant: a file whose name ends in ``.gz`` is written gzipped,
and a gzipped file is recognised on load by its magic bytes.

Hostile input: every line is checked for its kind (header, payload, event, end) and its place;
event lines are parsed in pydantic's strict mode (``"seq": "1"`` is an error, not a
number), a gzipped one may not expand beyond :data:`MAX_DECOMPRESSED_BYTES`, nesting is bounded by
the JSON parser, and an error message quotes at most a short, one-line excerpt of the data.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import os
import re
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from io import BytesIO
from itertools import compress, repeat
from operator import add, attrgetter, itemgetter, sub
from pathlib import Path
from typing import Any, NamedTuple

import orjson
from pydantic import ValidationError

from stepfork_otel.constants import BUNDLE_SUFFIX, FORMAT_NAME, FORMAT_VERSION, GZIP_MAGIC
from stepfork_otel.trace.checks import (
    lines_fingerprint,
    note_lines_fingerprint,
    plainly_consistent,
    raise_if_inconsistent,
)
from stepfork_otel.trace.conversion import order_events
from stepfork_otel.trace.errors import BundleError, BundleVersionError, Problem, quote
from stepfork_otel.trace.limits import (
    DEFAULT_LIMITS,
    NotRegularFile,
    ReadLimits,
    json_depth_exceeds,
    open_regular,
    text_depth_exceeds,
)
from stepfork_otel.trace.models import (
    EVENT_ADAPTER,
    TRACE_ADAPTER,
    ErrorEvent,
    Event,
    LlmRequest,
    LlmResponse,
    ToolCall,
    ToolResult,
    Trace,
)

#: A gzipped bundle may not expand beyond this many bytes by default (a hostile "zip bomb" stops
#: here; see :class:`~stepfork_otel.trace.limits.ReadLimits`).
MAX_DECOMPRESSED_BYTES = DEFAULT_LIMITS.max_decompressed_bytes


def bundle_file_name(trace_id: str, tag: str | None = None, *, compressed: bool = False) -> str:
    """``<trace_id>.sftrace`` (``.sftrace.gz`` compressed); a further bundle of the same trace
    (another run, or its calls outside runs) gets ``<trace_id>-<tag>.sftrace``."""
    stem = trace_id if tag is None else f"{trace_id}-{tag}"
    return stem + BUNDLE_SUFFIX + (".gz" if compressed else "")


def bundle_stem(name: str) -> str:
    """A bundle's file name without its suffix (``.sftrace`` or ``.sftrace.gz``)."""
    return name.removesuffix(".gz").removesuffix(BUNDLE_SUFFIX)


def _describe_validation_error(
    exc: ValidationError, prefix: tuple[str | int, ...] | None = None
) -> str:
    """``prefix`` goes before the error's location (an event line validated on its own is
    ``events.<its index in the bundle>``)."""
    first = exc.errors(include_url=False, include_input=False)[0]
    parts = (prefix or ()) + tuple(first["loc"])
    loc = ".".join(quote(p) for p in parts)
    ctx = first.get("ctx") or {}
    if first["type"] == "union_tag_invalid":  # pydantic's message quotes the tag whole
        msg = (
            f"unknown event type '{quote(ctx.get('tag'))}' (expected one of "
            f"{ctx.get('expected_tags')})"
        )
    else:
        msg = first["msg"]
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"invalid bundle at {loc or 'top level'}: {msg[:300]}{more}"


# Bytes read (or decompressed) at a time: few enough that a chunk and its lines are still in the
# processor's cache while they are cut, validated and decoded (the 510 MB benchmark bundle parses
# in 1.05 s with 512 KiB, 1.27 s with 8 MiB).
_CHUNK = 512 << 10
_EVENT = b'{"type":"'
_P_IN = b'{"input":'
_P_OUT = b'{"output":'
_END = b'{"end":'
_RUN = b'{"run":'  # the trailer of a bundle written as its run went
_CAPTURED = b'{"captured":'  # captured reads, as they were made (written as it went)
_KIND_EVENT, _KIND_IN, _KIND_OUT = ord("t"), ord("i"), ord("o")
#: A payload map's byte as 1 for an event with a payload line (I, O), 0 without (t).
_PAYLOADS = bytes.maketrans(b"tIO", b"\x00\x01\x01")
# one byte per line (the line's third byte: t(ype), i(nput), o(utput)); a valid run of lines
_GRAMMAR = re.compile(rb"(?:t[io]?)*")
_ONLY_EVENTS = bytes(1 if i == _KIND_EVENT else 0 for i in range(256))
_ONLY_IN = bytes(1 if i == _KIND_IN else 0 for i in range(256))
_ONLY_OUT = bytes(1 if i == _KIND_OUT else 0 for i in range(256))
_ONLY_IN_EVENTS = bytes(1 if i == ord("I") else 0 for i in range(256))
_ONLY_OUT_EVENTS = bytes(1 if i == ord("O") else 0 for i in range(256))
# What ``lines_sha256`` hashes after the header and event lines: one byte per payload slot (the
# run's input and output, then each event): i(nput line), o(utput line), - (none). The reader has
# it as t(no payload line) / I / O per event.
_PAYLOAD_MAP = bytes.maketrans(b"tIO", b"-io")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# A file that is no bundle at all is told from its first bytes (after any leading whitespace): a
# bundle is UTF-8 JSON Lines whose first line is the header object. A first line this long that
# does not even name the format is not read to its end.
_SNIFF_BYTES = 512 << 10
_FORMAT_FIELD = re.compile(rb'"format"[ \t]*:[ \t]*"sftrace"')
_UTF16_32 = (b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff", b"{\x00", b"\x00{")
_UTF8_BOM = b"\xef\xbb\xbf"
_HEADER_HINT = '{"format":"sftrace",...}'
_STRAY_CR = "a carriage return that does not end a line (line breaks are LF, or CRLF)"
_CALL_CLASSES = frozenset((ToolCall, LlmRequest))
_OUTCOME_CLASSES = frozenset((ToolResult, LlmResponse, ErrorEvent))
_third = itemgetter(2)


def _third_byte(line: bytes) -> bytes:
    """The line's third byte (empty for a shorter line: a damaged file may hold one)."""
    return line[2:3]


_fields_set = attrgetter("__pydantic_fields_set__")
_set_attribute = object.__setattr__
_PAYLOAD_FIELDS = frozenset(("input", "output"))
# One event line at a time: pydantic validates the benchmark bundle's 200,000 event lines ~5 %
# faster one by one than as a JSON array of each chunk's lines, and needs no joined copy of them.
_validate_event = functools.partial(EVENT_ADAPTER.validator.validate_json, strict=True)


def _newer(path: str | os.PathLike[str] | None, version: int) -> BundleVersionError:
    return BundleVersionError(
        path,
        f"format version {version} is newer than this stepfork_otel supports "
        f"({FORMAT_VERSION}); upgrade stepfork-otel",
    )


def parse_trace(
    data: bytes | str,
    path: str | os.PathLike[str] | None = None,
    *,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> Trace:
    """Validate bundle bytes into a :class:`Trace` (schema only; see :func:`validate_structure`)."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return _parse((raw[i : i + _CHUNK] for i in range(0, len(raw), _CHUNK)), path, limits)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a bundle is read or a replay plan is built: a
    large bundle is millions of objects, none of them in cycles, and each collection their
    allocation triggers would walk them all (measured on a 100,000-call bundle: load + verify
    3.6 s -> 2.7 s; building the plan 5x faster)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _parse(
    chunks: Iterable[bytes],
    path: str | os.PathLike[str] | None,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> Trace:
    with gc_paused():
        return _Reader(path, limits).read(chunks)


class _Reader:
    """Reads the lines of a bundle chunk by chunk (see the module docstring for the layout).

    Event lines are validated by pydantic (strict), one by one; payload lines are never parsed:
    the text between ``{"input":`` and the final ``}`` is the stored payload, decoded straight
    from the file's bytes."""

    def __init__(
        self, path: str | os.PathLike[str] | None, limits: ReadLimits = DEFAULT_LIMITS
    ) -> None:
        self.path = path
        self.limits = limits
        self.head: dict[str, Any] | None = None
        self.run_payloads: dict[str, str] = {}
        self.in_run = True  # still reading the run's payload lines (after the header)
        self.events: list[Event] = []
        self.end: Any = None
        self.trailer: dict[str, Any] | None = None  #
        self.as_it_went = False  # see may_end_early
        self.captured_lines: list[Any] = []  # (written as it went: read without trailer)
        self.lineno = 1  # the number of the first line not yet consumed
        self.start: bytes | None = b""  # the file's first bytes, until sniff() has decided
        self.format_named = False  # a long first line was seen to name the format
        self.lines_hash = hashlib.sha256()  # of the header and event lines (lines_sha256)
        self.payload_map: list[bytes] = []  # per batch of event lines: t / I / O per event
        self.fields_sets: dict[frozenset[str], set[str]] = {}

    def error(self, reason: str, line: int | None = None) -> BundleError:
        return BundleError(self.path, reason if line is None else f"line {line}: {reason}")

    def read(self, chunks: Iterable[bytes]) -> Trace:
        """Every line handed on keeps its line break (a last line without one gets one). A chunk
        is cut into lines by ``BytesIO.readlines``, which finds line breaks with ``memchr`` where
        ``bytes.split`` compares byte by byte (reading and cutting the 510 MB benchmark bundle:
        70 ms against 200 ms).

        CRLF line breaks (a bundle checked out by git with ``core.autocrlf``) are read as LF: a
        raw CR cannot occur inside JSON text, so the CR before each LF is only ever part of the
        line break, and dropping it leaves every line -- payload text included -- byte for byte
        what the LF bundle holds. Whether a chunk has a CR at all is one ``memchr`` (13 ms over
        the 510 MB benchmark bundle); only a chunk that has one is rewritten. A CR anywhere else
        is an error."""
        partial: list[bytes] = []  # the start of a line cut by the end of a chunk
        partial_len = 0  # its length (a line longer than the cap is refused as it grows)
        max_line = self.limits.max_line_bytes
        held: bytes | None = None  # an event line kept back until its payload line is seen
        carry = b""  # a CR that ended the previous chunk (its LF may start this one)
        ended = 0  # the line breaks before this chunk (to number the line of a stray CR)
        for chunk in self.until_cut(chunks):
            if not chunk:
                continue
            if carry:
                chunk, carry = carry + chunk, b""
            if self.start is not None:
                self.sniff(chunk, at_eof=False)
            if b"\r" in chunk:
                chunk, carry = self.without_cr(chunk, ended, partial)
            if b"\n" not in chunk:
                if chunk:
                    partial.append(chunk)
                    partial_len += len(chunk)
                    if partial_len > max_line:
                        raise self.line_too_long(ended + 1)
                    if self.head is None and not self.format_named:
                        self.check_first_line(partial)
                continue
            lines = BytesIO(chunk).readlines()
            ended += len(lines)
            if partial:
                if partial_len + len(lines[0]) > max_line + 1:
                    raise self.line_too_long(ended - len(lines) + 1)
                partial.append(lines[0])
                lines[0] = b"".join(partial)
                partial, partial_len = [], 0
            if not lines[-1].endswith(b"\n"):
                ended -= 1
                partial.append(lines.pop())
                partial_len = len(partial[0])
            if max(map(len, lines), default=0) > max_line + 1:
                n = next(i for i, line in enumerate(lines) if len(line) > max_line + 1)
                raise self.line_too_long(ended - len(lines) + n + 1)
            if held is not None:
                lines.insert(0, held)
                held = None
            if lines and lines[-1][2:3] in (b"t", b"r"):  # (the header line starts {"f)
                held = lines.pop()  # an event line, or the trailer: its payload line may follow
            self.feed(lines, at_eof=False)
        if self.start is not None:
            self.sniff(b"", at_eof=True)
        if carry:
            raise self.error(_STRAY_CR, ended + 1)
        lines = [] if held is None else [held]
        if partial:  # a missing final newline is tolerated; the end line tells truncation
            line = b"".join([*partial, b"\n"])
            if not self.may_end_early():  # (written as it went: a line a kill cut short)
                lines.append(line)
        self.feed(lines, at_eof=True)
        return self.finish()

    def until_cut(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """``chunks``; a compressed bundle written as its run went (one gzip stream, flushed at
        each write) that a kill cut short ends where the kill cut it, as an uncompressed one
        does, instead of being refused as truncated gzip data."""
        try:
            yield from chunks
        except TruncatedGzip as exc:
            if not self.may_end_early():
                raise BundleError(self.path, exc.reason) from None

    def line_too_long(self, line: int) -> BundleError:
        return self.error(
            f"longer than {self.limits.max_line_bytes} bytes (the line-length limit)", line
        )

    def sniff(self, chunk: bytes, *, at_eof: bool) -> None:
        """Refuse a file that is no bundle at all (an image, random bytes, UTF-16 text) from its
        first bytes, without reading on: a bundle starts (after any whitespace) with ``{``, the
        header object, in UTF-8."""
        if not self.start:
            chunk = chunk.lstrip(b" \t\r\n")
        start = self.start = (self.start or b"") + chunk[: 8 - len(self.start or b"")]
        if len(start) < 8 and not at_eof:
            return  # (a first chunk this short: only ever in tests, or a tiny file)
        self.start = None
        if not start:
            return  # empty, or only whitespace: the lines say so
        if start.startswith(_UTF8_BOM):
            why = "it starts with a UTF-8 byte-order mark; a bundle is UTF-8 without one"
        elif start.startswith(_UTF16_32):
            why = "UTF-16 or UTF-32 text; a bundle is UTF-8"
        elif start[0] != ord("{"):
            why = f"it starts with {start!r}, not with the header line {_HEADER_HINT}"
        else:
            return
        raise self.error(f"not a .sftrace bundle ({why})")

    def check_first_line(self, partial: list[bytes]) -> None:
        """A first line longer than :data:`_SNIFF_BYTES` must at least name the format there:
        a large file that is no bundle is refused without being read whole."""
        if sum(map(len, partial)) < _SNIFF_BYTES:
            return
        if not _FORMAT_FIELD.search(b"".join(partial), 0, _SNIFF_BYTES):
            raise self.error(
                f"not a .sftrace bundle (its first {_SNIFF_BYTES >> 10} KiB hold no line break "
                f'and no "format": "sftrace")'
            )
        self.format_named = True

    def without_cr(self, chunk: bytes, ended: int, partial: list[bytes]) -> tuple[bytes, bytes]:
        """The chunk with each CRLF made LF, and a CR that ends it kept back for the next chunk
        (its LF may start that one). ``ended``: the line breaks before the chunk; ``partial``:
        the start of the line the chunk continues."""
        carry = b""
        if chunk.endswith(b"\r"):
            chunk, carry = chunk[:-1], b"\r"
        # (cut with memchr and put together again: 3x faster than chunk.replace(b"\r\n", b"\n"),
        # which compares byte by byte)
        chunk = b"".join(
            [line[:-2] + b"\n" if line[-2:] == b"\r\n" else line for line in BytesIO(chunk)]
        )
        stray = chunk.find(b"\r")
        if stray >= 0:
            if self.head is None:  # (binary data has CRs: say first that it is no bundle)
                end = chunk.find(b"\n")
                first = b"".join([*partial, chunk if end < 0 else chunk[:end]])
                if not _FORMAT_FIELD.search(first, 0, _SNIFF_BYTES):
                    raise self.error("not a .sftrace bundle (its first line is no bundle header)")
            raise self.error(_STRAY_CR, ended + chunk.count(b"\n", 0, stray) + 1)
        return chunk, carry

    def feed(self, lines: list[bytes], *, at_eof: bool) -> None:
        if self.head is None:
            if not lines:
                if at_eof:
                    raise self.error("empty file, not a .sftrace bundle")
                return
            self.read_head(lines[0], blank_rest=all(not line.strip() for line in lines))
            del lines[0]
            self.lineno += 1
        if self.in_run:
            taken = 0
            for line in lines:
                if line.startswith(_P_IN) or line.startswith(_P_OUT):
                    self.run_payload(line, self.lineno + taken)
                    taken += 1
                else:
                    self.in_run = False
                    break
            del lines[:taken]
            self.lineno += taken
        if self.end is not None and lines:
            raise self.error("data after the end line", self.lineno)
        end_line: bytes | None = None
        if lines and lines[-1].startswith(_END):
            end_line = lines.pop()
        elif at_eof and self.end is None:
            for n, line in enumerate(lines):
                if line.startswith(_END):
                    raise self.error("data after the end line", self.lineno + n + 1)
            if not self.may_end_early():
                raise self.error('truncated bundle (no end line {"end":"sftrace",...})')
        tail: list[bytes] = []
        if self.trailer is not None:
            tail, lines = lines, []
        elif self.as_it_went:  # the trailer, then the run's output line, then the end line
            for n in range(max(0, len(lines) - 2), len(lines)):
                if lines[n].startswith(_RUN):
                    tail = lines[n:]
                    del lines[n:]
                    break
        if lines and self.as_it_went and b"c" in b"".join(map(_third_byte, lines)):
            lines = self.take_captured(lines)
        if lines:
            self.read_events(lines)
            self.lineno += len(lines)
        if tail:
            self.read_tail(tail)
        if end_line is not None:
            self.read_end(end_line, self.lineno)
            self.lineno += 1

    def may_end_early(self) -> bool:
        """A bundle written as its run went says it is incomplete until its trailer (its header
        says ``complete: false``): it may end anywhere (the process was killed), and loads as
        what it holds."""
        return self.as_it_went

    def take_captured(self, lines: list[bytes]) -> list[bytes]:
        """The lines without the captured-reads lines among them (written as the run
        went), which are kept for a file without a trailer. (Line numbers in later messages
        count them out.)"""
        kept: list[bytes] = []
        for line in lines:
            if not line.startswith(_CAPTURED):
                kept.append(line)
                continue
            try:
                value = orjson.loads(line[:-1])
            except orjson.JSONDecodeError as exc:
                raise self.error(f"captured reads line is not valid JSON: {exc}") from None
            if json_depth_exceeds(value, self.limits.max_json_depth):
                raise self.too_deep(self.lineno)
            items = value.get("captured") if isinstance(value, dict) else None
            if not isinstance(items, list) or len(value) != 1:
                raise self.error('a captured reads line is {"captured":[...]}')
            self.captured_lines.extend(items)
        self.lineno += len(lines) - len(kept)
        return kept

    def read_tail(self, tail: list[bytes]) -> None:
        """The trailer: what only the run's end knew, then the run's output line."""
        if self.trailer is None:
            line = tail[0]
            try:
                trailer = orjson.loads(line[:-1])
            except orjson.JSONDecodeError as exc:
                raise self.error(f"trailer is not valid JSON: {exc}", self.lineno) from None
            if json_depth_exceeds(trailer, self.limits.max_json_depth):
                raise self.too_deep(self.lineno)
            self.check_keys(line, _keys_in(trailer), self.lineno)
            if not (isinstance(trailer, dict) and isinstance(trailer.get("run"), dict)):
                raise self.error('trailer must be an object with a "run" object', self.lineno)
            if "input" in trailer["run"] or "output" in trailer["run"] or "events" in trailer:
                raise self.error("the trailer holds no payloads or events", self.lineno)
            assert self.head is not None
            run = self.head.get("run")
            self.head.update({key: v for key, v in trailer.items() if key != "run"})
            self.head["run"] = {**(run if isinstance(run, dict) else {}), **trailer["run"]}
            self.trailer = trailer
            self.lines_hash.update(line)
            self.lineno += 1
            tail = tail[1:]
        for line in tail:
            if not line.startswith(_P_OUT) or "output" in self.run_payloads:
                raise self.error("after the trailer: the run's output line, then the end line")
            self.run_payload(line, self.lineno)
            self.lineno += 1

    def read_head(self, line: bytes, *, blank_rest: bool) -> None:
        if not line.strip():
            if blank_rest:
                raise self.error("empty file, not a .sftrace bundle")
            raise self.error("blank line (the header must be the first line)", 1)
        try:
            head = orjson.loads(line[:-1])
        except orjson.JSONDecodeError as exc:
            if _FORMAT_FIELD.search(line, 0, _SNIFF_BYTES):  # a header, cut or damaged
                raise self.error(f"not valid JSON (truncated or not a bundle): {exc}") from None
            raise self.error("not a .sftrace bundle (its first line is not JSON)") from None
        if not isinstance(head, dict) or head.get("format") != FORMAT_NAME:
            raise self.error('not a .sftrace bundle (no "format": "sftrace" field)')
        if json_depth_exceeds(head, self.limits.max_json_depth):
            raise self.too_deep(1)
        self.check_keys(line, _keys_in(head), 1)
        version = head.get("format_version")
        if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
            raise _newer(self.path, version)
        if version != FORMAT_VERSION:
            raise BundleVersionError(
                self.path,
                f"format version {version!r} is not {FORMAT_VERSION}, the one format this "
                "stepfork_otel reads (earlier versions were development formats): record it again",
            )
        if "events" in head:
            raise self.error("events belong on their own lines, not in the header", 1)
        run = head.get("run")
        if isinstance(run, dict) and ("input" in run or "output" in run):
            raise self.error("the run's input/output belong on their own lines", 1)
        self.as_it_went = head.pop("trailer", None) is True
        if self.as_it_went and head.get("complete") is not False:
            raise self.error('"trailer": true needs "complete": false', 1)
        self.head = head
        self.lines_hash.update(line)

    def too_deep(self, line: int) -> BundleError:
        return self.error(
            f"JSON nested deeper than {self.limits.max_json_depth} levels (the nesting limit)",
            line,
        )

    def payload_text(self, line: bytes, offset: int, lineno: int) -> str:
        if not line.endswith(b"}\n"):
            raise self.error("a payload line must end with '}'", lineno)
        try:
            return line[offset:-2].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.error(f"payload is not UTF-8 ({exc.reason})", lineno) from None

    def run_payload(self, line: bytes, lineno: int) -> None:
        key = "input" if line[2] == _KIND_IN else "output"
        if key in self.run_payloads or (key == "input" and "output" in self.run_payloads):
            raise self.error(f"a second run {key} (run input, then run output)", lineno)
        text = self.payload_text(line, len(_P_IN) if key == "input" else len(_P_OUT), lineno)
        if text_depth_exceeds(line, self.limits.max_json_depth + 1):
            raise self.too_deep(lineno)
        run = self.head.get("run") if self.head else None
        if not (isinstance(run, dict) and isinstance(run.get(f"{key}_sha256"), str)):
            self.check_json(text, lineno)
        self.run_payloads[key] = text

    def check_json(self, text: str, lineno: int) -> None:
        """A payload without a fingerprint is parsed once (with one, the fingerprint tells)."""
        try:
            orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise self.error(f"payload is not valid JSON: {exc}", lineno) from None

    def read_end(self, line: bytes, lineno: int) -> None:
        try:
            self.end = orjson.loads(line[:-1])
        except orjson.JSONDecodeError as exc:
            raise self.error(f"end line is not valid JSON: {exc}", lineno) from None

    def bad_line(self, lines: list[bytes], why: str) -> BundleError:
        for n, line in enumerate(lines):
            if line.startswith(_END):
                return self.error("data after the end line", self.lineno + n)
            if not line.startswith((_EVENT, _P_IN, _P_OUT)):
                return self.error(
                    "not an event, payload or end line (blank or foreign line?)", self.lineno + n
                )
        return self.error(why)

    def read_events(self, lines: list[bytes]) -> None:
        try:
            kinds = bytes(map(_third, lines))  # one byte per line: t(ype), i(nput), o(utput)
        except IndexError:
            raise self.bad_line(lines, "a line too short to be an event") from None
        if kinds.translate(None, b"tio"):
            raise self.bad_line(lines, "not an event or payload line")
        matched = _GRAMMAR.match(kinds)
        if matched is None or matched.end() != len(kinds):
            at = 0 if matched is None else matched.end()
            raise self.error(
                "a payload line must follow its event line (one payload per event)",
                self.lineno + at,
            )
        event_lines = list(compress(lines, kinds.translate(_ONLY_EVENTS)))
        if not (
            all(map(bytes.startswith, event_lines, repeat(_EVENT)))
            and all(
                map(bytes.startswith, compress(lines, kinds.translate(_ONLY_IN)), repeat(_P_IN))
            )
            and all(
                map(bytes.startswith, compress(lines, kinds.translate(_ONLY_OUT)), repeat(_P_OUT))
            )
        ):
            raise self.bad_line(lines, "malformed line")
        try:
            batch: list[Event] = list(map(_validate_event, event_lines))
        except ValidationError:
            raise self.explain(kinds, event_lines) from None
        # an event line that names its payload (even as null) is refused: it has a line of its own
        if not all(map(_PAYLOAD_FIELDS.isdisjoint, map(_fields_set, batch))):
            n = next(
                i for i, e in enumerate(batch) if not _PAYLOAD_FIELDS.isdisjoint(_fields_set(e))
            )
            raise self.error(
                f"event {quote(batch[n].id)}: its payload belongs on its own line",
                self.event_line(kinds, n),
            )
        # one byte per event: t (no payload line), I (an input line), O (an output line)
        per_event = kinds.replace(b"ti", b"I").replace(b"to", b"O")
        for key, offset, only, only_events, classes in (
            ("input", len(_P_IN), _ONLY_IN, _ONLY_IN_EVENTS, _CALL_CLASSES),
            ("output", len(_P_OUT), _ONLY_OUT, _ONLY_OUT_EVENTS, _OUTCOME_CLASSES),
        ):
            payload_lines = list(compress(lines, kinds.translate(only)))
            if not payload_lines:
                continue
            owners = list(compress(batch, per_event.translate(only_events)))
            if not all(map(classes.__contains__, map(type, owners))):
                owner = next(e for e in owners if type(e) not in classes)
                raise self.error(
                    f"event {quote(owner.id)}: an {key} payload line cannot follow a "
                    f"{owner.type} event",
                    self.event_line(kinds, batch.index(owner)) + 1,
                )
            depth = self.limits.max_json_depth + 1  # (the line's own {"input": ...} is a level)
            if any(map(text_depth_exceeds, payload_lines, repeat(depth))):
                n = next(i for i, ln in enumerate(payload_lines) if text_depth_exceeds(ln, depth))
                raise self.too_deep(self.payload_line(kinds, key, n))
            if not all(map(bytes.endswith, payload_lines, repeat(b"}\n"))):
                n = next(i for i, line in enumerate(payload_lines) if not line.endswith(b"}\n"))
                raise self.error(
                    "a payload line must end with '}'", self.payload_line(kinds, key, n)
                )
            try:
                # (mapped, not a list comprehension: 50 ms less over the benchmark bundle)
                texts = list(map(bytes.decode, map(itemgetter(slice(offset, -2)), payload_lines)))
            except UnicodeDecodeError:
                for n, line in enumerate(payload_lines):
                    self.payload_text(line, offset, self.payload_line(kinds, key, n))
                raise
            sha_key = f"{key}_sha256"
            for n, (event, text) in enumerate(zip(owners, texts, strict=True)):
                if getattr(event, sha_key) is None:
                    self.check_json(text, self.payload_line(kinds, key, n))
                # the models are frozen: the payload is set where validation would have put it
                event.__dict__[key] = text
                event.__pydantic_fields_set__.add(key)
        # Events with the same fields set share one set object: a set per event was 0.29x the
        # file's size in memory (the models are frozen: nothing adds to it after this).
        own = list(map(_fields_set, batch))
        joined = b"".join(event_lines)
        # A key twice (which orjson and pydantic read silently, the last winning): each key is
        # followed by a colon, so when the lines hold no more colons than the events have keys
        # (their fields, less the payloads just set, and the entries of ``usage``, the one
        # nested object) no key can be there twice -- one count in C over the batch. Only the
        # lines of a batch with colons to spare (a colon in a value) are looked at closely.
        keys = sum(map(len, own)) - (len(per_event) - per_event.count(b"t"))
        keys += sum(map(len, filter(None, [e.usage for e in batch if type(e) is LlmResponse])))
        if joined.count(b":") != keys:
            self.check_event_keys(kinds, event_lines, batch, own, per_event)
        ones = list(map(self.fields_sets.setdefault, map(frozenset, own), own))
        for event, one, fields in zip(batch, ones, own, strict=True):
            if one is not fields:
                _set_attribute(event, "__pydantic_fields_set__", one)
        self.events += batch
        self.lines_hash.update(joined)  # (SHA-256 of 89 MB: 42 ms)
        self.payload_map.append(per_event)

    def check_event_keys(
        self,
        kinds: bytes,
        event_lines: list[bytes],
        batch: list[Event],
        own: list[set[str]],
        per_event: bytes,
    ) -> None:
        """The event lines of a batch whose colons outnumber its keys, one by one: a line whose
        colons are its keys and its ``usage`` entries' (the one nested object) holds no key
        twice; any other is parsed again, keeping every key (rare: a colon in a value)."""
        colons = list(map(bytes.count, event_lines, repeat(b":")))
        # colons beyond each line's fields (a payload set on its event is no key of its line)
        spare = list(map(add, map(sub, colons, map(len, own)), per_event.translate(_PAYLOADS)))
        for n in compress(range(len(spare)), spare):  # (in C up to here)
            event = batch[n]
            usage = event.usage if type(event) is LlmResponse else None
            nested = len(usage) if usage else 0
            if spare[n] != nested:
                self.check_keys(
                    event_lines[n], colons[n] - spare[n] + nested, self.event_line(kinds, n)
                )

    def check_keys(self, line: bytes, keys: int, lineno: int) -> None:
        """``keys``: how many keys ``line`` holds once parsed, at every level. No more colons
        than that: no key twice (each is followed by one); else the line is parsed again,
        keeping every key, and the first key held twice is an error."""
        if line.count(b":") <= keys:
            return
        twice = _key_twice(line)
        if twice is not None:
            raise self.error(
                f"the key {_quoted_key(twice)} appears twice in an object (JSON readers "
                "disagree on which one counts: a bundle holds each key once)",
                lineno,
            )

    def event_line(self, kinds: bytes, index: int) -> int:
        """The line number of the ``index``-th event line among ``kinds``."""
        seen = -1
        for n, kind in enumerate(kinds):
            if kind == _KIND_EVENT:
                seen += 1
                if seen == index:
                    return self.lineno + n
        return self.lineno

    def payload_line(self, kinds: bytes, key: str, index: int) -> int:
        want = _KIND_IN if key == "input" else _KIND_OUT
        seen = -1
        for n, kind in enumerate(kinds):
            if kind == want:
                seen += 1
                if seen == index:
                    return self.lineno + n
        return self.lineno

    def explain(self, kinds: bytes, event_lines: list[bytes]) -> BundleError:
        """The first of ``event_lines`` that does not validate, as an error naming its line. The
        lines were validated in one pass that keeps nothing of a failure but the exception, so
        they are validated again one by one (only ever on the way to an error)."""
        for n, line in enumerate(event_lines):
            try:
                _validate_event(line)
            except ValidationError as exc:
                lineno = self.event_line(kinds, n)
                if exc.errors(include_url=False, include_input=False)[0]["type"] == "json_invalid":
                    try:
                        orjson.loads(line[:-1])
                    except orjson.JSONDecodeError as err:
                        return self.error(f"not valid JSON: {err}", lineno)
                where = ("events", len(self.events) + n)
                return self.error(_describe_validation_error(exc, prefix=where), lineno)
        raise AssertionError("a failed validation that passes when repeated")

    def finish(self) -> Trace:
        assert self.head is not None
        count = len(self.events)
        end = self.end
        if end is None and self.may_end_early():  # (cut short: what it holds, incomplete)
            self.head["complete"] = False
            said = self.head.get("incomplete_reason")
            failed = isinstance(said, str) and said.startswith(WRITE_FAILED_REASON)
            self.head["incomplete_reason"] = said if failed else NO_TRAILER_REASON
            self.events = _cut_short(self.events, self.head)
            end = {"end": FORMAT_NAME, "events": len(self.events)}
            if self.captured_lines:  # the reads of the calls kept
                calls = {e.seq for e in self.events if isinstance(e, (ToolCall, LlmRequest))}
                self.head["captured"] = sorted(
                    (
                        r
                        for r in self.captured_lines
                        if not isinstance(r, dict) or r.get("before_call") in calls
                    ),
                    key=lambda r: r.get("index", 0) if isinstance(r, dict) else 0,
                )
        elif not (
            isinstance(end, dict) and end.get("end") == FORMAT_NAME and end.get("events") == count
        ):
            declared = end.get("events") if isinstance(end, dict) else end
            raise self.error(
                f"end line does not match: it declares {quote(declared)} events, found {count}"
            )
        stored = end.get("lines_sha256")
        if stored is not None and not (isinstance(stored, str) and _SHA256_HEX.fullmatch(stored)):
            raise self.error(
                f"end line: lines_sha256 is not a SHA-256 hex digest ({quote(stored)})"
            )
        head = self.head
        if self.run_payloads:
            run = head.get("run", {})
            if isinstance(run, dict):  # (anything else is reported by the validation below)
                head["run"] = {**run, **self.run_payloads}
        try:
            trace = TRACE_ADAPTER.validate_json(orjson.dumps({**head, "events": []}), strict=True)
        except ValidationError as exc:
            raise self.error(_describe_validation_error(exc), 1) from None
        if self.as_it_went and not plainly_consistent(self.events):
            # written as the run went: a call's events come when it ends (nested calls first)
            ordered = order_events(self.events)
            if ordered is not None:
                self.events = ordered
        trace.__dict__["events"] = self.events
        run_map = (b"i" if "input" in self.run_payloads else b"-") + (
            b"o" if "output" in self.run_payloads else b"-"
        )
        self.lines_hash.update(run_map + b"".join(self.payload_map).translate(_PAYLOAD_MAP))
        note_lines_fingerprint(trace, stored, self.lines_hash.hexdigest())
        return trace


def _keys_in(value: Any) -> int:
    """The keys of every object in a parsed JSON value (iterative; its depth is checked)."""
    count = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            count += len(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def _key_twice(line: bytes) -> str | None:
    """The first key an object of ``line`` holds twice (None: none), read by the standard
    library's parser, which hands each object's keys over as they are written. (Only for a
    line already parsed once: valid JSON, its depth bounded.)"""
    twice: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> None:
        if not twice and len({key for key, _ in items}) != len(items):
            seen: set[str] = set()
            twice.append(next(key for key, _ in items if key in seen or seen.add(key)))  # type: ignore[func-returns-value]

    try:
        json.loads(line, object_pairs_hook=pairs)
    except (ValueError, RecursionError):  # (20-digit numbers, say: what orjson read is valid)
        return None
    return twice[0] if twice else None


def _quoted_key(key: str) -> str:
    return orjson.dumps(quote(key)).decode()


def _torn(event: Event) -> bool:
    """An event whose payload line the kill cut off (it names a fingerprint, no reason)."""
    if isinstance(event, (ToolCall, LlmRequest)):
        return event.input is None and event.input_sha256 is not None and not event.input_missing
    if isinstance(event, ErrorEvent):
        return False  # (its output is its message: always there)
    return event.output is None and event.output_sha256 is not None and not event.output_missing


def _cut_short(events: list[Event], head: dict[str, Any]) -> list[Event]:
    """The events of a bundle whose writing stopped mid-way (no end line): the last event is
    left out if the kill cut its payload line off. A call is numbered when it starts and written
    when it ends, so a number missing is a call that had not ended (or was still queued): every
    call that is there is kept -- with concurrent calls, one that returned after a call another
    thread started and had not ended is on disk and stays -- except the calls nested in one that
    is missing (ended while it ran: a replay cannot reach them without it). The reason names
    the missing numbers."""
    while events and _torn(events[-1]):
        events = events[:-1]
    calls = sorted(
        (e for e in events if isinstance(e, (ToolCall, LlmRequest))), key=attrgetter("seq")
    )
    if all(c.seq == n for n, c in enumerate(calls, start=1)):
        return events  # (no hole: nothing to name, nothing nested in a missing call)
    present = {c.seq for c in calls}
    missing = [n for n in range(1, calls[-1].seq) if n not in present]
    ids = {c.id for c in calls}
    dropped: set[str] = set()
    for call in calls:  # (by number: the call a call is nested in comes first)
        if call.parent_id is not None and (call.parent_id not in ids or call.parent_id in dropped):
            dropped.add(call.id)
    named = ", ".join(f"call-{n}" for n in missing[:5]) + (
        f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    )
    reason = (
        f"{head['incomplete_reason']}; {named} {'is' if len(missing) == 1 else 'are'} not in it (not ended, "
        "or ended within the flush interval)"
    )
    if dropped:
        them = "it" if len(missing) == 1 else "them"
        reason += f", so the {len(dropped)} call(s) nested in {them} are left out too"
    head["incomplete_reason"] = reason
    return [e for e in events if e.id not in dropped and e.parent_id not in dropped]


class TruncatedGzip(BundleError):
    """A gzip stream that ends before its end (a bundle written as its run went may)."""


def _file_chunks(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[bytes]:
    try:
        handle = open_regular(path, limits)
    except NotRegularFile as exc:
        if exc.reason.startswith("is a directory"):
            raise BundleError(path, "is a directory, not a .sftrace bundle") from None
        raise BundleError(path, f"{exc.reason}; only regular files are read") from None
    except IsADirectoryError:
        raise BundleError(path, "is a directory, not a .sftrace bundle") from None
    except FileNotFoundError:
        raise BundleError(path, "no such file") from None
    except OSError as exc:
        raise BundleError(path, f"cannot read: {exc.strerror or exc}") from None
    with handle:
        try:
            first = handle.read(max(_CHUNK, len(GZIP_MAGIC)))
        except IsADirectoryError:
            raise BundleError(path, "is a directory, not a .sftrace bundle") from None
        except OSError as exc:
            raise BundleError(path, f"cannot read: {exc.strerror or exc}") from None
        if first.startswith(GZIP_MAGIC):
            yield from _gunzip_chunks(first, handle, path, limits.max_decompressed_bytes)
            return
        chunk = first
        while chunk:
            yield chunk
            chunk = handle.read(_CHUNK)


def _gunzip_chunks(
    first: bytes, handle: Any, path: Path, cap: int = MAX_DECOMPRESSED_BYTES
) -> Iterator[bytes]:
    """Every gzip member, expanded a chunk at a time and at most to ``cap`` bytes in all (a
    hostile "zip bomb" stops there)."""
    room = cap
    decompressor = zlib.decompressobj(wbits=31)
    data = first
    try:
        while True:
            if not data:
                data = handle.read(_CHUNK)
                if not data:
                    if not decompressor.eof:
                        raise TruncatedGzip(path, "truncated gzip data")
                    return
            if decompressor.eof:  # a following gzip member
                decompressor = zlib.decompressobj(wbits=31)
            out = decompressor.decompress(data, min(room + 1, 4 * _CHUNK))
            if len(out) > room:
                raise BundleError(path, f"expands beyond {cap} bytes (the decompressed-size limit)")
            room -= len(out)
            data = decompressor.unconsumed_tail or (
                decompressor.unused_data if decompressor.eof else b""
            )
            if out:
                yield out
    except zlib.error as exc:
        raise BundleError(path, f"corrupt gzip data ({exc})") from None


def read_trace(source: str | os.PathLike[str], *, limits: ReadLimits = DEFAULT_LIMITS) -> Trace:
    """Read and parse a bundle file without the structural checks of :func:`load_trace` (for
    ``stepfork validate``, which lists every problem rather than stopping at the first)."""
    return _read(Path(source), limits)


def schema_problems(
    source: str | os.PathLike[str], *, limits: ReadLimits = DEFAULT_LIMITS
) -> list[Problem]:
    """Every schema problem of a bundle, each tied to its event (None: the header), for
    ``stepfork validate``. Each line is validated on its own, in pydantic's lax mode (as the
    messages say); an empty list means the bundle's trouble is of another kind (see the
    :class:`BundleError` that :func:`read_trace` raises). The file is read a chunk at a time,
    and a file whose first line is not a bundle header is not read on."""
    problems: list[Problem] = []
    last = b""
    try:
        lines = _plain_lines(_file_chunks(Path(source), limits), limits.max_line_bytes)
        for number, line in enumerate(lines, start=1):
            if line:
                last = line
            if number == 1:
                try:
                    head = orjson.loads(line)
                except orjson.JSONDecodeError:
                    return []
                if not (isinstance(head, dict) and head.get("format") == FORMAT_NAME):
                    return []  # not a bundle
                if json_depth_exceeds(head, limits.max_json_depth):
                    return []  # (read_trace says so)
                if head.get("trailer") is True:  # (a layout marker, not a field of the run)
                    line = orjson.dumps({key: v for key, v in head.items() if key != "trailer"})
                try:
                    TRACE_ADAPTER.validate_json(line)
                except ValidationError as exc:
                    problems += [_schema_problem(None, err, None) for err in _errors(exc)]
            elif line.startswith(_EVENT):
                try:
                    EVENT_ADAPTER.validate_json(line)
                except ValidationError as exc:
                    try:
                        raw = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        return []  # not JSON: unreadable, not a schema problem
                    raw_id = raw.get("id") if isinstance(raw, dict) else None
                    event_id = raw_id if isinstance(raw_id, str) else f"line {number}"
                    tag = raw.get("type") if isinstance(raw, dict) else None
                    problems += [_schema_problem(event_id, err, tag) for err in _errors(exc)]
    except BundleError:
        return []
    if not last.startswith(_END):
        return []  # truncated
    return problems


def _plain_lines(chunks: Iterable[bytes], max_line: int) -> Iterator[bytes]:
    """The lines of a file without their line breaks (LF or CRLF), one at a time, for the slow
    paths (the reader cuts lines its own way); no empty line after the last line break. Stops
    with a :class:`BundleError` at a first line that runs past :data:`_SNIFF_BYTES` without
    naming the format."""
    rest: list[bytes] = []
    rest_len = 0
    first = True
    for chunk in chunks:
        pieces = chunk.split(b"\n")
        if len(pieces) == 1:
            rest.append(chunk)
            rest_len += len(chunk)
            if rest_len > max_line:
                raise BundleError(None, "a line longer than the line-length limit")
            if first and sum(map(len, rest)) >= _SNIFF_BYTES:
                if not _FORMAT_FIELD.search(b"".join(rest), 0, _SNIFF_BYTES):
                    raise BundleError(None, "not a .sftrace bundle")
                first = False
            continue
        pieces[0] = b"".join([*rest, pieces[0]])
        rest = [pieces.pop()]
        rest_len = len(rest[0])
        first = False
        for piece in pieces:
            yield piece.removesuffix(b"\r")
    line = b"".join(rest).removesuffix(b"\r")
    if line:
        yield line


def _errors(exc: ValidationError) -> list[Any]:
    return list(exc.errors(include_url=False, include_input=False))


def _schema_problem(event_id: str | None, err: Any, tag: object) -> Problem:
    loc = list(err["loc"])
    if loc and loc[0] == tag:
        loc = loc[1:]  # drop the union tag pydantic puts in the location
    where = ".".join(quote(p) for p in loc) or ("event" if event_id else "header")
    return Problem(event_id, f"{where}: {err['msg']}")


def load_trace(source: str | os.PathLike[str], *, limits: ReadLimits = DEFAULT_LIMITS) -> Trace:
    """Read, parse and structurally validate a bundle file, a chunk at a time. Fingerprints are
    checked separately (:func:`verify_integrity`) because replay and ``validate
    --verify-integrity`` want it, while ``show`` does not. ``limits``: what the read may cost
    (:class:`~stepfork_otel.trace.limits.ReadLimits`; a file beyond them is a
    :class:`BundleError`)."""
    path = Path(source)
    trace = _read(path, limits)
    raise_if_inconsistent(trace, path)
    return trace


def _read(path: Path, limits: ReadLimits) -> Trace:
    return _parse(_file_chunks(path, limits), path, limits)


def dump_trace(trace: Trace, *, trailer: bool = False) -> bytes:
    """The bundle bytes: JSON Lines, see the module docstring. The end line carries
    ``lines_sha256``: SHA-256 of the header line and every event line (each with its LF, in
    order), then the payload map -- one byte per payload slot, the run's input and output and
    then each event: ``i`` / ``o`` when a payload line follows, ``-`` when none. Every field
    outside the payloads is in those lines; the payload texts are covered by their own
    fingerprints, which are in those lines too.

    ``trailer``: the layout of a bundle written as its run goes (what only the run's
    end knows in a trailer; see :class:`BundleEncoder`), events in the order given -- the bytes
    the processor writes for a run whose calls did not overlap."""
    if trailer:
        return b"".join(_trailer_pieces(trace))
    return b"".join(_dump_pieces(trace))


def bundle_fingerprint(trace: Trace) -> str:
    """The lines fingerprint that names ``trace``'s bundle: the one its end line stores (for a
    bundle written without one, what its lines hash to), and for a trace built in memory the one
    :func:`save_trace` would write. A fork's ``forked_from.lines_sha256`` is this of its
    original."""
    seal = lines_fingerprint(trace)
    if seal is not None:
        return seal.stored or seal.actual
    *_, end = _dump_pieces(trace)  # (the end line comes last)
    return str(orjson.loads(end)["lines_sha256"])


def _trailer_pieces(trace: Trace) -> Iterator[bytes]:
    encoder = BundleEncoder(trace)
    yield encoder.head()
    for event in trace.events:
        yield encoder.events((event,))
    yield encoder.trailer(trace)


#: Bytes gathered before one write when a bundle is saved (the bundle is never whole in memory).
_WRITE_BATCH = 1 << 20


def _dump_pieces(trace: Trace) -> Iterator[bytes]:
    """:func:`dump_trace`'s bytes, piece by piece (``save_trace`` writes them as they come: a
    600 MB bundle joined whole, and its encoded payloads beside it, cost twice its size)."""
    head = trace.model_dump(mode="json", exclude={"events"}, exclude_none=True)
    run = head.get("run", {})
    run_input, run_output = run.pop("input", None), run.pop("output", None)
    head_line = orjson.dumps(head) + b"\n"
    yield head_line
    payload_map = [b"-" if run_input is None else b"i", b"-" if run_output is None else b"o"]
    if run_input is not None:
        yield b"".join([_P_IN, _payload_bytes(run_input, "run input"), b"}\n"])
    if run_output is not None:
        yield b"".join([_P_OUT, _payload_bytes(run_output, "run output"), b"}\n"])
    lines_hash = hashlib.sha256(head_line)
    for event in trace.events:
        line, payload, slot = _event_lines(event)
        yield line
        if payload is not None:
            yield payload
        payload_map.append(slot)
        lines_hash.update(line)
    lines_hash.update(b"".join(payload_map))
    end = {"end": FORMAT_NAME, "events": len(trace.events), "lines_sha256": lines_hash.hexdigest()}
    yield orjson.dumps(end) + b"\n"


def _event_lines(event: Event) -> tuple[bytes, bytes | None, bytes]:
    """One event as its line, its payload line (None: no payload) and its payload-map byte."""
    if isinstance(event, (ToolCall, LlmRequest)):
        line = _event_json(event, "input") + b"\n"
        if event.input is None:
            return line, None, b"-"
        return line, b"".join([_P_IN, _payload_bytes(event.input, event.id), b"}\n"]), b"i"
    line = _event_json(event, "output") + b"\n"
    if event.output is None:
        return line, None, b"-"
    return line, b"".join([_P_OUT, _payload_bytes(event.output, event.id), b"}\n"]), b"o"


def _event_json(event: Event, payload: str) -> bytes:
    """An event's line without its payload (written on the next line): what
    ``EVENT_ADAPTER.dump_json(event, exclude_none=True, exclude={payload})`` writes -- the
    fields in declared order, ``type`` and ``id`` first, None left out -- built by orjson from
    the validated fields. Five times faster for an output with a key order (measured: 10.4 µs
    -> 1.9 µs for 16 entries; the adapter checks each entry's union types again); a value orjson
    refuses (a lone surrogate in a name) goes through the adapter, which says what is wrong."""
    try:
        return orjson.dumps(
            {key: v for key, v in event.__dict__.items() if v is not None and key != payload}
        )
    except orjson.JSONEncodeError:
        return _dump_event(event, exclude_none=True, exclude={payload})


_dump_event = EVENT_ADAPTER.dump_json


#: Why a bundle written as its run went, and never closed by its trailer, is incomplete.
NO_TRAILER_REASON = "the recording stopped before the run ended (the bundle has no trailer)"
#: How the reason a writer puts in the header, in place of :data:`NO_TRAILER_REASON`, when a
#: write failed (a full disk) starts: a bundle without trailer then says that instead.
WRITE_FAILED_REASON = "writing the bundle failed: "


#: What a bundle's header holds: what is known when the run starts.
_HEAD_FIELDS: set[str] = {"format", "format_version", "trace_id", "created_by"}
_RUN_START: set[str] = {
    "capture",
    "name",
    "span_id",
    "entrypoint",
    "input_sha256",
    "input_missing",
    "start_time_unix_nano",
}


class Encoded(NamedTuple):
    """Events as bytes (:meth:`BundleEncoder.encode`): ``data`` to write, and what the trailer
    counts of them -- their lines (fingerprinted) and payload-map bytes."""

    data: bytes
    lines: tuple[int, ...]
    """Where each event line is in ``data``: start and end offsets, in turn (the lines, not
    their payloads, are fingerprinted; offsets, so that the queued bytes are held once)."""
    slots: bytes
    calls: tuple[int, ...] = ()
    """The numbers of the calls whose call events these are."""

    def size(self) -> int:
        return len(self.data)


class BundleEncoder:
    """The bytes of a bundle written as its run goes (see ``docs/bundle-format.md``):
    :meth:`head` first, then the events as calls end (any order, each outcome after its call),
    then :meth:`trailer` once the run has ended -- what only the end knows (the run's output and
    status, ``complete``, the spans kept as context, the event count and the lines fingerprint).
    Any thread may :meth:`encode` events; whoever writes them will :meth:`commit` them, in the
    order written (:meth:`events` does both). Pure bytes: the caller writes them. Holds one byte per event (the payload map
    the lines fingerprint covers) and one bit per call (which calls it has written) and nothing
    else of them."""

    def __init__(self, trace: Trace) -> None:
        """``trace``: the header as known when the run starts (its events are ignored)."""
        self._start = trace
        self._hash = hashlib.sha256()
        self._map = bytearray()
        self._calls = bytearray()
        self.count = 0
        self._run_map = b"-"

    def head(self) -> bytes:
        start = self._start
        head = start.model_dump(mode="json", include=_HEAD_FIELDS, exclude_none=True)
        head["complete"] = False  # until the trailer says otherwise
        head["incomplete_reason"] = NO_TRAILER_REASON
        head["trailer"] = True
        head["run"] = start.run.model_dump(mode="json", include=_RUN_START, exclude_none=True)
        run_input = start.run.input
        line = orjson.dumps(head) + b"\n"
        self._hash.update(line)
        if run_input is None:
            return line
        self._run_map = b"i"
        return line + b"".join([_P_IN, _payload_bytes(run_input, "run input"), b"}\n"])

    def encode(self, events: Iterable[Event]) -> Encoded:
        """The bytes of ``events``, not yet counted: :meth:`commit` counts them when they are
        written. Pure, so that what is counted is exactly what was written even when the
        encoding thread is interrupted (a signal handler raising in the main thread)."""
        pieces: list[bytes] = []
        lines: list[int] = []
        calls: list[int] = []
        slots = bytearray()
        at = 0
        for event in events:
            line, payload, slot = _event_lines(event)
            lines += (at, at + len(line))
            at += len(line)
            slots += slot
            pieces.append(line)
            if payload is not None:
                pieces.append(payload)
                at += len(payload)
            if isinstance(event, (ToolCall, LlmRequest)):
                calls.append(event.seq)
        return Encoded(b"".join(pieces), tuple(lines), bytes(slots), tuple(calls))

    def commit(self, encoded: Encoded) -> None:
        """Count what :meth:`encode` made, in the order it is written."""
        data, lines = memoryview(encoded.data), encoded.lines
        for i in range(0, len(lines), 2):
            self._hash.update(data[lines[i] : lines[i + 1]])
        self._map += encoded.slots
        self.count += len(lines) // 2
        written = self._calls
        for seq in encoded.calls:
            byte = seq >> 3
            if byte >= len(written):
                written += bytes(byte + 1 - len(written))
            written[byte] |= 1 << (seq & 7)

    def committed(self, encoded: Encoded) -> bool:
        """Whether every call in ``encoded`` was committed already (one bit per call number)."""
        written = self._calls
        return bool(encoded.calls) and all(
            (seq >> 3) < len(written) and written[seq >> 3] & (1 << (seq & 7))
            for seq in encoded.calls
        )

    def events(self, events: Iterable[Event]) -> bytes:
        """:meth:`encode` and :meth:`commit` at once (the whole-bundle writer)."""
        encoded = self.encode(events)
        self.commit(encoded)
        return encoded.data

    def captured(self, reads: Iterable[Any]) -> bytes:
        """A line of captured reads, written after the call they preceded so that a
        run cut short keeps them; the trailer then holds all of them, and these lines are read
        only when there is no trailer. Not counted or fingerprinted: a file with a trailer
        ignores them."""
        items = [r.model_dump(mode="json", exclude_none=True) for r in reads]
        return orjson.dumps({"captured": items}) + b"\n" if items else b""

    def trailer(self, final: Trace) -> bytes:
        """``final``: the header as known at the end (``run``, ``complete``,
        ``incomplete_reason``, ``dropped_spans``, ``context``; its events are ignored)."""
        summary = final.model_dump(
            mode="json",
            include={
                "complete",
                "incomplete_reason",
                "dropped_spans",
                "context",
                "run",
                "captured",
            },
            exclude_none=True,
        )
        summary.setdefault("incomplete_reason", None)  # (clears the header's)
        run = summary.get("run", {})
        run.pop("input", None)
        output = run.pop("output", None)
        line = orjson.dumps({"run": run, **{k: v for k, v in summary.items() if k != "run"}})
        line += b"\n"
        self._hash.update(line)
        pieces = [line]
        out_map = b"-"
        if output is not None:
            out_map = b"o"
            pieces.append(b"".join([_P_OUT, _payload_bytes(output, "run output"), b"}\n"]))
        self._hash.update(self._run_map + out_map + self._map)
        end = {"end": FORMAT_NAME, "events": self.count, "lines_sha256": self._hash.hexdigest()}
        pieces.append(orjson.dumps(end) + b"\n")
        return b"".join(pieces)


def _batches(pieces: Iterable[bytes], compress: bool) -> Iterator[bytes]:
    """``pieces`` gathered into writes of about :data:`_WRITE_BATCH` bytes, gzipped (level 6,
    no timestamp, as ``gzip.compress`` would) when ``compress``."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 31) if compress else None
    gathered: list[bytes] = []
    size = 0
    for piece in pieces:
        gathered.append(piece)
        size += len(piece)
        if size >= _WRITE_BATCH:
            data = b"".join(gathered)
            gathered, size = [], 0
            yield data if packer is None else packer.compress(data)
    data = b"".join(gathered)
    if packer is None:
        yield data
    else:
        yield packer.compress(data) + packer.flush()


def _payload_bytes(text: str, owner: str) -> bytes:
    if "\n" in text:  # canonical JSON never has one; a line break would split the line
        raise ValueError(f"payload of {owner} is not canonical JSON text (it has a line break)")
    return text.encode("utf-8")


def save_trace(trace: Trace, destination: str | os.PathLike[str]) -> Path:
    """Write a bundle atomically: a temporary file in the same folder, then a rename."""
    path = Path(destination)
    path.parent.mkdir(parents=True, exist_ok=True)
    # (the pid in the name tells a leftover of a dead process from a write under way)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.{os.getpid()}.", suffix=TMP_SUFFIX, dir=path.parent
    )
    try:
        with os.fdopen(fd, "wb") as handle:
            for data in _batches(_dump_pieces(trace), path.name.endswith(".gz")):
                handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


TMP_SUFFIX = ".tmp"


def load_any(source: Trace | str | os.PathLike[str] | Any) -> Trace:
    """A :class:`Trace` from a Trace (returned as is) or a path."""
    if isinstance(source, Trace):
        return source
    if isinstance(source, (str, os.PathLike)):
        return load_trace(source)
    raise TypeError(f"expected a path or a Trace, got {type(source).__name__}")
