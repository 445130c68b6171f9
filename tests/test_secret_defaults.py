"""Every attribute stepfork writes goes through redaction -- the tool's description and the JSON
schema of its parameters (``tool.parameters``) included: a secret given as a parameter's
**default** (``api_key="sk-..."``) or written in the docstring reaches no span attribute, span
event or bundle, for every secret of the generated corpus (issue 28)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import Recording
from secret_families import CORPUS
from secret_families import Secret as GeneratedSecret

from stepfork_otel import configure, record, trace_tool
from stepfork_otel.constants import OI_TOOL_PARAMETERS


def _forms(secret: GeneratedSecret) -> list[str]:
    forms = [line for line in secret.secret.splitlines() if len(line) >= 6] or [secret.secret]
    return [*forms, *(json.dumps(f)[1:-1] for f in forms)]


def _tool(secret: GeneratedSecret) -> Any:
    """A tool whose defaults and docstring hold ``secret`` (under a sensitive parameter name,
    under a plain one, in free text, nested in a dict)."""
    note = f"debug dump: {secret.text} (from env)"

    def fetch(
        query: str,
        api_key: str = secret.text,
        note: str = note,
        extra: dict[str, Any] = {"headers": {"Authorization": secret.text}},  # noqa: B006
    ) -> str:
        return "ok"

    fetch.__doc__ = f"Fetch things.\n\nSeen in the logs: {note}"
    return trace_tool(fetch)


def test_no_corpus_secret_in_a_tool_default_or_docstring(
    recording: Recording, tmp_path: Path
) -> None:
    configure(redact_all_spans=True, tracer_provider=recording.provider)
    leaks: list[str] = []
    for n, secret in enumerate(CORPUS):
        recording.exporter.clear()
        path = tmp_path / f"{n:03d}.sftrace"
        with record(path):
            assert _tool(secret)("weather") == "ok"
        texts = [path.read_bytes().decode("utf-8")]
        spans = recording.exporter.get_finished_spans()
        tool_spans = [s for s in spans if (s.attributes or {}).get(OI_TOOL_PARAMETERS)]
        assert len(tool_spans) == 1, secret.family  # the schema is there, redacted
        for span in spans:
            texts += [span.name, json.dumps(dict(span.attributes or {}))]
            texts += [
                t for e in span.events for t in (e.name, json.dumps(dict(e.attributes or {})))
            ]
        if any(form in text for text in texts for form in _forms(secret)):
            leaks.append(secret.family)
    assert leaks == []


def test_a_schema_without_secrets_is_unchanged(recording: Recording) -> None:
    @trace_tool
    def lookup(city: str, limit: int = 5, unit: str = "metric") -> str:
        """Look a city up."""
        return city

    lookup("Paris")
    (span,) = recording.exporter.get_finished_spans()
    schema = json.loads(str((span.attributes or {})[OI_TOOL_PARAMETERS]))
    assert schema["properties"]["limit"]["default"] == 5
    assert schema["properties"]["unit"]["default"] == "metric"
    assert (span.attributes or {})["tool.description"] == "Look a city up."
