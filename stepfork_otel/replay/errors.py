"""Replay errors: raised on purpose, typed, with structured fields and a message built from them.

::

    ReplayError                      base of every error replay raises on purpose
    ├── ReplayMismatchError          the run left the recorded path (order, kind, name, provider,
    │   │                            model, input, fingerprint, a missing result, left-over calls)
    │   └── ReplayExhaustedError     a call after the recording was used up, or consumed twice
    ├── ReplayPolicyError            the session mode or the call's recorded policy forbids it
    ├── RecordedDependencyError      the dependency failed while recording; replayed as this
    └── BundleIntegrityError         a stored fingerprint does not match its payload (also a
                                     BundleError, so the CLI treats it as an invalid bundle)

These are not internal errors: they never pass through the "log and continue" path of recording.
Fingerprints in the fields and messages are full SHA-256 hex digests; the CLI abbreviates them.
No field ever holds more than the redacted previews that are already in the bundle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepfork_otel.trace.bundle import BundleError

#: Characters of a redacted input preview shown in messages.
PREVIEW_CHARS = 160


def preview(text: str | None, limit: int = PREVIEW_CHARS) -> str:
    if text is None:
        return "<not recorded>"
    return text if len(text) <= limit else text[:limit] + "…"


@dataclass(frozen=True)
class CallDescription:
    """One call as shown in diagnostics: recorded (``event_id`` set) or actual (live run)."""

    kind: str
    name: str
    provider: str | None = None
    model: str | None = None
    input_preview: str | None = None
    input_sha256: str | None = None
    model_fingerprint: str | None = None
    event_id: str | None = None
    fingerprint_source: str = "stored"
    """``stored`` (from the bundle), ``computed from the loaded trace`` (legacy bundle without
    fingerprints) or ``live`` (computed from the call just made)."""

    def label(self) -> str:
        if self.kind == "llm":
            return f"llm {self.provider}/{self.model}"
        return f"tool {self.name}"

    def lines(self, indent: str = "    ") -> list[str]:
        out = [f"{self.label()}" + (f" ({self.event_id})" if self.event_id else "")]
        out.append(f"{indent}input: {preview(self.input_preview)}")
        if self.input_sha256:
            src = (
                ""
                if self.fingerprint_source in ("stored", "live")
                else f" ({self.fingerprint_source})"
            )
            out.append(f"{indent}input sha256: {self.input_sha256}{src}")
        if self.kind == "llm" and self.model_fingerprint:
            out.append(f"{indent}model fingerprint: {self.model_fingerprint}")
        return out


class ReplayError(Exception):
    """Base class of every error that replay raises on purpose."""

    def __init__(
        self,
        reason: str,
        *,
        position: int | None = None,
        expected: CallDescription | None = None,
        actual: CallDescription | None = None,
        details: list[str] | None = None,
        after_live_call: CallDescription | None = None,
    ) -> None:
        self.reason = reason
        self.position = position
        """1-based number of the call (in the live run) where replay stopped."""
        self.expected = expected
        self.actual = actual
        self.details = list(details or [])
        self.after_live_call = after_live_call
        """Hybrid/live: the last LLM call that ran live before this divergence."""
        super().__init__(self._build_message())

    @property
    def fingerprints(self) -> dict[str, str | None]:
        """The fingerprints involved, by role."""
        return {
            "expected_input_sha256": self.expected.input_sha256 if self.expected else None,
            "actual_input_sha256": self.actual.input_sha256 if self.actual else None,
            "expected_model_fingerprint": self.expected.model_fingerprint
            if self.expected
            else None,
            "actual_model_fingerprint": self.actual.model_fingerprint if self.actual else None,
        }

    def _build_message(self) -> str:
        head = f"call {self.position}: {self.reason}" if self.position else self.reason
        lines = [head]
        if self.expected is not None:
            exp = self.expected.lines()
            lines.append(f"  expected (recorded): {exp[0]}")
            lines.extend(f"  {line}" for line in exp[1:])
        if self.actual is not None:
            act = self.actual.lines()
            lines.append(f"  actual (this run):   {act[0]}")
            lines.extend(f"  {line}" for line in act[1:])
        if self.after_live_call is not None:
            lines.append(
                f"  this followed the live {self.after_live_call.label()} call "
                f"({self.after_live_call.event_id or 'not recorded'}): its new answer led here"
            )
        lines.extend(f"  {d}" for d in self.details)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The structured fields, JSON-ready (used by ``stepfork replay --json``)."""

        def desc(d: CallDescription | None) -> dict[str, Any] | None:
            return None if d is None else dict(d.__dict__.items())

        return {
            "type": type(self).__name__,
            "reason": self.reason,
            "position": self.position,
            "expected": desc(self.expected),
            "actual": desc(self.actual),
            "after_live_call": desc(self.after_live_call),
            "details": self.details,
        }


class ReplayMismatchError(ReplayError):
    """The run diverged from the recording; raised before the dependency body executes."""


class ReplayExhaustedError(ReplayMismatchError):
    """A call was made after the recording was used up, or a recorded call was consumed twice."""


class ReplayPolicyError(ReplayError):
    """The session mode, the allowlist or the call's recorded replay policy forbids this call."""


class RecordedDependencyError(ReplayError):
    """The dependency raised while recording; replay raises this in its place.

    ``error_type`` is the recorded exception's qualified type name and ``message`` its redacted
    message. The original exception class is never imported from the bundle.
    """

    def __init__(
        self,
        error_type: str,
        message: str,
        *,
        position: int | None = None,
        expected: CallDescription | None = None,
    ) -> None:
        self.error_type = error_type
        self.message = message
        super().__init__(
            f"recorded failure replayed: {error_type}: {message}",
            position=position,
            expected=expected,
        )


class BundleIntegrityError(BundleError, ReplayError):
    """A stored fingerprint does not match its recorded payload: the bundle is rejected."""

    def __init__(self, path: str | None, problems: list[str]) -> None:
        self.problems = problems
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        reason = (
            f"bundle rejected, integrity check failed: {problems[0]}{more}; "
            "run `stepfork validate --verify-integrity` for the full list"
        )
        BundleError.__init__(self, path, reason)
        self.position = None
        self.expected = None
        self.actual = None
        self.details = problems
        self.after_live_call = None
