"""Substituted values: the recorded JSON rebuilt into the type the agent got while recording.

A bundle stores each output as redacted canonical JSON. Handing the agent a plain ``dict`` where
the tool returned a pydantic model (or a dataclass, a ``datetime``, ``bytes``) would make the
replayed run take other code paths than the recorded one. So a substituted value is validated
into the tool's return annotation (or an ``llm_request``'s ``response_type``) with pydantic.

The rebuilt value is kept only when it *round-trips*: its JSON, encoded as outputs are recorded
(its keys in their order), must equal the recorded text. That one check catches every way a rebuild can quietly differ from what was recorded --
an ``int`` returned where the annotation says ``float``, a redacted field, ``bytes`` in a pydantic
dataclass read back under another encoding -- and in each of those cases the agent gets the
recorded JSON value instead, with a note on the replayed call. (Trying pydantic's lax validation
and trusting it was the first version; it turned ``b"\\xff"`` into the base64 text's bytes.)

Annotations that JSON values already are (``str``, ``int``, ``float``, ``bool``, ``None``,
``Any``, and lists, dicts, tuples-as-lists and unions of those) skip pydantic: the recorded JSON
value is what a rebuild would return, and skipping it is most of a substituted call's cost.

``bytes`` are canonicalised as base64; pydantic reads JSON bytes as UTF-8 unless configured, so
the type is validated wrapped in a one-element tuple under ``val_json_bytes="base64"``: the
config then reaches stdlib dataclasses and plain containers, while pydantic models keep their
own config, exactly as their own ``model_dump`` wrote them.
"""

from __future__ import annotations

import threading
import types
import typing
from typing import Any

from pydantic import ConfigDict, TypeAdapter

from stepfork_otel.trace.canonical import as_returned_bytes

_lock = threading.Lock()
_adapters: dict[Any, TypeAdapter[Any] | None] = {}
_MAX_CACHED = 1024


def _adapter(output_type: Any) -> TypeAdapter[Any] | None:
    try:
        if output_type in _adapters:
            return _adapters[output_type]
    except TypeError:  # unhashable annotation
        return _build(output_type)
    adapter = _build(output_type)
    with _lock:
        if len(_adapters) < _MAX_CACHED:
            _adapters[output_type] = adapter
    return adapter


def _build(output_type: Any) -> TypeAdapter[Any] | None:
    try:
        return TypeAdapter(tuple[output_type], config=ConfigDict(val_json_bytes="base64"))
    except Exception:  # not a type pydantic understands: replay returns the JSON value
        return None


_NATIVE = (str, int, float, bool, type(None), object)
_native_cache: dict[Any, bool] = {}


def _json_native(tp: Any, depth: int = 0) -> bool:
    """True when every value JSON can give for ``tp`` is already of that type (no rebuild)."""
    if tp is Any or tp is None or tp in _NATIVE or tp in (dict, list):
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if depth > 8 or origin is None:
        return False
    if origin is list or origin is typing.Union or origin is types.UnionType:
        return all(_json_native(a, depth + 1) for a in args)
    if origin is dict:
        return len(args) == 2 and args[0] is str and _json_native(args[1], depth + 1)
    return False


def _is_json_native(tp: Any) -> bool:
    try:
        cached = _native_cache.get(tp)
    except TypeError:  # unhashable annotation
        return _json_native(tp)
    if cached is None:
        cached = _json_native(tp)
        if len(_native_cache) < _MAX_CACHED:
            _native_cache[tp] = cached
    return cached


def rebuild(value: Any, text: str, output_type: Any) -> tuple[Any, str | None]:
    """``(value, note)``: the recorded value as ``output_type`` when pydantic can rebuild it from
    the recorded JSON ``text`` exactly, else the JSON ``value`` as recorded and a note saying why."""
    if _is_json_native(output_type):
        return value, None
    adapter = _adapter(output_type)
    if adapter is None:
        return value, None
    name = getattr(output_type, "__qualname__", None) or repr(output_type)
    try:
        rebuilt = adapter.validate_json(f"[{text}]")[0]
    except Exception:
        return value, f"the recorded value does not validate as {name}; returned as JSON"
    try:
        same = as_returned_bytes(rebuilt).decode("utf-8") == text
    except Exception:  # e.g. UnserialisableError: the rebuilt value cannot be checked
        same = False
    if not same:
        return value, f"the recorded value does not round-trip through {name}; returned as JSON"
    return rebuilt, None
