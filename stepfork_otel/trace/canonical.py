"""Canonical JSON and SHA-256 fingerprints.

Every payload that stepfork records, matches or hashes goes through :func:`canonical_json`, and a
fingerprint is always ``sha256(canonical_json(redacted_value).encode("utf-8"))``. There is exactly
one encoder (orjson) and no fallback to another JSON library: two libraries disagree on small
floats (``1e-07`` vs ``1e-7``), NaN and huge integers, so a silent fallback would change
fingerprints between two runs of the same program.

The rules (documented for users in ``docs/bundle-format.md``):

* objects: keys sorted by code point, no insignificant whitespace, UTF-8, non-ASCII unescaped;
* integers: exact decimal, any size (RFC 8785 would round beyond 2**53; we keep them exact);
* floats: shortest round-trip form (``1.0``, ``1e-7``, ``1e+16``, ``-0.0``); an int and a float are
  different values (``1`` vs ``1.0``; RFC 8785 would write ``1``, ``1e-7``, ``10000000000000000``
  and ``0``); NaN and +/-Infinity become ``null`` (as JSON.stringify does); subclasses of ``float``
  (``numpy.float64``) are floats;
* tuples (named tuples too) and lists: arrays; sets and frozensets: arrays sorted by their
  elements' canonical JSON (so ``{1, "a"}`` is ``["a",1]``: ``"`` sorts before digits);
* ``bytes``/``bytearray``/``memoryview``: standard base64 strings -- of the bytes as redaction left
  them, when a redactor is given (see :func:`canonical_bytes`): a secret in bytes is redacted in
  the bytes, before they are encoded;
* ``datetime``/``date``/``time``: ISO 8601 / RFC 3339 strings, with the UTC offset when the value
  has one (``2024-01-02T03:04:05+00:00``, ``01:02:03+05:30``) and without when it is naive;
* ``UUID``: string; ``Enum``: its value; ``Decimal`` and ``pathlib`` paths: ``str()``;
* pydantic models: ``model_dump(mode="json")``, i.e. pydantic's own JSON rules (a UTC datetime
  ends in ``Z``, ``bytes`` are UTF-8 text), except that arrays pydantic made from sets are sorted
  as above (pydantic writes them in iteration order, which changes between processes); a model
  that pydantic cannot dump is unserialisable; dataclasses: an object of their fields;
* dict keys that are not strings: ``int``/``float``/``bool``/``None``/``Enum`` keys become the
  JSON text of the key (``1`` -> ``"1"``, ``True`` -> ``"true"``, ``2**70`` -> its exact decimal);
  if two keys then collide, or a key has another type (a tuple, bytes, ...), the value is
  unserialisable;
* lone surrogates in strings and keys are replaced by U+FFFD;
* at most 254 levels of nested arrays and objects (orjson's limit, applied on both paths);
* anything else is unserialisable: :class:`UnserialisableError`. The boundaries record such a
  value as ``{"$unserialisable": "<type>"}`` and replay reports it instead of inventing a value.

Most values are encoded by one orjson call. Only when orjson refuses a value (a non-string key, an
integer beyond 64 bits, a lone surrogate) is it rewritten by :func:`_normalise` and encoded again;
both paths give the same bytes for everything the fast path accepts.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import enum
import functools
import hashlib
import json
import math
import pathlib
import re
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import pydantic

from stepfork_otel.constants import FINGERPRINT_CHARS

_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS
_AS_RETURNED = orjson.OPT_PASSTHROUGH_DATACLASS
_SURROGATE = re.compile("[\ud800-\udfff]")
#: Deepest nesting of arrays/objects accepted (orjson refuses the 255th level).
MAX_DEPTH = 254

#: Key of the marker object that stands for a value that could not be encoded.
UNSERIALISABLE_MARKER = "$unserialisable"


class UnserialisableError(TypeError):
    """A value has no canonical JSON form (see the module docstring for what has one)."""


class _SetFound(TypeError):
    """Raised inside orjson's ``default`` to send a value holding a set down the slow path."""


BytesHook = Callable[[bytes], bytes]


def _default(value: Any, redact_bytes: BytesHook | None = None) -> Any:
    # Called by orjson for types it does not encode itself; whatever it returns is encoded again.
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        if redact_bytes is not None:
            data = redact_bytes(data)
        return base64.b64encode(data).decode("ascii")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, (set, frozenset)):
        # sorted by canonical element: done by _normalise, which also counts nesting exactly
        raise _SetFound
    if isinstance(value, pydantic.BaseModel):
        try:
            return _pydantic_json(value)
        except Exception as exc:  # e.g. bytes that are not UTF-8, a field that cannot serialise
            raise UnserialisableError(f"{_type_name(value)}: {exc}") from None
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (decimal.Decimal, pathlib.PurePath)):
        return str(value)
    if isinstance(value, float):  # a subclass (numpy.float64); NaN and infinities stay null
        return float(value)
    if isinstance(value, tuple):  # a named tuple
        return list(value)
    raise UnserialisableError(_type_name(value))


def _pydantic_json(model: pydantic.BaseModel) -> Any:
    """``model_dump(mode="json")``, with the arrays that pydantic made from sets sorted: pydantic
    writes a set in iteration order, which for strings changes from one process to the next."""
    data = model.model_dump(mode="json")
    if _may_hold_sets(type(model)):
        data = _sort_sets(model.model_dump(mode="python"), data)
    return data


@functools.lru_cache(maxsize=1024)
def _may_hold_sets(cls: type[pydantic.BaseModel]) -> bool:
    """Whether a model's core schema has a set, an ``Any`` or custom code that could return one."""
    stack: list[Any] = [getattr(cls, "__pydantic_core_schema__", None)]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            kind = node.get("type")
            if isinstance(kind, str) and (
                kind in ("set", "frozenset", "any", "is-instance") or kind.startswith("function")
            ):
                return True
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return False


def _sort_sets(python: Any, data: Any) -> Any:
    """Sort the arrays of ``data`` (JSON form) whose counterpart in ``python`` is a set."""
    if isinstance(python, (set, frozenset)) and isinstance(data, list):
        return sorted(data, key=canonical_bytes)
    if isinstance(python, dict) and isinstance(data, dict) and len(python) == len(data):
        for (_, p), k in zip(python.items(), list(data), strict=True):
            data[k] = _sort_sets(p, data[k])
    elif isinstance(python, (list, tuple)) and isinstance(data, list) and len(python) == len(data):
        data[:] = [_sort_sets(p, d) for p, d in zip(python, data, strict=True)]
    return data


def _type_name(value: Any) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


def _key(key: Any) -> str:
    if isinstance(key, str):
        return _SURROGATE.sub("\ufffd", key)
    if isinstance(key, enum.Enum):
        return _key(key.value)
    if key is None or isinstance(key, bool):
        return "null" if key is None else "true" if key else "false"
    if isinstance(key, int):
        return str(int(key))
    if isinstance(key, float):
        return orjson.dumps(float(key)).decode()
    raise UnserialisableError(f"dict key of type {type(key).__qualname__}")


def bytes_default(redact_bytes: BytesHook) -> Callable[[Any], Any]:
    """The orjson ``default`` that redacts bytes with ``redact_bytes`` before encoding them (what
    :func:`canonical_bytes` takes as ``default``; build it once per redactor)."""
    return functools.partial(_default, redact_bytes=redact_bytes)


def _normalise(value: Any, depth: int = 0, default: Callable[[Any], Any] = _default) -> Any:
    """Rewrite the parts orjson rejects (non-str keys, huge ints, surrogates) into encodable ones.

    Only reached when the fast path failed, so its cost does not matter for ordinary payloads.
    Everything orjson accepts is passed through untouched, so both paths give the same bytes.
    ``depth`` counts the arrays/objects around ``value``.
    """
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int) and not isinstance(value, enum.Enum):
        if -(2**63) <= value < 2**64:
            return int(value)
        return orjson.Fragment(str(int(value)).encode("ascii"))
    if isinstance(value, (dict, list, tuple, set, frozenset)) and depth >= MAX_DEPTH:
        raise UnserialisableError(f"nesting deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = _key(k)
            if key in out:
                raise UnserialisableError(f"dict keys collide as {key!r}")
            out[key] = _normalise(v, depth + 1, default)
        return out
    if isinstance(value, (list, tuple)):
        return [_normalise(v, depth + 1, default) for v in value]
    if isinstance(value, (set, frozenset)):
        items = sorted(
            orjson.dumps(_normalise(v, depth + 1, default), default=default, option=_OPTIONS)
            for v in value
        )
        return [orjson.Fragment(b) for b in items]
    if isinstance(value, datetime.time) and value.tzinfo is not None:
        return value.isoformat()  # orjson refuses aware times
    if _is_native(value):
        return value
    # a converted value (dataclass -> object, enum -> value, ...) is not a level of its own
    return _normalise(default(value), depth, default)


def _is_native(value: Any) -> bool:
    return isinstance(value, (datetime.datetime, datetime.date, datetime.time, uuid.UUID))


def canonical_bytes(value: Any, default: Callable[[Any], Any] = _default) -> bytes:
    """Canonical JSON of ``value`` as UTF-8 bytes. Raises :class:`UnserialisableError`.

    ``default``: :func:`bytes_default` of a redactor's bytes hook, so that bytes are redacted as
    bytes before they become base64 (the recorder passes its redactor's)."""
    return _encode(value, _OPTIONS, default)


def as_returned_bytes(value: Any, default: Callable[[Any], Any] = _default) -> bytes:
    """``value`` encoded like :func:`canonical_bytes` but with its objects' keys in the order
    the value holds them (the order a call returned them), not sorted. Raises
    :class:`UnserialisableError` where :func:`canonical_bytes` does."""
    return _encode(value, _AS_RETURNED, default)


def _encode(value: Any, option: int, default: Callable[[Any], Any] = _default) -> bytes:
    try:
        return orjson.dumps(value, default=default, option=option)
    except UnserialisableError:
        raise
    except (TypeError, orjson.JSONEncodeError) as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, UnserialisableError) else None
        if cause is not None:
            raise cause from None
        try:
            normalised = _normalise(value, 0, default)
            return orjson.dumps(normalised, default=default, option=option)
        except UnserialisableError:
            raise
        except RecursionError:
            raise UnserialisableError(f"nesting deeper than {MAX_DEPTH} levels") from None
        except (TypeError, orjson.JSONEncodeError) as inner:
            raise UnserialisableError(str(inner)) from None


def canonical_json(value: Any) -> str:
    """Canonical JSON of ``value`` as text (see the module docstring for the rules)."""
    return canonical_bytes(value).decode("utf-8")


def sha256_hex(text: str) -> str:
    """The fingerprint of an already canonical JSON text: SHA-256 of its UTF-8 bytes, in hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def stored_or_sha256(text: str | None, stored: str | None) -> str | None:
    """A payload's fingerprint: the stored one, else computed from its text (legacy and
    hand-built bundles carry none), else None when there is no text either."""
    if stored is not None:
        return stored
    return None if text is None else sha256_hex(text)


def short_fingerprint(sha: str | None, *, verbose: bool = False, missing: str = "none") -> str:
    """A SHA-256 hex digest as shown to people: its first characters and an ellipsis (the whole
    digest when ``verbose``); ``missing`` when there is none."""
    if sha is None:
        return missing
    if verbose or len(sha) <= FINGERPRINT_CHARS:
        return sha
    return sha[:FINGERPRINT_CHARS] + "…"


def fingerprint(value: Any) -> str:
    """SHA-256 fingerprint of ``value``'s canonical JSON (``value`` must already be redacted)."""
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


def unserialisable_marker(value: Any, reason: str) -> dict[str, str]:
    """The value recorded in place of one that has no canonical JSON form."""
    return {UNSERIALISABLE_MARKER: f"{_type_name(value)}: {reason}"}


def model_fingerprint(provider: str, model: str, operation: str) -> str:
    """SHA-256 of the canonical ``{"model", "operation", "provider"}`` of an LLM call: recorded
    by the boundaries, checked by replay (one definition for both). Cached: it is computed on
    every LLM call, nearly always for the same few models."""
    try:
        return _model_fingerprint(provider, model, operation)
    except TypeError:  # an unhashable value passed where a string belongs: computed, not cached
        return _model_fingerprint.__wrapped__(provider, model, operation)


@functools.lru_cache(maxsize=1024)
def _model_fingerprint(provider: str, model: str, operation: str) -> str:
    return sha256_hex(
        canonical_json({"provider": provider, "model": model, "operation": operation})
    )


# a minus sign counts as a digit: "-" and 19 digits is then a run of 20, found by the same test
_DIGITS_AS_ZERO = bytes.maketrans(b"-123456789", b"0000000000")
_LONG_RUN = b"0" * 20


def loads(text: str) -> Any:
    """Parse canonical JSON text back into a value, integers of any size exact.

    orjson reads integers exactly from -2**63 to 2**64 - 1 and silently as floats beyond, so a
    text that may hold a longer integer (20 digits, or a negative 19: nanosecond timestamps
    have 19 digits and stay on the fast path) goes to the standard library's parser. The check
    maps digits and minus signs to ``0`` and looks for a run of 20: a regex repetition costs ten
    times more. A run inside a string ("2026-11-29-0001-0002") only sends the text to the slower
    parser, which reads it the same."""
    if _LONG_RUN in text.encode("utf-8").translate(_DIGITS_AS_ZERO):
        return json.loads(text, parse_constant=_not_json, parse_float=_finite)
    return orjson.loads(text)


def _not_json(name: str) -> Any:
    # the standard library reads NaN and Infinity, which are not JSON (and orjson refuses them)
    raise ValueError(f"{name} is not valid JSON")


def _finite(text: str) -> float:
    # ... and reads 1e400 as inf, which orjson refuses too
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is out of range")
    return value
