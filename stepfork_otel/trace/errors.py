"""Why a bundle cannot be read or is not valid: :class:`BundleError` and :class:`Problem`.

Every message quotes at most a short, one-line excerpt of the bundle's own data (:func:`quote`):
a hostile bundle cannot flood a terminal or forge extra lines in a log.
"""

from __future__ import annotations

import os
import re
import reprlib
from dataclasses import dataclass

#: Longest excerpt of a bundle's own data (a key, a tag, an id) quoted in an error message.
MAX_QUOTED_CHARS = 80
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")


def one_line(text: str) -> str:
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel = 3  # (str() of a 1,000-deep list from a hostile bundle recurses too far)
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = MAX_QUOTED_CHARS


def quote(value: object) -> str:
    """A short one-line excerpt of a value taken from the bundle, for an error message."""
    text = _SHORT_REPR.repr(value) if isinstance(value, (list, dict, tuple)) else str(value)
    if len(text) > MAX_QUOTED_CHARS:
        text = text[: MAX_QUOTED_CHARS - 1] + "…"
    return one_line(text)


class BundleError(ValueError):
    """A bundle could not be read or is not valid. ``str(error)`` is one line."""

    def __init__(self, path: str | os.PathLike[str] | None, reason: str) -> None:
        self.path = None if path is None else str(path)
        self.reason = one_line(reason)
        where = "<trace>" if self.path is None else one_line(self.path)
        super().__init__(f"{where}: {self.reason}")


class BundleVersionError(BundleError):
    """The bundle is of another format version than the one this stepfork_otel reads (a newer
    one, or a development format of the unreleased package)."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a bundle, tied to the event it concerns (None: the whole bundle)."""

    event_id: str | None
    message: str

    def __str__(self) -> str:
        return f"{quote(self.event_id)}: {self.message}" if self.event_id else self.message
