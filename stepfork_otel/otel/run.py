"""``record(...)``: one run of an agent, kept as one `.sftrace` bundle.

The run is a root span (``invoke_agent {name}``) under which every boundary span of the run hangs,
so a collector's copy of the spans can be grouped back into this run by trace id. The bundle is
written by the :class:`~stepfork_otel.otel.processor.SftraceSpanProcessor` when the run span ends;
``record`` itself only opens and closes the span and tells the processor where the bundle goes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from contextvars import Token
from pathlib import Path
from types import TracebackType
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.util.types import AttributeValue

from stepfork_otel import constants as k
from stepfork_otel._internal import handle_internal_errors
from stepfork_otel._version import __version__
from stepfork_otel.config import CONFIG
from stepfork_otel.otel.setup import ensure_bundle_processor
from stepfork_otel.recording import determinism
from stepfork_otel.recording.spans import (
    call_start_time,
    check_attributes_kept,
    current_run,
    end_span,
    record_failure,
    write_payload,
)
from stepfork_otel.trace.models import ForkOrigin, RunInfo, Trace, payload_value
from stepfork_otel.trace.payload import capture

logger = logging.getLogger("stepfork_otel")
_UNSET: Any = object()


class RunRecorder:
    """A run being recorded. Use as ``with record(...) as run:`` or ``async with``."""

    def __init__(
        self,
        destination: str | os.PathLike[str] | None = None,
        *,
        input: Any = _UNSET,
        name: str = "agent",
        entrypoint: str | None = None,
        keep: bool = False,
        flush_interval: float | None = None,
        fsync_interval: float | None = None,
        capture: str | Iterable[str] | None = None,
        links: Sequence[Link] = (),
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        """``links`` and ``attributes``: more for the run span (a fork's: :func:`fork_recorder`)."""
        self._links = tuple(links)
        self._attributes = dict(attributes or {})
        self._groups, self._audit = determinism.capture_groups(
            CONFIG.settings.capture if capture is None else capture
        )
        self._capture: tuple[determinism.CaptureRun, object] | None = None
        self._destination = destination
        self._durability = {"flush_interval": flush_interval, "fsync_interval": fsync_interval}
        self._input = input
        self._output: Any = _UNSET
        self.name = name
        self.entrypoint = entrypoint
        self._keep = keep
        self._span: Span | None = None
        self._token: object | None = None
        self._run_token: Token[Span | None] | None = None
        self.trace_id: str | None = None
        """Hex trace id of the run (set on entry)."""
        self.path: Path | None = None
        """Where the bundle is written when the run ends (None if no bundle processor)."""

    # -- what the agent calls --------------------------------------------------------------------

    def set_output(self, output: Any) -> None:
        """Record the run's final output (redacted like every payload); the CLI compares it."""
        self._output = output

    def keep(self) -> None:
        """Mark the run for a gateway collector's tail sampling (``stepfork.run.keep = true``)."""
        self._keep = True
        if self._span is not None:
            self._span.set_attribute(k.RUN_KEEP, True)

    @property
    def trace(self) -> Trace:
        """The bundle written for this run (after the ``with`` block)."""
        if self._span is not None:
            raise RuntimeError("this run has no bundle yet: it is still running")
        if self.path is None:
            raise RuntimeError("this run has no bundle (not sampled, or no bundle processor)")
        return Trace.load(self.path)

    # -- context manager -------------------------------------------------------------------------

    def __enter__(self) -> RunRecorder:
        self._start()
        return self

    @handle_internal_errors("starting a run")
    def _start(self) -> None:
        processor = None
        with handle_internal_errors("attaching the bundle processor"):
            processor = ensure_bundle_processor()
        attributes: dict[str, Any] = {
            k.KIND: k.KIND_RUN,
            k.CALL_SEQ: 0,
            k.RUN_NAME: self.name,
            k.GEN_AI_OPERATION_NAME: k.OP_INVOKE_AGENT,
            k.GEN_AI_AGENT_NAME: self.name,
            k.OPENINFERENCE_SPAN_KIND: k.OI_KIND_AGENT,
            k.SDK_VERSION: f"stepfork_otel {__version__}",
        }
        if self.entrypoint:
            attributes[k.RUN_ENTRYPOINT] = self.entrypoint
        if self._keep:
            attributes[k.RUN_KEEP] = True
        if self._groups or self._audit:
            attributes[k.CAPTURE] = determinism.capture_label(self._groups, self._audit)
        attributes.update(self._attributes)
        tracer = CONFIG.tracer()
        span = tracer.start_span(
            f"{k.OP_INVOKE_AGENT} {self.name}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=self._links,
            start_time=call_start_time(),
            record_exception=False,
            set_status_on_exception=False,
        )
        self._span = span
        check_attributes_kept(span, tracer)
        self._token = context_api.attach(trace_api.set_span_in_context(span))
        self._run_token = current_run.set(span)
        with handle_internal_errors("starting the determinism capture"):
            self._capture = determinism.start_run(self._groups, self._audit)
        span_context = span.get_span_context()
        self.trace_id = format(span_context.trace_id, "032x")
        with handle_internal_errors("recording the run input"):
            if self._input is not _UNSET:
                write_payload(span, k.INPUT, capture(self._input, CONFIG.settings.redactor))
        if not span.is_recording():
            logger.warning(
                "stepfork_otel: the run %r was not sampled by the tracer provider's sampler; "
                "no bundle is written for it",
                self.name,
            )
        elif processor is not None:
            with handle_internal_errors("registering the bundle destination"):
                self.path = processor.set_destination(
                    span_context.trace_id,
                    self._destination,
                    span_id=span_context.span_id,
                    span=span,
                    **self._durability,
                )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span = self._span
        if span is None:
            return
        self._span = None
        with handle_internal_errors("recording the run's captured reads"):
            self._end_capture(span)
        with handle_internal_errors("recording the run outcome"):
            if self._output is not _UNSET:
                write_payload(span, k.OUTPUT, capture(self._output, CONFIG.settings.redactor))
            if exc is not None:
                record_failure(span, exc)
            else:
                span.set_attribute(k.STATUS, k.STATUS_OK)
        with handle_internal_errors("ending the run"):
            if self._run_token is not None:
                run_token, self._run_token = self._run_token, None
                current_run.reset(run_token)
            if self._token is not None:
                token, self._token = self._token, None
                context_api.detach(token)  # type: ignore[arg-type]
            end_span(span)  # the processor writes the bundle here
        if self.path is not None and not self.path.exists():
            self.path = None

    def _end_capture(self, span: Span) -> None:
        """The reads after the run's last call (and an audit's tally) go on the run span."""
        started, self._capture = self._capture, None
        if started is None:
            return
        capture = started[0]
        try:
            reads = capture.take()
            if reads is not None:
                span.set_attribute(k.CAPTURED, reads)
            tally = capture.audit_json()
            if tally is not None:
                span.set_attribute(k.CAPTURED_AUDIT, tally)
        finally:
            determinism.stop_run(started)

    async def __aenter__(self) -> RunRecorder:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


def record(
    destination: str | os.PathLike[str] | None = None,
    *,
    input: Any = _UNSET,
    name: str = "agent",
    entrypoint: str | None = None,
    keep: bool = False,
    flush_interval: float | None = None,
    fsync_interval: float | None = None,
    capture: str | Iterable[str] | None = None,
) -> RunRecorder:
    """Record one run into a bundle.

    ``destination`` is a file path (``failure.sftrace``) or a directory -- an existing one, or a
    path ending in a separator -- where the bundle is named after the trace id; None uses the
    directory given to ``configure()``. ``input`` (any JSON-able value) is stored redacted. Works
    with no prior configuration: when no SDK ``TracerProvider`` is set, the embedded default is
    installed. ``flush_interval`` / ``fsync_interval``: this run's, instead of ``configure()``'s
    (the bundle is written as the run goes; see ``configure``).
    installed.

    ``capture`` records what the run's own code reads of the clock, randomness and the
    environment, so that a replay serves the same values and checks where they were asked for:
    any of ``"time"``, ``"random"``, ``"uuid"``, ``"secrets"`` (``os.urandom``,
    ``secrets.token_*``), ``"env"`` (names and fingerprints only, checked, never served), or
    ``"all"``; ``"audit"`` records no values but lists every such read (``stepfork show``).
    None: what ``configure(capture=...)`` set (nothing by default). See ``docs/replay.md``.
    """
    return RunRecorder(
        destination,
        input=input,
        name=name,
        entrypoint=entrypoint,
        keep=keep,
        flush_interval=flush_interval,
        fsync_interval=fsync_interval,
        capture=capture,
    )


def fork_recorder(destination: Path, *, origin: ForkOrigin, run: RunInfo) -> RunRecorder:
    """The recording of a fork's run (``ReplaySession.from_trace(..., fork_at=N,
    record_to=...)``; the package face provides it to ``replay/``): a run named as the original
    ``run``, with its input and what it captured (else what ``configure(capture=...)`` says),
    whose span says where it was forked from and links to the original run's span."""
    links = []
    if origin.span_id is not None:
        original = SpanContext(
            int(origin.trace_id, 16),
            int(origin.span_id, 16),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        links.append(Link(original, {k.FORK_AT_CALL: origin.at_call}))
    return RunRecorder(
        destination,
        input=_UNSET if run.input is None else payload_value(run.input),
        name=run.name or "agent",
        entrypoint=run.entrypoint,
        capture=run.capture or None,
        links=links,
        attributes={k.FORK_OF: origin.trace_id, k.FORK_AT_CALL: origin.at_call},
    )
