"""Canonical JSON and the hash chain: the one serialisation the log hashes and stores."""

from __future__ import annotations

import hashlib
import json
from typing import Any

GENESIS_HASH = "0" * 64


def canonical_json(value: Any) -> str:
    """Serialise `value` with sorted keys, no spaces and UTF-8 text; NaN and infinity are refused."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def digest(value: Any) -> str:
    """The sha256 hex digest of `value`'s canonical JSON."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def chain_hash(prev_hash: str, header: dict[str, Any], data_json: str) -> str:
    """`sha256(prev_hash || canonical(header) || "\\n" || canonical(data))` as hex.

    The header is every envelope field but `data`, `prev_hash` and `hash`; `data_json` is the
    canonical text stored in the row, so verification hashes exactly the bytes that were stored.
    """
    hasher = hashlib.sha256(prev_hash.encode("ascii"))
    hasher.update(canonical_json(header).encode("utf-8"))
    hasher.update(b"\n")
    hasher.update(data_json.encode("utf-8"))
    return hasher.hexdigest()
