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


def test_quick_mode_never_overwrites_the_committed_results(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = Path(bench_run.HERE / "RESULTS.md")
    before = results.read_bytes() if results.exists() else None
    assert bench_run.main(["--quick", "--only", "no_such_benchmark"]) == 0
    after = results.read_bytes() if results.exists() else None
    assert before == after
    assert "## Machine" in capsys.readouterr().out
