"""Replay errors: raised on purpose, typed, with structured fields and a message built from them.

::

    ReplayError                      base of every error replay raises on purpose
    ├── ReplayMismatchError          the run left the recorded path (order, kind, name, provider,
    │   │                            model, input, fingerprint, a missing result, left-over calls)
    │   └── ReplayExhaustedError     a call after the recording was used up, or consumed twice
    ├── ReplayPolicyError            the session mode or the call's policy forbids it
    │   └── NetworkRefusedError      traffic no boundary serves, refused during a replay
    │                                (in ``replay/network.py``, beside the guard that raises it)
    ├── RecordedDependencyError      the dependency failed while recording; replayed as this
    ├── ReplayModeError              an unknown or reserved mode, or options that do not fit the
    │                                mode (also a ValueError: it is a bad argument)
    ├── ReplaySessionError           the session is misused: entered twice, nested, or reached by
    │                                a boundary after it exited
    └── BundleIntegrityError         a stored fingerprint does not match its payload (also a
                                     BundleError, so the CLI treats it as an invalid bundle)

These are not internal errors: they never pass through the "log and continue" path of recording.

Why structured fields first and the message second: the CLI, the pytest plugin and the JSON report
all need the same facts (where, what was expected, what happened, which fingerprints), and a
message parsed back into fields always drifts. So each error keeps the facts as fields
(:meth:`ReplayError.to_dict`) and builds its message from them, once.

Fingerprints in the fields and messages are full SHA-256 hex digests; the CLI abbreviates them.
No field ever holds more than the redacted previews that are already in the bundle.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from stepfork_otel.constants import ERROR_PREVIEW_CHARS
from stepfork_otel.trace.errors import BundleError, one_line
from stepfork_otel.trace.models import label

#: ``CallDescription.fingerprint_source`` of a legacy bundle's call whose fingerprint replay computed.
COMPUTED_FROM_TRACE = "computed from the loaded trace"


def preview(text: str | None, limit: int = ERROR_PREVIEW_CHARS) -> str:
    """A redacted payload shortened for a message (``<not recorded>`` when absent)."""
    if text is None:
        return "<not recorded>"
    return text if len(text) <= limit else text[:limit] + "…"


def first_difference(
    a: str, b: str, labels: tuple[str, str] = ("recorded", "this run")
) -> list[str]:
    """Where two (already redacted) payload texts first differ, with a little context."""
    i = next((n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    start = max(0, i - 30)
    width = max(len(label) for label in labels)
    return [
        f"first difference at character {i}:",
        f"  {labels[0]:<{width}}: …{a[start : i + 50]}…",
        f"  {labels[1]:<{width}}: …{b[start : i + 50]}…",
    ]


_ABSENT = object()


def _step(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "<absent>"
    return preview(json.dumps(value, ensure_ascii=False, separators=(",", ":")), 80)


def first_differing_path(a: str, b: str) -> str | None:
    """The first place (in canonical key order) where two JSON payload texts differ, as a path
    (``body.messages[0].content``, ``$`` for the whole value) with both values shortened; None
    when either is not JSON or they are equal."""
    try:
        left, right = json.loads(a), json.loads(b)
    except ValueError:
        return None
    path = ""
    while True:
        if isinstance(left, dict) and isinstance(right, dict):
            key = next(
                (
                    k
                    for k in sorted(left.keys() | right.keys())
                    if left.get(k, _ABSENT) != right.get(k, _ABSENT)
                ),
                None,
            )
            if key is None:
                return None
            path, left, right = _step(path, key), left.get(key, _ABSENT), right.get(key, _ABSENT)
        elif isinstance(left, list) and isinstance(right, list):
            index = next(
                (i for i, (x, y) in enumerate(zip(left, right, strict=False)) if x != y),
                min(len(left), len(right)),
            )
            if index == len(left) == len(right):
                return None
            path = _step(path, index)
            left = left[index] if index < len(left) else _ABSENT
            right = right[index] if index < len(right) else _ABSENT
        elif left == right and type(left) is type(right):
            return None
        else:
            return f"{path or '$'}: recorded {_shown(left)}, this run {_shown(right)}"


@dataclass(frozen=True)
class CallDescription:
    """One call as shown in diagnostics: recorded (``event_id`` set) or actual (live run)."""

    kind: str
    name: str
    provider: str | None = None
    model: str | None = None
    input_preview: str | None = None
    """The redacted canonical input (the full text; messages shorten it)."""
    input_sha256: str | None = None
    model_fingerprint: str | None = None
    event_id: str | None = None
    fingerprint_source: str = "stored"
    """``stored`` (from the bundle), ``computed from the loaded trace`` (legacy bundle without
    fingerprints) or ``live`` (computed from the call just made)."""
    output_sha256: str | None = None
    """Fingerprint of the recorded outcome (recorded calls only)."""
    operation: str | None = None

    def label(self) -> str:
        return label(self.kind, self.name, self.provider, self.model)

    def lines(self, indent: str = "    ") -> list[str]:
        # names and ids come from the bundle: one line each, so none can forge a line of its own
        out = [one_line(self.label() + (f" ({self.event_id})" if self.event_id else ""))]
        out.append(f"{indent}input: {preview(self.input_preview)}")
        source = (
            "" if self.fingerprint_source in ("stored", "live") else f" ({self.fingerprint_source})"
        )
        if self.input_sha256:
            out.append(f"{indent}input sha256: {self.input_sha256}{source}")
        if self.output_sha256:
            out.append(f"{indent}recorded output sha256: {self.output_sha256}{source}")
        if self.kind == "llm" and self.model_fingerprint:
            op = f" (operation {one_line(self.operation)})" if self.operation else ""
            out.append(f"{indent}model fingerprint: {self.model_fingerprint}{op}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
        """One line: what went wrong."""
        self.position = position
        """1-based number of the call (in this run) where replay stopped; None: not at a call."""
        self.expected = expected
        """The recorded call replay expected here."""
        self.actual = actual
        """The call this run made."""
        self.details = list(details or [])
        self.after_live_call = after_live_call
        """Hybrid/live: the last LLM call that ran live before this divergence."""
        super().__init__(self._build_message())

    def add_details(self, lines: list[str]) -> None:
        """Append detail lines (the message is rebuilt with them)."""
        if lines:
            self.details.extend(lines)
            self.args = (self._build_message(),)

    @property
    def fingerprints(self) -> dict[str, str | None]:
        """The fingerprints involved, by role (full SHA-256 hex digests)."""
        exp, act = self.expected, self.actual
        return {
            "expected_input_sha256": exp.input_sha256 if exp else None,
            "actual_input_sha256": act.input_sha256 if act else None,
            "expected_output_sha256": exp.output_sha256 if exp else None,
            "expected_model_fingerprint": exp.model_fingerprint if exp else None,
            "actual_model_fingerprint": act.model_fingerprint if act else None,
        }

    def _build_message(self) -> str:
        head = (
            f"at call {self.position} of this run: {self.reason}" if self.position else self.reason
        )
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
            live = self.after_live_call
            lines.append(
                f"  this followed the live {live.label()} call ({live.event_id or 'not recorded'}), "
                "which ran again instead of being substituted: its answer led the agent here"
            )
        lines.extend(f"  {d}" for d in self.details)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The structured fields, JSON-ready (used by ``stepfork replay --json``)."""

        def desc(d: CallDescription | None) -> dict[str, Any] | None:
            return None if d is None else d.to_dict()

        return {
            "type": type(self).__name__,
            "reason": self.reason,
            "position": self.position,
            "expected": desc(self.expected),
            "actual": desc(self.actual),
            "after_live_call": desc(self.after_live_call),
            "details": list(self.details),
            "fingerprints": self.fingerprints,
            "message": str(self),
        }


class ReplayMismatchError(ReplayError):
    """The run diverged from the recording; raised before the dependency body executes."""


class ReplayExhaustedError(ReplayMismatchError):
    """A call was made after the recording was used up, or a recorded call was consumed twice."""


class ReplayPolicyError(ReplayError):
    """The session mode, the allowlist or the call's recorded replay policy forbids this call.

    Raised before the body runs and before the recorded response is consumed: the replay cursor
    stays on the refused call."""


class ReplayModeError(ReplayError, ValueError):
    """An unknown or reserved replay mode, or session options that do not fit the mode."""


class ReplaySessionError(ReplayError):
    """The session is used outside its life: entered twice, entered inside another active session,
    or reached by a boundary after it exited (e.g. from a thread started with a copied context)."""


class RecordedDependencyError(ReplayError):
    """The dependency raised while recording; replay raises this in its place.

    ``error_type`` is the recorded exception's qualified type name and ``message`` its redacted
    message. The original exception class is never imported from the bundle, so code that caught
    the original type will not catch this one: that difference is deliberate and documented.
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

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["error_type"] = self.error_type
        out["error_message"] = self.message
        return out


class BundleIntegrityError(BundleError, ReplayError):
    """A stored fingerprint does not match its recorded payload: the bundle is rejected."""

    def __init__(self, path: str | None, problems: list[str]) -> None:
        self.problems = problems
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        reason = (
            f"bundle rejected, integrity check failed: {problems[0]}{more}; the bundle was "
            "edited or corrupted after it was written. Run `stepfork validate --verify-integrity` "
            "for the full list"
        )
        BundleError.__init__(self, path, reason)
        self.position = None
        self.expected = None
        self.actual = None
        self.details = list(problems)
        self.after_live_call = None
