"""Redaction of secrets at the boundary, before a value reaches a span, an exporter or a file.

:mod:`.rules` holds the rules as data (the secret patterns with their needles, the sensitive key
words, the markers); :mod:`.engine` holds the machinery that applies them (the needle pre-check,
the splice, the walk, :class:`Redactor`). They are kept apart so that new rule families can be added
as data without touching the engine, and the engine (its regular expressions, say, for a
linear-time one) can be replaced without touching the rules; this module only re-exports both.
"""

from __future__ import annotations

from stepfork_otel.trace.redaction.engine import (
    DEFAULT_REDACTOR,
    Redactor,
    _found_needles,
    fold,
)
from stepfork_otel.trace.redaction.rules import (
    DEFAULT_PATTERNS,
    DEFAULT_SENSITIVE_KEYS,
    KEY_MARKER,
    MAX_MESSAGE_CHARS,
    UNSTABLE_MARKER,
    SecretPattern,
    holds_marker,
)

__all__ = [
    "DEFAULT_PATTERNS",
    "DEFAULT_REDACTOR",
    "DEFAULT_SENSITIVE_KEYS",
    "KEY_MARKER",
    "MAX_MESSAGE_CHARS",
    "UNSTABLE_MARKER",
    "Redactor",
    "SecretPattern",
    "_found_needles",
    "fold",
    "holds_marker",
]
