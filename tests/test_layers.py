"""Pin the package's layer rules (DESIGN.md section 3): imports point down, never up, and no
import cycle, not even inside a package. The graph comes from ``ast`` (every import, including
``if TYPE_CHECKING:`` and function-local ones); the "no OpenTelemetry" rules from a fresh
interpreter. The ``test_selftest_*`` tests run the checker on a synthetic package: it can fail."""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "stepfork_otel"

# Names relative to the package: "x" is exactly module x, "x.*" is x and everything under it,
# "" is the package's own __init__. A module may import only modules of its layer or lower.
LAYERS: dict[int, tuple[str, ...]] = {
    0: ("constants", "_version", "_internal", "_lazy", "_patching"),
    1: ("trace.*",),
    2: ("config",),
    3: ("recording.*",),
    4: ("otel.*", "replay.*"),
    5: ("assertions", "pytest_plugin", "cli.*", ""),
}
# Edges forbidden whatever the layers say: (importer, imported, allowed exceptions, why).
FORBIDDEN: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("otel.*", "replay.*", (), "otel and replay never import each other"),
    ("replay.*", "otel.*", (), "otel and replay never import each other"),
    ("replay.*", "recording.*", ("recording.contract",), "replay takes only recording.contract"),
    ("pytest_plugin", "cli.*", (), "pytest_plugin imports nothing under cli"),
)

Graph = dict[str, dict[str, int]]  # importer -> {imported: first line}


def module_files(package_dir: Path, package_name: str) -> dict[str, Path]:
    """Every module of the package by dotted name; a package is its ``__init__``."""
    modules: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir).with_suffix("").parts
        modules[".".join((package_name, *parts[: -1 if parts[-1] == "__init__" else None]))] = path
    return modules


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) blocks."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            inside |= {id(sub) for stmt in node.body for sub in ast.walk(stmt)}
    return inside


def build_graph(package_dir: Path, package_name: str, *, run_time: bool = False) -> Graph:
    """The import graph: edges to names inside the package only, no self-edges.

    By default every import statement is an edge to what it names (module level, in a function,
    under ``if TYPE_CHECKING:``): the layer rules. With ``run_time=True`` it is the graph of what
    importing a module runs, the one cycles are looked for in: an import of ``a.b.c`` is also an
    edge to ``a`` and ``a.b`` (Python runs every enclosing package's ``__init__`` first, the
    importer's own package included), and a package ``__init__``'s ``if TYPE_CHECKING:`` imports
    of its own modules are left out -- they are what a type checker sees of its PEP 562
    re-exports, which import nothing until a name is used, after the package has been imported.
    """
    modules = module_files(package_dir, package_name)
    graph: Graph = {}
    for importer, path in modules.items():
        edges = graph.setdefault(importer, {})
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        skipped = _type_checking_nodes(tree) if run_time and path.name == "__init__.py" else set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: the importer's package, then up level - 1
                    parts = importer.split(".")[: None if path.name == "__init__.py" else -1]
                    parts = parts[: max(0, len(parts) - node.level + 1)]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                subs = [f"{base}.{alias.name}" for alias in node.names]
                targets = [sub if sub in modules else base for sub in subs]
            else:
                continue
            if id(node) in skipped and all(t.startswith(importer + ".") for t in targets):
                continue
            if run_time:  # the enclosing packages first
                targets = [
                    ".".join(t.split(".")[:n]) for t in targets for n in range(1, t.count(".") + 2)
                ]
            for target in targets:
                inside = target == package_name or target.startswith(package_name + ".")
                if inside and target != importer:
                    edges[target] = min(edges.get(target, node.lineno), node.lineno)
    return graph


def _matches(name: str, pattern: str, package_name: str) -> bool:
    full = ".".join(part for part in (package_name, pattern.removesuffix(".*")) if part)
    return name == full or (pattern.endswith(".*") and name.startswith(full + "."))


def layer_of(name: str, package_name: str) -> int | None:
    found = (
        n for n, patterns in LAYERS.items() for p in patterns if _matches(name, p, package_name)
    )
    return next(found, None)


def unassigned_modules(graph: Graph, package_name: str) -> list[str]:
    return [m for m in sorted(graph) if layer_of(m, package_name) is None]


def layer_violations(graph: Graph, package_name: str) -> list[str]:
    """Upward imports, FORBIDDEN edges, and edges to names that are no module of the package."""
    problems: list[str] = []
    for importer, edges in sorted(graph.items()):
        level = layer_of(importer, package_name)
        if level is None:
            continue  # reported by unassigned_modules
        for target, line in sorted(edges.items()):
            edge, to = f"{importer} -> {target} (line {line})", layer_of(target, package_name)
            if target not in graph:  # e.g. a stale import of a module that moved
                problems.append(f"{edge}: not a module of the package")
                continue
            if to is not None and to > level:
                problems.append(f"{edge}: upward import L{level} -> L{to}")
            problems += [
                f"{edge}: {why}"
                for src, dst, allowed, why in FORBIDDEN
                if _matches(importer, src, package_name)
                and _matches(target, dst, package_name)
                and not any(_matches(target, a, package_name) for a in allowed)
            ]
    return problems


def import_cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for child in sorted(t for t in graph[node] if t in graph):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component, stack[stack.index(node) :] = stack[stack.index(node) :], []
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def describe_cycles(graph: Graph, components: list[list[str]]) -> list[str]:
    lines: list[str] = []
    for members in components:
        lines.append(f"cycle between {', '.join(members)}:")
        for a in members:
            lines += [
                f"  {a} -> {b} (line {n})" for b, n in sorted(graph[a].items()) if b in members
            ]
    return lines


def fail_if(problems: list[str], header: str) -> None:
    __tracebackhide__ = True  # and no `assert`: pytest would repeat the list as a repr
    if problems:
        raise AssertionError(f"{header}:\n" + "\n".join(problems))


# Run in a fresh interpreter: import each name in turn; what it newly loads under the prefix.
PROBE = """import importlib, sys
found = {}
for name in sys.argv[2:]:
    before = set(sys.modules)
    try:
        importlib.import_module(name)
        error = []
    except Exception as e:
        error = [f"cannot be imported ({type(e).__name__}: {e})"]
    new = sorted(m for m in set(sys.modules) - before if m.startswith(sys.argv[1]))
    found[name] = "; ".join(error + (["newly loads " + ", ".join(new)] if new else []))
print(repr(found))
"""


def new_modules(imports: list[str], prefix: str) -> list[str]:
    """Per name: what it newly loads starting with prefix, or that it cannot be imported."""
    __tracebackhide__ = True
    command = [sys.executable, "-c", PROBE, prefix, *imports]
    # logfire (a dev extra) registers a pydantic plugin that imports OpenTelemetry the first time
    # pydantic builds a model, in any program where logfire is installed: that is logfire's
    # import, not stepfork's, so the probe measures stepfork's own imports without it.
    env = {**os.environ, "PYDANTIC_DISABLE_PLUGINS": "logfire-plugin"}
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    fail_if([run.stderr.strip()] if run.returncode else [], "the import subprocess failed")
    found: dict[str, str] = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    return [f"{name} {problem}" for name, problem in found.items() if problem]


# --- the real package --------------------------------------------------------------------------


def test_every_module_has_a_layer() -> None:
    missing = unassigned_modules(build_graph(ROOT / PACKAGE, PACKAGE), PACKAGE)
    fail_if([f"unassigned module {m}: add it to the layer map" for m in missing], "layer map")


def test_no_import_cycles() -> None:
    graph = build_graph(ROOT / PACKAGE, PACKAGE, run_time=True)
    header = "import cycles (an import of a.b runs a/__init__ first: an edge to the package)"
    fail_if(describe_cycles(graph, import_cycles(graph)), header)


def test_no_upward_or_forbidden_imports() -> None:
    graph = build_graph(ROOT / PACKAGE, PACKAGE)
    fail_if(layer_violations(graph, PACKAGE), "layer violations")


def test_recording_boundaries_loads_no_opentelemetry_sdk() -> None:
    bad = new_modules([f"{PACKAGE}.recording.boundaries"], "opentelemetry.sdk")
    fail_if(bad, "recording.boundaries must load no opentelemetry.sdk module")


def test_trace_loads_no_opentelemetry() -> None:
    names = [m for m in module_files(ROOT / PACKAGE, PACKAGE) if _matches(m, "trace.*", PACKAGE)]
    fail_if(new_modules(sorted(names), "opentelemetry"), "trace/ must load no opentelemetry module")


def _loaded_by(code: str) -> list[str]:
    """The ``stepfork_otel`` and ``opentelemetry`` modules and ``pydantic`` that ``code`` loads
    in a fresh interpreter (logfire's plugin off, as in :func:`new_modules`)."""
    __tracebackhide__ = True
    probe = f"import sys\n{code}\nprint(repr(sorted(sys.modules)))"
    env = {**os.environ, "PYDANTIC_DISABLE_PLUGINS": "logfire-plugin"}
    run = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    fail_if([run.stderr.strip()] if run.returncode else [], "the import subprocess failed")
    loaded: list[str] = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    return [m for m in loaded if m.startswith((PACKAGE, "opentelemetry")) or m == "pydantic"]


def test_trace_canonical_loads_no_other_trace_module() -> None:
    """The package faces import nothing of their own: canonical JSON is canonical JSON (it was 19
    stepfork modules when ``trace/__init__`` connected the models to the bundle reader)."""
    loaded = _loaded_by("import stepfork_otel.trace.canonical")
    expected = ["constants", "_lazy", "_version", "trace", "trace.canonical"]
    assert [m for m in loaded if m.startswith(PACKAGE)] == sorted(
        [PACKAGE, *(f"{PACKAGE}.{name}" for name in expected)]
    )


def test_stepfork_validate_loads_no_opentelemetry_and_help_no_command(tmp_path: Path) -> None:
    """``stepfork validate`` imports its command only: not replay, recording or OpenTelemetry (and
    builds no redactor); ``stepfork --help`` no command and not the models (pydantic builds none)."""
    from stepfork_otel.trace.models import RunInfo, Trace

    bundle = tmp_path / "layers.sftrace"
    Trace(trace_id="0" * 32, run=RunInfo(name="layers")).save(bundle)
    run = "from stepfork_otel.cli import main\nrc = main({})\nassert rc == 0, rc"
    unbuilt = (  # reading needs no redactor: the default one is built on first use
        "\nfrom stepfork_otel.trace.redaction import engine"
        "\nassert 'DEFAULT_REDACTOR' not in vars(engine), 'the default redactor was built'"
    )
    validate = _loaded_by(run.format(repr(["validate", str(bundle)])) + unbuilt)
    assert f"{PACKAGE}.cli.validate_cmd" in validate
    unwanted = (f"{PACKAGE}.replay", f"{PACKAGE}.recording", f"{PACKAGE}.otel", "opentelemetry")
    fail_if([m for m in validate if m.startswith(unwanted)], "stepfork validate loads")
    help_loads = _loaded_by(run.format("['--help']"))
    heavy = [m for m in help_loads if m.endswith(("_cmd", ".models", ".bundle"))]
    fail_if(heavy, "stepfork --help loads")


def test_package_faces_are_lazy_and_complete() -> None:
    """Every package ``__init__`` with re-exports keeps to ``_lazy``: ``_EXPORTS`` names exactly
    ``__all__`` (but ``__version__``), the TYPE_CHECKING block imports exactly those names from
    exactly those modules, and each name resolves."""
    import importlib

    problems: list[str] = []
    for name, path in module_files(ROOT / PACKAGE, PACKAGE).items():
        if path.name != "__init__.py" or not (tree := ast.parse(path.read_text("utf-8"))):
            continue
        checking = _type_checking_nodes(tree)
        declared = {
            alias.asname or alias.name: node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and id(node) in checking
            for alias in node.names
        }
        module = importlib.import_module(name)
        exports: dict[str, str] = getattr(module, "_EXPORTS", {})
        public = set(getattr(module, "__all__", [])) - {"__version__"}
        if exports and (declared != exports or set(exports) != public):
            problems.append(f"{name}: _EXPORTS, __all__ and the TYPE_CHECKING imports differ")
        problems += [f"{name}.{n} does not resolve" for n in exports if not hasattr(module, n)]
        if name != f"{PACKAGE}.cli" and not exports and (declared or public):
            problems.append(f"{name}: re-exports without _EXPORTS")
    fail_if(problems, "package faces")


def test_cli_help_lines_are_the_commands_own() -> None:
    """The names and help lines ``stepfork --help`` shows without importing the commands are the
    ones their modules register."""
    from stepfork_otel import cli

    def listing(parser: argparse.ArgumentParser) -> list[tuple[str, str | None]]:
        actions = [a for a in parser._actions if a.dest == "command"]
        return [(c.dest, c.help) for a in actions for c in a._choices_actions]

    lazy, full = cli.build_parser(), cli.build_parser(list(cli.COMMANDS))
    assert listing(lazy) == listing(full) == [(n, h) for n, (_, h) in cli.COMMANDS.items()]
    assert lazy.format_help() == full.format_help()


# --- self-tests on a synthetic package laid out like the real layers ----------------------------

BASE: dict[str, str] = {  # no violation: each self-test adds files and expects exact findings
    "__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.trace import models\n",
    "constants.py": "",
    "trace/__init__.py": "",
    "trace/models.py": "from pkg.constants import X\n",
    "recording/__init__.py": "",
    "recording/contract.py": "from ..trace.models import Thing\n",
    "recording/boundaries.py": "from . import contract\n",
    "replay/__init__.py": "",
    "replay/session.py": "from pkg.recording.contract import Replayer\n",
}


def fake_graph(tmp_path: Path, extra: dict[str, str], *, run_time: bool = False) -> Graph:
    """The graph of BASE plus extra files (path inside the package -> source)."""
    for rel, text in {**BASE, **extra}.items():
        (tmp_path / "pkg" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / rel).write_text(text, encoding="utf-8")
    return build_graph(tmp_path / "pkg", "pkg", run_time=run_time)


def test_selftest_upward_import_in_function_is_reported(tmp_path: Path) -> None:
    late = "def load():\n    from pkg.recording.boundaries import f\n"
    graph = fake_graph(tmp_path, {"trace/bundle.py": late, "extra.py": "import pkg.gone\n"})
    assert layer_violations(graph, "pkg") == [
        "pkg.trace.bundle -> pkg.recording.boundaries (line 2): upward import L1 -> L3"
    ]
    assert unassigned_modules(graph, "pkg") == ["pkg.extra"]
    assert import_cycles(graph) == []


def test_selftest_forbidden_edges_are_reported(tmp_path: Path) -> None:
    extra = {
        "replay/session.py": "import pkg.recording.contract\n"
        "from pkg.recording import boundaries, y\n",
        "otel/x.py": "import pkg.replay\nfrom pkg.gone import y\n",
        "pytest_plugin.py": "class P:\n    def f(self):\n        import pkg.cli.report as r\n",
        "cli/report.py": "",
    }
    assert layer_violations(fake_graph(tmp_path, extra), "pkg") == [
        "pkg.otel.x -> pkg.gone (line 2): not a module of the package",
        "pkg.otel.x -> pkg.replay (line 1): otel and replay never import each other",
        "pkg.pytest_plugin -> pkg.cli.report (line 3): pytest_plugin imports nothing under cli",
        "pkg.replay.session -> pkg.recording (line 2): replay takes only recording.contract",
        "pkg.replay.session -> pkg.recording.boundaries (line 2): "
        "replay takes only recording.contract",
    ]


def test_selftest_cycle_is_reported(tmp_path: Path) -> None:
    cyclic = {"trace/a.py": "from . import b\n", "trace/b.py": "x = 1\nimport pkg.trace.a\n"}
    graph = fake_graph(tmp_path, cyclic)
    components = import_cycles(graph)
    assert components == [["pkg.trace.a", "pkg.trace.b"]]
    assert describe_cycles(graph, components) == [
        "cycle between pkg.trace.a, pkg.trace.b:",
        "  pkg.trace.a -> pkg.trace.b (line 1)",
        "  pkg.trace.b -> pkg.trace.a (line 2)",
    ]


def test_selftest_base_has_no_run_time_cycle(tmp_path: Path) -> None:
    graph = fake_graph(tmp_path, {}, run_time=True)
    assert graph["pkg.recording.contract"] == {"pkg": 1, "pkg.trace": 1, "pkg.trace.models": 1}
    assert graph["pkg"] == {}  # a face's TYPE_CHECKING re-exports run nothing
    assert import_cycles(graph) == []


def test_selftest_cycle_through_a_package_init_is_reported(tmp_path: Path) -> None:
    """The face imports a module that imports a sibling: importing the sibling runs the face
    first -- a cycle the plain graph (edges to what each statement names) does not have."""
    eager_face = {
        "trace/__init__.py": "from pkg.trace import bundle\n",
        "trace/bundle.py": "\nfrom pkg.trace.models import Thing\n",
    }
    assert import_cycles(fake_graph(tmp_path, eager_face)) == []
    graph = fake_graph(tmp_path, eager_face, run_time=True)
    components = import_cycles(graph)
    assert components == [["pkg.trace", "pkg.trace.bundle"]]
    assert describe_cycles(graph, components) == [
        "cycle between pkg.trace, pkg.trace.bundle:",
        "  pkg.trace -> pkg.trace.bundle (line 1)",
        "  pkg.trace.bundle -> pkg.trace (line 2)",
    ]


def test_selftest_function_level_cycle_is_reported(tmp_path: Path) -> None:
    lazy = {
        "trace/models.py": "class T:\n    def load(self):\n        from pkg.trace import bundle\n",
        "trace/bundle.py": "from pkg.trace.models import T\n",
    }
    components = import_cycles(fake_graph(tmp_path, lazy, run_time=True))
    assert components == [["pkg.trace.bundle", "pkg.trace.models"]]


def test_selftest_type_checking_cycle_outside_a_face_is_reported(tmp_path: Path) -> None:
    """Only a package ``__init__``'s TYPE_CHECKING imports of its own modules are left out."""
    checking = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.trace import b\n"
    cyclic = {"trace/a.py": checking, "trace/b.py": "from pkg.trace import a\n"}
    components = import_cycles(fake_graph(tmp_path, cyclic, run_time=True))
    assert components == [["pkg.trace.a", "pkg.trace.b"]]
    upward = {"trace/__init__.py": checking.replace("pkg.trace import b", "pkg import recording")}
    graph = fake_graph(tmp_path, {**upward, "recording/__init__.py": "import pkg.trace.models\n"})
    assert graph["pkg.trace"] == {"pkg.recording": 3}  # not its own module: kept, and a cycle
    assert import_cycles(fake_graph(tmp_path, {}, run_time=True)) != []


def test_selftest_type_checking_and_relative_imports_are_detected(tmp_path: Path) -> None:
    checking = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..replay import session\n"
    )
    package_init = "from . import session\nfrom .. import Z\n"
    graph = fake_graph(tmp_path, {"recording/run.py": checking, "replay/__init__.py": package_init})
    assert graph["pkg.recording.run"] == {"pkg.replay.session": 3}
    assert graph["pkg.replay"] == {"pkg.replay.session": 1, "pkg": 2}
    assert graph["pkg.recording.contract"] == {"pkg.trace.models": 1}
    assert graph["pkg.recording.boundaries"] == {"pkg.recording.contract": 1}
    assert graph["pkg"] == {"pkg.trace.models": 3}
    assert layer_violations(graph, "pkg") == [
        "pkg.recording.run -> pkg.replay.session (line 3): upward import L3 -> L4",
        "pkg.replay -> pkg (line 2): upward import L4 -> L5",
    ]


def test_architecture_doc_names_every_module() -> None:
    """docs/architecture.md is where contributors find their way: every module is in its tables
    (as its file name under its package), and every file it names exists."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    package_dir = ROOT / PACKAGE
    every = {path.relative_to(package_dir).as_posix() for path in package_dir.rglob("*.py")}
    modules = {f for f in every if not f.endswith(("__init__.py", "__main__.py"))}
    listed = {cell for cell in page.split("`") if cell.endswith(".py") and " " not in cell}
    missing = sorted(f for f in modules if f not in listed and f.split("/", 1)[-1] not in listed)
    assert not missing, f"modules missing from docs/architecture.md: {missing}"
    unknown = sorted(
        name
        for name in listed
        if not (ROOT / name).is_file()
        and name not in every
        and not any(f.endswith("/" + name) for f in every)
    )
    assert not unknown, f"docs/architecture.md names files that do not exist: {unknown}"
