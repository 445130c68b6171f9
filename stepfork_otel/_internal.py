"""The one place where a failure of stepfork itself is turned into a log line.

Recording must never break the program it records: every decorator body, every span processor
callback and every exporter path goes through :func:`handle_internal_errors`. Tests set
:data:`RAISE_INTERNAL_ERRORS` so that a bug in stepfork fails the test instead of hiding in a log.
Replay errors are *not* internal errors: they are raised on purpose and never pass through here.
"""

from __future__ import annotations

import logging
from types import TracebackType

logger = logging.getLogger("stepfork_otel")

#: Set to True (tests do) to re-raise internal errors instead of logging them.
RAISE_INTERNAL_ERRORS = False

#: Number of internal errors logged since start-up (exposed for tests and health checks).
internal_error_count = 0


def log_internal_error(
    what: str,
    exc_info: tuple[type[BaseException], BaseException, TracebackType | None] | None = None,
) -> None:
    """Log the exception being handled (or ``exc_info``) as an internal stepfork error."""
    global internal_error_count
    internal_error_count += 1
    logger.error(
        "stepfork_otel internal error while %s; the program continues",
        what,
        exc_info=exc_info or True,
    )


def log_or_raise(what: str) -> None:
    """What :class:`handle_internal_errors` does, as a call for an ``except Exception`` block:
    log the exception being handled (or re-raise it under :data:`RAISE_INTERNAL_ERRORS`). The
    boundaries' hot path uses it: a ``try`` costs nothing until it fails, entering a context
    manager costs ~0.1 us every time."""
    if RAISE_INTERNAL_ERRORS:
        raise  # only ever called from an except block: re-raises what it handles
    log_internal_error(what)


class handle_internal_errors:
    """Run a block of stepfork's own work; log (never raise) any ``Exception`` it throws.

    A class rather than ``@contextmanager``: it wraps every boundary call several times, and a
    generator-based context manager costs several times more per use."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc_type is None or exc is None or not issubclass(exc_type, Exception):
            return False
        if RAISE_INTERNAL_ERRORS:
            return False
        log_internal_error(self.what, (exc_type, exc, tb))
        return True
