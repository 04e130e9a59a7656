"""The log's encodings: canonical JSON, the hashed header text, derived event ids.

The fast paths (orjson, a hand-built UUIDv5) must agree with the definitions they replace.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.canonical import Plain, canonical_json, decode, digest, encode, header_json
from events.model import EVENT_NAMESPACE, derived_event_id

plain_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text()
                 | st.floats(allow_nan=False, allow_infinity=False))
plain_values = st.recursive(plain_scalars, lambda inner: st.lists(inner, max_size=4)
                            | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20)


def _sorted_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    assert keys == sorted(keys)
    return dict(pairs)


@given(plain_values)
def test_canonical_text_decodes_to_the_value_with_sorted_keys(value: Any) -> None:
    text, decoded = encode(value)
    assert json.loads(text, object_pairs_hook=_sorted_pairs) == value == decoded
    assert canonical_json(decoded) == text  # the decoded value gives the same text again


def _with_tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_with_tuples(item) for item in value)
    if isinstance(value, dict):
        return {key: _with_tuples(item) for key, item in value.items()}
    return value


@given(plain_values)
def test_same_plain_value_gives_the_same_text_however_it_is_built(value: Any) -> None:
    assert canonical_json(_with_tuples(value)) == canonical_json(value)
    assert canonical_json((value, 1e-05)) == canonical_json([value, 1e-05])


def test_int_keys_and_tuples_are_written_as_plain_json() -> None:
    assert canonical_json({2: (1, 2), 10: "x"}) == '{"10":"x","2":[1,2]}'
    assert encode({2: (1, 2)})[1] == {"2": [1, 2]}


def test_integers_beyond_64_bits_keep_their_exact_value() -> None:
    big = {"n": 2**80, "m": -(2**70)}
    text, decoded = encode(big)
    assert text == '{"m":-1180591620717411303424,"n":1208925819614629174706176}'
    assert decoded == big


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("shape", [lambda x: x, lambda x: [1, x], lambda x: {"a": {"b": [x]}},
                                   lambda x: ({"a": x},)])
def test_nan_and_infinity_are_refused_wherever_they_hide(bad: float, shape: Any) -> None:
    with pytest.raises(ValueError):
        canonical_json(shape(bad))


class Colour(Enum):
    RED = "red"


@dataclass
class Point:
    x: int


@pytest.mark.parametrize("value", [Point(1), datetime(2026, 1, 1, tzinfo=UTC), {1, 2}, Colour.RED,
                                   {"nested": [Point(1)]}, object()])
def test_values_that_are_not_json_are_refused(value: Any) -> None:
    with pytest.raises(TypeError):
        canonical_json(value)


def test_a_lone_surrogate_never_reaches_the_log() -> None:
    with pytest.raises(UnicodeEncodeError):
        digest({"text": "\ud800"})


def test_header_text_is_the_standard_library_text_for_every_character() -> None:
    characters = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for start in range(0, len(characters), 4096):
        chunk = characters[start:start + 4096]
        header = {f"k{i:05d}": c for i, c in enumerate(chunk)}
        assert header_json(header) == json.dumps(
            header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


headers = st.dictionaries(st.text(min_size=1, max_size=20),
                          st.none() | st.text() | st.integers() | st.booleans()
                          | st.floats(allow_nan=False, allow_infinity=False), max_size=14)


@given(headers)
def test_header_text_never_changes_whatever_the_values(header: dict[str, Any]) -> None:
    assert header_json(header) == json.dumps(
        header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@given(st.text(), st.text())
def test_derived_event_ids_are_uuid5_of_command_and_slot(command_id: str, slot: str) -> None:
    assert derived_event_id(command_id, slot) == str(uuid.uuid5(EVENT_NAMESPACE,
                                                                f"{command_id}/{slot}"))


@dataclass(eq=False)
class EqualToItsFields:
    x: int

    def __eq__(self, other: object) -> bool:
        return other == {"x": self.x} or (isinstance(other, EqualToItsFields) and other.x == self.x)


def test_a_dataclass_equal_to_its_fields_is_still_refused() -> None:
    with pytest.raises(TypeError):
        canonical_json({"value": EqualToItsFields(1)})


@given(st.dictionaries(st.text(), plain_values, max_size=6))
def test_a_plain_record_is_stored_as_the_checked_path_would_store_it(value: dict[str, Any]) -> None:
    text, decoded = encode(Plain(value))
    assert (text, decoded) == encode(value)
    assert type(decoded) is dict  # the reader's value, not the producer's marker


def test_a_plain_record_with_a_huge_integer_takes_the_checked_path() -> None:
    assert encode(Plain({"n": 2**80})) == ('{"n":1208925819614629174706176}', {"n": 2**80})


def test_a_plain_record_holding_something_that_is_not_json_is_still_refused() -> None:
    with pytest.raises(TypeError):
        encode(Plain({"at": datetime(2026, 1, 1, tzinfo=UTC)}))


def _typed(value: Any) -> Any:
    """`value` with each number's type made visible (1 and 1.0 are equal in Python)."""
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_typed(item) for item in value]
    return (type(value).__name__, value)


wide_values = st.recursive(
    plain_scalars | st.integers(-(2**70), 2**70), lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20)


@given(wide_values)
def test_stored_text_decodes_exactly_as_the_standard_library_reads_it(value: Any) -> None:
    text = canonical_json(value)
    assert _typed(decode(text)) == _typed(json.loads(text))


@pytest.mark.parametrize("text", [
    "18446744073709551616", '{"a":[-9223372036854775809,1]}',  # orjson would read floats
    '{"x":1e-05}', '{"b":1,"a":2}', '{"a":1,"a":2}', '"\\ud800"', "NaN", '{"a":1e400}',
    '{"a": 1}', '"\\u00e9"', "[" * 300 + "]" * 300, '{"a":' * 300 + "1" + "}" * 300,
])
def test_text_orjson_would_read_otherwise_is_read_by_the_standard_library(text: str) -> None:
    assert _typed(decode(text)) == _typed(json.loads(text)) or (
        text == "NaN" and math.isnan(decode(text)))


def test_text_read_as_bytes_is_read_as_the_standard_library_reads_it() -> None:
    assert decode(b'{"a":1}') == json.loads(b'{"a":1}') == {"a": 1}  # type: ignore[arg-type]
