"""The captured sources as data: each source's group and the JSON form of its value, and the
structural check of a bundle's ``captured`` reads.

The one list of what can be captured: ``recording/determinism.py`` intercepts exactly these names,
replay serves values of these forms, and a bundle whose reads name another source or hold a value
of the wrong form is refused when it is loaded (a hostile or damaged bundle gets a
:class:`~stepfork_otel.trace.errors.BundleError` then, never a ``ValueError`` from inside the
agent's ``datetime.now()``).
"""

from __future__ import annotations

import datetime
import hashlib
import re
import secrets
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from stepfork_otel import constants as k
from stepfork_otel.trace.errors import Problem, quote
from stepfork_otel.trace.models import CapturedRead, Trace


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parses(parse: Callable[[str], object]) -> Callable[[Any], bool]:
    """Whether a value is text that ``parse`` reads -- the form replay decodes it from."""

    def valid(value: Any) -> bool:
        if not isinstance(value, str):
            return False
        try:
            parse(value)
        except ValueError:
            return False
        return True

    return valid


_datetime = _parses(datetime.datetime.fromisoformat)
_date = _parses(datetime.date.fromisoformat)
_uuid = _parses(uuid.UUID)


_HEX = re.compile(r"(?:[0-9a-f]{2})*")
_BITS = re.compile(r"[0-9]{1,9}:[0-9a-f]{1,4096}")


def _hex(value: Any) -> bool:
    return isinstance(value, str) and _HEX.fullmatch(value) is not None


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _struct_time(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 9 and all(_integer(v) for v in value)


def _draws(value: Any) -> bool:
    """The primitive draws of a ``random`` function: floats, and ``bits:hex`` for random bits."""
    return isinstance(value, list) and all(
        isinstance(d, float) or (isinstance(d, str) and _BITS.fullmatch(d) is not None)
        for d in value
    )


class Source(NamedTuple):
    group: str
    """The ``capture=`` name that records it."""
    valid: Callable[[Any], bool]
    """Whether a recorded value has this source's form."""
    form: str
    """The form, as an error message names it."""


_RANDOM = Source(k.CAPTURE_RANDOM, _draws, "a list of draws")

#: Every source that can be captured, by the name a bundle records it under.
SOURCES: dict[str, Source] = {
    "time.time": Source(k.CAPTURE_TIME, _number, "a number"),
    "time.time_ns": Source(k.CAPTURE_TIME, _integer, "an integer"),
    "time.strftime": Source(k.CAPTURE_TIME, _text, "text"),
    "time.ctime": Source(k.CAPTURE_TIME, _text, "text"),
    "time.localtime": Source(k.CAPTURE_TIME, _struct_time, "nine integers"),
    "time.gmtime": Source(k.CAPTURE_TIME, _struct_time, "nine integers"),
    "datetime.now": Source(k.CAPTURE_TIME, _datetime, "an ISO date-time"),
    "datetime.utcnow": Source(k.CAPTURE_TIME, _datetime, "an ISO date-time"),
    "datetime.today": Source(k.CAPTURE_TIME, _datetime, "an ISO date-time"),
    "date.today": Source(k.CAPTURE_TIME, _date, "an ISO date"),
    "uuid.uuid4": Source(k.CAPTURE_UUID, _uuid, "a uuid"),
    "uuid.uuid1": Source(k.CAPTURE_UUID, _uuid, "a uuid"),
    "os.urandom": Source(k.CAPTURE_SECRETS, _hex, "hex digits"),
    "secrets.token_bytes": Source(k.CAPTURE_SECRETS, _hex, "hex digits"),
    "secrets.token_hex": Source(k.CAPTURE_SECRETS, _text, "text"),
    "secrets.token_urlsafe": Source(k.CAPTURE_SECRETS, _text, "text"),
    "random.gauss": Source(k.CAPTURE_RANDOM, _number, "a number"),
    "os.environ": Source(k.CAPTURE_ENV, lambda value: value is None, "no value"),
}
for _name in (
    "random",
    "uniform",
    "triangular",
    "randint",
    "randrange",
    "choice",
    "choices",
    "sample",
    "shuffle",
    "getrandbits",
    "randbytes",
    "normalvariate",
    "lognormvariate",
    "expovariate",
    "vonmisesvariate",
    "gammavariate",
    "betavariate",
    "paretovariate",
    "weibullvariate",
):
    SOURCES[f"random.{_name}"] = _RANDOM

#: The global ``random`` functions that are captured by their draws (``gauss`` keeps half of
#: each pair it draws on the generator, so its value is recorded as is).
RANDOM_FUNCTIONS = tuple(
    name.removeprefix("random.") for name, source in SOURCES.items() if source is _RANDOM
)


# --- environment reads: a salted, slow fingerprint -----------------------------------------------


def env_salting() -> dict[str, Any]:
    """What a new environment read keeps beside its fingerprint, as the read's ``value``: the
    key derivation, its iterations and a random salt of this read's own."""
    return {
        "kdf": k.ENV_KDF,
        "iterations": k.ENV_KDF_ITERATIONS,
        "salt": secrets.token_hex(k.ENV_SALT_BYTES),
    }


def env_fingerprint(value: str | None, salting: Any = None) -> str | None:
    """What a bundle keeps of an environment variable's value (None: it was unset).

    With ``salting`` (:func:`env_salting`, as a read holds it): PBKDF2-HMAC-SHA-256 of the
    value under the read's salt, in hex. Without (a bundle of an earlier version): the bare
    SHA-256 that bundle holds, so that it can still be compared. The salt is in the bundle --
    replay must compute the same fingerprint of the live value -- so it defeats precomputed
    lists and the comparison of one value across bundles, not a guess of this one read: the
    iterations make each guess cost thousands of hashes, and a short or common value can still
    be found. ``salting`` is assumed checked (:func:`env_salting_problem`)."""
    if value is None:
        return None
    data = value.encode("utf-8", "surrogatepass")
    if salting is None:
        return hashlib.sha256(data).hexdigest()
    salt = bytes.fromhex(salting["salt"])
    return hashlib.pbkdf2_hmac("sha256", data, salt, salting["iterations"]).hex()


_SALT = re.compile(r"(?:[0-9a-f]{2}){8,64}")


def env_salting_problem(value: Any) -> str | None:
    """What is wrong with an environment read's ``value`` (None: nothing): absent (an unset
    variable, or a bundle of an earlier version), or exactly what :func:`env_salting` makes,
    with no more iterations than :data:`~stepfork_otel.constants.ENV_KDF_MAX_ITERATIONS` (what a
    hostile bundle may make replay compute)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"kdf", "iterations", "salt"}:
        return "an environment read holds no value, only how its fingerprint was made"
    if value["kdf"] != k.ENV_KDF:
        return f"unknown fingerprint derivation {quote(value['kdf'])}"
    iterations = value["iterations"]
    if not _integer(iterations) or not 1 <= iterations <= k.ENV_KDF_MAX_ITERATIONS:
        return f"the fingerprint's iterations are not 1 to {k.ENV_KDF_MAX_ITERATIONS}"
    if not isinstance(value["salt"], str) or _SALT.fullmatch(value["salt"]) is None:
        return "the fingerprint's salt is not 8 to 64 bytes in hex"
    return None


#: A read's ``thread``: the numbers of the threads started, from the run's first thread down.
_THREAD = re.compile(r"[1-9][0-9]{0,8}(?:\.[1-9][0-9]{0,8})*")


def _read_problem(read: CapturedRead) -> str | None:
    source = SOURCES.get(read.source)
    if source is None:
        return f"unknown source {quote(read.source)}"
    if read.kind == "audit":
        if read.thread is not None:
            return "an audit entry names no thread (it counts the reads of every thread)"
        return None if read.value is None else "an audit entry holds no value"
    if read.thread is not None and not _THREAD.fullmatch(read.thread):
        return f"thread {quote(read.thread)} is not a thread's number (such as 2 or 2.1)"
    if read.kind == "env":
        if read.source != "os.environ" or not read.name:
            return "an environment read names os.environ and its variable"
        return env_salting_problem(read.value)
    if source.group == k.CAPTURE_ENV:
        return "os.environ is checked, never served: it holds no value"
    if not source.valid(read.value):
        return f"the value of {read.source} is not {source.form}"
    return None


def captured_problems(trace: Trace) -> list[Problem]:
    """What is wrong with a bundle's captured reads: unknown sources, values of the wrong form,
    order numbers out of order, a ``before_call`` that is no call of the run, a ``thread`` that
    is no thread's number."""
    problems: list[Problem] = []
    last = 0
    calls = {event.seq for event in trace.calls}
    for read in trace.captured:
        where = f"captured read {read.index}"
        if read.kind != "audit":
            if read.index <= last:
                problems.append(Problem(None, f"{where} is out of order"))
            last = read.index
        if read.before_call is not None and read.before_call not in calls:
            problems.append(Problem(None, f"{where} precedes call {read.before_call}, not a call"))
        problem = _read_problem(read)
        if problem is not None:
            problems.append(Problem(None, f"{where}: {problem}"))
    return problems


def group_of(source: str) -> str:
    """The ``capture=`` group a source belongs to (``env`` for one this version does not know)."""
    known = SOURCES.get(source)
    return known.group if known is not None else k.CAPTURE_ENV
