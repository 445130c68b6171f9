"""Shared fixtures: every test records through its own SDK TracerProvider, with an in-memory
exporter beside the bundle processor, and internal errors re-raised so bugs cannot hide in logs."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import stepfork_otel._internal as internal
from stepfork_otel import SftraceSpanProcessor, configure
from stepfork_otel.otel import setup

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `examples` is importable as a package, as from the repo root
    sys.path.insert(0, str(ROOT))


@dataclass
class Recording:
    provider: TracerProvider
    exporter: InMemorySpanExporter
    processor: SftraceSpanProcessor
    directory: Path


@pytest.fixture(autouse=True)
def _raise_internal_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(internal, "RAISE_INTERNAL_ERRORS", True)


@pytest.fixture(autouse=True)
def _reset_settings() -> Iterator[None]:
    yield
    setup.reset()


@pytest.fixture
def recording(tmp_path: Path) -> Iterator[Recording]:
    """A private SDK provider with an InMemorySpanExporter and the bundle processor."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    directory = tmp_path / "traces"
    processor = configure(directory=directory, tracer_provider=provider)
    yield Recording(provider, exporter, processor, directory)
    provider.shutdown()


def installed(module: str) -> Any:
    """``module``, imported; the test is skipped only when its distribution is not installed. An
    installed module that fails to import (an incompatible release) fails the test instead of
    hiding behind a skip, as ``pytest.importorskip`` would."""
    import importlib
    import importlib.util

    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a parent package is missing
        found = None
    if found is None:
        pytest.skip(f"{module} is not installed")
    return importlib.import_module(module)
