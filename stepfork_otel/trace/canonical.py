"""Canonical JSON and SHA-256 fingerprints.

Every payload that stepfork records, matches or hashes goes through :func:`canonical_json`, and a
fingerprint is always ``sha256(canonical_json(redacted_value).encode("utf-8"))``. There is exactly
one encoder (orjson) and no fallback to another JSON library: two libraries disagree on small
floats (``1e-07`` vs ``1e-7``), NaN and huge integers, so a silent fallback would change
fingerprints between two runs of the same program.

The rules (documented for users in ``docs/bundle-format.md``):

* objects: keys sorted by code point, no insignificant whitespace, UTF-8, non-ASCII unescaped;
* integers: exact decimal, any size (RFC 8785 would round beyond 2**53; we keep them exact);
* floats: shortest round-trip form (``1.0``, ``1e-7``, ``1e+16``); an int and a float are
  different values (``1`` vs ``1.0``); NaN and +/-Infinity become ``null`` (as JSON.stringify does);
* tuples and lists: arrays; sets and frozensets: arrays sorted by their elements' canonical JSON;
* ``bytes``/``bytearray``: standard base64 strings; ``datetime``/``date``/``time``: RFC 3339 strings;
  ``UUID``: string; ``Enum``: its value; ``Decimal`` and ``pathlib`` paths: ``str()``;
* pydantic models: ``model_dump(mode="json")``; dataclasses: an object of their fields;
* dict keys that are not strings: ``int``/``float``/``bool``/``None``/``Enum`` keys become the
  JSON text of the key (``1`` -> ``"1"``, ``True`` -> ``"true"``); if two keys then collide, or a
  key has another type, the value is unserialisable;
* lone surrogates in strings are replaced by U+FFFD;
* anything else is unserialisable: :class:`UnserialisableError`. The boundaries record such a
  value as ``{"$unserialisable": "<type>"}`` and replay reports it instead of inventing a value.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import enum
import hashlib
import pathlib
import re
import uuid
from typing import Any

import orjson

_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS
_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_DEPTH = 200

#: Key of the marker object that stands for a value that could not be encoded.
UNSERIALISABLE_MARKER = "$unserialisable"


class UnserialisableError(TypeError):
    """A value has no canonical JSON form (see the module docstring for what has one)."""


def _default(value: Any) -> Any:
    # Called by orjson for types it does not encode itself; whatever it returns is encoded again.
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, (set, frozenset)):
        return [orjson.Fragment(b) for b in sorted(canonical_bytes(v) for v in value)]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    model_dump = getattr(value, "model_dump", None)
    if model_dump is not None and hasattr(type(value), "model_fields"):
        return model_dump(mode="json")
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (decimal.Decimal, pathlib.PurePath)):
        return str(value)
    raise UnserialisableError(f"{type(value).__module__}.{type(value).__qualname__}")


def _key(key: Any) -> str:
    if isinstance(key, str):
        return _SURROGATE.sub("\ufffd", key)
    if isinstance(key, enum.Enum):
        return _key(key.value)
    if key is None or isinstance(key, (bool, int, float)):
        return orjson.dumps(key).decode()
    raise UnserialisableError(f"dict key of type {type(key).__qualname__}")


def _normalise(value: Any, depth: int = 0) -> Any:
    """Rewrite the parts orjson rejects (non-str keys, huge ints, surrogates) into encodable ones.

    Only reached when the fast path failed, so its cost does not matter for ordinary payloads.
    Everything orjson accepts is passed through untouched, so both paths give the same bytes.
    """
    if depth > _MAX_DEPTH:
        raise UnserialisableError(f"nesting deeper than {_MAX_DEPTH}")
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return value
    if isinstance(value, int):
        if -(2**63) <= value < 2**64:
            return value
        return orjson.Fragment(str(int(value)).encode("ascii"))
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = _key(k)
            if key in out:
                raise UnserialisableError(f"dict keys collide as {key!r}")
            out[key] = _normalise(v, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_normalise(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = sorted(
            orjson.dumps(_normalise(v, depth + 1), default=_default, option=_OPTIONS) for v in value
        )
        return [orjson.Fragment(b) for b in items]
    converted = _default(value) if not _is_native(value) else value
    if converted is value:
        return value
    return _normalise(converted, depth + 1)


def _is_native(value: Any) -> bool:
    return isinstance(value, (datetime.datetime, datetime.date, datetime.time, uuid.UUID))


def canonical_bytes(value: Any) -> bytes:
    """Canonical JSON of ``value`` as UTF-8 bytes. Raises :class:`UnserialisableError`."""
    try:
        return orjson.dumps(value, default=_default, option=_OPTIONS)
    except UnserialisableError:
        raise
    except (TypeError, orjson.JSONEncodeError) as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, UnserialisableError) else None
        if cause is not None:
            raise cause from None
        try:
            normalised = _normalise(value)
            return orjson.dumps(normalised, default=_default, option=_OPTIONS)
        except UnserialisableError:
            raise
        except (TypeError, orjson.JSONEncodeError, RecursionError) as inner:
            raise UnserialisableError(str(inner)) from None


def canonical_json(value: Any) -> str:
    """Canonical JSON of ``value`` as text (see the module docstring for the rules)."""
    return canonical_bytes(value).decode("utf-8")


def sha256_hex(text: str) -> str:
    """The fingerprint of an already canonical JSON text: SHA-256 of its UTF-8 bytes, in hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fingerprint(value: Any) -> str:
    """SHA-256 fingerprint of ``value``'s canonical JSON (``value`` must already be redacted)."""
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


def unserialisable_marker(value: Any, reason: str) -> dict[str, str]:
    """The value recorded in place of one that has no canonical JSON form."""
    return {UNSERIALISABLE_MARKER: f"{type(value).__module__}.{type(value).__qualname__}: {reason}"}
