"""Determinism capture: the clock, randomness, uuids and the environment recorded at their call
sites, served and checked in replay (``recording/determinism.py``, ``replay/reads.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime as dt_module
import email.utils
import json
import os
import random
import re
import secrets
import subprocess
import sys
import threading
import time
import uuid
from datetime import date, datetime, timezone
from pathlib import Path
from time import time_ns as imported_time_ns
from typing import Any

import pytest

from examples.fake_llm import FakeLLM
from stepfork_otel import ReplaySession, record, trace_tool
from stepfork_otel.recording import determinism
from stepfork_otel.replay.errors import ReplayMismatchError, ReplayModeError
from stepfork_otel.trace.models import Trace
from tests.conftest import Recording

ROOT = Path(__file__).resolve().parent.parent
AGENTS = Path(__file__).with_name("determinism_agents.py")
# In tuples: while time is captured, every name of the run's modules bound to a source or to
# ``datetime``/``date`` is replaced -- module-level constants too.
REAL = (time.time, dt_module.datetime, dt_module.date)
MODULE = __name__


@trace_tool
def echo(value: Any) -> Any:
    """Return the value (a boundary between the reads)."""
    return value


def _record(path: Path, body: Any, capture: Any = "all") -> tuple[Any, Trace]:
    with record(path, capture=capture) as run:
        result = body()
        run.set_output(result)
    return result, Trace.load(path)


def _replay(path: Path, body: Any, **options: Any) -> tuple[Any, ReplaySession]:
    with ReplaySession.from_trace(path, **options) as session:
        result = body()
    return result, session


# --- each source -----------------------------------------------------------------------------------


def _clock() -> list[Any]:
    return [
        time.time(),
        time.time_ns(),
        imported_time_ns(),  # ``from time import time_ns``
        datetime.now().isoformat(),  # ``from datetime import datetime``
        datetime.now(timezone.utc).isoformat(),
        dt_module.datetime.now(dt_module.timezone(dt_module.timedelta(hours=5))).isoformat(),
        datetime.utcnow().isoformat(),
        datetime.today().isoformat(),
        date.today().isoformat(),
        dt_module.date.today().isoformat(),  # ``import datetime``
        time.strftime("%Y-%m-%d %H:%M:%S"),
        time.strftime("%Y", time.gmtime(0)),  # a time given: not a read (but gmtime(0) neither)
        time.ctime(),
        list(time.localtime()),
        list(time.gmtime()),
    ]


def _randomness() -> list[Any]:
    random.seed()  # not a read: it draws nothing
    items = list(range(20))
    random.shuffle(items)
    return [
        random.random(),
        random.randint(1, 10**30),
        random.choice("abcdefgh"),
        random.sample(range(1000), 5),
        items,
        random.uniform(-1, 1),
        random.gauss(0, 1),
        random.getrandbits(200),
        random.randbytes(7).hex(),
        random.choices("xyz", k=4),
    ]


def _ids() -> list[Any]:
    return [str(uuid.uuid4()), str(uuid.uuid1()), uuid.uuid4().hex]


def _secret_values() -> list[Any]:
    return [
        os.urandom(12).hex(),
        secrets.token_hex(8),
        secrets.token_urlsafe(8),
        secrets.token_bytes(5).hex(),
    ]


@pytest.mark.parametrize(
    ("body", "capture", "sources"),
    [
        (
            _clock,
            "time",
            [
                "time.time",
                "time.time_ns",
                "time.time_ns",
                "datetime.now",
                "datetime.now",
                "datetime.now",
                "datetime.utcnow",
                "datetime.today",
                "date.today",
                "date.today",
                "time.strftime",
                "time.ctime",
                "time.localtime",
                "time.gmtime",
            ],
        ),
        (
            _randomness,
            "random",
            [
                "random.shuffle",
                "random.random",
                "random.randint",
                "random.choice",
                "random.sample",
                "random.uniform",
                "random.gauss",
                "random.getrandbits",
                "random.randbytes",
                "random.choices",
            ],
        ),
        (_ids, "uuid", ["uuid.uuid4", "uuid.uuid1", "uuid.uuid4"]),
        (
            _secret_values,
            "secrets",
            ["os.urandom", "secrets.token_hex", "secrets.token_urlsafe", "secrets.token_bytes"],
        ),
    ],
    ids=["time", "random", "uuid", "secrets"],
)
def test_each_source_is_recorded_with_its_site_and_served_back(
    recording: Recording, tmp_path: Path, body: Any, capture: str, sources: list[str]
) -> None:
    def run() -> Any:
        first = body()
        echo("between")
        return [first, body()]

    path = tmp_path / "run.sftrace"
    recorded, trace = _record(path, run, capture)
    reads = [r for r in trace.captured if r.kind == "value"]
    assert [r.source for r in reads] == sources * 2
    assert [r.index for r in reads] == list(range(1, len(reads) + 1))
    assert {r.module for r in reads} == {__name__}
    assert {r.function for r in reads} == {body.__name__}
    assert [r.before_call for r in reads] == [1] * len(sources) + [None] * len(sources)
    assert trace.run.capture == [capture]
    time.sleep(0.002)  # the clock moves on; the replay still sees the recorded values
    replayed, session = _replay(path, run)
    assert replayed == recorded
    session.verify_complete()
    assert session.summary.reads.served == len(reads)
    assert not determinism.installed()


def test_timezone_aware_now_keeps_the_zone_asked_for(recording: Recording, tmp_path: Path) -> None:
    zone = dt_module.timezone(dt_module.timedelta(hours=-3), "BRT")

    def run() -> Any:
        value = datetime.now(zone)
        return [value.isoformat(), value.tzname(), isinstance(value, datetime)]

    recorded, _ = _record(tmp_path / "run.sftrace", run, "time")
    replayed, _ = _replay(tmp_path / "run.sftrace", run)
    assert replayed == recorded
    assert replayed[1] == "BRT"
    assert replayed[2] is True


def test_values_made_while_capturing_are_the_real_classes(
    recording: Recording, tmp_path: Path
) -> None:
    def run() -> Any:
        now = datetime.now()
        built = datetime(2024, 5, 1, 12, 0)
        parsed = datetime.fromisoformat("2024-05-01T12:00:00")
        return [
            type(now) is REAL[1],
            type(built) is REAL[1],
            type(parsed) is REAL[1],
            isinstance(built, datetime),
            isinstance(date(2024, 1, 1), date),
            issubclass(dt_module.datetime, datetime),
        ]

    with record(tmp_path / "run.sftrace", capture="time"):
        assert run() == [True] * 6
    assert datetime is REAL[1]
    assert date is REAL[2]


# --- scope -------------------------------------------------------------------------------------


def test_only_the_runs_own_code_in_its_context_is_captured(
    recording: Recording, tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}

    def outside_thread() -> None:  # a thread started without the run's context
        seen["plain thread"] = time.time()

    def copied_context() -> None:
        seen["copied"] = time.time()

    async def tasks() -> list[float]:
        async def one() -> float:
            return time.time()

        return list(await asyncio.gather(one(), one()))

    def run() -> Any:
        email.utils.formatdate()  # the standard library reads the clock: not the run's read
        uuid.uuid4()  # reads os.urandom inside the stdlib: one read, uuid.uuid4
        thread = threading.Thread(target=outside_thread)
        thread.start()
        thread.join()
        context = contextvars.copy_context()
        copied = threading.Thread(target=context.run, args=(copied_context,))
        copied.start()
        copied.join()
        return asyncio.run(tasks())

    _, trace = _record(tmp_path / "run.sftrace", run, "all")
    reads = [(r.source, r.function) for r in trace.captured if r.kind == "value"]
    assert reads == [
        ("uuid.uuid4", "test_only_the_runs_own_code_in_its_context_is_captured.<locals>.run"),
        (
            "time.time",
            "test_only_the_runs_own_code_in_its_context_is_captured.<locals>.copied_context",
        ),
        (
            "time.time",
            "test_only_the_runs_own_code_in_its_context_is_captured.<locals>.tasks.<locals>.one",
        ),
        (
            "time.time",
            "test_only_the_runs_own_code_in_its_context_is_captured.<locals>.tasks.<locals>.one",
        ),
    ]


def test_a_boundary_body_reads_live_it_is_the_dependency(
    recording: Recording, tmp_path: Path
) -> None:
    @trace_tool
    def stamp() -> float:
        """The tool reads the clock: its result is what is recorded."""
        return time.time()

    def run() -> Any:
        return [stamp(), time.time()]

    recorded, trace = _record(tmp_path / "run.sftrace", run, "time")
    assert [(r.source, r.before_call) for r in trace.captured] == [("time.time", None)]
    replayed, session = _replay(tmp_path / "run.sftrace", run)
    assert replayed == recorded
    session.verify_complete()


def test_without_capture_nothing_is_replaced(recording: Recording, tmp_path: Path) -> None:
    with record(tmp_path / "run.sftrace"):
        assert time.time is REAL[0]
        assert not determinism.installed()
        echo(1)
    trace = Trace.load(tmp_path / "run.sftrace")
    assert trace.captured == []
    assert trace.run.capture is None
    with record(tmp_path / "captured.sftrace", capture="time"):
        assert time.time is not REAL[0]
    assert time.time is REAL[0]


def test_nested_runs_share_the_outer_runs_reads(recording: Recording, tmp_path: Path) -> None:
    def run() -> Any:
        first = time.time()
        with record(tmp_path / "inner.sftrace"):
            inner = [time.time(), echo("in")]
        return [first, inner, time.time()]

    recorded, trace = _record(tmp_path / "outer.sftrace", run, "time")
    assert [r.index for r in trace.captured] == [1, 2, 3]
    replayed, session = _replay(tmp_path / "outer.sftrace", run)
    assert replayed == recorded
    session.verify_complete()


def test_wrong_capture_names_are_refused_up_front() -> None:
    with pytest.raises(ValueError, match="unknown source 'clock'"):
        record("x.sftrace", capture=("clock",))
    with pytest.raises(ValueError, match="cannot be combined"):
        record("x.sftrace", capture=("audit", "time"))
    with pytest.raises(ReplayModeError, match="strict"):
        ReplaySession(Trace(trace_id="0" * 32), captured="loose")


# --- replay checks -------------------------------------------------------------------------------


def _plan_a() -> list[Any]:
    now = time.time()
    return [now, echo(now)]


def _plan_b() -> list[Any]:
    stamp = datetime.now().isoformat()
    return [stamp, echo(stamp)]


def test_a_read_from_another_site_is_a_mismatch_naming_both(
    recording: Recording, tmp_path: Path
) -> None:
    path = tmp_path / "run.sftrace"
    _record(path, _plan_a, "time")
    with pytest.raises(ReplayMismatchError) as raised:
        _replay(path, _plan_b)
    message = str(raised.value)
    assert "captured read 1 differs from the recording" in message
    assert f"this run read datetime.now at {MODULE}:_plan_b:" in message
    assert f"the recording read time.time at {MODULE}:_plan_a:" in message
    assert "(before call 1)" in message


def _reads(count: dict[str, int]) -> list[Any]:
    values = []
    for _ in range(count["n"]):
        values.append(time.time())
    return [len(values), echo(1)]


def test_an_extra_read_and_a_left_over_read_are_mismatches(
    recording: Recording, tmp_path: Path
) -> None:
    path = tmp_path / "run.sftrace"
    _record(path, lambda: _reads({"n": 1}), "time")
    with pytest.raises(
        ReplayMismatchError, match=r"the recording's 1 captured read\(s\) are used up"
    ):
        _replay(path, lambda: _reads({"n": 2}))
    result, session = _replay(path, lambda: _reads({"n": 0}))
    assert result == [0, 1]
    with pytest.raises(ReplayMismatchError) as raised:
        session.verify_complete()
    assert "1 captured read(s) were never made by this run" in str(raised.value)
    assert f"read 1 time.time at {MODULE}:_reads:" in str(raised.value)
    assert not session.summary.ok


def _clock_then_echo() -> list[Any]:
    return [time.time() > 0, echo(1)]


def _date_then_echo() -> list[Any]:
    return [datetime.now() is not None, echo(1)]


def test_lenient_reads_live_and_notes_it(recording: Recording, tmp_path: Path) -> None:
    path = tmp_path / "run.sftrace"
    _record(path, _clock_then_echo, "time")
    result, session = _replay(path, _date_then_echo, captured="lenient")
    assert result == [True, 1]
    session.verify_complete()  # lenient: what was not read is not held against the run
    notes = session.summary.reads.notes
    assert len(notes) == 1
    assert notes[0].startswith("read live (captured='lenient'): captured read 1 differs")


def test_a_swallowed_read_mismatch_still_fails_verify_complete(
    recording: Recording, tmp_path: Path
) -> None:
    path = tmp_path / "run.sftrace"
    _record(path, _clock_then_echo, "time")

    def swallowing() -> None:
        with contextlib.suppress(ReplayMismatchError):
            datetime.now()  # not the recorded read: refused, and the cursor stays

    with ReplaySession.from_trace(path) as session:
        swallowing()
        _clock_then_echo()
    with pytest.raises(ReplayMismatchError, match="the agent caught the error"):
        session.verify_complete()


def test_a_random_function_called_differently_is_a_mismatch(
    recording: Recording, tmp_path: Path
) -> None:
    size = {"n": 5}

    def run() -> list[Any]:
        return random.sample(range(100), size["n"])

    path = tmp_path / "run.sftrace"
    _record(path, run, "random")
    size["n"] = 7
    with pytest.raises(ReplayMismatchError, match=r"random\.sample at .* drew differently"):
        _replay(path, run)


def test_without_capture_a_mismatch_points_at_the_read_and_suggests_capture(
    recording: Recording, tmp_path: Path
) -> None:
    def run() -> Any:
        return echo(f"now is {time.time()}")

    path = tmp_path / "run.sftrace"
    _record(path, run, None)
    with pytest.raises(ReplayMismatchError) as raised:
        _replay(path, run)
    message = str(raised.value)
    assert "input differs from the recording" in message
    assert "the run read values the recording did not capture: time.time at " in message
    assert f"{MODULE}:test_without_capture_a_mismatch" in message
    assert "record(..., capture=('time',))" in message


# --- environment -------------------------------------------------------------------------------


def test_environment_reads_are_checked_by_fingerprint_never_stored(
    recording: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-env-" + "q" * 30
    monkeypatch.setenv("STEPFORK_TEST_REGION", "eu-west-1")
    monkeypatch.setenv("STEPFORK_TEST_TOKEN", secret)
    monkeypatch.delenv("STEPFORK_TEST_UNSET", raising=False)

    def run() -> Any:
        region = os.environ["STEPFORK_TEST_REGION"]
        token = os.getenv("STEPFORK_TEST_TOKEN")
        missing = os.environ.get("STEPFORK_TEST_UNSET")
        again = os.environ["STEPFORK_TEST_REGION"]  # once per variable
        return echo([region, token is not None, missing, again])

    path = tmp_path / "run.sftrace"
    _record(path, run, "env")
    trace = Trace.load(path)
    env = {r.name: r for r in trace.captured if r.kind == "env"}
    assert set(env) == {"STEPFORK_TEST_REGION", "STEPFORK_TEST_TOKEN", "STEPFORK_TEST_UNSET"}
    assert env["STEPFORK_TEST_UNSET"].sha256 is None
    assert secret not in path.read_text()
    assert "eu-west-1" not in path.read_text().split("\n")[0]
    monkeypatch.setenv("STEPFORK_TEST_REGION", "us-east-2")
    monkeypatch.setenv("STEPFORK_TEST_UNSET", "now set")
    with ReplaySession.from_trace(path) as session:
        pass
    notes = session.summary.reads.notes
    assert any("STEPFORK_TEST_REGION differs from the recorded value" in n for n in notes)
    assert any("STEPFORK_TEST_UNSET is set here, unset when recorded" in n for n in notes)
    assert not any("STEPFORK_TEST_TOKEN" in n for n in notes)


# --- audit ------------------------------------------------------------------------------------------


def test_audit_lists_every_read_without_recording_values(
    recording: Recording, tmp_path: Path
) -> None:
    def run() -> Any:
        for _ in range(3):
            time.time()
        uuid.uuid4()
        os.environ.get("HOME")
        return echo(1)

    path = tmp_path / "run.sftrace"
    _record(path, run, "audit")
    trace = Trace.load(path)
    assert trace.run.capture == ["audit"]
    tally = [(r.source, r.count, r.value) for r in trace.captured]
    assert tally == [("time.time", 3, None), ("uuid.uuid4", 1, None), ("os.environ", 1, None)]
    shown = subprocess.run(
        [sys.executable, "-m", "stepfork_otel.cli", "show", str(path)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1"),
    )
    assert "audit: 5 nondeterministic read(s) at 3 site(s)" in shown.stdout
    assert "time.time        x3" in shown.stdout
    _, session = _replay(path, run)  # an audit serves nothing and expects nothing
    session.verify_complete()


# --- on spans: OTLP import -------------------------------------------------------------------------


def test_a_bundle_rebuilt_from_exported_spans_replays_the_same_values(
    recording: Recording, tmp_path: Path
) -> None:
    from stepfork_otel.otel.otlp_file import OtlpJsonFileExporter

    out = tmp_path / "otlp.jsonl"
    exporter = OtlpJsonFileExporter(out)
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    recording.provider.add_span_processor(SimpleSpanProcessor(exporter))

    def run() -> Any:
        stamp = datetime.now().isoformat()
        pick = random.random()
        ident = str(uuid.uuid4())
        return [echo([stamp, pick]), echo(ident), time.time()]

    recorded, trace = _record(tmp_path / "run.sftrace", run, ("time", "random", "uuid"))
    exporter.shutdown()
    imported = Trace.from_otlp_json(out)
    assert imported.captured == trace.captured
    assert imported.run.capture == trace.run.capture
    rebuilt = tmp_path / "imported.sftrace"
    imported.save(rebuilt)
    replayed, session = _replay(rebuilt, run)
    assert replayed == recorded
    session.verify_complete()


def test_captured_reads_are_covered_by_the_bundle_integrity_check(
    recording: Recording, tmp_path: Path
) -> None:
    from stepfork_otel.trace.errors import BundleError

    path = tmp_path / "run.sftrace"
    _record(path, _plan_a, "time")
    lines = path.read_bytes().split(b"\n")
    # (the header of a bundle saved in one piece, the trailer of one written as the run went)
    n = next(
        i
        for i, line in enumerate(lines)
        if line.startswith((b'{"format"', b'{"run":')) and b'"captured":[{' in line
    )
    head = json.loads(lines[n])
    head["captured"][0]["value"] += 1.0
    lines[n] = json.dumps(head, separators=(",", ":")).encode()
    tampered = tmp_path / "tampered.sftrace"
    tampered.write_bytes(b"\n".join(lines))
    with pytest.raises(BundleError, match="lines"):
        ReplaySession.from_trace(tampered)


# --- a real agent, replayed in a fresh process with another clock ---------------------------------


def _agent(mode: str, bundle: Path, url: str, capture: str, env: dict[str, str]) -> Any:
    out = bundle.with_suffix(f".{mode}.json")
    done = subprocess.run(
        [sys.executable, str(AGENTS), mode, str(bundle), str(out), url, capture],
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **env),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_an_agent_with_the_date_in_its_prompt_replays_frozen_in_a_fresh_process(
    tmp_path: Path,
) -> None:
    bundle = tmp_path / "agent.sftrace"
    with FakeLLM() as llm:
        recorded = _agent("record", bundle, llm.openai_url, "time,random,uuid", {"TZ": "UTC"})
        served = len(llm.requests)
    time.sleep(1.1)  # the seconds shown in the prompt have moved on
    replayed = _agent("replay", bundle, llm.openai_url, "none", {"TZ": "Asia/Tokyo"})
    assert served == 1
    assert "error" not in replayed, replayed.get("error")
    assert replayed["result"] == recorded["result"]
    assert replayed["calls"] == [["tool", "substituted"], ["llm", "substituted"]]
    trace = Trace.load(bundle)
    assert replayed["reads"] == [len(trace.captured), len(trace.captured)]
    assert [r.source for r in trace.captured] == [
        "datetime.now",
        "random.choice",
        "time.time",
        "uuid.uuid4",
        "uuid.uuid4",
    ]
    assert {r.module for r in trace.captured} == {"determinism_agents"}


def test_the_same_agent_recorded_without_capture_fails_at_its_first_call_and_says_why(
    tmp_path: Path,
) -> None:
    bundle = tmp_path / "agent.sftrace"
    with FakeLLM() as llm:
        _agent("record", bundle, llm.openai_url, "none", {"TZ": "UTC"})
    replayed = _agent("replay", bundle, llm.openai_url, "none", {"TZ": "Asia/Tokyo"})
    kind, message = replayed["error"]
    assert kind == "ReplayMismatchError"
    assert "at call 1 of this run: input differs from the recording" in message
    # (datetime is noticed only where a recording captured time: without capture, the run's own
    # modules are left untouched)
    assert "random.choice at determinism_agents:run_agent:" in message
    assert "time.time at determinism_agents:run_agent:" in message
    assert "uuid.uuid4 at determinism_agents:run_agent:" in message
    assert "record(..., capture=('random', 'time', 'uuid'))" in message


# --- docs/replay.md shows real output ------------------------------------------------------------

_MASKS = [
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+"), "<when>"),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
    (re.compile(r"\d+(\.\d+)? ?(µs|ms)"), "<duration>"),
]


def _masked(text: str) -> str:
    for pattern, placeholder in _MASKS:
        text = pattern.sub(placeholder, text)
    return text


def _python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page, flags=re.S)


def test_the_replay_page_shows_what_capture_prints(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "replay.md").read_text(encoding="utf-8")
    section = page.split("## Time, randomness and the environment", 1)[1].split("\n## ", 1)[0]
    blocks = _python_blocks(section)
    support = blocks[0]
    undated = next(block for block in blocks if "undated.sftrace" in block)
    (tmp_path / "support.py").write_text(support, encoding="utf-8")
    (tmp_path / "undated.py").write_text(undated, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, env=env
        )

    done = run("support.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout in section
    shown = run("-m", "stepfork_otel.cli", "show", "dated.sftrace")
    captured = shown.stdout[shown.stdout.index("captured (") :]
    assert _masked(captured) in _masked(section)
    failed = run("undated.py")
    assert failed.returncode == 1
    message = failed.stderr.strip().splitlines()
    first = next(line for line in message if "ReplayMismatchError: " in line)
    assert first.startswith("stepfork_otel.replay.errors.ReplayMismatchError: at call 1")
    assert first.split(": ", 1)[1] in section
    assert "\n".join(message[-2:]) in section


# --- hostile bundles ----------------------------------------------------------------------------


def test_every_intercepted_source_is_a_known_source() -> None:
    from stepfork_otel.trace.captured import SOURCES

    assert determinism.intercepted_sources() == set(SOURCES)


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (
            lambda r: r.update(value="yesterday"),
            "the value of datetime.now is not an ISO date-time",
        ),
        (lambda r: r.update(source="os.system"), "captured read 2: unknown source os.system"),
        (lambda r: r.update(index=0), "captured read 0 is out of order"),
        (lambda r: r.update(before_call=9), "precedes call 9, not a call"),
        (lambda r: r.update(kind="env"), "an environment read names os.environ"),
        (lambda r: r.update(value=[1, 2]), "is not an ISO date-time"),
    ],
)
def test_a_damaged_captured_read_is_a_bundle_error_on_load(
    recording: Recording, tmp_path: Path, edit: Any, reason: str
) -> None:
    from stepfork_otel.trace.errors import BundleError

    def run() -> Any:
        first = time.time()
        return [first, echo(datetime.now().isoformat())]

    path = tmp_path / "run.sftrace"
    _record(path, run, "time")
    trace = Trace.load(path)
    data = trace.model_dump(mode="json")
    edit(data["captured"][1])
    damaged = tmp_path / "damaged.sftrace"
    Trace.model_validate(data).save(damaged)  # saved whole: the lines fingerprint agrees
    with pytest.raises(BundleError, match=re.escape(reason)):
        Trace.load(damaged)


# --- a killed run keeps its reads -------------------------------------------------------------------

KILLED = """
import os, signal, sys, time, uuid
from stepfork_otel import record, trace_tool

@trace_tool
def step(n: int, ident: str) -> int:
    return n

with record(sys.argv[1], capture=("uuid",)):
    step(1, str(uuid.uuid4()))
    step(2, str(uuid.uuid4()))
    time.sleep(1.5)  # past the flush bound (1 s): the calls above are on disk
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_run_keeps_the_reads_of_the_calls_it_wrote(tmp_path: Path) -> None:
    script = tmp_path / "killed.py"
    script.write_text(KILLED, encoding="utf-8")
    bundle = tmp_path / "killed.sftrace"
    done = subprocess.run(
        [sys.executable, str(script), str(bundle)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == -9, done.stderr
    trace = Trace.load(bundle)  # written as the run went: cut short, it loads incomplete
    assert not trace.complete
    assert [(r.source, r.before_call) for r in trace.captured] == [
        ("uuid.uuid4", 1),
        ("uuid.uuid4", 2),
    ]
    inputs = [json.loads(call.input or "{}")["ident"] for call in trace.calls]
    assert inputs == [r.value for r in trace.captured]


def test_the_replay_report_lists_the_captured_reads(
    recording: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepfork_otel.replay.report import format_report, report_data

    monkeypatch.setenv("STEPFORK_TEST_MODE", "a")

    def run() -> Any:
        os.environ.get("STEPFORK_TEST_MODE")
        return echo(str(uuid.uuid4()))

    path = tmp_path / "run.sftrace"
    _record(path, run, ("uuid", "env"))
    monkeypatch.setenv("STEPFORK_TEST_MODE", "b")
    _, session = _replay(path, run)
    report = format_report(session.summary, 1)
    assert report.startswith("Dependency-call matching: MATCHED")
    assert "   captured reads: 1 of 1 served" in report
    assert "   note: environment: STEPFORK_TEST_MODE differs from the recorded value" in report
    data = report_data(session.summary, 1)["captured_reads"]
    assert data["recorded"] == data["served"] == 1

    with ReplaySession.from_trace(path) as unread:
        pass
    left = format_report(unread.summary, 1)
    assert left.splitlines()[0].startswith("Dependency-call matching: DIVERGED")
    assert "not read: read 2 uuid.uuid4 at " in left


SITE_MODULE = """
import time
from stepfork_otel import trace_tool

@trace_tool
def echo(value):
    return value

def agent():
    stamp = time.time()
    return echo(stamp)
"""


def test_a_site_is_its_line_within_the_function(
    recording: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    monkeypatch.syspath_prepend(str(tmp_path))
    module = tmp_path / "site_agent.py"

    def load(source: str) -> Any:
        module.write_text(source, encoding="utf-8")
        sys.modules.pop("site_agent", None)
        importlib.invalidate_caches()
        return importlib.import_module("site_agent")

    agent = load(SITE_MODULE)
    path = tmp_path / "run.sftrace"
    with record(path, capture="time"):
        recorded = agent.agent()
    moved = load("import os\nimport sys\n# an edit elsewhere in the file\n" + SITE_MODULE)
    with ReplaySession.from_trace(path) as session:
        assert moved.agent() == recorded
    session.verify_complete()
    edited = load(
        SITE_MODULE.replace("    stamp = time.time()", "    # a new line\n    stamp = time.time()")
    )
    with (
        pytest.raises(ReplayMismatchError, match="captured read 1 differs"),
        ReplaySession.from_trace(path),
    ):
        edited.agent()


def test_monotonic_clocks_are_left_alone(recording: Recording, tmp_path: Path) -> None:
    originals = (time.monotonic, time.perf_counter, time.monotonic_ns, time.process_time)
    with record(tmp_path / "run.sftrace", capture="all"):
        assert (time.monotonic, time.perf_counter, time.monotonic_ns, time.process_time) == (
            originals
        )
        time.sleep(0.001)  # a timeout or a duration inside the run measures real time
    assert Trace.load(tmp_path / "run.sftrace").captured == []


def test_configure_sets_what_every_run_captures(recording: Recording, tmp_path: Path) -> None:
    from stepfork_otel import configure

    configure(capture=("uuid",))
    with record(tmp_path / "run.sftrace"):
        uuid.uuid4()
        time.time()
    trace = Trace.load(tmp_path / "run.sftrace")
    assert [r.source for r in trace.captured] == ["uuid.uuid4"]
    with record(tmp_path / "none.sftrace", capture=()):
        uuid.uuid4()
    assert Trace.load(tmp_path / "none.sftrace").captured == []
    with pytest.raises(ValueError, match="unknown source 'clock'"):
        configure(capture="clock")


CLI_AGENT = """
import time
import uuid

from stepfork_otel import record, trace_tool


@trace_tool
def ask(prompt: str) -> str:
    return prompt.upper()


def main() -> str:
    stamp = time.time()
    ident = str(uuid.uuid4())
    return ask(f"request {ident}")


if __name__ == "__main__":
    with record("cli.sftrace", capture=("time", "uuid")) as run:
        run.set_output(main())
"""


def test_stepfork_replay_serves_captured_reads_and_takes_captured_lenient(tmp_path: Path) -> None:
    (tmp_path / "cli_agent.py").write_text(CLI_AGENT, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, env=env
        )

    assert run("cli_agent.py").returncode == 0
    replay = ["-m", "stepfork_otel.cli", "replay", "cli.sftrace", "--entrypoint", "cli_agent:main"]
    same = run(*replay)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "captured reads: 2 of 2 served" in same.stdout
    # the clock is no longer read: the uuid read moves up a line, a different site
    (tmp_path / "cli_agent.py").write_text(
        CLI_AGENT.replace("    stamp = time.time()\n", ""), encoding="utf-8"
    )
    strict = run(*replay)
    assert strict.returncode == 1
    assert "captured read 1 differs from the recording: this run read uuid.uuid4" in strict.stdout
    lenient = run(*replay, "--captured", "lenient")
    assert "note: read live (captured='lenient'): captured read 1 differs" in lenient.stdout
    assert lenient.returncode == 1  # the live uuid changed the call's input


INSTALLED_AGENT = """
import time
import uuid
from datetime import datetime

from stepfork_otel import trace_tool


@trace_tool
def ask(prompt: str) -> str:
    return prompt.upper()


def main() -> str:
    return ask(f"request {uuid.uuid4()} at {time.time()} on {datetime.now():%A}")
"""


def test_an_agent_installed_as_a_package_is_captured_once_named(
    recording: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Code under ``site-packages`` is a library's, its reads not the run's -- unless
    ``configure(capture_packages=...)`` names its package: then it records and replays like the
    run's own code (the sites are by module name, so the same wherever it is installed)."""
    from stepfork_otel import configure

    installed = tmp_path / "lib" / "site-packages" / "acme_agent"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text(INSTALLED_AGENT, "utf-8")
    monkeypatch.syspath_prepend(str(installed.parent))
    monkeypatch.delitem(sys.modules, "acme_agent", raising=False)
    import acme_agent  # type: ignore[import-not-found]

    _, unnamed = _record(tmp_path / "unnamed.sftrace", acme_agent.main, ("time", "uuid"))
    assert unnamed.captured == []  # an installed package's reads: not the run's

    configure(capture_packages="acme_agent")
    try:
        recorded, trace = _record(tmp_path / "named.sftrace", acme_agent.main, ("time", "uuid"))
        assert [(r.source, r.module, r.function) for r in trace.captured] == [
            ("uuid.uuid4", "acme_agent", "main"),
            ("time.time", "acme_agent", "main"),
            ("datetime.now", "acme_agent", "main"),  # its own name for datetime, replaced too
        ]
        replayed, session = _replay(tmp_path / "named.sftrace", acme_agent.main)
        assert replayed == recorded
        session.verify_complete()
    finally:
        configure(capture_packages=())
    _, again = _record(tmp_path / "again.sftrace", acme_agent.main, ("time", "uuid"))
    assert again.captured == []  # the verdicts are made again when the setting changes


def test_capture_packages_takes_import_names_only() -> None:
    from stepfork_otel import configure

    for wrong, error, says in (
        ("my agent", ValueError, "not a package's import name"),
        ("", ValueError, "not a package's import name"),
        ([3], TypeError, "package names"),
        ("stepfork_otel.recording", ValueError, "never captured"),
        ("stepfork_otel", ValueError, "never captured"),
    ):
        with pytest.raises(error, match=says):
            configure(capture_packages=wrong)  # type: ignore[arg-type]
