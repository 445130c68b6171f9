"""Where bundles go: :class:`BundleWriter` names and writes them.

The processor (``otel/processor.py``) decides *when* a bundle is complete and which spans it holds;
the writer decides *where* it goes and how it is written -- as the SDK's ``BatchSpanProcessor``
decides when a batch is done and a ``SpanExporter`` where it goes. Swapping the destination never
touches the buffering.
"""

from __future__ import annotations

from pathlib import Path

from opentelemetry import context as context_api

from stepfork_otel.trace.bundle import bundle_file_name, save_trace
from stepfork_otel.trace.models import Trace

#: The API's suppression key (set while a bundle is written, so nothing it does is traced).
_SUPPRESS_KEY = getattr(context_api, "_SUPPRESS_INSTRUMENTATION_KEY", "suppress_instrumentation")


class BundleWriter:
    """Writes bundles atomically, named by trace id in ``directory`` unless given a path."""

    def __init__(self, directory: str | Path | None = None, *, compress: bool = False) -> None:
        self.directory = Path(directory) if directory is not None else None
        """Where bundles without a destination of their own go (None: ``./traces`` when a
        run asks for a default name, nothing for calls outside runs)."""
        self.compress = compress
        """Write ``.sftrace.gz`` files."""

    def default_path(self, trace_id: str, directory: Path | None = None) -> Path:
        """``<trace_id>.sftrace`` in ``directory``, else the writer's, else ``./traces``."""
        name = bundle_file_name(trace_id, compressed=self.compress)
        return (directory or self.directory or Path("traces")) / name

    def write(self, trace: Trace, path: Path) -> Path:
        """Write ``trace`` to ``path`` atomically, with instrumentation suppressed."""
        token = context_api.attach(context_api.set_value(_SUPPRESS_KEY, True))
        try:
            return save_trace(trace, path)
        finally:
            context_api.detach(token)
