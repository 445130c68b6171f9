"""The rules as data: every built-in rule is RE2, has a family and keeps the pre-check exact; the
family table in docs/guarantees.md is the generated one; ordinary agent traffic is left alone;
bytes are redacted as bytes; user rules, allow-lists and the CLI that lists and tests them."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from secret_families import CORPUS, FALSE_POSITIVES

from stepfork_otel import cli
from stepfork_otel.trace.canonical import canonical_json
from stepfork_otel.trace.payload import capture
from stepfork_otel.trace.redaction import (
    DEFAULT_PATTERNS,
    DEFAULT_REDACTOR,
    FAMILIES,
    Redactor,
    SecretPattern,
)
from stepfork_otel.trace.redaction.catalog import TABLE_END, TABLE_START, families_markdown
from stepfork_otel.trace.redaction.engine import check_pattern
from stepfork_otel.trace.redaction.files import RedactionRulesError, load_redaction_rules

ROOT = Path(__file__).resolve().parent.parent


# --- the rules -------------------------------------------------------------------------------------


def test_every_built_in_rule_is_re2_with_a_family_and_a_unique_name() -> None:
    names = [p.name for p in DEFAULT_PATTERNS]
    assert len(names) == len(set(names))
    for pattern in DEFAULT_PATTERNS:
        check_pattern(pattern.source)
        assert pattern.family in FAMILIES, pattern.name
        assert pattern.family != "user", pattern.name
        assert pattern.description, pattern.name
        assert re.fullmatch(r"[a-z0-9_]+", pattern.name), pattern.name


def test_built_in_rules_anchor_only_in_boundary_alternatives() -> None:
    # `^`/`$` only as (?:^|[...]) / (?:[...]|$): in the scan form a string's edge is a quote, which
    # those alternatives accept -- what keeps the one-scan pre-check exact
    for pattern in DEFAULT_PATTERNS:
        source = re.sub(r"\\.", "", pattern.source)  # escaped characters
        source = source.replace("[^", "[").replace("(?:^|", "(?:").replace("|$)", ")")
        assert "^" not in source, pattern.name
        assert "$" not in source, pattern.name


def test_the_family_table_in_the_docs_is_the_generated_one() -> None:
    text = (ROOT / "docs" / "guarantees.md").read_text("utf-8")
    start = text.index(TABLE_START) + len(TABLE_START)
    end = text.index(TABLE_END)
    assert text[start:end].strip() == families_markdown().strip(), (
        "regenerate with: stepfork redaction-rules --markdown"
    )


def test_every_family_has_rules_and_a_corpus_secret() -> None:
    families = {p.family for p in DEFAULT_PATTERNS}
    assert families == set(FAMILIES) - {"user"}
    redacted_by = {p.name for s in CORPUS for p in DEFAULT_REDACTOR.matching_rules(s.text)}
    unused = {p.name for p in DEFAULT_PATTERNS} - redacted_by
    assert unused == set(), f"rules no corpus secret exercises: {sorted(unused)}"


# --- false positives -------------------------------------------------------------------------------


@pytest.mark.parametrize("text", FALSE_POSITIVES, ids=lambda t: t[:40])
def test_ordinary_agent_traffic_is_left_alone(text: str) -> None:
    assert DEFAULT_REDACTOR.redact_text(text) == text
    payload = canonical_json({"content": text, "note": [text]})
    assert DEFAULT_REDACTOR.redact_canonical(payload) == payload


def test_ordinary_payload_keys_are_left_alone() -> None:
    value = {
        "max_tokens": 256,
        "prompt_tokens": 40,
        "keyboard": "us",
        "key": "flight-search",
        "passengers": 2,
        "bypass": True,
        "oauth": {"provider": "google"},
        "api_version": "2024-10-21",
        "idempotency_key": "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b",
        "session": {"id": "abc"},
    }
    text = canonical_json(value)
    assert DEFAULT_REDACTOR.redact_canonical(text) == text


# --- bytes -----------------------------------------------------------------------------------------


def test_bytes_without_a_secret_encode_as_before() -> None:
    data = b"\x00\x01 plain bytes \xff"
    payload = capture({"blob": data}, DEFAULT_REDACTOR)
    assert json.loads(payload.text)["blob"] == base64.b64encode(data).decode()


@pytest.mark.parametrize(
    "data",
    [
        b"Authorization: Bearer sk-proj-" + b"a1B2" * 12,
        b"\xff\xfe binary header then password=hunter2hunter2 and more \x00\x01",
        bytearray(b'{"api_key": "' + b"x9Y8" * 8 + b'"}'),
        memoryview(b"postgres://app:Pg5ecretPass42@db/x"),
    ],
    ids=["utf8", "binary", "bytearray", "memoryview"],
)
def test_secrets_in_bytes_are_redacted_before_base64(data: bytes) -> None:
    payload = capture({"blob": data}, DEFAULT_REDACTOR)
    decoded = base64.b64decode(json.loads(payload.text)["blob"])
    assert b"[REDACTED" in decoded
    for secret in (b"a1B2" * 12, b"hunter2hunter2", b"x9Y8" * 8, b"Pg5ecretPass42"):
        assert secret not in decoded
    assert decoded.startswith(bytes(data)[:4])  # the rest of the bytes as they were


# --- user rules, allow-lists ----------------------------------------------------------------------


def test_an_allow_list_keeps_known_false_positives() -> None:
    text = "demo key sk-test0000000000000000000000 and sk-" + "Zq9" * 10
    allowing = DEFAULT_REDACTOR.with_rules(allow=[r"sk-test0+"])
    assert allowing.redact_text(text) == (
        "demo key sk-test0000000000000000000000 and [REDACTED:openai_api_key]"
    )
    assert DEFAULT_REDACTOR.redact_text(text).count("[REDACTED") == 2


def test_user_patterns_must_be_re2() -> None:
    with pytest.raises(ValueError, match="RE2"):
        Redactor().with_rules(patterns=[("bad", r"(?<=x)y")])
    with pytest.raises(ValueError, match="RE2"):
        Redactor().with_rules(allow=[r"(a)\1"])
    # a compiled Python pattern is carried over (source and flags)
    pattern = SecretPattern("emp", re.compile(r"emp-\d{4}", re.IGNORECASE))
    assert Redactor().with_rules(patterns=[pattern]).redact_text("EMP-1234") == "[REDACTED:emp]"


def _rules_file(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(data))
    return path


def test_a_rules_file_with_patterns_descriptions_and_an_allow_list(tmp_path: Path) -> None:
    path = _rules_file(
        tmp_path,
        {
            "keys": ["ssn"],
            "patterns": [{"name": "acme", "regex": "ACME-[0-9]{4}", "description": "ACME ids"}],
            "allow": ["AKIAIOSFODNN7EXAMPLE"],
        },
    )
    redactor = load_redaction_rules(path)
    assert redactor.redact_text("ACME-1234 ssn=078-05-1120 AKIAIOSFODNN7EXAMPLE") == (
        "[REDACTED:acme] ssn=[REDACTED:sensitive_key] AKIAIOSFODNN7EXAMPLE"
    )
    (acme,) = [p for p in redactor.patterns if p.name == "acme"]
    assert (acme.family, acme.description) == ("user", "ACME ids")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"patterns": [{"name": "x", "regex": "(?<=a)b"}]}, "RE2"),
        ({"allow": ["(?!a)"]}, "allow 1"),
        ({"allow": "x"}, "'allow' must be a list"),
        ({"patterns": [{"name": "x", "regex": "a", "family": "cloud"}]}, "description"),
        ({"other": 1}, "'allow'"),
    ],
)
def test_bad_rules_files_are_refused_on_one_line(
    tmp_path: Path, data: object, message: str
) -> None:
    with pytest.raises(RedactionRulesError, match=re.escape(message)) as error:
        load_redaction_rules(_rules_file(tmp_path, data))
    assert "\n" not in str(error.value)


# --- the CLI ---------------------------------------------------------------------------------------


def test_redaction_rules_lists_every_rule_with_its_family(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["redaction-rules"]) == 0
    out = capsys.readouterr().out
    for pattern in DEFAULT_PATTERNS:
        assert pattern.name in out
    for family in set(FAMILIES.values()) - {"User rules"}:
        assert family in out
    assert cli.main(["redaction-rules", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in data["patterns"]} == {p.name for p in DEFAULT_PATTERNS}
    assert cli.main(["redaction-rules", "--markdown"]) == 0
    assert capsys.readouterr().out.strip() == families_markdown().strip()


def test_redaction_rules_with_a_rules_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _rules_file(tmp_path, {"patterns": [{"name": "acme", "regex": "ACME-[0-9]+"}]})
    assert cli.main(["redaction-rules", "--rules", str(path)]) == 0
    out = capsys.readouterr().out
    assert "User rules" in out
    assert "acme" in out
    assert cli.main(["redaction-rules", "--rules", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_redact_shows_the_redacted_text_and_the_rules(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    token = "ghp_" + "a1" * 18
    assert cli.main(["redact", f"clone with {token}"]) == 1
    captured = capsys.readouterr()
    assert captured.out.strip() == "clone with [REDACTED:github_token]"
    assert "github_token" in captured.err
    assert cli.main(["redact", "nothing to see"]) == 0
    assert capsys.readouterr().out.strip() == "nothing to see"
    assert cli.main(["redact", "--json", f"Cookie: sessionid={token}"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["redacted"] == "Cookie: [REDACTED:cookie]"
    assert set(data["rules"]) == {"cookie", "assigned_secret", "github_token"}
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(f"password={token}\n"))
    assert cli.main(["redact", "-"]) == 1
    assert "[REDACTED:assigned_secret]" in capsys.readouterr().out
    path = _rules_file(tmp_path, {"allow": [re.escape(token)]})
    assert cli.main(["redact", "--rules", str(path), token]) == 0


def test_user_patterns_may_anchor_a_whole_string() -> None:
    # `^`/`$` mean the edges of the string being redacted; the one-scan pre-check (where strings
    # sit between quotes) still finds them
    redactor = Redactor().with_rules(patterns=[("ssn", r"^\d{3}-\d{2}-\d{4}$")])
    text = canonical_json({"a": "078-05-1120", "b": "x 078-05-1120", "c": ["078-05-1120"]})
    assert redactor.redact_canonical(text) == (
        '{"a":"[REDACTED:ssn]","b":"x 078-05-1120","c":["[REDACTED:ssn]"]}'
    )


# --- user key rules inside text (issue 28) ----------------------------------------------------------

_TICKET = "TCK-" + "".join(chr(ord("a") + (n * 7) % 26) for n in range(12))  # generated


@pytest.mark.parametrize(
    "text",
    [
        f"lookup failed: ticket_ref={_TICKET}",
        f"ticket_ref: {_TICKET}",
        f"{{'ticket_ref': '{_TICKET}'}}",
        f'{{"ticket_ref": "{_TICKET}"}}',
        f"TicketRef={_TICKET} rejected",
        f"ticket-ref = {_TICKET}",
        f"MY_TICKET_REF={_TICKET}",
    ],
)
def test_a_user_key_is_redacted_in_text_as_built_in_keys_are(text: str) -> None:
    # the key is compared normalised (as dict keys are): every spelling of it in text is the key
    redactor = Redactor().with_rules(keys=["ticket_ref"])
    assert redactor.redact({"ticket_ref": _TICKET}) == {"ticket_ref": "[REDACTED]"}
    for redacted in (redactor.redact_text(text), redactor.redact_message(text)):
        assert _TICKET not in redacted
        assert "[REDACTED:sensitive_key]" in redacted
    assert DEFAULT_REDACTOR.redact_text(text) == text  # not a key without the rule


def test_a_user_key_from_a_rules_file_reaches_exception_messages_and_stepfork_redact(
    recording: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stepfork_otel import Trace, configure, record, trace_tool

    path = _rules_file(tmp_path, {"keys": ["ticket_ref"]})
    configure(redactor=load_redaction_rules(path))

    @trace_tool
    def open_ticket(ticket_ref: str) -> None:  # the argument: a dict key of the recorded input
        raise LookupError(f"no such ticket: ticket_ref={ticket_ref}")

    bundle = tmp_path / "run.sftrace"
    with record(bundle), pytest.raises(LookupError):
        open_ticket(_TICKET)
    assert _TICKET not in bundle.read_text("utf-8")
    (error,) = [e for e in Trace.load(bundle).events if e.type == "error"]
    assert "ticket_ref=[REDACTED:sensitive_key]" in str(error.model_dump())

    assert cli.main(["redact", "--rules", str(path), f"ticket_ref={_TICKET}"]) == 1
    assert capsys.readouterr().out.strip() == "ticket_ref=[REDACTED:sensitive_key]"
