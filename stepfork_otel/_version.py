"""The package version, in a module of its own so that every layer can name it without importing
the public package (``stepfork_otel/__init__.py`` sits at the top layer)."""

from __future__ import annotations

__version__ = "0.1.0"
