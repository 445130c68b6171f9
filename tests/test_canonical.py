"""Canonical JSON: every rule of ``stepfork_otel.trace.canonical`` pinned to exact bytes.

A fingerprint is the SHA-256 of these bytes, so any change here changes every recorded fingerprint:
each test states the expected output literally rather than comparing two encoder calls.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import hashlib
import json
import os
import pathlib
import random
import subprocess
import sys
import uuid
from typing import Any

import pydantic
import pytest

from stepfork_otel.trace.canonical import (
    MAX_DEPTH,
    UNSERIALISABLE_MARKER,
    UnserialisableError,
    canonical_bytes,
    canonical_json,
    fingerprint,
    loads,
    sha256_hex,
    unserialisable_marker,
)

# --- objects, strings, whitespace ------------------------------------------------------------------


def test_keys_sorted_at_every_level_without_whitespace() -> None:
    value = {"b": 1, "a": {"d": [{"z": 1, "y": 2}], "c": 3}, "A": None}
    assert canonical_bytes(value) == b'{"A":null,"a":{"c":3,"d":[{"y":2,"z":1}]},"b":1}'


def test_keys_sorted_by_code_point_not_utf16() -> None:
    # RFC 8785 sorts by UTF-16 code units (U+1F600 would come before U+FFFF); we sort by code point.
    value = {"\U0001f600": 1, "\uffff": 2, "é": 3, "z": 4, "Z": 5, "a": 6}
    assert canonical_json(value) == '{"Z":5,"a":6,"z":4,"é":3,"\uffff":2,"\U0001f600":1}'


def test_non_ascii_is_utf8_not_escaped() -> None:
    assert canonical_bytes("é漢😀") == '"é漢😀"'.encode()
    assert canonical_bytes({"clé": "漢"}) == b'{"cl\xc3\xa9":"\xe6\xbc\xa2"}'


def test_string_escapes() -> None:
    assert canonical_json('q"b\\s/\n\t\x00\x1f\u2028') == '"q\\"b\\\\s/\\n\\t\\u0000\\u001f\u2028"'


def test_empty_containers_and_scalars() -> None:
    assert canonical_json({}) == "{}"
    assert canonical_json([]) == "[]"
    assert canonical_json(None) == "null"
    assert canonical_json(True) == "true"
    assert canonical_json([False, 0, -1, ""]) == '[false,0,-1,""]'


# --- numbers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, "1.0"),
        (1, "1"),
        (0.1, "0.1"),
        (1e-7, "1e-7"),
        (1e16, "1e+16"),
        (123456789.125, "123456789.125"),
        (-0.0, "-0.0"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
    ],
)
def test_float_form(value: float, expected: str) -> None:
    assert canonical_json(value) == expected


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinities_become_null(value: float) -> None:
    assert canonical_json(value) == "null"
    assert canonical_json({"x": [value]}) == '{"x":[null]}'


def test_float_subclass_is_a_float() -> None:
    class Metres(float):
        pass

    assert canonical_json([Metres(2.5), {"m": Metres(float("nan"))}]) == '[2.5,{"m":null}]'


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2**63 - 1, "9223372036854775807"),
        (2**64 - 1, "18446744073709551615"),
        (2**64, "18446744073709551616"),
        (-(2**63), "-9223372036854775808"),
        (-(2**63) - 1, "-9223372036854775809"),
        (10**40, "1" + "0" * 40),
        (-(10**40) - 7, "-1" + "0" * 39 + "7"),
    ],
)
def test_integers_of_any_size_are_exact(value: int, expected: str) -> None:
    assert canonical_json(value) == expected
    # and read back exactly, alone and inside a payload (orjson alone would give a float)
    assert loads(expected) == value
    assert type(loads(expected)) is int
    text = canonical_json({"date": "2026-11-29", "n": [value, 1.5], "s": "12-34"})
    assert loads(text) == {"date": "2026-11-29", "n": [value, 1.5], "s": "12-34"}


def test_big_integers_nested_in_dicts_sets_and_keys() -> None:
    big = 2**70
    value = {"n": {"deep": [big, -big]}, "s": {big, 1, -big}, big: "key"}
    assert canonical_json(value) == (
        '{"1180591620717411303424":"key",'
        '"n":{"deep":[1180591620717411303424,-1180591620717411303424]},'
        '"s":[-1180591620717411303424,1,1180591620717411303424]}'
    )


# --- non-JSON types ------------------------------------------------------------------------------


class Colour(enum.Enum):
    RED = "red"
    PAIR = (1, 2)


class Size(str, enum.Enum):
    SMALL = "s"


class Level(enum.IntEnum):
    HIGH = 3


def test_enums_encode_as_their_value() -> None:
    assert (
        canonical_json([Colour.RED, Colour.PAIR, Size.SMALL, Level.HIGH]) == '["red",[1,2],"s",3]'
    )


def test_datetimes_naive_and_aware() -> None:
    utc = datetime.timezone.utc
    plus = datetime.timezone(datetime.timedelta(hours=5, minutes=30))
    value = [
        datetime.datetime(2024, 1, 2, 3, 4, 5),
        datetime.datetime(2024, 1, 2, 3, 4, 5, 123456),
        datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=utc),
        datetime.datetime(2024, 1, 2, tzinfo=plus),
        datetime.date(2024, 1, 2),
        datetime.time(1, 2, 3),
        datetime.time(1, 2, 3, 500),
        datetime.time(1, 2, 3, tzinfo=plus),
    ]
    assert canonical_json(value) == (
        '["2024-01-02T03:04:05","2024-01-02T03:04:05.123456","2024-01-02T03:04:05+00:00",'
        '"2024-01-02T00:00:00+05:30","2024-01-02","01:02:03","01:02:03.000500","01:02:03+05:30"]'
    )


def test_uuid_decimal_path() -> None:
    value = [
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        decimal.Decimal("1.10"),
        decimal.Decimal("-1E+3"),
        pathlib.PurePosixPath("/srv/a b"),
    ]
    assert canonical_json(value) == (
        '["12345678-1234-5678-1234-567812345678","1.10","-1E+3","/srv/a b"]'
    )


def test_bytes_are_standard_base64() -> None:
    assert canonical_json([b"", b"\x00\xff\xfe", bytearray(b"ab?"), memoryview(b"hi")]) == (
        '["","AP/+","YWI/","aGk="]'
    )


def test_sets_are_sorted_by_canonical_element() -> None:
    assert canonical_json({3, 1, 2}) == "[1,2,3]"
    assert canonical_json(frozenset({"b", "a", "ab"})) == '["a","ab","b"]'
    # mixed types: by the bytes of each element ('"' < '-' < digits < 'f' < 'n' < 't' < '[')
    mixed = {"x", 10, 9, -1, 2.5, None, True, (1, 2), frozenset()}
    assert canonical_json(mixed) == '["x",-1,10,2.5,9,[1,2],[],null,true]'


def test_sets_of_non_json_elements_and_nested_sets() -> None:
    value = {frozenset({2, 1}), frozenset({"a"}), Colour.RED}
    assert canonical_json(value) == '["red",["a"],[1,2]]'
    assert canonical_json({b"\x01", b"\x00"}) == '["AA==","AQ=="]'


def test_set_order_is_the_same_in_another_process() -> None:
    # string hashing is randomised per process: the encoding must not depend on iteration order
    code = (
        "from stepfork_otel.trace.canonical import canonical_json;"
        "print(canonical_json({'pear','apple','fig','kiwi','date','lime'}))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
        ).stdout.strip()
        for seed in (1, 2, 3)
    }
    assert outputs == {'["apple","date","fig","kiwi","lime","pear"]'}


def test_tuples_and_named_tuples_are_arrays() -> None:
    Point = collections.namedtuple("Point", "x y")
    assert canonical_json((1, (2, "3"))) == '[1,[2,"3"]]'
    assert canonical_json({"p": Point(1, 2), "s": {Point(3, 4)}}) == '{"p":[1,2],"s":[[3,4]]}'


@dataclasses.dataclass
class Inner:
    zeta: int
    alpha: bytes


@dataclasses.dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner
    when: datetime.date
    tags: frozenset[str] = frozenset()


def test_dataclasses_are_objects_of_their_fields_sorted_and_nested() -> None:
    value = Outer("n", Inner(2, b"\x01"), datetime.date(2024, 5, 6), frozenset({"y", "x"}))
    assert canonical_json(value) == (
        '{"inner":{"alpha":"AQ==","zeta":2},"name":"n","tags":["x","y"],"when":"2024-05-06"}'
    )


def test_dataclass_class_itself_is_unserialisable() -> None:
    with pytest.raises(UnserialisableError, match=r"builtins\.type"):
        canonical_json(Inner)


class Address(pydantic.BaseModel):
    street: str
    zip_code: int


class Customer(pydantic.BaseModel):
    name: str
    address: Address
    seen: datetime.datetime
    raw: bytes
    tags: set[str]
    extra: dict[str, Any] = {}


def test_pydantic_models_use_pydantic_json_mode() -> None:
    value = Customer(
        name="Zoë",
        address=Address(street="Rua", zip_code=1100),
        seen=datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
        raw=b"ok",
        tags={"vip", "early", "b2b"},
        extra={"nested": {"z", "a"}, "n": float("nan")},
    )
    assert canonical_json({"c": value}) == (
        '{"c":{"address":{"street":"Rua","zip_code":1100},"extra":{"n":null,"nested":["a","z"]},'
        '"name":"Zoë","raw":"ok","seen":"2024-01-02T03:04:05Z","tags":["b2b","early","vip"]}}'
    )


def test_pydantic_set_fields_are_sorted_in_another_process() -> None:
    code = (
        "import pydantic\n"
        "from stepfork_otel.trace.canonical import canonical_json\n"
        "class M(pydantic.BaseModel):\n"
        "    tags: frozenset[str]\n"
        "print(canonical_json(M(tags={'pear','apple','fig','kiwi','date','lime'})))\n"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
        ).stdout.strip()
        for seed in (1, 2, 3)
    }
    assert outputs == {'{"tags":["apple","date","fig","kiwi","lime","pear"]}'}


def test_pydantic_model_that_cannot_dump_is_unserialisable() -> None:
    with pytest.raises(UnserialisableError, match="Customer"):
        canonical_json(
            Customer(
                name="x",
                address=Address(street="s", zip_code=1),
                seen=datetime.datetime(2024, 1, 1),
                raw=b"\xff\xfe",  # pydantic writes bytes as UTF-8 text: this is not UTF-8
                tags=set(),
            )
        )


# --- dict keys -----------------------------------------------------------------------------------


def test_non_string_keys_become_their_json_text() -> None:
    value = {1: "int", 2.5: "float", False: "bool", None: "none", Level.HIGH: "enum", "s": "str"}
    assert canonical_json(value) == (
        '{"1":"int","2.5":"float","3":"enum","false":"bool","null":"none","s":"str"}'
    )
    assert canonical_json({1.0: "a", 1e16: "b", -0.0: "c"}) == '{"-0.0":"c","1.0":"a","1e+16":"b"}'
    assert canonical_json({Size.SMALL: 1, Colour.RED: 2}) == '{"red":2,"s":1}'
    assert canonical_json({2**64: 1, -(2**70): 2}) == (
        '{"-1180591620717411303424":2,"18446744073709551616":1}'
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({1: "a", "1": "b"}, "collide as '1'"),
        ({None: 1, "null": 2}, "collide as 'null'"),
        ({float("nan"): 1, None: 2}, "collide as 'null'"),
        ({True: 1, "true": 2}, "collide as 'true'"),
        ({(1, 2): 3}, "dict key of type tuple"),
        ({Colour.PAIR: 1}, "dict key of type tuple"),
        ({b"k": 1}, "dict key of type bytes"),
        ({datetime.date(2024, 1, 1): 1}, "dict key of type date"),
        ({"ok": {frozenset(): 1}}, "dict key of type frozenset"),
    ],
)
def test_unencodable_keys_are_unserialisable(value: Any, message: str) -> None:
    with pytest.raises(UnserialisableError, match=message):
        canonical_json(value)


# --- lone surrogates -----------------------------------------------------------------------------


def test_lone_surrogates_become_replacement_characters() -> None:
    assert canonical_json("a\ud800b") == '"a\ufffdb"'
    assert canonical_json({"k\udfff": ["\udc00", "ok"]}) == '{"k\ufffd":["\ufffd","ok"]}'
    assert canonical_json({"\ud83d": 1, "x": {"\ud800"}}) == '{"x":["\ufffd"],"\ufffd":1}'
    # a proper pair is one character and stays
    assert canonical_json("\U0001f600") == '"\U0001f600"'


def test_keys_colliding_after_surrogate_replacement_are_unserialisable() -> None:
    with pytest.raises(UnserialisableError, match="collide"):
        canonical_json({chr(0xD800): 1, "\ufffd": 2})


# --- unknown objects and depth -------------------------------------------------------------------


class Opaque:
    pass


@pytest.mark.parametrize(
    "value",
    [
        Opaque(),
        {"deep": [{"x": Opaque()}]},
        {Opaque()},
        complex(1, 2),
        datetime.timedelta(seconds=1),
        lambda: None,
        object,
        ...,
    ],
)
def test_unknown_objects_are_unserialisable(value: Any) -> None:
    with pytest.raises(UnserialisableError):
        canonical_json(value)


def test_unserialisable_error_names_the_type_and_marker_is_canonical() -> None:
    with pytest.raises(UnserialisableError) as info:
        canonical_json({"a": [Opaque()]})
    name = f"{__name__}.Opaque"
    assert str(info.value) == name
    marker = unserialisable_marker(Opaque(), "no encoding")
    assert canonical_json(marker) == f'{{"$unserialisable":"{name}: no encoding"}}'
    assert UNSERIALISABLE_MARKER == "$unserialisable"


def _nested_lists(levels: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("leaf", [1, 2**70, "\ud800"])  # fast path, and both slow-path triggers
def test_nesting_limit_is_the_same_on_both_paths(leaf: Any) -> None:
    assert canonical_json(_nested_lists(MAX_DEPTH, leaf)).startswith("[" * MAX_DEPTH)
    with pytest.raises(UnserialisableError, match=f"nesting deeper than {MAX_DEPTH} levels"):
        canonical_json(_nested_lists(MAX_DEPTH + 1, leaf))


def test_deep_nesting_of_every_container_kind_is_a_defined_error() -> None:
    @dataclasses.dataclass
    class Node:
        child: Any

    deep_dict: Any = 1
    deep_set: Any = frozenset()
    deep_node: Any = None
    for _ in range(5000):
        deep_dict = {"a": deep_dict}
        deep_set = frozenset({deep_set})
        deep_node = Node(deep_node)
    for value in (deep_dict, deep_set, deep_node, _nested_lists(100_000, 0)):
        with pytest.raises(UnserialisableError, match="nesting deeper"):
            canonical_json(value)


def test_self_referencing_containers_are_a_defined_error() -> None:
    loop: list[Any] = []
    loop.append(loop)
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    for value in (loop, cycle):
        with pytest.raises(UnserialisableError, match="nesting deeper"):
            canonical_json(value)


# --- fingerprints --------------------------------------------------------------------------------


def test_fingerprint_is_sha256_of_the_canonical_bytes() -> None:
    value = {"b": [1, 2.5], "a": "é"}
    expected = hashlib.sha256('{"a":"é","b":[1,2.5]}'.encode()).hexdigest()
    assert fingerprint(value) == expected
    assert sha256_hex(canonical_json(value)) == expected
    assert fingerprint({}) == "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


def test_fingerprint_ignores_dict_insertion_order_and_set_order() -> None:
    a = {"x": 1, "y": {"p": [1, 2], "q": {"m", "n"}}}
    b = {"y": {"q": {"n", "m"}, "p": [1, 2]}, "x": 1}
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a) == fingerprint(json.loads(canonical_json(a)))
    # but list order, int/float and key case matter
    assert fingerprint([1, 2]) != fingerprint([2, 1])
    assert fingerprint(1) != fingerprint(1.0)
    assert fingerprint({"A": 1}) != fingerprint({"a": 1})


def test_fingerprint_is_stable_across_calls_and_equal_values() -> None:
    value = Outer("n", Inner(1, b"z"), datetime.date(2020, 1, 1))
    assert {fingerprint(value) for _ in range(5)} == {
        fingerprint(Outer("n", Inner(1, b"z"), datetime.date(2020, 1, 1)))
    }


# --- round trip property -------------------------------------------------------------------------


def _random_string(rng: random.Random) -> str:
    alphabet = 'ab "\\/\n\t\x00\x7fé漢😀\u2028\ufeff{}[]:,'
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, -1, 2**53 + 1, 2**64 + 5, -(2**80), rng.randint(-(10**6), 10**6)])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1e-7, 1e16, 1e300, 5e-324, 0.1 + 0.2, rng.uniform(-1e9, 1e9)])
    if kind in (4, 5):
        return _random_string(rng)
    if kind in (6, 7):
        return {_random_string(rng): _random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]


def test_canonical_form_is_a_fixed_point_of_parsing() -> None:
    rng = random.Random(20240601)
    for _ in range(3000):
        value = _random_json(rng)
        text = canonical_json(value)
        assert canonical_json(json.loads(text)) == text
        assert json.loads(text) == value


def test_loads_keeps_integers_of_any_size_exact() -> None:
    """orjson reads integers beyond 64 bits as floats; `loads` keeps them exact, and keeps the
    fast parser for 19-digit nanosecond timestamps."""
    from stepfork_otel.trace.canonical import loads

    values = [1795950506266387897, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30, 1.5, "x" * 30]
    assert loads(canonical_json(values)) == values
    assert all(
        type(a) is type(b) for a, b in zip(loads(canonical_json(values)), values, strict=True)
    )
    assert loads('{"digits": "123456789012345678901234"}') == {"digits": "123456789012345678901234"}


def test_loads_refuses_what_is_not_json_on_both_parsers() -> None:
    # a text with a long run of digits or dashes goes to the exact (standard library) parser,
    # which would read NaN and Infinity; neither parser may
    for constant in ("NaN", "Infinity", "-Infinity"):
        for text in (f"[{constant}]", f'["{"-" * 20}", {constant}]', f"[{10**25}, {constant}]"):
            with pytest.raises(ValueError):  # orjson.JSONDecodeError is a ValueError
                loads(text)
    assert loads(f'["{"-" * 20}", {10**25}]') == ["-" * 20, 10**25]


def test_loads_refuses_numbers_out_of_range_on_both_parsers() -> None:
    for text in ("[1e400]", f'["{"-" * 20}", 1e400]', f'["{"-" * 20}", -1e400]'):
        with pytest.raises(ValueError):
            loads(text)
