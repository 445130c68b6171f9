"""The ``stepfork`` command: ``replay``, ``validate``, ``export pytest``, ``show``, ``diff`` and
``import``.

Each command is one module with ``add_parser(subparsers)`` and ``run(args) -> int``; ``main``
builds the parser from :data:`COMMANDS`, so a command is added by writing its module and naming it
there. Only the module of the command being run is imported (``stepfork validate`` loads neither
the replay machinery nor OpenTelemetry; ``stepfork --help`` loads no command): the others appear in
the parser by name and help line only (``tests/test_layers.py`` checks those lines are the ones the
modules register). Errors are handled once, here: a :class:`~stepfork_otel.cli._common.CliError` (or
a bundle that cannot be read) is one line on stderr and exit 2; a traceback only with
``--verbose``. argparse is used (not click or rich): the command must not add dependencies.

Output works with any stream encoding: ``main`` sets stdout and stderr to write what the encoding
cannot hold as backslash escapes (``PYTHONIOENCODING=ascii``, a redirect to a cp1252 file on
Windows), so no command fails with ``UnicodeEncodeError`` for a character it prints.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import io
import os
import re
import sys
import traceback
from collections.abc import Collection, Iterator, Sequence
from typing import Any, NoReturn, TextIO

from stepfork_otel.cli._common import EXIT_BAD_INPUT, EXIT_OK, CliError, print_error, styled_line
from stepfork_otel.trace.errors import BundleError

#: Every command, in the order ``stepfork --help`` lists them: its module (under ``cli/``) and the
#: line ``stepfork --help`` shows for it (the module's own ``help=``, kept equal by a test).
COMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("replay_cmd", "re-run an entrypoint against a recorded bundle and compare"),
    "validate": ("validate_cmd", "check bundles: schema, structure, fingerprints, completeness"),
    "export": ("export_cmd", "turn a recorded run into a regression test"),
    "show": ("show_cmd", "print a recorded run as a tree of calls"),
    "diff": ("diff_cmd", "the first point where two recorded runs differ"),
    "import": ("import_cmd", "rebuild .sftrace bundles from OTLP JSON a collector captured"),
    "redaction-rules": ("redaction_cmd", "list the active redaction rules, with their family"),
    "redact": ("redaction_cmd", "show what recording keeps of a text, and which rules fired"),
}


def command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` runs: its first word that is not an option (the top-level options take
    no value), or None."""
    return next((word for word in argv if not word.startswith("-")), None)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (like every other error of the command), and a
    mistyped choice -- a command (``stepfork repaly``), an export kind, an option's value --
    names the one meant when one is close (argparse suggests nothing before Python 3.14).
    Subparsers are made of this class too (argparse gives them the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is None or value in choices:
            return
        names = [str(choice) for choice in choices]
        close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.6)
        if not close:
            super()._check_value(action, value)
        raise argparse.ArgumentError(action, f"invalid choice: {value!r}; did you mean {close[0]}?")


def build_parser(commands: Collection[str] = ()) -> argparse.ArgumentParser:
    """The parser; the modules of ``commands`` are imported and add their own (full) parsers,
    every other command is its name and help line."""
    from stepfork_otel import __version__

    parser = _Parser(
        prog="stepfork",
        description="Replay, check, inspect and compare .sftrace bundles of recorded agent runs.",
    )
    parser.add_argument("--version", action="version", version=f"stepfork_otel {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = {COMMANDS[name][0] for name in commands if name in COMMANDS}
    for name, (module_name, line) in COMMANDS.items():
        if name in subparsers.choices:  # added with another command of its module
            continue
        if module_name not in wanted:
            subparsers.add_parser(name, help=line, add_help=False)
            continue
        module = importlib.import_module(f"{__name__}.{module_name}")
        before = set(subparsers.choices)
        module.add_parser(subparsers)
        for added in set(subparsers.choices) - before:
            subparsers.choices[added].set_defaults(_run=module.run)
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
    argv = sys.argv[1:] if argv is None else argv
    command = command_of(argv)
    parser = build_parser([command] if command is not None else [])
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
