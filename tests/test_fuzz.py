"""The fuzz harness, bounded, in the normal suite: mutated golden bundles and collector files
(``benchmarks/fuzz.py`` has the mutators and the checks; ``python -m benchmarks.fuzz`` runs the
long campaign, whose last result is ``benchmarks/FUZZ_RESULTS.md``). Every mutant must end in
success, a typed one-line error, or the golden agent's own error -- never an untyped exception
from stepfork_otel, never a hang. Deterministic: hypothesis derandomised, seeds drawn from it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks import fuzz
from stepfork_otel.trace.bundle import dump_trace
from stepfork_otel.trace.errors import BundleError

SETTINGS = settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
GOLDENS = {name: (fuzz.GOLDEN / name).read_bytes() for name in fuzz.GOLDEN_BUNDLES}


@SETTINGS
@given(name=st.sampled_from(sorted(GOLDENS)), seed=st.integers(0, 2**32 - 1))
def test_bundle_mutants_end_in_success_or_a_typed_error(
    tmp_path: Path, name: str, seed: int
) -> None:
    data, compressed = fuzz.bundle_mutant(GOLDENS[name], random.Random(seed))
    path = tmp_path / ("mutant.sftrace.gz" if compressed else "mutant.sftrace")
    path.write_bytes(data)
    agent, question = fuzz.GOLDEN_BUNDLES[name]
    outcome = fuzz.check_bundle(path, agent, question)
    assert outcome.kind in ("ok", "typed", "agent"), (seed, name, outcome)


@settings(SETTINGS, max_examples=150)
@given(seed=st.integers(0, 2**32 - 1))
def test_otlp_mutants_end_in_success_or_a_typed_error(tmp_path: Path, seed: int) -> None:
    data, compressed = fuzz.otlp_mutant(fuzz.OTLP_GOLDEN.read_bytes(), random.Random(seed))
    path = tmp_path / ("mutant.jsonl.gz" if compressed else "mutant.jsonl")
    path.write_bytes(data)
    out = tmp_path / f"out-{seed}"
    out.mkdir()
    outcome = fuzz.check_otlp(path, out)
    assert outcome.kind in ("ok", "typed"), (seed, outcome)


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """The harness tells an untyped failure and a hang from a typed error."""
    assert fuzz._classify(fuzz.Hang()).kind == "hang"
    with pytest.raises(BundleError) as typed:
        fuzz.load_trace(tmp_path / "missing.sftrace")
    assert fuzz._classify(typed.value).kind == "typed"
    with pytest.raises(AttributeError) as ours:
        dump_trace(None)  # type: ignore[arg-type]
    assert fuzz._classify(ours.value).kind == "untyped"  # raised inside stepfork_otel
    with pytest.raises(AttributeError) as theirs:
        fuzz.refingerprint(None)  # type: ignore[arg-type]
    assert fuzz._classify(theirs.value).kind == "agent"  # raised outside it
