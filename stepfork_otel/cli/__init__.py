"""The ``stepfork`` command: ``replay``, ``validate``, ``export pytest``, ``show``, ``diff`` and
``import``.

Each command is one module with ``add_parser(subparsers)`` and ``run(args) -> int``; ``main``
builds the parser from the list of those modules, so a command is added by writing its module and
naming it here. Errors are handled once, here: a :class:`~stepfork_otel.cli._common.CliError` (or
a bundle that cannot be read) is one line on stderr and exit 2; a traceback only with
``--verbose``. argparse is used (not click or rich): the command must not add dependencies.

Output works with any stream encoding: ``main`` sets stdout and stderr to write what the encoding
cannot hold as backslash escapes (``PYTHONIOENCODING=ascii``, a redirect to a cp1252 file on
Windows), so no command fails with ``UnicodeEncodeError`` for a character it prints.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import traceback
from collections.abc import Iterator
from types import ModuleType
from typing import Any, NoReturn, TextIO

from stepfork_otel.cli import (
    diff_cmd,
    export_cmd,
    import_cmd,
    redaction_cmd,
    replay_cmd,
    show_cmd,
    validate_cmd,
)
from stepfork_otel.cli._common import EXIT_BAD_INPUT, EXIT_OK, CliError, print_error, styled_line
from stepfork_otel.trace.errors import BundleError


def command_modules() -> list[ModuleType]:
    """The command modules, in the order ``stepfork --help`` lists them."""
    return [replay_cmd, validate_cmd, export_cmd, show_cmd, diff_cmd, import_cmd, redaction_cmd]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (like every other error of the command)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from stepfork_otel import __version__

    parser = _Parser(
        prog="stepfork",
        description="Replay, check, inspect and compare .sftrace bundles of recorded agent runs.",
    )
    parser.add_argument("--version", action="version", version=f"stepfork_otel {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in command_modules():
        before = set(subparsers.choices)
        module.add_parser(subparsers)
        for name in set(subparsers.choices) - before:
            subparsers.choices[name].set_defaults(_run=module.run)
    return parser


# The commands escape every line they print (``_common.terminal_safe``). This is the net under
# them, for text printed without it -- the entrypoint's own output during a replay, argparse's
# messages: control characters other than newline, tab and carriage return, and escape sequences
# other than colour (SGR) and erase-line, are shown escaped; colours a ``Style`` marked are written.
_UNSAFE = re.compile(r"\x1b\[[0-9;]*[mK]|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _escape(match: re.Match[str]) -> str:
    text = match.group()
    return text if len(text) > 1 else text.encode("unicode_escape").decode("ascii")


def _unsafe_escaped(text: str) -> str:
    return _UNSAFE.sub(_escape, text)


class _TerminalSafe:
    """A text stream that writes control characters escaped (see ``_UNSAFE``)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(styled_line(text, escape=_unsafe_escaped))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _any_encoding(*streams: TextIO) -> Iterator[None]:
    """Characters a stream's encoding cannot hold are written as backslash escapes (``\\xfc``,
    ``\\u2026``) instead of failing; the streams are set back afterwards."""
    changed: list[tuple[io.TextIOWrapper[Any], str]] = []
    for stream in streams:
        if isinstance(stream, io.TextIOWrapper) and stream.errors != "backslashreplace":
            before = stream.errors or "strict"
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # closed, or a stream that cannot be reconfigured
                continue
            changed.append((stream, before))
    try:
        yield
    finally:
        for stream, errors in changed:
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors=errors)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    stdout, stderr = sys.stdout, sys.stderr
    with _any_encoding(stdout, stderr):
        sys.stdout = _TerminalSafe(stdout)
        sys.stderr = _TerminalSafe(stderr)
        try:
            return _main(argv)
        finally:
            sys.stdout, sys.stderr = stdout, stderr


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    verbose = bool(getattr(args, "verbose", False))
    try:
        return int(run(args))
    except (CliError, BundleError) as exc:
        if verbose:
            traceback.print_exc()
        print_error(str(exc))
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print_error("interrupted")
        return 130
    except BrokenPipeError:  # `stepfork show ... | head`: the reader left; not an error to report
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # a bug in stepfork itself: still one line unless --verbose
        if verbose:
            traceback.print_exc()
        print_error(
            f"internal error: {type(exc).__name__}: {exc} (run with --verbose for the traceback)"
        )
        return EXIT_BAD_INPUT
