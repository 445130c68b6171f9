"""Which spans make which bundle: the one grouping rule.

The bundle processor (live spans, bundle by bundle as their roots end) and the OTLP importer
(every span of a trace at once) both decide with these functions, over the same two facts about
each span: its parent and its ``stepfork.kind``. Span ids are whatever the caller uses (ints in
the processor, hex strings in the importer).

The rule:

* a **run** (a span of kind ``run``, opened by ``record(...)``) not nested in another run makes
  a bundle of its subtree. A nested run's spans belong to the outer run's bundle
  (:func:`enclosing_run` tells the two apart); the processor, which promised ``record(path)`` a
  file, also writes the nested run's own subtree there when it ends;
* the **boundary calls outside every run** (lone calls, or calls of an application span that no
  run encloses) make one bundle with the spans around them as context, if there are any
  (:func:`calls_outside_runs`); a span with no boundary call under it makes no bundle.

:func:`groups` applies the whole rule to a complete set of spans.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from stepfork_otel import constants as k

T = TypeVar("T", bound=Hashable)


def subtree(parent_of: Mapping[T, T | None], root: T) -> set[T]:
    """``root`` and every id whose parent chain (through ``parent_of``) reaches it."""
    children: dict[T, list[T]] = {}
    for child, parent in parent_of.items():
        if parent is not None and child != parent:
            children.setdefault(parent, []).append(child)
    found = {root}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def enclosing_run(
    parent_of: Mapping[T, T | None], kind_of: Mapping[T, object], span_id: T
) -> T | None:
    """The nearest run span above ``span_id`` (None: not inside a run, as far as the spans go).
    Bounded by the number of spans, so hostile parent links that form a cycle end the walk."""
    parent, seen = parent_of.get(span_id), 0
    while parent is not None and seen <= len(parent_of):
        if parent not in kind_of:
            return None
        if kind_of[parent] == k.KIND_RUN:
            return parent
        parent, seen = parent_of.get(parent), seen + 1
    return None


def top_level_runs(parent_of: Mapping[T, T | None], kind_of: Mapping[T, object]) -> list[T]:
    """The run spans not nested in another run span."""
    return [
        span_id
        for span_id, kind in kind_of.items()
        if kind == k.KIND_RUN and enclosing_run(parent_of, kind_of, span_id) is None
    ]


def holds_calls(kind_of: Mapping[T, object], ids: Iterable[T]) -> bool:
    """True when one of ``ids`` is a boundary call (a tool or LLM span)."""
    return any(kind_of.get(i) in k.BOUNDARY_KINDS for i in ids)


def calls_outside_runs(
    parent_of: Mapping[T, T | None], kind_of: Mapping[T, object], runs: Iterable[T]
) -> set[T]:
    """The spans outside the subtrees of ``runs`` -- the bundle of calls outside runs -- or an
    empty set when no boundary call is among them."""
    inside: set[T] = set()
    for run in runs:
        inside |= subtree(parent_of, run)
    rest = {i for i in kind_of if i not in inside}
    return rest if holds_calls(kind_of, rest) else set()


@dataclass(frozen=True)
class Group(Generic[T]):
    """The spans of one bundle."""

    run: T | None
    """The run span the bundle is of (None: the calls outside every run)."""
    members: frozenset[T]


def groups(parent_of: Mapping[T, T | None], kind_of: Mapping[T, object]) -> list[Group[T]]:
    """The bundles a complete set of spans makes: one per top-level run (its subtree), then one
    for the boundary calls outside every run, if there are any. ``kind_of`` names every span
    (``None`` for the application's own spans)."""
    runs = top_level_runs(parent_of, kind_of)
    found = [Group(run, frozenset(subtree(parent_of, run))) for run in runs]
    outside = calls_outside_runs(parent_of, kind_of, runs)
    if outside:
        found.append(Group(None, frozenset(outside)))
    return found
