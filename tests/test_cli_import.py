"""``stepfork import`` as a command (issue 27): it refuses to overwrite a bundle without
``--force``, as ``export`` refuses to overwrite a test; ``--json`` says the same as the lines; and
a bundle whose application span never reached the collector is not called complete."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Recording
from opentelemetry import trace as trace_api
from otlp_receiver import collector_lines

import examples.booking_agent as booking
from stepfork_otel import cli, record, trace_tool
from stepfork_otel.trace.models import Trace


@pytest.fixture
def spans(recording: Recording, tmp_path: Path) -> Path:
    """The example's two runs as a collector's file."""
    booking.main(str(tmp_path / "local"))
    path = tmp_path / "collector.jsonl"
    path.write_bytes(b"".join(collector_lines(recording.exporter.get_finished_spans(), 3)))
    return path


def _import(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(["import", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_an_existing_bundle_is_not_overwritten_without_force(
    spans: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundles"
    assert _import(capsys, spans, "-o", out)[0] == 0
    (first, second) = sorted(out.iterdir())
    first.write_text("my edited bundle\n")  # a file the user has: not to be lost silently
    before = second.read_bytes()

    code, stdout, stderr = _import(capsys, spans, "-o", out)
    assert code == 2
    assert f"{first}: NOT WRITTEN -- exists (use --force to overwrite)" in stdout.splitlines()
    assert f"{second}: NOT WRITTEN -- exists (use --force to overwrite)" in stdout.splitlines()
    assert stderr == (
        f"stepfork: error: 2 bundles not written: they exist in {out} (use --force to overwrite)\n"
    )
    assert first.read_text() == "my edited bundle\n"
    assert second.read_bytes() == before

    code, stdout, stderr = _import(capsys, spans, "-o", out, "--force")
    assert (code, stderr) == (0, "")
    assert {line.split(" -- ")[0] for line in stdout.splitlines()[:2]} == {
        f"{first}: complete",
        f"{second}: complete",
    }
    assert Trace.load(first).trace_id == first.name.removesuffix(".sftrace")


def test_import_json_says_what_the_lines_say(
    spans: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundles"
    code, stdout, _ = _import(capsys, spans, "-o", out, "--json")
    assert code == 0
    data = json.loads(stdout)
    assert list(data) == ["bundles", "summary", "problems", "exit_code"]
    by_calls = {b["calls"]: b for b in data["bundles"]}
    failure = by_calls[4]
    assert failure == {
        "path": str(out / f"{failure['trace_id']}.sftrace"),
        "written": True,
        "error": None,
        "trace_id": failure["trace_id"],
        "run": "booking_agent",
        "status": "error",
        "error_type": "examples.booking_agent.SeatUnavailableError",
        "calls": 4,
        "complete": True,
        "incomplete_reason": None,
        "missing": [],
    }
    assert Path(failure["path"]).is_file()
    assert data["summary"] == {
        "runs": 2,
        "files": 1,
        "lines": 5,
        "spans": 13,
        "ignored_traces": 0,
        "ignored_spans": 0,
        "other_signals": 0,
        "genai_log_records": 0,
        "skipped_spans": 0,
        "base64_ids": False,
    }
    assert (data["problems"], data["exit_code"]) == ([], 0)

    code, stdout, stderr = _import(capsys, spans, "-o", out, "--json")  # again: they exist
    assert code == 2
    again = json.loads(stdout)
    assert [b["written"] for b in again["bundles"]] == [False, False]
    assert {b["error"] for b in again["bundles"]} == {"exists (use --force to overwrite)"}
    assert again["exit_code"] == 2
    assert stderr.startswith("stepfork: error: 2 bundles not written")


@trace_tool
def lookup(city: str) -> dict[str, Any]:
    return {"city": city}


def test_calls_whose_application_span_never_arrived_are_incomplete(
    recording: Recording, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Calls made under an application span (no ``record()``) that was never exported -- the
    process died inside it, or the span was lost on the way -- are not a complete bundle: the
    calls under that span may be missing (locally, the bundle is complete when that span ends)."""
    request = recording.provider.get_tracer("app").start_span("handle request")
    with trace_api.use_span(request, end_on_exit=False):
        lookup("Oslo")
        lookup("Rome")
    path = tmp_path / "collector.jsonl"  # (the request span never ended: it was never exported)
    path.write_bytes(b"".join(collector_lines(recording.exporter.get_finished_spans(), 5)))
    code, stdout, _ = _import(capsys, path, "-o", tmp_path / "bundles")
    assert code == 1, stdout
    parent = format(request.get_span_context().span_id, "016x")
    lines = stdout.splitlines()
    assert lines[0].endswith(": INCOMPLETE -- run, 2 calls, unset")
    assert lines[1] == (
        f"  incomplete: span {parent}, which 'execute_tool lookup' was made in, never arrived "
        "(spans under it may be missing)"
    )
    (bundle,) = (tmp_path / "bundles").iterdir()
    assert not Trace.load(bundle).complete
    request.end()


def test_a_run_whose_application_span_never_arrived_is_complete(
    recording: Recording, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The span around a ``record()`` is outside the run's bundle: the run is whole without it."""
    request = recording.provider.get_tracer("app").start_span("handle request")
    with trace_api.use_span(request, end_on_exit=False), record(tmp_path / "local.sftrace"):
        lookup("Oslo")
    path = tmp_path / "collector.jsonl"
    path.write_bytes(b"".join(collector_lines(recording.exporter.get_finished_spans(), 5)))
    code, stdout, _ = _import(capsys, path, "-o", tmp_path / "bundles")
    assert code == 0, stdout
    assert stdout.splitlines()[0].endswith(": complete -- agent, 1 call, ok")
    request.end()


def test_a_run_that_lost_a_span_inside_it_is_incomplete(
    recording: Recording, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A span of the application inside the run was lost on the way: the calls made in it are
    cut off from the run (their parent never arrived), so the run's bundle lacks them."""
    tracer = recording.provider.get_tracer("app")
    with record(tmp_path / "local.sftrace"):
        lookup("Oslo")
        with tracer.start_as_current_span("retry loop") as lost:
            lookup("Rome")
    spans = [s for s in recording.exporter.get_finished_spans() if s.name != "retry loop"]
    path = tmp_path / "collector.jsonl"
    path.write_bytes(b"".join(collector_lines(spans, 5)))
    code, stdout, _ = _import(capsys, path, "-o", tmp_path / "bundles")
    assert code == 1, stdout
    lines = stdout.splitlines()
    assert lines[0].endswith(": INCOMPLETE -- agent, 1 call, ok")
    assert lines[1] == (
        f"  incomplete: span {format(lost.get_span_context().span_id, '016x')}, which "
        "'execute_tool lookup' was made in, never arrived (spans under it may be missing)"
    )
    assert "1 calls outside the recorded run(s) were not imported" in stdout
