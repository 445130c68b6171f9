"""Reading a process's own memory from ``/proc`` (Linux), for the benchmarks' child processes.
Standard library only: a child imports this before it measures anything."""

from __future__ import annotations

from pathlib import Path


def status(field: str) -> int:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> bool:
    """Reset the resident high-water mark (``VmHWM``) to now; False where the kernel cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True
