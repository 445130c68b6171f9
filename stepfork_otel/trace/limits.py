"""What reading a bundle or a collector file may cost: :class:`ReadLimits`, checked as the data
streams in, and the one way files are opened for reading (:func:`open_regular`).

A hostile file must fail with a typed one-line error in bounded time and memory, so the readers
check three things while they read, not after: the bytes a gzip stream expands to (a "zip bomb"
stops there), the length of a line (a 1 GB line of zeros is refused when its first
``max_line_bytes`` are in memory, not when all of it is) and the nesting depth of JSON that is
parsed or later rebuilt recursively (the standard library's parser, used for 20-digit integers,
recurses once per level and would raise ``RecursionError`` into the agent during a replay).

Only regular files are read: a FIFO would block forever, ``/dev/zero`` never ends. The file is
opened non-blocking and checked with ``fstat`` on the open descriptor, so nothing can be swapped
in between the check and the read.

A gzip file is also held to a ratio, in :func:`open_regular` itself, so that every reader gets
it whatever it does with the bytes: the file it returns inflates (and throws away) what it hands
out, counting, and its ``read`` raises :class:`ExpansionLimitError` once the compressed bytes read
so far expand to more than ``max_compression_ratio`` times their size (past the first
``ratio_free_bytes``) or beyond ``max_decompressed_bytes``. A 1 MB file of newlines that inflates
to 1 GiB is then refused after its first kilobytes, before the reader has seen a line of it -- the
size cap alone let the readers work through the whole gigabyte (forty minutes for ``stepfork
validate``). The cost is one more inflation of a compressed file (zlib's, in C).
"""

from __future__ import annotations

import os
import stat
import typing
import zlib
from dataclasses import dataclass
from itertools import accumulate
from typing import IO, Any

from stepfork_otel.constants import (
    DEFAULT_MAX_COMPRESSION_RATIO,
    DEFAULT_MAX_DECOMPRESSED_BYTES,
    DEFAULT_MAX_JSON_DEPTH,
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_RATIO_FREE_BYTES,
    GZIP_MAGIC,
)
from stepfork_otel.trace.errors import BundleError


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """Caps on what one read of a bundle or a collector file may take (documented defaults in
    ``docs/guarantees.md``; pass your own to ``load_trace(..., limits=)`` or
    ``iter_traces_from_otlp_json(..., limits=)``)."""

    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
    """Bytes a gzip file may expand to, in all."""
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    """Bytes of one line (JSON Lines) or of a whole-file request body."""
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    """Levels of nesting of a JSON value (arrays and objects)."""
    max_compression_ratio: int = DEFAULT_MAX_COMPRESSION_RATIO
    """Times its compressed size a gzip file may expand to (checked past ``ratio_free_bytes``)."""
    ratio_free_bytes: int = DEFAULT_RATIO_FREE_BYTES
    """Bytes a gzip file may expand to whatever its ratio."""


DEFAULT_LIMITS = ReadLimits()

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotRegularFile(OSError):
    """The path names something other than a regular file (``reason`` says what)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ExpansionLimitError(BundleError, OSError):
    """A gzip file expands beyond a cap of :class:`ReadLimits` (``reason`` says which, and how
    far the read got). A :class:`~stepfork_otel.trace.errors.BundleError`, so a bundle reader
    lets it through as it is, and an ``OSError``, so a reader that reports a failed read in its
    own terms (the collector-file importer: ``OtlpImportError``) does so."""

    def __init__(self, path: str | os.PathLike[str], reason: str, consumed: int) -> None:
        super().__init__(path, reason)
        self.strerror = self.reason  # (what a reader quoting a failed read's strerror shows)
        self.consumed = consumed
        """Compressed bytes inflated when the cap was reached."""


#: Most bytes inflated at once while metering (what is inflated is thrown away).
_METER_STEP = 1 << 20


class _GzipMeter:
    """A gzip file read through the caps of :class:`ReadLimits` (see the module docstring):
    what ``read`` hands out is inflated here too, counted and thrown away. ``seek(0)`` starts
    the count again (the reader starts again); a seek elsewhere than where the reading is stops
    the metering (the readers make none: the stream would no longer be one)."""

    def __init__(self, raw: IO[bytes], path: str | os.PathLike[str], limits: ReadLimits) -> None:
        self._raw = raw
        self._path = path
        self._limits = limits
        self._restart()

    def _restart(self) -> None:
        self._inflater: Any = zlib.decompressobj(wbits=31)
        self._position = 0
        self._consumed = 0
        self._expanded = 0
        self._metering = True

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._position += len(data)
        if self._metering and data:
            self._meter(data)
        return data

    def _meter(self, data: bytes) -> None:
        full = False
        try:
            while data or full:
                if self._inflater.eof:  # a following member
                    self._inflater = zlib.decompressobj(wbits=31)
                fed = len(data)
                expanded = len(self._inflater.decompress(data, _METER_STEP))
                data = self._inflater.unused_data if self._inflater.eof else b""
                data = data or self._inflater.unconsumed_tail
                self._consumed += fed - len(data)
                self._expanded += expanded
                full = expanded == _METER_STEP
                self._check()
        except zlib.error:
            self._metering = False  # corrupt data: the reader's own inflation says so

    def _check(self) -> None:
        limits, expanded = self._limits, self._expanded
        if expanded > limits.max_decompressed_bytes:  # (the words every reader's own cap says)
            raise ExpansionLimitError(
                self._path,
                f"expands beyond {limits.max_decompressed_bytes} bytes (the decompressed-size limit)",
                self._consumed,
            )
        if expanded > limits.ratio_free_bytes and expanded > limits.max_compression_ratio * (
            self._consumed
        ):
            raise ExpansionLimitError(
                self._path,
                f"expands more than {limits.max_compression_ratio} times its compressed size "
                f"(the compression-ratio limit; {expanded} bytes from its first {self._consumed} "
                "compressed bytes)",
                self._consumed,
            )

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        position = self._raw.seek(offset, whence)
        if position == 0:
            self._restart()
        elif position != self._position:
            self._metering = False
        self._position = position
        return position

    def tell(self) -> int:
        return self._raw.tell()

    def fileno(self) -> int:
        return self._raw.fileno()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._raw.seekable()

    @property
    def closed(self) -> bool:
        return self._raw.closed

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> _GzipMeter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_regular(path: str | os.PathLike[str], limits: ReadLimits = DEFAULT_LIMITS) -> IO[bytes]:
    """``path`` opened for binary reading, if it is a regular file (symlinks followed); else
    :class:`NotRegularFile`. Other failures are the ``OSError`` of ``open``. A gzip file is read
    through ``limits``' compression caps: a ``read`` past them raises
    :class:`ExpansionLimitError`."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise NotRegularFile(f"is {what}, not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    try:
        compressed = handle.read(len(GZIP_MAGIC)) == GZIP_MAGIC
        handle.seek(0)
    except BaseException:
        handle.close()
        raise
    if compressed:
        return typing.cast(IO[bytes], _GzipMeter(handle, path, limits))
    return handle


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """True when a parsed JSON value nests deeper than ``limit`` levels (iterative: a deep
    value cannot exhaust the stack here)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def text_depth_exceeds(data: bytes, limit: int) -> bool:
    """True when JSON text nests deeper than ``limit`` levels. Cheap for nearly every text: the
    count of ``[`` and ``{`` bounds the depth from above, and only a text with more of them than
    ``limit`` is looked at closely: strings cut out, then a running sum over the brackets, all
    in C. Strings are cut without a regex (which cost a third of an OTLP import): once the
    escaped backslashes and then the escaped quotes are removed, every quote left in valid JSON
    opens or closes a string, so the text outside strings is every other piece between quotes.
    For text that is not valid JSON the answer may be wrong, but such text fails to parse next."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(unescaped.split(b'"')[::2])
    brackets = outside.translate(None, _NOT_BRACKET)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > limit
