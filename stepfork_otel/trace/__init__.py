"""The bundle format: what a recorded run is, and nothing that needs OpenTelemetry.

Models (data only), canonical JSON and fingerprints, payload capture and the span payload codec,
redaction (rules apart from the engine), replay policies, reading and writing bundles, their
checks, the one span -> event conversion with its grouping rule, and the OTLP JSON import. See
``docs/architecture.md``.

Importing the package runs none of its modules (``import stepfork_otel.trace.canonical`` loads
canonical JSON, not the models). Its three names are the I/O behind
:meth:`~stepfork_otel.trace.models.Trace.load`, :meth:`~stepfork_otel.trace.models.Trace.save`
and :meth:`~stepfork_otel.trace.models.Trace.from_otlp_json`, which look them up here on call:
``bundle.py`` and ``otlp.py`` import the models, so the models name them only through this face,
resolved after every module involved has finished importing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepfork_otel import _lazy

if TYPE_CHECKING:
    from stepfork_otel.trace.bundle import load_trace, save_trace
    from stepfork_otel.trace.otlp import trace_from_otlp_json

_EXPORTS: dict[str, str] = {
    "load_trace": "stepfork_otel.trace.bundle",
    "save_trace": "stepfork_otel.trace.bundle",
    "trace_from_otlp_json": "stepfork_otel.trace.otlp",
}


def __getattr__(name: str) -> Any:
    return _lazy.attribute(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = ["load_trace", "save_trace", "trace_from_otlp_json"]
