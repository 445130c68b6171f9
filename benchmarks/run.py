"""Run every benchmark and write ``benchmarks/RESULTS.md``: ``python benchmarks/run.py [--quick]``.

Each ``benchmarks/bench_*.py`` exposes ``run(quick: bool = False) -> str`` returning a markdown
section; this script discovers them (in name order), runs them one after the other in this
process, and writes the sections under a description of the machine, because every number here is
only meaningful next to the machine and the library versions it was measured with.

``--quick`` runs each benchmark on small inputs (seconds, used by the smoke test) and, so that a
quick check never overwrites the committed results, prints instead of writing unless ``--output``
is given.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import subprocess
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # `python benchmarks/run.py` puts benchmarks/, not the root, first
    sys.path.insert(0, str(ROOT))

PACKAGES = (
    "stepfork-otel",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "pydantic",
    "pydantic-core",
    "orjson",
    "google-re2",
)


def discover() -> list[str]:
    """Module names of the benchmarks, ``benchmarks.bench_*``, in name order."""
    return sorted(f"benchmarks.{p.stem}" for p in HERE.glob("bench_*.py"))


def _proc_field(path: str, field: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.split(":")[0].strip() == field:
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return f"{line.split('=', 1)[1].strip(chr(34))} ({platform.platform()})"
    except OSError:
        pass
    return platform.platform()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git_commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{head}{' + uncommitted changes' if dirty else ''}" if head else "unknown"


def machine_description() -> str:
    """Markdown list: CPU, cores, memory, OS, Python, package versions, load."""
    cpu = _proc_field("/proc/cpuinfo", "model name") or platform.processor() or "unknown"
    mem_kib = _proc_field("/proc/meminfo", "MemTotal")
    memory = f"{int(mem_kib.split()[0]) / 1024**2:.1f} GiB" if mem_kib else "unknown"
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    versions = ", ".join(f"{p} {_version(p)}" for p in PACKAGES)
    return "\n".join(
        [
            f"- CPU: {cpu} ({os.cpu_count()} logical cores, {usable} usable by this process)",
            f"- Memory: {memory}",
            f"- OS: {_os_name()}",
            f"- Python: {platform.python_implementation()} {platform.python_version()}",
            f"- Packages: {versions}",
            f"- Code: commit {_git_commit()}",
            f"- Load average at start (1, 5, 15 min): {load} -- a shared machine: only ratios "
            "measured in the same run are compared",
        ]
    )


def run_all(quick: bool, only: list[str] | None = None) -> tuple[str, bool]:
    """All sections as one markdown document, and whether every benchmark ran."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = [
        "# stepfork_otel benchmarks",
        "",
        f"Measured {now} with `python benchmarks/run.py{' --quick' if quick else ''}`"
        + (" (quick mode: small inputs, not the results)" if quick else "")
        + ". Every number is a median over repeated, interleaved rounds; comparisons are ratios "
        "against a baseline measured in the same run.",
        "",
        "## Machine",
        "",
        machine_description(),
        "",
    ]
    sections: list[str] = []
    ok = True
    for name in discover():
        if only and not any(name.endswith(o) for o in only):
            continue
        started = time.perf_counter()
        print(f"running {name}{' (quick)' if quick else ''} ...", file=sys.stderr, flush=True)
        try:
            module = importlib.import_module(name)
            section = module.run(quick=quick)
        except Exception:
            ok = False
            section = f"## {name}: FAILED\n\n```\n{traceback.format_exc()}```\n"
        elapsed = time.perf_counter() - started
        print(f"  {name}: {elapsed:.1f} s", file=sys.stderr, flush=True)
        sections.append(f"{section.rstrip()}\n\n_{name} ran in {elapsed:.1f} s._\n")
    if not quick and (HERE / "FUZZ_RESULTS.md").exists():  # its own, longer command
        sections.append(
            "## Hostile input: the fuzz campaign (benchmarks/fuzz.py)\n\n"
            "Run apart (`python -m benchmarks.fuzz`, minutes): its last result, with the cases "
            "tried, typed errors, untyped failures, hangs and peak memory, is "
            "[`FUZZ_RESULTS.md`](FUZZ_RESULTS.md).\n"
        )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    sections.append(f"_Load average at the end (1, 5, 15 min): {load}._\n")
    return "\n".join(header + sections), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small inputs; print, do not write")
    parser.add_argument("--output", type=Path, help="write here (default: benchmarks/RESULTS.md)")
    parser.add_argument("--only", action="append", help="run only benchmarks ending in this name")
    args = parser.parse_args(argv)
    document, ok = run_all(args.quick, args.only)
    output = args.output or (None if args.quick else HERE / "RESULTS.md")
    if output is None:
        print(document)
    else:
        output.write_text(document)
        print(f"wrote {output}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
