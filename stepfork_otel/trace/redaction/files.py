"""Redaction rules kept in a file, so that every process that writes or rebuilds bundles of one
application applies the same rules (``stepfork import --redaction-rules FILE``).

The file is JSON (the standard library reads it on every supported Python)::

    {
      "keys": ["ticket_id", "ssn"],
      "patterns": [{"name": "acme_ticket", "regex": "ACME-[0-9]+"}]
    }

Both fields are optional; the rules are *added* to the built-in ones, as
``Redactor().with_rules(keys=..., patterns=...)`` adds them in code. A file that is not of this
shape is refused with a :class:`RedactionRulesError` naming the file and what is wrong, on one
line; nothing in it is executed (a regex is compiled, never evaluated as code).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from stepfork_otel.trace.redaction.engine import DEFAULT_REDACTOR, Redactor

#: A rules file larger than this is refused (a rules file is a few kilobytes).
MAX_RULES_FILE_BYTES = 1024 * 1024


class RedactionRulesError(ValueError):
    """A redaction rules file cannot be read or is not valid. ``str(error)`` is one line."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


def _patterns(path: str | os.PathLike[str], raw: Any) -> list[tuple[str, str]]:
    if not isinstance(raw, list):
        raise RedactionRulesError(path, '\'patterns\' must be a list of {"name", "regex"}')
    out: list[tuple[str, str]] = []
    for n, item in enumerate(raw, start=1):
        if not (
            isinstance(item, dict)
            and set(item) == {"name", "regex"}
            and isinstance(item["name"], str)
            and isinstance(item["regex"], str)
            and item["name"]
        ):
            raise RedactionRulesError(
                path, f"pattern {n} must be an object with a non-empty 'name' and a 'regex'"
            )
        try:
            re.compile(item["regex"])
        except re.error as exc:
            raise RedactionRulesError(
                path, f"pattern {item['name']!r}: not a regular expression ({exc})"
            ) from None
        out.append((item["name"], item["regex"]))
    return out


def load_redaction_rules(
    path: str | os.PathLike[str], base: Redactor = DEFAULT_REDACTOR
) -> Redactor:
    """``base`` (the built-in rules) with the keys and patterns of the rules file ``path``."""
    source = Path(path)
    try:
        if not source.is_file():
            raise RedactionRulesError(path, "not a file")
        if source.stat().st_size > MAX_RULES_FILE_BYTES:
            raise RedactionRulesError(
                path, f"larger than {MAX_RULES_FILE_BYTES} bytes: not a rules file"
            )
        data = json.loads(source.read_bytes())
    except OSError as exc:
        raise RedactionRulesError(path, f"cannot be read ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError
        raise RedactionRulesError(path, f"not JSON ({exc})") from None
    if not isinstance(data, dict) or not set(data) <= {"keys", "patterns"}:
        raise RedactionRulesError(
            path, "must be a JSON object with 'keys' and/or 'patterns' (and nothing else)"
        )
    keys = data.get("keys", [])
    if not (isinstance(keys, list) and all(isinstance(key, str) and key for key in keys)):
        raise RedactionRulesError(path, "'keys' must be a list of non-empty strings")
    return base.with_rules(keys=keys, patterns=_patterns(path, data.get("patterns", [])))
