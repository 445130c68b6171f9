"""Bundle IO: round trips, the gzip variant, atomic writes, fingerprint verification, legacy and
incomplete bundles -- and every way a bundle can be broken or hostile, each of which must give a
``BundleError`` whose message is one line naming the file and the reason."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

import stepfork_otel.trace.bundle as bundle
from stepfork_otel.constants import FORMAT_VERSION
from stepfork_otel.replay.plan import build_plan
from stepfork_otel.trace.bundle import dump_trace, load_any, load_trace, parse_trace, save_trace
from stepfork_otel.trace.canonical import canonical_json
from stepfork_otel.trace.checks import missing_payloads, validate_structure, verify_integrity
from stepfork_otel.trace.errors import BundleError, BundleVersionError, Problem
from stepfork_otel.trace.limits import ReadLimits
from stepfork_otel.trace.models import (
    EVENT_ADAPTER,
    ContextSpan,
    ErrorEvent,
    Event,
    LlmRequest,
    LlmResponse,
    RunInfo,
    ToolCall,
    ToolResult,
    Trace,
    pair_outcomes,
    payload_value,
)
from stepfork_otel.trace.policy import ReplayPolicy

GOLDEN = Path(__file__).parent / "golden"

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _payload(value: Any, *, fingerprints: bool = True) -> tuple[str, str | None]:
    text = canonical_json(value)
    return text, _sha(text) if fingerprints else None


def _events(*, fingerprints: bool = True, parent_links: bool = True) -> list[Event]:
    """A run: an LLM call, a tool that makes its own LLM call, a tool that fails, a tool again."""

    def ids(n: int) -> dict[str, Any]:
        return {"trace_id": TRACE_ID, "span_id": f"{n:016x}", "seq": n, "time_unix_nano": n}

    def link(call: str) -> str | None:
        return call if parent_links else None

    events: list[Event] = []
    text, sha = _payload(
        {"messages": [{"role": "user", "content": "Lisbon for 2"}]}, fingerprints=fingerprints
    )
    events.append(
        LlmRequest(
            id="call-1",
            **ids(1),
            input=text,
            input_sha256=sha,
            input_size=len(text),
            provider="openai",
            model="gpt-4.1-mini",
            model_fingerprint=_sha(
                '{"model":"gpt-4.1-mini","operation":"chat","provider":"openai"}'
            )
            if fingerprints
            else None,
        )
    )
    text, sha = _payload({"content": "search first"}, fingerprints=fingerprints)
    events.append(
        LlmResponse(
            id="call-1.result",
            parent_id=link("call-1"),
            **ids(1),
            output=text,
            output_sha256=sha,
            provider="openai",
            model="gpt-4.1-mini",
            usage={"input_tokens": 10, "output_tokens": 3},
        )
    )
    text, sha = _payload({"city": "Lisbon", "max_results": 5}, fingerprints=fingerprints)
    events.append(ToolCall(id="call-2", **ids(2), input=text, input_sha256=sha, name="search"))
    text, sha = _payload({"prompt": "summarise"}, fingerprints=fingerprints)
    events.append(
        LlmRequest(
            id="call-3",
            parent_id="call-2",
            **ids(3),
            input=text,
            input_sha256=sha,
            provider="scripted",
            model="summariser-1",
        )
    )
    text, sha = _payload("short summary", fingerprints=fingerprints)
    events.append(
        LlmResponse(
            id="call-3.result",
            parent_id=link("call-3"),
            **ids(3),
            output=text,
            output_sha256=sha,
            provider="scripted",
            model="summariser-1",
        )
    )
    text, sha = _payload([{"flight": "TP1351", "price": 189.5}], fingerprints=fingerprints)
    events.append(
        ToolResult(
            id="call-2.result",
            parent_id=link("call-2"),
            **ids(2),
            output=text,
            output_sha256=sha,
            name="search",
        )
    )
    text, sha = _payload({"card": "[REDACTED]", "amount": 10}, fingerprints=fingerprints)
    events.append(
        ToolCall(
            id="call-4",
            **ids(4),
            input=text,
            input_sha256=sha,
            name="charge_card",
            replay_policy=ReplayPolicy.FORBIDDEN,
        )
    )
    text, sha = _payload(
        {"error_type": "PaymentDeclined", "message": "card declined"}, fingerprints=fingerprints
    )
    events.append(
        ErrorEvent(
            id="call-4.error",
            parent_id=link("call-4"),
            **ids(4),
            output=text,
            output_sha256=sha,
            error_type="PaymentDeclined",
            message="card declined",
        )
    )
    text, sha = _payload({"city": "Porto", "max_results": 5}, fingerprints=fingerprints)
    events.append(ToolCall(id="call-5", **ids(5), input=text, input_sha256=sha, name="search"))
    text, sha = _payload([], fingerprints=fingerprints)
    events.append(
        ToolResult(
            id="call-5.result",
            parent_id=link("call-5"),
            **ids(5),
            output=text,
            output_sha256=sha,
            name="search",
        )
    )
    return events


def make_trace(**kwargs: Any) -> Trace:
    fingerprints = kwargs.get("fingerprints", True)
    run_in, run_in_sha = _payload({"question": "Dinner in Lisbon?"}, fingerprints=fingerprints)
    run_out, run_out_sha = _payload("Booked.", fingerprints=fingerprints)
    return Trace(
        trace_id=TRACE_ID,
        created_by="tests",
        run=RunInfo(
            name="agent",
            span_id="00000000000000aa",
            entrypoint="agents.dinner:main",
            input=run_in,
            input_sha256=run_in_sha,
            output=run_out,
            output_sha256=run_out_sha,
            status="ok",
        ),
        events=_events(**kwargs),
        context=[ContextSpan(span_id="00000000000000bb", name="http request", kind="SERVER")],
    )


def _bundle_dict(trace: Trace | None = None) -> dict[str, Any]:
    """The bundle as one object (payloads inline), for tests to edit; :func:`_jsonl` writes it
    back in the bundle layout."""
    result: dict[str, Any] = (trace or make_trace()).model_dump(mode="json", exclude_none=True)
    return result


def _jsonl(data: dict[str, Any]) -> bytes:
    """The bundle layout for a (possibly broken) bundle given as one object: header line, run
    payload lines, each event line followed by its payload line, end line. Only payloads that are
    strings move to their own line; any other value stays where it was, so a broken value is
    written as it is."""
    events = data.get("events")
    head = {k: v for k, v in data.items() if k != "events" or not isinstance(v, list)}
    lines: list[bytes] = []

    def take_payloads(obj: dict[str, Any]) -> list[bytes]:
        found = []
        for key in ("input", "output"):
            if isinstance(obj.get(key), str):
                found.append(b'{"%s":%s}' % (key.encode(), obj.pop(key).encode("utf-8")))
        return found

    if isinstance(head.get("run"), dict):
        head["run"] = dict(head["run"])
        payloads = take_payloads(head["run"])
    else:
        payloads = []
    lines += [orjson.dumps(head), *payloads]
    for event in events if isinstance(events, list) else []:
        event = dict(event)
        payloads = take_payloads(event)
        lines += [orjson.dumps(event), *payloads]
    lines.append(b'{"end":"sftrace","events":%d}' % len(events if isinstance(events, list) else []))
    return b"\n".join(lines) + b"\n"


def _write(path: Path, data: dict[str, Any] | bytes | str) -> Path:
    if isinstance(data, dict):
        path.write_bytes(_jsonl(data))
    elif isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)
    return path


def _load_error(path: Path, error: type[BundleError] = BundleError) -> BundleError:
    with pytest.raises(BundleError) as info:
        Trace.load(path)
    assert type(info.value) is error
    message = str(info.value)
    assert "\n" not in message
    assert "\r" not in message
    assert message.startswith(f"{path}: ")
    assert len(message) < len(str(path)) + 400
    assert info.value.path == str(path)
    return info.value


# --- round trip and layout -----------------------------------------------------------------------


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    trace = make_trace()
    path = save_trace(trace, tmp_path / "run.sftrace")
    loaded = Trace.load(path)
    assert loaded == trace
    assert validate_structure(loaded) == []
    assert verify_integrity(loaded) == []
    assert missing_payloads(loaded) == []
    assert payload_value(loaded.events[2].input) == {"city": "Lisbon", "max_results": 5}
    assert load_any(loaded) is loaded
    assert load_any(str(path)) == trace


def test_layout_is_json_lines_with_payloads_on_their_own_lines(tmp_path: Path) -> None:
    trace = make_trace()
    trace.save(tmp_path / "run.sftrace")
    data = (tmp_path / "run.sftrace").read_bytes()
    assert data.endswith(b"\n")
    lines = data.decode("utf-8").split("\n")[:-1]
    parsed = [json.loads(line) for line in lines]  # every line is one JSON value
    assert lines[0].startswith(
        f'{{"format":"sftrace","format_version":{FORMAT_VERSION},"trace_id":'
    )
    assert '"context":[' in lines[0]
    assert '"events"' not in lines[0]
    assert "input" not in parsed[0]["run"]
    assert "output" not in parsed[0]["run"]
    # the run's payloads, then each event followed by its payload, verbatim (not escaped)
    assert lines[1] == '{"input":' + (trace.run.input or "") + "}"
    assert lines[2] == '{"output":' + (trace.run.output or "") + "}"
    expected: list[str] = []
    for event in trace.events:
        expected.append(f"event {event.id}")
        text = event.input if isinstance(event, (ToolCall, LlmRequest)) else event.output
        key = "input" if isinstance(event, (ToolCall, LlmRequest)) else "output"
        expected.append("{" + f'"{key}":' + (text or "") + "}")
    seen = [
        f"event {obj['id']}" if line.startswith('{"type":') else line
        for line, obj in zip(lines[3:-1], parsed[3:-1], strict=True)
    ]
    assert seen == expected
    assert all("input" not in obj and "output" not in obj for obj in parsed[3:-1:2])
    # the end line counts the events and fingerprints every line but the payload lines (see
    # docs/bundle-format.md): the header and event lines, then the payload map
    payload_map = "io" + "".join(
        "i" if e.type.endswith(("_call", "_request")) else "o" for e in trace.events
    )
    covered = "".join(line + "\n" for line in [lines[0], *lines[3:-1:2]]) + payload_map
    assert parsed[-1] == {
        "end": "sftrace",
        "events": len(trace.events),
        "lines_sha256": _sha(covered),
    }
    # the payload line holds exactly the text that was hashed
    assert hashlib.sha256(lines[4][len('{"input":') : -1].encode()).hexdigest() == (
        trace.events[0].input_sha256
    )


def test_saving_is_deterministic(tmp_path: Path) -> None:
    for name in ("a.sftrace", "b.sftrace", "a.sftrace.gz", "b.sftrace.gz"):
        save_trace(make_trace(), tmp_path / name)
    assert (tmp_path / "a.sftrace").read_bytes() == (tmp_path / "b.sftrace").read_bytes()
    assert (tmp_path / "a.sftrace.gz").read_bytes() == (tmp_path / "b.sftrace.gz").read_bytes()


def test_gzip_variant_by_name_and_detected_by_magic(tmp_path: Path) -> None:
    trace = make_trace()
    gz = save_trace(trace, tmp_path / "run.sftrace.gz")
    assert gz.read_bytes()[:2] == b"\x1f\x8b"
    assert gzip.decompress(gz.read_bytes()) == dump_trace(trace)
    assert Trace.load(gz) == trace
    # the name does not decide how a file is read: the bytes do
    disguised = _write(tmp_path / "plain-name.sftrace", gz.read_bytes())
    assert Trace.load(disguised) == trace
    plain = _write(tmp_path / "gz-name.sftrace.gz", dump_trace(trace))
    assert Trace.load(plain) == trace


def test_multi_member_gzip_is_read_whole(tmp_path: Path) -> None:
    data = dump_trace(make_trace())
    path = _write(
        tmp_path / "two.sftrace.gz", gzip.compress(data[:100]) + gzip.compress(data[100:])
    )
    assert Trace.load(path) == make_trace()


# --- atomic writes -------------------------------------------------------------------------------


def test_save_leaves_no_temporary_file(tmp_path: Path) -> None:
    save_trace(make_trace(), tmp_path / "run.sftrace")
    save_trace(make_trace(), tmp_path / "run.sftrace")  # replacing an existing bundle too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.sftrace"]


def test_save_creates_missing_folders(tmp_path: Path) -> None:
    path = save_trace(make_trace(), tmp_path / "a" / "b" / "run.sftrace")
    assert Trace.load(path) == make_trace()


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failing_write_leaves_the_old_bundle_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = save_trace(make_trace(), tmp_path / "run.sftrace")
    before = path.read_bytes()

    def fail(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bundle.os, failing, fail)
    changed = make_trace().model_copy(update={"complete": False, "incomplete_reason": "x"})
    with pytest.raises(OSError, match="No space left"):
        save_trace(changed, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.sftrace"]


# --- load errors ---------------------------------------------------------------------------------


def _cut(data: bytes) -> bytes:
    return data[: len(data) // 2]


BROKEN: dict[str, tuple[Callable[[Path], Path], str]] = {
    "missing file": (lambda d: d / "nope.sftrace", "no such file"),
    "a directory": (lambda d: _mkdir(d / "dir.sftrace"), "is a directory"),
    "empty file": (lambda d: _write(d / "e.sftrace", b""), "empty file"),
    "only whitespace": (lambda d: _write(d / "w.sftrace", b" \n\t"), "empty file"),
    "not JSON": (
        lambda d: _write(d / "n.sftrace", "hello: world\n"),
        "not a .sftrace bundle (it starts with b'hello: w', not with the header line",
    ),
    "YAML object tag": (
        lambda d: _write(d / "y.sftrace", "!!python/object/apply:os.system ['true']\n"),
        "not a .sftrace bundle (it starts with b'!!python'",
    ),
    "binary garbage": (
        lambda d: _write(d / "b.sftrace", bytes(range(256))),
        "not a .sftrace bundle (it starts with b'\\x00\\x01",
    ),
    "an object that is not JSON": (
        lambda d: _write(d / "j.sftrace", b"{hello}\n"),
        "not a .sftrace bundle (its first line is not JSON)",
    ),
    "a JSON list": (lambda d: _write(d / "l.sftrace", b"[1, 2]"), "not a .sftrace bundle"),
    "another JSON object": (
        lambda d: _write(d / "o.sftrace", {"resourceSpans": []}),
        'no "format": "sftrace" field',
    ),
    "another format": (
        lambda d: _write(d / "f.sftrace", {**_bundle_dict(), "format": "har"}),
        "not a .sftrace bundle",
    ),
    "truncated bundle": (
        lambda d: _write(d / "t.sftrace", _cut(dump_trace(make_trace()))),
        'truncated bundle (no end line {"end":"sftrace",...})',
    ),
    "truncated gzip": (
        lambda d: _write(d / "t.sftrace.gz", _cut(gzip.compress(dump_trace(make_trace())))),
        "truncated gzip data",
    ),
    "corrupt gzip": (
        lambda d: _write(d / "c.sftrace.gz", b"\x1f\x8b" + b"\x00" * 40),
        "corrupt gzip data",
    ),
    "wrong type: seq as text": (
        lambda d: _write(d / "s.sftrace", _edit_event(2, seq="2")),
        "line 8: invalid bundle at events.2.tool_call.seq: Input should be a valid integer",
    ),
    "wrong type: complete as text": (
        lambda d: _write(d / "c.sftrace", {**_bundle_dict(), "complete": "yes"}),
        "line 1: invalid bundle at complete: Input should be a valid boolean",
    ),
    "wrong type: events not a list": (
        lambda d: _write(d / "e.sftrace", {**_bundle_dict(), "events": {"a": 1}}),
        "line 1: events belong on their own lines, not in the header",
    ),
    "wrong type: payload as an object": (
        lambda d: _write(d / "p.sftrace", _edit_event(2, input={"city": "Lisbon"})),
        "line 8: invalid bundle at events.2.tool_call.input: Input should be a valid string",
    ),
    "missing required field": (
        lambda d: _write(
            d / "m.sftrace", {k: v for k, v in _bundle_dict().items() if k != "trace_id"}
        ),
        "line 1: invalid bundle at trace_id: Field required",
    ),
    "unknown field": (
        lambda d: _write(d / "u.sftrace", _edit_event(0, shell="rm -rf /")),
        "line 4: invalid bundle at events.0.llm_request.shell: Extra inputs are not permitted",
    ),
    "unknown event type": (
        lambda d: _write(d / "x.sftrace", _edit_event(2, type="shell_command")),
        "line 8: invalid bundle at events.2: unknown event type 'shell_command' (expected one of "
        "'tool_call', 'tool_result', 'llm_request', 'llm_response', 'error')",
    ),
    "unknown replay policy": (
        lambda d: _write(d / "r.sftrace", _edit_event(2, replay_policy="sometimes")),
        "invalid bundle at events.2.tool_call.replay_policy",
    ),
    "duplicate ids": (
        lambda d: _write(d / "d.sftrace", _edit_event(8, id="call-2")),
        "inconsistent bundle: call-2: duplicate event id",
    ),
    "dangling parent": (
        lambda d: _write(d / "p.sftrace", _edit_event(3, parent_id="call-99")),
        "inconsistent bundle: call-3: parent 'call-99' is not an earlier call",
    ),
    "outcome of an unknown call": (
        lambda d: _write(d / "o.sftrace", _edit_event(5, parent_id="call-77")),
        "inconsistent bundle: call-2.result: outcome of unknown call 'call-77'",
    ),
    "second outcome for a call": (
        lambda d: _write(d / "s.sftrace", _edit_event(9, parent_id="call-2")),
        "inconsistent bundle: call-5.result: second outcome for call-2",
    ),
    "calls out of order": (
        lambda d: _write(d / "o.sftrace", _edit_event(8, seq=1)),
        "inconsistent bundle: call-5: call number 1 out of order",
    ),
    "LLM response paired with a tool call": (
        lambda d: _write(d / "k.sftrace", _edit_event(4, parent_id="call-2")),
        "inconsistent bundle: call-3.result: llm_response paired with a non-LLM call (and 1 more)",
    ),
    "tool result paired with an LLM call": (
        lambda d: _write(d / "t.sftrace", _result_for_llm_call()),
        "inconsistent bundle: call-3.result: tool_result paired with a non-tool call",
    ),
}


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _result_for_llm_call() -> dict[str, Any]:
    data = _bundle_dict()
    event = data["events"][4]  # the llm_response of call-3, turned into a tool_result
    for key in ("provider", "model"):
        del event[key]
    event.update(type="tool_result", name="search")
    return data


def _edit_event(index: int, **changes: Any) -> dict[str, Any]:
    data = _bundle_dict()
    data["events"][index].update(changes)
    return data


@pytest.mark.parametrize("case", list(BROKEN), ids=list(BROKEN))
def test_broken_bundles_give_a_one_line_bundle_error(tmp_path: Path, case: str) -> None:
    make, reason = BROKEN[case]
    error = _load_error(make(tmp_path))
    assert reason in str(error)


def test_a_bundle_from_a_newer_format_version(tmp_path: Path) -> None:
    newer = {**_bundle_dict(), "format_version": FORMAT_VERSION + 1}
    error = _load_error(_write(tmp_path / "v2.sftrace", newer), BundleVersionError)
    assert (
        f"format version {FORMAT_VERSION + 1} is newer than this stepfork_otel supports "
        f"({FORMAT_VERSION})"
    ) in str(error)
    # a newer version usually brings new fields: still reported as a version problem
    newer["events"][0]["speculative"] = True
    newer["retention"] = {"days": 7}
    error = _load_error(_write(tmp_path / "v2b.sftrace", newer), BundleVersionError)
    assert "upgrade stepfork-otel" in str(error)
    assert isinstance(error, BundleError)


def test_problem_lists_all_inconsistencies(tmp_path: Path) -> None:
    data = _edit_event(3, parent_id="call-99")
    data["events"][8]["id"] = "call-2"
    error = _load_error(_write(tmp_path / "two.sftrace", data))
    assert str(error).endswith("(and 2 more)")


# --- hostile bundles -----------------------------------------------------------------------------


def test_deeply_nested_json(tmp_path: Path) -> None:
    deep = b'{"format":"sftrace","trace_id":"t","run":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    error = _load_error(_write(tmp_path / "deep.sftrace", deep))
    assert "not valid JSON" in str(error)
    # a payload is never parsed at load, but its nesting is checked as it streams in: replay
    # and show parse it later, recursively
    error = _load_error(_write(tmp_path / "payload.sftrace", _edit_event(2, input="[" * 100_000)))
    assert "line 9: JSON nested deeper than 254 levels (the nesting limit)" in str(error)
    text = '"' + "[" * 100_000 + '"'  # deep *inside a string* is just text
    trace = Trace.load(_write(tmp_path / "string.sftrace", _edit_event(2, input=text)))
    assert trace.events[2].input == text  # type: ignore[union-attr]


def test_a_50_mb_string_value_loads_as_data(tmp_path: Path) -> None:
    huge = "A" * 50_000_000
    trace = Trace.load(_write(tmp_path / "big.sftrace", _edit_event(2, input=huge)))
    assert len(trace.events[2].input or "") == 50_000_000  # type: ignore[union-attr]
    assert [p.event_id for p in verify_integrity(trace)] == ["call-2"]


def test_a_50_mb_key_or_tag_is_not_copied_into_the_message(tmp_path: Path) -> None:
    huge = "k\n" * 25_000_000
    error = _load_error(_write(tmp_path / "key.sftrace", _edit_event(0, **{huge: 1})))
    assert "Extra inputs are not permitted" in str(error)
    error = _load_error(_write(tmp_path / "tag.sftrace", _edit_event(0, type=huge)))
    assert "unknown event type 'k\\nk\\nk" in str(error)
    assert "(expected one of 'tool_call'," in str(error)
    error = _load_error(
        _write(tmp_path / "id.sftrace", _edit_event(8, id="call-2", parent_id=huge))
    )
    assert "inconsistent bundle" in str(error)


def _filler(size: int) -> bytes:
    """``size`` bytes that gzip ~40 times (spaces, one pseudo-random letter in 61): below the
    compression-ratio limit, so a test of another cap reaches that cap first."""
    rng = random.Random(size)
    return b"".join(b" " * 60 + bytes([rng.randrange(97, 123)]) for _ in range(size // 61 + 1))[
        :size
    ]


def test_a_gzip_bomb_stops_at_the_cap(tmp_path: Path) -> None:
    limits = ReadLimits(max_decompressed_bytes=1_000_000)

    def load_error(path: Path) -> str:
        with pytest.raises(BundleError) as info:
            load_trace(path, limits=limits)
        return str(info.value)

    bomb = _write(tmp_path / "bomb.sftrace.gz", gzip.compress(_filler(3_000_000), compresslevel=9))
    assert bomb.stat().st_size < 100_000
    assert "expands beyond 1000000 bytes (the decompressed-size limit)" in load_error(bomb)
    # the cap counts every gzip member together
    head = dump_trace(make_trace()).split(b"\n")[0] + b"\n"
    two = gzip.compress(head + _filler(600_000)) + gzip.compress(_filler(600_000))
    assert "expands beyond" in load_error(_write(tmp_path / "two.sftrace.gz", two))
    # a bundle below the cap still loads
    small = save_trace(make_trace(), tmp_path / "ok.sftrace.gz")
    assert load_trace(small, limits=limits) == make_trace()


def test_strings_that_look_like_code_are_only_data(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    payloads = [
        f"__import__('os').system('touch {pwned}')",
        f"!!python/object/apply:os.system ['touch {pwned}']",
        "{{ self.__init__.__globals__ }}",
        f"$(touch {pwned})",
    ]
    data = _bundle_dict()
    data["run"]["entrypoint"] = "os:system"
    data["run"]["output"] = canonical_json(payloads)
    data["run"].pop("output_sha256")
    data["events"][2]["name"] = payloads[0]
    data["events"][2]["input"] = canonical_json({"cmd": payloads})
    data["events"][2].pop("input_sha256")
    data["events"][5]["name"] = payloads[0]
    path = _write(tmp_path / "code.sftrace", data)
    trace = Trace.load(path)
    assert verify_integrity(trace) == []
    assert missing_payloads(trace) == []
    assert payload_value(trace.run.output) == payloads
    assert payload_value(trace.events[2].input) == {"cmd": payloads}  # type: ignore[union-attr]
    assert trace.run.entrypoint == "os:system"
    assert not pwned.exists()


# --- hostile lines (the JSON Lines layout) ---------------------------------------------------------


def _lines() -> list[bytes]:
    """The bundle's lines: 0 header, 1 run input, 2 run output, 3 call-1 (llm_request), 4 its
    input, 5 call-1.result, 6 its output, 7 call-2 (tool_call), 8 its input, ..."""
    return dump_trace(make_trace()).split(b"\n")[:-1]


def _joined(lines: list[bytes]) -> bytes:
    return b"\n".join(lines) + b"\n"


def _replace(lines: list[bytes], index: int, line: bytes) -> bytes:
    return _joined([*lines[:index], line, *lines[index + 1 :]])


_L = _lines()
_SRC = _joined(_L)
HOSTILE: dict[str, tuple[bytes, str]] = {
    "truncated mid-file": (_SRC[: len(_SRC) // 2], "truncated bundle (no end line"),
    "truncated at a line end": (_joined(_L[:10]), "truncated bundle (no end line"),
    "seq as string": (
        _SRC.replace(b'"seq":1,', b'"seq":"1",', 1),
        "line 4: invalid bundle at events.0.llm_request.seq: Input should be a valid integer",
    ),
    "unknown field": (
        _SRC.replace(b'"seq":1,', b'"seq":1,"x":1,', 1),
        "line 4: invalid bundle at events.0.llm_request.x: Extra inputs are not permitted",
    ),
    "unknown event type": (
        _SRC.replace(b'{"type":"llm_request"', b'{"type":"eval_me"', 1),
        "line 4: invalid bundle at events.0: unknown event type 'eval_me'",
    ),
    "payload inside the event line": (
        _SRC.replace(b'"seq":1,', b'"seq":1,"input":"{}",', 1),
        "line 4: event call-1: its payload belongs on its own line",
    ),
    "payload inside the event line, as null": (
        _SRC.replace(b'"id":"call-1.result",', b'"id":"call-1.result","output":null,', 1),
        "line 6: event call-1.result: its payload belongs on its own line",
    ),
    "event line not JSON": (
        _replace(_L, 7, _L[7][:40]),
        "line 8: not valid JSON: unexpected end of data: line 1 column 41 (char 40)",
    ),
    "payload without its wrapper": (
        _replace(_L, 4, _L[4][len(b'{"input":') : -1]),
        "line 5: not an event, payload or end line",
    ),
    "payload after the wrong kind of event": (
        _replace(_L, 4, b'{"output":' + _L[4][len(b'{"input":') :]),
        "line 5: event call-1: an output payload line cannot follow a llm_request event",
    ),
    "two payload lines for one event": (
        _joined([*_L[:5], _L[4], *_L[5:]]),
        "line 6: a payload line must follow its event line (one payload per event)",
    ),
    "payload not UTF-8": (
        _replace(_L, 4, _L[4][:-2] + b"\xff}"),
        "line 5: payload is not UTF-8",
    ),
    "not a bundle": (b'{"hello":1}\n', 'not a .sftrace bundle (no "format": "sftrace" field)'),
    "empty": (b"", "empty file, not a .sftrace bundle"),
    "data after the end line": (_SRC + b'{"type":"tool_call"}\n', "data after the end line"),
    "blank line": (
        _joined([*_L[:5], b"", *_L[5:]]),
        "line 6: not an event, payload or end line",
    ),
    "end line with the wrong count": (
        _SRC.replace(b'"events":10,', b'"events":9,'),
        "end line does not match: it declares 9 events, found 10",
    ),
    "payload line without its closing brace": (
        _replace(_L, 8, _L[8][:-1] + b" "),
        "line 9: a payload line must end with '}'",
    ),
    "run input twice": (
        _joined([_L[0], _L[1], _L[1], *_L[3:]]),
        "line 3: a second run input",
    ),
    "run input inside the header": (
        _replace(_L, 0, _L[0].replace(b'"run":{', b'"run":{"input":"{}",', 1)),
        "line 1: the run's input/output belong on their own lines",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE), ids=list(HOSTILE))
def test_hostile_lines_give_a_one_line_bundle_error(tmp_path: Path, case: str) -> None:
    data, reason = HOSTILE[case]
    error = _load_error(_write(tmp_path / "h.sftrace", data))
    assert reason in str(error)
    with pytest.raises(BundleError) as info:
        parse_trace(data)
    assert str(info.value) == "<trace>: " + error.reason


def test_a_tampered_payload_line_loads_and_fails_verification(tmp_path: Path) -> None:
    """Fingerprinted payload lines are not parsed at load: an edit, even one that leaves the
    payload invalid JSON (a closing brace cut), is what verification finds."""
    assert _L[4].count(b"Lisbon for 2") == 1
    edited = _replace(_L, 4, _L[4].replace(b"Lisbon for 2", b"Lisbon for 3"))
    cut = _replace(_L, 8, _L[8][:-1])
    for name, data, event in (("t", edited, "call-1"), ("c", cut, "call-2")):
        trace = Trace.load(_write(tmp_path / f"{name}.sftrace", data))
        assert [(p.event_id, p.message.split(":")[0]) for p in verify_integrity(trace)] == [
            (event, "input fingerprint mismatch")
        ]


def test_a_payload_without_a_fingerprint_must_be_json(tmp_path: Path) -> None:
    data = _bundle_dict(make_trace(fingerprints=False))
    data["events"][2]["input"] = '{"city": Lisbon}'
    error = _load_error(_write(tmp_path / "p.sftrace", data))
    assert "line 9: payload is not valid JSON" in str(error)


@pytest.mark.parametrize("chunk", [1, 2, 7, 64, 1000])
def test_chunk_boundaries_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Files are read a chunk at a time: a line (or an event and its payload line) cut by a
    chunk's end reads the same, and errors name the same line."""
    plain = save_trace(make_trace(), tmp_path / "run.sftrace")
    gz = save_trace(make_trace(), tmp_path / "run.sftrace.gz")
    broken = _write(tmp_path / "b.sftrace", HOSTILE["two payload lines for one event"][0])
    expected = str(_load_error(broken))
    invalid = _write(tmp_path / "i.sftrace", _edit_event(8, seq="5"))  # the last call
    assert str(_load_error(invalid)).endswith(
        "line 20: invalid bundle at events.8.tool_call.seq: Input should be a valid integer"
    )
    expected_invalid = str(_load_error(invalid))
    monkeypatch.setattr(bundle, "_CHUNK", chunk)
    assert Trace.load(plain) == make_trace()
    assert Trace.load(gz) == make_trace()
    assert str(_load_error(broken)) == expected
    assert str(_load_error(invalid)) == expected_invalid
    assert "payload is not UTF-8" in str(
        _load_error(_write(tmp_path / "u.sftrace", HOSTILE["payload not UTF-8"][0]))
    )


def test_the_line_break_is_not_part_of_what_is_parsed(tmp_path: Path) -> None:
    """Lines are cut with their line break; a last line may lack one. Either way the same text is
    parsed, and an error quotes the same position."""
    no_final_newline = _write(tmp_path / "n.sftrace", _SRC[:-1])
    assert Trace.load(no_final_newline) == make_trace()
    cut_header = b'{"format":"sftrace","trace_id":"ab'
    for name, data in (("a", cut_header), ("b", cut_header + b"\n")):
        error = _load_error(_write(tmp_path / f"{name}.sftrace", data))
        assert "not valid JSON (truncated or not a bundle): unexpected end of data: line 1 " in (
            str(error)
        )
    cut_end = _joined([*_L[:-1], _L[-1][:12]])
    for name, data in (("c", cut_end), ("d", cut_end[:-1])):
        error = _load_error(_write(tmp_path / f"{name}.sftrace", data))
        assert "end line is not valid JSON: unexpected end of data: line 1 column 13" in str(error)


# --- integrity -----------------------------------------------------------------------------------


def test_tampered_payload_is_found(tmp_path: Path) -> None:
    data = _bundle_dict()
    data["events"][2]["input"] = canonical_json({"city": "Porto", "max_results": 5})
    trace = Trace.load(_write(tmp_path / "t.sftrace", data))
    problems = verify_integrity(trace)
    assert [p.event_id for p in problems] == ["call-2"]
    assert problems[0].message.startswith("input fingerprint mismatch: stored ")


def test_tampered_fingerprints_are_found(tmp_path: Path) -> None:
    data = _bundle_dict()
    data["events"][5]["output_sha256"] = "0" * 64
    data["events"][7]["output_sha256"] = "1" * 64
    data["run"]["input_sha256"] = "2" * 64
    trace = Trace.load(_write(tmp_path / "t.sftrace", data))
    problems = verify_integrity(trace)
    assert [(p.event_id, p.message.split(":")[0]) for p in problems] == [
        (None, "run input fingerprint mismatch"),
        ("call-2.result", "output fingerprint mismatch"),
        ("call-4.error", "output fingerprint mismatch"),
    ]
    assert str(problems[1]).startswith(
        "call-2.result: output fingerprint mismatch: stored 000000000000…"
    )
    assert isinstance(problems[0], Problem)


def test_verification_hashes_what_the_trace_holds_now(tmp_path: Path) -> None:
    """Nothing computed at load stands in for a hash at verification: a loaded trace whose
    payloads or fingerprints were changed afterwards, or whose events were swapped, is checked as
    it is now."""
    trace = Trace.load(save_trace(make_trace(), tmp_path / "run.sftrace"))
    assert verify_integrity(trace) == []
    call = trace.events[2]
    assert isinstance(call, ToolCall)
    assert call.input is not None
    edited = call.model_copy(update={"input": call.input.replace("Lisbon", "Porto")})
    refingerprinted = call.model_copy(update={"input_sha256": _sha("{}")})
    for replacement in (edited, refingerprinted):
        swapped = trace.model_copy(
            update={"events": [*trace.events[:2], replacement, *trace.events[3:]]}
        )
        assert [p.message.split(":")[0] for p in verify_integrity(swapped)] == [
            "input fingerprint mismatch"
        ]
    trace.events[2] = edited  # the list itself, after load
    assert [p.event_id for p in verify_integrity(trace)] == ["call-2"]


def test_legacy_bundles_without_fingerprints_load_and_verify_clean(tmp_path: Path) -> None:
    legacy = make_trace(fingerprints=False)
    path = save_trace(legacy, tmp_path / "legacy.sftrace")
    assert '"input_sha256"' not in path.read_text(encoding="utf-8")
    trace = Trace.load(path)
    assert verify_integrity(trace) == []
    assert missing_payloads(trace) == []


# --- legacy pairing (outcomes without parent_id) ------------------------------------------------


def test_legacy_outcomes_without_parent_links_are_paired(tmp_path: Path) -> None:
    path = save_trace(make_trace(parent_links=False), tmp_path / "old.sftrace")
    assert '"parent_id":"call-1"' not in path.read_text(encoding="utf-8")
    trace = Trace.load(path)  # validate_structure accepts it
    assert validate_structure(trace) == []
    assert missing_payloads(trace) == []
    expected = {
        "call-1": "call-1.result",
        "call-2": "call-2.result",
        "call-3": "call-3.result",
        "call-4": "call-4.error",
        "call-5": "call-5.result",
    }
    assert {c.id: getattr(trace.outcome_of(c), "id", None) for c in trace.calls} == expected
    # replay pairs them the same way (read-only use of the replay plan)
    plan = build_plan(trace)
    assert {rc.event.id: getattr(rc.outcome, "id", None) for rc in plan} == expected
    assert [rc.parent for rc in plan] == [None, None, 1, None, None]


def test_legacy_pairing_rules_for_repeated_and_nested_tools() -> None:
    def call(n: int, name: str) -> ToolCall:
        return ToolCall(id=f"c{n}", trace_id=TRACE_ID, span_id=f"{n:016x}", seq=n, name=name)

    def result(n: int, name: str) -> ToolResult:
        return ToolResult(id=f"r{n}", trace_id=TRACE_ID, span_id=f"{n:016x}", seq=n, name=name)

    def error(n: int) -> ErrorEvent:
        return ErrorEvent(
            id=f"e{n}", trace_id=TRACE_ID, span_id=f"{n:016x}", seq=n, error_type="E", message=""
        )

    # DESIGN.md: a tool call takes the next unpaired result of the same tool name *before that
    # tool is called again*. A, A (called again before any result), B; results: A, B; C; an
    # error; two more A results.
    events: list[Event] = [
        call(1, "a"),
        call(2, "a"),  # closes c1: it never gets a result
        call(3, "b"),
        result(10, "a"),  # the open "a": c2
        result(11, "b"),
        call(4, "c"),
        error(12),  # the most recent unpaired call: c4
        result(13, "a"),  # no open "a" (c2 has its result, c1 was closed)
        result(14, "a"),
    ]
    trace = Trace(trace_id=TRACE_ID, events=events)
    pairs = [(o.id, c.id if c else None) for o, c in pair_outcomes(trace.events)]
    assert pairs == [("r10", "c2"), ("r11", "c3"), ("e12", "c4"), ("r13", None), ("r14", None)]
    plan = build_plan(trace)
    assert [(rc.event.id, getattr(rc.outcome, "id", None)) for rc in plan] == [
        ("c1", None),
        ("c2", "r10"),
        ("c3", "r11"),
        ("c4", "e12"),
    ]
    assert [str(p) for p in validate_structure(trace)] == [
        "r13: outcome without parent_id matches no earlier tool",
        "r14: outcome without parent_id matches no earlier tool",
    ]


def test_outcome_lookup_is_built_once_per_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    import stepfork_otel.trace.models as models

    trace = make_trace()
    built = 0
    real = models.pair_outcomes

    def counting(events: Any) -> Any:
        nonlocal built
        built += 1
        return real(events)

    monkeypatch.setattr(models, "pair_outcomes", counting)
    assert [trace.outcome_of(c) is not None for c in trace.calls] == [True] * 5
    assert built == 1
    other = make_trace()  # an equal but distinct Trace gets its own index
    assert other.outcome_of(other.calls[0]) is not None
    assert built == 2


# --- missing payloads and incomplete bundles -----------------------------------------------------


def test_missing_payloads_are_reported() -> None:
    events = _events()
    call = events[2]
    assert isinstance(call, ToolCall)
    events[2] = call.model_copy(update={"input": None, "input_missing": "size_cap"})
    result = events[5]
    assert isinstance(result, ToolResult)
    events[5] = result.model_copy(update={"output": None})
    del events[9]  # call-5 has no outcome
    trace = Trace(trace_id=TRACE_ID, events=events)
    assert [str(p) for p in missing_payloads(trace)] == [
        "call-2: input missing (size_cap)",
        "call-2.result: output missing (not_recorded)",
        "call-5: no recorded result",
    ]
    # in an incomplete bundle an open call is expected, not a problem
    incomplete = trace.model_copy(update={"complete": False})
    assert [str(p) for p in missing_payloads(incomplete)] == [
        "call-2: input missing (size_cap)",
        "call-2.result: output missing (not_recorded)",
    ]


def test_incomplete_bundles_load_and_say_so(tmp_path: Path) -> None:
    events = _events()[:-1]  # the run died while call-5 was running
    trace = make_trace().model_copy(
        update={"events": events, "complete": False, "incomplete_reason": "process shut down"}
    )
    loaded = Trace.load(save_trace(trace, tmp_path / "died.sftrace"))
    assert loaded.complete is False
    assert loaded.incomplete_reason == "process shut down"
    assert loaded.outcome_of(loaded.calls[-1]) is None
    assert validate_structure(loaded) == []
    assert verify_integrity(loaded) == []


def test_parse_trace_without_a_path_names_the_trace() -> None:
    with pytest.raises(BundleError, match=r"^<trace>: empty file"):
        parse_trace(b"")
    with pytest.raises(TypeError, match="expected a path or a Trace"):
        load_any(42)


def test_load_trace_accepts_str_and_pathlike(tmp_path: Path) -> None:
    path = save_trace(make_trace(), tmp_path / "run.sftrace")
    assert load_trace(str(path)) == load_trace(path) == load_trace(os.fspath(path))


def test_edited_error_fields_fail_integrity(tmp_path: Path) -> None:
    """The readable error_type/message of an error event must agree with its fingerprinted
    output: editing them alone is tampering (found in review)."""
    from examples import booking_agent

    out = tmp_path / "out"
    booking_agent.main(str(out))
    trace = Trace.load(out / "failure.sftrace")
    assert verify_integrity(trace) == []
    events = [
        e.model_copy(update={"message": "all good"}) if isinstance(e, ErrorEvent) else e
        for e in trace.events
    ]
    tampered = trace.model_copy(update={"events": events})
    problems = verify_integrity(tampered)
    assert [(p.event_id, p.message) for p in problems] == [
        ("call-4.error", "error_type/message differ from the fingerprinted output of this error")
    ]


def test_loading_restores_the_garbage_collector(tmp_path: Path) -> None:
    import gc

    bad = tmp_path / "bad.sftrace"
    bad.write_text('{"format": "sftrace", "format_version": 1, "trace_id": 7}')
    assert gc.isenabled()
    with pytest.raises(BundleError):
        load_trace(bad)
    assert gc.isenabled()
    gc.disable()
    try:
        with pytest.raises(BundleError):
            load_trace(bad)
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


def test_verify_integrity_checks_model_fingerprints(tmp_path: Path) -> None:
    """`stepfork validate --verify-integrity` and replay use the same check (found in review:
    only replay compared model fingerprints)."""
    from examples import booking_agent

    out = tmp_path / "out"
    booking_agent.main(str(out))
    trace = Trace.load(out / "failure.sftrace")
    events = [
        e.model_copy(update={"model": "gpt-4.1"}) if isinstance(e, LlmRequest) else e
        for e in trace.events
    ]
    problems = verify_integrity(trace.model_copy(update={"events": events}))
    assert [p.event_id for p in problems] == ["call-1", "call-3"]
    assert all("model fingerprint mismatch" in p.message for p in problems)


# --- the event line: orjson over the validated fields, as the adapter would write it ----------


def _every_event() -> list[Any]:
    """Each golden bundle's events (tool and LLM calls and results, errors, replay actions,
    usage), and events with every optional field set or unset."""
    events: list[Any] = []
    for path in sorted(GOLDEN.glob("*.sftrace")):
        with contextlib.suppress(BundleError):  # (the tampered goldens are meant to fail)
            events.extend(Trace.load(path).events)
    base = dict(trace_id="a" * 32, span_id="b" * 16, seq=3, parent_id="call-2")
    events += [
        ToolCall(id="call-3", name="t\u00e9\U0001f600", input='{"a":1}', **base),
        LlmResponse(
            id="call-3.result",
            output="{}",
            usage={"input_tokens": 2**40, "output_tokens": 0},
            replay_action="substituted",
            replay_policy="manual",
            provider="openai",
            model="gpt-x",
            duration_ns=2**62,
            **base,
        ),
        ErrorEvent(id="call-3.error", error_type="E", message="", output=None, **base),
    ]
    return events


def test_an_event_line_is_the_adapters_json_of_the_event() -> None:
    events = _every_event()
    assert len(events) > 100
    for event in events:
        payload = "input" if isinstance(event, (ToolCall, LlmRequest)) else "output"
        expected = EVENT_ADAPTER.dump_json(event, exclude_none=True, exclude={payload})
        assert bundle._event_json(event, payload) == expected, event.id


def test_an_event_orjson_refuses_is_written_by_the_adapter() -> None:
    event = ToolCall(id="call-1", name="lone \ud800", trace_id="a" * 32, span_id="b" * 16, seq=1)
    with pytest.raises(Exception) as refused:  # neither encoder writes a lone surrogate
        EVENT_ADAPTER.dump_json(event, exclude_none=True, exclude={"input"})
    with pytest.raises(type(refused.value)):
        bundle._event_json(event, "input")
