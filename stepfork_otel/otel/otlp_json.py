"""OTLP JSON import (collector file exporter output): implemented with issue 5."""

from __future__ import annotations

from typing import Any

from stepfork_otel.trace.models import Trace


def trace_from_otlp_json(source: Any, trace_id: str | None = None) -> Trace:
    raise NotImplementedError("OTLP JSON import is implemented with issue 5")
