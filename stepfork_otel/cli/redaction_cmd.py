"""``stepfork redaction-rules [--rules FILE] [--json | --markdown]``: the active redaction rules,
each with its family; ``stepfork redact TEXT... [--rules FILE] [--json]``: what recording would
keep of a text, and which rules fired.

``--rules`` adds the rules of a JSON rules file (keys, patterns, allow-list; see
``stepfork_otel.trace.redaction.files``) to the built-in ones, as recording and ``stepfork import
--redaction-rules`` do. ``stepfork redact -`` reads the text from standard input (a secret given
as an argument is visible to other processes of the machine while it runs).

Exit 0. ``redact``: 0 also when nothing was redacted, 1 when something was; 2: a rules file that
cannot be read.
"""

from __future__ import annotations

import argparse
import sys

from stepfork_otel.cli._common import (
    EXIT_BAD_INPUT,
    EXIT_DIFFERENT,
    EXIT_OK,
    Style,
    add_common_arguments,
    json_text,
    print_error,
)
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR, FAMILIES, Redactor
from stepfork_otel.trace.redaction.catalog import families_markdown, key_rows, rule_rows
from stepfork_otel.trace.redaction.files import RedactionRulesError, load_redaction_rules


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rules = subparsers.add_parser(
        "redaction-rules",
        help="list the active redaction rules, with their family",
        description="List the redaction rules recording applies: value patterns by family, "
        "then the key rules.",
    )
    _rules_option(rules)
    shown = rules.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="one JSON object")
    shown.add_argument(
        "--markdown", action="store_true", help="the family table of docs/guarantees.md"
    )
    add_common_arguments(rules)
    rules.set_defaults(_redaction="rules")
    redact = subparsers.add_parser(
        "redact",
        help="show what recording keeps of a text, and which rules fired",
        description="Redact TEXT as recording would (exception messages, strings in payloads). "
        "Exit 0: nothing to redact; 1: something was redacted.",
    )
    redact.add_argument("text", nargs="+", metavar="TEXT", help="the text ('-': standard input)")
    _rules_option(redact)
    redact.add_argument("--json", action="store_true", help="one JSON object")
    add_common_arguments(redact)
    redact.set_defaults(_redaction="redact")


def _rules_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rules",
        metavar="FILE",
        help="a JSON redaction rules file to add to the built-in rules",
    )


def _redactor(args: argparse.Namespace) -> Redactor | None:
    if not args.rules:
        return DEFAULT_REDACTOR
    try:
        return load_redaction_rules(args.rules)
    except RedactionRulesError as exc:
        print_error(f"redaction rules {exc}")
        return None


def run(args: argparse.Namespace) -> int:
    redactor = _redactor(args)
    if redactor is None:
        return EXIT_BAD_INPUT
    if args._redaction == "rules":
        return _list(redactor, args)
    return _redact(redactor, args)


def _list(redactor: Redactor, args: argparse.Namespace) -> int:
    rows = rule_rows(redactor)
    if args.markdown:
        print(families_markdown(redactor))
        return EXIT_OK
    if args.json:
        data = {
            "patterns": [
                {"family": r.family, "name": r.name, "description": r.description, "regex": r.regex}
                for r in rows
            ],
            "keys": dict(key_rows(redactor)),
            "allow": list(redactor.allow),
        }
        print(json_text(data))
        return EXIT_OK
    style = Style(sys.stdout)
    family = None
    for row in rows:
        if row.family != family:
            family = row.family
            print(style.line(style.bold(FAMILIES.get(family, family))))
        print(style.line(f"  {row.name:<28} {row.description}"))
    print(style.line(style.bold("Keys (JSON, dicts, text)")))
    for what, words in key_rows(redactor):
        print(style.line(f"  {what}: {words}"))
    if redactor.allow:
        print(style.line(style.bold("Allowed (never redacted)")))
        for regex in redactor.allow:
            print(style.line(f"  {regex}"))
    print(style.line(f"{len(rows)} patterns in {len({r.family for r in rows})} families"))
    return EXIT_OK


def _redact(redactor: Redactor, args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.text == ["-"] else " ".join(args.text)
    redacted = redactor.redact_text(text)
    fired = [p.name for p in redactor.matching_rules(text)]
    if args.json:
        print(json_text({"redacted": redacted, "rules": fired}))
    else:
        style = Style(sys.stdout)
        print(style.line(redacted))
        if fired:
            print(style.line(f"rules: {', '.join(fired)}"), file=sys.stderr)
    return EXIT_DIFFERENT if redacted != text else EXIT_OK
