"""What the active redaction rules are, for people: the rows ``stepfork redaction-rules`` prints
and the family table ``docs/guarantees.md`` holds (``tests/test_redaction_rules.py`` checks that
the table in the docs is the one generated here, so the docs cannot drift from the rules)."""

from __future__ import annotations

from dataclasses import dataclass

from stepfork_otel.trace.redaction.engine import DEFAULT_REDACTOR, Redactor
from stepfork_otel.trace.redaction.rules import FAMILIES, GENERIC_KEY_WORDS, SEGMENT_KEYS

#: Where the generated table starts and ends in ``docs/guarantees.md``.
TABLE_START = "<!-- redaction-families:start (generated: stepfork redaction-rules --markdown) -->"
TABLE_END = "<!-- redaction-families:end -->"


@dataclass(frozen=True)
class RuleRow:
    family: str
    name: str
    description: str
    regex: str


def rule_rows(redactor: Redactor = DEFAULT_REDACTOR) -> list[RuleRow]:
    """Every value pattern of ``redactor``, in the order of :data:`FAMILIES`, then as applied."""
    order = {family: n for n, family in enumerate(FAMILIES)}
    rows = [
        RuleRow(p.family, p.name, p.description, p.source)
        for p in redactor.patterns
        if p.name != "allow"
    ]
    return sorted(rows, key=lambda row: order.get(row.family, len(order)))


def key_rows(redactor: Redactor = DEFAULT_REDACTOR) -> list[tuple[str, str]]:
    """The key rules: (what, words)."""
    return [
        ("key ends with", ", ".join(redactor.sensitive_keys)),
        ("key's last word is", ", ".join(SEGMENT_KEYS)),
        ("random-looking value under a key holding", ", ".join(GENERIC_KEY_WORDS)),
    ]


def families_markdown(redactor: Redactor = DEFAULT_REDACTOR) -> str:
    """The family table of ``docs/guarantees.md`` (between :data:`TABLE_START` and
    :data:`TABLE_END`)."""
    lines = ["| Family | Rule | What it covers |", "| --- | --- | --- |"]
    for row in rule_rows(redactor):
        family = FAMILIES.get(row.family, row.family)
        lines.append(f"| {family} | `{row.name}` | {row.description.replace('|', '/')} |")
    for what, words in key_rows(redactor):
        lines.append(f"| Keys (JSON, dicts, text) | {what} | {words} |")
    return "\n".join(lines)
