"""A tool call's arguments, normalised: ``inspect.Signature.bind`` + ``apply_defaults``.

Defaulted parameters are part of the recorded input, so a changed default is argument drift, not
a silent reuse of a stale result. ``bind`` costs several microseconds per call, so plain
signatures get a binder of their own (:func:`simple_binder`) that gives exactly the same mapping;
``tests/test_shortcuts.py`` proves the two agree, ``TypeError`` cases included.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

Binder = Callable[[Any, Any], "dict[str, Any] | None"]


def bind_arguments(
    signature: inspect.Signature, skip_first: bool, args: Any, kwargs: Any
) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults filled in, the first parameter left out
    when ``skip_first`` (``self``/``cls``). Raises ``TypeError`` for a call that does not fit."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    if skip_first:
        arguments.pop(next(iter(signature.parameters)), None)
    return arguments


def simple_binder(signature: inspect.Signature, skip_first: bool) -> Binder | None:
    """For a signature of plain parameters (positional-or-keyword, no ``*args``/``**kwargs``),
    a function giving exactly what :func:`bind_arguments` gives -- the arguments in parameter
    order, defaults filled in -- or None when the call is not a plain one (a missing or unknown
    argument, one given twice, too many): :func:`bind_arguments` then binds it, and raises the
    same ``TypeError`` as ``bind``. None for other signatures."""
    params = list(signature.parameters.values())
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return None
    names = tuple(p.name for p in params)
    defaults = tuple(p.default for p in params)
    empty = inspect.Parameter.empty
    first = names[0] if skip_first and names else None

    def bind(args: Any, kwargs: Any) -> dict[str, Any] | None:
        given = len(args)
        if given > len(names):
            return None
        arguments = dict(zip(names, args, strict=False))
        used = 0
        for name, default in zip(names[given:], defaults[given:], strict=True):
            if name in kwargs:
                arguments[name] = kwargs[name]
                used += 1
            elif default is empty:
                return None
            else:
                arguments[name] = default
        if used != len(kwargs):
            return None
        if first is not None:
            del arguments[first]
        return arguments

    return bind
