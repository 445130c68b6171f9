"""Lazy re-exports for the package faces (PEP 562).

A package's ``__init__`` names its public attributes in ``_EXPORTS`` (name -> defining module)
and ``__all__``, declares them for type checkers under ``if TYPE_CHECKING:``, and resolves them on
first use with :func:`attribute`. Importing the package then runs none of its modules -- which
is what lets its modules import each other (importing ``a.b`` runs ``a/__init__`` first) without
an import cycle through the face. ``tests/test_layers.py`` checks every face keeps to this.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any


def attribute(package: str, exports: Mapping[str, str], name: str) -> Any:
    """The package's attribute ``name``, imported from where ``exports`` says it lives and kept
    in the package's namespace (later lookups do not come here)."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    setattr(sys.modules[package], name, value)
    return value
