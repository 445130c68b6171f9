"""A bundle rebuilt from a collector's copy of the spans equals the local bundle when the importer
is given the recording process's redaction rules -- including the application's own span names,
which the conversion redacts (they are not stepfork's payloads, so the collector has them raw).

The bug this pins: the conversion used to read the *importing* process's configured redactor, so
``stepfork import`` in a shell (built-in rules) left ``handle ACME-1234`` in the bundle while the
recording process had written ``handle [REDACTED:acme_ticket]``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import stepfork
from conftest import Recording
from opentelemetry import trace as trace_api
from otlp_receiver import collector_lines

from stepfork_otel import Redactor, configure, iter_traces_from_otlp_json, record, trace_tool
from stepfork_otel.trace.bundle import dump_trace
from stepfork_otel.trace.models import Trace
from stepfork_otel.trace.redaction.files import RedactionRulesError, load_redaction_rules

RULES = {"keys": ["ticket_ref"], "patterns": [{"name": "acme_ticket", "regex": r"ACME-\d+"}]}


@trace_tool
def lookup(ticket: str, ticket_ref: str) -> dict[str, str]:
    return {"ticket": ticket, "status": "open"}


def record_in_user_span(recording: Recording, tmp_path: Path) -> tuple[Trace, Path]:
    """One run whose call is made inside the application's span ``handle ACME-1234`` (kept as
    context), recorded with the custom rules; returns the local bundle and the collector's file
    of the same spans."""
    configure(
        redactor=Redactor().with_rules(keys=RULES["keys"], patterns=[("acme_ticket", r"ACME-\d+")])
    )
    tracer = recording.provider.get_tracer("the-application")
    with (
        record(tmp_path / "local.sftrace", input={"ticket": "ACME-1234"}) as run,
        tracer.start_as_current_span("handle ACME-1234"),
    ):
        run.set_output(lookup("ACME-1234", ticket_ref="r-77"))
    spans = recording.exporter.get_finished_spans()
    assert trace_api.format_trace_id(spans[0].context.trace_id) == run.trace_id
    collector = tmp_path / "collector.jsonl"
    collector.write_bytes(b"".join(collector_lines(spans, batch_size=2)))
    return Trace.load(tmp_path / "local.sftrace"), collector


def rules_file(tmp_path: Path, rules: object = RULES) -> Path:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(rules))
    return path


def test_local_bundle_redacts_the_user_span_name(recording: Recording, tmp_path: Path) -> None:
    local, _ = record_in_user_span(recording, tmp_path)
    assert [c.name for c in local.context] == ["handle [REDACTED:acme_ticket]"]
    assert "ACME-1234" not in dump_trace(local).decode()
    assert '"ticket_ref":"[REDACTED]"' in dump_trace(local).decode()


def test_imported_with_the_same_rules_equals_local_byte_for_byte(
    recording: Recording, tmp_path: Path
) -> None:
    local, collector = record_in_user_span(recording, tmp_path)
    redactor = load_redaction_rules(rules_file(tmp_path))
    (imported,) = iter_traces_from_otlp_json(collector, redactor=redactor)
    assert dump_trace(imported) == dump_trace(local)
    assert Trace.from_otlp_json(collector.read_bytes()).context[0].name == "handle ACME-1234"


def test_import_command_takes_the_rules_file(recording: Recording, tmp_path: Path) -> None:
    local, collector = record_in_user_span(recording, tmp_path)
    out = tmp_path / "imported"
    plain = stepfork("import", collector, "-o", out / "plain")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    (plain_bundle,) = (out / "plain").glob("*.sftrace")
    # the default is the built-in rules: the application's span name is not a built-in secret
    assert [c.name for c in Trace.load(plain_bundle).context] == ["handle ACME-1234"]

    ruled = stepfork(
        "import", collector, "-o", out / "ruled", "--redaction-rules", rules_file(tmp_path)
    )
    assert ruled.returncode == 0, ruled.stdout + ruled.stderr
    (ruled_bundle,) = (out / "ruled").glob("*.sftrace")
    # the same bytes as the local recording, in its layout (written as the run went)
    recorded = (tmp_path / "local.sftrace").read_bytes()
    assert dump_trace(Trace.load(ruled_bundle), trailer=True) == recorded
    assert dump_trace(Trace.load(ruled_bundle)) == dump_trace(local)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ("[]", "must be a JSON object with 'keys' and/or 'patterns'"),
        ('{"keys": "ssn"}', "'keys' must be a list of non-empty strings"),
        ('{"patterns": [{"name": "x"}]}', "pattern 1 must be an object"),
        ('{"patterns": [{"name": "x", "regex": "("}]}', "pattern 'x': not a regular expression"),
        ('{"keys": [], "extra": 1}', "and nothing else"),
    ],
)
def test_a_bad_rules_file_is_one_line_exit_2(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "rules.json"
    path.write_text(content)
    with pytest.raises(RedactionRulesError, match=message):
        load_redaction_rules(path)
    collector = tmp_path / "empty.jsonl"
    collector.write_text("")
    result = stepfork("import", collector, "-o", tmp_path / "out", "--redaction-rules", path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert message.split("'")[0] in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_missing_or_huge_rules_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RedactionRulesError, match="not a file"):
        load_redaction_rules(tmp_path / "absent.json")
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (1024 * 1024 + 1))
    with pytest.raises(RedactionRulesError, match="larger than"):
        load_redaction_rules(huge)
