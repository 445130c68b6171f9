"""Which spans make which bundle: the graph side of the one grouping rule.

The rule itself -- a bundle has a root and takes a span whose parent it holds; a bundle of calls
outside runs takes no run span -- is applied as spans start by the bundle builder
(:mod:`stepfork_otel.trace.builder`), for the processor and the importer alike. These helpers
answer the questions about a set of spans that need the whole graph, over two facts about each
span: its parent and its ``stepfork.kind``. Span ids are whatever the caller uses.

* a **run** (a span of kind ``run``, opened by ``record(...)``) not nested in another run makes
  a bundle of its subtree (:func:`top_level_runs`; a nested run's spans also belong to the outer
  run's bundle);
* the **boundary calls outside every run** make bundles with the spans around them as context,
  one per local root holding such calls (:func:`calls_outside_runs` finds them all).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import TypeVar

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


def local_roots(parent_of: Mapping[T, T | None], roots: AbstractSet[T] | None = None) -> dict[T, T]:
    """Each id -> the root at or above it: the nearest of ``roots``, or (None) the local root its
    parent chain ends at (an id with no parent, or whose parent is not in ``parent_of``). That
    is :func:`subtree` of every root at once, in one pass over the spans: time and memory linear
    in their number, however many roots or however deep. Ids that reach no root -- on a cycle of
    hostile parent links, or under one -- are left out."""
    root_of: dict[T, T] = {}
    lost: set[T] = set()  # reach no root
    for start in parent_of:
        chain: list[T] = []
        on_chain: set[T] = set()
        node = start
        root: T | None = None
        while node not in root_of and node not in lost:
            if node in on_chain:  # a cycle
                break
            chain.append(node)
            on_chain.add(node)
            if roots is not None and node in roots:
                root = node
                break
            parent = parent_of[node]
            if parent is None or parent not in parent_of:
                root = node if roots is None else None
                break
            node = parent
        else:
            root = root_of.get(node)
        if root is None:
            lost.update(chain)
        else:
            root_of.update(dict.fromkeys(chain, root))
    return root_of


def top_level_runs(parent_of: Mapping[T, T | None], kind_of: Mapping[T, object]) -> list[T]:
    """The run spans not nested in another run span (no run above them, as far as the spans go),
    in one pass: each span's nearest run above is found once, so many runs under one deep chain of spans
    cost the spans, not runs x depth)."""
    above: dict[T, T | None] = {}
    """span -> the nearest run strictly above it (None: none, as far as the spans go)."""
    for span_id, kind in kind_of.items():
        if kind != k.KIND_RUN:
            continue
        chain: list[T] = []
        on_chain: set[T] = set()
        node, found = span_id, None
        while True:
            if node in above:
                found = above[node]
                break
            chain.append(node)
            on_chain.add(node)
            parent = parent_of.get(node)
            if parent is None or parent not in kind_of:
                break  # (the top, or a parent never seen)
            if kind_of[parent] == k.KIND_RUN:
                found = parent
                break
            if parent in on_chain:
                break  # (hostile links that form a cycle of spans that are not runs)
            node = parent
        above.update(dict.fromkeys(chain, found))
    return [i for i, kind in kind_of.items() if kind == k.KIND_RUN and above[i] is None]


def calls_outside_runs(
    parent_of: Mapping[T, T | None], kind_of: Mapping[T, object], runs: Iterable[T]
) -> set[T]:
    """The spans outside the subtrees of ``runs`` -- the bundle of calls outside runs -- or an
    empty set when no boundary call is among them."""
    inside = local_roots(parent_of, set(runs))
    rest = {i for i in kind_of if i not in inside}
    return rest if any(kind_of.get(i) in k.BOUNDARY_KINDS for i in rest) else set()
