"""Redaction of secrets at the boundary, before a value reaches a span, an exporter or a file.

:mod:`.rules` holds the rules as data (the secret patterns with their families, the sensitive key
words, the markers); :mod:`.engine` holds the machinery that applies them (RE2: one linear-time
scan as the pre-check, the splice, the walk, :class:`Redactor`). They are kept apart so that new
rule families can be added as data without touching the engine; this module only re-exports both,
lazily (PEP 562): importing it runs neither until a name is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepfork_otel import _lazy

if TYPE_CHECKING:
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

_EXPORTS: dict[str, str] = {
    "DEFAULT_PATTERNS": "stepfork_otel.trace.redaction.rules",
    "DEFAULT_REDACTOR": "stepfork_otel.trace.redaction.engine",
    "DEFAULT_SENSITIVE_KEYS": "stepfork_otel.trace.redaction.rules",
    "FAMILIES": "stepfork_otel.trace.redaction.rules",
    "GENERIC_KEY_WORDS": "stepfork_otel.trace.redaction.rules",
    "GENERIC_MARKER": "stepfork_otel.trace.redaction.rules",
    "KEY_MARKER": "stepfork_otel.trace.redaction.rules",
    "MAX_MESSAGE_CHARS": "stepfork_otel.trace.redaction.rules",
    "Redactor": "stepfork_otel.trace.redaction.engine",
    "SEGMENT_KEYS": "stepfork_otel.trace.redaction.rules",
    "SecretPattern": "stepfork_otel.trace.redaction.rules",
    "UNSTABLE_MARKER": "stepfork_otel.trace.redaction.rules",
    "holds_marker": "stepfork_otel.trace.redaction.rules",
    "looks_random": "stepfork_otel.trace.redaction.rules",
    "scan_form": "stepfork_otel.trace.redaction.engine",
}


def __getattr__(name: str) -> Any:
    return _lazy.attribute(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return sorted(__all__)


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
