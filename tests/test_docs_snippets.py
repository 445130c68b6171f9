"""Every ```python block in README.md and docs/*.md runs as pasted.

Each block runs the way a reader would run it: saved as a file in a fresh copy of the project's
``examples/`` (with ``examples/out/*.sftrace`` recorded by ``python examples/booking_agent.py``,
exactly as the docs say), run by ``sys.executable`` in a fresh subprocess with that directory as
the working directory, offline (every outbound connection is refused) and under a timeout. A block
passes when it finishes without an exception, or raises exactly what its marker says it raises.
The subprocess must exit 0 without an error at exit (an ``atexit`` hook, a ``__del__``). No block
may swallow every error (``except Exception: pass`` and its relatives are refused, in fragments
too): a block that expects an error catches that error and shows it, or is marked ``raises=`` and
followed by the error as it is printed.

Markers. An HTML comment on the line right before the opening fence (invisible when the page is
rendered) says how a block is meant to be read; tokens combine, separated by spaces:

    <!-- snippet: fragment -->       not run, only compiled: an excerpt (`...` for bodies), or code
                                     that needs the reader's own agent, keys or files
    <!-- snippet: id=NAME -->        names the block, so that a later block can build on it
    <!-- snippet: after=NAME -->     runs after block NAME of the same page, in the same
                                     subprocess, in a copy of the namespace NAME left behind
                                     (blocks built on the same one do not see each other's names)
    <!-- snippet: raises=TYPE -->    the block must raise TYPE (a class name, optionally
                                     qualified), and the output block right after it must show
                                     that error (its first line starts with the type's name)
    <!-- snippet: file=NAME -->      the page tells the reader to save the block as NAME in the
                                     working directory; any fence language (a JSON config, say).
                                     It is written there before the page's blocks run; a python
                                     block with it also runs, with NAME as its ``__file__``

Unmarked python blocks run. A block in a page this test's authors cannot edit that fails is listed
in ``EXPECTED_FAILURES`` (strict xfail: it must fail, so fixing the page means removing the entry).
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON_LANGUAGES = {"python", "py", "python3"}
TIMEOUT_SECONDS = 600  # a hang guard: a chain of blocks takes seconds, ten times that under load

#: (page, a line of the block) -> why it fails. Pages other people own; see the module docstring.
EXPECTED_FAILURES: dict[tuple[str, str], str] = {}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<lang>[^\s`]*)")
_MARKER = re.compile(r"^\s*<!--\s*snippet:(?P<tokens>.*?)-->\s*$")


@dataclass
class Block:
    page: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    source: str
    marker_line: str | None = None
    tokens: dict[str, str | None] = field(default_factory=dict)
    next_block: Block | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def is_python(self) -> bool:
        return self.lang.lower() in PYTHON_LANGUAGES

    @property
    def fragment(self) -> bool:
        return "fragment" in self.tokens


def parse_blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """Every fenced block of a markdown page, in order, with the marker on the line before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    page = path.relative_to(root).as_posix()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, indent = opening["fence"], opening["indent"]
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            body.append(lines[end][len(indent) :] if lines[end].startswith(indent) else lines[end])
            end += 1
        marker_line = lines[index - 1] if index > 0 else ""
        marker = _MARKER.match(marker_line)
        tokens: dict[str, str | None] = {}
        if marker:
            for token in marker["tokens"].split():
                name, _, value = token.partition("=")
                tokens[name] = value or None
        blocks.append(
            Block(
                page=page,
                line=index + 1,
                lang=opening["lang"],
                source="\n".join(body) + "\n",
                marker_line=marker_line.strip() if marker else None,
                tokens=tokens,
            )
        )
        index = end + 1
    for block, following in itertools.pairwise(blocks):
        block.next_block = following
    return blocks


ALL_BLOCKS = {page: parse_blocks(page) for page in PAGES}
PYTHON_BLOCKS = [block for blocks in ALL_BLOCKS.values() for block in blocks if block.is_python]


def marker_problems(blocks: list[Block]) -> list[str]:
    """What is wrong with the markers of one page (unknown tokens, dangling references...)."""
    problems: list[str] = []
    known = {"fragment", "id", "after", "raises", "file"}
    ids: dict[str, Block] = {}
    for block in blocks:
        where = f"{block.key}: {block.marker_line}"
        for name, value in block.tokens.items():
            if name not in known:
                problems.append(f"{where}: unknown token {name!r} (known: {sorted(known)})")
            elif (name == "fragment") != (value is None):
                problems.append(f"{where}: {name!r} takes {'no' if value is None else 'a'} value")
        if block.marker_line is not None and not block.tokens:
            problems.append(f"{where}: empty marker")
        if not block.is_python and set(block.tokens) - {"file"}:
            problems.append(f"{where}: only file= applies to a {block.lang or 'plain'} block")
        if block.fragment and set(block.tokens) & {"after", "raises", "id"}:
            problems.append(f"{where}: a fragment is not run, so it takes no id/after/raises")
        name = block.tokens.get("id")
        if name:
            if name in ids:
                problems.append(f"{where}: id {name!r} already names {ids[name].key}")
            ids[name] = block
        parent = block.tokens.get("after")
        if parent and parent not in ids:
            problems.append(f"{where}: after={parent} names no earlier block of this page")
        raises = block.tokens.get("raises")
        if raises:
            shown = block.next_block
            if shown is None or shown.is_python:
                problems.append(f"{where}: raises={raises} but no output block follows to show it")
    return problems


def swallowing_handlers(source: str) -> list[int]:
    """Lines of `except:` / `except Exception:` / `except BaseException:` handlers whose body only
    passes: they hide exactly the errors (a missing import, a replay error) the reader must see."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ExceptHandler):
            continue
        names = []
        if node.type is None:
            names = ["BaseException"]
        else:
            types = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            names = [t.id if isinstance(t, ast.Name) else ast.unparse(t) for t in types]
        catches_all = any(n in {"Exception", "BaseException"} for n in names)
        passes = all(
            isinstance(s, ast.Pass)
            or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            for s in node.body
        )
        if catches_all and passes:
            lines.append(node.lineno)
    return lines


# -- running blocks -----------------------------------------------------------------------------

_RUNNER = r'''
"""Runs doc blocks in order in this process, each in a copy of its parent's namespace."""
import builtins, json, os, socket, sys, traceback, types

plan = json.load(open(sys.argv[1], encoding="utf-8"))
sys.path[0] = os.getcwd()  # as `python snippet.py` run from the working directory


def _offline(self, address, *args, **kwargs):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        raise ConnectionRefusedError(f"doc snippets run offline: connection to {address!r} refused")
    return _connect(self, address, *args, **kwargs)


_connect = socket.socket.connect
socket.socket.connect = _offline
socket.socket.connect_ex = _offline

namespaces = {}
results = {}
for block in plan:
    parent = block["after"]
    module = types.ModuleType("__main__")
    if parent is not None:
        module.__dict__.update(namespaces[parent])
    module.__dict__.update(__file__=block["path"], __builtins__=builtins)
    sys.modules["__main__"] = module
    print(f"---- {block['key']}", flush=True)
    print(f"---- {block['key']}", file=sys.stderr, flush=True)
    try:
        exec(compile(block["source"], block["path"], "exec"), module.__dict__)
        result = {"raised": None}
    except BaseException as exc:  # reported to the test, which decides
        result = {
            "raised": type(exc).__qualname__,
            "module": type(exc).__module__,
            "message": str(exc),
            "traceback": traceback.format_exc(),
        }
    sys.stdout.flush()
    sys.stderr.flush()
    namespaces[block["key"]] = dict(module.__dict__)
    results[block["key"]] = result
    with open(sys.argv[2], "w", encoding="utf-8") as out:
        json.dump(results, out)
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project directory as a reader has it after the README's first command: `examples/`
    with the bundles `python examples/booking_agent.py` writes."""
    base = tmp_path_factory.mktemp("docs_project")
    (base / "examples").mkdir()
    for source in (ROOT / "examples").glob("*.py"):
        shutil.copy(source, base / "examples" / source.name)
    subprocess.run(
        [sys.executable, "examples/booking_agent.py"],
        cwd=base,
        check=True,
        capture_output=True,
        timeout=TIMEOUT_SECONDS,
    )
    assert (base / "examples" / "out" / "failure.sftrace").is_file()
    return base


def _chain(block: Block, page_blocks: list[Block]) -> list[Block]:
    """Every runnable block of the after= tree `block` is in, in page order (the root first)."""
    by_id = {b.tokens["id"]: b for b in page_blocks if b.tokens.get("id")}

    def root_of(b: Block) -> Block:
        while b.tokens.get("after"):
            b = by_id[b.tokens["after"] or ""]
        return b

    root = root_of(block)
    return [b for b in page_blocks if b.is_python and not b.fragment and root_of(b) is root]


_RESULTS: dict[str, dict[str, Any]] = {}
_LOGS: dict[str, str] = {}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "STEPFORK_"))}
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        env.pop(proxy, None)
    env.update(PYTHONIOENCODING="utf-8", PYTHONDONTWRITEBYTECODE="1")
    return env


def _run_chain(page_blocks: list[Block], chain: list[Block], project: Path, tmp: Path) -> None:
    """Run one tree of blocks in a fresh subprocess, in a fresh copy of the project."""
    workdir = tmp / "work"
    shutil.copytree(project, workdir)
    for saved in page_blocks:  # what the page tells the reader to save
        if saved.tokens.get("file"):
            target = workdir / (saved.tokens["file"] or "")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(saved.source, encoding="utf-8")
    by_id = {b.tokens["id"]: b for b in page_blocks if b.tokens.get("id")}
    plan = []
    for block in chain:
        parent = block.tokens.get("after")
        name = block.tokens.get("file") or f"snippet_{Path(block.page).stem}_{block.line}.py"
        path = workdir / name
        if not block.tokens.get("file"):
            path.write_text(block.source, encoding="utf-8")
        plan.append(
            {
                "key": block.key,
                "after": by_id[parent].key if parent else None,
                "path": str(path),
                "source": block.source,
            }
        )
    (tmp / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    (tmp / "runner.py").write_text(_RUNNER, encoding="utf-8")
    try:
        completed = subprocess.run(
            [sys.executable, str(tmp / "runner.py"), str(tmp / "plan.json"), str(tmp / "out.json")],
            cwd=workdir,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
            check=False,
        )
        log = f"stdout:\n{completed.stdout}\nstderr:\n{completed.stderr}"
        failed = completed.returncode != 0 or "Exception ignored in" in completed.stderr
        if failed:
            log = f"the subprocess exited {completed.returncode} (or reported an error at exit)\n{log}"
    except subprocess.TimeoutExpired as timeout:
        log = f"timed out after {TIMEOUT_SECONDS} s\n{timeout.stdout!r}\n{timeout.stderr!r}"
        failed = True
    results = json.loads((tmp / "out.json").read_text()) if (tmp / "out.json").exists() else {}
    if failed:
        results = {}  # every block of the tree fails, with the log
    for block in chain:
        _RESULTS[block.key] = results.get(
            block.key, {"raised": "<no result, see the log>", "traceback": log}
        )
        _LOGS[block.key] = log


def _params() -> list[Any]:
    params = []
    for block in PYTHON_BLOCKS:
        marks = [
            pytest.mark.xfail(strict=True, reason=reason)
            for (page, line), reason in EXPECTED_FAILURES.items()
            if page == block.page and line in block.source.splitlines()
        ]
        params.append(pytest.param(block, id=block.key, marks=marks))
    return params


def test_markers_are_valid() -> None:
    problems = [p for blocks in ALL_BLOCKS.values() for p in marker_problems(blocks)]
    assert not problems, "\n".join(problems)


def test_expected_failures_name_existing_blocks() -> None:
    for page, line in EXPECTED_FAILURES:
        assert any(b.page == page and line in b.source.splitlines() for b in PYTHON_BLOCKS), (
            f"EXPECTED_FAILURES names no block of {page} with the line {line!r}: remove it"
        )


@pytest.mark.parametrize("block", _params())
def test_snippet_runs_as_pasted(
    block: Block, project: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    swallowed = swallowing_handlers(block.source)
    assert not swallowed, (
        f"{block.key}: an `except Exception: pass` (block line {swallowed}) hides every error, "
        "a missing import included: catch the error you expect and show it"
    )
    if block.fragment:
        compile(block.source, block.key, "exec")
        return
    if block.key not in _RESULTS:
        page_blocks = ALL_BLOCKS[ROOT / block.page]
        chain = _chain(block, page_blocks)
        _run_chain(page_blocks, chain, project, tmp_path_factory.mktemp("snippet"))
    result = _RESULTS[block.key]
    expected = block.tokens.get("raises")
    raised = result["raised"]
    qualified = f"{result.get('module')}.{raised}"
    if expected is None:
        assert raised is None, (
            f"{block.key} raised {qualified}: {result.get('message')}\n"
            f"{result.get('traceback')}\n{_LOGS[block.key]}"
        )
        return
    assert raised is not None, f"{block.key} should raise {expected} and raised nothing"
    assert expected in (raised, qualified), (
        f"{block.key} should raise {expected} and raised {qualified}: {result.get('message')}\n"
        f"{result.get('traceback')}"
    )
    assert block.next_block is not None
    shown = block.next_block.source.lstrip().splitlines()[0]
    names = (f"{qualified}:", f"{raised}:") if result["module"] != "builtins" else (f"{raised}:",)
    assert shown.startswith(names), (
        f"{block.key} raises {qualified}; the output block after it should show it, "
        f"and starts with {shown!r}"
    )


# -- the checks themselves ----------------------------------------------------------------------


def test_swallowing_handlers_are_found() -> None:
    assert swallowing_handlers("try:\n    f()\nexcept Exception:\n    pass\n") == [3]
    assert swallowing_handlers("try:\n    f()\nexcept:\n    ...\n") == [3]
    assert swallowing_handlers("try:\n    f()\nexcept (KeyError, BaseException):\n    pass\n")
    assert not swallowing_handlers("try:\n    f()\nexcept KeyError:\n    pass\n")
    assert not swallowing_handlers("try:\n    f()\nexcept Exception as e:\n    print(e)\n")


def _page(tmp_path: Path, text: str) -> list[Block]:
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    return parse_blocks(page, root=tmp_path)


def test_marker_problems_are_reported(tmp_path: Path) -> None:
    blocks = _page(
        tmp_path,
        "<!-- snippet: fragmnt -->\n```python\nx = 1\n```\n\n"
        "<!-- snippet: after=nowhere raises=KeyError -->\n```python\n{}[1]\n```\n\n"
        "<!-- snippet: fragment id=a -->\n```python\nx = 1\n```\n",
    )
    problems = "\n".join(marker_problems(blocks))
    assert "unknown token 'fragmnt'" in problems
    assert "after=nowhere names no earlier block" in problems
    assert "raises=KeyError but no output block follows" in problems
    assert "a fragment is not run" in problems


def test_blocks_run_offline_in_a_copy_of_their_parent(project: Path, tmp_path: Path) -> None:
    blocks = _page(
        tmp_path,
        "<!-- snippet: id=base -->\n```python\nseen = ['base']\n```\n"
        "<!-- snippet: after=base -->\n```python\nseen = [*seen, 'one']\n```\n"
        "<!-- snippet: after=base -->\n```python\nassert seen == ['base'], seen\n```\n"
        "```python\nimport socket\nsocket.create_connection(('127.0.0.1', 9), timeout=5)\n```\n",
    )
    _run_chain(blocks, blocks[:3], project, tmp_path / "tree")
    _run_chain(blocks, blocks[3:], project, tmp_path / "network")
    assert [_RESULTS[b.key]["raised"] for b in blocks[:3]] == [None, None, None]
    refused = _RESULTS[blocks[3].key]
    assert refused["raised"] == "ConnectionRefusedError"
    assert "doc snippets run offline" in refused["message"]
