"""pytest integration: replay a bundle around a test, and keep live LLM calls out of tests.

Installed as the ``pytest11`` entry point ``stepfork`` and opt-in: loading it registers markers,
a fixture and an option, and changes nothing for a test that uses none of them.

* ``@pytest.mark.stepfork_replay(path, mode="frozen", allow_live_tools=(), live_llms=(),
  approve=None, allow_network=(), verify_complete=True)`` replays the bundle around the test body: the session is
  entered just before the test function runs and left just after (fixtures are not replayed). A
  relative ``path`` is relative to the test file. The ``stepfork_replay`` fixture is that
  session, so the test can call ``verify_complete()``, read ``calls`` or run the assertions.
* When replay raises (a mismatch, a policy refusal, a left-over call, or a divergence the agent
  caught), the test fails with the same dependency-call report that ``stepfork replay`` prints --
  so a test exported by ``stepfork export pytest`` and a hand-written one fail the same way.
  After a passing body the plugin checks that every recorded call was made (unless
  ``verify_complete=False``).
* **No live LLM calls in tests.** While the plugin is active -- for a test with the
  ``stepfork_replay`` marker, or for every test with ``--stepfork`` or the ini option
  ``stepfork = true`` -- an ``llm_request``/``allm_request`` that would run its ``call`` outside
  a replay session fails the test, unless the test is marked ``stepfork_allow_live_llm``. The
  check is the documented switch ``stepfork_otel.recording.boundaries.set_live_llm_guard`` (a global,
  like pydantic-ai's ``ALLOW_MODEL_REQUESTS``, so calls from threads are covered too); it raises
  pytest's ``Failed``, a ``BaseException`` that an agent's ``except Exception`` cannot swallow,
  and the plugin fails the test even if something swallowed it anyway. Calls inside a replay
  session are the session's business: in ``live``/``hybrid`` mode running the LLM is the point.

Why the exported test uses this plugin rather than a bare ``ReplaySession``: the divergence report
is then written by one piece of code for both, and the test body shows only the agent call and the
recorded outcome. ``expect_recorded_failure`` and ``assert_recorded_output`` are the outcome
checks the exported test uses; they give the same verdicts as ``stepfork replay``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    from stepfork_otel.replay.session import ReplaySession

# The entry point loads this module in every pytest run of every project that installs
# stepfork-otel, so it imports nothing of stepfork (nor the OTel SDK) until a test uses it.

MARKER = "stepfork_replay"
ALLOW_LIVE_LLM_MARKER = "stepfork_allow_live_llm"

_SESSION = pytest.StashKey["ReplaySession"]()
_BLOCKED = pytest.StashKey[list[str]]()

__all__ = ["assert_recorded_output", "expect_recorded_failure", "stepfork_replay"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("stepfork", "stepfork_otel")
    group.addoption(
        "--stepfork",
        action="store_true",
        default=False,
        help="stepfork: fail any test that makes a live LLM call outside a replay session "
        f"(unless marked {ALLOW_LIVE_LLM_MARKER})",
    )
    parser.addini(
        "stepfork",
        type="bool",
        default=False,
        help="stepfork: same as --stepfork, for every run",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(path, mode='frozen', allow_live_tools=(), live_llms=(), approve=None, "
        "allow_network=(), verify_complete=True): replay a .sftrace bundle around the test body",
    )
    config.addinivalue_line(
        "markers",
        f"{ALLOW_LIVE_LLM_MARKER}: this test may make live LLM calls while stepfork is active",
    )


# --- the replay session --------------------------------------------------------------------------


def _session_for(item: pytest.Item) -> ReplaySession | None:
    """The item's session, built on first use from its marker (None without the marker)."""
    if _SESSION in item.stash:
        return item.stash[_SESSION]
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return None
    options = dict(marker.kwargs)
    options.pop("verify_complete", None)
    if len(marker.args) != 1:
        pytest.fail(f"@pytest.mark.{MARKER} takes one bundle path, e.g. {MARKER}('run.sftrace')")
    path = Path(marker.args[0])
    if not path.is_absolute():
        path = item.path.parent / path
    from stepfork_otel.replay.errors import ReplayError
    from stepfork_otel.replay.session import ReplaySession
    from stepfork_otel.trace.errors import BundleError

    try:
        session = ReplaySession.from_trace(path, **options)
    except (BundleError, ReplayError, TypeError, ValueError) as exc:
        pytest.fail(f"{MARKER}: {exc}", pytrace=False)
    item.stash[_SESSION] = session
    return session


@pytest.fixture
def stepfork_replay(request: pytest.FixtureRequest) -> ReplaySession:
    """The replay session of ``@pytest.mark.stepfork_replay(...)``, active during the test body."""
    session = _session_for(request.node)
    if session is None:
        pytest.fail(
            f"the {MARKER} fixture needs the marker: @pytest.mark.{MARKER}('path.sftrace')",
            pytrace=False,
        )
    return session


def replay_report(session: ReplaySession, verbose: bool, raised: BaseException | None) -> str:
    """The failure message of a replay test: a line naming the bundle, then the matching report
    ``stepfork replay`` prints (:func:`stepfork_otel.replay.report.format_report`)."""
    from stepfork_otel.replay.errors import ReplayError
    from stepfork_otel.replay.outcome import describe_exception
    from stepfork_otel.replay.report import format_report

    where = f"{Path(session.source).name} " if session.source else ""
    lines = [
        f"stepfork replay of {where}(mode {session.mode.value}) diverged from the recording",
        format_report(session.summary, len(session.trace.calls), verbose=verbose),
    ]
    if raised is not None and not isinstance(raised, ReplayError):
        lines.append(f"the test then raised {describe_exception(raised)}")
    return "\n".join(lines)


def _fail(message: str) -> NoReturn:
    # `from None`: the replay error is in the report already; its traceback would only repeat it
    raise pytest.fail.Exception(message, pytrace=False) from None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    session = _session_for(item)
    if session is None:
        result = yield
        _fail_if_blocked(item)
        return result
    from stepfork_otel.replay.errors import ReplayError

    verbose = item.config.get_verbosity() > 0
    marker = item.get_closest_marker(MARKER)
    check_complete = bool(marker.kwargs.get("verify_complete", True)) if marker else True
    with session:
        try:
            result = yield
        except Exception as exc:
            _fail_if_blocked(item)
            if session.errors:  # the root cause, even when the test failed on something else
                _fail(replay_report(session, verbose, exc))
            raise
    _fail_if_blocked(item)
    if session.errors:  # a divergence the agent (or the test) caught
        _fail(replay_report(session, verbose, None))
    if check_complete:
        try:
            session.verify_complete()
        except ReplayError:
            _fail(replay_report(session, verbose, None))
    return result


# --- live LLM calls ------------------------------------------------------------------------------


def _active(item: pytest.Item) -> bool:
    config = item.config
    return bool(
        item.get_closest_marker(MARKER) is not None
        or config.getoption("stepfork")
        or config.getini("stepfork")
    )


def _guard(blocked: list[str]) -> Callable[[str, str], None]:
    def guard(provider: str, model: str) -> None:
        message = (
            f"live LLM call to {provider}/{model} blocked: the stepfork pytest plugin is active. "
            f"Replay a bundle (@pytest.mark.{MARKER}(...)) or let this test call models with "
            f"@pytest.mark.{ALLOW_LIVE_LLM_MARKER}"
        )
        blocked.append(message)
        pytest.fail(message, pytrace=False)

    return guard


def _fail_if_blocked(item: pytest.Item) -> None:
    blocked = item.stash.get(_BLOCKED, [])
    if blocked:  # the Failed may have been swallowed by the agent; the test fails anyway
        pytest.fail(blocked[0], pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    if not _active(item) or item.get_closest_marker(ALLOW_LIVE_LLM_MARKER) is not None:
        return (yield)
    from stepfork_otel.recording import boundaries

    blocked: list[str] = []
    item.stash[_BLOCKED] = blocked
    previous = boundaries.set_live_llm_guard(_guard(blocked))
    try:
        return (yield)
    finally:
        boundaries.set_live_llm_guard(previous)


# --- outcome checks used by exported tests ------------------------------------------------------


@contextlib.contextmanager
def expect_recorded_failure(error_type: str) -> Iterator[None]:
    """The block must fail as the recorded run did: raise ``error_type`` itself, or the
    :class:`RecordedDependencyError` replaying a dependency's recorded ``error_type``. Only the
    type is compared (``__main__`` tolerated), not the message or side effects. A divergence is
    re-raised so the plugin reports it."""
    from stepfork_otel.replay.errors import RecordedDependencyError, ReplayError
    from stepfork_otel.replay.outcome import describe_exception, reproduces_failure, same_type_name

    try:
        yield
    except RecordedDependencyError as exc:
        if not same_type_name(error_type, exc.error_type):
            raise
        return
    except ReplayError:
        raise
    except Exception as exc:
        if reproduces_failure(error_type, exc):
            return
        pytest.fail(
            f"the recorded run failed with {error_type}; this run raised {describe_exception(exc)}",
            pytrace=False,
        )
    pytest.fail(
        f"the recorded run failed with {error_type}; this run returned without raising",
        pytrace=False,
    )


def assert_recorded_output(output: Any, recorded_sha256: str, recorded: str | None = None) -> None:
    """The replayed return value, redacted and canonicalised as recording does, must have the
    recorded output fingerprint. ``recorded`` (the recorded canonical JSON) is only shown."""
    from stepfork_otel.replay.outcome import output_payload
    from stepfork_otel.replay.report import report_preview
    from stepfork_otel.trace.canonical import short_fingerprint

    payload = output_payload(output)
    if payload.sha256 == recorded_sha256:
        return
    pytest.fail(
        "the output differs from the recorded run output\n"
        f"  recorded: {report_preview(recorded)}  sha256 {short_fingerprint(recorded_sha256)}\n"
        f"  this run: {report_preview(payload.text)}  sha256 {short_fingerprint(payload.sha256)}",
        pytrace=False,
    )
