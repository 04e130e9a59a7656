"""Projection snapshots compared as they are stored: by canonical JSON, so 1, 1.0 and true differ."""

from __future__ import annotations

from typing import Any

from events.canonical import canonical_json


def comparable_json(value: Any) -> str:
    """`value`'s canonical JSON, by which replay compares what is stored: 1, 1.0 and true differ,
    as their stored texts do. A value that has none (a NaN read from a hand-edited row) is
    compared by its repr, unequal to any canonical text."""
    try:
        return canonical_json(value)
    except (TypeError, ValueError):
        return f"not JSON: {value!r}"


def key_differs(left: dict[str, Any], right: dict[str, Any], key: str) -> bool:
    """Whether `key` is in only one of the two, or their values' canonical JSON differs."""
    if (key in left) != (key in right):
        return True
    return key in left and comparable_json(left[key]) != comparable_json(right[key])


def diff_tables(live: dict[str, dict[str, Any]], rebuilt: dict[str, dict[str, Any]],
                limit: int | None = 20) -> list[dict[str, Any]]:
    """Rows that differ between two projection snapshots (as canonical JSON), at most `limit`
    (every one when None: the entries refer to the snapshots' rows, they copy none)."""
    differences = []
    for name in sorted(set(live) | set(rebuilt)):
        left, right = live.get(name, {}), rebuilt.get(name, {})
        for key in sorted(set(left) | set(right)):
            if key_differs(left, right, key):
                differences.append({"projection": name, "key": key, "live": left.get(key),
                                    "rebuilt": right.get(key)})
                if limit is not None and len(differences) >= limit:
                    return differences
    return differences
