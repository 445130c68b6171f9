"""The redaction engine: the rules of :mod:`stepfork_otel.trace.redaction.rules` applied to
canonical JSON texts, JSON-shaped values and exception messages.

Why the fast path looks the way it does: walking every string of every payload with a dozen
regular expressions costs several times a bare span at 2 KB. Instead the canonical JSON text (which
exists anyway, for the fingerprint) is checked for *needles*: literal texts that every match of a
rule must contain. Keys give ``<word>":``; patterns declare ``triggers`` (compared on the *folded*
text: ASCII lower case, without ``_ - .``, whitespace and the JSON escapes of whitespace, so that
``pass_word`` and ``Api-Key`` fold to plain words) and ``prefixes`` (case-sensitive, on the text as
is). One substring test costs about as much as hashing the payload and there are some forty
needles, so they are grouped: a greedy cover picks anchor bytes (rare ones, each shared by many
needles), one regular expression per anchor finds any needle of its group, and a group whose
anchor byte does not occur is skipped by one ``memchr``. Only when a needle is found are the rules
it belongs to worked out; a pattern may then ``confirm`` on the raw text (``sk-`` followed by 20
token characters, ``://`` followed by an ``@``) so that ``task-1`` or a plain URL does not cost a
walk. Only then is the payload redacted -- with just the rules whose needles were found, and only
in the strings that hold one of those needles: a match lies inside one string and contains a
needle, so the strings are found from where the needles are in the text (the quotes around them
are counted), redacted, and spliced back into the text (``_splice``); the output is byte for byte
what decoding, walking and re-encoding gives. A payload where that shortcut does not apply (a
sensitive key, a secret used as a key, non-ASCII text, a needle holding a quote) is decoded and
walked, and each string is first searched with one alternation of the selected patterns.

A needle is deliberately looser than its rule: a false alarm costs time, never correctness. Words
such as "bearer" and "basic" are both needles and ordinary English; a payload holding them is
walked with those two patterns only (which then leave "basic information" alone). What was
rejected: a trigger on the last three letters of each key (``ion":`` fired on every
``"destination":``), bare ``pass``/``token`` (``passengers``, ``max_tokens``), prefixes matched only
at the start of a token-like run (missed ``key_sk-...``), and one alternation regex (the ``re``
engine tries every branch at every position: slower than forty substring tests).
``tests/test_redaction.py`` checks that the pre-check says "maybe" for every payload that redaction
would change, for each secret family in many positions, and on random fragments of every rule;
``tests/test_shortcuts.py`` checks that the splice gives what decoding and walking gives.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from stepfork_otel.trace.canonical import as_returned_bytes, canonical_json
from stepfork_otel.trace.canonical import loads as canonical_loads
from stepfork_otel.trace.redaction.rules import (
    DEFAULT_PATTERNS,
    DEFAULT_SENSITIVE_KEYS,
    KEY_MARKER,
    MAX_MESSAGE_CHARS,
    UNSTABLE_MARKER,
    SecretPattern,
    _assigned,
    _assignment,
    _normalise_key,
)

#: The built-in patterns: their sources are known to combine into one probe (see :func:`_probe`).
_BUILT_IN = frozenset(DEFAULT_PATTERNS)


# --- folding and needles ---------------------------------------------------------------------------

_ASCII_LOWER = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", b"abcdefghijklmnopqrstuvwxyz")
_FOLD_DELETE = b" \t\n\r\f\v_-."
# JSON escapes of the whitespace that folding removes; an escaped backslash is consumed as a
# whole so that the "t" of `\\t` (a backslash, then a letter) is not read as a tab.
_WHITESPACE_ESCAPE = re.compile(rb"\\(?:[\\tnrf]|u000b)")


def fold(text: str) -> bytes:
    """The folded form of a canonical JSON text that triggers and key needles are compared with:
    UTF-8, lower case, without ``_ - .`` and whitespace (raw or as a JSON escape)."""
    data = text.encode("utf-8") if text.isascii() else text.lower().encode("utf-8")
    if b"\\" in data:
        data = _WHITESPACE_ESCAPE.sub(b"", data)
    return data.translate(_ASCII_LOWER, _FOLD_DELETE)


def _escaped(text: str) -> str:
    """``text`` as it appears inside a canonical JSON string."""
    return canonical_json(text)[1:-1]


# Rough frequency (percent) of bytes in canonical JSON payloads: English letters (capitals an
# eighth as often), digits and JSON syntax; unlisted bytes count as rare. Used only to choose cheap
# anchor bytes, never for correctness.
_LETTERS = "etaoinsrhldcumfpgwybvkxjqz"
_LETTER_PERCENT: tuple[float, ...] = (
    9.0,
    6.5,
    5.8,
    5.5,
    5.2,
    4.9,
    4.6,
    4.5,
    4.0,
    3.1,
    2.9,
    2.1,
    2.0,
)
_LETTER_PERCENT += (1.7, 1.6, 1.4, 1.4, 1.4, 1.4, 1.1, 1.1, 0.7, 0.6, 0.12, 0.1, 0.08)
_SYNTAX = '" :,{}[]_-./\\'
_SYNTAX_PERCENT = (12.0, 10.0, 4.5, 3.5, 1.0, 1.0, 0.4, 0.4, 1.2, 0.6, 0.5, 0.3, 0.4)
_FREQUENCY: dict[int, float] = {
    **dict.fromkeys(b"0123456789", 0.8),
    **{ord(c): f for c, f in zip(_SYNTAX, _SYNTAX_PERCENT, strict=True)},
    **{ord(c): f for c, f in zip(_LETTERS, _LETTER_PERCENT, strict=True)},
    **{ord(c.upper()): f / 8 for c, f in zip(_LETTERS, _LETTER_PERCENT, strict=True)},
}
_DESIGN_SIZE = 2048  # payload size the anchor choice is tuned for


def _anchor_cost(byte: int, members: list[bytes]) -> float:
    """Expected cost of one anchored search, in scans of a payload: a scan when the byte occurs,
    plus per hit a quick first-byte test for each member, or a look-behind for a member whose
    anchor is its last byte (nothing left to compare forward)."""
    p = _FREQUENCY.get(byte, 0.01) / 100
    present = 1 - (1 - p) ** _DESIGN_SIZE
    per_hit = 0.01 + sum(0.03 if n.index(byte) == len(n) - 1 else 0.004 for n in members)
    return present * (1.0 + _DESIGN_SIZE * p * per_hit)


@dataclass(frozen=True)
class _Group:
    """Needles that share an anchor byte, and one regex that finds any of them."""

    anchor: int
    needles: tuple[bytes, ...]
    regex: re.Pattern[bytes]
    placed: tuple[tuple[bytes, int], ...]
    """Each needle with the offset of the anchor in it (where the regex's match starts)."""

    @classmethod
    def of(cls, anchor: int, needles: list[bytes]) -> _Group:
        # at the anchor (its first occurrence in each needle), compare what follows it, then
        # look back over the whole needle
        alternatives = b"|".join(
            re.escape(n[n.index(anchor) + 1 :]) + b"(?<=" + re.escape(n) + b")" for n in needles
        )
        regex = re.compile(re.escape(bytes([anchor])) + b"(?:" + alternatives + b")")
        placed = tuple((n, n.index(anchor)) for n in needles)
        return cls(anchor, tuple(needles), regex, placed)


def _group_needles(needles: Iterable[bytes]) -> tuple[_Group, ...]:
    """Needles grouped by anchor byte (a greedy set cover: bytes that cover many needles cheaply).
    A needle that contains another needle is implied by it and left out."""
    kept: list[bytes] = []
    for needle in sorted(set(needles), key=lambda n: (len(n), n)):
        if not any(k in needle for k in kept):
            kept.append(needle)
    groups: list[_Group] = []
    while kept:
        covering = {b: [n for n in kept if b in n] for n in kept for b in n}
        anchor = min(covering, key=lambda b: (_anchor_cost(b, covering[b]) / len(covering[b]), b))
        groups.append(_Group.of(anchor, covering[anchor]))
        kept = [n for n in kept if anchor not in n]
    return tuple(groups)


def _found_needles(groups: tuple[_Group, ...], data: bytes) -> set[bytes]:
    """Every grouped needle that occurs in ``data``. A group whose anchor byte is absent costs one
    ``memchr``; otherwise its regex finds each anchor position where some needle matches, and
    there each of the group's needles is compared in place (two needles can match at the same
    anchor, and the regex reports one): a few comparisons per hit, not a scan per needle."""
    found: set[bytes] = set()
    for g in groups:
        if g.anchor not in data:
            continue
        match = g.regex.search(data)
        while match is not None:
            at = match.start()
            for needle, offset in g.placed:
                if at >= offset and data.startswith(needle, at - offset):
                    found.add(needle)
            match = g.regex.search(data, at + 1)
    return found


def _implied(
    groups: tuple[_Group, ...], needles: Iterable[tuple[int, Iterable[bytes]]]
) -> dict[bytes, tuple[tuple[int, bytes], ...]]:
    """For each grouped needle, the (owner, needle) pairs whose needle contains it: finding the
    grouped one is what makes each of those worth looking for."""
    pairs = [(owner, n) for owner, ns in needles for n in ns]
    return {g: tuple((o, n) for o, n in pairs if g in n) for grp in groups for g in grp.needles}


@dataclass(frozen=True)
class _Plan:
    """What the slow path has to do with one payload."""

    patterns: tuple[SecretPattern, ...]
    keys: bool
    probe: re.Pattern[str] | None = None
    """One regex that finds something in a string whenever any of ``patterns`` would (see
    :func:`_probe`); a string it finds nothing in is left alone without running each pattern."""
    raw: bytes = b""
    """The canonical text's UTF-8 bytes, and below its folded form (as the pre-check saw them)."""
    folded: bytes = b""
    raw_needles: tuple[bytes, ...] | None = None
    """Prefixes of ``patterns`` (as in ``raw``), and below their triggers (as in ``folded``);
    None when a pattern has neither (it can match anywhere)."""
    folded_needles: tuple[bytes, ...] = ()


_PROBE_GROUP = re.compile(r"\(\?P<secret>")


def _probe(patterns: tuple[SecretPattern, ...]) -> re.Pattern[str] | None:
    """The alternation of ``patterns`` (built-in ones only: their sources are known to combine
    -- the same flags, no back-references, only the ``secret`` group, renamed away here).

    Patterns are applied one after the other, each on the text the previous one left; but when
    none of them finds anything in a string, each leaves it unchanged, so one search of the
    alternation that finds nothing proves the whole sequence changes nothing."""
    if not patterns or not all(p in _BUILT_IN for p in patterns):
        return None
    return re.compile(
        "|".join(f"(?:{_PROBE_GROUP.sub('(?:', p.regex.pattern)})" for p in patterns), re.ASCII
    )


# --- the redactor ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Redactor:
    """Redaction rules. Immutable; derive a changed copy with :meth:`with_rules`.

    >>> r = Redactor().with_rules(keys=["ssn"])
    >>> r.redact({"ssn": "078-05-1120", "q": "Bearer abc.def.ghi"})
    {'ssn': '[REDACTED]', 'q': 'Bearer [REDACTED:bearer_token]'}
    """

    patterns: tuple[SecretPattern, ...] = DEFAULT_PATTERNS
    """Secret-shaped value patterns, applied in order."""
    sensitive_keys: tuple[str, ...] = DEFAULT_SENSITIVE_KEYS
    """Key suffixes whose values are always redacted (normalised form)."""
    _raw_groups: tuple[_Group, ...] = field(init=False, repr=False, compare=False)
    _folded_groups: tuple[_Group, ...] = field(init=False, repr=False, compare=False)
    _key_needles: frozenset[bytes] = field(init=False, repr=False, compare=False)
    _raw_needles: tuple[tuple[bytes, ...], ...] = field(init=False, repr=False, compare=False)
    _folded_needles: tuple[tuple[bytes, ...], ...] = field(init=False, repr=False, compare=False)
    _always_scan: tuple[SecretPattern, ...] = field(init=False, repr=False, compare=False)
    _probes: dict[tuple[int, ...], re.Pattern[str] | None] = field(
        init=False, repr=False, compare=False
    )
    """Probe (see :func:`_probe`) of each combination of patterns a payload selected."""
    _raw_implied: dict[bytes, tuple[tuple[int, bytes], ...]] = field(
        init=False, repr=False, compare=False
    )
    _folded_implied: dict[bytes, tuple[tuple[int, bytes], ...]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        keys = tuple(dict.fromkeys(k for k in map(_normalise_key, self.sensitive_keys) if k))
        set_ = object.__setattr__
        set_(self, "sensitive_keys", keys)
        # A sensitive key is written `"<key>":`; folded, it ends with the word itself.
        key_needles = frozenset(fold(_escaped(k)) + b'":' for k in keys)
        raw = tuple(
            tuple(_escaped(p).encode("utf-8") for p in pat.prefixes) for pat in self.patterns
        )
        folded = tuple(tuple(fold(_escaped(t)) for t in pat.triggers) for pat in self.patterns)
        raw_groups = _group_needles(n for ns in raw for n in ns)
        folded_groups = _group_needles([*key_needles, *(n for ns in folded for n in ns)])
        set_(self, "_key_needles", key_needles)
        set_(self, "_raw_needles", raw)
        set_(self, "_folded_needles", folded)
        set_(self, "_raw_groups", raw_groups)
        set_(self, "_folded_groups", folded_groups)
        always = tuple(p for p in self.patterns if not (p.triggers or p.prefixes))
        set_(self, "_always_scan", always)
        set_(self, "_probes", {})
        # which needles (of which pattern; -1: a sensitive key) each grouped needle stands for
        set_(self, "_raw_implied", _implied(raw_groups, enumerate(raw)))
        set_(
            self,
            "_folded_implied",
            _implied(folded_groups, [(-1, key_needles), *enumerate(folded)]),
        )

    def with_rules(
        self,
        *,
        keys: Iterable[str] = (),
        patterns: Iterable[tuple[str, str] | SecretPattern] = (),
    ) -> Redactor:
        """A copy with more sensitive keys and/or ``(name, regex)`` value patterns added.

        A user pattern without ``triggers``/``prefixes`` is checked on every payload (correct,
        slower); give a :class:`SecretPattern` with triggers to keep the fast path fast.
        """
        extra = tuple(
            p if isinstance(p, SecretPattern) else SecretPattern(p[0], re.compile(p[1]))
            for p in patterns
        )
        new_keys = tuple(_normalise_key(key) for key in keys if _normalise_key(key))
        if new_keys:  # the same keys inside text: `ssn=...`, `{'ssn': '...'}` in a message
            words = "|".join(re.escape(key) for key in sorted(set(new_keys)))
            extra += (_assignment("sensitive_key", words, triggers=_assigned(*new_keys)),)
        return Redactor(
            patterns=self.patterns + extra, sensitive_keys=self.sensitive_keys + tuple(keys)
        )

    # -- rules ---------------------------------------------------------------------------------

    def is_sensitive_key(self, key: str) -> bool:
        """Whether a value under ``key`` is always redacted."""
        return _normalise_key(key).endswith(self.sensitive_keys)

    def redact_text(self, text: str) -> str:
        """Replace every secret-shaped part of ``text`` (used for strings and exception messages)."""
        return _redact_text(text, self.patterns)

    def redact(self, value: Any) -> Any:
        """A redacted copy of a JSON-shaped value (dicts, lists, strings, numbers)."""
        everything = _Plan(self.patterns, True, self._probe_of(tuple(range(len(self.patterns)))))
        return self._walk(value, everything)[0]

    def redact_message(self, message: str) -> str:
        """An exception message made safe to record: redacted and bounded in length."""
        text = self.redact_text(message)
        if len(text) > MAX_MESSAGE_CHARS:
            text = text[:MAX_MESSAGE_CHARS] + "…[truncated]"
        return text

    # -- the fast path used by the boundaries ---------------------------------------------------

    def may_contain_secret(self, canonical: str) -> bool:
        """Cheap pre-check on canonical JSON text: False means :meth:`redact` would change nothing."""
        return self._plan(canonical) is not None

    def redact_canonical(self, canonical: str) -> str:
        """Redact a canonical JSON text; returns the same text when nothing needed redaction."""
        plan = self._plan(canonical)
        return canonical if plan is None else self._redact_planned(canonical, plan)

    def redact_canonical_and_returned(self, canonical: str, returned: str) -> tuple[str, str]:
        """:meth:`redact_canonical` of ``canonical``, and ``returned`` -- the same value with its
        keys in the order a call returned them -- redacted with the same rules, keys kept in
        that order. One pre-check for both; each text comes back as given (the same object)
        when nothing needed redaction."""
        plan = self._plan(canonical)
        if plan is None:
            return canonical, returned
        redacted = self._redact_planned(canonical, plan)
        if redacted is canonical:
            return canonical, returned
        # the splice works on any compact JSON text: strings change in place, keys keep their
        # places (it needs the needles' positions in this text, so its own pre-check)
        own = self._plan(returned)
        if own is not None and not own.keys and own.raw_needles is not None:
            spliced = _splice(returned, own)
            if spliced is not None:
                return redacted, spliced
        value = self._walk(canonical_loads(returned), plan)[0]
        if canonical_json(value) != redacted:
            # secrets used as keys that redact to one marker are numbered in walk order, which
            # differs between the two orders: keep the canonical form (sorted keys) instead
            return redacted, redacted
        return redacted, as_returned_bytes(value).decode("utf-8")

    def _redact_planned(self, canonical: str, plan: _Plan) -> str:
        if not plan.keys and plan.raw_needles is not None:
            spliced = _splice(canonical, plan)
            if spliced is not None:
                return spliced
        # orjson reads an integer beyond 64 bits as a float (1e+20): the stdlib parser keeps it
        value = canonical_loads(canonical)
        redacted, changed = self._walk(value, plan)
        return canonical_json(redacted) if changed else canonical

    def _plan(self, canonical: str) -> _Plan | None:
        """None when no rule can match; otherwise the rules whose needles were found."""
        raw = canonical.encode("utf-8")
        folded = fold(canonical)
        in_raw = _found_needles(self._raw_groups, raw)
        in_folded = _found_needles(self._folded_groups, folded)
        if not (in_raw or in_folded or self._always_scan):
            return None
        # Something was found (rare): work out which rules it concerns, and with which needles.
        present: dict[int, tuple[list[bytes], list[bytes]]] = {}
        for side, found, implied, data in (
            (0, in_raw, self._raw_implied, raw),
            (1, in_folded, self._folded_implied, folded),
        ):
            for grouped in found:
                for index, needle in implied[grouped]:
                    # a needle left out of the groups holds a shorter one: look for it only now
                    if needle == grouped or needle in data:
                        present.setdefault(index, ([], []))[side].append(needle)
        selected = []
        indexes = []
        raw_found: dict[bytes, None] = {}
        folded_found: dict[bytes, None] = {}
        for index, pattern in enumerate(self.patterns):
            if pattern in self._always_scan or (
                index in present
                and (pattern.confirm is None or pattern.confirm.search(raw) is not None)
            ):
                selected.append(pattern)
                indexes.append(index)
                raw_needles, folded_needles = present.get(index, ((), ()))
                raw_found.update(dict.fromkeys(raw_needles))
                folded_found.update(dict.fromkeys(folded_needles))
        keys = -1 in present
        if not selected and not keys:
            return None
        patterns = tuple(selected)
        located = not any(p in self._always_scan for p in patterns)
        return _Plan(
            patterns,
            keys,
            self._probe_of(tuple(indexes)),
            raw,
            folded,
            tuple(raw_found) if located else None,
            tuple(folded_found),
        )

    def _probe_of(self, indexes: tuple[int, ...]) -> re.Pattern[str] | None:
        """The probe of the patterns at ``indexes`` (built once per combination)."""
        if indexes in self._probes:
            return self._probes[indexes]
        probe = _probe(tuple(self.patterns[i] for i in indexes))
        if len(self._probes) < 1024:
            self._probes[indexes] = probe
        return probe

    def _walk(self, value: Any, plan: _Plan) -> tuple[Any, bool]:
        patterns, probe = plan.patterns, plan.probe
        search = probe.search if probe is not None else None
        sensitive = self.is_sensitive_key if plan.keys else None

        def text(s: str) -> str:
            if not patterns or (search is not None and search(s) is None):
                return s
            return _redact_text(s, patterns)

        def walk(value: Any) -> tuple[Any, bool]:
            if isinstance(value, str):
                redacted = text(value)
                return redacted, redacted != value
            if isinstance(value, dict):
                changed = False
                out: dict[Any, Any] = {}
                for k, v in value.items():
                    if sensitive is not None and isinstance(k, str) and sensitive(k):
                        item: Any = KEY_MARKER
                        changed = changed or v != KEY_MARKER
                    elif isinstance(v, (str, dict, list, tuple)):
                        item, c = walk(v)
                        changed = changed or c
                    else:
                        item = v
                    if isinstance(k, str) and patterns:
                        name = text(k)
                        if name != k:  # a secret used as a key
                            changed = True
                            k = name
                        if k in out:  # taken by a redacted key: number it, never overwrite
                            k = _free_name(k, out)
                    out[k] = item
                return out, changed
            if isinstance(value, (list, tuple)):
                items = [walk(v) for v in value]
                return [v for v, _ in items], any(c for _, c in items)
            return value, False

        return walk(value)


_MAX_SPLICE_HITS = 64


def _real_quotes(data: bytes) -> bytes:
    """``data`` (canonical JSON text, or its folded form) with escaped quotes and backslashes
    masked, so that every quote left delimits a string. In canonical JSON every backslash starts
    an escape, so pairing backslashes from the left pairs them the way the escapes do."""
    if b"\\" not in data:
        return data
    return data.replace(b"\\\\", b"__").replace(b'\\"', b"__")


def _splice(canonical: str, plan: _Plan) -> str | None:
    """``canonical_json`` of the redacted value, without decoding the whole payload: the strings
    that redaction changes, redacted and spliced into the text. None when this shortcut does not
    apply (a key would change, a non-ASCII text, many needles found): the caller decodes and walks.

    The strings of a canonical text are the stretches between its unescaped quotes (every other
    stretch), in the text as in its folded form: folding keeps every quote and removes escapes
    whole. Every match of a pattern contains one of its needles (the contract the pre-check rests
    on) and lies inside one string, so a string without a needle of any selected pattern is a
    string the walk would leave alone. A needle holding a quote or a backslash could straddle a
    string's edge: when one is present, this shortcut is not taken. The strings holding a needle
    are redacted exactly as the walk redacts them; a value changes in place, so the key order and
    the rest of the text stay as they are."""
    if not canonical.isascii():  # non-ASCII lower-casing may depend on neighbouring letters
        return None
    hits: set[int] = set()
    masked_raw = b""
    for data, needles in ((plan.raw, plan.raw_needles or ()), (plan.folded, plan.folded_needles)):
        found: list[int] = []
        for needle in needles:
            at = data.find(needle)
            if at != -1 and (b'"' in needle or b"\\" in needle):
                return None
            while at != -1:
                if len(found) == _MAX_SPLICE_HITS:
                    return None
                found.append(at)
                at = data.find(needle, at + 1)
        masked = _real_quotes(data)
        if data is plan.raw:
            masked_raw = masked
        found.sort()
        quotes, counted = 0, 0
        for at in found:
            quotes += masked.count(b'"', counted, at)
            counted = at
            if quotes % 2:
                hits.add(quotes)
    if not hits:
        return canonical
    parts = masked_raw.split(b'"')
    pieces: list[str] = []
    done = 0
    for index in sorted(hits):
        begin = sum(map(len, parts[:index])) + index
        end = begin + len(parts[index])
        text = canonical[begin:end]
        value = orjson.loads(f'"{text}"') if "\\" in text else text
        redacted = _redact_text(value, plan.patterns)
        if redacted != value:
            if canonical.startswith(":", end + 1):  # a key: the order of keys could change
                return None
            pieces.append(canonical[done:begin])
            pieces.append(canonical_json(redacted)[1:-1])
            done = end
    if not pieces:
        return canonical
    pieces.append(canonical[done:])
    return "".join(pieces)


def _free_name(name: str, taken: dict[Any, Any]) -> str:
    if name not in taken:
        return name
    n = 2
    while f"{name}#{n}" in taken:
        n += 1
    return f"{name}#{n}"


#: Passes of the patterns over one string at most (see :func:`_redact_text`).
_MAX_PASSES = 16


def _redact_text(text: str, patterns: tuple[SecretPattern, ...]) -> str:
    """Apply the patterns in order, then again until nothing changes. One pass is not always
    enough: a pattern that must not start inside a word (``sk-`` after a letter) can match once
    the secret glued in front of it has become a marker. A text that still changes after
    ``_MAX_PASSES`` passes (a long chain of glued secrets, or a user pattern that matches markers)
    is replaced whole by ``UNSTABLE_MARKER``: failing closed keeps every secret out, and makes
    redaction idempotent -- redacted text redacts to itself -- for any rules."""
    for _ in range(_MAX_PASSES):
        before = text
        for pattern in patterns:
            text = pattern.regex.sub(_replacer(pattern), text)
        if text == before:
            return text
    return UNSTABLE_MARKER


#: id(pattern) -> (pattern, its replacement function); keyed by identity: hashing a pattern
#: (a dataclass holding a compiled regex) costs more than the substitution of a short string.
_REPLACERS: dict[int, tuple[SecretPattern, Callable[[re.Match[str]], str]]] = {}


def _replacer(pattern: SecretPattern) -> Callable[[re.Match[str]], str]:
    entry = _REPLACERS.get(id(pattern))
    if entry is None or entry[0] is not pattern:
        if len(_REPLACERS) > 4096:
            _REPLACERS.clear()
        entry = _REPLACERS[id(pattern)] = (pattern, functools.partial(_replace, pattern=pattern))
    return entry[1]


def _replace(match: re.Match[str], pattern: SecretPattern) -> str:
    if "secret" in pattern.regex.groupindex and match.group("secret") is not None:
        start, end = match.span("secret")
        whole_start = match.start()
        text = match.group()
        return text[: start - whole_start] + pattern.marker + text[end - whole_start :]
    return pattern.marker


#: The redactor used when none is configured.
DEFAULT_REDACTOR = Redactor()
