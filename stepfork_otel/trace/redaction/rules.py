"""The redaction rules, as data: what is a secret, and what replaces it. No engine code here.

Three kinds of rule, applied to the JSON form of every payload, to exception messages and (with
``configure(redact_all_spans=True)``) to the attributes of every exported span:

* **Sensitive keys.** A value under a key such as ``api_key``, ``Authorization``, ``password``,
  ``clientSecret``, ``refreshToken`` or ``Cookie`` is replaced whole by ``"[REDACTED]"``, whatever
  it looks like (a string, a number, an object). Keys are compared after lower-casing and removing
  ``_``, ``-``, ``.`` and whitespace, and match when they *end* with a sensitive word
  (:data:`DEFAULT_SENSITIVE_KEYS`: ``X-Api-Key``, ``openai_api_key``, ``PGPASSWORD`` and
  ``csrftoken`` match, ``max_tokens`` and ``key_count`` do not), or when their last word is one of
  :data:`SEGMENT_KEYS` (``DB_PASS``, ``dbPass``, ``http_auth``; not ``bypass`` or ``oauth``).
* **Generic keys with random values.** A string under a key that merely *contains* a generic
  word (:data:`GENERIC_KEY_WORDS`: ``key``, ``auth``, ``access``, ``api``, ``cred``, ...) is
  replaced by ``[REDACTED:generic_secret]`` when it looks random: one token of 12 to 1000
  characters with digits or mixed case and a Shannon entropy of at least 3.5 bits per character
  (gitleaks' threshold for its generic rule), and not a UUID.
* **Secret-shaped values** (:data:`DEFAULT_PATTERNS`): inside any string (and any dict key),
  provider tokens written from the providers' documented formats, JWTs, PEM private keys, every
  ``Authorization`` header whatever its scheme, every ``Cookie``/``Set-Cookie`` header,
  ``<key> = value`` assignments whose key ends with a sensitive word (camelCase, snake, glued,
  quoted, in JSON held in a string, in a header tuple ``("X-Api-Key", "...")``), and credentials
  in URLs whatever precedes the scheme. Only the ``secret`` group(s) of a match are replaced, by
  ``[REDACTED:<rule name>]``.

Every pattern is an RE2 regular expression (the engine runs them with RE2: linear time in the
text, for any input). What a pattern may use so that the engine's one-scan pre-check stays exact
(see :mod:`stepfork_otel.trace.redaction.engine`): no ``^``/``$`` except in the boundary
alternatives ``(?:^|[^...])`` / ``(?:[^...]|$)`` where a JSON quote ``"`` is one of the allowed
characters. ``tests/test_redaction_rules.py`` checks that of every built-in pattern.

Markers are fixed strings -- never a hash of the secret, which could be brute-forced for a short
password -- so the same input always redacts to the same text and fingerprints stay stable.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: Replacement for a value found under a sensitive key.
KEY_MARKER = "[REDACTED]"


def holds_marker(text: str) -> bool:
    """Whether ``text`` holds a redaction marker (``[REDACTED]`` or ``[REDACTED:<kind>]``)."""
    return "[REDACTED" in text


#: Longest exception message kept (after redaction), in characters.
MAX_MESSAGE_CHARS = 2000

#: Families of rules, in the order ``docs/guarantees.md`` lists them.
FAMILIES: dict[str, str] = {
    "ai": "LLM and AI providers",
    "cloud": "Cloud and infrastructure",
    "vcs": "Version control hosts",
    "ci_cd": "CI/CD, secrets managers and observability",
    "registry": "Package registries",
    "payment": "Payment and commerce",
    "messaging": "Messaging, e-mail and chat",
    "database": "Databases and connection strings",
    "generic": "Generic (headers, keys, URLs, tokens)",
    "user": "User rules",
}


@dataclass(frozen=True)
class SecretPattern:
    """A secret-shaped value: an RE2 regular expression. Only its ``secret`` group(s) (a named
    group ``secret`` or ``secret<suffix>``; the whole match when it has none) are replaced.

    ``regex`` is the pattern source (``str``) or a compiled Python pattern, whose source and
    ``IGNORECASE``/``MULTILINE``/``DOTALL`` flags are carried over; either way it is compiled by
    RE2, so a pattern RE2 does not accept (look-arounds, back-references) is refused with a
    ``ValueError``. ``triggers``/``prefixes``/``confirm`` were hints for the former pre-check;
    they are accepted and unused (the RE2 pre-check needs no hints).
    """

    name: str
    """Short name, used in the marker ``[REDACTED:<name>]``."""
    regex: Any
    """The pattern: RE2 source text, or a compiled Python pattern (its source is used)."""
    triggers: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    confirm: Any = None
    family: str = "user"
    """One of :data:`FAMILIES` (what ``stepfork redaction-rules`` lists it under)."""
    description: str = ""
    min_entropy: float = 0.0
    """A match whose secret has less Shannon entropy (bits per character) is left alone."""
    allow: tuple[str, ...] = ()
    """RE2 patterns: a secret that one of them matches in full is left alone (a known false
    positive)."""
    source: str = field(init=False, repr=False, compare=False)
    """The RE2 source text of ``regex``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", re2_source(self.regex))

    @property
    def marker(self) -> str:
        return f"[REDACTED:{self.name}]"


_PY_FLAGS = ((re.IGNORECASE, "i"), (re.MULTILINE, "m"), (re.DOTALL, "s"))
# Python-only letters in inline flag groups: (?a...), (?u...), (?L...) (RE2 is ASCII for \w \d \s)
_INLINE_FLAGS = re.compile(r"\(\?([aiLmsux]+)([:)])")


def re2_source(regex: Any) -> str:
    """The RE2 source of ``regex`` (a ``str``, or a compiled Python pattern)."""
    if isinstance(regex, re.Pattern):
        if isinstance(regex.pattern, bytes):
            raise ValueError("a redaction pattern must be a text (str) pattern, not bytes")
        if regex.flags & re.VERBOSE:
            raise ValueError("re.VERBOSE patterns are not supported: give the pattern on one line")
        source = regex.pattern
        letters = "".join(letter for flag, letter in _PY_FLAGS if regex.flags & flag)
        if letters:
            source = f"(?{letters}){source}"
    elif isinstance(regex, str):
        source = regex
    else:
        raise TypeError(f"a redaction pattern is a str or re.Pattern, not {type(regex).__name__}")

    def flags(match: re.Match[str]) -> str:
        kept = "".join(c for c in match.group(1) if c in "ims")
        if not kept:
            return "(?:" if match.group(2) == ":" else ""
        return f"(?{kept}{match.group(2)}"

    return _INLINE_FLAGS.sub(flags, source)


# --- building blocks ---------------------------------------------------------------------------

#: Before a token: the start, or a character that cannot be part of it (a quote qualifies).
_B = r"(?:^|[^0-9A-Za-z])"
#: After a token: a character that cannot continue it, or the end.
_E = r"(?:[^0-9A-Za-z]|$)"


def _p(
    name: str,
    family: str,
    description: str,
    pattern: str,
    *,
    min_entropy: float = 0.0,
    allow: tuple[str, ...] = (),
) -> SecretPattern:
    return SecretPattern(
        name,
        pattern,
        family=family,
        description=description,
        min_entropy=min_entropy,
        allow=allow,
    )


def _token(
    name: str, family: str, description: str, token: str, *, end: bool = False
) -> SecretPattern:
    """A provider token with a distinctive shape: ``token`` after a token boundary (and before
    one too with ``end``: for short prefixes followed by hex, which occur inside longer runs)."""
    return _p(name, family, description, rf"{_B}(?P<secret>{token})" + (_E if end else ""))


def _word(word: str) -> str:
    """``word`` in a key of any case, with ``_ - .`` or a space allowed where ``|`` stands."""
    return r"[_.\- ]?".join(word.split("|"))


#: Key words whose value is always redacted (normalised key *ends with* the word).
DEFAULT_SENSITIVE_KEYS: tuple[str, ...] = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "apikey",
    "accesskey",
    "privatekey",
    "secretkey",
    "signingkey",
    "accountkey",
    "encryptionkey",
    "masterkey",
    "sessionkey",
    "sessionid",
    "credential",
    "credentials",
    "creds",
    "authorization",
    "cookie",
    "cookies",
    "connectionstring",
)

#: Short key words that are sensitive only as the last word of a key (after ``_ - .``, a space,
#: or a camelCase step): ``DB_PASS``, ``dbPass``, ``user-pw``, ``MYSQL_PWD``, ``basic_auth``.
SEGMENT_KEYS: tuple[str, ...] = ("pass", "pw", "pwd", "auth")

#: Words that make a key *generic*: a random-looking string under it is redacted.
GENERIC_KEY_WORDS: tuple[str, ...] = (
    "key",
    "auth",
    "access",
    "api",
    "cred",
    "passw",
    "private",
    "signature",
)

# Key words as they are written in text (separators between the parts), for the patterns.
_TEXT_KEY_WORDS = (
    "pass|word",
    "passwd",
    "pass|phrase",
    "secret",
    "secret|key",
    "token",
    "api|key",
    "access|key",
    "private|key",
    "signing|key",
    "account|key",
    "encryption|key",
    "master|key",
    "session|key",
    "session|id",
    "credentials?",
    "creds",
    "connection|string",
)

# <key> then what separates it from its value: a quote (JSON, a dict's repr), `=`, `:`, `:=`, `=>`
_SEP = r"\\*[\"'`]?[ \t]*(?:=>|:=|[=:])[ \t]*"
_Q = r"\\*[\"'`]"


def _keyed(words: str, *, camel: str = "", segment: bool = False) -> str:
    """``<key><separator>``: the key ends with one of ``words`` (``segment``: as its last word,
    or after a lower-case letter or digit in its ``camel`` spellings); or a header tuple
    ``("X-Api-Key", "v")``: the key quoted whole, then a comma and the value's opening quote."""
    if segment:
        bare = rf"(?:(?:^|[^A-Za-z0-9])(?i:{words})|[a-z0-9](?:{camel}))"
        quoted = rf"{_Q}(?:[A-Za-z0-9.-]*[_.-])?(?i:{words})|{_Q}[A-Za-z0-9_.-]*[a-z0-9](?:{camel})"
    else:
        bare = rf"(?i:{words})"
        quoted = rf"{_Q}[A-Za-z0-9_.-]*(?i:{words})"
    return rf"(?:{bare}{_SEP}|(?:{quoted}){_Q}[ \t]*,[ \t]*)"


# A quoted value is taken whole, up to its closing quote (spaces included), a bare one up to a
# separator. Whole, so that a value a sensitive key redacted (``[REDACTED]``) and then written into
# text redacts as the secret did (replay feeds recorded, redacted outputs back to the agent).
_VALUE = (
    r"(?:\\*[\"'`](?P<secret>[^\"'`\\\r\n]+)"
    r"|(?P<secret_bare>\[REDACTED\]|[^\s\"'`\\;&,<>(){}\[\]]{3,}))"
)
# Percent-encoded (a query string, a form body, a URL logged whole): the separator `=` / `:` as
# %3D / %3A (a quote as %22 / %27 before it), encoded spaces after it; the value runs to the next
# parameter, and a header's scheme word (Bearer%20...) is kept as in a header line.
_PCT_SEP = r"(?:%2[27])?%3[AaDd](?:%20|\+)*"
_PCT_SCHEME = r"(?:[A-Za-z][A-Za-z0-9_-]{1,30}(?:%20|\+)+)?"
_PCT_VALUE = r"(?P<secret>[^\s&\"'`\\#;,<>]{3,})"
# A header's value: quoted, whole; in a header line, all of it but the scheme word.
_HEADER_VALUE = (
    r"(?:\\*[\"'`](?P<secret>[^\"'`\\\r\n]+)"
    r"|(?:[A-Za-z][A-Za-z0-9_-]{1,30}[ \t]+)?(?P<secret_bare>[^\s\"'`\\][^\"'`\\\r\n]*))"
)


def _assignment(name: str, family: str, description: str, words: str) -> SecretPattern:
    return _p(name, family, description, _keyed(words) + _VALUE, allow=PLACEHOLDER_VALUES)


_SEGMENT_WORDS = "|".join(SEGMENT_KEYS)
_SEGMENT_CAMEL = "|".join(f"{w.capitalize()}|{w.upper()}" for w in SEGMENT_KEYS)

#: Values that an assignment rule leaves alone: placeholders, not secrets.
PLACEHOLDER_VALUES = (
    r"(?i:null|none|nil|true|false|undefined|empty|hidden|secret|password|changeme)",
    r"\*+|x{3,}|X{3,}|\.{3,}|-+|_+|<[^>]*>?|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|\{\{[^}]*\}?\}?",
    r"%[sd]|%\([a-z_]+\)s|\$[0-9]+",
    # a placeholder percent-encoded (%3Cyour token%3E), a value read from the environment in code
    r"%3[Cc][A-Za-z0-9_.-]*(?:%3[Ee])?",
    r"os\.environ(?:\.get)?|os\.getenv|process\.env(?:\.[A-Za-z_][A-Za-z0-9_]*)?|ENV\.fetch",
)


#: The built-in secret patterns. All are applied to the original text; overlapping matches are
#: merged, and the merged part is marked with the name of the first of them in this order.
DEFAULT_PATTERNS: tuple[SecretPattern, ...] = (
    # --- generic: keys, headers, URLs, tokens with a universal shape --------------------------
    _p(
        "pem_private_key",
        "generic",
        "PEM private keys (RSA, EC, DSA, OpenSSH, PKCS#8, PGP blocks), to the END line or the end",
        r"-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[\s\S]*?-----END[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----|[\s\S]*)",
    ),
    _p(
        "cookie",
        "generic",
        "Cookie / Set-Cookie headers: every cookie in them",
        _keyed(r"(?:set[_-])?cookies?") + _HEADER_VALUE,
        allow=PLACEHOLDER_VALUES,
    ),
    _p(
        "jwt",
        "generic",
        "JSON Web Tokens (and JWE: five parts)",
        r"(?P<secret>eyJ[0-9A-Za-z_-]{5,}\.eyJ[0-9A-Za-z_-]{5,}\.[0-9A-Za-z_-]*(?:\.[0-9A-Za-z_-]+){0,2})",
    ),
    _p(
        "bearer_token",
        "generic",
        "Bearer credentials anywhere in text (not a plain word: 'bearer bonds')",
        r"(?:^|[^0-9A-Za-z]|%20)(?i:bearer)(?:[ \t]+|(?:%20)+)"
        r"(?P<secret>[A-Za-z0-9._~+/-]{8,}(?:=|%3[Dd])*)",
        allow=(r"[A-Z]?[a-z]+",),
    ),
    _p(
        "basic_auth",
        "generic",
        "Basic credentials anywhere in text (not a plain word: 'basic information')",
        rf"{_B}(?i:basic)[ \t]+(?P<secret>[A-Za-z0-9+/]{{8,}}={{0,2}})",
        allow=(r"[A-Z]?[a-z]+(?:\+[a-z]+)?",),
    ),
    _p(
        "authorization",
        "generic",
        "Authorization / Proxy-Authorization headers, any scheme (in a header line the scheme word is kept)",
        _keyed(r"(?:proxy[_-])?authori[sz]ation") + _HEADER_VALUE,
        allow=PLACEHOLDER_VALUES,
    ),
    _p(
        "url_password",
        "generic",
        "user:password@ in URLs and DSNs of any scheme, whatever precedes the scheme",
        r"[A-Za-z][A-Za-z0-9+.-]{0,30}://[^\s/?#@:\"'`\\]*:"
        r"(?P<secret>[^\s/?#\"'`\\]{1,})@[^\s/?#@\"'`\\]{1,}",
    ),
    _p(
        "url_signature",
        "generic",
        "Signatures and session tokens in presigned URLs (AWS, GCS, Azure SAS)",
        r"(?i:[?&](?:x-amz-signature|x-amz-security-token|x-goog-signature|x-goog-credential|"
        r"sig|signature))=(?P<secret>[^&\s\"'`#\\]{16,})",
    ),
    _p(
        "percent_encoded_secret",
        "generic",
        "Authorization, Cookie and <key>=value percent-encoded (Authorization%3A%20Bearer%20..., "
        "password%3D... in a query string)",
        rf"(?:(?i:(?:proxy[_-])?authori[sz]ation|(?:set[_-])?cookies?){_PCT_SEP}{_PCT_SCHEME}"
        rf"|(?i:{'|'.join(_word(w) for w in _TEXT_KEY_WORDS)}|(?:^|[^A-Za-z0-9])"
        rf"(?:{_SEGMENT_WORDS})){_PCT_SEP}){_PCT_VALUE}",
        allow=PLACEHOLDER_VALUES,
    ),
    _assignment(
        "assigned_secret",
        "generic",
        '<key> = value / "<key>": "value" in text, the key ending with a sensitive word',
        "|".join(_word(w) for w in _TEXT_KEY_WORDS),
    ),
    _p(
        "assigned_secret_short",
        "generic",
        "<key> = value in text, the key's last word pass, pw, pwd or auth (DB_PASS=, dbPass:)",
        _keyed(_SEGMENT_WORDS, camel=_SEGMENT_CAMEL, segment=True) + _VALUE,
        allow=PLACEHOLDER_VALUES,
    ),
    _p(
        "generic_secret",
        "generic",
        "a random-looking value (entropy >= 3.5) under a key holding key, auth, access, api, ...",
        r"(?i:key|auth|access|api|cred|passw|private|signature)[A-Za-z0-9_. -]{0,20}"
        + _SEP
        + r"\\*[\"'`]?(?P<secret>[A-Za-z0-9_.=+/~-]{12,})",
        min_entropy=3.5,
    ),
    # --- LLM and AI providers ------------------------------------------------------------------
    _token(
        "anthropic_api_key",
        "ai",
        "Anthropic API and admin keys (sk-ant-api03-, sk-ant-admin01-, ...)",
        r"sk-ant-[A-Za-z0-9_-]{20,}",
    ),
    _token(
        "openai_api_key",
        "ai",
        "OpenAI keys (sk-, sk-proj-, sk-svcacct-, sk-admin-); also OpenRouter and DeepSeek sk- keys",
        r"sk-[A-Za-z0-9_-]{20,}",
    ),
    _token(
        "google_api_key", "ai", "Google / Gemini / GCP API keys (AIza...)", r"AIza[0-9A-Za-z_-]{35}"
    ),
    _token(
        "google_oauth",
        "ai",
        "Google OAuth client secrets (GOCSPX-) and access tokens (ya29.)",
        r"GOCSPX-[A-Za-z0-9_-]{20,64}|ya29\.[0-9A-Za-z_-]{20,}",
    ),
    _token(
        "huggingface_token",
        "ai",
        "Hugging Face user and organisation tokens (hf_, api_org_)",
        r"(?:hf_|api_org_)[A-Za-z0-9]{30,40}",
    ),
    _token("perplexity_api_key", "ai", "Perplexity API keys (pplx-)", r"pplx-[A-Za-z0-9]{40,64}"),
    _token("groq_api_key", "ai", "Groq API keys (gsk_)", r"gsk_[A-Za-z0-9]{40,64}"),
    _token("xai_api_key", "ai", "xAI API keys (xai-)", r"xai-[A-Za-z0-9]{60,100}"),
    _token("replicate_api_token", "ai", "Replicate API tokens (r8_)", r"r8_[A-Za-z0-9]{30,45}"),
    _token(
        "langsmith_api_key",
        "ai",
        "LangSmith / LangChain API keys (lsv2_pt_, lsv2_sk_)",
        r"lsv2_(?:pt|sk)_[0-9a-f]{32}_[0-9a-f]{10}",
    ),
    _token(
        "tavily_api_key", "ai", "Tavily API keys (tvly-)", r"tvly-(?:dev-|prod-)?[A-Za-z0-9]{30,40}"
    ),
    _token("pinecone_api_key", "ai", "Pinecone API keys (pcsk_)", r"pcsk_[A-Za-z0-9_]{40,100}"),
    _token(
        "bedrock_api_key",
        "ai",
        "Amazon Bedrock API keys (ABSK, bedrock-api-key-)",
        r"ABSK[A-Za-z0-9+/]{100,}={0,2}|bedrock-api-key-[A-Za-z0-9+/=]{20,}",
    ),
    # --- cloud and infrastructure --------------------------------------------------------------
    _p(
        "aws_access_key_id",
        "cloud",
        "AWS access key ids (AKIA, ASIA, ABIA, ACCA, A3T)",
        r"(?:^|[^0-9A-Z])(?P<secret>(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16})(?:[^0-9A-Z]|$)",
    ),
    _p(
        "aws_secret_access_key",
        "cloud",
        "AWS secret access keys assigned to a key naming them",
        r"(?i:aws[_.-]?secret[_.-]?(?:access[_.-]?)?key)"
        + _SEP
        + r"\\*[\"'`]?(?P<secret>[A-Za-z0-9/+=]{40})",
    ),
    _p(
        "azure_storage_key",
        "cloud",
        "Azure storage account keys and shared access keys in connection strings",
        r"(?i:AccountKey|SharedAccessKey)[ \t]*=[ \t]*(?P<secret>[A-Za-z0-9+/=]{20,})",
    ),
    _p(
        "azure_client_secret",
        "cloud",
        "Azure AD / Entra client secrets (xxx8Q~...)",
        r"(?:^|[^0-9A-Za-z_~.])(?P<secret>[A-Za-z0-9_~.]{3}[0-9]Q~[A-Za-z0-9_~.-]{31,34})",
    ),
    _token(
        "alibaba_access_key_id",
        "cloud",
        "Alibaba Cloud AccessKey ids (LTAI)",
        r"LTAI[A-Za-z0-9]{20}",
    ),
    _token(
        "digitalocean_token",
        "cloud",
        "DigitalOcean personal, OAuth and refresh tokens (dop_v1_, doo_v1_, dor_v1_)",
        r"do[opr]_v1_[a-f0-9]{64}",
    ),
    _token("heroku_api_key", "cloud", "Heroku API keys (HRKU-)", r"HRKU-[0-9A-Za-z_-]{60}"),
    _token(
        "flyio_token",
        "cloud",
        "Fly.io tokens (fo1_, fm1a_, fm1r_, fm2_)",
        r"fo1_[A-Za-z0-9_-]{43}|fm(?:1[ar]|2)_[A-Za-z0-9+/]{100,}={0,3}",
    ),
    _token(
        "cloudflare_origin_ca_key",
        "cloud",
        "Cloudflare Origin CA keys (v1.0-)",
        r"v1\.0-[a-f0-9]{24}-[a-f0-9]{146}",
    ),
    _token(
        "terraform_token",
        "cloud",
        "HashiCorp Terraform Cloud tokens (.atlasv1.)",
        r"[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=-]{60,70}",
    ),
    _token(
        "vault_token",
        "cloud",
        "HashiCorp Vault service and batch tokens (hvs., hvb.)",
        r"hv[sb]\.[A-Za-z0-9_-]{90,}",
    ),
    _token("pulumi_token", "cloud", "Pulumi access tokens (pul-)", r"pul-[a-f0-9]{40}"),
    _token(
        "supabase_token",
        "cloud",
        "Supabase access tokens and secret keys (sbp_, sb_secret_)",
        r"sbp_[a-f0-9]{40}|sb_secret_[A-Za-z0-9_-]{20,64}",
    ),
    _token(
        "netlify_token", "cloud", "Netlify personal access tokens (nfp_)", r"nfp_[A-Za-z0-9]{36,40}"
    ),
    _token(
        "openshift_token", "cloud", "OpenShift user tokens (sha256~)", r"sha256~[A-Za-z0-9_-]{43}"
    ),
    _token(
        "dynatrace_token",
        "cloud",
        "Dynatrace API tokens (dt0c01.)",
        r"dt0c01\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{64}",
    ),
    # --- version control hosts -----------------------------------------------------------------
    _token(
        "github_token",
        "vcs",
        "GitHub tokens (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_)",
        r"gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}",
    ),
    _token(
        "gitlab_token",
        "vcs",
        "GitLab tokens (glpat-, gldt-, glrt-, glptt-, glsoat-, glft-, glimt-, glagent-, gloas-, glcbt-, GR1348941)",
        r"(?:glpat|gldt|glrt|glptt|glsoat|glffct|glft|glimt|glagent|gloas)-[0-9A-Za-z_.-]{20,}"
        r"|glcbt-[0-9A-Za-z]{1,5}_[0-9A-Za-z_-]{20,64}|GR1348941[0-9A-Za-z_-]{20,64}",
    ),
    _token(
        "atlassian_token",
        "vcs",
        "Atlassian API tokens (ATATT3) and Bitbucket app passwords (ATBB)",
        r"ATATT3[A-Za-z0-9_=-]{100,}|ATBB[A-Za-z0-9_=.-]{28,64}",
    ),
    _token(
        "sourcegraph_token",
        "vcs",
        "Sourcegraph access tokens (sgp_)",
        r"sgp_(?:[a-fA-F0-9]{16}_|local_)?[a-fA-F0-9]{40}",
    ),
    # --- CI/CD, secrets managers and observability ---------------------------------------------
    _token(
        "doppler_token",
        "ci_cd",
        "Doppler tokens (dp.pt., dp.st., dp.sa., dp.ct., dp.scim., dp.audit.)",
        r"dp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9._-]{40,64}",
    ),
    _token("buildkite_token", "ci_cd", "Buildkite API tokens (bkua_)", r"bkua_[a-f0-9]{40}"),
    _token(
        "harness_token",
        "ci_cd",
        "Harness personal and service account tokens (pat., sat.)",
        r"(?:pat|sat)\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{20}",
    ),
    _token(
        "octopus_deploy_key",
        "ci_cd",
        "Octopus Deploy API keys (API-)",
        r"API-[A-Z0-9]{26}",
        end=True,
    ),
    _token("prefect_token", "ci_cd", "Prefect API keys (pnu_)", r"pnu_[A-Za-z0-9]{36}"),
    _token(
        "postman_api_key", "ci_cd", "Postman API keys (PMAK-)", r"PMAK-[a-f0-9]{24}-[a-f0-9]{34}"
    ),
    _token(
        "grafana_token",
        "ci_cd",
        "Grafana Cloud and service account tokens (glc_, glsa_, eyJrIjoi)",
        r"glc_[A-Za-z0-9+/]{32,}={0,3}|glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}"
        r"|eyJrIjoi[A-Za-z0-9]{70,}={0,3}",
    ),
    _token(
        "sentry_token",
        "ci_cd",
        "Sentry organisation and user tokens (sntrys_, sntryu_)",
        r"sntrys_eyJ[A-Za-z0-9+/=_]{50,}|sntryu_[a-f0-9]{64}",
    ),
    _token(
        "newrelic_key",
        "ci_cd",
        "New Relic user, browser and insert keys (NRAK-, NRJS-, NRII-)",
        r"NRAK-[A-Z0-9]{27}|NRJS-[a-f0-9]{19}|NRII-[A-Za-z0-9_-]{32}",
    ),
    _token(
        "onepassword_secret",
        "ci_cd",
        "1Password service account tokens (ops_eyJ) and secret keys (A3-)",
        r"ops_eyJ[A-Za-z0-9+/]{250,}={0,3}"
        r"|A3-[A-Z0-9]{6}-(?:[A-Z0-9]{11}|[A-Z0-9]{6}-[A-Z0-9]{5})-[A-Z0-9]{5}-[A-Z0-9]{5}-[A-Z0-9]{5}",
    ),
    _token(
        "age_secret_key",
        "ci_cd",
        "age encryption secret keys (AGE-SECRET-KEY-1)",
        r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}",
    ),
    _token(
        "jfrog_token",
        "ci_cd",
        "JFrog Artifactory API keys (AKCp) and reference tokens (cmVmd)",
        r"AKCp[A-Za-z0-9]{69}|cmVmd[A-Za-z0-9]{59}",
    ),
    # --- package registries --------------------------------------------------------------------
    _token("npm_token", "registry", "npm access tokens (npm_)", r"npm_[A-Za-z0-9]{36}"),
    _token(
        "pypi_token",
        "registry",
        "PyPI and TestPyPI upload tokens (pypi-AgE...)",
        r"pypi-AgE[A-Za-z0-9_-]{50,}",
    ),
    _token("rubygems_token", "registry", "RubyGems API keys (rubygems_)", r"rubygems_[a-f0-9]{48}"),
    _token(
        "clojars_token", "registry", "Clojars deploy tokens (CLOJARS_)", r"CLOJARS_[A-Za-z0-9]{60}"
    ),
    _token(
        "dockerhub_token",
        "registry",
        "Docker Hub personal and organisation access tokens (dckr_pat_, dckr_oat_)",
        r"dckr_(?:pat|oat)_[A-Za-z0-9_-]{27,64}",
    ),
    _token("nuget_api_key", "registry", "NuGet API keys (oy2)", r"oy2[a-z0-9]{43}", end=True),
    # --- payment and commerce ------------------------------------------------------------------
    _token(
        "stripe_key",
        "payment",
        "Stripe secret and restricted keys, webhook secrets (sk_live_, rk_test_, whsec_, ...)",
        r"(?:sk|rk)_(?:live|test|prod)_[A-Za-z0-9]{10,}|whsec_[A-Za-z0-9]{16,}",
    ),
    _token(
        "square_token",
        "payment",
        "Square access tokens and OAuth secrets (EAAA, sq0atp-, sq0csp-)",
        r"EAAA[A-Za-z0-9_-]{22,60}|sq0atp-[A-Za-z0-9_-]{22,60}|sq0csp-[A-Za-z0-9_-]{43}",
    ),
    _token(
        "shopify_token",
        "payment",
        "Shopify access tokens and shared secrets (shpat_, shpca_, shppa_, shpss_)",
        r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}",
    ),
    _token(
        "braintree_token",
        "payment",
        "Braintree / PayPal access tokens (access_token$production$)",
        r"access_token\$(?:production|sandbox)\$[0-9a-z]{16}\$[0-9a-f]{32}",
    ),
    _token(
        "flutterwave_key",
        "payment",
        "Flutterwave secret and encryption keys (FLWSECK)",
        r"FLWSECK(?:_TEST)?-[A-Za-z0-9]{12,32}(?:-X)?",
    ),
    _token(
        "shippo_token",
        "payment",
        "Shippo API tokens (shippo_live_, shippo_test_)",
        r"shippo_(?:live|test)_[a-fA-F0-9]{40}",
    ),
    _token(
        "duffel_token",
        "payment",
        "Duffel API tokens (duffel_live_, duffel_test_)",
        r"duffel_(?:test|live)_[A-Za-z0-9_=-]{43}",
    ),
    _token("easypost_key", "payment", "EasyPost API keys (EZAK, EZTK)", r"EZ[AT]K[A-Za-z0-9]{54}"),
    # --- messaging, e-mail and chat ------------------------------------------------------------
    _token(
        "slack_token",
        "messaging",
        "Slack bot, user, app, config and legacy tokens (xoxb-, xoxp-, xapp-, xoxe-, ...)",
        r"xox[abposre]-[A-Za-z0-9-]{10,}|xoxe\.xox[bp]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}",
    ),
    _p(
        "slack_webhook",
        "messaging",
        "Slack incoming webhook and workflow URLs",
        r"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<secret>[A-Za-z0-9+/_-]{20,})",
    ),
    _p(
        "discord_webhook",
        "messaging",
        "Discord webhook URLs",
        r"discord(?:app)?\.com/api/webhooks/[0-9]{17,20}/(?P<secret>[A-Za-z0-9_-]{60,68})",
    ),
    _token(
        "discord_bot_token",
        "messaging",
        "Discord bot tokens (id.timestamp.hmac)",
        r"[MNO][A-Za-z0-9_-]{23,25}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,38}",
        end=True,
    ),
    _p(
        "telegram_bot_token",
        "messaging",
        "Telegram bot tokens (<bot id>:AA...)",
        r"(?:^|[^0-9])(?P<secret>[0-9]{5,16}:AA[A-Za-z0-9_-]{30,40})(?:[^0-9A-Za-z_-]|$)",
    ),
    _token(
        "twilio_api_key",
        "messaging",
        "Twilio API key SIDs (SK + 32 hex)",
        r"SK[0-9a-fA-F]{32}",
        end=True,
    ),
    _p(
        "twilio_auth_token",
        "messaging",
        "Twilio auth tokens written next to their account SID (AC + 32 hex ... auth token 32 hex)",
        r"(?:^|[^0-9A-Za-z])AC[0-9a-fA-F]{32}[^\r\n]{0,60}?(?i:auth)[^\r\n]{0,30}?"
        r"(?:^|[^0-9A-Za-z])(?P<secret>[0-9a-fA-F]{32})(?:[^0-9A-Za-z]|$)"
        r"|(?i:auth)[_. -]?(?i:token)[^\r\n]{0,30}?(?:^|[^0-9A-Za-z])"
        r"(?P<secret_b>[0-9a-fA-F]{32})[^0-9A-Za-z][^\r\n]{0,60}?AC[0-9a-fA-F]{32}",
    ),
    _token(
        "sendgrid_api_key",
        "messaging",
        "SendGrid API keys (SG.)",
        r"SG\.[A-Za-z0-9_-]{16,32}\.[A-Za-z0-9_-]{16,64}",
    ),
    _token(
        "mailgun_key", "messaging", "Mailgun private API keys (key-)", r"key-[0-9a-f]{32}", end=True
    ),
    _token(
        "mailchimp_key",
        "messaging",
        "Mailchimp API keys (...-us12)",
        r"[0-9a-f]{32}-us[0-9]{1,2}",
        end=True,
    ),
    _token(
        "brevo_key",
        "messaging",
        "Brevo / Sendinblue API and SMTP keys (xkeysib-, xsmtpsib-)",
        r"x(?:keysib|smtpsib)-[a-f0-9]{64}-[A-Za-z0-9]{16}",
    ),
    _p(
        "teams_webhook",
        "messaging",
        "Microsoft Teams / Office 365 incoming webhook URLs",
        r"\.webhook\.office\.com/(?P<secret>webhookb2/[^\s\"'`\\]{20,})",
    ),
    # --- databases -----------------------------------------------------------------------------
    _token(
        "planetscale_token",
        "database",
        "PlanetScale tokens and passwords (pscale_tkn_, pscale_oauth_, pscale_pw_)",
        r"pscale_(?:tkn|oauth|pw)_[A-Za-z0-9_=.-]{32,64}",
    ),
    _token(
        "databricks_token",
        "database",
        "Databricks personal access tokens (dapi)",
        r"dapi[a-f0-9]{32}(?:-[0-9])?",
        end=True,
    ),
    _token(
        "neon_password", "database", "Neon database passwords (npg_)", r"npg_[A-Za-z0-9]{12,64}"
    ),
)


#: What a string becomes when its redaction does not settle (the engine gives up after a fixed
#: number of passes of the patterns over it, and fails closed).
UNSTABLE_MARKER = "[REDACTED:unstable]"

#: Marker of a random-looking value found under a generic key (see :func:`looks_random`).
GENERIC_MARKER = "[REDACTED:generic_secret]"

# --- keys ----------------------------------------------------------------------------------------

_KEY_NORMALISE = re.compile(r"[ \t\n\r\f\v_\-.]")
_KEY_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+|[^\W\d_]+")


@functools.lru_cache(maxsize=8192)
def _normalise_key(key: str) -> str:
    return _KEY_NORMALISE.sub("", key.lower())


_MARKER = re.compile(r"\[REDACTED[^\]]*\]")


@functools.lru_cache(maxsize=8192)
def last_key_word(key: str) -> str:
    """The last word of a key, lower-cased: words are split at ``_ - .``, whitespace and camelCase
    steps (``dbPass`` -> ``pass``, ``DB_PASS`` -> ``pass``, ``bypass`` -> ``bypass``). A marker
    is one word of its own (``Basic [REDACTED:basic_auth]`` and ``DB_PASS=[REDACTED:...]`` end
    with it), so that a key whose secret was redacted is not made sensitive by it."""
    words = _KEY_WORDS.findall(_MARKER.sub(" redacted ", key) if "[REDACTED" in key else key)
    return words[-1].lower() if words else ""


# --- randomness ----------------------------------------------------------------------------------

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_TOKEN = re.compile(r"[A-Za-z0-9_.=+/~-]{12,}")


def entropy(text: str) -> float:
    """Shannon entropy of ``text``, in bits per character."""
    if not text:
        return 0.0
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values())


def looks_random(text: str) -> bool:
    """Whether a value under a generic key looks like a credential: one token of 12 to 1000
    characters, with a digit or both cases, entropy >= 3.5 bits per character, not a UUID and not
    a plain identifier (only letters and ``_ . -``)."""
    if not _TOKEN.fullmatch(text) or _UUID.fullmatch(text):
        return False
    has_digit = any(c.isdigit() for c in text)
    mixed = any(c.islower() for c in text) and any(c.isupper() for c in text)
    return (has_digit or mixed) and entropy(text) >= 3.5
