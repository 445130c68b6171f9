"""The pre-check's gate: for each rule, a cheaper regular expression that matches wherever the
rule matches (a necessary condition), derived from the rule itself.

Why: the pre-check searches a payload's scan form for every rule at once. RE2 does that in one
linear pass, but the DFA of ~90 rules visits many states on ordinary text (bounded repeats such
as ``[A-Za-z0-9]{14}``, or a URL scheme's ``{0,30}``, start counting on any letter), and in a
recorded call -- between the SDK's work and the application's -- those states have left the CPU's
caches. The gates make a DFA that stays small: for each rule its most distinctive part
(``sk-ant-``, ``://``, ``-----BEGIN``, a key word followed by ``=`` or ``:``); a payload they find
nothing in holds no match of any rule, and only the rules whose gate fired are searched
themselves. ``benchmarks/bench_redaction.py`` measures both, per kilobyte, in the same run.

Gitleaks does the same with keywords written by hand beside each rule; here they are derived, so
that a rule added as data (or by a user) needs nothing more and cannot be given a wrong one.

How a rule is relaxed (each step keeps "matches wherever the rule matches"):

* the rule is parsed (Python's own regular-expression parser: RE2's syntax for what the rules
  use; anything it reads differently, or not at all, leaves the rule whole -- see
  :func:`_parse`);
* assertions (``^``, ``$``, ``\\b``) are dropped, capture groups made plain, and every repeat
  ``x{m,n}`` loses its upper bound (``x{m,}``): a larger language;
* of the resulting sequence, a *suffix* is kept -- a match of the sequence contains a match of
  any suffix of it -- starting where the run of literal characters that every match has there
  is the longest (a token's prefix, a key word); the part before it (a boundary, a class of
  letters counted to 30) is what made the DFA large: it is active on every word of a payload,
  where what follows a distinctive start is reached only after it;
* when no start has such a run (``_B(?:a|b)``: every branch of an alternation has its own key
  word), the alternation is distributed -- ``P (A|B) S`` matches where ``P A S`` or ``P B S``
  does -- and each branch relaxed on its own;
* when nothing distinctive is found, the gate is the rule itself (correct, just not cheaper).

``tests/test_redaction_prefilter.py`` checks, for every built-in rule and key detector, that
strings generated from the rule (and the corpus of secrets) are found by its gate, and which
rules are their own gate; ``tests/test_shortcuts.py`` that the pre-check with the gates decides
as one search of every rule does, and that the redacted output is the obvious version's.
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
import warnings
from typing import Any, NamedTuple

from re2 import _re2

# Python's regular-expression parser (private; ``sre_parse`` before 3.11, deprecated after)
if sys.version_info >= (3, 11):  # pragma: no branch
    _sre: Any = importlib.import_module("re._parser")
    _C: Any = importlib.import_module("re._constants")
else:  # pragma: no cover
    _sre = importlib.import_module("sre_parse")
    _C = importlib.import_module("sre_constants")

#: A literal run at least this distinctive starts a gate (two letters; ``://`` is 2.25).
_MIN_RUN = 1.5
#: Work allowed per rule (runs computed), so that a huge user alternation costs a bounded time.
_BUDGET = 20_000
#: A gate this many times longer than its rule is not worth it: the rule is its own gate.
_MAX_GROWTH = 8
#: A character class of at most this many characters counts as half a literal.
_SMALL_CLASS = 8
_BIG = 1 << 20

_IGNORECASE = int(_C.SRE_FLAG_IGNORECASE)
_DOTALL = int(_C.SRE_FLAG_DOTALL)

#: RE2 syntax that Python's parser reads differently (``{,n}`` is a literal to RE2, a repeat to
#: Python; ``[[:alpha:]]`` a POSIX class to RE2, a nested set to Python): a rule using any of it
#: stays whole.
_READ_DIFFERENTLY = re.compile(r"\{,|\[:[A-Za-z]+:\]|\\[pPQECz]")


class _Unsupported(Exception):
    """The rule uses syntax the gate does not relax: it stays whole."""


class _Lit(NamedTuple):
    char: str
    icase: bool


class _Set(NamedTuple):
    source: str
    """RE2 source of one character (a class, ``.``, a negated literal)."""
    size: int


class _Alt(NamedTuple):
    branches: tuple[tuple[Any, ...], ...]


class _Rep(NamedTuple):
    body: tuple[Any, ...]
    min: int
    max: int | None


def _escape(code: int) -> str:
    """One character as RE2 source text, inside or outside a class."""
    char = chr(code)
    if (char.isascii() and char.isalnum()) or char == "_" or code >= 0x80:
        return char
    if 0x21 <= code <= 0x7E:  # punctuation: RE2 reads any of it escaped as itself
        return "\\" + char
    return f"\\x{{{code:02x}}}"


_CATEGORIES = {
    "CATEGORY_DIGIT": ("\\d", 10),
    "CATEGORY_NOT_DIGIT": ("\\D", _BIG),
    "CATEGORY_SPACE": ("\\s", 6),
    "CATEGORY_NOT_SPACE": ("\\S", _BIG),
    "CATEGORY_WORD": ("\\w", 63),
    "CATEGORY_NOT_WORD": ("\\W", _BIG),
}


def _class(items: list[tuple[Any, Any]], flags: int) -> _Set:
    negate = False
    parts: list[str] = []
    size = 0
    for op, av in items:
        name = op.name
        if name == "NEGATE":
            negate = True
        elif name == "LITERAL":
            parts.append(_escape(av))
            size += 1
        elif name == "RANGE":
            parts.append(f"{_escape(av[0])}-{_escape(av[1])}")
            size += av[1] - av[0] + 1
        elif name == "CATEGORY" and av.name in _CATEGORIES:
            source, count = _CATEGORIES[av.name]
            parts.append(source)
            size += count
        else:
            raise _Unsupported(name)
    source = "[" + ("^" if negate else "") + "".join(parts) + "]"
    if flags & _IGNORECASE:
        source, size = f"(?i:{source})", size * 2
    return _Set(source, _BIG if negate else size)


def _nodes(items: Any, flags: int) -> tuple[Any, ...]:
    """Python's parse of a sequence, as the nodes the gate works on (assertions dropped, groups
    made plain)."""
    out: list[Any] = []
    for op, av in items:
        name = op.name
        if name == "LITERAL":
            out.append(_Lit(chr(av), bool(flags & _IGNORECASE)))
        elif name == "NOT_LITERAL":
            source = f"[^{_escape(av)}]"
            out.append(_Set(f"(?i:{source})" if flags & _IGNORECASE else source, _BIG))
        elif name == "IN":
            out.append(_class(av, flags))
        elif name == "ANY":
            out.append(_Set("(?s:.)" if flags & _DOTALL else "[^\\n]", _BIG))
        elif name == "AT":
            continue  # dropped: a larger language
        elif name == "BRANCH":
            out.append(_Alt(tuple(_nodes(branch, flags) for branch in av[1])))
        elif name == "SUBPATTERN":
            _, add, remove, body = av
            out.extend(_nodes(body, (flags | add) & ~remove))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, body = av
            out.append(_Rep(_nodes(body, flags), low, None if high == _C.MAXREPEAT else high))
        else:
            raise _Unsupported(name)
    return tuple(out)


def _parse(source: str) -> tuple[Any, ...]:
    if _READ_DIFFERENTLY.search(source):
        raise _Unsupported("syntax Python reads differently")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a FutureWarning: Python and RE2 may disagree
        try:
            parsed = _sre.parse(source)
        except Exception as exc:  # re.error, a warning: leave the rule whole
            raise _Unsupported(str(exc)) from exc
    return _nodes(parsed, int(parsed.state.flags) & (_IGNORECASE | _DOTALL))


# --- choosing the suffix ------------------------------------------------------------------------


class _Budget:
    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = _BUDGET

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _Unsupported("too large to relax")


def _weight(node: Any) -> float:
    if isinstance(node, _Lit):
        return 1.0 if node.char.isascii() and node.char.isalnum() else 0.75
    if isinstance(node, _Set) and node.size <= _SMALL_CLASS:
        return 0.5
    return 0.0


def _run(nodes: tuple[Any, ...], budget: _Budget) -> float:
    """How distinctive the start of every match of ``nodes`` is: the weight of the literal
    characters (and small classes) that every match begins with, the least over alternatives."""
    budget.spend()
    total = 0.0
    for i, node in enumerate(nodes):
        if isinstance(node, _Alt):
            rest = nodes[i + 1 :]
            return total + min(_run(branch + rest, budget) for branch in node.branches)
        if isinstance(node, _Rep):
            return total + (_run(node.body, budget) if node.min >= 1 else 0.0)
        weight = _weight(node)
        if not weight:
            return total
        total += weight
    return total


def _relaxed(nodes: tuple[Any, ...], budget: _Budget) -> str | None:
    """A gate for the sequence ``nodes``, or None when none is more distinctive than the whole."""
    best, start = 0.0, 0
    for i in range(len(nodes)):
        run = _run(nodes[i:], budget)
        if run > best:
            best, start = run, i
    if best >= _MIN_RUN:
        return _emit(nodes[start:])
    for j, node in enumerate(nodes):
        if isinstance(node, _Alt):
            gates = [
                _relaxed(nodes[:j] + branch + nodes[j + 1 :], budget) for branch in node.branches
            ]
            if all(gate is not None for gate in gates):
                return "(?:" + "|".join(dict.fromkeys(g for g in gates if g is not None)) + ")"
    return None


def _emit(nodes: tuple[Any, ...]) -> str:
    """RE2 source of ``nodes``, every repeat without its upper bound."""
    out: list[str] = []
    folded: list[str] = []  # consecutive case-insensitive literals, written as one (?i:...)
    for node in nodes:
        if isinstance(node, _Lit) and node.icase:
            folded.append(_escape(ord(node.char)))
            continue
        if folded:
            out.append("(?i:" + "".join(folded) + ")")
            folded = []
        if isinstance(node, _Lit):
            out.append(_escape(ord(node.char)))
        elif isinstance(node, _Set):
            out.append(node.source)
        elif isinstance(node, _Alt):
            out.append("(?:" + "|".join(_emit(branch) for branch in node.branches) + ")")
        else:
            body = "(?:" + _emit(node.body) + ")"
            if node.max == 1:
                out.append(body if node.min >= 1 else body + "?")
            else:  # at least as many as the rule asks, without an upper bound
                out.append(body + {0: "*", 1: "+"}.get(node.min, f"{{{node.min},}}"))
    if folded:
        out.append("(?i:" + "".join(folded) + ")")
    return "".join(out)


@functools.lru_cache(maxsize=4096)
def gate_of(source: str) -> str | None:
    """An RE2 expression that matches wherever ``source`` (RE2, no captures needed) matches,
    cheaper to search; None when none is found (the rule is its own gate)."""
    try:
        gate = _relaxed(_parse(source), _Budget())
    except (_Unsupported, RecursionError):  # (a rule nested deeper than Python's stack)
        return None
    if gate is None or len(gate) > _MAX_GROWTH * len(source) + 1000:
        return None  # (alternations distributed over a long rest: no smaller than the rule)
    options = _re2.RE2.Options()
    options.log_errors = False
    options.never_capture = True
    return gate if _re2.RE2(gate.encode("utf-8"), options).ok() else None
