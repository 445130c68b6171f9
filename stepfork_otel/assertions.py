"""Trajectory assertions over a replay: which tools the agent called, how often, with what, in
which order, in how many steps.

They look at the calls the agent *actually reached* during replay (``replay.calls``), not at the
recording: a recording says what the agent did once, the replay says what today's code does.
A step is one instrumented tool or LLM call (a boundary), not a line of Python. A tool call that
failed (a recorded failure replayed, or a live body that raised) still counts: the agent made it.

A replay that diverged is not a trajectory to assert on: if any replay error was raised -- even one
the agent caught and swallowed -- every assertion fails and says so, instead of passing on a run
that left the recorded path. Each failure message shows the trajectory actually reached.

Usable with a :class:`~stepfork_otel.replay.session.ReplaySession` (inside or after its ``with``
block) or its frozen :class:`~stepfork_otel.replay.session.ReplayResult` (``replay.summary``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from stepfork_otel.constants import REPORT_PREVIEW_CHARS
from stepfork_otel.replay.errors import ReplayError, preview
from stepfork_otel.replay.session import ReplayedCall
from stepfork_otel.trace.canonical import UnserialisableError, canonical_json
from stepfork_otel.trace.redaction import holds_marker

__all__ = [
    "assert_max_steps",
    "assert_tool_arguments",
    "assert_tool_call_count",
    "assert_tool_called",
    "assert_tool_not_called",
    "assert_tool_order",
    "assert_tool_sequence",
]


class Replay(Protocol):
    """What the assertions need: a ReplaySession or a ReplayResult."""

    @property
    def calls(self) -> Sequence[ReplayedCall]: ...

    @property
    def errors(self) -> Sequence[ReplayError]: ...


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def trajectory(replay: Replay) -> str:
    """The calls reached, one per line: position, kind and name, arguments, what replay did."""
    calls = list(replay.calls)
    if not calls:
        return "trajectory: no tool or LLM call was reached"
    lines = [f"trajectory ({len(calls)} call{'s' if len(calls) != 1 else ''} reached):"]
    for call in calls:
        what = call.action + (" (raised)" if call.status == "error" else "")
        if call.kind == "tool":
            shown = preview(call.input, REPORT_PREVIEW_CHARS)
            lines.append(f"  {call.position:>3}. {call.label} {shown} [{what}]")
        else:  # "llm " padded to the width of "tool", so the names line up
            lines.append(f"  {call.position:>3}. llm  {call.provider}/{call.model} [{what}]")
    return "\n".join(lines)


def _fail(replay: Replay, message: str) -> AssertionError:
    return AssertionError(f"{message}\n{trajectory(replay)}")


def _valid(replay: Replay) -> list[ReplayedCall]:
    """The calls reached, after checking that the replay did not diverge."""
    errors = list(replay.errors)
    if errors:
        first = errors[0]
        where = f" at call {first.position}" if first.position else ""
        raise _fail(
            replay,
            f"the replay diverged{where} ({type(first).__name__}: {first.reason}); "
            f"{len(errors)} replay error(s) were raised during the run, even if the agent caught "
            "them, so assertions about its trajectory would be about a run that left the "
            "recorded path",
        )
    return list(replay.calls)


def _tools(calls: Sequence[ReplayedCall]) -> list[ReplayedCall]:
    return [c for c in calls if c.kind == "tool"]


def _tool_names(calls: Sequence[ReplayedCall]) -> list[str]:
    return [c.name for c in _tools(calls)]


def assert_tool_called(replay: Replay, name: str) -> None:
    """The agent called tool ``name`` at least once."""
    calls = _valid(replay)
    if name not in _tool_names(calls):
        raise _fail(replay, f"tool {name!r} was never called")


def assert_tool_not_called(replay: Replay, name: str) -> None:
    """The agent never called tool ``name``."""
    calls = _valid(replay)
    positions = [c.position for c in _tools(calls) if c.name == name]
    if positions:
        at = ", ".join(str(p) for p in positions)
        raise _fail(
            replay,
            f"tool {name!r} was called {_times(len(positions))} (at call {at}), expected never",
        )


def assert_tool_call_count(replay: Replay, name: str, count: int) -> None:
    """The agent called tool ``name`` exactly ``count`` times (failed calls included)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    calls = _valid(replay)
    actual = _tool_names(calls).count(name)
    if actual != count:
        raise _fail(
            replay,
            f"tool {name!r} was {f'called {_times(actual)}' if actual else 'never called'}, "
            f"expected {_times(count) if count else 'never'}",
        )


def _canonical(value: Any) -> str:
    try:
        return canonical_json(value)
    except UnserialisableError:
        return repr(value)


def assert_tool_arguments(
    replay: Replay, name: str, expected: Mapping[str, Any], *, occurrence: int = 1
) -> None:
    """The ``occurrence``-th call (from 1) of tool ``name`` had these arguments.

    Only the names given are compared, against the call's *normalised, redacted* arguments
    (defaults applied, secrets replaced by ``[REDACTED…]`` markers), by canonical JSON: ``1`` and
    ``1.0`` differ, a ``datetime`` equals its RFC 3339 string.
    """
    if occurrence < 1:
        raise ValueError(f"occurrence counts from 1, got {occurrence}")
    calls = _valid(replay)
    matching = [c for c in _tools(calls) if c.name == name]
    if len(matching) < occurrence:
        raise _fail(
            replay,
            f"tool {name!r} was called {_times(len(matching)) if matching else 'never'}, so it "
            f"has no call number {occurrence} to check arguments on",
        )
    call = matching[occurrence - 1]
    arguments = call.arguments
    if not isinstance(arguments, dict):
        raise _fail(replay, f"the arguments of tool {name!r} were not recorded as an object")
    problems: list[str] = []
    for key, want in expected.items():
        if key not in arguments:
            known = ", ".join(sorted(arguments)) or "none"
            problems.append(f"  {key}: not an argument of {name!r} (its arguments: {known})")
            continue
        got, wanted = _canonical(arguments[key]), _canonical(want)
        if got != wanted:
            redacted = " (the recorded value is redacted)" if holds_marker(got) else ""
            problems.append(f"  {key}: expected {wanted}, got {got}{redacted}")
    if problems:
        raise _fail(
            replay,
            f"tool {name!r} call {occurrence} (call {call.position} of the run) had other "
            "arguments:\n" + "\n".join(problems),
        )


def assert_tool_order(replay: Replay, first: str, then: str) -> None:
    """Tool ``first`` was called before tool ``then``: both were called, and the first call of
    ``first`` comes before the first call of ``then``."""
    calls = _tools(_valid(replay))
    a = next((c.position for c in calls if c.name == first), None)
    b = next((c.position for c in calls if c.name == then), None)
    if a is None or b is None:
        missing = [repr(n) for n, p in ((first, a), (then, b)) if p is None]
        raise _fail(
            replay,
            f"expected tool {first!r} before tool {then!r}, but {' and '.join(missing)} "
            f"{'was' if len(missing) == 1 else 'were'} never called",
        )
    if not a < b:
        raise _fail(
            replay,
            f"expected tool {first!r} before tool {then!r}, but {then!r} was first called at call "
            f"{b} and {first!r} only at call {a}",
        )


def assert_tool_sequence(replay: Replay, names: Sequence[str], *, strict: bool = True) -> None:
    """The tools the agent called, in order.

    ``strict=True`` (default): the tool calls are exactly ``names`` -- nothing before, between or
    after. ``strict=False``: ``names`` appear in this order, other tools allowed around and
    between them. LLM calls are never part of the sequence.
    """
    if isinstance(names, str):
        raise TypeError("names is a sequence of tool names, not a string")
    called = _tool_names(_valid(replay))
    wanted = list(names)
    if strict:
        if called != wanted:
            raise _fail(
                replay,
                f"tool sequence differs (exact match):\n  expected: {wanted}\n  actual:   {called}",
            )
        return
    found = 0
    for name in called:
        if found < len(wanted) and name == wanted[found]:
            found += 1
    if found < len(wanted):
        raise _fail(
            replay,
            f"tool sequence not found (other tools allowed between): matched {wanted[:found]}, "
            f"then no call of {wanted[found]!r} after them\n  expected: {wanted}\n  actual:   "
            f"{called}",
        )


def assert_max_steps(replay: Replay, max_steps: int) -> None:
    """The agent made at most ``max_steps`` steps; a step is one tool or LLM call reached."""
    if max_steps < 0:
        raise ValueError(f"max_steps must be >= 0, got {max_steps}")
    calls = _valid(replay)
    if len(calls) > max_steps:
        tools = len(_tools(calls))
        raise _fail(
            replay,
            f"the agent took {len(calls)} steps ({tools} tool, {len(calls) - tools} LLM calls), "
            f"more than the maximum of {max_steps}",
        )
