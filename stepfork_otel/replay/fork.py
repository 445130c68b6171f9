"""Forking a recorded run at call N: the calls before N replayed frozen and matched strictly, the
run live from there, and -- with ``record_to`` -- the whole kept as a run of its own.

The session does the replaying (:mod:`~stepfork_otel.replay.session`: up to the fork point it is a
frozen replay, from it a live one that matches nothing); this module holds what is particular to a
fork: which calls may be a fork point (:func:`fork_point`), where a fork comes from
(:func:`origin_of`), what an approval callback is shown after the fork point (:func:`live_call`),
and the fork's bundle (:func:`fork_trace`).

Why the fork point must be a run-level call that nothing before it was still running at: the calls
before it are replayed frozen, so a call recorded *inside* one of them is never made (its body does
not run), and a call that overlapped an earlier one has no "before" to freeze. Both are refused
when the session is made, naming the call to fork at instead.

Why the fork's bundle is made when its run ends, from two bundles, rather than written as the run
goes: its calls before the fork point must be the original's -- their event lines byte for byte,
original ids, times and spans -- while the replay made other spans for them (substituted, under the
fork's own trace, and none for the calls recorded inside them, which replay skips). So the fork's
run is recorded like any run, as it goes, to ``<record_to>.partial`` (a process killed mid-fork
leaves that bundle); when the run ends, :func:`fork_trace` takes the original's calls before the
fork point and the run's calls from it on -- renumbered to follow them -- and the bundle is saved
whole at ``record_to`` and the partial file removed. A fork that did not reach its fork point writes
no bundle: its prefix did not replay, so it is no fork of that run.

The recording itself is ``otel/``'s ``record()``, which ``replay/`` may not import: the package face
provides it (:data:`RECORDER`, see :mod:`stepfork_otel._lazy`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from stepfork_otel import _lazy
from stepfork_otel.recording.contract import BoundaryCall
from stepfork_otel.replay.errors import ReplayModeError
from stepfork_otel.replay.plan import RecordedCall
from stepfork_otel.trace.bundle import bundle_fingerprint
from stepfork_otel.trace.models import (
    CapturedRead,
    Event,
    ForkOrigin,
    LlmRequest,
    RunInfo,
    ToolCall,
    Trace,
    call_label,
)
from stepfork_otel.trace.policy import ReplayMode

__all__ = [
    "RECORDER",
    "Recording",
    "check_options",
    "fork_point",
    "fork_trace",
    "live_call",
    "not_reached",
    "origin_of",
    "partial_path",
    "start_recording",
]

RECORDER = "fork recorder"
"""The name the package face provides the fork's run recorder under (``otel/run.py``)."""


class Recording(Protocol):
    """What a fork session needs of the recording of its run (``otel``'s ``RunRecorder``)."""

    path: Path | None

    def __enter__(self) -> Any: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def set_output(self, output: Any) -> None: ...


def check_options(
    mode: ReplayMode,
    fork_at: object,
    record_to: str | os.PathLike[str] | None,
    source: object = None,
) -> None:
    """:class:`ReplayModeError` for fork options that do not fit (checked before anything is
    read): ``fork_at`` is a call's position and makes the session live from it, ``record_to``
    records a fork, to another file than the bundle replayed (``source``, when a path)."""
    if (
        record_to is not None
        and isinstance(source, (str, os.PathLike))
        and os.path.realpath(record_to) == os.path.realpath(source)
    ):
        raise ReplayModeError(
            f"record_to is the bundle being replayed ({os.fspath(record_to)}): the fork is "
            "written to a file of its own, the original is kept"
        )
    if fork_at is None:
        if record_to is not None:
            raise ReplayModeError(
                "record_to records a fork (fork_at=N); to record any other replay as a run, "
                "wrap it in record(...)"
            )
        return
    if isinstance(fork_at, bool) or not isinstance(fork_at, int):
        raise ReplayModeError(
            f"fork_at is the position of a call (an int, as stepfork show numbers them), "
            f"not {fork_at!r}"
        )
    if mode is not ReplayMode.LIVE:
        raise ReplayModeError(
            f"fork_at replays the calls before the fork point frozen and runs the rest live "
            f"(LLMs run, tools as allow_live_tools and their policies say): leave the mode out, "
            f"or say 'live' (this session is {mode.value!r})"
        )


def fork_point(plan: Sequence[RecordedCall], fork_at: int) -> int:
    """The plan index of call ``fork_at``; :class:`ReplayModeError` when it cannot be a fork
    point (see the module docstring)."""
    if not 1 <= fork_at <= len(plan):
        raise ReplayModeError(
            f"fork_at={fork_at}: the bundle has {len(plan)} call(s), numbered 1 to {len(plan)}"
            " (stepfork show lists them)"
        )
    index = fork_at - 1
    rc = plan[index]
    what = f"call {fork_at} ({call_label(rc.event)})"
    if rc.parent is not None:
        outer = plan[rc.parent]
        while outer.parent is not None:
            outer = plan[outer.parent]
        raise ReplayModeError(
            f"fork_at={fork_at}: {what} was made inside {outer.event.id} "
            f"({call_label(outer.event)}), which is before the fork point and so replayed "
            f"frozen -- its body does not run, so nothing would make call {fork_at}; fork at "
            f"{outer.event.id} (fork_at={outer.index + 1}) to run its body live"
        )
    for earlier in plan[:index]:
        if earlier.parent is None and earlier.end_ns > rc.start_ns:
            raise ReplayModeError(
                f"fork_at={fork_at}: {what} started while {earlier.event.id} "
                f"({call_label(earlier.event)}) was still running (they ran concurrently), so "
                f"there is no point where every call before it had ended; fork at "
                f"{earlier.event.id} (fork_at={earlier.index + 1})"
            )
    return index


def origin_of(trace: Trace, fork_at: int, source: str | None) -> ForkOrigin:
    """Where a fork of ``trace`` at call ``fork_at`` comes from (``source``: the bundle's path)."""
    return ForkOrigin(
        trace_id=trace.trace_id,
        lines_sha256=bundle_fingerprint(trace),
        at_call=fork_at,
        span_id=trace.run.span_id,
        bundle=None if source is None else Path(source).name,
    )


def not_reached(fork_at: int) -> str:
    """The detail line of an error raised before the fork point."""
    return (
        f"this is before the fork point (call {fork_at}): the calls before it are replayed "
        "frozen and must match the recording, so the fork point was not reached"
    )


def live_call(call: BoundaryCall, position: int) -> RecordedCall:
    """What the approval callback is shown for a call after the fork point, where no recorded
    call stands for it: a :class:`RecordedCall` that describes the call about to run (no
    outcome; its id is ``live-<position in this run>``)."""
    fields: dict[str, Any] = {
        "id": f"live-{position}",
        "trace_id": "",
        "span_id": "",
        "seq": position,
        "replay_policy": call.policy,
        "input": call.input.text,
        "input_sha256": call.input.sha256,
    }
    event: ToolCall | LlmRequest
    if call.kind == "tool":
        event = ToolCall(name=call.name, **fields)
    else:
        event = LlmRequest(
            provider=call.provider or "",
            model=call.model or call.name,
            operation=call.operation or "chat",
            model_fingerprint=call.model_fingerprint,
            **fields,
        )
    return RecordedCall(
        -1, event, None, None, input_sha256=call.input.sha256, fingerprint_source="live"
    )


# --- the fork's run and its bundle -----------------------------------------------------------------


def partial_path(destination: Path) -> Path:
    """Where the fork's run is written as it goes, until its bundle is made."""
    return destination.with_name(destination.name + ".partial")


def start_recording(destination: Path, origin: ForkOrigin, run: RunInfo) -> Recording:
    """The recording of the fork's run to ``destination`` (not entered yet)."""
    recorder = _lazy.provided(RECORDER)
    recording: Recording = recorder(destination, origin=origin, run=run)
    return recording


def _renumbered(event: Event, ids: dict[str, str], shift: int) -> Event:
    if event.parent_id is not None and event.id.startswith(event.parent_id + "."):
        new_id = ids[event.parent_id] + event.id[len(event.parent_id) :]  # an outcome
    else:
        new_id = ids[event.id]
    parent = None if event.parent_id is None else ids[event.parent_id]
    return event.model_copy(update={"id": new_id, "parent_id": parent, "seq": event.seq + shift})


def fork_trace(original: Trace, origin: ForkOrigin, run: Trace, made_before: int) -> Trace:
    """The fork's bundle: ``original``'s calls before the fork point (their events as they are)
    and, renumbered to follow them, the calls ``run`` made from there. ``run`` is the fork's own
    run as it was recorded; its first ``made_before`` calls are the calls before the fork point as
    replay substituted them (those recorded inside them were skipped, so ``run`` numbers the
    rest differently). The header is the run's, with ``forked_from`` (and ``replay_mode``
    ``live``: the fork's own calls ran live, whatever the first span of its run said); the
    captured reads are the original's served before the fork point, then the run's from it on.

    Raises ``ValueError`` when ``run`` is not such a run (its first calls not substituted)."""
    at = origin.at_call
    shift = at - 1 - made_before
    prefix = [e for e in original.events if e.seq < at]
    ids: dict[str, str] = {}
    for call in run.calls:
        if call.seq <= made_before:
            if call.replay_action != "substituted" or call.parent_id is not None:
                raise ValueError(
                    f"{call.id} of the fork's run is before the fork point but was not "
                    f"substituted at run level ({call.replay_action})"
                )
        else:
            ids[call.id] = f"call-{call.seq + shift}"
    after = [_renumbered(e, ids, shift) for e in run.events if e.seq > made_before]
    served = [
        r
        for r in original.captured
        if r.kind != "audit" and r.before_call is not None and r.before_call < at
    ]
    live = [
        r.model_copy(
            update={"before_call": None if r.before_call is None else r.before_call + shift}
        )
        for r in run.captured
        if r.before_call is None or r.before_call > made_before
    ]
    captured: list[CapturedRead] = [
        r.model_copy(update={"index": n}) for n, r in enumerate([*served, *live], 1)
    ]
    return Trace(
        trace_id=run.trace_id,
        complete=run.complete,
        incomplete_reason=run.incomplete_reason,
        created_by=run.created_by,
        forked_from=origin,
        run=run.run.model_copy(update={"replay_mode": ReplayMode.LIVE.value}),  # (its own part)
        events=[*prefix, *after],
        context=run.context,
        dropped_spans=run.dropped_spans,
        captured=captured,
    )
