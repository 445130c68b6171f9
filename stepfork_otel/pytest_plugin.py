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

* **Record once, replay forever** (``@pytest.mark.stepfork``): the test's bundle is a cassette.
  ``--stepfork-record-mode`` (or the ini option ``stepfork_record_mode``, or ``STEPFORK_RECORD_MODE``;
  the command line wins, then the environment) is ``none`` (the default: replay; a missing bundle
  fails the test with the command that records it), ``once`` (record a missing bundle, replay an
  existing one) or ``all`` (re-record). While a test records, its live calls are allowed (the
  live-LLM guard is lifted for it alone); the bundle is written to a temporary name and moved into
  place when the test passes, or kept as ``<name>.failed.sftrace`` -- never replayed -- when it
  fails. Replay is the strict replay of ``stepfork_replay``: frozen unless the marker says
  otherwise, network guard on, ``verify_complete()`` at the end. The default bundle path is
  ``<test dir>/bundles/<module>/<test>[<params>].sftrace``; ``@pytest.mark.stepfork("x.sftrace")``
  or ``bundle=`` overrides it, and two tests never share one. ``capture=("time", "uuid")`` (any
  ``record(capture=...)`` value) records the clock/random/uuid reads the test makes, and replay
  serves them (``captured="lenient"`` reads live where they depart). The run ends with a summary of the
  bundles replayed, recorded, missing and failed, and a warning for any recorded bundle holding the
  value of a secret-looking environment variable. State travels in each test's report
  (``user_properties``), so the summary is whole under pytest-xdist too.

Why the exported test uses this plugin rather than a bare ``ReplaySession``: the divergence report
is then written by one piece of code for both, and the test body shows only the agent call and the
recorded outcome. ``expect_recorded_failure`` and ``assert_recorded_output`` are the outcome
checks the exported test uses; they give the same verdicts as ``stepfork replay``.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import pytest

if TYPE_CHECKING:
    from stepfork_otel.replay.session import ReplaySession

# The entry point loads this module in every pytest run of every project that installs
# stepfork-otel, so it imports nothing of stepfork (nor the OTel SDK) until a test uses it.

MARKER = "stepfork_replay"
ALLOW_LIVE_LLM_MARKER = "stepfork_allow_live_llm"
CASSETTE_MARKER = "stepfork"
RECORD_MODES = ("none", "once", "all")
RECORD_MODE_ENV = "STEPFORK_RECORD_MODE"  # = constants.ENV_RECORD_MODE (not imported: see below)

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
    group.addoption(
        "--stepfork-record-mode",
        choices=RECORD_MODES,
        default=None,
        help="stepfork: for tests marked @pytest.mark.stepfork -- none (replay; default), once "
        f"(record missing bundles), all (re-record); also ${RECORD_MODE_ENV}",
    )
    parser.addini(
        "stepfork_record_mode",
        default="none",
        help="stepfork: the default of --stepfork-record-mode",
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
    config.addinivalue_line(
        "markers",
        f"{CASSETTE_MARKER}(bundle=None, mode='frozen', allow_live_tools=(), live_llms=(), "
        "approve=None, allow_network=(), verify_complete=True, capture=None, captured='strict'): "
        "record the test's dependency calls "
        "once into its bundle, replay them from then on (see --stepfork-record-mode)",
    )
    _record_mode(config)  # a bad value is a usage error before any test runs
    config.pluginmanager.register(BundleSummary(config), "stepfork-bundle-summary")


# --- the replay session --------------------------------------------------------------------------


def _session_for(item: pytest.Item) -> ReplaySession | None:
    """The item's session, built on first use from its marker (None without the marker, or for
    a ``stepfork`` test that records)."""
    if _SESSION in item.stash:
        return item.stash[_SESSION]
    cassette = item.stash.get(_CASSETTE, None)
    if cassette is not None:
        if cassette.action != "replay":
            return None
        marker, path = cassette.marker, cassette.path
    else:
        replay_marker = item.get_closest_marker(MARKER)
        if replay_marker is None:
            return None
        if len(replay_marker.args) != 1:
            pytest.fail(
                f"@pytest.mark.{MARKER} takes one bundle path, e.g. {MARKER}('run.sftrace')"
            )
        marker, path = replay_marker, Path(replay_marker.args[0])
        if not path.is_absolute():
            path = item.path.parent / path
    options = dict(marker.kwargs)
    options.pop("verify_complete", None)
    options.pop("bundle", None)
    options.pop("capture", None)  # what recording captured; replay serves whatever the bundle has
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
    cassette = item.stash.get(_CASSETTE, None)
    if cassette is not None and cassette.action == "record":
        return (yield from _recording(item, cassette))
    if cassette is not None and cassette.action == "missing":
        _fail(cassette.missing_message(item))
    session = _session_for(item)
    if session is None:
        result = yield
        _fail_if_blocked(item)
        return result
    from stepfork_otel.replay.errors import ReplayError

    verbose = item.config.get_verbosity() > 0
    marker = cassette.marker if cassette is not None else item.get_closest_marker(MARKER)
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
        or item.get_closest_marker(CASSETTE_MARKER) is not None
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
    cassette = _cassette_for(item)
    recording = cassette is not None and cassette.action == "record"
    if (
        not _active(item)
        or recording  # the live-LLM guard is lifted for a test that records, and for it alone
        or item.get_closest_marker(ALLOW_LIVE_LLM_MARKER) is not None
    ):
        return (yield)
    from stepfork_otel.recording import boundaries

    blocked: list[str] = []
    item.stash[_BLOCKED] = blocked
    previous = boundaries.set_live_llm_guard(_guard(blocked))
    try:
        return (yield)
    finally:
        boundaries.set_live_llm_guard(previous)


# --- record once, replay forever: @pytest.mark.stepfork ------------------------------------------

Action = Literal["replay", "record", "missing"]

_CASSETTE = pytest.StashKey["_Cassette | None"]()
_PATHS = pytest.StashKey[dict[Path, str]]()
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+,\[\]-]+")
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|AUTH|CREDENTIAL|PRIVATE", re.IGNORECASE)
_MIN_SECRET_CHARS = 8


@dataclass
class _Cassette:
    """The bundle of one ``stepfork`` test and what this run does with it."""

    marker: pytest.Mark
    path: Path
    action: Action
    mode: str
    notes: list[str] = field(default_factory=list)

    def missing_message(self, item: pytest.Item) -> str:
        return (
            f"stepfork: no bundle at {_shown(item.config, self.path)} (record mode none): "
            f"record it once with\n    pytest --stepfork-record-mode=once '{item.nodeid}'\n"
            "(the test then runs against the real services and the bundle is written)"
        )

    @property
    def failed_path(self) -> Path:
        return self.path.with_name(self.path.name.removesuffix(".sftrace") + ".failed.sftrace")

    @property
    def recording_path(self) -> Path:
        return self.path.with_name(self.path.name.removesuffix(".sftrace") + ".recording.sftrace")


def _record_mode(config: pytest.Config) -> str:
    mode = config.getoption("stepfork_record_mode") or os.environ.get(RECORD_MODE_ENV)
    mode = mode or config.getini("stepfork_record_mode") or "none"
    if mode not in RECORD_MODES:
        raise pytest.UsageError(
            f"stepfork: record mode {mode!r} is not one of {', '.join(RECORD_MODES)} "
            f"(--stepfork-record-mode, ${RECORD_MODE_ENV}, ini stepfork_record_mode)"
        )
    return str(mode)


def _shown(config: pytest.Config, path: Path) -> str:
    try:
        return str(path.relative_to(config.rootpath))
    except ValueError:
        return str(path)


def default_bundle_path(item: pytest.Item) -> Path:
    """``<test dir>/bundles/<module>/<test>[<params>].sftrace``, with file-safe names."""
    parts = item.nodeid.split("::")[1:] or [item.name]
    name = _UNSAFE.sub("_", ".".join(parts))[:150]
    return item.path.parent / "bundles" / item.path.stem / f"{name}.sftrace"


def _bundle_path(item: pytest.Item, marker: pytest.Mark) -> Path:
    given = marker.args[0] if marker.args else marker.kwargs.get("bundle")
    if given is None:
        return default_bundle_path(item)
    path = Path(given)
    return path if path.is_absolute() else item.path.parent / path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A bundle path belongs to one test: the second test to claim it fails at setup."""
    owners: dict[Path, str] = {}
    for item in items:
        marker = item.get_closest_marker(CASSETTE_MARKER)
        if marker is None:
            continue
        if len(marker.args) > 1:
            raise pytest.UsageError(
                f"{item.nodeid}: @pytest.mark.{CASSETTE_MARKER} takes at most one bundle path"
            )
        path = _bundle_path(item, marker).resolve()
        owners.setdefault(path, item.nodeid)
    config.stash[_PATHS] = owners


def _cassette_for(item: pytest.Item) -> _Cassette | None:
    if _CASSETTE in item.stash:
        return item.stash[_CASSETTE]
    marker = item.get_closest_marker(CASSETTE_MARKER)
    cassette = None
    if marker is not None:
        path = _bundle_path(item, marker)
        owner = item.config.stash.get(_PATHS, {}).get(path.resolve(), item.nodeid)
        if owner != item.nodeid:
            item.stash[_CASSETTE] = None
            pytest.fail(
                f"stepfork: the bundle {_shown(item.config, path)} belongs to {owner}; "
                "give this test its own (@pytest.mark.stepfork('other.sftrace'))",
                pytrace=False,
            )
        mode = _record_mode(item.config)
        exists = path.is_file()
        action: Action
        if mode == "all" or (mode == "once" and not exists):
            action = "record"
        else:
            action = "replay" if exists else "missing"
        cassette = _Cassette(marker, path, action, mode)
    item.stash[_CASSETTE] = cassette
    return cassette


def _secrets_in(text: str) -> list[str]:
    """Names of secret-looking environment variables whose value the bundle holds."""
    return sorted(
        name
        for name, value in os.environ.items()
        if _SECRET_NAME.search(name) and len(value) >= _MIN_SECRET_CHARS and value in text
    )


def _recording(item: pytest.Item, cassette: _Cassette) -> Generator[None, object, object]:
    """Run the test body inside ``record(...)``; move the bundle into place when it passes."""
    from stepfork_otel.otel.run import record

    target, temporary = cassette.path, cassette.recording_path
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary.unlink(missing_ok=True)
    entry: dict[str, Any] = {"path": _shown(item.config, target), "nodeid": item.nodeid}
    try:
        with record(temporary, name=item.name, capture=cassette.marker.kwargs.get("capture")):
            result = yield
    except BaseException:
        if temporary.exists():
            os.replace(temporary, cassette.failed_path)
        entry.update(action="failed", failed=_shown(item.config, cassette.failed_path))
        item.add_report_section(
            "call",
            "stepfork",
            f"the test failed while recording: its calls are kept in {entry['failed']} "
            "(not used for replay); fix the test and record again",
        )
        _note(item, entry)
        raise
    existed = target.exists()
    os.replace(temporary, target)
    cassette.path.with_name(cassette.failed_path.name).unlink(missing_ok=True)
    entry.update(action="re-recorded" if existed else "recorded")
    leaked = _secrets_in(target.read_text(encoding="utf-8", errors="replace"))
    if leaked:
        entry["secrets"] = leaked
    _note(item, entry)
    return result


def _note(item: pytest.Item, entry: dict[str, Any]) -> None:
    item.user_properties.append(("stepfork", entry))


@pytest.hookimpl(tryfirst=True)  # before the report is made: it copies user_properties
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    cassette = item.stash.get(_CASSETTE, None)
    if cassette is None or call.when != "call" or cassette.action == "record":
        return
    entry = {"path": _shown(item.config, cassette.path), "nodeid": item.nodeid}
    if cassette.action == "missing":
        entry["action"] = "missing"
    else:
        entry["action"] = "replayed" if call.excinfo is None else "failed replay"
    _note(item, entry)


class BundleSummary:
    """What every ``stepfork`` test did with its bundle, read from the test reports (so a
    pytest-xdist controller sees its workers' tests too), shown at the end of the run."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.entries: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for key, value in report.user_properties:
            if key == "stepfork" and isinstance(value, dict):
                self.entries.append(value)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.entries:
            return
        by_action: dict[str, list[dict[str, Any]]] = {}
        for entry in self.entries:
            by_action.setdefault(entry["action"], []).append(entry)
        write = terminalreporter.write_line
        terminalreporter.section("stepfork bundles")
        counts = ", ".join(
            f"{len(by_action.get(a, []))} {a}"
            for a in ("replayed", "failed replay", "recorded", "re-recorded", "missing", "failed")
        )
        write(f"{counts} (record mode {_record_mode(self.config)})")
        for action in ("recorded", "re-recorded", "missing", "failed"):
            for entry in sorted(by_action.get(action, []), key=lambda e: str(e["nodeid"])):
                where = entry.get("failed") if action == "failed" else entry["path"]
                write(f"  {action:<11} {where}  ({entry['nodeid']})")
        if by_action.get("missing"):
            write("  record the missing bundles with: pytest --stepfork-record-mode=once")
        if by_action.get("re-recorded"):
            write(
                "  review a re-recorded bundle call by call: git show HEAD:<bundle> > "
                "/tmp/old.sftrace && stepfork diff /tmp/old.sftrace <bundle>"
            )
        for entry in self.entries:
            for name in entry.get("secrets", []):
                write(
                    f"  WARNING: {entry['path']} contains the value of ${name}: a secret "
                    "slipped through redaction; add a rule (--redaction-rules) and record again",
                    red=True,
                )


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
