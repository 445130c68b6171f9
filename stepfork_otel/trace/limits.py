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
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from itertools import accumulate
from typing import IO, Any

from stepfork_otel.constants import (
    DEFAULT_MAX_DECOMPRESSED_BYTES,
    DEFAULT_MAX_JSON_DEPTH,
    DEFAULT_MAX_LINE_BYTES,
)


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


def open_regular(path: str | os.PathLike[str]) -> IO[bytes]:
    """``path`` opened for binary reading, if it is a regular file (symlinks followed); else
    :class:`NotRegularFile`. Other failures are the ``OSError`` of ``open``."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise NotRegularFile(f"is {what}, not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


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
