"""Lazy re-exports for the package faces (PEP 562), and what the top face provides to lower layers.

A package's ``__init__`` names its public attributes in ``_EXPORTS`` (name -> defining module)
and ``__all__``, declares them for type checkers under ``if TYPE_CHECKING:``, and resolves them on
first use with :func:`attribute`. Importing the package then runs none of its modules -- which
is what lets its modules import each other (importing ``a.b`` runs ``a/__init__`` first) without
an import cycle through the face. ``tests/test_layers.py`` checks every face keeps to this.

The top face (``stepfork_otel/__init__.py``, layer L5, which may import every layer) also wires
what a lower layer needs but may not import: ``replay/`` records a fork through ``otel/``'s
``record()``, and ``replay/`` and ``otel/`` never import each other. The face names the
implementation with :func:`provide` (a string: nothing is imported), and the lower layer asks for
it with :func:`provided` when it is used. Every import of the package runs the face first, so
what it provides is always there.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any

_PROVIDED: dict[str, str] = {}
"""What the top face provides: name -> ``"module:attribute"``."""


def provide(name: str, target: str) -> None:
    """Name ``target`` (``"module:attribute"``) as the implementation of ``name``."""
    _PROVIDED[name] = target


def provided(name: str) -> Any:
    """The implementation the top face provides for ``name``, imported on first use."""
    target = _PROVIDED.get(name)
    if target is None:
        raise LookupError(f"nothing provides {name!r} (the package face stepfork_otel names it)")
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def attribute(package: str, exports: Mapping[str, str], name: str) -> Any:
    """The package's attribute ``name``, imported from where ``exports`` says it lives and kept
    in the package's namespace (later lookups do not come here)."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    setattr(sys.modules[package], name, value)
    return value
