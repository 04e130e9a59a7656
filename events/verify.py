"""Hash-chain verification: find the first position where the stored log was tampered with."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from events.canonical import GENESIS_HASH, chain_hash
from events.merkle import CHECKPOINT_EVENT, CHECKPOINT_STREAM, merkle_root
from events.rows import header_of


@dataclass(frozen=True)
class ChainReport:
    """`ok` when every row chains; otherwise the first bad position and what is wrong there."""

    ok: bool
    events_checked: int
    head_position: int
    first_bad_position: int | None = None
    problem: str | None = None
    detail: str | None = None


def verify_chain(rows: Iterable[dict[str, Any]], head: tuple[int, str]) -> ChainReport:
    """Check positions run 1, 2, 3… without gaps, each row's hash and its link to the previous.

    Checkpoint rows must carry the log size before them and the Merkle root of every event
    hash since the previous checkpoint (`checkpoint_mismatch` otherwise).
    Problems: `position_gap` (a row deleted, or one inserted with a new position),
    `broken_link` (prev_hash differs from the previous row's hash: deleted, inserted or
    reordered rows), `hash_mismatch` (the row's content was edited), `head_mismatch` (rows
    removed from the end, or the head row edited).
    """
    expected_position, prev_hash, checked = 1, GENESIS_HASH, 0
    leaves: list[str] = []
    for row in rows:
        position = row["position"]
        if position != expected_position:
            return ChainReport(False, checked, head[0], expected_position, "position_gap",
                               f"expected position {expected_position}, found {position}")
        if row["prev_hash"] != prev_hash:
            return ChainReport(False, checked, head[0], position, "broken_link",
                               "prev_hash does not match the previous row's hash")
        recomputed = chain_hash(prev_hash, header_of(row), row["data"])
        if recomputed != row["hash"]:
            return ChainReport(False, checked, head[0], position, "hash_mismatch",
                               "the row's content does not match its hash")
        if row["event_type"] == CHECKPOINT_EVENT and row["stream_id"] == CHECKPOINT_STREAM:
            claim = json.loads(row["data"])
            if claim.get("log_size") != position - 1 or claim.get("merkle_root") != merkle_root(leaves):
                return ChainReport(False, checked, head[0], position, "checkpoint_mismatch",
                                   "the checkpoint's size or Merkle root disagrees with the log")
            leaves = []
        else:
            leaves.append(row["hash"])
        prev_hash = row["hash"]
        expected_position += 1
        checked += 1
    last_position = expected_position - 1
    if (last_position, prev_hash) != head:
        return ChainReport(False, checked, head[0], last_position + 1, "head_mismatch",
                           f"the log ends at {last_position} but its head says {head[0]}")
    return ChainReport(True, checked, head[0])
