"""Environment reads are fingerprinted with a salt of their own and a slow derivation, never a
bare SHA-256 of the value (issue 28: a short password was recovered from a bundle with a
five-word list). Replay still compares the live value against the recorded one."""

from __future__ import annotations

import hashlib
import os
import random
import string
from pathlib import Path
from typing import Any

import orjson
import pytest

from stepfork_otel import ReplaySession, record, trace_tool
from stepfork_otel.constants import ENV_KDF, ENV_KDF_ITERATIONS, ENV_KDF_MAX_ITERATIONS
from stepfork_otel.trace.captured import captured_problems, env_fingerprint, env_salting
from stepfork_otel.trace.models import CapturedRead, Trace
from tests.conftest import Recording

#: A short list of guesses, one of them the password (generated, never a real credential).
_rng = random.Random(28)
WORDS = ["".join(_rng.choice(string.ascii_lowercase) for _ in range(7)) for _ in range(5)]
PASSWORD = WORDS[3]


@trace_tool
def echo(value: Any) -> Any:
    return value


def _record(path: Path) -> Trace:
    with record(path, capture=("env",)) as run:
        run.set_output(echo(os.environ.get("STEPFORK_TEST_DB_PASSWORD") is not None))
    return Trace.load(path)


def _env_read(trace: Trace) -> CapturedRead:
    (read,) = [r for r in trace.captured if r.name == "STEPFORK_TEST_DB_PASSWORD"]
    return read


def test_a_word_list_finds_no_recorded_password(
    recording: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEPFORK_TEST_DB_PASSWORD", PASSWORD)
    path = tmp_path / "run.sftrace"
    read = _env_read(_record(path))
    data = path.read_bytes()
    assert PASSWORD.encode() not in data
    # the attack of the issue: a bare SHA-256 of each guess, looked for in the bundle
    for word in WORDS:
        assert hashlib.sha256(word.encode()).hexdigest().encode() not in data
    assert read.value["kdf"] == ENV_KDF
    assert read.value["iterations"] == ENV_KDF_ITERATIONS
    assert read.sha256 == env_fingerprint(PASSWORD, read.value)
    # a guess costs the derivation, under this read's own salt
    assert (
        read.sha256
        == hashlib.pbkdf2_hmac(
            "sha256", PASSWORD.encode(), bytes.fromhex(read.value["salt"]), ENV_KDF_ITERATIONS
        ).hex()
    )


def test_the_same_value_fingerprints_differently_in_each_bundle(
    recording: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEPFORK_TEST_DB_PASSWORD", PASSWORD)
    one = _env_read(_record(tmp_path / "one.sftrace"))
    two = _env_read(_record(tmp_path / "two.sftrace"))
    assert one.value["salt"] != two.value["salt"]
    assert one.sha256 != two.sha256


def test_replay_compares_the_live_value_with_the_salted_fingerprint(
    recording: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEPFORK_TEST_DB_PASSWORD", PASSWORD)
    path = tmp_path / "run.sftrace"
    _record(path)
    with ReplaySession.from_trace(path) as same:
        pass
    assert not any("STEPFORK_TEST_DB_PASSWORD" in n for n in same.summary.reads.notes)
    monkeypatch.setenv("STEPFORK_TEST_DB_PASSWORD", WORDS[0])
    with ReplaySession.from_trace(path) as changed:
        pass
    assert any(
        "STEPFORK_TEST_DB_PASSWORD differs from the recorded value" in n
        for n in changed.summary.reads.notes
    )


def test_a_bundle_of_an_earlier_version_still_compares() -> None:
    """Its reads hold a bare SHA-256 and no salting: compared as they were."""
    bare = hashlib.sha256(PASSWORD.encode()).hexdigest()
    assert env_fingerprint(PASSWORD, None) == bare
    assert env_fingerprint(None, env_salting()) is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"kdf": "md5", "iterations": 1, "salt": "00" * 16}, "unknown fingerprint derivation"),
        (
            {"kdf": ENV_KDF, "iterations": ENV_KDF_MAX_ITERATIONS + 1, "salt": "00" * 16},
            "iterations are not 1 to",
        ),
        ({"kdf": ENV_KDF, "iterations": 10, "salt": "zz"}, "salt is not 8 to 64 bytes"),
        ("hunter2", "holds no value, only how its fingerprint was made"),
    ],
)
def test_a_hostile_salting_is_a_bundle_problem(value: Any, problem: str) -> None:
    read = {
        "index": 1,
        "kind": "env",
        "source": "os.environ",
        "module": "m",
        "function": "f",
        "line": 1,
        "name": "X",
        "sha256": "00",
        "value": value,
    }
    trace = Trace.model_validate(
        {**orjson.loads(orjson.dumps(_minimal_trace())), "captured": [read]}
    )
    assert any(problem in p.message for p in captured_problems(trace))


def _minimal_trace() -> dict[str, Any]:
    golden = Path(__file__).parent / "golden" / "dinner_lisbon.sftrace"
    return Trace.load(golden).model_dump(mode="json")
