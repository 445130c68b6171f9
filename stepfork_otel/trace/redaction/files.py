"""Redaction rules kept in a file, so that every process that writes or rebuilds bundles of one
application applies the same rules (``stepfork import --redaction-rules FILE``).

The file is JSON (the standard library reads it on every supported Python)::

    {
      "keys": ["ticket_id", "ssn"],
      "patterns": [
        {"name": "acme_ticket", "regex": "ACME-[0-9]+", "description": "ACME ticket ids"}
      ],
      "allow": ["sk-test-[a-z]+", "AKIAIOSFODNN7EXAMPLE"]
    }

Every field is optional; the rules are *added* to the built-in ones, as
``Redactor().with_rules(keys=..., patterns=..., allow=...)`` adds them in code. A pattern is an
RE2 regular expression (no look-arounds or back-references: what RE2 runs in linear time); its
``secret`` group, if it has one, is what is replaced. ``allow`` lists known false positives: RE2
patterns matched against a whole secret a rule found, which is then left alone. A file that is not
of this shape is refused with a :class:`RedactionRulesError` naming the file and what is wrong, on
one line; nothing in it is executed (a regex is compiled, never evaluated as code).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from stepfork_otel.trace.redaction.engine import DEFAULT_REDACTOR, Redactor, check_pattern
from stepfork_otel.trace.redaction.rules import SecretPattern

#: A rules file larger than this is refused (a rules file is a few kilobytes).
MAX_RULES_FILE_BYTES = 1024 * 1024


class RedactionRulesError(ValueError):
    """A redaction rules file cannot be read or is not valid. ``str(error)`` is one line."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


_PATTERN_FIELDS = {"name", "regex", "description"}


def _regex(path: str | os.PathLike[str], what: str, regex: str) -> None:
    try:
        check_pattern(regex)
    except ValueError as exc:
        raise RedactionRulesError(path, f"{what}: {exc}") from None


def _patterns(path: str | os.PathLike[str], raw: Any) -> list[SecretPattern]:
    if not isinstance(raw, list):
        raise RedactionRulesError(path, '\'patterns\' must be a list of {"name", "regex"}')
    out: list[SecretPattern] = []
    for n, item in enumerate(raw, start=1):
        if not (
            isinstance(item, dict)
            and {"name", "regex"} <= set(item) <= _PATTERN_FIELDS
            and all(isinstance(item[f], str) for f in item)
            and item["name"]
        ):
            raise RedactionRulesError(
                path,
                f"pattern {n} must be an object with a non-empty 'name', a 'regex' "
                "and optionally a 'description'",
            )
        _regex(path, f"pattern {item['name']!r}", item["regex"])
        out.append(
            SecretPattern(
                item["name"], item["regex"], family="user", description=item.get("description", "")
            )
        )
    return out


def _allow(path: str | os.PathLike[str], raw: Any) -> list[str]:
    if not (isinstance(raw, list) and all(isinstance(a, str) and a for a in raw)):
        raise RedactionRulesError(path, "'allow' must be a list of non-empty regular expressions")
    for n, regex in enumerate(raw, start=1):
        _regex(path, f"allow {n}", regex)
    return list(raw)


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
    if not isinstance(data, dict) or not set(data) <= {"keys", "patterns", "allow"}:
        raise RedactionRulesError(
            path,
            "must be a JSON object with 'keys' and/or 'patterns' (or 'allow'), and nothing else",
        )
    keys = data.get("keys", [])
    if not (isinstance(keys, list) and all(isinstance(key, str) and key for key in keys)):
        raise RedactionRulesError(path, "'keys' must be a list of non-empty strings")
    return base.with_rules(
        keys=keys,
        patterns=_patterns(path, data.get("patterns", [])),
        allow=_allow(path, data.get("allow", [])),
    )
