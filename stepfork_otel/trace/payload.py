"""A value crossing a boundary, as it is recorded -- and how it travels on a span.

:func:`capture` turns a value into a :class:`Payload`: redacted canonical JSON and its SHA-256.
It is the hot path of recording (twice per call: input and output), so it does the least work
that keeps the guarantees: one orjson encode, one cheap redaction pre-check on the text, one hash.
The redactor is always passed in: what a payload is redacted with is the caller's decision (the
configured rules while recording, the importer's rules when rebuilding from a collector's file).

The span payload codec lives here too, both directions in one module so they cannot drift:
:func:`payload_attributes` writes a payload as span attributes (text, fingerprint and size, or
fingerprint, size and why the text was left off), :func:`read_payload` reads them back -- taking
a payload handed over in-process instead when there is one, and refusing a text that an attribute
length limit cut (its size or fingerprint no longer agree).

A payload travels on the span once. Its text is OpenInference's ``input.value``/``output.value``
(what Phoenix and Langfuse show), and ``stepfork.input``/``stepfork.output`` is written beside
it only when the canonical text differs from that value: an output whose objects' keys were not
returned in sorted order, where the canonical text (what the fingerprint is of) and the returned
one (what replay hands back) are two texts. Measured on the OTLP wire (docs/otel-setups.md): the
example agents' export is 16.7 % smaller, an LLM span late in a conversation 27 %.
Spans written before, with both attributes, read as they always did.
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
    as_returned: str | None = None
    """The same redacted value with its objects' keys in the order the call returned them,
    when that differs from ``text`` (outputs only: what replay hands back)."""

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
    """Redacted canonical JSON of ``value`` and its fingerprint.

    ``recorded`` (during replay): the text and stored fingerprint of the recorded input the
    session expects next. The value is redacted as always; when the result is that very text,
    its fingerprint -- verified against it when the session started -- is taken instead of
    hashing the text again.

    ``keep_order`` (outputs): also keep the value as returned, keys unsorted
    (:attr:`Payload.as_returned`), when that differs. It costs one more orjson encode; a value
    whose redaction changes something is also walked in returned order with the rules the one
    pre-check selected (the slow path such a value takes anyway)."""
    unserialisable = False
    default = redactor.json_default  # bytes are redacted as bytes, before they become base64
    try:
        raw = canonical_bytes(value, default)
    except UnserialisableError as exc:
        raw = canonical_bytes(unserialisable_marker(value, str(exc)))
        unserialisable = True
    text = raw.decode("utf-8")
    as_returned = None
    if keep_order and not unserialisable:
        plain = as_returned_bytes(value, default).decode("utf-8")
        if plain == text:  # its keys were in sorted order already
            redacted = redactor.redact_canonical(text)
        else:  # one pre-check for both forms; the returned one keeps its key order
            redacted, as_returned = redactor.redact_canonical_and_returned(text, plain)
    else:
        redacted = redactor.redact_canonical(text)
    if redacted is not text:
        raw = redacted.encode("utf-8")
    if recorded is not None and not unserialisable and redacted == recorded[0]:
        return Payload(recorded[0], recorded[1], len(raw))
    return Payload(redacted, hashlib.sha256(raw).hexdigest(), len(raw), unserialisable, as_returned)


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
    text, sha, size, omitted, preview, value, mime = (
        k.INPUT_KEYS if key == k.INPUT else k.OUTPUT_KEYS
    )
    if not capture_content:
        return {sha: payload.sha256, size: payload.size, omitted: k.OMITTED_CAPTURE_DISABLED}
    if payload.size > max_bytes:
        return {
            sha: payload.sha256,
            size: payload.size,
            omitted: k.OMITTED_SIZE_CAP,
            preview: payload.text[: k.PREVIEW_CHARS],
        }
    shown = payload.as_returned or payload.text  # what OpenInference shows: as returned
    attributes = {sha: payload.sha256, size: payload.size, value: shown, mime: k.MIME_JSON}
    if shown != payload.text:  # the canonical text travels too only when it is another text
        attributes[text] = payload.text
    return attributes


class SpanPayload(NamedTuple):
    """A payload read back from a span: whole (``text`` set), or only its fingerprint and size
    with the reason it is missing."""

    text: str | None
    sha256: str | None
    size: int | None
    missing: MissingReason | None
    as_returned: str | None = None
    """The value with its keys in returned order, when the span or the hand-off has it."""


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
        return SpanPayload(whole.text, whole.sha256, whole.size, None, whole.as_returned)
    raw_sha = attributes.get(sha_key)
    sha = raw_sha if isinstance(raw_sha, str) and _is_sha256(raw_sha) else None
    # A fingerprint attribute that is not 64 hex digits was itself cut by a length limit.
    sha_cut = isinstance(raw_sha, str) and sha is None
    size = attributes.get(size_key)
    size = size if isinstance(size, int) and not isinstance(size, bool) else None
    text = attributes.get(key)
    text = text if isinstance(text, str) else None
    shown = attributes.get(value_key)
    if text is None and (sha is not None or sha_cut) and isinstance(shown, str):
        text = shown  # written once, as the OpenInference value: the fingerprint says if it is
    if text is not None:
        data = text.encode("utf-8", "surrogatepass")
        if (
            sha_cut
            or (size is not None and len(data) != size)
            or (sha is not None and hashlib.sha256(data).hexdigest() != sha)
        ):
            # An attribute length limit cut the payload: never keep it as if it were whole.
            return SpanPayload(None, sha, size, "truncated")
        as_returned = shown if isinstance(shown, str) and shown != text else None
        return SpanPayload(text, sha, size, None, as_returned)
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
