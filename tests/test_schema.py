"""The JSON Schema of `.sftrace` bundles: the committed copy is the generated one, its structure is
what the loader expects, and real bundles (the booking example) satisfy both the schema and the
pydantic models it was generated from.

``jsonschema`` is not a dependency; ``_validate`` below implements the handful of keywords the
generated schema uses (and fails loudly on any other), which is enough to check real bundles
against it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import Recording

from stepfork_otel.constants import FORMAT_VERSION
from stepfork_otel.trace.bundle import dump_trace, parse_trace
from stepfork_otel.trace.models import TRACE_ADAPTER, Trace
from stepfork_otel.trace.schema import SCHEMA_ID, schema_text, trace_json_schema

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "docs" / "sftrace.schema.json"
EVENT_TYPES = ("tool_call", "tool_result", "llm_request", "llm_response", "error")


def test_committed_schema_is_the_generated_one() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == schema_text(), (
        "docs/sftrace.schema.json is stale: run "
        "`python -m stepfork_otel.trace.schema > docs/sftrace.schema.json`"
    )


def test_module_prints_the_schema() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "stepfork_otel.trace.schema"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert printed == COMMITTED.read_text(encoding="utf-8")


# --- structure, by inspection --------------------------------------------------------------------


def _def(schema: dict[str, Any], ref: str) -> dict[str, Any]:
    assert ref.startswith("#/$defs/")
    found: dict[str, Any] = schema["$defs"][ref.removeprefix("#/$defs/")]
    return found


def test_schema_header_and_top_level() -> None:
    schema = trace_json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == SCHEMA_ID == f"urn:stepfork:sftrace:{FORMAT_VERSION}"
    assert schema["title"] == f"stepfork_otel .sftrace bundle, format version {FORMAT_VERSION}"
    assert "redacted canonical JSON" in schema["description"]
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["trace_id"]
    props = schema["properties"]
    assert props["format"] == {
        "const": "sftrace",
        "default": "sftrace",
        "title": "Format",
        "type": "string",
    }
    assert props["format_version"]["type"] == "integer"
    assert props["format_version"]["default"] == FORMAT_VERSION
    assert props["complete"]["type"] == "boolean"


def test_events_are_a_discriminated_union_on_type() -> None:
    schema = trace_json_schema()
    items = schema["properties"]["events"]["items"]
    assert items["discriminator"]["propertyName"] == "type"
    mapping = items["discriminator"]["mapping"]
    assert sorted(mapping) == sorted(EVENT_TYPES)
    assert sorted(branch["$ref"] for branch in items["oneOf"]) == sorted(mapping.values())
    common = ["type", "id", "trace_id", "span_id", "seq"]
    specific = {
        "tool_call": ["name"],
        "tool_result": ["name"],
        "llm_request": ["provider", "model"],
        "llm_response": ["provider", "model"],
        "error": ["error_type", "message"],
    }
    for tag, ref in mapping.items():
        event = _def(schema, ref)
        assert event["properties"]["type"]["const"] == tag
        assert event["required"] == common + specific[tag]
        assert event["additionalProperties"] is False
        fingerprint = "input_sha256" if tag in ("tool_call", "llm_request") else "output_sha256"
        payload = "input" if tag in ("tool_call", "llm_request") else "output"
        assert {"anyOf": [{"type": "string"}, {"type": "null"}]}.items() <= event["properties"][
            fingerprint
        ].items()
        assert event["properties"][payload]["anyOf"] == [{"type": "string"}, {"type": "null"}]
        assert event["properties"]["replay_policy"]["$ref"] == "#/$defs/ReplayPolicy"
    assert schema["$defs"]["ReplayPolicy"]["enum"] == [
        "replayable",
        "frozen",
        "manual",
        "forbidden",
    ]


# --- real bundles against the schema ------------------------------------------------------------

_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}
_IGNORED = {"title", "description", "default", "discriminator"}


def _validate(schema: dict[str, Any], node: dict[str, Any], value: Any, where: str) -> list[str]:
    """Errors of ``value`` against ``node`` (a subschema of ``schema``)."""
    unknown = set(node) - _IGNORED - {
        "$ref", "anyOf", "oneOf", "type", "const", "enum", "properties", "required",
        "additionalProperties", "items", "$defs", "$schema", "$id",
    }  # fmt: skip
    assert not unknown, f"the generated schema uses keywords this test does not check: {unknown}"
    if "$ref" in node:
        return _validate(schema, _def(schema, node["$ref"]), value, where)
    for keyword in ("anyOf", "oneOf"):
        if keyword in node:
            passing = [b for b in node[keyword] if not _validate(schema, b, value, where)]
            if not passing or (keyword == "oneOf" and len(passing) != 1):
                return [f"{where}: {len(passing)} branches of {keyword} match"]
            return []
    errors: list[str] = []
    kind = node.get("type")
    if kind == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = kind is None or isinstance(value, _TYPES[kind])
    if not ok:
        return [f"{where}: expected {kind}, got {type(value).__name__}"]
    if "const" in node and value != node["const"]:
        errors.append(f"{where}: expected {node['const']!r}")
    if "enum" in node and value not in node["enum"]:
        errors.append(f"{where}: {value!r} not in {node['enum']}")
    if isinstance(value, dict):
        props = node.get("properties", {})
        errors += [f"{where}.{k}: required" for k in node.get("required", []) if k not in value]
        extra = node.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                errors += _validate(schema, props[key], item, f"{where}.{key}")
            elif extra is False:
                errors.append(f"{where}.{key}: not allowed")
            elif isinstance(extra, dict):
                errors += _validate(schema, extra, item, f"{where}.{key}")
    if isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            errors += _validate(schema, node["items"], item, f"{where}[{i}]")
    return errors


@pytest.fixture
def example_bundles(recording: Recording, tmp_path: Path) -> list[Path]:
    from examples.booking_agent import main

    assert main(str(tmp_path / "out")) == 0
    paths = sorted((tmp_path / "out").glob("*.sftrace"))
    assert [p.name for p in paths] == ["failure.sftrace", "success.sftrace"]
    return paths


def test_example_bundles_satisfy_the_schema_and_the_models(example_bundles: list[Path]) -> None:
    schema = json.loads(COMMITTED.read_text(encoding="utf-8"))
    seen_types: set[str] = set()
    for path in example_bundles:
        data = path.read_bytes()
        trace = parse_trace(data, path)
        # the schema describes the bundle's data: its lines put together as one object
        document = json.loads(TRACE_ADAPTER.dump_json(trace, exclude_none=True))
        assert _validate(schema, schema, document, "$") == []
        assert TRACE_ADAPTER.validate_python(document) == trace
        assert trace == Trace.load(path)
        # the models describe every byte of the bundle (recorded: written as the run went)
        assert dump_trace(trace, trailer=b'"trailer":true' in data.split(b"\n", 1)[0]) == data
        seen_types |= {e.type for e in trace.events}
    assert seen_types == set(EVENT_TYPES)


def test_the_schema_check_rejects_broken_bundles(example_bundles: list[Path]) -> None:
    schema = trace_json_schema()
    good = json.loads(TRACE_ADAPTER.dump_json(Trace.load(example_bundles[0]), exclude_none=True))
    cases = {
        "unknown event type": lambda d: d["events"][0].update(type="shell_command"),
        "event without type": lambda d: d["events"][0].pop("type"),
        "missing required": lambda d: d["events"][0].pop("seq"),
        "extra field": lambda d: d["events"][0].update(shell="rm -rf /"),
        "wrong type": lambda d: d["events"][0].update(seq="1"),
        "bad policy": lambda d: d["events"][0].update(replay_policy="sometimes"),
        "bad format": lambda d: d.update(format="har"),
        "no trace id": lambda d: d.pop("trace_id"),
    }
    for name, breaks in cases.items():
        broken = json.loads(json.dumps(good))
        breaks(broken)
        assert _validate(schema, schema, broken, "$"), name
