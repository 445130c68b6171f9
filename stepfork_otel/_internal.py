"""The one place where a failure of stepfork itself is turned into a log line.

Recording must never break the program it records. Every place where stepfork does its own work
on the user's behalf -- a boundary preparing or finishing a call, a span processor callback, an
exporter -- goes through this module, in one of three spellings of the same rule:

* ``with handle_internal_errors("what"):`` around a block;
* ``@handle_internal_errors("what")`` on a function (sync or ``async``), which then returns None
  when it failed;
* ``internal_error("what")`` inside an ``except Exception:`` block, where a ``with`` would cost
  too much (the boundaries' hot path: a ``try`` is free until it fails, entering a context manager
  costs ~0.1 us every time).

All three log through :func:`log_internal_error`, count the error, and re-raise instead when
:data:`RAISE_INTERNAL_ERRORS` is set (tests set it, so a bug in stepfork fails the test instead
of hiding in a log). ``strict=True`` re-raises in production too: the boundaries pass it inside a
replay session, where carrying on unrecorded would be a silent live fallback.

Replay errors are *not* internal errors: they are raised on purpose and never pass through here.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

logger = logging.getLogger("stepfork_otel")

F = TypeVar("F", bound=Callable[..., Any])

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


def internal_error(what: str, *, strict: bool = False) -> None:
    """Handle the exception being handled as an internal error: log it, or re-raise it under
    :data:`RAISE_INTERNAL_ERRORS` or ``strict``. Only ever called from an ``except`` block."""
    if strict or RAISE_INTERNAL_ERRORS:
        raise  # re-raises the exception being handled
    log_internal_error(what)


class handle_internal_errors:
    """Run stepfork's own work; log (never raise) any ``Exception`` it throws. A context manager
    and a decorator.

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

    def __call__(self, fn: F) -> F:
        """Decorate ``fn`` (sync or ``async``): an internal error in it is logged and the call
        returns None."""
        what = self.what
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_guarded(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await fn(*args, **kwargs)
                except Exception:
                    internal_error(what)
                    return None

            return async_guarded  # type: ignore[return-value]

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception:
                internal_error(what)
                return None

        return guarded  # type: ignore[return-value]
