"""A value crossing a boundary, turned into what is recorded: redacted canonical JSON + SHA-256.

This is the hot path of recording (twice per call: input and output), so it does the least work
that keeps the guarantees: one orjson encode, one cheap redaction pre-check on the text, one hash.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

from stepfork_otel.recording import settings as _settings
from stepfork_otel.trace.canonical import (
    UnserialisableError,
    canonical_bytes,
    unserialisable_marker,
)
from stepfork_otel.trace.redaction import Redactor


class Payload(NamedTuple):
    """A recorded payload: the redacted canonical JSON text and its fingerprint.

    A named tuple rather than a frozen dataclass: two or three are made per boundary call, and a
    frozen dataclass's ``__init__`` costs twice as much."""

    text: str
    sha256: str
    size: int
    """Size of ``text`` in UTF-8 bytes."""
    unserialisable: bool = False
    """True when the value had no canonical JSON form and ``text`` is the marker object."""

    @classmethod
    def from_text(cls, text: str) -> Payload:
        data = text.encode("utf-8")
        return cls(text, hashlib.sha256(data).hexdigest(), len(data))


def capture(
    value: Any, redactor: Redactor | None = None, recorded: tuple[str, str] | None = None
) -> Payload:
    """Redacted canonical JSON of ``value`` and its fingerprint; ``redactor`` defaults to the one
    configured (``configure(redactor=...)``).

    ``recorded`` (during replay): the text and stored fingerprint of the recorded input the
    session expects next (see ``ReplaySession.expected_input``). The value is redacted as always;
    when the result is that very text, its fingerprint -- verified against it when the session
    started -- is taken instead of hashing the text again."""
    unserialisable = False
    try:
        raw = canonical_bytes(value)
    except UnserialisableError as exc:
        raw = canonical_bytes(unserialisable_marker(value, str(exc)))
        unserialisable = True
    text = raw.decode("utf-8")
    if redactor is None:
        redactor = _settings.settings().redactor
    redacted = redactor.redact_canonical(text)
    if redacted is not text:
        raw = redacted.encode("utf-8")
    if recorded is not None and not unserialisable and redacted == recorded[0]:
        return Payload(recorded[0], recorded[1], len(raw))
    return Payload(redacted, hashlib.sha256(raw).hexdigest(), len(raw), unserialisable)
