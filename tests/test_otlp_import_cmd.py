"""``stepfork import``: bundles written atomically, one line per run, every problem named, and the
exit code says whether anything needs a look (0 whole, 1 something missing, 2 unreadable)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from otlp_receiver import collector_lines

import examples.booking_agent as booking
from stepfork_otel import cli, configure, record, trace_tool
from stepfork_otel.trace.models import Trace


@pytest.fixture
def captured(recording: Any, tmp_path: Path) -> tuple[dict[str, Trace], Path]:
    """The example's two runs as a collector's file (spans of both runs mixed in batches)."""
    booking.main(str(tmp_path / "local"))
    local = {n: Trace.load(tmp_path / "local" / f"{n}.sftrace") for n in ("failure", "success")}
    path = tmp_path / "collector.jsonl"
    path.write_bytes(b"".join(collector_lines(recording.exporter.get_finished_spans(), 3)))
    return local, path


def test_import_writes_one_bundle_per_run_and_exits_0(
    captured: tuple[dict[str, Trace], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local, path = captured
    capsys.readouterr()
    out = tmp_path / "bundles"
    assert cli.main(["import", str(path), "-o", str(out)]) == 0
    stdout = capsys.readouterr().out.splitlines()
    failure = out / f"{local['failure'].trace_id}.sftrace"
    success = out / f"{local['success'].trace_id}.sftrace"
    assert sorted(out.iterdir()) == sorted([failure, success])
    assert f"{failure}: complete -- booking_agent, 4 calls, error (SeatUnavailableError)" in stdout
    assert f"{success}: complete -- booking_agent, 7 calls, ok" in stdout
    assert stdout[-1].startswith("2 runs imported from 1 file (")
    assert Trace.load(failure) == local["failure"]


def test_trace_id_selects_one_run(
    captured: tuple[dict[str, Trace], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local, path = captured
    out = tmp_path / "one"
    wanted = local["success"].trace_id
    assert cli.main(["import", str(path), "--trace-id", wanted.upper(), "-o", str(out)]) == 0
    assert [p.name for p in out.iterdir()] == [f"{wanted}.sftrace"]


def test_unknown_trace_id_is_one_line_exit_2_and_writes_nothing(
    captured: tuple[dict[str, Trace], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, path = captured
    capsys.readouterr()
    out = tmp_path / "none"
    absent = "ab" * 16
    assert cli.main(["import", str(path), "--trace-id", absent, "-o", str(out)]) == 2
    captured_io = capsys.readouterr()
    (line,) = captured_io.err.splitlines()
    assert line.startswith(f"stepfork: error: trace {absent} is not in {path}; it holds 2 traces")
    assert captured_io.out == ""
    assert not out.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        (b"hello\nworld\n", "no OTLP trace data"),
    ],
)
def test_unreadable_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, message: str
) -> None:
    path = tmp_path / "input.jsonl"
    if content is not None:
        path.write_bytes(content)
    assert cli.main(["import", str(path), "-o", str(tmp_path / "out")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"stepfork: error: {path}: {message}")
    assert not (tmp_path / "out").exists()


def test_truncated_line_is_named_and_its_run_written_incomplete_exit_1(
    captured: tuple[dict[str, Trace], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, path = captured
    lines = path.read_bytes().splitlines(keepends=True)
    cut = lines[-1].index(b'"traceId"') + 60  # the collector died inside a span of one run
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][:cut])
    capsys.readouterr()
    out = tmp_path / "bundles"
    assert cli.main(["import", str(path), "-o", str(out)]) == 1
    stdout = capsys.readouterr().out
    assert f"{path}:{len(lines)}: truncated or not valid JSON" in stdout
    assert "INCOMPLETE" in stdout
    assert f"  incomplete: spans lost in unreadable input: {path}:{len(lines)}" in stdout
    incomplete = [t for t in map(Trace.load, out.iterdir()) if not t.complete]
    assert len(incomplete) == 1


def test_payloads_left_off_the_span_are_reported_by_import_and_validate(
    recording: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(max_span_payload_bytes=64)

    @trace_tool
    def fetch(url: str) -> str:
        return "<html>" + "x" * 100 + "</html>"

    with record(tmp_path / "local.sftrace"):
        fetch("https://example.org/" + "p" * 60)
    path = tmp_path / "collector.jsonl"
    path.write_bytes(b"".join(collector_lines(recording.exporter.get_finished_spans(), 5)))
    capsys.readouterr()
    out = tmp_path / "bundles"
    assert cli.main(["import", str(path), "-o", str(out)]) == 1
    stdout = capsys.readouterr().out
    assert (
        "  missing call-1.result: output missing (size_cap) -- replay stops at this call" in stdout
    )
    assert (
        "  missing call-1: input missing (size_cap) -- replay matches this call by its input "
        "fingerprint" in stdout
    )
    (bundle,) = out.iterdir()
    cli.main(["validate", str(bundle)])
    assert "output missing (size_cap)" in capsys.readouterr().out


def test_traces_without_stepfork_spans_only(
    recording: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tracer = recording.provider.get_tracer("the.app")
    with tracer.start_as_current_span("GET /health"):
        pass
    path = tmp_path / "plain.jsonl"
    path.write_bytes(b"".join(collector_lines(recording.exporter.get_finished_spans(), 5)))
    capsys.readouterr()
    assert cli.main(["import", str(path), "-o", str(tmp_path / "out")]) == 1
    stdout = capsys.readouterr().out
    assert (
        "0 runs imported from 1 file (1 lines, 1 spans); 1 trace without stepfork spans or calls "
        "of a known instrumentation ignored (1 spans)" in stdout
    )
    assert (
        "no recorded run found (no stepfork spans, nor calls of an instrumentation the importer "
        "reads)" in stdout
    )


def test_second_run_of_a_trace_is_named_after_its_run_span(
    recording: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tracer = recording.provider.get_tracer("the.app")

    @trace_tool
    def lookup(key: str) -> str:
        return key.upper()

    with tracer.start_as_current_span("batch job"):
        for name in ("first", "second"):
            with record(tmp_path / f"{name}.sftrace", name=name):
                lookup(name)
    second = Trace.load(tmp_path / "second.sftrace")
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"".join(collector_lines(recording.exporter.get_finished_spans(), 2)))
    out = tmp_path / "bundles"
    assert cli.main(["import", str(path), "-o", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        [f"{second.trace_id}.sftrace", f"{second.trace_id}-{second.run.span_id}.sftrace"]
    )
    assert Trace.load(out / names[1] if "-" in names[1] else out / names[0]) == second
