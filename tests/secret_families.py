"""A generated corpus of realistic secrets, one or more per covered family, for the corpus tests.

Every secret is made here from a seeded random generator in its provider's documented shape:
nothing in this file is, or was, a real credential. ``CORPUS`` has at least 150 of them; each is
a :class:`Secret` with the text as it appears in the wild and the part that must never be
recorded. ``FALSE_POSITIVES`` is ordinary agent traffic that redaction must leave alone.
"""

from __future__ import annotations

import base64
import hashlib
import random
import string
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Secret:
    family: str
    text: str
    secret: str


_rng = random.Random(20251201)
_ALNUM = string.ascii_letters + string.digits
_UPPER = string.ascii_uppercase + string.digits
_LOWER = string.ascii_lowercase + string.digits
_HEX = "0123456789abcdef"
_URLSAFE = _ALNUM + "_-"
_B64 = _ALNUM + "+/"


def _r(alphabet: str, n: int) -> str:
    # a random part that is not a plain word: a digit and a letter, where the alphabet has both
    digits = any(c.isdigit() for c in alphabet)
    letters = any(c.isalpha() for c in alphabet)
    while True:
        out = "".join(_rng.choice(alphabet) for _ in range(n))
        if n < 4 or (
            (not digits or any(c.isdigit() for c in out))
            and (not letters or any(c.isalpha() for c in out))
        ):
            return out


def _same(family: str, secret: str) -> Secret:
    return Secret(family, secret, secret)


def _pem(kind: str) -> Secret:
    body = base64.b64encode(_rng.randbytes(180)).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    label = f"{kind} PRIVATE KEY".strip()
    text = f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----\n"
    return Secret(f"pem_{kind.lower().replace(' ', '_') or 'pkcs8'}", text, lines[1])


def _jwt() -> str:
    def part(obj: str) -> str:
        return base64.urlsafe_b64encode(obj.encode()).decode().rstrip("=")

    header = part('{"alg":"HS256","typ":"JWT"}')
    payload = part('{"sub":"agent-' + _r(_LOWER, 6) + '","scope":"bookings"}')
    return f"{header}.{payload}.{_r(_URLSAFE, 43)}"


def _provider_tokens() -> list[Secret]:
    tokens = [
        # LLM and AI providers
        ("openai", "sk-" + _r(_ALNUM, 48)),
        ("openai_project", "sk-proj-" + _r(_URLSAFE, 74) + "T3BlbkFJ" + _r(_URLSAFE, 74)),
        ("openai_svcacct", "sk-svcacct-" + _r(_URLSAFE, 58) + "T3BlbkFJ" + _r(_URLSAFE, 58)),
        ("openai_admin", "sk-admin-" + _r(_URLSAFE, 58) + "T3BlbkFJ" + _r(_URLSAFE, 58)),
        ("anthropic", "sk-ant-api03-" + _r(_URLSAFE, 93) + "AA"),
        ("anthropic_admin", "sk-ant-admin01-" + _r(_URLSAFE, 93) + "AA"),
        ("openrouter", "sk-or-v1-" + _r(_HEX, 64)),
        ("deepseek", "sk-" + _r(_HEX, 32)),
        ("google_api_key", "AIza" + _r(_URLSAFE, 35)),
        ("gemini_api_key", "AIzaSy" + _r(_URLSAFE, 33)),
        ("google_oauth_secret", "GOCSPX-" + _r(_URLSAFE, 28)),
        ("google_oauth_access", "ya29.a0" + _r(_URLSAFE, 120)),
        ("huggingface", "hf_" + _r(string.ascii_letters, 34)),
        ("huggingface_org", "api_org_" + _r(string.ascii_letters, 34)),
        ("perplexity", "pplx-" + _r(_ALNUM, 48)),
        ("groq", "gsk_" + _r(_ALNUM, 52)),
        ("xai", "xai-" + _r(_ALNUM, 80)),
        ("replicate", "r8_" + _r(_ALNUM, 37)),
        ("langsmith", "lsv2_pt_" + _r(_HEX, 32) + "_" + _r(_HEX, 10)),
        ("langsmith_service", "lsv2_sk_" + _r(_HEX, 32) + "_" + _r(_HEX, 10)),
        ("tavily", "tvly-" + _r(_ALNUM, 32)),
        ("tavily_dev", "tvly-dev-" + _r(_ALNUM, 32)),
        ("pinecone", "pcsk_" + _r(_ALNUM, 6) + "_" + _r(_ALNUM, 60)),
        ("bedrock_long_lived", "ABSK" + _r(_B64, 132) + "=="),
        # cloud and infrastructure
        ("aws_access_key_id", "AKIA" + _r(_UPPER, 16)),
        ("aws_session_key_id", "ASIA" + _r(_UPPER, 16)),
        ("aws_a3t_key_id", "A3TX" + _r(_UPPER, 16)),
        ("alibaba", "LTAI" + _r(_ALNUM, 20)),
        ("azure_client_secret", _r(_ALNUM, 3) + "8Q~" + _r(_ALNUM + "_~.", 34)),
        ("digitalocean_pat", "dop_v1_" + _r(_HEX, 64)),
        ("digitalocean_oauth", "doo_v1_" + _r(_HEX, 64)),
        ("digitalocean_refresh", "dor_v1_" + _r(_HEX, 64)),
        ("heroku", "HRKU-AA" + _r(_URLSAFE, 58)),
        ("flyio", "fo1_" + _r(_URLSAFE, 43)),
        ("flyio_macaroon", "fm2_" + _r(_B64, 140)),
        ("cloudflare_origin_ca", "v1.0-" + _r(_HEX, 24) + "-" + _r(_HEX, 146)),
        ("terraform", _r(_ALNUM, 14) + ".atlasv1." + _r(_URLSAFE, 67)),
        ("vault_service", "hvs." + _r(_URLSAFE, 95)),
        ("vault_batch", "hvb." + _r(_URLSAFE, 140)),
        ("pulumi", "pul-" + _r(_HEX, 40)),
        ("supabase_access", "sbp_" + _r(_HEX, 40)),
        ("supabase_secret", "sb_secret_" + _r(_URLSAFE, 32)),
        ("netlify", "nfp_" + _r(_ALNUM, 36)),
        ("openshift", "sha256~" + _r(_URLSAFE, 43)),
        ("dynatrace", "dt0c01." + _r(_UPPER, 24) + "." + _r(_UPPER, 64)),
        # version control hosts
        ("github_classic", "ghp_" + _r(_ALNUM, 36)),
        ("github_oauth", "gho_" + _r(_ALNUM, 36)),
        ("github_user_to_server", "ghu_" + _r(_ALNUM, 36)),
        ("github_server_to_server", "ghs_" + _r(_ALNUM, 36)),
        ("github_refresh", "ghr_" + _r(_ALNUM, 76)),
        ("github_fine_grained", "github_pat_" + _r(_ALNUM, 22) + "_" + _r(_ALNUM, 59)),
        ("gitlab_pat", "glpat-" + _r(_URLSAFE, 20)),
        ("gitlab_pat_routable", "glpat-" + _r(_URLSAFE, 27) + ".01." + _r(_LOWER, 9)),
        ("gitlab_deploy", "gldt-" + _r(_URLSAFE, 20)),
        ("gitlab_runner", "glrt-" + _r(_URLSAFE, 20)),
        ("gitlab_pipeline_trigger", "glptt-" + _r(_HEX, 40)),
        ("gitlab_ci_job", "glcbt-" + _r(_ALNUM, 2) + "_" + _r(_URLSAFE, 20)),
        ("gitlab_runner_registration", "GR1348941" + _r(_URLSAFE, 20)),
        ("gitlab_oauth_secret", "gloas-" + _r(_URLSAFE, 64)),
        ("atlassian", "ATATT3xFfGF0" + _r(_URLSAFE, 180)),
        ("bitbucket_app_password", "ATBB" + _r(_ALNUM, 32)),
        ("sourcegraph", "sgp_" + _r(_HEX, 16) + "_" + _r(_HEX, 40)),
        # CI/CD, secrets managers, observability
        ("doppler_service", "dp.st." + _r(_ALNUM, 40)),
        ("doppler_personal", "dp.pt." + _r(_ALNUM, 43)),
        ("buildkite", "bkua_" + _r(_HEX, 40)),
        ("harness", "pat." + _r(_URLSAFE, 22) + "." + _r(_ALNUM, 24) + "." + _r(_ALNUM, 20)),
        ("octopus_deploy", "API-" + _r(_UPPER, 26)),
        ("prefect", "pnu_" + _r(_ALNUM, 36)),
        ("postman", "PMAK-" + _r(_HEX, 24) + "-" + _r(_HEX, 34)),
        ("grafana_cloud", "glc_" + _r(_ALNUM, 60)),
        ("grafana_service_account", "glsa_" + _r(_ALNUM, 32) + "_" + _r(_HEX, 8)),
        ("sentry_user", "sntryu_" + _r(_HEX, 64)),
        ("sentry_org", "sntrys_eyJpYXQiO" + _r(_B64, 120)),
        ("newrelic_user", "NRAK-" + _r(_UPPER, 27)),
        ("newrelic_insert", "NRII-" + _r(_URLSAFE, 32)),
        ("onepassword_service", "ops_eyJ" + _r(_B64, 300)),
        (
            "onepassword_secret_key",
            "A3-" + "-".join(_r(_UPPER, n) for n in (6, 6, 5, 5, 5, 5)).replace("-", "-", 1),
        ),
        (
            "age",
            "AGE-SECRET-KEY-1"
            + "".join(_rng.choice("QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L") for _ in range(58)),
        ),
        ("jfrog_api_key", "AKCp" + _r(_ALNUM, 69)),
        ("jfrog_reference", "cmVmd" + _r(_ALNUM, 59)),
        # package registries
        ("npm", "npm_" + _r(_ALNUM, 36)),
        ("pypi", "pypi-AgEIcHlwaS5vcmc" + _r(_URLSAFE, 70)),
        ("testpypi", "pypi-AgENdGVzdC5weXBpLm9yZw" + _r(_URLSAFE, 70)),
        ("rubygems", "rubygems_" + _r(_HEX, 48)),
        ("clojars", "CLOJARS_" + _r(_LOWER, 60)),
        ("dockerhub_pat", "dckr_pat_" + _r(_URLSAFE, 27)),
        ("dockerhub_org", "dckr_oat_" + _r(_URLSAFE, 32)),
        ("nuget", "oy2" + _r(_LOWER, 43)),
        # payment and commerce
        ("stripe_secret", "sk_live_" + _r(_ALNUM, 99)),
        ("stripe_test", "sk_test_" + _r(_ALNUM, 24)),
        ("stripe_restricted", "rk_live_" + _r(_ALNUM, 24)),
        ("stripe_webhook", "whsec_" + _r(_ALNUM, 32)),
        ("square_access", "EAAA" + _r(_URLSAFE, 60)),
        ("square_oauth_secret", "sq0csp-" + _r(_URLSAFE, 43)),
        ("shopify_access", "shpat_" + _r(_HEX, 32)),
        ("shopify_custom", "shpca_" + _r(_HEX, 32)),
        ("shopify_private_app", "shppa_" + _r(_HEX, 32)),
        ("shopify_shared_secret", "shpss_" + _r(_HEX, 32)),
        ("braintree", "access_token$production$" + _r(_LOWER, 16) + "$" + _r(_HEX, 32)),
        ("flutterwave", "FLWSECK_TEST-" + _r(_HEX, 32) + "-X"),
        ("shippo", "shippo_live_" + _r(_HEX, 40)),
        ("duffel", "duffel_test_" + _r(_URLSAFE, 43)),
        ("easypost", "EZAK" + _r(_ALNUM, 54)),
        # messaging, e-mail and chat
        (
            "slack_bot",
            "xoxb-" + _r("0123456789", 12) + "-" + _r("0123456789", 13) + "-" + _r(_ALNUM, 24),
        ),
        (
            "slack_user",
            "xoxp-" + "-".join(_r("0123456789", 12) for _ in range(3)) + "-" + _r(_HEX, 32),
        ),
        (
            "slack_app",
            "xapp-1-A" + _r(_UPPER, 10) + "-" + _r("0123456789", 13) + "-" + _r(_HEX, 64),
        ),
        ("slack_config", "xoxe.xoxp-1-" + _r(_UPPER, 163)),
        ("slack_refresh", "xoxe-1-" + _r(_UPPER, 146)),
        ("discord_bot", "M" + _r(_ALNUM, 25) + "." + _r(_URLSAFE, 6) + "." + _r(_URLSAFE, 38)),
        ("telegram_bot", _r("0123456789", 10) + ":AA" + _r(_URLSAFE, 33)),
        ("twilio_api_key", "SK" + _r(_HEX, 32)),
        ("sendgrid", "SG." + _r(_URLSAFE, 22) + "." + _r(_URLSAFE, 43)),
        ("mailgun", "key-" + _r(_HEX, 32)),
        ("mailchimp", _r(_HEX, 32) + "-us21"),
        ("brevo", "xkeysib-" + _r(_HEX, 64) + "-" + _r(_ALNUM, 16)),
        # databases
        ("planetscale_token", "pscale_tkn_" + _r(_URLSAFE, 43)),
        ("planetscale_password", "pscale_pw_" + _r(_URLSAFE, 43)),
        ("databricks", "dapi" + _r(_HEX, 32)),
        ("neon_password", "npg_" + _r(_ALNUM, 12)),
        # generic shapes
        ("jwt", _jwt()),
    ]
    return [_same(family, token) for family, token in tokens]


def _embedded() -> list[Secret]:
    """Secrets whose recorded text is a larger string (headers, URLs, assignments, keys)."""
    pw = _r(_ALNUM + "!#%", 16)
    items = [
        (
            "slack_webhook",
            "https://hooks.slack.com/services/T{0}/B{1}/{2}",
            (_r(_UPPER, 8), _r(_UPPER, 10), _r(_ALNUM, 24)),
            2,
        ),
        (
            "discord_webhook",
            "https://discord.com/api/webhooks/{0}/{1}",
            (_r("0123456789", 19), _r(_URLSAFE, 68)),
            1,
        ),
        (
            "teams_webhook",
            "https://acme.webhook.office.com/webhookb2/{0}@{1}/IncomingWebhook/{2}/{3}",
            (
                str(uuid.UUID(int=_rng.getrandbits(128))),
                str(uuid.UUID(int=_rng.getrandbits(128))),
                _r(_HEX, 32),
                str(uuid.UUID(int=_rng.getrandbits(128))),
            ),
            2,
        ),
        ("bearer", "Authorization: Bearer {0}", (_r(_URLSAFE, 40),), 0),
        ("bearer_lower", "authorization: bearer {0}", (_r(_ALNUM, 24),), 0),
        ("auth_token_scheme", "Authorization: Token {0}", (_r(_HEX, 40),), 0),
        ("auth_apikey_scheme", "Authorization: ApiKey {0}", (_r(_B64, 48),), 0),
        ("auth_ssws_scheme", "Authorization: SSWS {0}", (_r(_URLSAFE, 42),), 0),
        ("auth_bot_scheme", "Authorization: Bot {0}", (_r(_URLSAFE, 59),), 0),
        (
            "auth_digest_scheme",
            "Proxy-Authorization: Digest username=bob, response={0}",
            (_r(_HEX, 32),),
            0,
        ),
        (
            "auth_aws_sigv4",
            "Authorization: AWS4-HMAC-SHA256 Credential=AKIA{0}/20250101/eu-west-1/s3/aws4_request, Signature={1}",
            (_r(_UPPER, 16), _r(_HEX, 64)),
            1,
        ),
        ("auth_no_scheme", "Authorization: {0}", (_r(_ALNUM, 32),), 0),
        ("auth_json_header", '{{"Authorization": "Bearer {0}"}}', (_r(_ALNUM, 32),), 0),
        (
            "basic",
            "Authorization: Basic {0}",
            (base64.b64encode(f"admin:{_r(_ALNUM, 12)}".encode()).decode(),),
            0,
        ),
        (
            "cookie_every",
            "Cookie: theme=dark; sessionid={0}; csrftoken={1}",
            (_r(_LOWER, 32), _r(_ALNUM, 32)),
            0,
        ),
        ("cookie_first", "Cookie: sessionid={0}; theme=dark", (_r(_LOWER, 32),), 0),
        (
            "set_cookie",
            "Set-Cookie: __Host-session={0}; Path=/; Secure; HttpOnly",
            (_r(_URLSAFE, 40),),
            0,
        ),
        (
            "header_tuple_api_key",
            '[("X-Api-Key", "{0}"), ("Accept", "application/json")]',
            (_r(_ALNUM, 32),),
            0,
        ),
        ("header_tuple_auth", "[('Authorization', 'Bearer {0}')]", (_r(_ALNUM, 32),), 0),
        ("header_line_api_key", "X-Api-Key: {0}", (_r(_ALNUM, 32),), 0),
        ("postgres_url", "postgres://app_user:{0}@db.internal:5432/bookings", (pw,), 0),
        (
            "mongodb_srv_url",
            "use basic mongodb+srv://admin:{0}@cluster0.ab1cd.mongodb.net/?retryWrites=true",
            (_r(_ALNUM, 14),),
            0,
        ),
        ("redis_url", "redis://:{0}@cache.internal:6379/0", (_r(_ALNUM, 14),), 0),
        ("https_url", "https://deploy:{0}@git.example.com/repo.git", (_r(_ALNUM, 14),), 0),
        ("dsn_glued_scheme", "DSN_postgres://u:{0}@h/db", (_r(_ALNUM, 12),), 0),
        ("amqp_url", "amqps://guest:{0}@mq.example.net/vhost", (_r(_ALNUM, 12),), 0),
        ("jdbc_password", "jdbc:mysql://db:3306/app?user=app&password={0}", (_r(_ALNUM, 14),), 0),
        ("url_password_with_at", "postgres://u:p@{0}@db.internal/app", (_r(_ALNUM, 10),), 0),
        (
            "presigned_s3",
            "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA{1}%2F2025&X-Amz-Signature={0}",
            (_r(_HEX, 64), _r(_UPPER, 16)),
            0,
        ),
        (
            "azure_sas",
            "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig={0}",
            (_r(_B64, 43) + "%3D",),
            0,
        ),
        (
            "azure_storage_conn",
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={0};EndpointSuffix=core.windows.net",
            (_r(_B64, 86) + "==",),
            0,
        ),
        (
            "servicebus_conn",
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey={0}",
            (_r(_B64, 43) + "=",),
            0,
        ),
        (
            "sql_connection_string",
            "Server=tcp:db.example.net,1433;Database=app;User Id=app;Password={0};",
            (pw,),
            0,
        ),
        ("odbc_pwd", "Driver={{ODBC}};Server=db;Uid=app;Pwd={0};", (_r(_ALNUM, 14),), 0),
        ("aws_secret_access_key", "aws_secret_access_key={0}", (_r(_B64, 40),), 0),
        ("aws_secret_env", 'AWS_SECRET_ACCESS_KEY: "{0}"', (_r(_B64, 40),), 0),
        ("password_env", "DB_PASSWORD={0}", (_r(_ALNUM, 14),), 0),
        ("db_pass_env", "DB_PASS={0}", (_r(_ALNUM, 14),), 0),
        ("pgpassword", "PGPASSWORD={0} psql -h db", (_r(_ALNUM, 14),), 0),
        ("mysql_pwd", "MYSQL_PWD={0}", (_r(_ALNUM, 14),), 0),
        ("client_secret_camel", "oauth failed: clientSecret={0} rejected", (_r(_ALNUM, 24),), 0),
        ("refresh_token_camel", '{{"refreshToken":"{0}"}}', (_r(_URLSAFE, 40),), 0),
        ("access_token_camel", "accessToken: {0}", (_r(_URLSAFE, 40),), 0),
        ("db_password_camel", "dbPassword='{0}'", (_r(_ALNUM, 14),), 0),
        ("secret_access_key_pascal", "SecretAccessKey = {0}", (_r(_B64, 40),), 0),
        ("npmrc_auth_token", "//registry.npmjs.org/:_authToken={0}", (_r(_ALNUM, 36),), 0),
        ("csrftoken", "csrftoken={0}; Path=/", (_r(_ALNUM, 32),), 0),
        ("session_id", "session_id={0}", (_r(_HEX, 32),), 0),
        ("signing_key", "signing_key: {0}", (_r(_B64, 44),), 0),
        ("auth_short_key", "auth={0}", (_r(_ALNUM, 20),), 0),
        ("pass_short_key", "pass: {0}", (_r(_ALNUM, 12),), 0),
        ("pw_short_key", "user_pw={0}", (_r(_ALNUM, 12),), 0),
        ("api_key_in_repr", "{{'api_key': '{0}'}}", (_r(_ALNUM, 18),), 0),
        ("token_in_json_text", '{{"access_token":"{0}"}}', (_r(_ALNUM, 16),), 0),
        ("json_in_json", '{{"config": "{{\\"password\\": \\"{0}\\"}}"}}', (_r(_ALNUM, 14),), 0),
        ("passphrase_quoted", 'passphrase = "{0}"', ("correct horse " + _r(_LOWER, 8),), 0),
        ("generic_key_entropy", "stripe_key_live={0}", (_r(_ALNUM, 32),), 0),
        ("generic_api_key_id", 'ADAFRUIT_IO_KEY="{0}"', (_r(_LOWER, 32),), 0),
        ("generic_private_key_id", "private_key_id: {0}", (_r(_HEX, 40),), 0),
        ("datadog_app_key", "DD_APP_KEY={0}", (_r(_HEX, 40),), 0),
        ("twilio_auth_token", "TWILIO_AUTH_TOKEN={0}", (_r(_HEX, 32),), 0),
        ("cohere_key", "CO_API_KEY={0}", (_r(_ALNUM, 40),), 0),
        ("mistral_key", "MISTRAL_API_KEY={0}", (_r(_ALNUM, 32),), 0),
        (
            "query_string_token",
            "https://api.example.com/v1/items?page=2&token={0}&q=paris",
            (_r(_ALNUM, 32),),
            0,
        ),
        ("query_string_api_key", "https://maps.example.com/geo?api_key={0}", (_r(_ALNUM, 32),), 0),
        # percent-encoded: a header or an assignment logged inside a URL or a form body
        (
            "percent_encoded_bearer",
            "GET /oauth/callback?Authorization%3A%20Bearer%20{0}&next=%2Fhome",
            (_r(_URLSAFE, 40),),
            0,
        ),
        (
            "percent_encoded_password",
            "https://app.example.com/login?user=bob&password%3D{0}&remember=1",
            (_r(_ALNUM, 16),),
            0,
        ),
        (
            "percent_encoded_json_header",
            "q=%7B%22Authorization%22%3A%22Bearer%20{0}%22%7D",
            (_r(_ALNUM, 32),),
            0,
        ),
        ("percent_encoded_token_form", "grant=refresh&refresh_token%3D{0}", (_r(_URLSAFE, 40),), 0),
        # a Twilio auth token in prose, next to its account SID (either order)
        (
            "twilio_auth_token_prose",
            "account AC{0} auth token {1}",
            (_r(_HEX, 32), _r(_HEX, 32)),
            1,
        ),
        (
            "twilio_auth_token_prose_reversed",
            "use auth token {0} with account SID AC{1}",
            (_r(_HEX, 32), _r(_HEX, 32)),
            0,
        ),
        # framework secret keys whose value holds % ^ @ (the part after the first one is checked)
        (
            "django_secret_key",
            "SECRET_KEY={0}%{1}",
            (_r(_ALNUM, 12), _r(_ALNUM + "^@!#$*-_=+%", 30)),
            1,
        ),
        (
            "django_secret_key_quoted",
            "SECRET_KEY = 'django-insecure-{0}^{1}'",
            (_r(_LOWER, 10), _r(_LOWER + "@%^!#$*-_=+()&", 30)),
            1,
        ),
        (
            "flask_secret_key",
            'app.secret_key = "{0}@{1}"',
            (_r(_ALNUM, 8), _r(_ALNUM + "%^@", 24)),
            1,
        ),
        (
            "curl_header",
            'curl -H "X-Auth-Token: {0}" https://api.example.com',
            (_r(_ALNUM, 32),),
            0,
        ),
    ]
    out = []
    for family, template, parts, index in items:
        out.append(Secret(family, template.format(*parts), parts[index]))
    return out


CORPUS: tuple[Secret, ...] = (
    *_provider_tokens(),
    *_embedded(),
    *(_pem(kind) for kind in ("RSA", "EC", "OPENSSH", "DSA", "", "ENCRYPTED", "PGP")),
)

# PGP private keys are "-----BEGIN PGP PRIVATE KEY BLOCK-----": rebuild that one in its form
CORPUS = tuple(
    Secret(
        s.family,
        s.text.replace("PGP PRIVATE KEY-----", "PGP PRIVATE KEY BLOCK-----"),
        s.secret,
    )
    if s.family == "pem_pgp"
    else s
    for s in CORPUS
)

assert len(CORPUS) >= 150, len(CORPUS)
assert len({s.family for s in CORPUS}) == len(CORPUS), "families must be unique"


def _sha(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


#: Ordinary agent traffic: prose, code, ids, hashes, images, URLs without credentials.
FALSE_POSITIVES: tuple[str, ...] = (
    "The flight to Lisbon leaves from terminal two; the gate closes thirty minutes before.",
    "Please check the basic information about your booking before you pay.",
    "The bearer of this ticket may board first.",
    "I forgot my password. How do I reset it?",
    "Your session has expired; please log in again.",
    "Use the token bucket algorithm to rate limit requests.",
    "The key insight is that caching helps.",
    "max_tokens=256 temperature=0.2 top_p=1",
    '{"usage": {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49}}',
    "token_count: 1234",
    "def authenticate(user, password):\n    return check(user, password)\n",
    "for key, value in headers.items():\n    print(key, value)\n",
    "password_hint: your first pet",
    "secret_name: prod-db-credentials",
    "api_version=2024-10-21",
    "keyboard layout: us-intl",
    "The authorization server returns a code.",
    "access_mode: read-only",
    "monkey see monkey do",
    "Set the PWD variable with cd.",
    *(str(uuid.UUID(int=random.Random(n).getrandbits(128))) for n in range(20)),
    *(f"request_id={uuid.UUID(int=random.Random(n + 100).getrandbits(128))}" for n in range(10)),
    *(f"commit {_sha(n)[:40]}" for n in range(10)),
    *(f"sha256:{_sha(n)}" for n in range(10)),
    *(f'etag: W/"{_sha(n)[:32]}"' for n in range(5)),
    "data:image/png;base64," + base64.b64encode(random.Random(1).randbytes(600)).decode(),
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
    "https://www.example.com/search?q=flights+to+lisbon&page=2",
    "https://docs.python.org/3/library/re.html#re.sub",
    "http://localhost:8080/v1/traces",
    "git@github.com:acme/booking-agent.git",
    "https://github.com/acme/booking-agent/pull/42",
    "mailto:support@example.com",
    "postgres://db.internal:5432/bookings",
    "s3://my-bucket/path/to/object.json",
    "user@example.com wrote: thanks!",
    "chatcmpl-" + "".join(random.Random(2).choice(_ALNUM) for _ in range(29)),
    "call_" + "".join(random.Random(3).choice(_ALNUM) for _ in range(24)),
    "msg_01" + "".join(random.Random(4).choice(_ALNUM) for _ in range(22)),
    "toolu_01" + "".join(random.Random(5).choice(_ALNUM) for _ in range(22)),
    "fp_44709d6fcb",
    "SELECT * FROM bookings WHERE passenger_id = 42 AND status = 'confirmed';",
    "import os\nkey = os.environ['OPENAI_API_KEY']\n",
    "export OPENAI_API_KEY=${OPENAI_API_KEY}",
    "password: ********",
    "token: <your token here>",
    "api_key = {{ secrets.API_KEY }}",
    "Flight AF1381 CDG-LIS 2025-06-14T07:00:00Z, 2 passengers, 189.00 EUR",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.",
    "ERROR 2025-06-14 10:00:01 worker-3 task=sync status=retrying attempt=2",
    "The function returns a dict with keys 'id', 'name' and 'email'.",
    "skip-navigation task-1 desk-2 risk-assessment",
    "Versions: numpy==2.1.0, pydantic>=2.7,<3",
    "The secret to good coffee is fresh beans.",
    "Authentication-Results: spf=pass smtp.mailfrom=example.com",
    # percent-encoded text, Twilio ids, framework settings without a secret
    "https://www.example.com/search?q=how%20to%20reset%20my%20password%3F&page=2",
    "redirect_uri=https%3A%2F%2Fapp.example.com%2Fcallback&state=booking&scope=openid%20email",
    "Authorization%3A%20%3Credacted%3E",
    f"account AC{_sha(1)[:32]} sent message SM{_sha(2)[:32]}",
    f"the auth service logged request {_sha(3)[:32]}",
    "SECRET_KEY=${SECRET_KEY}",
    "SECRET_KEY = os.environ['SECRET_KEY']",
)
