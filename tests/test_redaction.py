"""Redaction: sensitive keys, every secret family, markers, user rules -- and the property that
makes the fast path safe: ``may_contain_secret`` says "maybe" for every payload that redaction
would change, with each secret in many positions and contexts.

All secrets here are fake (random characters in the real formats). ``SECRETS`` is also used by
``tests/test_secrets_corpus.py``, which records them through real spans and bundles.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from typing import Any

import pytest

from stepfork_otel import Redactor, SecretPattern
from stepfork_otel.trace.canonical import canonical_json
from stepfork_otel.trace.redaction import (
    DEFAULT_REDACTOR,
    KEY_MARKER,
    MAX_MESSAGE_CHARS,
    UNSTABLE_MARKER,
)


@dataclasses.dataclass(frozen=True)
class Secret:
    """A secret as it appears in the wild (``text``) and the part that must never be recorded."""

    family: str
    text: str
    secret: str


def _pem(kind: str, body: str) -> str:
    label = f"{kind} PRIVATE KEY" if kind else "PRIVATE KEY"
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----\n"


_PEM_BODY = (
    "tAuUPhGA0Qjm7zX3tzfk4V6IPk+YDsY3YRVJWxFU1i5pDUYAjV7YVQxIsmEK2nkVsj6CefrhZ0dKJLWAnsnwp8xt"
    "czNZr4g/zFo2ge+Jt8YrcEQBlA5CFwaPoENn0CnRIRT6FpxY1CQoXUZmp5I4loGvqgrTyNtkPy3CBaeatUyt+OJN"
    "nQsyoXBomTuuqKAVPsnolcK1J/VC93iHjm1u2kluI8Cxmr4nNMhUqAKejuSbWEu3/+q2yH0WDOFmHLiY9Vm3Y4no"
)
_JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhZ2VudC0xMjMiLCJzY29wZSI6ImJvb2tpbmdz"
    "In0.Zk9xT3lRdlh4S0pHcW1hbE5XdkJ6c1lqY0VmUmhUdWk"
)

SECRETS: tuple[Secret, ...] = (
    Secret("openai", *(["sk-u8jzPde0IgxLd6GncfBAepfJBd0Kh8oOOL8dKLzdocJ2isAj"] * 2)),
    Secret(
        "openai_project",
        *(
            ["sk-proj-pNxnyVmihA_2O76UMFxFkM_R5Kjp1vRt-1fjORS_6ilI8ihN5KXSc7Tvo_hBKqFYY_kv5ZJr3J"]
            * 2
        ),
    ),
    Secret(
        "anthropic",
        *(
            [
                "sk-ant-api03-1TWDtkwtDDb-xHKas1VOqg6YYZYn9ZhyiA4uoRgnatmUdjAWtGSU8po-799NksnRH9"
                "ucAUsdMlHUvTCQCyEZDz_TddJ8HAA"
            ]
            * 2
        ),
    ),
    Secret("google", *(["AIzayS5SUkCnD8zRA9a9SkpXz9w3QlY7Zkuvqdt"] * 2)),
    Secret("aws_access_key_id", *(["AKIA3J4WJ99IBAG7I1MN"] * 2)),
    Secret("aws_session_key_id", *(["ASIABQNS6PUQ80IDW370"] * 2)),
    Secret(
        "aws_secret_access_key",
        "aws_secret_access_key=qtc4xatws8phP9nhFyJfm5di4PzJ59FHz5r1pY4O",
        "qtc4xatws8phP9nhFyJfm5di4PzJ59FHz5r1pY4O",
    ),
    Secret(
        "aws_secret_access_key_env",
        'AWS_SECRET_ACCESS_KEY: "Wz8+k2PqL0v/Rt5mYx7NcB3dHf9Jg1Ks6Ae4Uo2Q"',
        "Wz8+k2PqL0v/Rt5mYx7NcB3dHf9Jg1Ks6Ae4Uo2Q",
    ),
    Secret("github_classic", *(["ghp_eQpBenQtYh5Xj8TPQxjq4i9DoV8gz4FkQ1ok"] * 2)),
    Secret("github_oauth", *(["gho_TBGzvAmwufUxbvJDCTbyvHNsG9eh6Yo4gfqr"] * 2)),
    Secret(
        "github_fine_grained",
        *(
            [
                "github_pat_c5XlrWi0B26R08qzjI6GKF_SufrdZSlB5er8bOfZqfM2oeq3hDavJA76rNicHTp8hkqdlm7t"
                "OtHWnsCGRl"
            ]
            * 2
        ),
    ),
    Secret("slack_bot", *(["xoxb-284619307521-3749201856437-Qm7Lp2Vx9Rt4Yw1Zb6Nc3Hd8"] * 2)),
    Secret(
        "slack_user", *(["xoxp-284619307521-3749201856437-3749201856501-9f8e7d6c5b4a3f2e1d0c"] * 2)
    ),
    Secret(
        "slack_app",
        *(["xapp-1-A05QZ7H2KLM-5928374610293-4f9a8c7e6d5b4a3c2d1e0f9a8b7c6d5e4f3a"] * 2),
    ),
    Secret(
        "slack_webhook",
        "https://hooks.slack.com/services/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",
        "T05QZ7H2K/B06RN3M8P/Qm7Lp2Vx9Rt4Yw1Zb6Nc3Hd8",
    ),
    Secret("stripe_secret", *(["sk_live_ovm14TUOizwd1iaeOV4qBkdf"] * 2)),
    Secret("stripe_restricted", *(["rk_live_Q1y3GQsMpSscDlkrCaqx9vJu"] * 2)),
    Secret("stripe_webhook", *(["whsec_rwZbqcabUGJmGEp7CgQ0PBQFI14zGtSn"] * 2)),
    Secret("jwt", _JWT, _JWT),
    Secret("bearer", "Bearer 8f3a9c2e7b1d4f6a0c5e9b2d7f1a4c8e", "8f3a9c2e7b1d4f6a0c5e9b2d7f1a4c8e"),
    Secret("bearer_lower", "bearer Zx9Kq2Lm7Np4Rs1Tv8Wy", "Zx9Kq2Lm7Np4Rs1Tv8Wy"),
    Secret("basic", "Basic YWRtaW46czNjcjN0UGFzcw==", "YWRtaW46czNjcjN0UGFzcw=="),
    Secret("pem_rsa", _pem("RSA", _PEM_BODY), _PEM_BODY[64:128]),
    Secret("pem_ec", _pem("EC", _PEM_BODY[:120]), _PEM_BODY[64:120]),
    Secret("pem_openssh", _pem("OPENSSH", _PEM_BODY[10:200]), _PEM_BODY[74:138]),
    Secret("pem_pkcs8", _pem("", _PEM_BODY[5:180]), _PEM_BODY[69:133]),
    Secret(
        "postgres_url",
        "postgres://app_user:Pg5ecretPass42@db.internal:5432/bookings",
        "Pg5ecretPass42",
    ),
    Secret(
        "mongodb_srv_url",
        "mongodb+srv://admin:M0ngoPa55word@cluster0.ab1cd.mongodb.net/?retryWrites=true&w=majority",
        "M0ngoPa55word",
    ),
    Secret("redis_url", "redis://:R3disPa55xyz@cache.internal:6379/0", "R3disPa55xyz"),
    Secret("https_url", "https://deploy:Htt9sPa55w0rd@git.example.com/repo.git", "Htt9sPa55w0rd"),
    Secret("url_password_with_at", "postgres://u:p@ssW0rd!x@db.internal/app", "ssW0rd!x"),
    Secret(
        "connection_string",
        "Server=tcp:db.example.net,1433;Database=app;User Id=app;Password=Sup3rS3cret!9;",
        "Sup3rS3cret!9",
    ),
    Secret("password_assignment", "DB_PASSWORD=hunter2hunter2", "hunter2hunter2"),
    Secret("api_key_in_repr", "{'api_key': 'abc123def456ghi789'}", "abc123def456ghi789"),
    Secret("token_in_json_text", '{"access_token":"a1b2c3d4e5f6g7h8"}', "a1b2c3d4e5f6g7h8"),
)


def _contexts(text: str) -> list[str]:
    """``text`` placed where secrets end up in practice."""
    return [
        text,
        f"x {text}",
        f"key={text}",
        f"value: {text}",
        f"the request failed with {text} while booking",
        f"https://api.example.com/v1/search?q=paris&next={text}&page=2",
        f"\n{text}\n",
        f'"{text}"',
        f"'{text}'",
        json.dumps({"config": text}),  # JSON held in a string: newlines are escaped
        f"{text},{text}",
        f"\t{text}\r\n",
    ]


def _odd_contexts(text: str) -> list[str]:
    """Positions where redaction may or may not apply -- the pre-check must still be right."""
    return [
        f"prefix{text}",
        f"{text}suffix",
        f"ID_{text}",
        text.upper(),
        text.lower(),
        text.replace("-", "_"),
        text[: len(text) // 2],
        f"{text[:-1]}\\{text[-1]}",
    ]


def _shapes(text: str) -> list[Any]:
    """Payload shapes holding ``text``."""
    return [
        text,
        {"v": text},
        {"a": [{"b": text}, 1, None]},
        [text, {"ok": True}],
        {text: 1},  # a secret used as a key
        {"x": {text: {"y": text}}},
    ]


def _changed(redactor: Redactor, payload: Any) -> bool:
    text = canonical_json(payload)
    return canonical_json(redactor.redact(json.loads(text))) != text


def _assert_precheck_is_sound(redactor: Redactor, payload: Any) -> None:
    text = canonical_json(payload)
    if _changed(redactor, payload):
        assert redactor.may_contain_secret(text), f"pre-check missed: {text[:300]}"
    # and the fast path gives exactly what the full walk gives
    redacted = redactor.redact_canonical(text)
    assert redacted == canonical_json(redactor.redact(json.loads(text)))
    # redacted text is left as it is (replay takes a live input equal to its recording as is)
    assert redactor.redact_canonical(redacted) == redacted, redacted[:300]


# --- the pre-check is sound ----------------------------------------------------------------------


@pytest.mark.parametrize("secret", SECRETS, ids=lambda s: s.family)
def test_every_secret_is_redacted_in_every_common_context(secret: Secret) -> None:
    for context in _contexts(secret.text):
        for payload in _shapes(context):
            text = canonical_json(payload)
            assert DEFAULT_REDACTOR.may_contain_secret(text), text[:200]
            redacted = DEFAULT_REDACTOR.redact_canonical(text)
            assert secret.secret not in redacted, redacted[:300]
            assert json.dumps(secret.secret)[1:-1] not in redacted, redacted[:300]
            _assert_precheck_is_sound(DEFAULT_REDACTOR, payload)


@pytest.mark.parametrize("secret", SECRETS, ids=lambda s: s.family)
def test_precheck_is_sound_in_odd_contexts(secret: Secret) -> None:
    for context in _odd_contexts(secret.text):
        for payload in _shapes(context):
            _assert_precheck_is_sound(DEFAULT_REDACTOR, payload)


_FRAGMENTS = (
    *("pass", "word", "wd", "phrase", "secret", "token", "tok", "en", "api", "key", "KEY", "Key"),
    *("access", "private", "credential", "s", "authorization", "cookie", "set", "aws", "AWS"),
    *("_", "-", ".", " ", "\t", "\n", "\v", "\\", '"', "'", "=", ":", ";", "@", "/", "://"),
    *("https", "postgres", "user", "hunter22", "Bearer", "bearer", "Basic", "BASIC", "sk-"),
    *("sk-proj-", "sk-ant-api03-", "AIza", "AKIA", "ASIA", "ghp_", "github_pat_", "xoxb-"),
    *("xapp-", "sk_live_", "rk_test_", "whsec_", "eyJ", ".eyJ", "hooks.slack.com/services/"),
    *("-----BEGIN ", "RSA ", "PRIVATE KEY-----", "-----END ", "\u00a0", "é", "ſ", "K", "\x1c"),
    *("ABCDEFGHIJKLMNOP", "abcdefghijklmnopqrstuvwxyz0123456789", "0123456789", "dXNlcjpwYXNz"),
    *("QRSTUVWXYZ234567", "Zm9vOmJhcg==", "A1b2C3d4E5f6G7h8", "secret_key", "X-Api-Key"),
)


def _random_payload(rng: random.Random, depth: int = 0) -> Any:
    def text() -> str:
        return "".join(rng.choice(_FRAGMENTS) for _ in range(rng.randint(1, 8)))

    roll = rng.random()
    if depth > 2 or roll < 0.5:
        return text()
    if roll < 0.8:
        return {text(): _random_payload(rng, depth + 1) for _ in range(rng.randint(1, 3))}
    return [_random_payload(rng, depth + 1) for _ in range(rng.randint(1, 3))]


def test_precheck_is_sound_on_random_fragments_of_every_rule() -> None:
    # Keys and texts glued from pieces of every rule: separators inside words ("pass_word"),
    # JSON escapes ("token\\t"), case, Unicode look-alikes, prefixes in mid-token.
    rng = random.Random(1234)
    redactors = [DEFAULT_REDACTOR, Redactor().with_rules(keys=["ssn", "my-Cookie_Jar"])]
    misses = 0
    for _ in range(6000):
        payload = _random_payload(rng)
        for redactor in redactors:
            text = canonical_json(payload)
            changed = _changed(redactor, payload)
            may = redactor.may_contain_secret(text)
            misses += changed and not may
            if may:
                assert redactor.redact_canonical(text) == canonical_json(
                    redactor.redact(json.loads(text))
                )
    assert misses == 0


# --- sensitive keys ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "Password",
        "db_password",
        "pass_word",
        "PASSWD",
        "pwd",
        "passphrase",
        "secret",
        "clientSecret",
        "client_secret",
        "SECRET_KEY",
        "token",
        "access_token",
        "X-Auth-Token",
        "refreshToken",
        "api_key",
        "apiKey",
        "X-Api-Key",
        "x.api.key",
        "openai_api_key",
        "OPENAI-API-KEY",
        "aws_access_key",
        "private_key",
        "credential",
        "credentials",
        "Authorization",
        "proxy-authorization",
        "cookie",
        "Set-Cookie",
        "token_",
        "__password__",
        "to ken",
        "api key\t",
    ],
)
def test_sensitive_keys(key: str) -> None:
    assert DEFAULT_REDACTOR.is_sensitive_key(key)
    payload = {key: "anything", "keep": "me"}
    assert DEFAULT_REDACTOR.redact(payload) == {key: KEY_MARKER, "keep": "me"}
    text = canonical_json(payload)
    assert DEFAULT_REDACTOR.may_contain_secret(text)
    assert DEFAULT_REDACTOR.redact_canonical(text) == canonical_json(
        {key: KEY_MARKER, "keep": "me"}
    )


@pytest.mark.parametrize(
    "key",
    [
        "max_tokens",
        "tokens",
        "prompt_tokens",
        "token_count",
        "passenger",
        "passengers",
        "key_count",
        "key",
        "keys",
        "monkey",
        "keyboard",
        "secretary",
        "author",
        "cookies_accepted",
        "password_hint_shown",
        "description",
    ],
)
def test_keys_that_are_not_sensitive(key: str) -> None:
    assert not DEFAULT_REDACTOR.is_sensitive_key(key)
    assert DEFAULT_REDACTOR.redact({key: "plain"}) == {key: "plain"}


@pytest.mark.parametrize(
    "value",
    [12345, 3.5, True, None, {"nested": {"deep": "x"}}, ["a", 1], "", "[REDACTED]"],
)
def test_value_under_sensitive_key_is_redacted_whatever_it_is(value: Any) -> None:
    payload = {"outer": {"api_key": value}}
    assert DEFAULT_REDACTOR.redact(payload) == {"outer": {"api_key": KEY_MARKER}}
    text = canonical_json(payload)
    assert DEFAULT_REDACTOR.redact_canonical(text) == '{"outer":{"api_key":"[REDACTED]"}}'


def test_sensitive_keys_inside_lists_and_deep_nesting() -> None:
    payload = {"calls": [{"headers": {"Authorization": "x", "Accept": "json"}}, {"token": 1}]}
    assert DEFAULT_REDACTOR.redact_canonical(canonical_json(payload)) == (
        '{"calls":[{"headers":{"Accept":"json","Authorization":"[REDACTED]"}},'
        '{"token":"[REDACTED]"}]}'
    )


# --- markers -------------------------------------------------------------------------------------


def test_markers_are_fixed_strings() -> None:
    r = DEFAULT_REDACTOR
    assert r.redact_text("key sk-u8jzPde0IgxLd6GncfBAepfJBd0Kh8oOOL8dKLzdocJ2isAj end") == (
        "key [REDACTED:openai_api_key] end"
    )
    assert r.redact_text("Authorization: Bearer 8f3a9c2e7b1d4f6a0c5e9b2d") == (
        "Authorization: Bearer [REDACTED:bearer_token]"
    )
    assert r.redact_text("postgres://app:Pg5ecretPass42@db/x") == (
        "postgres://app:[REDACTED:url_password]@db/x"
    )
    assert r.redact_text("Password=Sup3rS3cret!9;Encrypt=True") == (
        "Password=[REDACTED:assigned_secret];Encrypt=True"
    )
    assert r.redact_text(_pem("RSA", _PEM_BODY)) == "[REDACTED:pem_private_key]\n"
    assert r.redact_text(f"id {_JWT}.") == "id [REDACTED:jwt]."


def test_redaction_is_deterministic_and_idempotent() -> None:
    payload = {s.family: f"value: {s.text}" for s in SECRETS}
    first = DEFAULT_REDACTOR.redact_canonical(canonical_json(payload))
    assert first == DEFAULT_REDACTOR.redact_canonical(canonical_json(payload))
    assert DEFAULT_REDACTOR.redact_canonical(first) == first
    for pattern in DEFAULT_REDACTOR.patterns:  # no marker looks like a secret
        for text in (pattern.marker, f"x={pattern.marker}", f"token: {pattern.marker}"):
            assert DEFAULT_REDACTOR.redact_text(text) == text


def test_secrets_used_as_keys_are_redacted_and_collisions_numbered() -> None:
    a, b = "ghp_eQpBenQtYh5Xj8TPQxjq4i9DoV8gz4FkQ1ok", "ghp_TBGzvAmwufUxbvJDCTbyvHNsG9eh6Yo4gfqr"
    payload = {a: 1, b: 2, "plain": 3}
    assert DEFAULT_REDACTOR.redact_canonical(canonical_json(payload)) == (
        '{"[REDACTED:github_token]":2,"[REDACTED:github_token]#2":1,"plain":3}'
    )
    # a key that already reads like a marker is never overwritten by a redacted one
    payload = {"AKIA3J4WJ99IBAG7I1MN": "secret's", "[REDACTED:aws_access_key_id]": "literal"}
    assert DEFAULT_REDACTOR.redact_canonical(canonical_json(payload)) == (
        '{"[REDACTED:aws_access_key_id]":"secret\'s","[REDACTED:aws_access_key_id]#2":"literal"}'
    )


def test_secret_free_payloads_stay_the_same_object_and_are_not_walked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def walked(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a secret-free payload was walked")

    monkeypatch.setattr(Redactor, "_walk", walked)
    payloads = [
        {
            "model": "gpt-4.1-mini",
            "max_tokens": 512,
            "temperature": 0.2,
            "messages": [
                {"role": "system", "content": "You book flights. Ask before paying."},
                {"role": "user", "content": "2 passengers, window seats, key dates 14-16 June"},
            ],
            "usage": {"prompt_tokens": 120, "completion_tokens": 33, "total_tokens": 153},
            "tools": [{"type": "function", "function": {"name": "search_flights"}}],
        },
        {
            "query": {"origin": "LHR", "destination": "LIS", "passengers": 3},
            "results": [
                {"flight_id": "TP1351", "airline": "TAP Air Portugal", "price_eur": 189.5},
                {"flight_id": "BA500", "note": "good news: seats left", "stops": 0},
            ],
            "task-id": "task-2024-06-14-001",
            "url": "https://www.example.com/flights/lis?date=2024-06-14",
            "contact": "ops@example.com",
            "region": "Asia Pacific / Arabia",
            "keyboard_layout": "pt",
            "key_count": 4,
            "uuid": "3f2c1b0a-9d8e-4f7a-b6c5-d4e3f2a1b0c9",
        },
    ]
    for payload in payloads:
        text = canonical_json(payload)
        assert not DEFAULT_REDACTOR.may_contain_secret(text)
        assert DEFAULT_REDACTOR.redact_canonical(text) is text


@pytest.mark.parametrize(
    "text",
    [
        "basic information about your booking",
        "the bearer instrument is valid",
        "max_tokens: 512",
        "tokens: 5",
        "the password reset link was sent",
        "see https://example.com/path/to/page?x=1",
        "task-force meeting",
        "Asia and Arabia",
        "use the secret garden entrance",
    ],
)
def test_ordinary_text_is_not_redacted(text: str) -> None:
    assert DEFAULT_REDACTOR.redact_text(text) == text


# --- exception messages ---------------------------------------------------------------------------


@pytest.mark.parametrize("secret", SECRETS, ids=lambda s: s.family)
def test_exception_messages_are_redacted(secret: Secret) -> None:
    error = RuntimeError(f"upstream rejected the call (credential was {secret.text}); retry")
    message = DEFAULT_REDACTOR.redact_message(str(error))
    assert secret.secret not in message
    assert message.startswith("upstream rejected the call")
    assert message.endswith("; retry") or "PRIVATE KEY" in secret.text


def test_exception_messages_are_bounded_after_redaction() -> None:
    message = "AKIA3J4WJ99IBAG7I1MN " + "x" * (3 * MAX_MESSAGE_CHARS)
    out = DEFAULT_REDACTOR.redact_message(message)
    assert out == ("[REDACTED:aws_access_key_id] " + "x" * MAX_MESSAGE_CHARS)[
        :MAX_MESSAGE_CHARS
    ] + ("…[truncated]")
    assert DEFAULT_REDACTOR.redact_message("short") == "short"


def test_dict_repr_in_an_exception_message() -> None:
    error = ValueError(str({"api_key": "abc123def456", "password": "hunter22", "user": "bob"}))
    assert DEFAULT_REDACTOR.redact_message(str(error)) == (
        "{'api_key': '[REDACTED:assigned_secret]', 'password': '[REDACTED:assigned_secret]', "
        "'user': 'bob'}"
    )


# --- user rules ----------------------------------------------------------------------------------


def test_user_keys_and_untriggered_patterns() -> None:
    custom = Redactor().with_rules(
        keys=["SSN", "employee-number"], patterns=[("emp", r"EMP-\d{6}")]
    )
    payload = {"ssn": "078-05-1120", "EmployeeNumber": 7, "note": "see EMP-123456 and sk-short"}
    assert custom.redact(payload) == {
        "ssn": KEY_MARKER,
        "EmployeeNumber": KEY_MARKER,
        "note": "see [REDACTED:emp] and sk-short",
    }
    # user patterns join the one RE2 scan: a payload none of them matches is left alone
    assert not custom.may_contain_secret('{"nothing":"here"}')
    assert custom.redact_canonical('{"nothing":"here"}') == '{"nothing":"here"}'
    # the built-in rules still apply, and the default redactor is unchanged
    assert custom.redact({"token": 1}) == {"token": KEY_MARKER}
    assert DEFAULT_REDACTOR.redact({"ssn": "1"}) == {"ssn": "1"}


_USER_PATTERNS = (
    SecretPattern("employee_id", re.compile(r"EMP-\d{6}"), prefixes=("EMP-",)),
    SecretPattern(
        "ticket_ref",
        re.compile(r"(?ai:internal[ _\-]?ref)\s*[:=]\s*(?P<secret>\w{6,})"),
        triggers=("internal ref",),
    ),
)
_USER_SECRETS = (
    Secret("employee_id", "EMP-123456", "EMP-123456"),
    Secret("ticket_ref", "INTERNAL-REF: ABCDEF123", "ABCDEF123"),
    Secret("ticket_ref_snake", "internal_ref=zz9plural", "zz9plural"),
)


@pytest.mark.parametrize("secret", _USER_SECRETS, ids=lambda s: s.family)
def test_user_patterns_with_triggers_keep_the_precheck_sound(secret: Secret) -> None:
    custom = Redactor().with_rules(keys=["ssn"], patterns=_USER_PATTERNS)
    assert not custom.may_contain_secret('{"nothing":"here","ssn_hint":"x"}')
    for context in _contexts(secret.text):
        for payload in _shapes(context):
            text = canonical_json(payload)
            assert secret.secret not in custom.redact_canonical(text)
            _assert_precheck_is_sound(custom, payload)
    for context in _odd_contexts(secret.text):
        for payload in _shapes(context):
            _assert_precheck_is_sound(custom, payload)
    for payload in _shapes(f"key {SECRETS[0].text}"):  # built-ins still caught
        assert SECRETS[0].secret not in custom.redact_canonical(canonical_json(payload))


def test_user_keys_are_found_by_the_precheck_in_any_spelling() -> None:
    custom = Redactor().with_rules(keys=["employee-number"])
    for key in ("employee_number", "EmployeeNumber", "EMPLOYEE.NUMBER", "x-employee-number\t"):
        text = canonical_json({"a": [{key: 1}]})
        assert custom.may_contain_secret(text), key
        assert custom.redact_canonical(text) == canonical_json({"a": [{key: KEY_MARKER}]})


def test_redactor_is_immutable_and_compares_by_rules() -> None:
    r = Redactor()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.patterns = ()  # type: ignore[misc]
    assert r == DEFAULT_REDACTOR
    assert r.with_rules(keys=["ssn"]) != r
    assert r.with_rules(keys=["S-S-N"]).sensitive_keys[-1] == "ssn"


def test_doctest_example() -> None:
    r = Redactor().with_rules(keys=["ssn"])
    assert r.redact({"ssn": "078-05-1120", "q": "Bearer abc.def.ghi"}) == {
        "ssn": "[REDACTED]",
        "q": "Bearer [REDACTED:bearer_token]",
    }


def test_big_integers_stay_exact_in_a_payload_that_needs_redaction() -> None:
    """Redaction must not round integers beyond 64 bits (the canonical rule: exact decimal)."""
    from stepfork_otel.trace.canonical import canonical_json
    from stepfork_otel.trace.redaction import DEFAULT_REDACTOR

    for value in (
        {"n": 10**20, "q": "Bearer 8f3kT9qLmN2pR8sV4wY6"},
        {"n": -(10**30), "api_key": "x"},
        {"list": [2**64, {"auth": "Basic dXNlcjpwYXNzd29yZA=="}]},
    ):
        redacted = DEFAULT_REDACTOR.redact_canonical(canonical_json(value))
        assert "[REDACTED" in redacted
        for number in (
            "100000000000000000000",
            "-1000000000000000000000000000000",
            "18446744073709551616",
        ):
            if number in canonical_json(value):
                assert number in redacted


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("headers={'Cookie': 'sessionid=9f8e7d6c5b4a3210'}", "9f8e7d6c5b4a3210"),
        ("headers={'Authorization': 'Token 7a6b5c4d3e2f1a0b'}", "7a6b5c4d3e2f1a0b"),
        ('{"credentials": "admin:s3cr3t!"}', "s3cr3t"),
        ("aws_access_key=XYZ1234567890", "XYZ1234567890"),
        ("private_key: 'MIIEvQIBADANBgkq'", "MIIEvQIBADANBgkq"),
    ],
)
def test_sensitive_keys_apply_inside_text(text: str, secret: str) -> None:
    """The sensitive-key rule holds inside text too: exception messages, JSON held in strings
    (found in review: Cookie/Authorization headers in a message reached the bundle)."""
    from stepfork_otel.trace.canonical import canonical_json
    from stepfork_otel.trace.redaction import DEFAULT_REDACTOR

    assert secret not in DEFAULT_REDACTOR.redact_message(text)
    canonical = canonical_json({"error": text})
    assert DEFAULT_REDACTOR.may_contain_secret(canonical)
    assert secret not in DEFAULT_REDACTOR.redact_canonical(canonical)


def test_user_keys_apply_inside_text() -> None:
    from stepfork_otel.trace.canonical import canonical_json

    redactor = Redactor().with_rules(keys=["ssn"])
    assert redactor.redact({"body": '{"ssn": "078-05-1120"}'}) == {
        "body": '{"ssn": "[REDACTED:sensitive_key]"}'
    }
    assert redactor.redact_message("lookup failed for ssn=078-05-1120") == (
        "lookup failed for ssn=[REDACTED:sensitive_key]"
    )
    canonical = canonical_json({"body": '{"ssn": "078-05-1120"}'})
    assert "078-05-1120" not in redactor.redact_canonical(canonical)
    assert not redactor.may_contain_secret(canonical_json({"ssn_hint": "x"}))


def test_secrets_glued_together_are_all_redacted_in_one_go() -> None:
    # the OpenAI pattern may not start inside a word, so behind an AWS key it only matched once
    # the key had become a marker: one pass left it in the recording
    glued = "ASIABQNS6PUQ80IDW370" + "sk-u8jzPde0IgxLd6GncfBAepfJBd0Kh8oOOL8dKLzdocJ2isAj"
    redacted = DEFAULT_REDACTOR.redact_canonical(canonical_json({"q": glued}))
    assert redacted == '{"q":"[REDACTED:aws_access_key_id][REDACTED:openai_api_key]"}'
    assert DEFAULT_REDACTOR.redact_message(glued) == (
        "[REDACTED:aws_access_key_id][REDACTED:openai_api_key]"
    )


def test_redaction_is_idempotent_on_secrets_glued_to_anything() -> None:
    rng = random.Random(5)
    pieces = [s.text for s in SECRETS]
    separators = ["", " ", "=", ":", "@", "/", "\n", "Bearer ", "password=", "token: "]
    separators += ["https://u:", "\\", "'", "-----"]
    for _ in range(4000):
        text = "".join(
            rng.choice(pieces) if rng.random() < 0.5 else rng.choice(separators)
            for _ in range(rng.randint(1, 6))
        )
        shape = rng.choice([text, {"q": text}, [text, text], {"api_key": text, "x": text}])
        once = DEFAULT_REDACTOR.redact_canonical(canonical_json(shape))
        assert DEFAULT_REDACTOR.redact_canonical(once) == once, once[:300]


def test_redaction_that_does_not_settle_fails_closed() -> None:
    # a user pattern that matches its own marker would nest markers forever; a long chain of
    # glued secrets behind a look-behind needs one pass per secret: past the limit, the string
    # is replaced whole -- never left with a secret in it -- and redaction stays idempotent
    shouting = Redactor().with_rules(patterns=[("ticket", r"\b[A-Z]{8,}\b")])
    text = canonical_json({"q": "see TICKETNUMBER"})
    redacted = shouting.redact_canonical(text)
    assert redacted == '{"q":"' + UNSTABLE_MARKER + '"}'
    assert shouting.redact_canonical(redacted) == redacted
    glued = Redactor().with_rules(
        patterns=[("acme", r"(?:^|[^A-Za-z0-9])(?P<secret>acme_[a-z0-9]{8})")]
    )
    chain = "".join(f"acme_{c * 8}" for c in "abcdefghijklmnopqrstu")  # 21 tokens
    out = glued.redact_canonical(canonical_json({"q": chain}))
    assert "acme_" not in out
    assert glued.redact_canonical(out) == out
    short = glued.redact_canonical(canonical_json({"q": chain[: 13 * 6]}))
    assert short == '{"q":"' + "[REDACTED:acme]" * 6 + '"}'


@pytest.mark.parametrize(
    "text",
    [
        'Example key: ADAFRUIT_IO_KEY="v97w8d7f6g5h4j3k2l1mnbvcxz12345"',
        "key: private_key_id: 5d9f8e7d6c5b4a39281706f5e4d3c2b1a0918273",
    ],
)
def test_a_secret_under_a_key_inside_a_refused_value_is_redacted(text: str) -> None:
    """The generic rule matched the first ``key:`` and refused its value (``ADAFRUIT_IO_KEY=``,
    low entropy); the search went on after that value, past the real secret (found by the
    issue 28 campaign: a tool default written after "Example key:")."""
    redacted = DEFAULT_REDACTOR.redact_text(text)
    assert "[REDACTED:generic_secret]" in redacted
    assert text.rsplit(" ", 1)[-1].strip('"').split("=")[-1].strip('"') not in redacted
