"""What every ``stepfork`` command shares: exit codes, the one-line error, bundle loading,
fingerprint abbreviation, colour and progress on a terminal, text made inert for the terminal, and
resolving a trusted entrypoint.

Why one module: the commands must fail the same way (one line on stderr naming the problem, exit
2, a traceback only with ``--verbose``), and a user reading two commands' output must see
fingerprints, previews and colours written the same way. ``import_cmd`` (issue 5) uses it too.
Fingerprints are shortened by :func:`~stepfork_otel.trace.canonical.short_fingerprint` and payloads
previewed by :func:`~stepfork_otel.replay.report.report_preview`, the spellings the pytest plugin
uses as well.

**Terminal output is inert.** A bundle is data: a run name, an error message or a payload must not
recolour, conceal, retitle, clear or reorder what the terminal shows. Every line a command prints
goes through :func:`terminal_safe` (or :meth:`Style.line`, the same with the command's own colours
kept), where it is printed -- the bundle itself is never changed. ``--json`` output is escaped by
:func:`json_text`.

Only the standard library is used: the command is a thin layer over the package, and a colour or
CLI framework would be a dependency for a few escape codes.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import json
import os
import re
import secrets
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

from stepfork_otel.trace.canonical import canonical_json, short_fingerprint
from stepfork_otel.trace.errors import BundleError

if TYPE_CHECKING:
    from stepfork_otel.trace.errors import Problem
    from stepfork_otel.trace.models import CallEvent, Trace

# The bundle reader, the models and the replay report are imported where they are used: every
# command imports this module, and ``stepfork --help`` or a usage error should not load them.

#: Completed and matched / same / valid.
EXIT_OK = 0
#: Diverged / different / invalid.
EXIT_DIFFERENT = 1
#: Bad input: unreadable bundle, bad option, unresolvable entrypoint.
EXIT_BAD_INPUT = 2


class CliError(Exception):
    """A problem with what the user gave (a file, an option, an entrypoint). ``main`` prints it
    as one line on stderr and exits 2. The message should name the thing and the problem."""


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """``--verbose`` (full fingerprints, longer previews, tracebacks on errors), and the
    command's own refusal of arguments it does not know (:func:`refuse_unknown_arguments`).
    Every command's parser calls it."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="full SHA-256 fingerprints, longer previews, and a traceback on errors",
    )
    refuse_unknown_arguments(parser)


def refuse_unknown_arguments(parser: argparse.ArgumentParser) -> None:
    """Make a command's parser refuse the arguments it does not know itself, naming the option
    meant (``did you mean --json?``) and the command's own help.

    argparse hands a command's unknown arguments up to the top-level parser, whose error names
    neither (``stepfork: error: unrecognized arguments: --jsn (see stepfork --help)``), and
    suggests nothing before Python 3.14. The command's parser sees its own options, so it is
    where the error is made: its ``error`` is the one-line error of every usage error."""
    parse_known = parser.parse_known_args

    def parse_known_args(args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = parse_known(args, namespace)
        if extras:
            parser.error(unrecognized_arguments(parser, extras))
        return parsed, extras

    setattr(parser, "parse_known_args", parse_known_args)  # noqa: B010 (an instance's method)


def unrecognized_arguments(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """``unrecognized arguments: …``, with the closest option of ``parser`` for each unknown
    long option that is close to one (``--entrypiont=x``: ``did you mean --entrypoint?``)."""
    names = {  # compared without the dashes, which every long option shares
        option[2:]: option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--")
    }
    meant: list[str] = []
    for extra in extras:
        if extra.startswith("--"):
            typed = extra.split("=", 1)[0][2:]
            for name in difflib.get_close_matches(typed, sorted(names), n=1, cutoff=0.7):
                if names[name] not in meant:
                    meant.append(names[name])
    message = f"unrecognized arguments: {' '.join(extras)}"
    return f"{message}; did you mean {' or '.join(meant)}?" if meant else message


# --- inert text ------------------------------------------------------------------------------------

#: What :func:`terminal_safe` escapes: every C0 control character (newline and tab included), DEL,
#: every C1 control, and the bidi controls -- embeddings and overrides (U+202A-U+202E), isolates
#: (U+2066-U+2069), the marks (U+200E, U+200F) and the Arabic letter mark (U+061C).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: The same characters minus C0, which JSON escapes itself.
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _SHORT_ESCAPES.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def terminal_safe(text: str) -> str:
    """``text`` made inert for a terminal: every control character (C0 -- newline and tab too --,
    DEL, C1) and every bidi control written as a Python-style escape (``\\n``, ``\\x1b``,
    ``\\u202e``); everything else, other non-ASCII text included, unchanged.

    Apply it to each line printed with text from a bundle (or to that text before it is put in a
    line): the line's own structure is the newlines of the print, never those of the data."""
    return _UNSAFE.sub(_escape, text)


def inert_json(text: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``) with the characters JSON leaves raw in
    its strings -- DEL, C1, the bidi controls -- written as ``\\u`` escapes: the same data, inert.
    (Also a valid Python string literal that means the same string.)"""
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def json_text(data: Any) -> str:
    """``--json`` output: indented JSON, non-ASCII kept, inert (:func:`inert_json`)."""
    return inert_json(json.dumps(data, indent=2, ensure_ascii=False))


def print_error(message: str, stream: TextIO | None = None) -> None:
    """``stepfork: error: <message>`` on stderr, always one line (extra lines are dropped) and
    inert (:func:`terminal_safe`: a message quotes file names and bundle text)."""
    first = message.strip().splitlines()[0] if message.strip() else "unknown error"
    print(f"stepfork: error: {terminal_safe(first)}", file=stream or sys.stderr)


def print_note(message: str) -> None:
    """``stepfork: note: <message>`` on stderr, inert."""
    print(f"stepfork: note: {terminal_safe(message)}", file=sys.stderr)


def load_bundle(path: str | os.PathLike[str]) -> Trace:
    """Load and structurally validate a bundle; any failure becomes a one-line :class:`CliError`
    naming the file (missing, directory, not a bundle, truncated, newer format version, ...)."""
    from stepfork_otel.trace.bundle import load_trace

    try:
        return load_trace(path)
    except BundleError as exc:
        raise CliError(str(exc)) from None


def bundle_problems(trace: Trace, verify: bool = True) -> tuple[list[Problem], list[Problem]]:
    """What ``stepfork validate`` reports of a loaded bundle: (problems, warnings).

    Problems make a bundle invalid: its structure; with ``verify``, a stored fingerprint that does
    not match what it covers and a payload replay cannot parse; a payload recorded as the
    unserialisable marker. Warnings: calls replay cannot serve for want of data (no recorded
    result, a payload left off the span) and, with ``verify``, what an older bundle leaves
    unverified. An incomplete run is neither: the caller says so (``trace.complete``)."""
    from stepfork_otel.trace import checks

    problems = checks.validate_structure(trace)
    if verify:
        problems += checks.verify_integrity(trace)
        problems += checks.unreadable_payloads(trace)
    problems += checks.unreplayable_calls(trace)
    warnings = checks.missing_payloads(trace)
    if verify:
        warnings += checks.unverified_fields(trace)
    return problems, warnings


def replay_stops_at(trace: Trace, missing: Problem) -> bool:
    """Whether replay stops at the call a missing payload (a warning of :func:`bundle_problems`)
    belongs to. It does, except for a call's input left off the span whose fingerprint was kept:
    replay matches that call by the fingerprint."""
    from stepfork_otel.trace.models import LlmRequest, ToolCall

    event = next((e for e in trace.events if e.id == missing.event_id), None)
    return not (
        isinstance(event, (ToolCall, LlmRequest))
        and event.input is None
        and bool(event.input_sha256)
        and missing.message.startswith("input")
    )


def abbreviate(fingerprint: str | None, verbose: bool = False) -> str:
    """A SHA-256 hex digest as shown to people (:func:`short_fingerprint`), ``-`` for none."""
    return short_fingerprint(fingerprint, verbose=verbose, missing="-")


def abbreviate_in_data(data: Any, verbose: bool = False) -> Any:
    """:func:`~stepfork_otel.replay.report.abbreviate_in_text` applied to every string of a
    JSON-ready structure."""
    from stepfork_otel.replay.report import abbreviate_in_text

    if verbose:
        return data
    if isinstance(data, str):
        return abbreviate_in_text(data)
    if isinstance(data, dict):
        return {k: abbreviate_in_data(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [abbreviate_in_data(v) for v in data]
    return data


def format_duration(ns: int) -> str:
    if ns <= 0:
        return "-"
    if ns < 1_000_000:
        return f"{ns / 1000:.0f} µs"
    if ns < 1_000_000_000:
        return f"{ns / 1_000_000:.1f} ms"
    return f"{ns / 1_000_000_000:.2f} s"


def has_run_span(trace: Trace) -> bool:
    """Whether the bundle was written at a run span (``record(...)``, or a replay's run)."""
    run = trace.run
    return run.span_id is not None or run.name is not None or run.status != "unset"


def run_heading(trace: Trace) -> tuple[str, str, int]:
    """What ``show`` and the replay report call a bundle's run, how it ended, and how long it
    took (ns). A bundle written at a root span of the user's own -- calls outside any
    ``record(...)`` -- has no run span: it is named after that span, and "ended" when it did
    (its status unset), rather than reported as a run that did not finish."""
    run = trace.run
    status: str
    if has_run_span(trace):
        status = run.status if run.status != "unset" else "did not finish"
        took = run.end_time_unix_nano - run.start_time_unix_nano
        return f"run {run.name or '(unnamed)'}", status, took
    ids = {span.span_id for span in trace.context}
    root = next((s for s in trace.context if s.parent_span_id not in ids), None)
    if not trace.complete:
        status = "did not finish"
    elif root is None:
        status = "ended"
    else:
        status = {"error": "error", "ok": "ok"}.get(root.status, "ended")
    if root is None:
        return "calls outside a run", status, 0
    name = f"calls under your span {root.name!r}"
    return name, status, root.end_time_unix_nano - root.start_time_unix_nano


# --- terminal --------------------------------------------------------------------------------------


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


#: Marks the colours a :class:`Style` asks for until :func:`styled_line` writes them: random per
#: process, so no bundle can contain one (and NUL-delimited, so none survives escaping).
_MARK = "\x00" + secrets.token_hex(8)
_MARKED = re.compile(f"{_MARK}([0-9;]+)\x00")


def styled_line(text: str, escape: Callable[[str], str] = terminal_safe) -> str:
    """``text`` with the colours a :class:`Style` marked in it written as ANSI codes and every
    other part passed through ``escape`` (:func:`terminal_safe` by default)."""
    parts = _MARKED.split(text)  # text, code, text, code, ..., text
    return "".join(escape(part) if n % 2 == 0 else f"\033[{part}m" for n, part in enumerate(parts))


class Style:
    """ANSI colours, only when writing to a terminal and ``NO_COLOR`` is not set.

    The colours are *marked* in the text and written by :meth:`line`, which escapes everything
    else (:func:`terminal_safe`): a line mixing the command's colours with bundle text is printed
    ``print(style.line(text))``, and only the command's own colours reach the terminal."""

    def __init__(self, stream: TextIO | None, enabled: bool | None = None) -> None:
        if enabled is None:
            enabled = stream is not None and is_terminal(stream) and not os.environ.get("NO_COLOR")
        self.enabled = enabled

    def _wrap(self, code: str, text: str) -> str:
        return f"{_MARK}{code}\x00{text}{_MARK}0\x00" if self.enabled else text

    def line(self, text: str) -> str:
        """One line as it may be printed: inert, with this style's colours (:func:`styled_line`)."""
        return styled_line(text)

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def red(self, text: str) -> str:
        return self._wrap("31", text)

    def green(self, text: str) -> str:
        return self._wrap("32", text)

    def yellow(self, text: str) -> str:
        return self._wrap("33", text)

    def status(self, status: str) -> str:
        """A call or run status coloured by meaning."""
        if status in ("ok", "substituted", "executed", "MATCHED", "REPRODUCED FAILURE"):
            return self.green(status)
        if status in ("error", "rejected", "DIVERGED", "INVALID"):
            return self.red(status)
        return self.yellow(status)


class Progress:
    """One self-overwriting status line on stderr, shown only when stderr is a terminal (so
    piped or captured output stays quiet). ``describe`` is polled by a background thread."""

    def __init__(self, describe: Callable[[], str], stream: TextIO | None = None) -> None:
        self._describe = describe
        self._stream = stream or sys.stderr
        self.enabled = is_terminal(self._stream)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write(self, text: str) -> None:
        self._stream.write("\r\033[K" + terminal_safe(text))
        self._stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            self._write(self._describe())

    def __enter__(self) -> Progress:
        if self.enabled:
            self._write(self._describe())
            self._thread = threading.Thread(
                target=self._loop, name="stepfork-progress", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._write("")


# --- entrypoints -----------------------------------------------------------------------------------


@contextmanager
def _cwd_importable() -> Iterator[None]:
    # as `python -m` does: the current directory first on sys.path (kept there afterwards, the
    # entrypoint may import lazily while it runs)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path[:1]:
        sys.path.insert(0, cwd)
    yield


def resolve_entrypoint(spec: str) -> Callable[..., Any]:
    """Import ``MODULE:FUNCTION`` (the attribute may be dotted: ``module:Class.method``) from the
    current working directory and return the callable. This is the only code the command runs;
    nothing named in a bundle is ever imported. Every failure is a one-line :class:`CliError`."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path or ":" in attr_path:
        raise CliError(f"--entrypoint must be MODULE:FUNCTION (e.g. my_agent:run), got {spec!r}")
    with _cwd_importable():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (
                module_name == exc.name or module_name.startswith(exc.name + ".")
            ):
                raise CliError(
                    f"entrypoint module {module_name!r} not found (looked in {os.getcwd()} and "
                    "on sys.path)"
                ) from None
            raise CliError(
                f"importing entrypoint module {module_name!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        except (Exception, SystemExit) as exc:
            raise CliError(
                f"importing entrypoint module {module_name!r} raised {type(exc).__name__}: {exc}"
            ) from exc
    target: Any = module
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CliError(
                f"entrypoint {spec!r} not found: module {module_name!r} has no attribute "
                f"{attr_path!r}"
            ) from None
    if not callable(target):
        raise CliError(f"entrypoint {spec!r} is not callable (it is a {type(target).__name__})")
    return target  # type: ignore[no-any-return]


def recorded_arguments(trace: Trace) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """How the entrypoint is called with the recorded run input: no arguments when none was
    recorded, keyword arguments when it is a JSON object, else the value as the one positional
    argument. The input is the *redacted* one: a secret in it comes back as its marker."""
    from stepfork_otel.trace.models import payload_value

    run = trace.run
    if run.input is None:
        if run.input_missing is not None or run.input_sha256 is not None:
            raise CliError(
                f"the recorded run input is not in the bundle ({run.input_missing or 'missing'}), "
                "so the entrypoint cannot be called with it"
            )
        return (), {}
    value = payload_value(run.input)
    if isinstance(value, dict):
        return (), value
    return (value,), {}


def check_arguments(
    fn: Callable[..., Any], spec: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Fail (exit 2) before replaying when the entrypoint cannot take the recorded input."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some C callables have none: just try the call
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        shown = ", ".join([*(repr(a) for a in args), *(f"{k}=…" for k in kwargs)]) or "none"
        raise CliError(
            f"entrypoint {spec!r} does not accept the recorded run input (arguments: {shown}): "
            f"{exc}"
        ) from None


def call_text(spec: str, args: tuple[Any, ...], kwargs: dict[str, Any], limit: int = 60) -> str:
    """``function(arg=…)`` as shown in reports (values cut; they come from the redacted bundle)."""

    def short(value: Any) -> str:
        text = repr(value)
        return text if len(text) <= limit else text[:limit] + "…"

    parts = [*(short(a) for a in args), *(f"{k}={short(v)}" for k, v in kwargs.items())]
    return f"{spec.partition(':')[2]}({', '.join(parts)})"


def call_input_text(call: CallEvent) -> str | None:
    """What to preview of a call's input. A chat request repeats the whole conversation on every
    call, so its preview shows the message count and the *last* message: the part that changed."""
    from stepfork_otel.trace.models import LlmRequest, payload_value

    if not isinstance(call, LlmRequest) or call.input is None:
        return call.input
    value = payload_value(call.input)
    messages = value.get("messages") if isinstance(value, dict) else None
    if not isinstance(messages, list) or not messages:
        return call.input
    return f"{len(messages)} messages, last: {canonical_json(messages[-1])}"
