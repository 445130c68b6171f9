"""``restore_key_order`` walks each entry's path instead of building a trie of them (it is on the
path of every replayed call: a 2 KB output names ~16 objects); it must give exactly what the
trie-based version gave, for the entries a recording writes and for hand-edited ones (wrong
paths, indexes out of range, repeated or negative positions, two entries for one path)."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stepfork_otel.trace.canonical import KeyOrder, canonical_json, key_order, loads
from stepfork_otel.trace.canonical import restore_key_order as restore


def _reference(value: Any, order: Sequence[KeyOrder] | None) -> Any:
    """The former implementation (a trie of the paths, restored recursively)."""
    if not order:
        return value
    trie: dict[Any, Any] = {}
    for path, permutation in order:
        node = trie
        for step in path:
            node = node.setdefault(step, {})
        node[None] = permutation
    return _reference_restore(value, trie)


def _reference_restore(value: Any, trie: dict[Any, Any]) -> Any:
    permutation = None
    if type(value) is dict:
        for step, child in trie.items():
            if step is None:
                permutation = child
            elif type(step) is str and step in value:
                value[step] = _reference_restore(value[step], child)
        if permutation is None or len(permutation) != len(value):
            return value
        keys = list(value)
        try:
            if sorted(permutation) != list(range(len(keys))):
                return value
        except TypeError:
            return value
        return {keys[i]: value[keys[i]] for i in permutation}
    if type(value) is list:
        for step, child in trie.items():
            if type(step) is int and 0 <= step < len(value):
                value[step] = _reference_restore(value[step], child)
    return value


_keys = st.text("abcdef", min_size=1, max_size=2)
_values = st.recursive(
    st.integers(-3, 3) | st.none(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=16,
)
_steps = st.one_of(_keys, st.integers(-1, 3))
_junk = st.tuples(st.lists(_steps, max_size=3), st.lists(st.integers(-1, 4), max_size=5)).map(
    lambda entry: (list(entry[0]), list(entry[1]))
)


def _dumped(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


@settings(max_examples=600, deadline=None, derandomize=True)
@given(value=_values, junk=st.lists(_junk, max_size=4), data=st.data())
def test_restoring_agrees_with_the_trie_version(
    value: Any, junk: list[KeyOrder], data: Any
) -> None:
    canonical = canonical_json(value)
    real = key_order(canonical, _dumped(value)) or []
    # the recorded entries, shuffled, with hand-edited ones mixed in (and a path given twice)
    edited: list[KeyOrder] = []
    for path, permutation in real:  # a real path, its permutation edited: out of range, negative,
        if permutation and data.draw(st.booleans()):  # repeated (the right length, so it counts)
            at = data.draw(st.integers(0, len(permutation) - 1))
            wrong = data.draw(st.integers(-2, len(permutation)))
            edited.append((list(path), [*permutation[:at], wrong, *permutation[at + 1 :]]))
    entries = data.draw(st.permutations(real + junk + edited))
    if entries and data.draw(st.booleans()):
        entries.append((list(entries[0][0]), data.draw(st.lists(st.integers(-1, 4), max_size=5))))
    parsed = loads(canonical)
    expected = _reference(copy.deepcopy(parsed), copy.deepcopy(entries))
    assert _dumped(restore(parsed, entries)) == _dumped(expected)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(value=_values)
def test_the_recorded_entries_give_the_value_as_returned_in_any_order(value: Any) -> None:
    canonical = canonical_json(value)
    entries = key_order(canonical, _dumped(value)) or []
    for ordered in (entries, entries[::-1]):
        assert _dumped(restore(loads(canonical), ordered)) == _dumped(value)


def test_edited_entries_agree_with_the_trie_version() -> None:
    text = '{"a":{"x":1,"y":2,"z":3},"b":[{"p":1,"q":2}],"c":{"u":{"k":1,"l":2}}}'
    for entries in (
        [(["a"], [-1, 0, 1])],  # -1 would index from the end: not a position
        [(["a"], [2, 0, 0])],
        [(["a"], [0, 1, 3])],
        [(["a"], [True, 0, 2])],
        [(["b", 0], [1, 0]), (["b", 0], [0, 1])],  # the last entry for a path wins
        [(["b", 0], [0, 1]), (["b", 0], [1, 0])],
        [(["c", "u"], [1, 0]), (["c"], [0])],
        [(["c"], [0]), (["c", "u"], [1, 0]), ([], [2, 1, 0])],
        [(["b", True], [1, 0]), (["b", "0"], [1, 0]), ([0], [1, 0])],
    ):
        expected = _reference(loads(text), entries)
        assert _dumped(restore(loads(text), entries)) == _dumped(expected), entries
