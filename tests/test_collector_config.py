"""The collector configurations in ``collector-config/`` are wired as the collector requires and do
what the README promises: every component a pipeline names is defined, ``memory_limiter`` first
and ``batch`` last, the traces pipeline ends in a ``file`` exporter writing the OTLP JSON that
``stepfork import`` reads, the gateway keeps failed and marked runs, and its secret patterns mask
secrets without touching what replay needs (fingerprints, stepfork's own redaction markers)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from otlp_receiver import collector_lines

import examples.booking_agent as booking
from stepfork_otel import constants as k
from stepfork_otel.trace.models import Trace
from stepfork_otel.trace.otlp import iter_traces_from_otlp_json

CONFIG_DIR = Path(__file__).resolve().parent.parent / "collector-config"
CONFIGS = ["local.yaml", "gateway.yaml"]
SECTIONS = {"receivers": "receivers", "processors": "processors", "exporters": "exporters"}


def load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((CONFIG_DIR / name).read_text())
    assert isinstance(data, dict)
    return data


def component_type(component_id: str) -> str:
    """``file/stepfork`` -> ``file`` (the collector's ``type[/name]`` ids)."""
    return component_id.split("/", 1)[0]


@pytest.mark.parametrize("name", CONFIGS)
def test_pipelines_reference_only_defined_components(name: str) -> None:
    config = load(name)
    service = config["service"]
    used: dict[str, set[str]] = {section: set() for section in SECTIONS}
    assert service["pipelines"], "no pipelines"
    for pipeline_id, pipeline in service["pipelines"].items():
        assert component_type(pipeline_id) in ("traces", "metrics", "logs")
        assert pipeline.get("receivers"), f"{pipeline_id} has no receivers"
        assert pipeline.get("exporters"), f"{pipeline_id} has no exporters"
        for section, key in SECTIONS.items():
            for component in pipeline.get(key, []):
                assert component in (config.get(section) or {}), f"{component} is not defined"
                used[section].add(component)
    for section in SECTIONS:  # nothing defined and forgotten
        assert set(config.get(section) or {}) == used[section], section
    for extension in service.get("extensions", []):
        assert extension in config["extensions"]


@pytest.mark.parametrize("name", CONFIGS)
def test_traces_pipeline_order_and_file_exporter(name: str) -> None:
    config = load(name)
    traces = config["service"]["pipelines"]["traces"]
    processors = traces["processors"]
    assert component_type(processors[0]) == "memory_limiter"
    assert component_type(processors[-1]) == "batch"
    memory_limiter = config["processors"][processors[0]]
    assert memory_limiter["check_interval"]
    assert memory_limiter.get("limit_mib") or memory_limiter.get("limit_percentage")
    (file_id,) = [e for e in traces["exporters"] if component_type(e) == "file"]
    exporter = config["exporters"][file_id]
    assert exporter["format"] == "json"  # the OTLP JSON lines stepfork import reads
    assert exporter["path"].endswith(".jsonl")
    rotation = exporter["rotation"]
    assert set(rotation) >= {"max_megabytes", "max_days", "max_backups"}
    assert all(
        isinstance(rotation[key], int) and rotation[key] > 0
        for key in rotation
        if key != "localtime"
    )
    assert "compression" not in exporter  # zstd output cannot be imported line by line


@pytest.mark.parametrize("name", CONFIGS)
def test_otlp_receiver_accepts_large_batches_on_both_ports(name: str) -> None:
    config = load(name)
    (receiver_id,) = config["service"]["pipelines"]["traces"]["receivers"]
    assert component_type(receiver_id) == "otlp"
    protocols = config["receivers"][receiver_id]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    assert protocols["grpc"]["max_recv_msg_size_mib"] > 4  # the gRPC default refuses > 4 MiB
    assert protocols["http"]["endpoint"].endswith(":4318")
    assert protocols["http"]["max_request_body_size"] > 20 * 1024 * 1024


def test_gateway_keeps_failed_and_marked_runs() -> None:
    config = load("gateway.yaml")
    processors = config["service"]["pipelines"]["traces"]["processors"]
    assert processors.index("tail_sampling") < processors.index("batch")
    policies = config["processors"]["tail_sampling"]["policies"]
    for policy in policies:
        assert set(policy) == {"name", "type", policy["type"]}  # each policy's block is its type
    by_type = {p["type"]: p[p["type"]] for p in policies}
    assert by_type["status_code"] == {"status_codes": ["ERROR"]}
    assert by_type["boolean_attribute"] == {"key": k.RUN_KEEP, "value": True}


def test_gateway_second_line_of_defence() -> None:
    config = load("gateway.yaml")
    processors = config["service"]["pipelines"]["traces"]["processors"]
    assert "redaction" in processors
    assert any(component_type(p) == "transform" for p in processors)
    redaction = config["processors"]["redaction"]
    # without allow_all_keys the processor deletes every attribute not listed: stepfork's too
    assert redaction["allow_all_keys"] is True
    for transform_id in (p for p in processors if component_type(p) == "transform"):
        for group in config["processors"][transform_id]["trace_statements"]:
            assert group["context"] in ("span", "spanevent", "resource", "scope")
            for statement in group["statements"]:
                assert not re.search(r"stepfork\.", statement)  # never rewrites replay data


def gateway_patterns() -> list[re.Pattern[str]]:
    return [
        re.compile(p) for p in load("gateway.yaml")["processors"]["redaction"]["blocked_values"]
    ]


@pytest.mark.parametrize(
    "secret",
    [
        "sk-proj-Xf3kT9qLmN2pR8sV4wY6zA1bC5dE7gH0jK",
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_" + "a1B2c3D4e5" * 4,
        "AIza" + "Sy" + "B" * 33,
        "xoxb-1234567890-abcdefghij",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "Authorization: Bearer abcdefghijklmnopqrstuvwx",
        "-----BEGIN RSA PRIVATE KEY-----",
    ],
)
def test_gateway_patterns_mask_secrets(secret: str) -> None:
    assert any(p.search(secret) for p in gateway_patterns())


def test_gateway_patterns_leave_a_redacted_run_replayable(recording: Any, tmp_path: Path) -> None:
    """Every attribute value the example agent's spans carry (after stepfork's own redaction:
    payloads, fingerprints, markers) passes the gateway's patterns untouched, so the gateway
    does not cost a properly redacted run its replayability."""
    booking.main(str(tmp_path / "local"))
    lines = collector_lines(recording.exporter.get_finished_spans(), batch_size=100)
    text = b"".join(lines).decode()
    assert "[REDACTED" in text  # stepfork redacted the booking API key and the card token
    assert booking.BOOKING_API_KEY not in text
    patterns = gateway_patterns()
    values = re.findall(r'"stringValue":"((?:[^"\\]|\\.)*)"', text)
    assert any(re.fullmatch(r"[0-9a-f]{64}", v) for v in values)  # fingerprints are there
    assert [v for v in values if any(p.search(v) for p in patterns)] == []
    masked = text
    for pattern in patterns:  # what the redaction processor would do, "****" for each match
        masked = pattern.sub("****", masked)
    path = tmp_path / "kept.jsonl"
    path.write_text(masked)
    imported = {t.trace_id: t for t in iter_traces_from_otlp_json(path)}
    for name in ("failure", "success"):
        local = Trace.load(tmp_path / "local" / f"{name}.sftrace")
        assert imported[local.trace_id] == local


def test_local_keeps_the_log_records_in_a_file_the_import_reads() -> None:
    """openai-v2 with EVENT_ONLY puts a call's messages in log records: the local collector
    writes them as OTLP JSON lines too, to a file of their own, for the same import."""
    config = load("local.yaml")
    logs = config["service"]["pipelines"]["logs"]
    assert component_type(logs["processors"][0]) == "memory_limiter"
    assert component_type(logs["processors"][-1]) == "batch"
    (file_id,) = [e for e in logs["exporters"] if component_type(e) == "file"]
    exporter = config["exporters"][file_id]
    assert exporter["format"] == "json"
    assert exporter["path"].endswith(".jsonl")
    traces = config["service"]["pipelines"]["traces"]["exporters"]
    assert exporter["path"] not in {config["exporters"][e]["path"] for e in traces}
