"""What ``docs/collectors.md`` says an imported bundle is: it loads equal to the local one (every
field), and it is not the same file -- the local bundle was written as its run went (header,
calls, trailer), the imported one in one piece. The page must not promise the same bytes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import examples.booking_agent as booking
from stepfork_otel import Trace, cli
from stepfork_otel.otel.otlp_file import OtlpJsonFileExporter

PAGE = ROOT / "docs" / "collectors.md"


def test_an_imported_bundle_loads_equal_to_the_local_one_but_is_another_file(
    recording: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exporter = OtlpJsonFileExporter(tmp_path / "collector-out" / "traces.jsonl")
    recording.provider.add_span_processor(SimpleSpanProcessor(exporter))
    booking.main(str(tmp_path / "local"))
    exporter.shutdown()
    assert cli.main(["import", str(exporter.path), "-o", str(tmp_path / "imported")]) == 0
    local = tmp_path / "local" / "failure.sftrace"
    imported = tmp_path / "imported" / f"{Trace.load(local).trace_id}.sftrace"
    assert Trace.load(imported) == Trace.load(local)
    assert imported.read_bytes() != local.read_bytes()  # the page says why; update it if equal
    capsys.readouterr()
    assert cli.main(["diff", str(imported), str(local)]) == 0
    assert "same: 4 calls" in capsys.readouterr().out


def test_the_page_does_not_promise_the_same_bytes() -> None:
    text = PAGE.read_text(encoding="utf-8")
    promises = re.findall(r"byte[ -]for[ -]byte[^.]*|cmp [^\n]*IDENTICAL", text, flags=re.I)
    assert promises == []
