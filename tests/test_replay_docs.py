"""``docs/replay.md`` shows real output: each pasted output block is produced again here, against
the example agent's bundles, and must appear in the page (fingerprints masked, so regenerating
the example bundles does not break the page)."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ROOT

from examples import booking_agent
from examples.booking_agent import run_agent
from stepfork_otel import RecordedDependencyError, ReplayPolicyError, ReplaySession, Trace
from stepfork_otel.assertions import assert_tool_not_called, assert_tool_sequence

DOC = ROOT / "docs" / "replay.md"
FAILURE = "failure.sftrace"
SUCCESS = "success.sftrace"
_BUNDLES: list[Path] = []


@pytest.fixture(scope="module", autouse=True)
def _example_bundles(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The example's bundles, recorded afresh exactly as the docs made them: by running
    `python examples/booking_agent.py` (so recorded types from `__main__` have bare names)."""
    out = tmp_path_factory.mktemp("examples_out")
    subprocess.run(
        [sys.executable, "examples/booking_agent.py", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    _BUNDLES[:] = [out]


def _bundle(name: str) -> Path:
    return _BUNDLES[0] / name


def _mask(text: str) -> str:
    text = re.sub(r"\b[0-9a-f]{64}\b", "<sha256>", text)
    return re.sub(r"\b[0-9a-f]{12}…", "<sha256…>", text)


def _raised(body: Callable[[], object]) -> str:
    with pytest.raises(BaseException) as caught:
        body()
    error = caught.value
    module = type(error).__module__
    prefix = "" if module == "builtins" else f"{module}."
    return f"{prefix}{type(error).__qualname__}: {error}"


def _frozen_failure() -> str:
    lines: list[str] = []
    with ReplaySession.from_trace(_bundle(FAILURE), mode="frozen") as replay:
        try:
            run_agent("Book me the cheapest flight to Paris.")
        except RecordedDependencyError as exc:
            lines.append(f"{type(exc).__name__} | {exc.error_type} | {exc.message}")
        replay.verify_complete()
    lines.append(str(replay.summary))
    return "\n".join(lines)


def _prompt_drift() -> None:
    with ReplaySession.from_trace(_bundle(FAILURE)):
        run_agent("Book me the cheapest flight to Paris, please.")


def _hybrid() -> None:
    with ReplaySession.from_trace(
        _bundle(FAILURE), mode="hybrid", live_llms={"openai/gpt-4.1-mini"}
    ):
        run_agent("Book me the cheapest flight to London.")


def _live() -> None:
    with ReplaySession.from_trace(_bundle(FAILURE), mode="live"):
        run_agent("Book me the cheapest flight to Paris.")


def _forbidden_policy() -> None:
    with ReplaySession.from_trace(_bundle(SUCCESS)):
        run_agent("Book me the cheapest flight to London.")


def _never_ran() -> None:
    with ReplaySession.from_trace(_bundle(FAILURE)) as replay:
        pass
    replay.verify_complete()


def _assertion() -> None:
    with ReplaySession.from_trace(_bundle(FAILURE)) as replay:
        with contextlib.suppress(RecordedDependencyError):
            run_agent("Book me the cheapest flight to Paris.")
        replay.verify_complete()
    assert_tool_sequence(replay, ["search_flights", "book_flight"])
    assert_tool_not_called(replay, "book_flight")


def _tampered() -> None:
    trace = Trace.load(_bundle(FAILURE))
    call = trace.calls[1]
    events = [
        e.model_copy(update={"input": (call.input or "").replace("Paris", "Lyon")})
        if e is call
        else e
        for e in trace.events
    ]
    ReplaySession.from_trace(trace.model_copy(update={"events": events}))


@contextlib.contextmanager
def _full_flights_hidden() -> Iterator[None]:
    """The fix the page's fork tries: full flights never reach the model."""
    search = booking_agent.search_flights
    booking_agent.search_flights = lambda **args: [  # type: ignore[assignment]
        f for f in search(**args) if f["seats_left"]
    ]
    try:
        yield
    finally:
        booking_agent.search_flights = search


def _fork() -> str:
    lines: list[str] = []
    fork_path = _BUNDLES[0] / "fixed.sftrace"
    with (
        _full_flights_hidden(),
        ReplaySession.from_trace(
            _bundle(FAILURE), fork_at=3, record_to=fork_path, allow_live_tools=["book_flight"]
        ) as fork,
    ):
        try:
            run_agent("Book me the cheapest flight to Paris.")
        except ReplayPolicyError as exc:
            lines.append(f"stopped: {exc.reason}")
    assert fork.fork_bundle == fork_path
    lines.append(str(fork.summary))
    return "\n".join(lines)


def _fork_prefix_differs() -> None:
    with (
        _full_flights_hidden(),
        ReplaySession.from_trace(
            _bundle(FAILURE), fork_at=3, record_to=_BUNDLES[0] / "lyon.sftrace"
        ),
    ):
        run_agent("Book me the cheapest flight to Lyon.")


SCENARIOS: dict[str, Callable[[], str]] = {
    "frozen replay and summary": _frozen_failure,
    "prompt drift": lambda: _raised(_prompt_drift),
    "hybrid": lambda: _raised(_hybrid),
    "live without allowlist": lambda: _raised(_live),
    "forbidden policy": lambda: _raised(_forbidden_policy),
    "verify_complete": lambda: _raised(_never_ran),
    "assertion": lambda: _raised(_assertion),
    "integrity": lambda: _raised(_tampered),
    "fork": _fork,
    "fork prefix differs": lambda: _raised(_fork_prefix_differs),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_pasted_output_is_real(name: str) -> None:
    output = SCENARIOS[name]()
    assert _mask(output) in _mask(DOC.read_text(encoding="utf-8")), output


def test_doc_names_every_error() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name in (
        "ReplayError",
        "ReplayMismatchError",
        "ReplayExhaustedError",
        "ReplayPolicyError",
        "RecordedDependencyError",
        "ReplayModeError",
        "ReplaySessionError",
        "BundleIntegrityError",
    ):
        assert f"`{name}`" in text, name
