"""A tool call's arguments, normalised: ``inspect.Signature.bind`` + ``apply_defaults``, with the
parameters that are not the tool's input left out.

Defaulted parameters are part of the recorded input, so a changed default is argument drift, not
a silent reuse of a stale result. ``bind`` costs several microseconds per call, so plain
signatures get a binder of their own (:func:`simple_binder`) that gives exactly the same mapping;
``tests/test_shortcuts.py`` proves the two agree, ``TypeError`` cases included.

Left out of the input (:attr:`ToolArguments.left_out`): a first ``self``/``cls``, the names the tool's author
gives (``@trace_tool(exclude=("ctx",))``), and **framework context** -- what a framework passes
to a tool beside its arguments: pydantic-ai's ``RunContext``, LangChain's ``RunnableConfig``,
callback handlers and managers, run managers. It is not what the tool was asked (a run context
holds the model, the usage so far, the whole message history; a callback manager, handlers) and
has no JSON form, so recording it made a call that could never be replayed. It is found by the
parameter's annotation or, for a parameter without one, by the type of the value passed
(:meth:`ToolArguments.bind`), matching a class's name and top-level package in its MRO
(:data:`FRAMEWORK_CONTEXT`): nothing is imported, and a framework that is not installed is never
looked for. Recording and replay build the input by this same code, so what is left out while
recording is left out when the replayed call is matched.
"""

from __future__ import annotations

import inspect
import sys
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Binder = Callable[[Any, Any], "dict[str, Any] | None"]

#: Classes whose parameters are framework context, as ``(top-level package, class name)``: a
#: parameter annotated with one of them (or a subclass, a generic alias of one, an ``Optional``
#: or ``Union`` of them, a list of them), or given an instance of one, is not the tool's input.
FRAMEWORK_CONTEXT: frozenset[tuple[str, str]] = frozenset(
    {
        ("pydantic_ai", "RunContext"),
        ("langchain_core", "RunnableConfig"),
        ("langchain_core", "BaseCallbackHandler"),
        ("langchain_core", "BaseCallbackManager"),
        ("langchain_core", "BaseRunManager"),
    }
)

#: The names a tool's annotation gives framework context by, when it is a string that cannot be
#: evaluated (imported under ``TYPE_CHECKING``): the class or alias -> its framework's package.
CONTEXT_NAMES: dict[str, str] = {
    "RunContext": "pydantic_ai",
    "RunnableConfig": "langchain_core",
    "Callbacks": "langchain_core",
    "BaseCallbackHandler": "langchain_core",
    "BaseCallbackManager": "langchain_core",
    "CallbackManager": "langchain_core",
    "AsyncCallbackManager": "langchain_core",
    "BaseRunManager": "langchain_core",
    "CallbackManagerForToolRun": "langchain_core",
    "AsyncCallbackManagerForToolRun": "langchain_core",
}

_SELF_NAMES = ("self", "cls")
_UNION_TYPES: tuple[Any, ...] = (typing.Union, types.UnionType)
_SEQUENCES: tuple[Any, ...] = (list, tuple, set, frozenset, Sequence, Collection)


def bind_arguments(
    signature: inspect.Signature, leave_out: Collection[str], args: Any, kwargs: Any
) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults filled in, the names in ``leave_out``
    left out (also from a ``**kwargs`` parameter's mapping). Raises ``TypeError`` for a call
    that does not fit."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    if leave_out:
        for name, param in signature.parameters.items():
            if name in leave_out:
                arguments.pop(name, None)
            elif param.kind is param.VAR_KEYWORD and name in arguments:
                extra = arguments[name]
                arguments[name] = {k: v for k, v in extra.items() if k not in leave_out}
    return arguments


def simple_binder(signature: inspect.Signature, leave_out: Collection[str]) -> Binder | None:
    """For a signature of plain parameters (positional-or-keyword, no ``*args``/``**kwargs``),
    a function giving exactly what :func:`bind_arguments` gives -- the arguments in parameter
    order, defaults filled in, ``leave_out`` left out -- or None when the call is not a plain
    one (a missing or unknown argument, one given twice, too many): :func:`bind_arguments` then
    binds it, and raises the same ``TypeError`` as ``bind``. None for other signatures."""
    params = list(signature.parameters.values())
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return None
    names = tuple(p.name for p in params)
    defaults = tuple(p.default for p in params)
    empty = inspect.Parameter.empty
    dropped = tuple(name for name in names if name in leave_out)

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
        for name in dropped:
            del arguments[name]
        return arguments

    return bind


# --- what is not the tool's input ----------------------------------------------------------------


_judged: dict[type, bool] = {}
"""Classes already judged by :func:`is_context_class` (a watched parameter's value is judged on
every call)."""


def is_context_class(cls: type) -> bool:
    """``cls`` is (or derives from) a framework context class of :data:`FRAMEWORK_CONTEXT`."""
    judged = _judged.get(cls)
    if judged is None:
        judged = _judged[cls] = any(
            (str(getattr(klass, "__module__", "")).partition(".")[0], klass.__qualname__)
            in FRAMEWORK_CONTEXT
            for klass in getattr(cls, "__mro__", ())
        )
    return judged


def is_context_annotation(annotation: Any, depth: int = 0) -> bool:
    """An annotation naming framework context: a context class, a generic alias of one
    (``RunContext[Deps]``), a list of them, or an ``Optional``/``Union`` whose members all are
    (LangChain's ``Callbacks``). A string (an annotation that could not be evaluated, its name
    imported only for type checkers) is judged by the class it names, when that class's
    framework is imported (without it, nothing can pass one)."""
    if depth > 4 or annotation is None or annotation is type(None):
        return False
    if isinstance(annotation, str):
        names = [_bare_name(member) for member in _members(annotation)]
        names = [name for name in names if name != "None"]
        return bool(names) and all(CONTEXT_NAMES.get(name) in sys.modules for name in names)
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return is_context_annotation(typing.get_args(annotation)[0], depth + 1)
    if origin in _UNION_TYPES:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(members) and all(is_context_annotation(a, depth + 1) for a in members)
    if origin in _SEQUENCES:
        items = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return len(items) == 1 and is_context_annotation(items[0], depth + 1)
    target = origin if origin is not None else annotation
    return isinstance(target, type) and is_context_class(target)


def _members(text: str) -> list[str]:
    """The members of a union written as text (``A | None``, ``Optional[A]``, ``Union[A, B]``)."""
    text = text.strip()
    head, bracket, _ = text.partition("[")
    if bracket and _bare_name(head) in ("Optional", "Union") and text.endswith("]"):
        inside = text[len(head) + 1 : -1]
        return [member for part in _split(inside, ",") for member in _members(part)]
    parts = _split(text, "|")
    return [text] if len(parts) == 1 else [member for part in parts for member in _members(part)]


def _split(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` outside brackets."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += (char == "[") - (char == "]")
        if char == separator and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    return [*parts, text[start:]]


def _bare_name(text: str) -> str:
    """``pydantic_ai.RunContext[Deps]`` -> ``RunContext``."""
    return text.split("[", 1)[0].strip().rsplit(".", 1)[-1]


_PLAIN: frozenset[type] = frozenset({str, int, float, bool, type(None), dict, bytes})


def is_context_value(value: Any) -> bool:
    """A value that is framework context: an instance of a context class, or a non-empty list
    or tuple of them (LangChain's callback handlers). Judged on every call of a parameter
    without an annotation: a plain value costs one set lookup."""
    cls = type(value)
    if cls in _PLAIN:
        return False
    if cls is list or cls is tuple:
        return bool(value) and all(is_context_class(type(item)) for item in value)
    return is_context_class(cls)


def _annotations(function: Any, signature: inspect.Signature) -> dict[str, Any]:
    """Each parameter's annotation, evaluated (``typing.get_type_hints``) or, when it cannot be
    (a forward reference, a name imported only for type checkers), as written."""
    try:
        hints = typing.get_type_hints(function)
    except Exception:
        hints = {}
    return {name: hints.get(name, p.annotation) for name, p in signature.parameters.items()}


@dataclass(frozen=True, slots=True)
class ToolArguments:
    """How the calls of one tool become its recorded input."""

    signature: inspect.Signature
    left_out: frozenset[str]
    """Parameters never in the input: ``self``/``cls``, excluded, framework context."""
    watched: tuple[str, ...]
    """Parameters without an annotation: left out of a call when its value is context."""
    simple: Binder | None

    def bind(self, args: Any, kwargs: Any) -> dict[str, Any]:
        """The input of a call; ``TypeError`` when the call does not fit the signature."""
        arguments = None if self.simple is None else self.simple(args, kwargs)
        if arguments is None:
            arguments = bind_arguments(self.signature, self.left_out, args, kwargs)
        for name in self.watched:
            if is_context_value(arguments.get(name)):
                del arguments[name]
        return arguments


def tool_arguments(
    function: Any, signature: inspect.Signature, exclude: Collection[str]
) -> ToolArguments:
    """The binding of one tool: what is left out (see the module docstring), its binder."""
    params = list(signature.parameters.values())
    left_out = set(exclude)
    if params and params[0].name in _SELF_NAMES:
        left_out.add(params[0].name)
    annotations = _annotations(function, signature)
    watched: list[str] = []
    for param in params:
        if param.name in left_out or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = annotations.get(param.name, param.empty)
        if annotation is param.empty or annotation is Any or annotation is object:
            watched.append(param.name)
        elif is_context_annotation(annotation):
            left_out.add(param.name)
    frozen = frozenset(left_out)
    return ToolArguments(signature, frozen, tuple(watched), simple_binder(signature, frozen))


def unknown_names(signature: inspect.Signature, names: Collection[str]) -> list[str]:
    """The names in ``names`` that no parameter has (any name goes with ``**kwargs``)."""
    parameters: Mapping[str, inspect.Parameter] = signature.parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return []
    return [name for name in names if name not in parameters]
