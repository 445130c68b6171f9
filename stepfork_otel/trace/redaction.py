"""Redaction of secrets at the boundary, before a value reaches a span, an exporter or a file.

Two rules, applied to the JSON form of every payload and to exception messages:

* **Sensitive keys.** A value under a key such as ``api_key``, ``Authorization``, ``password``,
  ``client_secret``, ``access_token`` or ``Cookie`` is replaced whole by ``"[REDACTED]"``, whatever
  it looks like (a string, a number, an object). Keys are compared after lower-casing and removing
  ``_``, ``-``, ``.`` and spaces, and match when they *end* with a sensitive word, so ``X-Api-Key``
  and ``openai_api_key`` match while ``max_tokens`` does not.
* **Secret-shaped values.** Inside any string, provider keys (OpenAI, Anthropic, Google, AWS,
  GitHub, Slack, Stripe), JWTs, bearer/basic credentials, PEM private keys and passwords in URLs
  and connection strings are replaced by ``[REDACTED:<pattern name>]``.

Markers are fixed strings -- never a hash of the secret, which could be brute-forced for a short
password -- so the same input always redacts to the same text and fingerprints stay stable.

Why the fast path looks the way it does: walking every value of every payload with a dozen regular
expressions costs about eight times a bare span at 2 KB. Instead the canonical JSON text (which
exists anyway, for the fingerprint) is scanned once for *triggers*: a handful of substring tests
and one character-class regex that finds long token-like runs. Only when a trigger fires is the
payload decoded and walked with the precise rules. A trigger is deliberately looser than the rule
it guards; a false trigger costs time, never correctness.
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
    """A secret-shaped value. Only the ``secret`` group (or the whole match) is replaced."""

    name: str
    """Short name, used in the marker ``[REDACTED:<name>]``."""
    regex: re.Pattern[str]
    """Compiled pattern; may define a named group ``secret`` to keep the surrounding text."""
    triggers: tuple[str, ...] = ()
    """Lower-case substrings, one of which every match contains (the fast pre-check)."""
    prefixes: tuple[str, ...] = ()
    """Case-sensitive prefixes of a token-like run that may start a match (the fast pre-check)."""

    @property
    def marker(self) -> str:
        return f"[REDACTED:{self.name}]"


def _p(
    name: str, pattern: str, *, triggers: tuple[str, ...] = (), prefixes: tuple[str, ...] = ()
) -> SecretPattern:
    return SecretPattern(name, re.compile(pattern), triggers, prefixes)


#: The built-in secret patterns, most specific first.
DEFAULT_PATTERNS: tuple[SecretPattern, ...] = (
    _p(
        "pem_private_key",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----|[\s\S]*)",
        triggers=("-----begin",),
    ),
    _p("anthropic_api_key", r"sk-ant-[A-Za-z0-9_\-]{20,}", prefixes=("sk-ant-",)),
    _p(
        "openai_api_key",
        r"(?<![A-Za-z0-9])sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}",
        prefixes=("sk-",),
    ),
    _p("google_api_key", r"AIza[0-9A-Za-z_\-]{35}", prefixes=("AIza",)),
    _p(
        "aws_access_key_id",
        r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}(?![A-Z0-9])",
        prefixes=("AKIA", "ASIA", "ABIA", "ACCA"),
    ),
    _p(
        "aws_secret_access_key",
        r"(?i:aws_?secret_?(?:access_?)?key)[\"']?\s*[=:]\s*[\"']?(?P<secret>[A-Za-z0-9/+=]{40})",
        triggers=("aws_secret", "awssecret"),
    ),
    _p(
        "github_token",
        r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})",
        prefixes=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    _p(
        "slack_token",
        r"(?:xox[abposre]-[A-Za-z0-9\-]{10,}|xapp-[A-Za-z0-9\-]{10,})",
        prefixes=("xox", "xapp-"),
    ),
    _p(
        "slack_webhook",
        r"https://hooks\.slack\.com/services/[A-Za-z0-9/_\-]+",
        triggers=("hooks.slack.com",),
    ),
    _p(
        "stripe_key",
        r"(?:(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|whsec_[A-Za-z0-9]{16,})",
        prefixes=("sk_live", "sk_test", "rk_live", "rk_test", "whsec_"),
    ),
    _p(
        "jwt",
        r"eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]*",
        prefixes=("eyJ",),
    ),
    _p(
        "bearer_token",
        r"(?i:\bbearer)\s+(?P<secret>[A-Za-z0-9\-._~+/]{8,}=*)",
        triggers=("bearer",),
    ),
    _p(
        "basic_auth",
        r"(?i:\bbasic)\s+(?P<secret>[A-Za-z0-9+/]{8,}={0,2})",
        triggers=("basic ",),
    ),
    _p(
        "url_password",
        r"(?i:\b[a-z][a-z0-9+.\-]*://)[^/\s:@\"]+:(?P<secret>[^/\s@\"]+)@",
        triggers=("://",),
    ),
    _p(
        "assigned_secret",
        r"(?i:\b(?:password|passwd|pwd|passphrase|secret|client_secret|api_?key|access_?token"
        r"|auth_?token|token))\s*[=:]\s*(?P<secret>[^\s;&,\"'<>]{4,})",
        triggers=("pass", "pwd", "secret", "key=", "key:", "token"),
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

_TOKEN_RUN = re.compile(r"[A-Za-z0-9_\-]{16,}")
_KEY_NORMALISE = re.compile(r"[\s_\-.]")


def _normalise_key(key: str) -> str:
    return _KEY_NORMALISE.sub("", key.lower())


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
    _key_triggers: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _text_triggers: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _prefixes: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _always_scan: tuple[SecretPattern, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        keys = tuple(_normalise_key(k) for k in self.sensitive_keys)
        object.__setattr__(self, "sensitive_keys", keys)
        # A key is written `"<key>":` in canonical JSON; its last three normalised characters end
        # the raw key unless a separator sits among them, which none of the defaults has.
        object.__setattr__(self, "_key_triggers", tuple(sorted({k[-3:] + '":' for k in keys})))
        triggers = {t for p in self.patterns for t in p.triggers}
        object.__setattr__(self, "_text_triggers", tuple(sorted(triggers)))
        object.__setattr__(
            self, "_prefixes", tuple(p for pat in self.patterns for p in pat.prefixes)
        )
        object.__setattr__(
            self, "_always_scan", tuple(p for p in self.patterns if not (p.triggers or p.prefixes))
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
        return Redactor(
            patterns=self.patterns + extra, sensitive_keys=self.sensitive_keys + tuple(keys)
        )

    # -- rules ---------------------------------------------------------------------------------

    def is_sensitive_key(self, key: str) -> bool:
        """Whether a value under ``key`` is always redacted."""
        return _normalise_key(key).endswith(self.sensitive_keys)

    def redact_text(self, text: str) -> str:
        """Replace every secret-shaped part of ``text`` (used for strings and exception messages)."""
        for pattern in self.patterns:
            text = pattern.regex.sub(functools.partial(_replace, pattern=pattern), text)
        return text

    def redact(self, value: Any) -> Any:
        """A redacted copy of a JSON-shaped value (dicts, lists, strings, numbers)."""
        return self._walk(value)[0]

    def redact_message(self, message: str) -> str:
        """An exception message made safe to record: redacted and bounded in length."""
        text = self.redact_text(message)
        if len(text) > MAX_MESSAGE_CHARS:
            text = text[:MAX_MESSAGE_CHARS] + "…[truncated]"
        return text

    # -- the fast path used by the boundaries ---------------------------------------------------

    def may_contain_secret(self, canonical: str) -> bool:
        """Cheap pre-check on canonical JSON text: False means :meth:`redact` would change nothing."""
        if self._always_scan:
            return True
        low = canonical.lower()
        for trigger in self._key_triggers:
            if trigger in low:
                return True
        for trigger in self._text_triggers:
            if trigger in low:
                return True
        prefixes = self._prefixes
        return any(run.group().startswith(prefixes) for run in _TOKEN_RUN.finditer(canonical))

    def redact_canonical(self, canonical: str) -> str:
        """Redact a canonical JSON text; returns the same text when nothing needed redaction."""
        if not self.may_contain_secret(canonical):
            return canonical
        try:
            value = orjson.loads(canonical)
        except orjson.JSONDecodeError:  # integers beyond 64 bits: the stdlib parser keeps them
            value = json.loads(canonical)
        redacted, changed = self._walk(value)
        return canonical_json(redacted) if changed else canonical

    def _walk(self, value: Any) -> tuple[Any, bool]:
        if isinstance(value, str):
            redacted = self.redact_text(value)
            return redacted, redacted != value
        if isinstance(value, dict):
            changed = False
            out: dict[Any, Any] = {}
            for k, v in value.items():
                if isinstance(k, str) and self.is_sensitive_key(k):
                    out[k] = KEY_MARKER
                    changed = changed or v != KEY_MARKER
                else:
                    out[k], c = self._walk(v)
                    changed = changed or c
            return out, changed
        if isinstance(value, (list, tuple)):
            items = [self._walk(v) for v in value]
            return [v for v, _ in items], any(c for _, c in items)
        return value, False


def _replace(match: re.Match[str], pattern: SecretPattern) -> str:
    if "secret" in pattern.regex.groupindex and match.group("secret") is not None:
        start, end = match.span("secret")
        whole_start = match.start()
        text = match.group()
        return text[: start - whole_start] + pattern.marker + text[end - whole_start :]
    return pattern.marker


#: The redactor used when none is configured.
DEFAULT_REDACTOR = Redactor()
