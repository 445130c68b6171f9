"""The one patching module (``stepfork_otel/_patching.py``): what a ``Patcher`` replaced it puts
back itself -- own or inherited as it was --, idempotent, beside another library that wrapped the
same attribute since (wrapt, as openinference does), safe across threads, holding no instance
alive; and each of its four users (the SDK integrations, the network guard, the determinism
capture, the redacting processors) keeps to it."""

from __future__ import annotations

import gc
import socket
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
import wrapt
from conftest import installed
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import stepfork_otel
from stepfork_otel import record
from stepfork_otel._patching import MARK, Patcher
from stepfork_otel.otel import redacting
from stepfork_otel.recording import determinism
from stepfork_otel.recording.integrations import sdk
from stepfork_otel.replay.network import NetworkGuard, NetworkRefusedError


def shouting(method: Any) -> Any:
    def wrapper(self: Any) -> str:
        return str(method(self)).upper()

    return wrapper


@pytest.fixture
def classes() -> tuple[type, type]:
    """A fresh base class and subclass for each test (patched, whatever the test leaves)."""

    class Base:
        def greet(self) -> str:
            return "base"

    class Child(Base):
        def own(self) -> str:
            return "own"

    return Base, Child


def test_an_inherited_attribute_is_inherited_again_and_an_own_one_put_back(
    classes: tuple[type, Any],
) -> None:
    base, child = classes
    patcher = Patcher("test")
    own = vars(child)["own"]
    assert patcher.wrap(child, "greet", shouting) is not None
    assert patcher.wrap(child, "own", shouting) is not None
    assert (child().greet(), child().own()) == ("BASE", "OWN")
    assert patcher.replaced(vars(child)["greet"]) is vars(base)["greet"]
    patcher.restore_all()
    assert "greet" not in vars(child)  # inherited again, not copied into the subclass
    assert vars(child)["own"] is own
    assert len(patcher) == 0


def test_idempotent_and_undone_only_by_the_patcher_that_applied_it(
    classes: tuple[type, Any],
) -> None:
    _, child = classes
    first, second = Patcher("first"), Patcher("second")
    wrapper = first.wrap(child, "own", shouting)
    assert first.wrap(child, "own", shouting) is None  # ours already: nothing changes
    assert vars(child)["own"] is wrapper
    assert first.owns(child, "own")
    assert not second.owns(child, "own")
    assert not second.restore(child, "own")  # not its patch
    assert vars(child)["own"] is wrapper
    assert first.restore(child, "own")
    assert not first.restore(child, "own")  # undone already
    assert child().own() == "own"


def test_a_wrapt_wrapper_made_since_is_left_and_its_proxy_is_not_taken_for_ours(
    classes: tuple[type, Any],
) -> None:
    """Another instrumentation wraps our wrapper with wrapt (openinference does): undoing ours
    leaves theirs, and their proxy -- which hands out our attributes as its own -- is not taken
    for one of ours (that would take their wrapper off with ours)."""
    _, child = classes
    patcher = Patcher("test")
    patcher.wrap(child, "own", shouting)

    def exclaim(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> str:
        return str(wrapped(*args, **kwargs)) + "!"

    wrapt.wrap_function_wrapper(child, "own", exclaim)
    theirs = vars(child)["own"]
    assert getattr(theirs, MARK, None) is not None  # the proxy hands out our mark ...
    assert patcher.replaced(theirs) is None  # ... which is not read through it
    assert not patcher.owns(child, "own")
    patcher.restore_all()
    assert vars(child)["own"] is theirs
    assert child().own() == "OWN!"  # (ours inside theirs: its user makes it inert)


def test_a_copy_of_ours_put_back_by_another_library_is_undone_too(
    classes: tuple[type, Any],
) -> None:
    """A library undone puts back the method it saved: one of our wrappers, now on a class we
    never patched (openinference on ``OpenAI.request``). Undoing that class finds it ours."""
    base, child = classes
    real = vars(base)["greet"]
    patcher = Patcher("test")
    ours = patcher.wrap(base, "greet", shouting)
    child.greet = ours  # what the other library saved (inherited) and put back (own)
    assert patcher.wrap(child, "greet", shouting) is None  # ours already
    assert patcher.restore(child, "greet")
    assert vars(child)["greet"] is real
    patcher.restore_all()
    assert vars(base)["greet"] is real


def test_a_failing_replacement_leaves_nothing_changed() -> None:
    class Frozen(type):
        def __setattr__(cls, name: str, value: Any) -> None:
            raise AttributeError("frozen")

    class Locked(metaclass=Frozen):
        def method(self) -> int:
            return 1

    patcher = Patcher("test")
    with pytest.raises(AttributeError, match="frozen"):
        patcher.wrap(Locked, "method", shouting)
    assert len(patcher) == 0
    assert Locked().method() == 1


def test_concurrent_patching_from_threads_never_wraps_a_wrapper(
    classes: tuple[type, Any],
) -> None:
    """Eight threads wrap and restore the same attributes at once: every wrapper of ours found
    wraps the real method (never another of ours), and the last restore leaves the real ones."""
    base, child = classes
    patcher = Patcher("test")
    real = {"own": vars(child)["own"], "greet": vars(base)["greet"]}
    barrier = threading.Barrier(8)
    wrapped: list[Any] = []

    def worker() -> None:
        barrier.wait()
        for _ in range(200):
            for name in ("own", "greet"):
                patcher.wrap(child, name, shouting)
                original = patcher.replaced(vars(child).get(name))
                if original is not None:
                    wrapped.append((name, original))
            patcher.restore(child, "greet")

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrapped
    assert all(original is real[name] for name, original in wrapped)
    patcher.restore_all()
    assert vars(child)["own"] is real["own"]
    assert "greet" not in vars(child)


def test_a_patched_instance_is_not_kept_alive(classes: tuple[type, Any]) -> None:
    _, child = classes
    patcher = Patcher("test")
    instance = child()
    patcher.replace(instance, "own", lambda: "replaced")
    assert instance.own() == "replaced"
    gone = weakref.ref(instance)
    del instance
    gc.collect()
    assert gone() is None
    assert len(patcher) == 0


def test_put_first_is_undone_by_taking_out_only_what_it_put_there() -> None:
    """The redacting processors' patch of the SDK's private processor tuple: undone, the
    processors added since stay."""
    provider = TracerProvider()
    multi = provider._active_span_processor
    before = SimpleSpanProcessor(InMemorySpanExporter())
    provider.add_span_processor(before)
    first = redacting.enable_span_redaction(provider)
    assert multi._span_processors[0] is first
    assert redacting.enable_span_redaction(provider) is first  # idempotent
    after = SimpleSpanProcessor(InMemorySpanExporter())
    provider.add_span_processor(after)
    assert redacting._PATCHES.restore(multi, "_span_processors")
    assert multi._span_processors == (before, after)


# -- the four users --------------------------------------------------------------------------------


def test_the_sdk_integration_holds_no_client_it_instrumented(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``instrument_openai(client)`` patches that instance through the patcher: a client dropped
    without being undone is collected (its connection pool with it)."""
    openai = installed("openai")
    monkeypatch.setattr(sdk, "_clients", {})  # (a dropped client is never counted down)
    client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-test")
    stepfork_otel.instrument_openai(client)
    try:
        assert "request" in vars(client)
        gone = weakref.ref(client)
        del client
        gc.collect()
        assert gone() is None
    finally:
        sdk._clients.clear()
        sdk._uninstall_http()


def test_ending_a_capturing_run_puts_back_the_clock_another_library_had_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run puts back what was there when it started: a clock another library had replaced
    before the run (a test's frozen clock) is that library's again. It used to be the real
    ``time.time``, undoing the other library's patch behind its back."""

    def frozen() -> float:
        return 1_700_000_000.0

    monkeypatch.setattr(time, "time", frozen)
    with record(tmp_path / "run.sftrace", capture="time"):
        assert time.time is not frozen  # the capture's stand-in, during the run
    assert time.time is frozen
    assert not determinism.installed()


def test_the_network_guard_leaves_a_wrapper_made_over_its_own() -> None:
    """A library wraps ``socket.create_connection`` while a guard is active: deactivating
    leaves that library's wrapper (and the guard's inside it no longer refuses)."""
    real = socket.create_connection
    guard = NetworkGuard()
    token = guard.activate()
    guarded = socket.create_connection
    calls: list[Any] = []

    def theirs(address: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(address)
        return guarded(address, *args, **kwargs)

    socket.create_connection = theirs
    try:
        with pytest.raises(NetworkRefusedError):
            socket.create_connection(("127.0.0.1", 9), timeout=0.01)
        guard.deactivate(token)
        assert socket.create_connection is theirs
        with pytest.raises(OSError) as refused:  # nobody listens on port 9: refused by the OS
            socket.create_connection(("127.0.0.1", 9), timeout=1)
        assert not isinstance(refused.value, NetworkRefusedError)
        assert len(calls) == 2
    finally:
        socket.create_connection = real
