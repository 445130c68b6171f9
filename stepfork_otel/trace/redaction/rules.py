"""The redaction rules, as data: what is a secret, and what replaces it. No engine code here.

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
  "whitespace" means ASCII whitespace: the engine's cheap pre-check (see
  :mod:`stepfork_otel.trace.redaction.engine`) must be able to prove a match impossible, and
  Unicode case folding (``ſ`` matches ``s``) would defeat that.

Every pattern also declares what that pre-check looks for (see :class:`SecretPattern`):
``triggers`` and ``prefixes``, one of which every match of the pattern contains, and optionally a
``confirm`` regex. A pattern without triggers or prefixes is correct, only slower (it is checked
on every payload).

Markers are fixed strings -- never a hash of the secret, which could be brute-forced for a short
password -- so the same input always redacts to the same text and fingerprints stay stable.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

#: Replacement for a value found under a sensitive key.
KEY_MARKER = "[REDACTED]"


def holds_marker(text: str) -> bool:
    """Whether ``text`` holds a redaction marker (``[REDACTED]`` or ``[REDACTED:<kind>]``)."""
    return "[REDACTED" in text


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


def _assigned(*words: str) -> tuple[str, ...]:
    """Folded needles for ``<word>`` followed by what an assignment puts after a key (``=``,
    ``:`` or a quote; needles are matched in their escaped form, so ``"`` also finds ``\\"``):
    tighter than the bare word, which fires on ``max_tokens`` or ``cookie_policy``."""
    return tuple(word + after for word in words for after in ("=", ":", "'", '"'))


def _assignment(name: str, words: str, *, triggers: tuple[str, ...]) -> SecretPattern:
    """``<key> = value`` / ``"<key>": "value"`` / ``'<key>': 'value'`` inside text (connection
    strings, env dumps, JSON held in a string -- even twice, ``\\"`` --, the repr of a dict in an
    exception message): the sensitive-key rule, for text. A quoted value is replaced whole (up
    to its closing quote, spaces included); a bare one up to a separator."""
    return _p(
        name,
        rf"(?<![A-Za-z0-9])(?i:{words})"
        r"(?:\\*[\"'])?\s*[=:]\s*(?:\\*[\"'])?"
        r"(?P<secret>(?<=[\"'])[^\"'\\\n]{1,256}(?=\\*[\"'])"
        # a bare value; an auth scheme word is left to the bearer/basic patterns
        r"|(?!(?i:bearer|basic)\s)[^\s;&,\"'<>\\]{4,})",
        triggers=triggers,
    )


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
    _assignment(
        "assigned_secret",
        r"password|passwd|pwd|passphrase|secret(?:[_\-]?key)?|api[_\-]?key|token|cookie"
        r"|authorization|access[_\-]?key|private[_\-]?key|credentials?",
        triggers=(
            "passw",
            "pwd",
            "passphrase",
            "secret",
            "apikey",
            *_assigned("token", "cookie", "authorization", "accesskey", "privatekey"),
            *_assigned("credential", "credentials"),
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


#: What a string becomes when its redaction does not settle (the engine gives up after a fixed
#: number of passes of the patterns over it, and fails closed).
UNSTABLE_MARKER = "[REDACTED:unstable]"
