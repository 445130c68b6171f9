"""Redaction of secrets at the boundary, before a value reaches a span, an exporter or a file.

Two rules, applied to the JSON form of every payload and to exception messages:

* **Sensitive keys.** A value under a key such as ``api_key``, ``Authorization``, ``password``,
  ``client_secret``, ``access_token`` or ``Cookie`` is replaced whole by ``"[REDACTED]"``, whatever
  it looks like (a string, a number, an object). Keys are compared after lower-casing and removing
  ``_``, ``-``, ``.`` and ASCII whitespace, and match when they *end* with a sensitive word, so
  ``X-Api-Key`` and ``openai_api_key`` match while ``max_tokens`` and ``key_count`` do not.
* **Secret-shaped values.** Inside any string (and any dict key), provider keys (OpenAI,
  Anthropic, Google, AWS, GitHub, Slack, Stripe), JWTs, bearer/basic credentials, PEM private keys,
  ``password=...``-style assignments and passwords in URLs and connection strings are replaced by
  ``[REDACTED:<pattern name>]``. Case-insensitive parts of the patterns fold ASCII case only, and
  "whitespace" means ASCII whitespace: the cheap pre-check below must be able to prove a match
  impossible, and Unicode case folding (``ſ`` matches ``s``) would defeat that.

Markers are fixed strings -- never a hash of the secret, which could be brute-forced for a short
password -- so the same input always redacts to the same text and fingerprints stay stable.

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
walk. Only then is the payload decoded and walked -- with just the rules whose needles were found.

A needle is deliberately looser than its rule: a false alarm costs time, never correctness. Words
such as "bearer" and "basic" are both needles and ordinary English; a payload holding them is
walked with those two patterns only (which then leave "basic information" alone). What was
rejected: a trigger on the last three letters of each key (``ion":`` fired on every
``"destination":``), bare ``pass``/``token`` (``passengers``, ``max_tokens``), prefixes matched only
at the start of a token-like run (missed ``key_sk-...``), and one alternation regex (the ``re``
engine tries every branch at every position: slower than forty substring tests).
``tests/test_redaction.py`` checks that the pre-check says "maybe" for every payload that redaction
would change, for each secret family in many positions, and on random fragments of every rule.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from stepfork_otel.trace.canonical import canonical_json

#: Replacement for a value found under a sensitive key.
KEY_MARKER = "[REDACTED]"
#: Longest exception message kept (after redaction), in characters.
MAX_MESSAGE_CHARS = 2000


@dataclass(frozen=True)
class SecretPattern:
    """A secret-shaped value. Only the ``secret`` group (or the whole match) is replaced.

    ``triggers``, ``prefixes`` and ``confirm`` make the fast pre-check possible: every match must
    contain one of the triggers or one of the prefixes. A pattern with neither is checked on every
    payload (correct, slower).
    """

    name: str
    """Short name, used in the marker ``[REDACTED:<name>]``."""
    regex: re.Pattern[str]
    """Compiled pattern; may define a named group ``secret`` to keep the surrounding text."""
    triggers: tuple[str, ...] = ()
    """Texts one of which every match contains, compared ignoring ASCII case, ``_``, ``-``, ``.``
    and whitespace (``"api key"`` is found in ``API_KEY=``)."""
    prefixes: tuple[str, ...] = ()
    """Case-sensitive texts one of which every match contains (``"AKIA"``)."""
    confirm: re.Pattern[bytes] | None = None
    """Optional: a regex that finds something in the canonical JSON text (its UTF-8 bytes, as
    they are) whenever the pattern matches; checked after a trigger or prefix was found, so that a
    common one (``://``, ``sk-`` in ``task-1``) does not send the payload down the slow path."""

    @property
    def marker(self) -> str:
        return f"[REDACTED:{self.name}]"


def _p(
    name: str,
    pattern: str,
    *,
    triggers: tuple[str, ...] = (),
    prefixes: tuple[str, ...] = (),
    confirm: bytes | None = None,
) -> SecretPattern:
    return SecretPattern(
        name,
        re.compile(pattern, re.ASCII),
        triggers,
        prefixes,
        None if confirm is None else re.compile(confirm),
    )


# A credential after "Bearer"/"Basic" must not be a plain word ("basic information").
_NOT_A_WORD = r"(?![A-Z]?[a-z]+(?![A-Za-z0-9+/=\-._~]))"

#: The built-in secret patterns, most specific first (they are applied in this order).
DEFAULT_PATTERNS: tuple[SecretPattern, ...] = (
    _p(
        "pem_private_key",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----|[\s\S]*)",
        triggers=("private key",),
    ),
    _p("anthropic_api_key", r"sk-ant-[A-Za-z0-9_\-]{20,}", prefixes=("sk-ant-",)),
    _p(
        "openai_api_key",
        r"(?<![A-Za-z0-9])sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}",
        prefixes=("sk-",),
        confirm=rb"sk-[A-Za-z0-9_\-]{20}",
    ),
    _p("google_api_key", r"AIza[0-9A-Za-z_\-]{35}", prefixes=("AIza",)),
    _p(
        "aws_access_key_id",
        r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}(?![A-Z0-9])",
        prefixes=("AKIA", "ASIA", "ABIA", "ACCA"),
    ),
    _p(
        "aws_secret_access_key",
        r"(?i:aws_?secret_?(?:access_?)?key)(?:\\*[\"'])?\s*[=:]\s*(?:\\*[\"'])?"
        r"(?P<secret>[A-Za-z0-9/+=]{40})",
        triggers=("aws secret",),
    ),
    _p(
        "github_token",
        r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})",
        prefixes=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    _p(
        "slack_token",
        r"(?:xox[abposre]-[A-Za-z0-9\-]{10,}|xapp-[A-Za-z0-9\-]{10,})",
        prefixes=("xoxa-", "xoxb-", "xoxp-", "xoxo-", "xoxs-", "xoxr-", "xoxe-", "xapp-"),
    ),
    _p(
        "slack_webhook",
        r"https://hooks\.slack\.com/services/[A-Za-z0-9/_\-]+",
        triggers=("hooks.slack.com",),
    ),
    _p(
        "stripe_key",
        r"(?:(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|whsec_[A-Za-z0-9]{16,})",
        prefixes=("sk_live_", "sk_test_", "rk_live_", "rk_test_", "whsec_"),
    ),
    _p(
        "jwt",
        r"eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]*",
        prefixes=("eyJ",),
    ),
    _p(
        "bearer_token",
        rf"(?i:\bbearer)\s+{_NOT_A_WORD}(?P<secret>[A-Za-z0-9\-._~+/]{{8,}}=*)",
        triggers=("bearer",),
    ),
    _p(
        "basic_auth",
        rf"(?i:\bbasic)\s+{_NOT_A_WORD}(?P<secret>[A-Za-z0-9+/]{{8,}}={{0,2}})",
        triggers=("basic",),
    ),
    _p(
        "url_password",
        # user info ends at the last "@" before the host (a password may hold "@" or "/")
        r"(?i:\b[a-z][a-z0-9+.\-]*://)[^/\s:@\"]*:(?P<secret>[^\s\"]+?)@(?=[^\s\"@]*(?:[\s\"/?#]|$))",
        triggers=("://",),
        confirm=rb'://[^"]*@',
    ),
    _p(
        "assigned_secret",
        # `password=...`, `Pwd: ...`, `"api_key": "..."` inside text (connection strings, env
        # dumps, JSON held in a string -- even twice, `\"` --, the repr of a dict in a message)
        r"(?<![A-Za-z0-9])(?i:password|passwd|pwd|passphrase|secret|api[_\-]?key|token)"
        r"(?:\\*[\"'])?\s*[=:]\s*(?:\\*[\"'])?(?P<secret>[^\s;&,\"'<>\\]{4,})",
        triggers=(
            "passw",
            "pwd",
            "passphrase",
            "secret",
            "apikey",
            "token=",
            "token:",
            "token'",
            'token"',
        ),
    ),
)

#: Sensitive key suffixes, compared against the normalised key (see the module docstring).
DEFAULT_SENSITIVE_KEYS: tuple[str, ...] = (
    "password",
    "passwd",
    "passphrase",
    "pwd",
    "secret",
    "token",
    "apikey",
    "accesskey",
    "privatekey",
    "secretkey",
    "credential",
    "credentials",
    "authorization",
    "cookie",
)

_KEY_NORMALISE = re.compile(r"[ \t\n\r\f\v_\-.]")


@functools.lru_cache(maxsize=8192)
def _normalise_key(key: str) -> str:
    return _KEY_NORMALISE.sub("", key.lower())


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

    @classmethod
    def of(cls, anchor: int, needles: list[bytes]) -> _Group:
        # at the anchor (its first occurrence in each needle), compare what follows it, then
        # look back over the whole needle
        alternatives = b"|".join(
            re.escape(n[n.index(anchor) + 1 :]) + b"(?<=" + re.escape(n) + b")" for n in needles
        )
        regex = re.compile(re.escape(bytes([anchor])) + b"(?:" + alternatives + b")")
        return cls(anchor, tuple(needles), regex)


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


def _found(groups: tuple[_Group, ...], data: bytes) -> bool:
    # `anchor in data` is a memchr: a group whose anchor byte is absent costs nothing
    return any(g.anchor in data and g.regex.search(data) is not None for g in groups)


def _found_needles(groups: tuple[_Group, ...], data: bytes) -> set[bytes]:
    found: set[bytes] = set()
    for g in groups:
        if g.anchor in data and g.regex.search(data) is not None:
            found.update(n for n in g.needles if n in data)
    return found


@dataclass(frozen=True)
class _Plan:
    """What the slow path has to do with one payload."""

    patterns: tuple[SecretPattern, ...]
    keys: bool


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
    _raw_grouped: frozenset[bytes] = field(init=False, repr=False, compare=False)
    _folded_grouped: frozenset[bytes] = field(init=False, repr=False, compare=False)

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
        set_(self, "_raw_grouped", frozenset(n for g in raw_groups for n in g.needles))
        set_(self, "_folded_grouped", frozenset(n for g in folded_groups for n in g.needles))
        always = tuple(p for p in self.patterns if not (p.triggers or p.prefixes))
        set_(self, "_always_scan", always)

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
        return self._walk(value, _Plan(self.patterns, True))[0]

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
        if plan is None:
            return canonical
        try:
            value = orjson.loads(canonical)
        except orjson.JSONDecodeError:  # integers beyond 64 bits: the stdlib parser keeps them
            value = json.loads(canonical)
        redacted, changed = self._walk(value, plan)
        return canonical_json(redacted) if changed else canonical

    def _plan(self, canonical: str) -> _Plan | None:
        """None when no rule can match; otherwise the rules whose needles were found."""
        raw = canonical.encode("utf-8")
        folded = fold(canonical)
        if not (
            self._always_scan
            or _found(self._raw_groups, raw)
            or _found(self._folded_groups, folded)
        ):
            return None
        # Something was found (rare): work out which rules it concerns.
        in_raw = _Finder(_found_needles(self._raw_groups, raw), self._raw_grouped, raw)
        in_folded = _Finder(
            _found_needles(self._folded_groups, folded), self._folded_grouped, folded
        )
        selected = []
        for pattern, raw_needles, folded_needles in zip(
            self.patterns, self._raw_needles, self._folded_needles, strict=True
        ):
            if pattern in self._always_scan or (
                (in_raw.any(raw_needles) or in_folded.any(folded_needles))
                and (pattern.confirm is None or pattern.confirm.search(raw) is not None)
            ):
                selected.append(pattern)
        keys = in_folded.any(self._key_needles)
        if not selected and not keys:
            return None
        return _Plan(tuple(selected), keys)

    def _walk(self, value: Any, plan: _Plan) -> tuple[Any, bool]:
        if isinstance(value, str):
            redacted = _redact_text(value, plan.patterns)
            return redacted, redacted != value
        if isinstance(value, dict):
            changed = False
            out: dict[Any, Any] = {}
            for k, v in value.items():
                if plan.keys and isinstance(k, str) and self.is_sensitive_key(k):
                    item: Any = KEY_MARKER
                    changed = changed or v != KEY_MARKER
                else:
                    item, c = self._walk(v, plan)
                    changed = changed or c
                if isinstance(k, str) and plan.patterns:
                    name = _redact_text(k, plan.patterns)
                    if name != k:  # a secret used as a key
                        changed = True
                        k = name
                    if k in out:  # taken by a redacted key: number it, never overwrite
                        k = _free_name(k, out)
                out[k] = item
            return out, changed
        if isinstance(value, (list, tuple)):
            items = [self._walk(v, plan) for v in value]
            return [v for v, _ in items], any(c for _, c in items)
        return value, False


@dataclass(frozen=True)
class _Finder:
    """Which needles a text holds, given the grouped needles found in it."""

    found: set[bytes]
    grouped: frozenset[bytes]
    data: bytes

    def any(self, needles: Iterable[bytes]) -> bool:
        for n in needles:
            if n in self.found:
                return True
            # a needle left out of the groups holds a shorter one: look for it only then
            if n not in self.grouped and any(k in n for k in self.found) and n in self.data:
                return True
        return False


def _free_name(name: str, taken: dict[Any, Any]) -> str:
    if name not in taken:
        return name
    n = 2
    while f"{name}#{n}" in taken:
        n += 1
    return f"{name}#{n}"


def _redact_text(text: str, patterns: tuple[SecretPattern, ...]) -> str:
    for pattern in patterns:
        text = pattern.regex.sub(functools.partial(_replace, pattern=pattern), text)
    return text


def _replace(match: re.Match[str], pattern: SecretPattern) -> str:
    if "secret" in pattern.regex.groupindex and match.group("secret") is not None:
        start, end = match.span("secret")
        whole_start = match.start()
        text = match.group()
        return text[: start - whole_start] + pattern.marker + text[end - whole_start :]
    return pattern.marker


#: The redactor used when none is configured.
DEFAULT_REDACTOR = Redactor()
