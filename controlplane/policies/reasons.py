"""The vocabulary every policy decision shares: reasons, typed input errors, plain output."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from math import isfinite
from typing import Any


@dataclass(frozen=True)
class Reason:
    """Why a decision came out as it did.

    `code` is a stable snake_case identifier that tests and automation match on; `message` is
    for people and may change; `facts` are the JSON-safe numbers and names that decided it.
    """

    code: str
    message: str
    facts: Mapping[str, Any] = field(default_factory=dict)


class PolicyInputError(ValueError):
    """An input a policy cannot decide on; `code` is stable and `field` names the bad input."""

    def __init__(self, code: str, field: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.field = field
        self.message = message

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "field": self.field, "message": self.message}


def require(condition: bool, code: str, field: str, message: str) -> None:
    """Raise `PolicyInputError(code, field, message)` unless `condition` holds."""
    if not condition:
        raise PolicyInputError(code, field, message)


_SCALARS = frozenset((str, int, bool, type(None)))
# Each dataclass's field names, looked up once per class rather than once per value.
_FIELDS: dict[type, tuple[str, ...]] = {}


def to_plain(value: Any) -> Any:
    """Convert a decision (dataclasses, enums, tuples, mappings) to JSON-safe plain data.

    Guarantee: the result contains only dict, list, str, int, float, bool and None, and never a
    NaN or an infinity (a non-finite float raises ValueError instead of leaking into the log).
    """
    kind = type(value)
    if kind in _SCALARS:  # exact types only: an enum member's type is its enum
        return value
    # A container is copied whole, then only its items that are not scalars (a finite float is
    # one) are converted, each by a call: most of a decision's leaves are scalars.
    if kind is dict:
        plain = dict(value)
        for key, item in value.items():
            if type(key) is not str:
                return {str(key): to_plain(item) for key, item in value.items()}
            if type(item) not in _SCALARS and not (type(item) is float and isfinite(item)):
                plain[key] = to_plain(item)
        return plain
    if kind is list or kind is tuple:
        return [item if type(item) in _SCALARS or type(item) is float and isfinite(item)
                else to_plain(item) for item in value]
    if kind is float:
        if not isfinite(value):
            raise ValueError(f"non-finite number {value!r} in a decision")
        return value
    fields = _FIELDS.get(kind)
    if fields is None and hasattr(kind, "__dataclass_fields__") and not isinstance(value, type):
        fields = _FIELDS[kind] = tuple(kind.__dataclass_fields__)
    if fields is not None:
        # Its fields' dict is built plain as it is filled: it is fresh, so it need not be built
        # and then copied by the dict path above (a decision's reasons come this way).
        plain = {}
        for name in fields:
            item = getattr(value, name)
            plain[name] = item if type(item) in _SCALARS or type(item) is float and isfinite(item) \
                else to_plain(item)
        return plain
    return _to_plain_other(value)


def _to_plain_other(value: Any) -> Any:
    """The rarer kinds: enums, other mappings and sequences, sets, subclassed scalars."""
    if isinstance(value, Enum):
        return to_plain(value.value)
    if isinstance(value, Mapping):
        return {str(key): to_plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(item) for item in value]
    if isinstance(value, (frozenset, set)):
        return sorted((to_plain(item) for item in value), key=repr)
    if isinstance(value, float):
        return to_plain(float(value))
    if isinstance(value, (str, int)):
        return value
    raise TypeError(f"{type(value).__name__} is not plain decision data")
