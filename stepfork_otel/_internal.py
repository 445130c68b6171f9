"""The one place where a failure of stepfork itself is turned into a log line.

Recording must never break the program it records: every decorator body, every span processor
callback and every exporter path goes through :func:`handle_internal_errors`. Tests set
:data:`RAISE_INTERNAL_ERRORS` so that a bug in stepfork fails the test instead of hiding in a log.
Replay errors are *not* internal errors: they are raised on purpose and never pass through here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger("stepfork_otel")

#: Set to True (tests do) to re-raise internal errors instead of logging them.
RAISE_INTERNAL_ERRORS = False

#: Number of internal errors logged since start-up (exposed for tests and health checks).
internal_error_count = 0


def log_internal_error(what: str) -> None:
    """Log the exception being handled as an internal stepfork error."""
    global internal_error_count
    internal_error_count += 1
    logger.exception("stepfork_otel internal error while %s; the program continues", what)


@contextmanager
def handle_internal_errors(what: str) -> Iterator[None]:
    """Run a block of stepfork's own work; log (never raise) anything it throws."""
    try:
        yield
    except Exception:
        if RAISE_INTERNAL_ERRORS:
            raise
        log_internal_error(what)
