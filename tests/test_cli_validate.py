"""``stepfork validate``: valid, invalid (every problem listed with its event), unreadable."""

from __future__ import annotations

from pathlib import Path

from cli_support import Bundles, bundles, stepfork

__all__ = ["bundles"]


def test_valid_bundles(bundles: Bundles) -> None:
    result = stepfork("validate", bundles.failure, bundles.success, "--verify-integrity")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"{bundles.failure}: valid (4 calls, 8 events, every fingerprint verified)",
        f"{bundles.success}: valid (7 calls, 14 events, every fingerprint verified)",
    ]


def test_tampered_payload_is_invalid_only_with_verify_integrity(
    bundles: Bundles, tmp_path: Path
) -> None:
    tampered = tmp_path / "tampered.sftrace"
    text = bundles.failure.read_text()
    assert text.count('"max_results":5') == 1  # payload lines hold the canonical JSON verbatim
    tampered.write_text(text.replace('"max_results":5', '"max_results":6'))
    assert stepfork("validate", tampered).returncode == 0
    result = stepfork("validate", tampered, "--verify-integrity")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == f"{tampered}: INVALID (1 problem)"
    assert lines[1].startswith("  call-2: input fingerprint mismatch: stored 3a95c0f3af5f…")


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
