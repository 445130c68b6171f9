"""Redaction of secrets at the boundary, before a value reaches a span, an exporter or a file.

:mod:`.rules` holds the rules as data (the secret patterns with their families, the sensitive key
words, the markers); :mod:`.engine` holds the machinery that applies them (RE2: one linear-time
scan as the pre-check, the splice, the walk, :class:`Redactor`). They are kept apart so that new
rule families can be added as data without touching the engine; this module only re-exports both.
"""

from __future__ import annotations

from stepfork_otel.trace.redaction.engine import DEFAULT_REDACTOR, Redactor, scan_form
from stepfork_otel.trace.redaction.rules import (
    DEFAULT_PATTERNS,
    DEFAULT_SENSITIVE_KEYS,
    FAMILIES,
    GENERIC_KEY_WORDS,
    GENERIC_MARKER,
    KEY_MARKER,
    MAX_MESSAGE_CHARS,
    SEGMENT_KEYS,
    UNSTABLE_MARKER,
    SecretPattern,
    holds_marker,
    looks_random,
)

__all__ = [
    "DEFAULT_PATTERNS",
    "DEFAULT_REDACTOR",
    "DEFAULT_SENSITIVE_KEYS",
    "FAMILIES",
    "GENERIC_KEY_WORDS",
    "GENERIC_MARKER",
    "KEY_MARKER",
    "MAX_MESSAGE_CHARS",
    "SEGMENT_KEYS",
    "UNSTABLE_MARKER",
    "Redactor",
    "SecretPattern",
    "holds_marker",
    "looks_random",
    "scan_form",
]
