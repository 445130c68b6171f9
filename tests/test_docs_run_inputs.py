"""A run's recorded input is what replay calls the entrypoint with, as keyword arguments
(``run_agent(**input)``): in every python block of the docs where ``record(..., input={...})``
wraps a call of the entrypoint, the input's keys are among the names the block passes to it, so a
reader who copies the block gets a bundle ``stepfork replay`` can call the entrypoint with."""

from __future__ import annotations

import ast

import pytest
from conftest import ROOT
from test_docs_snippets import PAGES, Block, parse_blocks


def _blocks() -> list[Block]:
    return [b for page in PAGES for b in parse_blocks(page) if b.is_python]


def _mismatches(source: str) -> list[str]:
    """``record(input={...})`` blocks whose keys are not the names passed to the call of
        ``run.set_output(entrypoint(...))`` inside them (it may take more: a client the block passes
    and a replay from Python passes too)."""
    problems: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.With):
            continue
        for item in node.items:
            call = item.context_expr
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "record"):
                continue
            given = [kw.value for kw in call.keywords if kw.arg == "input"]
            if not given or not isinstance(given[0], ast.Dict):
                continue
            keys = {key.value for key in given[0].keys if isinstance(key, ast.Constant)}
            for inner in ast.walk(node):
                if not (
                    isinstance(inner, ast.Call)
                    and getattr(inner.func, "attr", None) == "set_output"
                    and inner.args
                    and isinstance(inner.args[0], ast.Call)
                ):
                    continue
                entry = inner.args[0]
                passed = {a.id for a in entry.args if isinstance(a, ast.Name)}
                passed |= {kw.arg for kw in entry.keywords if kw.arg is not None}
                if not keys <= passed:
                    problems.append(
                        f"input keys {sorted(keys)} but {ast.unparse(entry)} passes "
                        f"{sorted(passed)} (replay calls the entrypoint with **input)"
                    )
    return problems


@pytest.mark.parametrize("block", _blocks(), ids=lambda b: b.key)
def test_a_run_input_names_the_entrypoint_parameters(block: Block) -> None:
    assert _mismatches(block.source) == []


def test_the_check_can_fail() -> None:
    bad = 'with record("r.sftrace", input={"question": q}) as run:\n    run.set_output(f(q))\n'
    assert _mismatches(bad) != []
    good = bad.replace("q)", "question)").replace(": q}", ": question}")
    assert _mismatches(good) == []


def test_pages_are_read() -> None:
    assert (ROOT / "README.md") in PAGES
