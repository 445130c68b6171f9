"""Regenerate the golden `.sftrace` bundles used by ``tests/test_replay_golden.py``.

Run from the repository root::

    python tests/golden/make_golden.py

It records ``tests/golden_agent.py`` (a deterministic, offline agent) three times:

* ``dinner_lisbon.sftrace`` -- the sync agent, successful run: 9 calls, one tool (``research``)
  with an LLM call inside it;
* ``dinner_porto_failure.sftrace`` -- the sync agent; ``book_table`` raised
  ``TableUnavailableError`` (its message held a fake API token, stored redacted);
* ``dinner_lisbon_async.sftrace`` -- the async agent (two tools of one turn run concurrently);
* ``dinner_dated.sftrace`` -- the agent with the date, a uuid and a random greeting in its prompt,
  recorded with ``capture=`` (``record_dated()`` alone adds it without touching the others).

``dinner_lisbon_cut.sftrace`` (a run written as it goes, cut before its end) is written by
``python -m benchmarks.fuzz --write-cut-golden``.

Then it derives the bundles built to mismatch, each by one deterministic edit of the JSON of
``dinner_lisbon.sftrace`` (events are addressed by tool name / model, never by position guesses,
and after an edit calls are renumbered ``call-1..n`` in file order, with ``seq``, outcome ids and
``parent_id`` links rewritten to match):

==================================  ===============================================================
``mismatch_order.sftrace``          the ``convert_currency`` and ``research`` calls (the latter
                                    with its nested LLM call) swapped
``mismatch_kind.sftrace``           the ``convert_currency`` call and result replaced by an LLM
                                    request/response (``scripted/planner-1``) with the same input
``mismatch_tool_name.sftrace``      ``convert_currency`` renamed ``exchange_currency``
``mismatch_provider.sftrace``       the first planner call's provider ``scripted`` -> ``openai``
                                    (model fingerprint recomputed, so the bundle stays consistent)
``mismatch_model.sftrace``          the first planner call's model ``planner-1`` -> ``planner-2``
                                    (model fingerprint recomputed)
``mismatch_input.sftrace``          ``convert_currency`` recorded with ``amount`` 45.0 instead of
                                    40.0 (input fingerprint and size recomputed)
``tampered_fingerprint.sftrace``    the ``convert_currency`` result's ``output_sha256`` replaced by
                                    the SHA-256 of another text; the payload is unchanged
``missing_result.sftrace``          the ``convert_currency`` ``tool_result`` event deleted
``extra_call.sftrace``              the last planner call and its response deleted: the agent makes
                                    one call more than the recording holds
``skipped_call.sftrace``            a second ``book_table`` call (and result) appended: a recorded
                                    call the agent never makes
``legacy_no_fingerprints.sftrace``  every stored fingerprint removed (input/output SHA-256, model
                                    fingerprint), as in a hand-built or legacy bundle
==================================  ===============================================================

Argument default drift needs no bundle of its own: the agent is run with
``drifted_default=True`` (``lookup_weather`` with ``units="imperial"`` as its default) against
``dinner_lisbon.sftrace``.

Bundles hold absolute timestamps and random trace/span ids; they are data, and regenerating
changes those (and nothing the tests assert on).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import golden_agent  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402

from stepfork_otel import configure, record  # noqa: E402
from stepfork_otel.trace.bundle import parse_trace, save_trace  # noqa: E402
from stepfork_otel.trace.canonical import canonical_json  # noqa: E402
from stepfork_otel.trace.models import TRACE_ADAPTER  # noqa: E402

Event = dict[str, Any]
BASE = HERE / "dinner_lisbon.sftrace"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _model_fingerprint(event: Event) -> str:
    return _sha(
        canonical_json(
            {
                "provider": event["provider"],
                "model": event["model"],
                "operation": event["operation"],
            }
        )
    )


# --- recording -------------------------------------------------------------------------------------


def record_runs() -> None:
    provider = TracerProvider()
    configure(tracer_provider=provider)  # bundles go where record(...) says
    entry = "golden_agent:run_dinner_agent"
    with record(
        BASE, input={"question": golden_agent.LISBON}, name="dinner_agent", entrypoint=entry
    ) as run:
        run.set_output(golden_agent.run_dinner_agent(golden_agent.LISBON))
    try:
        with record(
            HERE / "dinner_porto_failure.sftrace",
            input={"question": golden_agent.PORTO},
            name="dinner_agent",
            entrypoint=entry,
        ) as run:
            run.set_output(golden_agent.run_dinner_agent(golden_agent.PORTO))
    except golden_agent.TableUnavailableError:
        pass
    else:
        raise RuntimeError("the Porto run was expected to fail")

    async def run_async() -> None:
        async with record(
            HERE / "dinner_lisbon_async.sftrace",
            input={"question": golden_agent.LISBON},
            name="dinner_agent_async",
            entrypoint="golden_agent:run_dinner_agent_async",
        ) as arun:
            arun.set_output(await golden_agent.run_dinner_agent_async(golden_agent.LISBON))

    asyncio.run(run_async())
    record_dated()
    provider.shutdown()


def record_dated() -> None:
    """``dinner_dated.sftrace``: the agent with the date, a uuid and a random greeting in its
    prompt, recorded with ``capture=("time", "uuid", "random")`` (format 3's captured reads)."""
    with tempfile.TemporaryDirectory() as scratch:  # (recording in tests/golden would recover
        path = Path(scratch) / "dinner_dated.sftrace"  # its golden journal into a bundle)
        with record(
            path,
            input={"question": golden_agent.LISBON},
            name="dinner_agent_dated",
            entrypoint="golden_agent:run_dated_agent",
            capture=("time", "uuid", "random"),
        ) as run:
            run.set_output(golden_agent.run_dated_agent(golden_agent.LISBON))
        shutil.move(path, HERE / path.name)


# --- editing ---------------------------------------------------------------------------------------


def _load(path: Path) -> dict[str, Any]:
    """The bundle as one JSON object, payloads inline (the edits below work on that)."""
    data: dict[str, Any] = parse_trace(path.read_bytes(), path).model_dump(
        mode="json", exclude_none=True
    )
    return data


def _save(bundle: dict[str, Any], name: str) -> None:
    _renumber(bundle)
    # parsed through the model: every golden bundle is schema-valid, whatever else is wrong with it
    save_trace(TRACE_ADAPTER.validate_json(orjson.dumps(bundle), strict=True), HERE / name)


def _renumber(bundle: dict[str, Any]) -> None:
    """Calls become ``call-1..n`` in file order; outcomes and parent links follow."""
    mapping: dict[str, str] = {}
    n = 0
    for event in bundle["events"]:
        if event["type"] in ("tool_call", "llm_request"):
            n += 1
            mapping[event["id"]] = f"call-{n}"
    for event in bundle["events"]:
        if event["type"] in ("tool_call", "llm_request"):
            event["id"] = mapping[event["id"]]
            event["seq"] = int(event["id"].split("-")[1])
            if event.get("parent_id"):
                event["parent_id"] = mapping[event["parent_id"]]
        else:
            call = mapping[event["parent_id"]]
            suffix = event["id"].rsplit(".", 1)[1]
            event["id"], event["parent_id"] = f"{call}.{suffix}", call
            event["seq"] = int(call.split("-")[1])


def _call(bundle: dict[str, Any], match: Callable[[Event], bool], nth: int = 1) -> Event:
    found = [e for e in bundle["events"] if e["type"] in ("tool_call", "llm_request") and match(e)]
    return found[nth - 1]


def _tool(name: str) -> Callable[[Event], bool]:
    return lambda e: e["type"] == "tool_call" and e["name"] == name


def _llm(model: str) -> Callable[[Event], bool]:
    return lambda e: e["type"] == "llm_request" and e["model"] == model


def _outcome(bundle: dict[str, Any], call: Event) -> Event:
    return next(e for e in bundle["events"] if e.get("parent_id") == call["id"] and "output" in e)


def _group(bundle: dict[str, Any], call: Event) -> tuple[int, int]:
    """[start, end) of the events of ``call``: the call, its nested calls, its outcome."""
    events = bundle["events"]
    start = events.index(call)
    end = events.index(_outcome(bundle, call)) + 1
    return start, end


def mismatch_order(bundle: dict[str, Any]) -> None:
    convert = _call(bundle, _tool("convert_currency"))
    research = _call(bundle, _tool("research"))
    (a0, a1), (b0, b1) = _group(bundle, convert), _group(bundle, research)
    assert a1 == b0, "convert_currency and research are expected back to back"
    events = bundle["events"]
    events[a0:b1] = events[b0:b1] + events[a0:a1]


def mismatch_kind(bundle: dict[str, Any]) -> None:
    call = _call(bundle, _tool("convert_currency"))
    result = _outcome(bundle, call)
    for event in (call, result):
        del event["name"]
        event["provider"], event["model"] = golden_agent.PLANNER
    call["type"], call["operation"] = "llm_request", "chat"
    call["model_fingerprint"] = _model_fingerprint(call)
    result["type"] = "llm_response"


def mismatch_tool_name(bundle: dict[str, Any]) -> None:
    call = _call(bundle, _tool("convert_currency"))
    call["name"] = _outcome(bundle, call)["name"] = "exchange_currency"


def _first_planner(bundle: dict[str, Any]) -> tuple[Event, Event]:
    call = _call(bundle, _llm("planner-1"))
    return call, _outcome(bundle, call)


def mismatch_provider(bundle: dict[str, Any]) -> None:
    call, response = _first_planner(bundle)
    call["provider"] = response["provider"] = "openai"
    call["model_fingerprint"] = _model_fingerprint(call)


def mismatch_model(bundle: dict[str, Any]) -> None:
    call, response = _first_planner(bundle)
    call["model"] = response["model"] = "planner-2"
    call["model_fingerprint"] = _model_fingerprint(call)


def mismatch_input(bundle: dict[str, Any]) -> None:
    call = _call(bundle, _tool("convert_currency"))
    arguments = orjson.loads(call["input"])
    assert arguments["amount"] == 40.0
    arguments["amount"] = 45.0
    call["input"] = canonical_json(arguments)
    call["input_sha256"] = _sha(call["input"])
    call["input_size"] = len(call["input"].encode("utf-8"))


def tampered_fingerprint(bundle: dict[str, Any]) -> None:
    result = _outcome(bundle, _call(bundle, _tool("convert_currency")))
    result["output_sha256"] = _sha("43.21")  # a plausible but wrong fingerprint


def missing_result(bundle: dict[str, Any]) -> None:
    result = _outcome(bundle, _call(bundle, _tool("convert_currency")))
    bundle["events"].remove(result)


def extra_call(bundle: dict[str, Any]) -> None:
    last = [e for e in bundle["events"] if e["type"] == "llm_request"][-1]
    start, end = _group(bundle, last)
    del bundle["events"][start:end]


def skipped_call(bundle: dict[str, Any]) -> None:
    book = _call(bundle, _tool("book_table"))
    start, end = _group(bundle, book)
    extra = copy.deepcopy(bundle["events"][start:end])
    for event in extra:
        event["id"] = event["id"].replace("call-", "extra-")
        event["parent_id"] = event.get("parent_id") and event["parent_id"].replace(
            "call-", "extra-"
        )
        event["time_unix_nano"] += 10**9
    bundle["events"].extend(extra)


def legacy_no_fingerprints(bundle: dict[str, Any]) -> None:
    for event in bundle["events"]:
        for key in ("input_sha256", "output_sha256", "model_fingerprint"):
            event.pop(key, None)
    for key in ("input_sha256", "output_sha256"):
        bundle["run"].pop(key, None)


EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "mismatch_order.sftrace": mismatch_order,
    "mismatch_kind.sftrace": mismatch_kind,
    "mismatch_tool_name.sftrace": mismatch_tool_name,
    "mismatch_provider.sftrace": mismatch_provider,
    "mismatch_model.sftrace": mismatch_model,
    "mismatch_input.sftrace": mismatch_input,
    "tampered_fingerprint.sftrace": tampered_fingerprint,
    "missing_result.sftrace": missing_result,
    "extra_call.sftrace": extra_call,
    "skipped_call.sftrace": skipped_call,
    "legacy_no_fingerprints.sftrace": legacy_no_fingerprints,
}


def derive_mismatches() -> None:
    base = _load(BASE)
    for name, edit in EDITS.items():
        bundle = copy.deepcopy(base)
        edit(bundle)
        _save(bundle, name)


def main() -> int:
    record_runs()
    derive_mismatches()
    for path in sorted(HERE.glob("*.sftrace")):
        print(path.relative_to(TESTS.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
