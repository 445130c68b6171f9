"""A value crossing a boundary, as it is recorded -- and how it travels on a span.

:func:`capture` turns a value into a :class:`Payload`: redacted JSON and its SHA-256.
It is the hot path of recording (twice per call: input and output), so it does the least work
that keeps the guarantees: one orjson encode, one cheap redaction pre-check on the text, one hash.
The redactor is always passed in: what a payload is redacted with is the caller's decision (the
configured rules while recording, the importer's rules when rebuilding from a collector's file).

The span payload codec lives here too, both directions in one module so they cannot drift:
:func:`payload_attributes` writes a payload as span attributes (text, fingerprint and size, or
fingerprint, size and why the text was left off), :func:`read_payload` reads them back -- taking
a payload handed over in-process instead when there is one, and refusing a text that an attribute
length limit cut (its size or fingerprint no longer agree).

A payload travels on the span once, as OpenInference's ``input.value``/``output.value`` (what
Phoenix and Langfuse show) beside its ``stepfork.*.sha256`` and size: an input in canonical form
(what matching compares), an output as the call returned it (what replay hands back, and what
its fingerprint is of). Nothing stepfork needs beyond that rides on the span: the whole payload
reaches the local bundle through the in-process hand-off.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, NamedTuple

from stepfork_otel import constants as k
from stepfork_otel.trace.canonical import (
    UnserialisableError,
    as_returned_bytes,
    canonical_bytes,
    unserialisable_marker,
)
from stepfork_otel.trace.models import MissingReason
from stepfork_otel.trace.redaction import Redactor

_HEX = frozenset("0123456789abcdef")


class Payload(NamedTuple):
    """A recorded payload: the redacted canonical JSON text and its fingerprint.

    A named tuple rather than a frozen dataclass: two or three are made per boundary call, and a
    frozen dataclass's ``__init__`` costs twice as much."""

    text: str
    sha256: str
    size: int
    """Size of ``text`` in UTF-8 bytes."""
    unserialisable: bool = False
    """True when the value had no canonical JSON form and ``text`` is the marker object."""

    @classmethod
    def from_text(cls, text: str) -> Payload:
        data = text.encode("utf-8")
        return cls(text, hashlib.sha256(data).hexdigest(), len(data))


def capture(
    value: Any,
    redactor: Redactor,
    recorded: tuple[str, str] | None = None,
    *,
    keep_order: bool = False,
) -> Payload:
    """Redacted JSON of ``value`` and its fingerprint: canonical (keys sorted) for what is
    matched -- inputs --, or with ``keep_order`` (outputs) the value as the call returned it,
    its objects' keys in the order they came back: what replay hands back, stored once, so that
    recording needs no second encoding and replay one decode (``docs/bundle-format.md``).

    ``recorded`` (during replay): the text and stored fingerprint of the recorded input the
    session expects next. The value is redacted as always; when the result is that very text,
    its fingerprint -- verified against it when the session started -- is taken instead of
    hashing the text again."""
    unserialisable = False
    default = redactor.json_default  # bytes are redacted as bytes, before they become base64
    try:
        raw = (as_returned_bytes if keep_order else canonical_bytes)(value, default)
    except UnserialisableError as exc:
        raw = canonical_bytes(unserialisable_marker(value, str(exc)))
        unserialisable = True
    text = raw.decode("utf-8")
    redacted = redactor.redact_canonical(text, keep_order=keep_order)
    if redacted is not text:
        raw = redacted.encode("utf-8")
    if recorded is not None and not unserialisable and redacted == recorded[0]:
        return Payload(recorded[0], recorded[1], len(raw))
    return Payload(redacted, hashlib.sha256(raw).hexdigest(), len(raw), unserialisable)


def exception_message(exc: BaseException, redactor: Redactor) -> str:
    """The message of ``exc`` as stepfork keeps it anywhere: redacted and bounded. A broken
    ``__str__`` gives a placeholder: it must not hide the exception being recorded."""
    try:
        message = str(exc)
    except Exception:
        message = f"<unprintable {type(exc).__name__}>"
    return redactor.redact_message(message)


def qualified_name(cls: type) -> str:
    """How an exception type is recorded: ``module.Qualname`` (bare for builtins and __main__)."""
    module = cls.__module__
    return (
        cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"
    )


# --- the span payload codec ----------------------------------------------------------------------


def payload_attributes(
    key: str, payload: Payload, capture_content: bool, max_bytes: int
) -> dict[str, Any]:
    """The span attributes of the input (``key`` = ``stepfork.input``) or output payload: text,
    fingerprint and size, or -- over ``max_bytes`` or with content capture off -- fingerprint,
    size and why the text was left off (plus a preview under the cap). One dict, so a span takes
    them in one call (or at start, for inputs)."""
    _, sha, size, omitted, preview, value, mime = k.INPUT_KEYS if key == k.INPUT else k.OUTPUT_KEYS
    if not capture_content:
        return {sha: payload.sha256, size: payload.size, omitted: k.OMITTED_CAPTURE_DISABLED}
    if payload.size > max_bytes:
        return {
            sha: payload.sha256,
            size: payload.size,
            omitted: k.OMITTED_SIZE_CAP,
            preview: payload.text[: k.PREVIEW_CHARS],
        }
    return {sha: payload.sha256, size: payload.size, value: payload.text, mime: k.MIME_JSON}


class SpanPayload(NamedTuple):
    """A payload read back from a span: whole (``text`` set), or only its fingerprint and size
    with the reason it is missing."""

    text: str | None
    sha256: str | None
    size: int | None
    missing: MissingReason | None


def _is_sha256(value: str) -> bool:
    return len(value) == 64 and _HEX.issuperset(value)


def read_payload(
    attributes: Mapping[str, Any], handed: Mapping[str, Payload], *, is_input: bool
) -> SpanPayload:
    """The input or output payload of a span (the inverse of :func:`payload_attributes`).

    ``handed``: payloads handed over in-process by the boundary (the local bundle processor);
    they are whole even when the span attribute was left off or cut."""
    key, sha_key, size_key, omitted_key, _, value_key, _ = (
        k.INPUT_KEYS if is_input else k.OUTPUT_KEYS
    )
    whole = handed.get(key)
    if whole is not None:
        return SpanPayload(whole.text, whole.sha256, whole.size, None)
    raw_sha = attributes.get(sha_key)
    sha = raw_sha if isinstance(raw_sha, str) and _is_sha256(raw_sha) else None
    # A fingerprint attribute that is not 64 hex digits was itself cut by a length limit.
    sha_cut = isinstance(raw_sha, str) and sha is None
    size = attributes.get(size_key)
    size = size if isinstance(size, int) and not isinstance(size, bool) else None
    shown = attributes.get(value_key)  # (on a stepfork span, the payload: it travels once)
    text = shown if isinstance(shown, str) else None
    if text is not None:
        data = text.encode("utf-8", "surrogatepass")
        if (
            sha_cut
            or (size is not None and len(data) != size)
            or (sha is not None and hashlib.sha256(data).hexdigest() != sha)
        ):
            # An attribute length limit cut the payload: never keep it as if it were whole.
            return SpanPayload(None, sha, size, "truncated")
        return SpanPayload(text, sha, size, None)
    if sha is None and not sha_cut:
        return SpanPayload(None, None, None, None)  # nothing was recorded (e.g. no run output)
    omitted = attributes.get(omitted_key)
    missing: MissingReason = (
        omitted if omitted in (k.OMITTED_SIZE_CAP, k.OMITTED_CAPTURE_DISABLED) else "not_recorded"
    )
    return SpanPayload(None, sha, size, missing)


def read_error_message(attributes: Mapping[str, Any], handed: Mapping[str, Payload]) -> str | None:
    """The redacted exception message of a failed span: the whole one handed over in-process,
    else the span attribute."""
    whole = handed.get(k.ERROR_MESSAGE)
    if whole is not None:
        return whole.text
    value = attributes.get(k.ERROR_MESSAGE)
    return value if isinstance(value, str) else None
