"""The ``stepfork`` command: implemented with issue 4."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    raise SystemExit("stepfork: the command line is not implemented yet")
