"""``stepfork validate``: valid, invalid (every problem listed with its event), incomplete,
unreadable; fingerprints verified by default; ``--json``."""

from __future__ import annotations

import json
from pathlib import Path

from cli_support import Bundles, bundles, stepfork

from stepfork_otel import Trace

__all__ = ["bundles"]


def test_valid_bundles(bundles: Bundles) -> None:
    result = stepfork("validate", bundles.failure, bundles.success, "--verify-integrity")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"{bundles.failure}: valid (4 calls, 8 events, every fingerprint verified)",
        f"{bundles.success}: valid (7 calls, 14 events, every fingerprint verified)",
    ]


def test_a_tampered_payload_is_invalid_unless_fingerprints_are_not_checked(
    bundles: Bundles, tmp_path: Path
) -> None:
    """Fingerprints are verified by default (issue 27: without the flag a tampered bundle was
    called valid, one that replay and diff reject); --no-verify-integrity checks the structure
    only, and says the fingerprints were not checked."""
    tampered = tmp_path / "tampered.sftrace"
    text = bundles.failure.read_text()
    assert text.count('"max_results":5') == 1  # payload lines hold the canonical JSON verbatim
    tampered.write_text(text.replace('"max_results":5', '"max_results":6'))
    for flags in ((), ("--verify-integrity",)):
        result = stepfork("validate", tampered, *flags)
        assert result.returncode == 1
        lines = result.stdout.splitlines()
        assert lines[0] == f"{tampered}: INVALID (1 problem)"
        assert lines[1].startswith("  call-2: input fingerprint mismatch: stored 3a95c0f3af5f…")
    unchecked = stepfork("validate", tampered, "--no-verify-integrity")
    assert unchecked.returncode == 0
    assert unchecked.stdout == f"{tampered}: valid (4 calls, 8 events; fingerprints not checked)\n"


def test_a_run_cut_short_is_incomplete_not_valid(bundles: Bundles, tmp_path: Path) -> None:
    """A bundle a killed recording left (written as the run went, no trailer) loads, but the run
    did not end: INCOMPLETE, exit 1 (issue 27: "valid", exit 0, with a warning)."""
    killed = tmp_path / "killed.sftrace"
    lines = bundles.failure.read_text().splitlines(keepends=True)
    killed.write_text("".join(lines[:10]))  # header, run input, two calls and their results
    result = stepfork("validate", killed)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines()[:3] == [
        f"{killed}: INCOMPLETE (2 calls, 4 events, every fingerprint verified): the recording "
        "stopped before the run ended (the bundle has no trailer)",
        "  the recorded run did not end: replay serves these calls and stops after the last one "
        "(`stepfork show` lists them)",
        "  warning no lines fingerprint (lines_sha256 in the end line: the bundle was cut short "
        "before it): not verified: the run's status, error type and message; every event's "
        "replay_policy, status, name, provider, model, id, parent and seq; which payload lines "
        "there are (payload texts, error outcomes and model fingerprints were verified)",
    ]


def test_a_bundle_written_whole_and_cut_is_unreadable(bundles: Bundles, tmp_path: Path) -> None:
    """A bundle written in one go (``stepfork import``, ``Trace.save``) has no trailer to wait
    for: cut short, it is a damaged file, exit 2."""
    whole = tmp_path / "whole.sftrace"
    Trace.load(bundles.failure).save(whole)
    cut = tmp_path / "truncated.sftrace"
    cut.write_text("".join(whole.read_text().splitlines(keepends=True)[:10]))
    result = stepfork("validate", cut)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f'stepfork: error: {cut}: truncated bundle (no end line {{"end":"sftrace",...}})\n'
    )


def test_validate_json(bundles: Bundles, tmp_path: Path) -> None:
    killed = tmp_path / "killed.sftrace"
    killed.write_text("".join(bundles.failure.read_text().splitlines(keepends=True)[:10]))
    missing = tmp_path / "missing.sftrace"
    result = stepfork("validate", "--json", bundles.failure, killed, missing)
    assert (result.returncode, result.stderr) == (2, "")
    data = json.loads(result.stdout)
    assert data["exit_code"] == 2
    valid, incomplete, unreadable = data["bundles"]
    assert valid == {
        "path": str(bundles.failure),
        "status": "valid",
        "calls": 4,
        "events": 8,
        "fingerprints_verified": True,
        "complete": True,
        "incomplete_reason": None,
        "problems": [],
        "warnings": [],
        "error": None,
    }
    assert (incomplete["status"], incomplete["calls"], incomplete["complete"]) == (
        "incomplete",
        2,
        False,
    )
    assert incomplete["incomplete_reason"].startswith("the recording stopped before the run ended")
    assert [w["event_id"] for w in incomplete["warnings"]] == [None]
    assert unreadable["status"] == "unreadable"
    assert unreadable["error"] == f"{missing}: no such file"
    tampered = tmp_path / "tampered.sftrace"
    tampered.write_text(bundles.failure.read_text().replace('"max_results":5', '"max_results":6'))
    invalid = json.loads(stepfork("validate", "--json", tampered).stdout)["bundles"][0]
    assert invalid["status"] == "invalid"
    assert invalid["problems"][0]["event_id"] == "call-2"
    assert invalid["problems"][0]["message"].startswith("input fingerprint mismatch: stored ")


def test_every_schema_problem_is_listed_with_its_event(bundles: Bundles, tmp_path: Path) -> None:
    broken = tmp_path / "broken.sftrace"
    text = bundles.failure.read_text()
    text = text.replace('"seq":2,', '"seq":"two",', 1).replace('"seq":3,', '"seq":3,"extra":1,', 1)
    broken.write_text(text)
    result = stepfork("validate", broken)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{broken}: INVALID (2 problems)",
        "  call-2: seq: Input should be a valid integer, unable to parse string as an integer",
        "  call-3: extra: Extra inputs are not permitted",
    ]


def test_structure_problem(bundles: Bundles, tmp_path: Path) -> None:
    dangling = tmp_path / "dangling.sftrace"
    text = bundles.failure.read_text()
    text = text.replace('"parent_id":"call-4"', '"parent_id":"call-9"', 1)
    dangling.write_text(text)
    result = stepfork("validate", dangling)
    assert result.returncode == 1
    assert "  call-4.error: outcome of unknown call 'call-9'" in result.stdout.splitlines()


def test_missing_result_is_a_warning(bundles: Bundles, tmp_path: Path) -> None:
    lines = bundles.failure.read_text().splitlines()
    cut = tmp_path / "cut.sftrace"
    error = next(n for n, line in enumerate(lines) if line.startswith('{"type":"error"'))
    assert lines[error + 1].startswith('{"output":')  # the error event's payload line
    kept = lines[:error] + lines[error + 2 :]
    assert kept[-1].startswith('{"end":"sftrace","events":8,"lines_sha256":')
    kept[-1] = '{"end":"sftrace","events":7}'  # (without the lines fingerprint: an older bundle)
    cut.write_text("\n".join(kept) + "\n")
    result = stepfork("validate", cut)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "  warning call-4: no recorded result" in result.stdout


def test_mixed_files_exit_with_the_worst(bundles: Bundles, tmp_path: Path) -> None:
    result = stepfork("validate", bundles.failure, tmp_path / "missing.sftrace")
    assert result.returncode == 2
    assert f"{bundles.failure}: valid" in result.stdout
    assert result.stderr == f"stepfork: error: {tmp_path / 'missing.sftrace'}: no such file\n"
