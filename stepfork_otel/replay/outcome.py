"""The comparison of a replayed run's outcome with the recorded one -- shared by ``stepfork
replay``, the tests written by ``stepfork export pytest`` (through the pytest plugin's
``expect_recorded_failure`` / ``assert_recorded_output``) and ``stepfork diff``, so they give the
same verdict for the same run.

Verdicts:

* ``MATCHED`` -- the recorded run returned, and the fingerprint of the replayed return value
  (redacted canonical JSON, with the redactor in effect) equals the recorded output fingerprint;
* ``DIVERGED`` -- a different output, or returned where the recording failed (or the reverse),
  or failed with another exception type;
* ``NOT RECORDED`` -- the recorded run returned but has no final output (``set_output`` was not
  called): there is nothing to compare;
* ``REPRODUCED FAILURE`` -- the recorded run failed with type ``T`` and the replay raised ``T``
  itself, or the :class:`RecordedDependencyError` that replays a dependency's recorded ``T`` (the
  agent let the replayed failure escape, as it did while recording). Only the type is compared,
  never the message or side effects.

Type names are compared tolerantly: a class defined in ``__main__`` is recorded with its
``__qualname__`` only (``SeatUnavailableError`` when the agent ran as ``python agent.py``), while
replay imports the same class from its module (``examples.booking_agent.SeatUnavailableError``).
A name without a module therefore matches the same qualified name in any module.

Replay knowledge (layer L4): no pytest and no terminal here, so the CLI and the plugin both
import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from stepfork_otel.config import CONFIG
from stepfork_otel.replay.errors import RecordedDependencyError, ReplayError
from stepfork_otel.trace.canonical import stored_or_sha256
from stepfork_otel.trace.models import RunInfo
from stepfork_otel.trace.payload import Payload, capture, exception_message, qualified_name

Verdict = Literal["MATCHED", "DIVERGED", "NOT RECORDED", "REPRODUCED FAILURE"]

#: Said with every REPRODUCED FAILURE, so nobody reads more into it.
NOT_COMPARED = "only the exception type is compared: its message and side effects are not compared"


@dataclass(frozen=True)
class OutcomeComparison:
    """The verdict and what it was based on (fingerprints are full SHA-256 hex digests)."""

    verdict: Verdict
    detail: str
    recorded_sha256: str | None = None
    replayed_sha256: str | None = None
    replayed_preview: str | None = None
    """Redacted canonical JSON of the replayed return value (never the raw value)."""

    @property
    def ok(self) -> bool:
        return self.verdict != "DIVERGED"

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "detail": self.detail,
            "recorded_sha256": self.recorded_sha256,
            "replayed_sha256": self.replayed_sha256,
            "replayed_preview": self.replayed_preview,
        }


def same_type_name(recorded: str, actual: str) -> bool:
    """Whether two qualified exception type names name the same class, tolerating a side
    recorded from ``__main__`` (qualname only) against the same class imported from a module."""
    if recorded == actual:
        return True
    return actual.endswith("." + recorded) or recorded.endswith("." + actual)


def raised_type_names(exc: BaseException) -> list[str]:
    """The type names an exception stands for: its own, and for a replayed dependency failure
    the recorded type it carries."""
    names = [qualified_name(type(exc))]
    if isinstance(exc, RecordedDependencyError):
        names.append(exc.error_type)
    return names


def reproduces_failure(error_type: str, raised: BaseException) -> bool:
    """Whether ``raised`` stands for the recorded failure type ``error_type``: the exception's own
    type, or the recorded type a replayed dependency failure carries (``__main__`` tolerated)."""
    return any(same_type_name(error_type, name) for name in raised_type_names(raised))


def output_payload(value: Any) -> Payload:
    """A replayed return value as recording stores a run output: canonical JSON redacted with the
    redactor in effect, and its fingerprint (compared with the recorded output fingerprint)."""
    return capture(value, CONFIG.settings.redactor)


def recorded_output_sha256(run: RunInfo) -> str | None:
    """The recorded final output's fingerprint (computed from the text for legacy bundles)."""
    return stored_or_sha256(run.output, run.output_sha256)


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` with the message redacted (a live tool's exception may carry secrets)
    and cut to its first line; a replayed dependency failure names the recorded type."""
    text = exception_message(exc, CONFIG.settings.redactor)
    first = text.splitlines()[0] if text else ""
    cls = type(exc)
    name = cls.__name__ if cls.__module__.startswith("stepfork_otel.") else qualified_name(cls)
    return f"{name}: {first}" if first else name


def compare_outcome(
    run: RunInfo, *, returned: Any = None, raised: BaseException | None = None
) -> OutcomeComparison:
    """Compare what the replayed entrypoint did (``returned`` a value, or ``raised``) with the
    recorded run. A run stopped by replay itself (a :class:`ReplayError` other than a replayed
    dependency failure) is DIVERGED: the output was never produced."""
    recorded_sha = recorded_output_sha256(run)
    recorded_failed = run.status == "error"
    recorded_type = run.error_type or "an exception"
    if raised is not None:
        if isinstance(raised, ReplayError) and not isinstance(raised, RecordedDependencyError):
            return OutcomeComparison(
                "DIVERGED",
                f"not compared: replay stopped the run ({type(raised).__name__} at call "
                f"{raised.position or '?'})",
                recorded_sha,
            )
        names = raised_type_names(raised)
        if recorded_failed and run.error_type and reproduces_failure(run.error_type, raised):
            how = (
                f"the replayed failure of a dependency ({raised.error_type}) escaped the agent"
                if isinstance(raised, RecordedDependencyError)
                else f"this run raised {names[0]}"
            )
            return OutcomeComparison(
                "REPRODUCED FAILURE",
                f"the recorded run failed with {run.error_type}; {how}; {NOT_COMPARED}",
                recorded_sha,
            )
        if recorded_failed:
            return OutcomeComparison(
                "DIVERGED",
                f"the recorded run failed with {recorded_type}; this run raised "
                f"{' / '.join(dict.fromkeys(names))}",
                recorded_sha,
            )
        return OutcomeComparison(
            "DIVERGED",
            f"the recorded run returned; this run raised {describe_exception(raised)}",
            recorded_sha,
        )
    payload = output_payload(returned)
    if recorded_failed:
        return OutcomeComparison(
            "DIVERGED",
            f"the recorded run failed with {recorded_type}; this run returned",
            recorded_sha,
            payload.sha256,
            payload.text,
        )
    if recorded_sha is None:
        why = (
            "the recorded run did not finish (incomplete bundle)"
            if run.status == "unset"
            else "the recorded run has no final output (record one with run.set_output(...))"
        )
        return OutcomeComparison(
            "NOT RECORDED",
            f"{why}; the return value was not compared",
            None,
            payload.sha256,
            payload.text,
        )
    if payload.sha256 == recorded_sha:
        return OutcomeComparison(
            "MATCHED",
            "the return value, redacted, has the recorded output fingerprint",
            recorded_sha,
            payload.sha256,
            payload.text,
        )
    return OutcomeComparison(
        "DIVERGED",
        "the return value differs from the recorded output",
        recorded_sha,
        payload.sha256,
        payload.text,
    )
