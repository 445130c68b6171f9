"""The redaction engine: the rules of :mod:`stepfork_otel.trace.redaction.rules` applied to
canonical JSON texts, JSON-shaped values and free text, with RE2 (linear time in the input for
every rule, whatever the input: no backtracking).

The hot path is one scan. The canonical JSON text of a payload exists anyway (for the
fingerprint); its *scan form* -- the text with JSON escapes decoded in place (``\\n`` becomes a
newline, ``\\"`` a quote) -- holds every string of the payload verbatim, each between two quotes.
The rules are written so that a match inside a string is also a match in the scan form (a quote
is a boundary, as the edge of a string is; see the rules module), and three key detectors match
wherever a dict key would be redacted (a key ending with a sensitive word, a key whose last word
is a short one, a generic key followed by a random-looking string), so *no rule or detector
matching the scan form means redaction would change nothing*: the payload is recorded as it is.
That is the common case. It is decided by one RE2 set search of the rules' *gates*
(:mod:`.prefilter`: each rule's most distinctive part, which matches wherever the rule does, with
a DFA a fraction of the size of all the rules'); only the rules whose gate fired are then
searched themselves. It costs about 1.5-2 µs per kilobyte (RE2's DFA walks a byte in ~1.5 ns
here, whatever the expression), plus decoding escapes when there are any
(``benchmarks/bench_redaction.py`` measures it against one search of every rule).

Only when something matched (rare: a secret, or a false alarm) is the payload redacted. An RE2
set match tells which rules matched somewhere; then either the *splice* (a payload without
escapes and without a sensitive key: the strings the matches lie in are redacted and written back
into the text, byte for byte what decoding, walking and re-encoding gives) or the *walk* (decode,
redact every key and string that the alternation of the matched rules finds something in,
re-encode).

Redacting one string: every rule that matches it (an RE2 set match says which) is searched on the
original text; the ``secret`` group(s) of every match that passes its rule's filters (allow-list,
entropy, not a marker already) are collected; overlapping parts are merged and each merged part
becomes the marker of its first rule. Then the same again on the result until nothing changes:
a match may need the boundary that a neighbouring secret (now a marker) provided. A text that
still changes after ``_MAX_PASSES`` passes becomes ``UNSTABLE_MARKER`` (fail closed; redaction is
idempotent for any rules). Every step is linear in the text, and the number of passes is bounded.

``tests/test_shortcuts.py`` checks that pre-check, splice and walk give what the obvious version
(every rule on every string) gives; ``tests/test_redaction_linear.py`` that adversarial inputs
cost what benign ones of the same size do.
"""

from __future__ import annotations

import codecs
import functools
import itertools
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson
from re2 import _re2

from stepfork_otel.trace.canonical import as_returned_bytes, bytes_default, canonical_json
from stepfork_otel.trace.canonical import loads as canonical_loads
from stepfork_otel.trace.redaction.prefilter import gate_of
from stepfork_otel.trace.redaction.rules import (
    DEFAULT_PATTERNS,
    DEFAULT_SENSITIVE_KEYS,
    GENERIC_KEY_WORDS,
    GENERIC_MARKER,
    KEY_MARKER,
    MAX_MESSAGE_CHARS,
    SEGMENT_KEYS,
    UNSTABLE_MARKER,
    SecretPattern,
    _assignment,
    _normalise_key,
    entropy,
    last_key_word,
    looks_random,
)

_UNANCHORED = _re2.RE2.Anchor.UNANCHORED
_ANCHOR_BOTH = _re2.RE2.Anchor.ANCHOR_BOTH
_NO_MATCH = (-1, -1)
#: RE2 memory budget per compiled expression: enough for the DFA of the whole rule set to stay
#: cached (past the budget RE2 falls back to its NFA: still linear, several times slower).
_MAX_MEM = 256 << 20


def _options(*, capture: bool) -> Any:
    options = _re2.RE2.Options()
    options.log_errors = False
    options.max_mem = _MAX_MEM
    options.never_capture = not capture
    return options


def _regex_set(sources: Iterable[str]) -> Any:
    """An RE2 set of ``sources`` (no captures): which of them match somewhere, in one pass."""
    regex_set = _re2.Set(_UNANCHORED, _options(capture=False))
    for source in sources:
        if regex_set.Add(source.encode("utf-8")) < 0:
            raise ValueError(f"not a regular expression RE2 accepts: {source!r}")
    if not regex_set.Compile():
        raise ValueError("the redaction rules do not fit RE2's memory budget")
    return regex_set


@functools.lru_cache(maxsize=4096)
def _one_set(source: str) -> Any:
    """``source`` as a set of one: whether it matches somewhere, without where (RE2 then skips
    the backward pass that finds where a match starts)."""
    return _regex_set((source,))


#: A gate that fires for more rules than this is followed by one search of every rule at once
#: (the set), fewer by a search of each of them (a small expression, often a literal's speed).
_FEW = 3


@functools.lru_cache(maxsize=4096)
def _compile(source: str, capture: bool = True) -> Any:
    regex = _re2.RE2(source.encode("utf-8"), _options(capture=capture))
    if not regex.ok():
        raise ValueError(f"not a regular expression RE2 accepts: {regex.error().decode()}")
    return regex


@functools.lru_cache(maxsize=4096)
def _scan_regex(source: str) -> Any:
    """A rule compiled for the scan form (:func:`_quote_anchored`, no captures), built once per
    rule: rewriting the source is a loop over its characters, too slow to repeat per payload."""
    return _compile(_uncaptured(_quote_anchored(source)), False)


def check_pattern(source: str) -> None:
    """Raise ``ValueError`` (saying why) unless RE2 accepts ``source`` as a redaction pattern."""
    _compile(source)


_GROUP_NAME = re.compile(r"\(\?P<[A-Za-z_][A-Za-z0-9_]*>")


def _uncaptured(source: str) -> str:
    """``source`` with its named groups made plain (so that sources can be joined)."""
    return _GROUP_NAME.sub("(?:", source)


def _alternation(sources: Iterable[str]) -> str:
    return "|".join(f"(?:{_uncaptured(s)})" for s in sources)


def _quote_anchored(source: str) -> str:
    """``source`` for the scan form: a bare ``^``/``$`` (outside a character class) also accepts
    a quote, which is where a string of the payload starts or ends there."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(source):
        c = source[i]
        if c == "\\":
            out.append(source[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]" or source[i - 1] == "["
        elif c == "[":
            in_class = True
            if source.startswith("[^", i) or source.startswith("[]", i):
                out.append(source[i : i + 2])
                i += 2
                continue
        elif c == "^":
            c = '(?:^|")'
        elif c == "$":
            c = '(?:$|")'
        out.append(c)
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class _Rule:
    """A pattern compiled for the engine."""

    pattern: SecretPattern
    regex: Any
    groups: tuple[int, ...]
    """Indexes of the secret groups (empty: the whole match is the secret)."""
    allow: Any
    """Compiled alternation of the allow-list (anchored at both ends when used), or None."""
    marker: bytes

    @classmethod
    def of(cls, pattern: SecretPattern) -> _Rule:
        regex = _compile(pattern.source)
        groups = tuple(
            index
            for name, index in sorted(regex.NamedCapturingGroups(), key=lambda item: item[1])
            if name.startswith(b"secret")
        )
        allow = _compile(_alternation(pattern.allow), False) if pattern.allow else None
        return cls(pattern, regex, groups, allow, pattern.marker.encode("utf-8"))

    def spans(self, data: bytes) -> list[tuple[int, int]]:
        """The secret parts of every match of this rule in ``data`` (UTF-8), as byte offsets."""
        out: list[tuple[int, int]] = []
        match = self.regex.Match
        end = len(data)
        pos = 0
        rejected_end = -1
        while pos <= end:
            found = match(_UNANCHORED, data, pos, end)
            start, stop = found[0]
            if start < 0:
                break
            kept, refused = False, -1
            if self.groups:
                for index in self.groups:
                    s, e = found[index]
                    if s >= 0 and e > s:
                        if self._keep(data, s, e):
                            out.append((s, e))
                            kept = True
                        elif refused < 0:
                            refused = s
            elif stop > start and self._keep(data, start, stop):
                out.append((start, stop))
                kept = True
            if not kept and refused > start and stop != rejected_end:
                # a value refused (low entropy, allow-listed) may hold a key of its own --
                # "key: API_KEY=<secret>": look again from the value, once per value (a chain
                # "key=key=key=..." ends at the same place and is not scanned again)
                rejected_end, pos = stop, refused
                continue
            pos = stop if stop > start else _next_char(data, stop)
        return out

    def _keep(self, data: bytes, start: int, end: int) -> bool:
        if data.startswith(b"[REDACTED:", start) and _NAMED_MARKER.fullmatch(data, start, end):
            return False  # a rule's marker already: redaction is idempotent
        if self.allow is not None and self.allow.Match(_ANCHOR_BOTH, data, start, end)[0][0] >= 0:
            return False
        if self.pattern.min_entropy:
            text = data[start:end].decode("utf-8", "replace")
            return looks_random(text) and entropy(text) >= self.pattern.min_entropy
        return True


#: A rule's marker. ``[REDACTED]`` (what a sensitive key leaves) is not one: written into text
#: under a key, it is redacted again as the secret was (see the rules' ``_VALUE``).
_NAMED_MARKER = re.compile(rb"\[REDACTED:[A-Za-z0-9_.-]*\]")


def _next_char(data: bytes, pos: int) -> int:
    """The offset of the UTF-8 character after the one at ``pos``."""
    pos += 1
    while pos < len(data) and (data[pos] & 0xC0) == 0x80:
        pos += 1
    return pos


# --- the scan form of a canonical JSON text ----------------------------------------------------

_ESCAPE = re.compile(rb'\\(?:u([0-9a-fA-F]{4})|(["\\/bfnrt]))')
_ESCAPED = {b'"': b'"', b"\\": b"\\", b"/": b"/", b"b": b"\b", b"f": b"\f", b"n": b"\n"}
_ESCAPED.update({b"r": b"\r", b"t": b"\t"})


def _unescape_one(match: re.Match[bytes]) -> bytes:
    if match.group(1) is not None:
        return chr(int(match.group(1), 16)).encode("utf-8", "surrogatepass")
    return _ESCAPED[match.group(2)]


#: An escape that ``codecs.escape_decode`` would not read as JSON does (``\\u``, ``\\/``): one
#: RE2 search, which skips from backslash to backslash (a two-byte ``in`` test is far slower).
_NOT_SHORT_ESCAPE = _re2.RE2(rb'\\[^"\\bfnrt]', _options(capture=False))


def scan_form(data: bytes) -> bytes:
    """``data`` (canonical JSON, UTF-8) with every JSON escape decoded in place: each string of
    the payload appears verbatim in it, between two quotes."""
    if b"\\" not in data:
        return data
    if _NOT_SHORT_ESCAPE.Match(_UNANCHORED, data, 0, len(data))[0][0] < 0:
        # only \" \\ \b \f \n \r \t: Python's bytes escapes too, decoded bytes to bytes in C
        # (bytes >= 0x80 stay as they are)
        decoded: bytes = codecs.escape_decode(data)[0]
        return decoded
    try:
        # C speed: JSON's escapes are Python's, but for \/ (which canonical JSON never writes);
        # bytes >= 0x80 come back as themselves through Latin-1
        return data.decode("unicode_escape").encode("latin-1")
    except (UnicodeError, DeprecationWarning):  # \u beyond U+00FF, or \/: read each escape
        return _ESCAPE.sub(_unescape_one, data)


# --- key detectors (for the scan form): a superset of the keys the walk redacts ---------------

_SEP_CHARS = r"[ \t\n\r\f\v_.\-]*"


def _key_detector(words: Iterable[str], end: str) -> str:
    """Matches ``<key>":`` (``end``; ``<name>",`` for a pair) in the scan form wherever the
    normalised key ends with one of ``words``: its letters, any of the removed separators between
    and after them."""
    spelled = "|".join(_SEP_CHARS.join(re.escape(c) for c in word) for word in words)
    return rf"(?i:{spelled}){_SEP_CHARS}{end}"


#: A key is *generic* when this finds a generic word followed by at most 20 key characters at
#: its end (gitleaks' generic rule: ``<word>[ \t\w.-]{0,20}`` before the assignment).
_GENERIC_KEY_TAIL = r"[A-Za-z0-9_. -]{0,20}"
_GENERIC_KEY = "(?i:" + "|".join(GENERIC_KEY_WORDS) + ")" + _GENERIC_KEY_TAIL
_GENERIC_VALUE = r"[A-Za-z0-9_.=+/~-]{12,}"


@functools.lru_cache(maxsize=8192)
def _is_generic_key(key: str) -> bool:
    data = key.encode("utf-8", "surrogatepass")
    found: int = _compile(_GENERIC_KEY + "$", False).Match(_UNANCHORED, data, 0, len(data))[0][0]
    return found >= 0


def _detectors(sensitive: tuple[str, ...]) -> tuple[str, ...]:
    """Key detectors: a sensitive key or pair name, a short last word, a generic key with a
    random-looking string value."""
    segment = "(?i:" + "|".join(SEGMENT_KEYS) + r')[^A-Za-z0-9]*"[:,]'
    generic = rf'{_GENERIC_KEY}":"{_GENERIC_VALUE}"'
    return (_key_detector(sensitive, '"[:,]'), segment, generic)


def _is_pair_list(value: list[Any] | tuple[Any, ...]) -> bool:
    """A list of ``[name, value]`` pairs (headers or query parameters as tuples)."""
    return bool(value) and all(
        isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)
        for item in value
    )


# --- the redactor --------------------------------------------------------------------------------


class _Plan(NamedTuple):
    """What the slow path has to do with one payload. (A named tuple: one is made per payload
    the pre-check fires on, and a frozen dataclass costs several times more to build.)"""

    patterns: tuple[SecretPattern, ...]
    """The rules that matched somewhere in the payload's scan form."""
    keys: bool
    """Whether a key detector matched (the payload may hold a key to redact: walk it)."""
    probe: Any = None
    """The alternation of ``patterns`` (RE2, no captures): a string it finds nothing in is left
    alone without redacting it."""
    raw: bytes = b""
    """The canonical text's UTF-8 bytes."""
    raw_needles: tuple[int, ...] | None = None
    """The indexes of ``patterns`` among the redactor's, when the splice may apply; None
    otherwise (:meth:`Redactor.redact` walks)."""
    redact_text: Any = None
    """The redactor's own :meth:`Redactor.redact_text` (what the splice redacts strings with)."""
    owner: Any = None
    """The redactor (its key rules and key detectors, for the splice)."""
    scan: bytes | None = None
    """The scan form of ``raw``, when the pre-check made it (None: made again when needed)."""


@dataclass(frozen=True)
class Redactor:
    """Redaction rules. Immutable; derive a changed copy with :meth:`with_rules`.

    >>> r = Redactor().with_rules(keys=["ssn"])
    >>> r.redact({"ssn": "078-05-1120", "q": "Bearer abc.def.ghi"})
    {'ssn': '[REDACTED]', 'q': 'Bearer [REDACTED:bearer_token]'}
    """

    patterns: tuple[SecretPattern, ...] = DEFAULT_PATTERNS
    """Secret-shaped value patterns; overlapping matches are marked with the first one's name."""
    sensitive_keys: tuple[str, ...] = DEFAULT_SENSITIVE_KEYS
    """Key suffixes whose values are always redacted (normalised form)."""
    allow: tuple[str, ...] = ()
    """RE2 patterns for known false positives: a secret that one of them matches in full is left
    alone, whichever rule found it."""
    _rules: tuple[_Rule, ...] = field(init=False, repr=False, compare=False)
    _gate: Any = field(init=False, repr=False, compare=False)
    _exact: tuple[str | None, ...] = field(init=False, repr=False, compare=False)
    _set: Any = field(init=False, repr=False, compare=False)
    _probes: dict[tuple[int, ...], Any] = field(init=False, repr=False, compare=False)
    _key_regexes: tuple[Any, ...] = field(init=False, repr=False, compare=False)
    json_default: Any = field(init=False, repr=False, compare=False)
    """The orjson ``default`` that encodes bytes as base64 *after* redacting them
    (:meth:`redact_bytes`): what the recorder canonicalises payloads with."""

    def __post_init__(self) -> None:
        keys = tuple(dict.fromkeys(k for k in map(_normalise_key, self.sensitive_keys) if k))
        set_ = object.__setattr__
        set_(self, "sensitive_keys", keys)
        set_(self, "allow", tuple(self.allow))
        patterns = tuple(self.patterns)
        if self.allow:  # the global allow-list joins every rule's own
            patterns = tuple(
                p if set(self.allow) <= set(p.allow) else _with_allow(p, self.allow)
                for p in patterns
            )
        set_(self, "patterns", patterns)
        set_(self, "_rules", tuple(_Rule.of(p) for p in patterns))
        sources = [
            _uncaptured(s)
            for s in [_quote_anchored(p.source) for p in patterns] + list(_detectors(keys))
        ]
        gates = [gate_of(source) for source in sources]
        set_(self, "_gate", _regex_set([g or s for g, s in zip(gates, sources, strict=True)]))
        # what a gate's hit is checked with: the rule itself (None: the gate is the rule)
        set_(
            self,
            "_exact",
            tuple(None if g is None else s for g, s in zip(gates, sources, strict=True)),
        )
        set_(self, "_key_regexes", tuple(_compile(d, False) for d in _detectors(keys)))
        set_(self, "_set", _regex_set(sources))
        set_(self, "_probes", {})
        set_(self, "json_default", bytes_default(self.redact_bytes))

    def with_rules(
        self,
        *,
        keys: Iterable[str] = (),
        patterns: Iterable[tuple[str, str] | SecretPattern] = (),
        allow: Iterable[str] = (),
    ) -> Redactor:
        """A copy with more sensitive keys, ``(name, regex)`` value patterns (RE2 syntax) and/or
        allow-list patterns (RE2, matched against a whole secret) added."""
        extra = tuple(
            p if isinstance(p, SecretPattern) else SecretPattern(p[0], p[1]) for p in patterns
        )
        new_keys = tuple(_normalise_key(key) for key in keys if _normalise_key(key))
        if new_keys:  # the same keys inside text: `ssn=...`, `{'ssn': '...'}` in a message
            # written as built-in key words are (rules._word): a key is compared normalised, so
            # `ticket_ref`, `ticket-ref`, `TicketRef` and `ticket ref` in text are the one key
            words = "|".join(
                r"[_.\- ]?".join(re.escape(c) for c in key) for key in sorted(set(new_keys))
            )
            extra += (_assignment("sensitive_key", "user", "user keys in text", words),)
        for pattern in (*extra, *(SecretPattern("allow", a) for a in allow)):
            _compile(pattern.source)  # refuse what RE2 does not accept, here
        return Redactor(
            patterns=self.patterns + extra,
            sensitive_keys=self.sensitive_keys + tuple(keys),
            allow=self.allow + tuple(allow),
        )

    # -- rules ---------------------------------------------------------------------------------

    def is_sensitive_key(self, key: str) -> bool:
        """Whether a value under ``key`` is always redacted."""
        return _normalise_key(key).endswith(self.sensitive_keys) or (
            last_key_word(key) in SEGMENT_KEYS
        )

    def is_generic_key(self, key: str) -> bool:
        """Whether a random-looking string under ``key`` is redacted (see
        :func:`~stepfork_otel.trace.redaction.rules.looks_random`)."""
        return _is_generic_key(key)

    def redact_text(self, text: str) -> str:
        """Replace every secret-shaped part of ``text`` (used for strings and exception messages)."""
        return self._redact_text(text)

    def redact_bytes(self, data: bytes) -> bytes:
        """``data`` with its secrets redacted, as bytes: read as UTF-8 text when it is text, else
        byte for byte (Latin-1, so every byte is one character and the rest stays as it was)."""
        # Until nothing changes: a secret holding the only byte that is not UTF-8 is replaced by
        # an ASCII marker, and what is left is then read as UTF-8, where a rule may find what it
        # could not find in Latin-1 (`paſsword=`); redacted bytes must redact to themselves.
        for _ in range(_MAX_PASSES):
            try:
                text, encoding = data.decode("utf-8"), "utf-8"
            except UnicodeDecodeError:
                text, encoding = data.decode("latin-1"), "latin-1"
            redacted = self._redact_text(text)
            if redacted is text:
                return data
            data = redacted.encode(encoding, "surrogatepass")
        return UNSTABLE_MARKER.encode("ascii")

    def redact(self, value: Any) -> Any:
        """A redacted copy of a JSON-shaped value (dicts, lists, strings, numbers)."""
        everything = _Plan(self.patterns, True, self._probe_of(tuple(range(len(self.patterns)))))
        return self._walk(value, everything)[0]

    def redact_message(self, message: str) -> str:
        """An exception message made safe to record: redacted and bounded in length."""
        text = self.redact_text(message)
        # Cut, then redact the cut text again until it no longer changes: a cut may leave a part
        # of a marker where a rule finds a value (`Authorization: Bearer [REDAC`), and a message
        # recorded once is redacted again in replay: it must redact to itself.
        for _ in range(_MAX_PASSES):
            if len(text) <= MAX_MESSAGE_CHARS:
                return text
            cut = text[:MAX_MESSAGE_CHARS] + "…[truncated]"
            text = self.redact_text(cut)
            if text == cut:
                return cut
        return UNSTABLE_MARKER

    def may_change_texts(self, texts: Iterable[str]) -> bool:
        """One RE2 search of the gates over ``texts`` (then of the rules they name): False means
        :meth:`redact_text` leaves every one of them unchanged (each is put between quotes, as
        the strings of a payload's scan form are)."""
        data = b'"' + b'"\x00"'.join(t.encode("utf-8", "surrogatepass") for t in texts) + b'"'
        return bool(self._matched(data, first=True))

    def matching_rules(self, text: str) -> list[SecretPattern]:
        """The rules that find a secret in ``text`` (what ``stepfork redact`` reports)."""
        data = text.encode("utf-8", "surrogatepass")
        return [rule.pattern for rule in self._rules if rule.spans(data)]

    # -- the fast path used by the boundaries ---------------------------------------------------

    def may_contain_secret(self, canonical: str) -> bool:
        """Cheap pre-check on canonical JSON text: False means :meth:`redact` would change nothing."""
        return self._plan(canonical) is not None

    def redact_canonical(self, canonical: str, *, keep_order: bool = False) -> str:
        """Redact a compact JSON text (canonical, or -- ``keep_order``, an output as returned --
        with its objects' keys in the order the value held them); returns the same text when
        nothing needed redaction. The key order of the text is kept either way: the splice
        edits strings in place, and a text that needs the walk is encoded again in its own
        order (sorted for canonical text)."""
        plan = self._plan(canonical)
        return canonical if plan is None else self._redact_planned(canonical, plan, {}, keep_order)

    def _redact_planned(
        self, canonical: str, plan: _Plan, memo: dict[str, str], keep_order: bool = False
    ) -> str:
        if plan.raw_needles is not None:
            spliced = _splice(canonical, plan, memo)
            if spliced is not None:
                return spliced
        # orjson reads an integer beyond 64 bits as a float (1e+20): the stdlib parser keeps it
        value = canonical_loads(canonical)
        redacted, changed = self._walk(value, plan)
        if not changed:
            return canonical
        return (
            as_returned_bytes(redacted).decode("utf-8") if keep_order else canonical_json(redacted)
        )

    def _plan(self, canonical: str | bytes) -> _Plan | None:
        """None when no rule can match the canonical text (given as text or as its UTF-8
        bytes); otherwise the rules that matched somewhere."""
        raw = (
            canonical.encode("utf-8", "surrogatepass") if isinstance(canonical, str) else canonical
        )
        scan = scan_form(raw)
        matched = self._matched(scan)
        if not matched:
            return None
        count = len(self.patterns)
        indexes = tuple(i for i in matched if i < count)
        keys = matched[-1] >= count
        return _Plan(
            tuple(self.patterns[i] for i in indexes),
            keys,
            self._probe_of(indexes),
            raw,
            indexes,
            self._redact_text,
            self,
            scan,
        )

    def _matched(self, scan: bytes, *, first: bool = False) -> list[int]:
        """The indexes of the rules and key detectors that match somewhere in ``scan`` (sorted;
        with ``first``, at most one): the gates first (:mod:`.prefilter`: nothing found there
        means no rule matches, the common case), then the rules whose gate fired."""
        candidates = self._gate.Match(scan)
        if not candidates:
            return []
        if len(candidates) > _FEW and not first:
            return sorted(self._set.Match(scan))
        out: list[int] = []
        exact = self._exact
        for index in sorted(candidates):
            source = exact[index]
            if source is None or _one_set(source).Match(scan):
                out.append(index)
                if first:
                    break
        return out

    def _probe_of(self, indexes: tuple[int, ...]) -> Any:
        """The probe of the patterns at ``indexes`` (built once per combination)."""
        probe = self._probes.get(indexes)
        if probe is None and indexes:
            probe = _compile(_alternation(self.patterns[i].source for i in indexes), False)
            if len(self._probes) < 1024:
                self._probes[indexes] = probe
        return probe

    def _walk(self, value: Any, plan: _Plan) -> tuple[Any, bool]:
        probe = plan.probe
        redact_text = self._redact_text
        sensitive = self.is_sensitive_key if plan.keys else None
        generic = self.is_generic_key if plan.keys else None

        seen: dict[str, str] = {}  # keys and short values repeat: each is looked at once

        def text(s: str) -> str:
            done = seen.get(s)
            if done is not None:
                return done
            if probe is None:
                return s
            data = s.encode("utf-8", "surrogatepass")
            found = probe.Match(_UNANCHORED, data, 0, len(data))[0][0] >= 0
            done = redact_text(s) if found else s
            seen[s] = done
            return done

        def walk(value: Any) -> tuple[Any, bool]:
            if isinstance(value, str):
                redacted = text(value)
                return redacted, redacted != value
            if isinstance(value, dict):
                changed = False
                out: dict[Any, Any] = {}
                numbered: dict[str, int] = {}  # a name taken -> the next number to try
                for k, v in value.items():
                    if sensitive is not None and isinstance(k, str) and sensitive(k):
                        item: Any = KEY_MARKER
                        changed = changed or v != KEY_MARKER
                    elif (
                        generic is not None
                        and isinstance(v, str)
                        and isinstance(k, str)
                        and generic(k)
                        and looks_random(v)
                    ):
                        item = GENERIC_MARKER
                        changed = True
                    elif isinstance(v, (str, dict, list, tuple)):
                        item, c = walk(v)
                        changed = changed or c
                    else:
                        item = v
                    if isinstance(k, str):
                        name = text(k)
                        if name != k:  # a secret used as a key
                            changed = True
                            k = name
                        if k in out:  # taken by a redacted key: number it, never overwrite
                            k = _free_name(k, out, numbered)
                    out[k] = item
                return out, changed
            if isinstance(value, (list, tuple)):
                if sensitive is not None and _is_pair_list(value):
                    return pairs(value)
                items = [walk(v) for v in value]
                return [v for v, _ in items], any(c for _, c in items)
            return value, False

        def pairs(value: list[Any] | tuple[Any, ...]) -> tuple[Any, bool]:
            assert sensitive is not None
            out: list[Any] = []
            changed = False
            for name, item in value:
                if sensitive(name):
                    redacted, c = [text(name), KEY_MARKER], item != KEY_MARKER
                else:
                    redacted, c = walk([name, item])
                out.append(redacted)
                changed = changed or c or redacted[0] != name
            return out, changed

        return walk(value)

    def _redact_text(self, text: str) -> str:
        """Every rule on ``text``, until nothing changes (see the module docstring)."""
        data = text.encode("utf-8", "surrogatepass")
        for _ in range(_MAX_PASSES):
            redacted = self._one_pass(data)
            if redacted is data:
                return text if _ == 0 else data.decode("utf-8", "surrogatepass")
            data = redacted
        return UNSTABLE_MARKER

    def _one_pass(self, data: bytes) -> bytes:
        matched = self._set.Match(data)
        count = len(self._rules)
        spans: list[tuple[int, int, int]] = []
        for index in sorted(i for i in matched if i < count):
            spans.extend((s, index, e) for s, e in self._rules[index].spans(data))
        if not spans:
            return data
        spans.sort()
        pieces: list[bytes] = []
        done = 0
        current_start, current_rule, current_end = spans[0]
        for start, rule, end in spans[1:]:
            if start < current_end:  # overlaps: one marker for both
                current_end = max(current_end, end)
                continue
            pieces += (data[done:current_start], self._rules[current_rule].marker)
            done = current_end
            current_start, current_rule, current_end = start, rule, end
        pieces += (data[done:current_start], self._rules[current_rule].marker, data[current_end:])
        return b"".join(pieces)


def _with_allow(pattern: SecretPattern, allow: tuple[str, ...]) -> SecretPattern:
    return SecretPattern(
        pattern.name,
        pattern.regex,
        pattern.triggers,
        pattern.prefixes,
        pattern.confirm,
        family=pattern.family,
        description=pattern.description,
        min_entropy=pattern.min_entropy,
        allow=tuple(dict.fromkeys(pattern.allow + allow)),
    )


#: Passes of the patterns over one string at most (see :meth:`Redactor._redact_text`).
_MAX_PASSES = 8
_MAX_SPLICE_HITS = 64


def _quote_map(raw: bytes, scan: bytes) -> bytes:
    """``scan`` (the scan form of ``raw``) with the quotes that were escaped in ``raw`` (``\\"``)
    turned into ``\x01``: the same length, and its quotes are exactly the strings' delimiters."""
    if b"\\" not in raw or b'\\"' not in raw:  # (a one-byte test first: memchr's speed)
        return scan
    held = raw.replace(b"\\\\", b"\x03")  # escaped backslashes first: pairs read left to right
    held = held.replace(b'\\"', b"\\u0001").replace(b"\x03", b"\\\\")
    return scan_form(held)


_KEY_MARKER_BYTES = KEY_MARKER.encode("ascii")
_GENERIC_MARKER_BYTES = GENERIC_MARKER.encode("ascii")


class _Strings:
    """The strings of a canonical JSON text, located from offsets of its scan form -- each
    look-up in time proportional to how far it is from the previous one, so that a splice costs
    time linear in the text however many matches it has (counting the quotes before every match
    from the start made a text dense in secrets quadratic: issue 24).

    ``quotes_at`` is the scan form with the decoded quotes masked (:func:`_quote_map`): its quotes
    are exactly the strings' delimiters, in the order of the text's."""

    __slots__ = ("_at", "_before", "_starts", "quotes_at", "raw")

    def __init__(self, raw: bytes, quotes_at: bytes) -> None:
        self.raw = raw
        self.quotes_at = quotes_at
        self._at = 0  # an offset of the scan form, and the delimiters before it
        self._before = 0
        self._starts: list[int] | None = None  # where each piece between delimiters begins

    def delimiters_before(self, offset: int) -> int:
        """How many delimiters lie before ``offset`` in the scan form (an odd count: the offset
        is inside a string, whose index it is)."""
        at = self._at
        if offset >= at:
            self._before += self.quotes_at.count(b'"', at, offset)
        else:
            self._before -= self.quotes_at.count(b'"', offset, at)
        self._at = offset
        return self._before

    def at_closing(self, closing: int) -> tuple[int, str] | None:
        """The string whose closing quote is at ``closing`` in the scan form: its index among
        the text's strings and its decoded value; None when that quote is not a delimiter."""
        if self.quotes_at[closing : closing + 1] != b'"':
            return None
        index = self.delimiters_before(closing)
        if index % 2 == 0:
            return None
        return index, self.value(index, closing)

    def bounds(self, index: int, near: int) -> tuple[int, int]:
        """``(begin, end)`` in the text of the string ``index``, given ``near``: an offset of the
        scan form inside it or at its closing quote."""
        raw = self.raw
        if self.quotes_at is raw:  # no escapes: offsets in the scan form are offsets in the text
            return raw.rfind(b'"', 0, near) + 1, raw.find(b'"', near)
        starts = self._starts
        if starts is None:
            # the text cut at its delimiters once (its escaped quotes and backslashes masked),
            # the lengths added up in C: never a loop over every string of the payload
            masked = raw.replace(b"\\\\", b"__").replace(b'\\"', b"__")
            lengths = [len(part) + 1 for part in masked.split(b'"')]
            starts = self._starts = [0, *itertools.accumulate(lengths)]
        begin = starts[index]
        return begin, starts[index + 1] - 1

    def value(self, index: int, near: int) -> str:
        begin, end = self.bounds(index, near)
        text = self.raw[begin:end]
        value: str = orjson.loads(b'"' + text + b'"') if b"\\" in text else text.decode("utf-8")
        return value


def _keyed_values(
    scan: bytes, strings: _Strings, owner: Redactor
) -> dict[int, tuple[bytes, int]] | None:
    """The values the key rules replace whole, by string index: a sensitive key's string value
    (``[REDACTED]``), a random-looking string under a generic key (``[REDACTED:generic_secret]``),
    each with an offset of the scan form inside the string or at its closing quote. None when the
    splice cannot do it (a sensitive key whose value is not a string, a pair list, a detector
    match spanning strings): the caller walks."""
    out: dict[int, tuple[bytes, int]] = {}
    quotes_at = strings.quotes_at
    sensitive, segment, generic = owner._key_regexes
    for regex in (sensitive, segment):
        pos, end = 0, len(scan)
        while pos < end:
            start, stop = regex.Match(_UNANCHORED, scan, pos, end)[0]
            if start < 0:
                break
            pos = stop
            closing = stop - 2  # the match ends with `"` and `:` (a key) or `,` (a pair)
            if quotes_at[closing : closing + 1] != b'"':
                continue  # a quote inside a string: no key ends there
            if b'"' in quotes_at[start:closing]:
                return None  # spans strings: let the walk decide
            key = strings.at_closing(closing)
            if key is None:
                continue
            index, name = key
            if not owner.is_sensitive_key(name):
                continue
            if scan[stop - 1 : stop] == b",":
                opening = quotes_at.rfind(b'"', 0, closing)
                if scan[opening - 1 : opening] != b"[":
                    continue  # an object's value, a list's later item: never a key or a name
                return None  # maybe a [name, value] pair: the walk knows
            if scan[stop : stop + 1] != b'"':
                return None  # a number, an object, a list under a sensitive key
            out[index + 2] = (_KEY_MARKER_BYTES, stop + 1)  # its value begins after `":"`
    pos, end = 0, len(scan)
    while pos < end:
        start, stop = generic.Match(_UNANCHORED, scan, pos, end)[0]
        if start < 0:
            break
        pos = stop
        value = strings.at_closing(stop - 1)
        if value is None:
            continue  # the value's quote is inside a string (and looking back could be far)
        opening = quotes_at.rfind(b'"', 0, stop - 1)  # no quote in the value: a short look
        if scan[opening - 1 : opening] != b":":
            continue  # not `"<key>":"<value>"` with real delimiters
        key = strings.at_closing(opening - 2)
        if key is None or key[0] != value[0] - 2:
            continue
        if len(out) > _MAX_SPLICE_HITS:
            return None
        index, text = value
        name = key[1]
        if (
            index not in out
            and not owner.is_sensitive_key(name)
            and owner.is_generic_key(name)
            and looks_random(text)
        ):
            out[index] = (_GENERIC_MARKER_BYTES, stop - 1)
    return out


def _splice(canonical: str, plan: _Plan, memo: dict[str, str] | None = None) -> str | None:
    """``canonical_json`` of the redacted value, without decoding the whole payload: the strings
    that redaction changes, redacted and written back into the text. None when this shortcut does
    not apply (a match spans more than one string or lies outside strings, a key would change,
    many matches): the caller decodes and walks.

    The rules are searched in the scan form, where each string appears decoded; a copy of it with
    the decoded quotes masked (:func:`_quote_map`) tells which string a match lies in (its
    quotes are the delimiters, in the order of the text's). Every match of a rule inside a string
    is found by searching the rule in the whole scan form -- unless a match that overlaps it and
    starts earlier hides it; that earlier match either lies in the same string (which is then
    redacted whole anyway) or spans a delimiter (it is dropped, and the search starts again one
    character after its start). A string without a match of any rule is one the walk leaves
    alone. The key rules are applied by :func:`_keyed_values`, which declines what only the walk
    can do. ``memo``: strings already redacted (string -> redacted), filled in here."""
    if plan.raw_needles is None or plan.redact_text is None:
        return None
    if memo is None:
        memo = {}
    raw = plan.raw
    scan = scan_form(raw) if plan.scan is None else plan.scan
    quotes_at = _quote_map(raw, scan)
    strings = _Strings(raw, quotes_at)
    hits: dict[int, int] = {}  # string index -> an offset of the scan form inside it
    crossings = 0
    for pattern in plan.patterns:
        regex = _scan_regex(pattern.source)
        pos, end = 0, len(scan)
        while pos <= end:
            start, stop = regex.Match(_UNANCHORED, scan, pos, end)[0]
            if start < 0:
                break
            first = start + 1 if scan[start : start + 1] == b'"' else start
            last = stop - 1 if stop - 1 > first and scan[stop - 1 : stop] == b'"' else stop
            if b'"' in quotes_at[first:last]:
                # spans strings (`"Authorization":"..."`): the walk never sees such a text, but
                # it may hide a match inside a string: one starting here but ending within the
                # string (searched in the string alone), or one starting later
                crossings += 1
                if crossings > _MAX_SPLICE_HITS:
                    return None
                quotes = strings.delimiters_before(first)
                if quotes % 2:
                    closing = quotes_at.find(b'"', first)
                    if regex.Match(_UNANCHORED, scan, start, closing)[0][0] >= 0:
                        hits[quotes] = first
                pos = _next_char(scan, start)
                continue
            quotes = strings.delimiters_before(first)
            if quotes % 2 == 0:  # outside every string (cannot be: a rule matches text)
                return None
            hits[quotes] = first
            if len(hits) > _MAX_SPLICE_HITS:
                return None
            pos = stop if stop > start else _next_char(scan, stop)
    keyed: dict[int, tuple[bytes, int]] = {}  # string index -> (its whole replacement, offset)
    if plan.keys:
        found = _keyed_values(scan, strings, plan.owner)
        if found is None:
            return None
        keyed = found
    if not hits and not keyed:
        return canonical
    wanted = {index: near for index, (_, near) in keyed.items()}
    wanted.update(hits)
    pieces: list[bytes] = []
    done = 0
    redact_text = plan.redact_text
    for index in sorted(wanted):
        begin, stop = strings.bounds(index, wanted[index])
        text = raw[begin:stop]
        replacement = keyed[index][0] if index in keyed else None
        if replacement is not None:
            if text != replacement:
                pieces += (raw[done:begin], replacement)
                done = stop
            continue
        value = orjson.loads(b'"' + text + b'"') if b"\\" in text else text.decode("utf-8")
        redacted = memo.get(value)
        if redacted is None:
            redacted = memo[value] = redact_text(value)
        if redacted != value:
            if raw.startswith(b":", stop + 1):  # a key: the order of keys could change
                return None
            pieces.append(raw[done:begin])
            pieces.append(orjson.dumps(redacted)[1:-1])
            done = stop
    if not pieces:
        return canonical
    pieces.append(raw[done:])
    return b"".join(pieces).decode("utf-8")


def _free_name(name: str, taken: dict[Any, Any], numbered: dict[str, int]) -> str:
    """The first ``name#<n>`` (n >= 2) not in ``taken``. ``numbered`` keeps, per name, the number
    after the last one given: names are only ever added to ``taken``, so every number below it
    stays taken, and many keys redacted to one marker cost one look each (not one per earlier
    key: a dict of thousands of secrets used as keys was quadratic)."""
    if name not in taken:
        return name
    n = numbered.get(name, 2)
    while f"{name}#{n}" in taken:
        n += 1
    numbered[name] = n + 1
    return f"{name}#{n}"


if TYPE_CHECKING:
    #: The redactor used when none is configured.
    DEFAULT_REDACTOR: Redactor

# Built on first use (PEP 562), once: compiling its rules costs ~45 ms of CPU that a program
# importing the engine only to read bundles (``stepfork validate``, ``show``) does not need.
_DEFAULT_LOCK = threading.Lock()


def __getattr__(name: str) -> Any:
    if name != "DEFAULT_REDACTOR":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _DEFAULT_LOCK:
        if "DEFAULT_REDACTOR" not in globals():
            globals()["DEFAULT_REDACTOR"] = Redactor()
    return globals()["DEFAULT_REDACTOR"]
