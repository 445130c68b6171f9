"""Bundle fidelity (issue 10): a CRLF checkout loads as the LF bundle it was (item 4), the
integrity check covers every field outside the payloads (item 6), ``stepfork validate`` names
each call recorded as unserialisable (item 2) and a file that is no bundle at all is refused from
its first bytes, in one line (item 15)."""

from __future__ import annotations

import gzip
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import stepfork
from conftest import Recording

import stepfork_otel.trace.bundle as bundle
import stepfork_otel.trace.checks as checks
from stepfork_otel import (
    BundleIntegrityError,
    ReplaySession,
    Trace,
    llm_request,
    record,
    trace_tool,
)
from stepfork_otel.trace.errors import BundleError


class Declined(Exception):
    pass


class Opaque:
    """A value with no JSON form."""


@trace_tool
def search(city: str) -> dict[str, Any]:
    return {"city": city, "flights": [{"id": "TP1351", "price": 189.5}]}


@trace_tool(name="charge_card", replay_policy="forbidden")
def charge_card(amount: float) -> dict[str, Any]:
    raise Declined(f"card declined for {amount}")


@trace_tool
def words(text: str) -> Iterator[str]:
    return (w for w in text.split())


@trace_tool
def measure(handle: Opaque) -> int:
    return 1


def ask(found: dict[str, Any]) -> dict[str, Any]:
    return llm_request(
        provider="acme",
        model="m1",
        input={"q": found},
        call=lambda: {"text": "book TP1351"},
    )


def booking_agent(city: str) -> str:
    found = search(city)
    return str(ask(found)["text"])


def paying_agent(city: str) -> str:
    booking_agent(city)
    charge_card(189.5)
    return "paid"


@pytest.fixture
def ok_bundle(recording: Recording, tmp_path: Path) -> Path:
    path = tmp_path / "ok.sftrace"
    with record(path, input={"city": "Lisbon"}) as run:
        run.set_output(booking_agent("Lisbon"))
    return path


@pytest.fixture
def failed_bundle(recording: Recording, tmp_path: Path) -> Path:
    """A run that failed: its status is "error", its last call (forbidden) raised."""
    path = tmp_path / "failed.sftrace"
    with pytest.raises(Declined), record(path, input={"city": "Lisbon"}):
        paying_agent("Lisbon")
    return path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _payloads(trace: Trace) -> list[str | None]:
    texts: list[str | None] = [trace.run.input, trace.run.output]
    for event in trace.events:
        texts.append(getattr(event, "input", None) or getattr(event, "output", None))
    return texts


def _replays(path: Path) -> None:
    with ReplaySession.from_trace(path) as replay:
        assert booking_agent("Lisbon") == "book TP1351"
    replay.verify_complete()


# --- item 4: CRLF line endings ---------------------------------------------------------------------


def test_a_crlf_checkout_loads_as_the_lf_bundle_and_replays(
    ok_bundle: Path, tmp_path: Path
) -> None:
    lf = ok_bundle.read_bytes()
    assert b"\r" not in lf
    crlf = _write(tmp_path / "crlf.sftrace", lf.replace(b"\n", b"\r\n"))
    gz = _write(tmp_path / "crlf.sftrace.gz", gzip.compress(crlf.read_bytes()))
    expected = Trace.load(ok_bundle)
    for path in (crlf, gz):
        loaded = Trace.load(path)
        assert loaded == expected
        assert _payloads(loaded) == _payloads(expected)  # the very text that was hashed
        assert checks.verify_integrity(loaded) == []  # payload fingerprints and lines fingerprint
        assert bundle.dump_trace(loaded, trailer=True) == lf  # (recorded as the run went)
        _replays(path)
    result = stepfork("validate", crlf, gz, "--verify-integrity")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("valid (2 calls, 4 events, every fingerprint verified)") == 2


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
def test_a_crlf_line_break_cut_by_a_chunk_end_reads_the_same(
    ok_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    crlf = _write(tmp_path / "crlf.sftrace", ok_bundle.read_bytes().replace(b"\n", b"\r\n"))
    expected = Trace.load(ok_bundle)
    monkeypatch.setattr(bundle, "_CHUNK", chunk)
    loaded = Trace.load(crlf)
    assert loaded == expected
    assert checks.verify_integrity(loaded) == []


def _stray_cr_cases(lines: list[bytes]) -> dict[str, tuple[bytes, int]]:
    """(bundle bytes with a CR that ends no line, the line it is on)."""
    event = next(n for n, line in enumerate(lines) if line.startswith(b'{"type":"tool_call"'))
    return {
        "a CR between two JSON tokens of an event line": (
            b"\n".join(
                [*lines[:event], lines[event].replace(b",", b",\r", 1), *lines[event + 1 :]]
            ),
            event + 1,
        ),
        "a doubled CR before a payload line's LF": (
            b"\n".join([*lines[: event + 1], lines[event + 1] + b"\r\r", *lines[event + 2 :]]),
            event + 2,
        ),
        "a CR after the last line": (b"\n".join(lines) + b"\r", len(lines)),
    }


@pytest.mark.parametrize("case", ["between tokens", "doubled", "at the end"])
@pytest.mark.parametrize("chunk", [None, 1, 5])
def test_a_lone_cr_is_still_an_error(
    ok_bundle: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    chunk: int | None,
) -> None:
    lines = ok_bundle.read_bytes().split(b"\n")
    assert lines[-1] == b""
    cases = list(_stray_cr_cases(lines[:-1]).values())
    data, line = cases[["between tokens", "doubled", "at the end"].index(case)]
    path = _write(tmp_path / "cr.sftrace", data if case == "at the end" else data + b"\n")
    if chunk is not None:
        monkeypatch.setattr(bundle, "_CHUNK", chunk)
    with pytest.raises(BundleError) as caught:
        Trace.load(path)
    assert str(caught.value) == (
        f"{path}: line {line}: a carriage return that does not end a line (line breaks are LF, "
        "or CRLF)"
    )


# --- item 6: integrity covers every field outside the payloads ----------------------------------------


def _edit_line(data: bytes, starts: bytes, old: bytes, new: bytes) -> bytes:
    """``old`` -> ``new`` once, in the first line that starts with ``starts``."""
    lines = data.split(b"\n")
    # (the run's end is in the trailer line of a bundle written as its run went)
    heads = (starts, b'{"run":') if starts == b'{"format"' else (starts,)
    n = next(i for i, line in enumerate(lines) if line.startswith(heads) and old in line)
    lines[n] = lines[n].replace(old, new, 1)
    return b"\n".join(lines)


def _drop_payload_line(data: bytes, after: bytes) -> bytes:
    lines = data.split(b"\n")
    n = next(i for i, line in enumerate(lines) if line.startswith(after))
    assert lines[n + 1].startswith(b'{"output":')
    del lines[n + 1]
    return b"\n".join(lines)


ONE_EDIT = {
    # the run failed; one word makes it a success, and a replay that fails the same way DIVERGED
    "run status": lambda d: _edit_line(d, b'{"format"', b'"status":"error"', b'"status":"ok"'),
    "run error type": lambda d: _edit_line(
        d, b'{"format"', b'"error_type":"', b'"error_type":"builtins.'
    ),
    "run error message": lambda d: _edit_line(d, b'{"format"', b"card declined", b"card accepted"),
    # the forbidden call: one word and live mode runs it for real
    "replay policy": lambda d: _edit_line(
        d, b'{"type":"tool_call"', b'"replay_policy":"forbidden"', b'"replay_policy":"replayable"'
    ),
    # the recorded failure becomes a call that was never run, or the other way round
    "outcome status": lambda d: _edit_line(
        d, b'{"type":"error"', b'"status":"error"', b'"status":"skipped"'
    ),
    "call status": lambda d: _edit_line(
        d, b'{"type":"tool_call"', b'"status":"error"', b'"status":"ok"'
    ),
    "tool name": lambda d: _edit_line(d, b'{"type":"tool_call"', b'"name":"search"', b'"name":"x"'),
    "llm model": lambda d: _edit_line(
        d, b'{"type":"llm_response"', b'"model":"m1"', b'"model":"m2"'
    ),
    "a header field replay does not read": lambda d: _edit_line(
        d, b'{"format"', b'"created_by":"stepfork_otel', b'"created_by":"someone'
    ),
    "missing payload reason": lambda d: _edit_line(
        d,
        b'{"type":"tool_result"',
        b'"status":"ok",',
        b'"status":"ok","output_missing":"size_cap",',
    ),
    "payload line removed": lambda d: _drop_payload_line(d, b'{"type":"tool_result"'),
}


@pytest.mark.parametrize("edit", sorted(ONE_EDIT))
def test_one_edit_outside_the_payloads_is_an_integrity_problem(
    failed_bundle: Path, tmp_path: Path, edit: str
) -> None:
    data = failed_bundle.read_bytes()
    edited_bytes = ONE_EDIT[edit](data)
    assert edited_bytes != data
    edited = _write(tmp_path / "edited.sftrace", edited_bytes)
    trace = Trace.load(edited)  # it still loads (`stepfork show` shows it) ...
    assert checks.verify_integrity(Trace.load(failed_bundle)) == []
    problems = [str(p) for p in checks.verify_integrity(trace)]  # ... but does not verify
    assert any(p.startswith("lines fingerprint mismatch: stored ") for p in problems), problems
    with pytest.raises(BundleIntegrityError, match="lines fingerprint mismatch"):
        ReplaySession.from_trace(edited)


def test_validate_says_which_fingerprint_an_edit_broke(failed_bundle: Path, tmp_path: Path) -> None:
    edited = _write(
        tmp_path / "edited.sftrace", ONE_EDIT["replay policy"](failed_bundle.read_bytes())
    )
    # schema and structure are fine (fingerprints are verified by default since issue 27)
    assert stepfork("validate", edited, "--no-verify-integrity").returncode == 0
    result = stepfork("validate", edited)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{edited}: INVALID (1 problem)"
    assert re.fullmatch(
        r"  lines fingerprint mismatch: stored [0-9a-f]{12}…, the header and event lines hash to "
        r"[0-9a-f]{12}… \(a field outside the payloads was changed: .*\)",
        lines[1],
    ), lines[1]


def _without_lines_fingerprint(data: bytes) -> bytes:
    """The bundle as an older stepfork_otel wrote it: an end line without lines_sha256."""
    return re.sub(rb',"lines_sha256":"[0-9a-f]{64}"\}\n$', b"}\n", data)


def test_an_older_bundle_loads_replays_and_says_what_was_not_verified(
    ok_bundle: Path, tmp_path: Path
) -> None:
    old = _write(tmp_path / "old.sftrace", _without_lines_fingerprint(ok_bundle.read_bytes()))
    trace = Trace.load(old)
    assert trace == Trace.load(ok_bundle)
    assert checks.verify_integrity(trace) == []
    _replays(old)
    (note,) = checks.unverified_fields(trace)
    assert note.message.startswith("no lines fingerprint (lines_sha256 in the end line")
    for field in ("run's status, error type", "replay_policy, status, name"):
        assert field in note.message
    assert checks.unverified_fields(Trace.load(ok_bundle)) == []
    result = stepfork("validate", old, "--verify-integrity")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"{old}: valid (2 calls, 4 events, every fingerprint verified)",
        f"  warning {note.message}",
    ]


def test_an_older_bundle_refuses_a_run_status_that_contradicts_its_error(
    failed_bundle: Path, tmp_path: Path
) -> None:
    """Without a lines fingerprint, the one-word edit of the run's status is still caught: a run
    recorded as failed keeps its error type, and a status other than "error" contradicts it."""
    data = _without_lines_fingerprint(ONE_EDIT["run status"](failed_bundle.read_bytes()))
    edited = _write(tmp_path / "edited.sftrace", data)
    (problem,) = checks.verify_integrity(Trace.load(edited))
    assert str(problem) == (
        "run status is 'ok' but the run records an error "
        f"({__name__}.Declined): contradictory (a recorded failure always has the status 'error')"
    )
    with pytest.raises(BundleIntegrityError, match="contradictory"):
        ReplaySession.from_trace(edited)


def test_a_malformed_lines_fingerprint_is_a_load_error(ok_bundle: Path, tmp_path: Path) -> None:
    data = re.sub(
        rb'"lines_sha256":"[0-9a-f]{64}"',
        lambda _: b'"lines_sha256":"\\u001b[8m"',
        ok_bundle.read_bytes(),
    )
    path = _write(tmp_path / "bad.sftrace", data)
    with pytest.raises(BundleError) as caught:
        Trace.load(path)
    assert str(caught.value) == (
        f"{path}: end line: lines_sha256 is not a SHA-256 hex digest (\\x1b[8m)"
    )


def test_a_trace_built_in_memory_has_no_lines_to_verify(ok_bundle: Path) -> None:
    loaded = Trace.load(ok_bundle)
    assert checks.lines_fingerprint(loaded) is not None
    copy = loaded.model_copy(update={"complete": False})
    assert checks.lines_fingerprint(copy) is None
    assert checks.verify_integrity(copy) == []
    assert checks.unverified_fields(copy) == []


# --- item 2: validate names each call that cannot be replayed ------------------------------------------


@pytest.fixture
def unserialisable_bundle(recording: Recording, tmp_path: Path) -> Path:
    path = tmp_path / "opaque.sftrace"
    with record(path, input={"text": "a b"}) as run:
        list(words("a b"))  # returns a generator: no JSON form
        search("Lisbon")
        measure(Opaque())  # takes an object without a JSON form
        run.set_output("done")
    return path


def test_validate_names_each_call_recorded_as_unserialisable(unserialisable_bundle: Path) -> None:
    trace = Trace.load(unserialisable_bundle)
    assert checks.verify_integrity(trace) == []  # the marker is what was fingerprinted
    assert [str(p) for p in checks.unreplayable_calls(trace)] == [
        "call-1: tool words: its output could not be serialised when recorded "
        "(builtins.generator: builtins.generator), so replay cannot substitute it",
        "call-3: tool measure: its input could not be serialised when recorded "
        f"(builtins.dict: parameter 'handle': {__name__}.Opaque), so replay cannot check a call "
        "against it",
    ]
    for flags in ((), ("--verify-integrity",)):
        result = stepfork("validate", unserialisable_bundle, *flags)
        assert result.returncode == 1, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == f"{unserialisable_bundle}: INVALID (2 problems)"
        assert lines[1].startswith("  call-1: tool words: its output could not be serialised")
        assert lines[2].startswith("  call-3: tool measure: its input could not be serialised")


def test_an_unserialisable_run_output_is_named_too(recording: Recording, tmp_path: Path) -> None:
    path = tmp_path / "run.sftrace"
    with record(path) as run:
        search("Lisbon")
        run.set_output(Opaque())
    assert [str(p) for p in checks.unreplayable_calls(Trace.load(path))] == [
        f"run output could not be serialised when recorded ({__name__}.Opaque: {__name__}.Opaque"
        "): replay cannot compare the run's return value with it",
    ]
    assert stepfork("validate", path).returncode == 1


# --- item 15: a file that is not a bundle ---------------------------------------------------------------


PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489")
HEADER = {"format": "sftrace", "format_version": 1, "trace_id": "ab" * 16}

NOT_BUNDLES: dict[str, tuple[bytes, str]] = {
    "PNG": (
        PNG,
        "not a .sftrace bundle (it starts with b'\\x89PNG\\r\\n\\x1a\\n', not with the header line "
        '{"format":"sftrace",...})',
    ),
    "random bytes": (random.Random(10).randbytes(1 << 20), "not a .sftrace bundle ("),
    "random bytes after a brace": (
        b"{" + random.Random(11).randbytes(1 << 20),
        "not a .sftrace bundle (",
    ),
    "empty": (b"", "empty file, not a .sftrace bundle"),
    "UTF-16 JSON": (
        json.dumps(HEADER).encode("utf-16") + "\n".encode("utf-16-le"),
        "not a .sftrace bundle (UTF-16 or UTF-32 text; a bundle is UTF-8)",
    ),
    "UTF-16 JSON without a byte-order mark": (
        json.dumps(HEADER).encode("utf-16-le"),
        "not a .sftrace bundle (UTF-16 or UTF-32 text; a bundle is UTF-8)",
    ),
    "UTF-8 with a byte-order mark": (
        b"\xef\xbb\xbf" + json.dumps(HEADER).encode(),
        "not a .sftrace bundle (it starts with a UTF-8 byte-order mark; a bundle is UTF-8 without "
        "one)",
    ),
}


@pytest.mark.parametrize("name", list(NOT_BUNDLES))
def test_a_file_that_is_not_a_bundle_says_so_in_one_line(tmp_path: Path, name: str) -> None:
    data, reason = NOT_BUNDLES[name]
    path = _write(tmp_path / "x.sftrace", data)
    for load in (Trace.load, ReplaySession.from_trace):
        with pytest.raises(BundleError) as caught:
            load(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: {reason}"), message
        assert "\n" not in message
        assert len(message) < len(str(path)) + 200
        assert "line 1 column" not in message  # no JSON parser's message
    result = stepfork("validate", path, "--verify-integrity")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"stepfork: error: {path}: {reason}")
    assert result.stderr.count("\n") == 1


def test_a_large_file_that_is_not_a_bundle_is_not_read_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Decided from the first chunk (or, for one long first line, its first 512 KiB): the
    reader and validate's schema pass each stop there, however long the file is."""
    served: list[int] = []

    def endless(first: bytes) -> Iterator[bytes]:
        yield first
        while True:
            served.append(1)
            assert len(served) < 16, "read on"
            yield b"a" * (64 << 10)

    starts = {
        "random bytes": random.Random(1).randbytes(64 << 10),
        "zero bytes": bytes(64 << 10),
        "one long line naming no format": b'{"resourceSpans":[' + b"a" * (64 << 10),
    }
    for first in starts.values():
        served.clear()
        monkeypatch.setattr(bundle, "_file_chunks", lambda path, *_, first=first: endless(first))
        with pytest.raises(BundleError, match=r"not a \.sftrace bundle"):
            bundle.read_trace("huge.sftrace")
        assert bundle.schema_problems("huge.sftrace") == []


def test_payloads_without_a_fingerprint_are_named_as_unverified(
    ok_bundle: Path, tmp_path: Path
) -> None:
    trace = Trace.load(ok_bundle)
    bare = [e.model_copy(update={"input_sha256": None}) for e in trace.calls]
    events = [bare.pop(0) if e in trace.calls else e for e in trace.events]
    path = bundle.save_trace(trace.model_copy(update={"events": events}), tmp_path / "bare.sftrace")
    assert [str(n) for n in checks.unverified_fields(Trace.load(path))] == [
        "2 payloads without a fingerprint (call-1, call-2): their text is not verified"
    ]


def test_an_event_of_a_subclass_is_verified_like_its_class(ok_bundle: Path) -> None:
    from stepfork_otel.trace.models import ToolCall

    class MyCall(ToolCall):
        pass

    trace = Trace.load(ok_bundle)
    call = trace.events[0]
    assert isinstance(call, ToolCall)
    mine = MyCall(**{**dict(call), "input": call.input.replace("Lisbon", "Porto")})  # type: ignore[union-attr]
    edited = trace.model_copy(update={"events": [mine, *trace.events[1:]]})
    (problem,) = checks.verify_integrity(edited)
    assert str(problem).startswith("call-1: input fingerprint mismatch: stored ")


def test_validate_prints_bundle_text_inert(recording: Recording, tmp_path: Path) -> None:
    @trace_tool(name="evil\x1b[8m\u202e")
    def evil() -> Iterator[int]:
        return iter([1])

    path = tmp_path / "evil.sftrace"
    with record(path):
        evil()
    result = stepfork("validate", path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "\x1b" not in result.stdout
    assert "\u202e" not in result.stdout
    assert "  call-1: tool evil\\x1b[8m\\u202e: its output could not be serialised" in result.stdout
