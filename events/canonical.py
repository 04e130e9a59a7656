"""Canonical JSON and the hash chain: the one serialisation the log hashes and stores.

Canonical JSON is plain data (dict with str keys, list, str, int, float, bool, None) with keys
sorted, no whitespace, UTF-8 text, and never a NaN or an infinity. It is rendered by orjson and
checked: the text is decoded again and must equal the value, which refuses NaN (orjson would
write `null`) and anything that is not plain data. A value that is not plain but that the
standard library would serialise (tuples, int keys) is first made plain through `json`, so
equal plain values always give the same text. Integers beyond 64 bits, which orjson does not
write, keep the standard library's text. Producing the text and the decoded value together
(`encode`) spares the appender decoding what it has just written.

A `Plain` dict is one its producer vouches for (a decision record built from `to_plain`
output): it is rendered without being decoded and compared again, and its reader's value is a
copy of it. Anything orjson cannot write in it (an integer beyond 64 bits) still takes the
checked path.

Stored text is read back by `decode`: orjson when re-encoding its result gives the very text
back (which proves it read what the standard library reads), else the standard library.

The hashed envelope header's text must never change (verifying a stored log recomputes it): it
is the standard library's sorted compact JSON. orjson writes the very same bytes for its values
(str, int, None; every Unicode character is escaped alike, which a test checks code point by
code point), so it renders them, and the standard library takes anything else.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson

GENESIS_HASH = "0" * 64
# One encoder for every call: `json.dumps` with options builds a new one each time.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                            allow_nan=False)
_SORTED = orjson.OPT_SORT_KEYS
# Dataclasses and datetimes are not JSON: orjson must refuse them as the standard library does
# (else one whose `==` matches its rendering would pass the check below).
_OPTIONS = _SORTED | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
_HEADER_TYPES = frozenset((str, int, type(None)))


class Plain(dict[str, Any]):
    """A dict its producer guarantees is plain JSON data, so `encode` need not check it.

    Plain means what `controlplane.policies.reasons.to_plain` returns: str keys, only dict,
    list, str, int, float, bool and None inside, no NaN or infinity, and containers that
    nothing else holds (so nothing changes them after the event is built). The value the
    appender keeps is equal to what a reader decodes, but its dicts keep the producer's key
    order (the text's keys are sorted; JSON objects have no order).
    """

    __slots__ = ()


def _rendered(value: Any) -> tuple[str, Any] | None:
    """orjson's text of `value` and its decoding, if that decodes back to an equal value."""
    try:
        raw = orjson.dumps(value, option=_OPTIONS)
    except (TypeError, orjson.JSONEncodeError):
        return None
    decoded = orjson.loads(raw)
    return (raw.decode("utf-8"), decoded) if decoded == value else None


def encode(value: Any) -> tuple[str, Any]:
    """`value`'s canonical text and the plain value a reader decodes from it.

    Raises ValueError for NaN or infinity and TypeError for what JSON cannot hold, as
    `json.dumps` does.
    """
    if type(value) is Plain:
        try:
            return orjson.dumps(value, option=_OPTIONS).decode("utf-8"), dict(value)
        except (TypeError, orjson.JSONEncodeError):  # a huge integer, a dataclass: checked
            pass
    rendered = _rendered(value)
    if rendered is not None:
        return rendered
    text = _ENCODER.encode(value)  # refuses what is not JSON, names why
    plain = json.loads(text)
    return _rendered(plain) or (text, plain)


def decode(text: str) -> Any:
    """The value stored canonical `text` holds, exactly as `json.loads` reads it.

    orjson decodes it (two to three times faster) when re-encoding its result gives back the
    very same text, which proves it read what the standard library would: where the two
    differ (an integer beyond 64 bits, which orjson reads as a float; NaN; a lone surrogate;
    text written before orjson rendered the log, or not canonical), the re-encoding differs or
    orjson refuses, and the standard library decodes it.
    """
    if type(text) is not str:  # bytes from a hand-edited row: the standard library's reading
        return json.loads(text)
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
    try:
        if orjson.dumps(value, option=_SORTED) == text.encode("utf-8"):
            return value
    except orjson.JSONEncodeError:  # nested deeper than orjson writes
        pass
    return json.loads(text)


def canonical_json(value: Any) -> str:
    """Serialise `value` with sorted keys, no spaces and UTF-8 text; NaN and infinity are refused."""
    return encode(value)[0]


def digest(value: Any) -> str:
    """The sha256 hex digest of `value`'s canonical JSON."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def header_json(header: dict[str, Any]) -> bytes:
    """The envelope header as the standard library's sorted compact JSON, in UTF-8."""
    if _HEADER_TYPES.issuperset(map(type, header.values())):
        try:
            return orjson.dumps(header, option=_SORTED)
        except orjson.JSONEncodeError:  # an int beyond 64 bits, a lone surrogate
            pass
    return _ENCODER.encode(header).encode("utf-8")


def chain_hash(prev_hash: str, header: dict[str, Any], data_json: str) -> str:
    """`sha256(prev_hash || header_json || "\\n" || data_json)` as hex.

    The header is every envelope field but `data`, `prev_hash` and `hash` (`header_json`);
    `data_json` is the canonical text stored in the row, so verification hashes exactly the
    bytes that were stored.
    """
    hasher = hashlib.sha256(prev_hash.encode("ascii"))
    hasher.update(header_json(header))
    hasher.update(b"\n")
    hasher.update(data_json.encode("utf-8"))
    return hasher.hexdigest()
