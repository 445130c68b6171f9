"""The bundle format: what a recorded run is, and nothing that needs OpenTelemetry.

Models (data only), canonical JSON and fingerprints, payload capture and the span payload codec,
redaction (rules apart from the engine), replay policies, reading and writing bundles, their
checks, the one span -> event conversion with its grouping rule, and the OTLP JSON import. See
``docs/architecture.md``.

Importing the package connects :class:`~stepfork_otel.trace.models.Trace`'s I/O methods to the
modules that implement them (they import the models, so the models cannot import them).
"""

from __future__ import annotations

from stepfork_otel.trace import bundle as _bundle
from stepfork_otel.trace import models as _models
from stepfork_otel.trace import otlp as _otlp

_models.provide_io(
    _models.TraceIO(
        load=_bundle.load_trace,
        save=_bundle.save_trace,
        from_otlp_json=lambda source, trace_id: _otlp.trace_from_otlp_json(source, trace_id),
    )
)
