"""The benchmarks still run: each one, in quick mode, produces its section with numbers.

Nothing here looks at how fast anything is (timings on a shared machine prove nothing in a test);
the full results live in ``benchmarks/RESULTS.md``. Nor is the quick run given a time limit beyond
a hang guard: it takes about 40 s of CPU, which a shared 2-core machine under a load of 6-13
stretches to several minutes (a 300 s limit failed the suite there, issue 27).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from benchmarks import bench_sdk
from benchmarks import run as bench_run

#: Only a hang should reach this (see the module docstring).
HANG_GUARD_SECONDS = 3600
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?\s?(?:µs|ms|s|MB|x)\b")


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory: pytest.TempPathFactory) -> str:
    output = tmp_path_factory.mktemp("bench") / "RESULTS.md"
    result = subprocess.run(
        [sys.executable, "benchmarks/run.py", "--quick", "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return output.read_text()


def test_every_benchmark_is_discovered() -> None:
    names = bench_run.discover()
    expected = {"benchmarks.bench_record", "benchmarks.bench_bundle", "benchmarks.bench_replay"}
    assert expected <= set(names)
    assert all(n.startswith("benchmarks.bench_") for n in names)


def test_each_benchmark_produces_numbers(quick_results: str) -> None:
    assert "FAILED" not in quick_results
    for name in bench_run.discover():
        footer = f"_{name} ran in "
        assert footer in quick_results, f"{name} produced no section"
        section = quick_results.split(footer)[0].rsplit("\n## ", 1)[-1]
        assert _NUMBER.search(section), f"{name}: no measured number in\n{section}"


def test_results_describe_the_machine(quick_results: str) -> None:
    machine = quick_results.split("## Machine", 1)[1]
    for field in ("- CPU: ", "- Memory: ", "- OS: ", "- Python: ", "opentelemetry-sdk ", "orjson "):
        assert field in machine
    assert "not installed" not in machine.split("- Packages:", 1)[1].splitlines()[0]


def test_record_section_reports_each_payload_size(quick_results: str) -> None:
    section = quick_results.split("## Recording:", 1)[1].split("\n## ", 1)[0]
    for size in ("200 B", "2,000 B", "20,000 B"):
        row = next(line for line in section.splitlines() if line.startswith(f"| {size} |"))
        assert re.search(r"\*\*\d+\.\d\dx\*\*", row), row  # the ratio against a bare span


def _section(results: str, title: str) -> str:
    return results.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def _row(section: str, label: str) -> str:
    return next(line for line in section.splitlines() if line.startswith(f"| {label}"))


def test_replay_section_has_a_per_component_budget(quick_results: str) -> None:
    section = _section(quick_results, "Replay:")
    budget = section.split("### Where a frozen replayed call's time goes", 1)[1]
    for size, target in (("2,000 B", "2x"), ("20,000 B", "5x")):
        part = budget.split(f"#### {size}", 1)[1].split("####", 1)[0]
        for label in (
            "**the whole frozen replayed call**",
            "baseline: bare SDK span, 8 attributes",
            "**span**",
            "**arguments**",
            "**input capture**",
            "**matching**",
            "**substitution**",
            "**session bookkeeping**",
            "**boundary, the rest**",
            "**processor + hand-off**",
            "**processor, the replay recorded**",
            "**writer**",
        ):
            assert re.search(r"\| -?[\d,]+\.\d µs \| -?\d+\.\d\dx \|", _row(part, label)), label
        line = next(x for x in part.splitlines() if x.startswith("Frozen replay per call at"))
        assert re.search(
            rf"\*\*\d+\.\d\dx\*\* a bare span \(target <= {target}: \*\*(met|MISSED)", line
        )


def test_sdk_section_has_the_recording_anchor(quick_results: str) -> None:
    section = _section(quick_results, "SDK integration:")
    for label in ("**stepfork**: `instrument_openai()`, recorded", "**openinference**"):
        assert re.search(r"\| [+-][\d,]+\.\d µs \|$", _row(section, label)), label  # its CPU share
    # (n/a: openinference's share was not above zero in a quick run's noise)
    assert re.search(r"Recording: stepfork adds -?[\d,.]+ µs .*\*\*(\d+\.\d\dx|n/a)\*\*", section)


def test_sdk_section_has_the_cassette_anchor_or_says_how_to_make_it(quick_results: str) -> None:
    section = _section(quick_results, "SDK integration:")
    anchor = section.split("### Against vcrpy", 1)[1]
    python, _ = bench_sdk.vcr_python()  # what the quick run found (same checkout, same env)
    if python is None:
        assert bench_sdk.VCR_SETUP in anchor
        assert "Not measured" in anchor
        return
    for label in ("**stepfork**", "**vcrpy**", "vcrpy: a cassette of one exchange"):
        assert re.search(r"\| [+-][\d,]+\.\d µs \|$", _row(anchor, label)), label
    assert re.search(r"CPU: \*\*\d+\.\d\dx\*\* vcrpy's cheapest", anchor)


def test_cassette_anchor_without_its_interpreter_says_how_to_make_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(bench_sdk.VCR_PYTHON_ENV, raising=False)
    monkeypatch.setattr(bench_sdk, "VCR_VENV", tmp_path / "no-venv" / "bin" / "python")
    text = "\n".join(bench_sdk._cassette_anchor(calls=1, rounds=1))
    assert "Not measured: no `.venv-vcr`" in text
    assert f"`{bench_sdk.VCR_SETUP}`" in text
    assert bench_sdk.VCR_PYTHON_ENV in text
    monkeypatch.setenv(bench_sdk.VCR_PYTHON_ENV, str(tmp_path / "missing-python"))
    text = "\n".join(bench_sdk._cassette_anchor(calls=1, rounds=1))
    assert (
        f"Not measured: `{bench_sdk.VCR_PYTHON_ENV}={tmp_path / 'missing-python'}` is not a file"
        in text
    )


def test_quick_mode_never_overwrites_the_committed_results(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = Path(bench_run.HERE / "RESULTS.md")
    before = results.read_bytes() if results.exists() else None
    assert bench_run.main(["--quick", "--only", "no_such_benchmark"]) == 0
    after = results.read_bytes() if results.exists() else None
    assert before == after
    assert "## Machine" in capsys.readouterr().out
