"""``stepfork export pytest``: the generated test passes on the code that produced the bundle and
fails -- with the divergence report -- when the agent's behaviour changes. Both are checked by
running pytest in a subprocess on the generated file, against a copy of the agent in tmp_path."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from cli_support import ENTRYPOINT, HANG_GUARD_SECONDS, Bundles, agent_copy, bundles, stepfork

from stepfork_otel import Trace

__all__ = ["bundles"]

PYTEST_INI = """[pytest]
filterwarnings = error
asyncio_default_fixture_loop_scope = function
"""


def _pytest(project: Path, test_file: Path) -> subprocess.CompletedProcess[str]:
    (project / "pytest.ini").write_text(PYTEST_INI)
    return subprocess.run(
        [sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
    )


def _project(tmp_path: Path, bundle: Path, old: str = "", new: str = "") -> Path:
    """A copy of the example agent (changed if asked) with the bundle beside the tests."""
    project = agent_copy(tmp_path, old or "max_results: int = 5", new or "max_results: int = 5")
    (project / "tests").mkdir()
    shutil.copyfile(bundle, project / "tests" / bundle.name)
    return project


def test_exported_failure_passes_then_fails_when_the_agent_changes(
    bundles: Bundles, tmp_path: Path
) -> None:
    project = _project(tmp_path, bundles.failure)
    out = project / "tests" / "test_failure_replay.py"
    exported = stepfork(
        "export", "pytest", "tests/failure.sftrace", "--entrypoint", ENTRYPOINT, "-o", out,
        cwd=project,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.splitlines()[0] == (
        f"wrote {out} (frozen replay of tests/failure.sftrace; expects SeatUnavailableError)"
    )
    text = out.read_text()
    assert 'BUNDLE = Path(__file__).parent / "failure.sftrace"' in text
    assert 'RECORDED_INPUT = {"question": "Book me the cheapest flight to Paris."}' in text
    assert 'RECORDED_FAILURE = "SeatUnavailableError"' in text
    assert '@pytest.mark.stepfork_replay(BUNDLE, mode="frozen")' in text
    assert "        run_agent(**RECORDED_INPUT)\n    stepfork_replay.verify_complete()" in text
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--isolated", str(out)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
    )
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr  # readable as written

    passing = _pytest(project, out)
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert "1 passed" in passing.stdout

    # the agent changes: a tool default now differs from the recording
    agent = project / "examples" / "booking_agent.py"
    agent.write_text(agent.read_text().replace("max_results: int = 5", "max_results: int = 3"))
    failing = _pytest(project, out)
    assert failing.returncode == 1, failing.stdout
    assert "1 failed" in failing.stdout
    report = failing.stdout
    assert "diverged from the recording" in report
    assert "Dependency-call matching: DIVERGED at call 2 (1 of 4 recorded calls matched)" in report
    assert "first divergence (ReplayMismatchError):" in report
    assert '"max_results":3' in report


def test_exported_failure_fails_when_the_agent_no_longer_fails(
    bundles: Bundles, tmp_path: Path
) -> None:
    project = _project(
        tmp_path,
        bundles.failure,
        "            result = book_flight(**args)",
        "            try:\n                result = book_flight(**args)\n"
        "            except Exception:\n                return 'sorry'",
    )
    out = project / "tests" / "test_failure_replay.py"
    assert stepfork(
        "export", "pytest", "tests/failure.sftrace", "--entrypoint", ENTRYPOINT, "-o", out,
        cwd=project,
    ).returncode == 0  # fmt: skip
    failing = _pytest(project, out)
    assert failing.returncode == 1
    assert (
        "the recorded run failed with SeatUnavailableError; this run returned without raising"
        in failing.stdout
    )


def test_exported_success_needs_the_forbidden_charge_approved(
    bundles: Bundles, tmp_path: Path
) -> None:
    project = _project(tmp_path, bundles.success)
    unapproved = project / "tests" / "test_unapproved.py"
    exported = stepfork(
        "export", "pytest", "tests/success.sftrace", "--entrypoint", ENTRYPOINT, "-o", unapproved,
        cwd=project,
    )  # fmt: skip
    assert exported.returncode == 0
    assert exported.stderr == (
        "stepfork: note: call-6 (charge_card) has replay policy 'forbidden': the exported test "
        "fails at it unless approved with --approve call-6\n"
    )
    approved = project / "tests" / "test_approved.py"
    assert stepfork(
        "export", "pytest", "tests/success.sftrace", "--entrypoint", ENTRYPOINT, "-o", approved,
        "--approve", "call-6", cwd=project,
    ).returncode == 0  # fmt: skip
    text = approved.read_text()
    assert 'APPROVED_CALLS = {"call-6"}' in text
    assert '@pytest.mark.stepfork_replay(BUNDLE, mode="manual", approve=approve)' in text
    assert """RECORDED_OUTPUT = '"Booked and paid: captured."'""" in text
    assert "assert_recorded_output(output, RECORDED_OUTPUT_SHA256, RECORDED_OUTPUT)" in text

    both = _pytest(project, project / "tests")
    assert both.returncode == 1, both.stdout
    assert "1 failed, 1 passed" in both.stdout
    assert "FAILED tests/test_unapproved.py::test_success_replays" in both.stdout
    assert "replay policy 'forbidden'" in both.stdout

    # the agent's final output changes while every call still matches
    agent = project / "examples" / "booking_agent.py"
    agent.write_text(
        agent.read_text().replace(
            'return str(message["content"])', 'return str(message["content"]).upper()'
        )
    )
    changed = _pytest(project, approved)
    assert changed.returncode == 1
    assert "the output differs from the recorded run output" in changed.stdout
    assert 'recorded: "Booked and paid: captured."' in changed.stdout
    assert 'this run: "BOOKED AND PAID: CAPTURED."' in changed.stdout


def test_exported_live_tools_and_async_entrypoint(bundles: Bundles, tmp_path: Path) -> None:
    project = _project(tmp_path, bundles.failure)
    live = project / "tests" / "test_live.py"
    exported = stepfork(
        "export", "pytest", "tests/failure.sftrace", "--entrypoint", ENTRYPOINT, "-o", live,
        "--allow-live-tool", "search_flights", "--allow-live-tool", "book_flight", cwd=project,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    text = live.read_text()
    assert 'ALLOW_LIVE_TOOLS = ["book_flight", "search_flights"]' in text
    assert 'mode="live", allow_live_tools=ALLOW_LIVE_TOOLS' in text
    shutil.copyfile(bundles.tiny_dir / "tiny_agent.py", project / "tiny_agent.py")
    shutil.copyfile(bundles.tiny("async"), project / "tests" / "async.sftrace")
    async_test = project / "tests" / "test_async.py"
    assert stepfork(
        "export", "pytest", "tests/async.sftrace", "--entrypoint", "tiny_agent:aforecast",
        "-o", async_test, cwd=project,
    ).returncode == 0  # fmt: skip
    assert "    output = asyncio.run(aforecast(**RECORDED_INPUT))" in async_test.read_text()
    result = _pytest(project, project / "tests")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_export_to_stdout_and_no_overwrite(bundles: Bundles, tmp_path: Path) -> None:
    result = stepfork(
        "export", "pytest", bundles.tiny("no_output"), "--entrypoint", "tiny_agent:forecast",
        "-o", "-", cwd=bundles.tiny_dir,
    )  # fmt: skip
    assert result.returncode == 0
    assert f'BUNDLE = Path("{bundles.tiny("no_output")}")' in result.stdout
    assert "    # only the dependency calls are checked\n    forecast(**RECORDED_INPUT)\n" in (
        result.stdout
    )
    existing = tmp_path / "test_existing.py"
    existing.write_text("# mine\n")
    refused = stepfork(
        "export", "pytest", bundles.failure, "--entrypoint", ENTRYPOINT, "-o", existing
    )
    assert refused.returncode == 2
    assert (
        refused.stderr == f"stepfork: error: {existing} already exists (use --force to overwrite)\n"
    )
    assert existing.read_text() == "# mine\n"


def test_text_from_a_hostile_bundle_never_becomes_code(bundles: Bundles, tmp_path: Path) -> None:
    """Run names and error types are bundle data: in the generated file they stay inert text."""
    import ast

    from stepfork_otel import Trace

    trace = Trace.load(bundles.failure)
    evil = 'x"""\nimport os; os.system("echo PWNED")\n_ = \'\'\''
    hostile = trace.model_copy(
        update={"run": trace.run.model_copy(update={"name": evil, "error_type": evil + "E"})}
    )
    project = _project(tmp_path, bundles.failure)
    hostile.save(project / "tests" / 'evil""".sftrace')
    out = project / "tests" / "test_evil.py"
    exported = stepfork(
        "export", "pytest", 'tests/evil""".sftrace', "--entrypoint", ENTRYPOINT, "-o", out,
        cwd=project,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    tree = ast.parse(out.read_text())
    calls = [
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    ]
    assert "system" not in calls
    assert not any(
        isinstance(node, ast.Import) and any(a.name == "os" for a in node.names)
        for node in ast.walk(tree)
    )
    docstring = ast.get_docstring(tree)
    assert docstring is not None
    assert "os.system" in docstring  # shown, as text


# --- a test that could never pass is not written (issue 27) ---------------------------------------


def _refused(bundle: Path, tmp_path: Path, *extra: str) -> str:
    """Export ``bundle`` and insist nothing was written: the one error line."""
    out = tmp_path / "test_refused.py"
    result = stepfork("export", "pytest", bundle, "--entrypoint", ENTRYPOINT, "-o", out, *extra)
    assert (result.returncode, result.stdout) == (2, ""), result.stdout + result.stderr
    assert not out.exists()
    assert result.stderr.count("\n") == 1
    return result.stderr


def test_export_refuses_a_tampered_bundle(bundles: Bundles, tmp_path: Path) -> None:
    """Replay rejects a bundle whose fingerprints do not match its payloads: a test from it
    fails at its first line (it was written, and failed, before)."""
    tampered = tmp_path / "tampered.sftrace"
    text = bundles.failure.read_text()
    tampered.write_text(text.replace('"max_results":5', '"max_results":6'))
    assert _refused(tampered, tmp_path) == (
        f"stepfork: error: {tampered}: no test written, it could never pass: replay rejects this "
        "bundle: integrity check failed: call-2: input fingerprint mismatch: stored "
        "3a95c0f3af5f…, payload hashes to 359b90634591…; it was edited or corrupted after it was "
        f"written; `stepfork validate {tampered}` lists every problem\n"
    )


def test_export_refuses_a_run_cut_short(bundles: Bundles, tmp_path: Path) -> None:
    """A bundle a killed recording left holds the calls that returned; the agent goes on past
    them, where replay has nothing left to serve."""
    killed = tmp_path / "killed.sftrace"
    killed.write_text("".join(bundles.failure.read_text().splitlines(keepends=True)[:10]))
    assert _refused(killed, tmp_path) == (
        f"stepfork: error: {killed}: no test written, it could never pass: the recorded run is "
        "incomplete: the recording stopped before the run ended (the bundle has no trailer); "
        "replay stops after its last recorded call, where the agent goes on -- record the run "
        f"again; `stepfork validate {killed}` lists every problem\n"
    )


def test_export_refuses_a_bundle_with_a_result_replay_cannot_serve(
    bundles: Bundles, tmp_path: Path
) -> None:
    trace = Trace.load(bundles.failure)
    events = [
        e.model_copy(update={"output": None, "output_missing": "size_cap"})
        if e.id == "call-2.result"
        else e
        for e in trace.events
    ]
    capped = tmp_path / "capped.sftrace"
    trace.model_copy(update={"events": events}).save(capped)
    assert _refused(capped, tmp_path) == (
        f"stepfork: error: {capped}: no test written, it could never pass: replay stops at "
        f"call-2.result: output missing (size_cap); `stepfork validate {capped}` lists every "
        "problem\n"
    )
