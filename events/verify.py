"""Hash-chain verification: find the first position where the stored log was tampered with."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import NoResultFound

from events.canonical import GENESIS_HASH, chain_hash
from events.merkle import CHECKPOINT_EVENT, CHECKPOINT_STREAM, merkle_root
from events.rows import header_of
from events.store import EventStore

# The types an append stores in a row's hashed fields; a row holding another (a BLOB, a REAL)
# was written by hand, and is not what was hashed.
_STORED_TYPES = frozenset((str, int, type(None)))


@dataclass(frozen=True)
class ChainReport:
    """`ok` when every row chains; otherwise the first bad position and what is wrong there.

    `head_hash` is the hash the head row claims: kept outside the database with its position,
    it is an anchor a later verification holds the log to (`verify_chain`'s `anchor`).
    """

    ok: bool
    events_checked: int
    head_position: int
    first_bad_position: int | None = None
    problem: str | None = None
    detail: str | None = None
    head_hash: str | None = None


# The largest position a log stores (a signed 64-bit column).
MAX_POSITION = 2**63 - 1
_ASCII_DIGITS = frozenset("0123456789")


def parse_anchor(text: str) -> tuple[int, str]:
    """`POSITION:HASH` as printed by `fleetctl verify` (`head`); ValueError naming the problem.

    The position is ASCII digits, 1 to MAX_POSITION (`str.isdecimal` also takes other scripts'
    digits, which no log prints)."""
    position, _, digest = text.strip().partition(":")
    if not position or not set(position) <= _ASCII_DIGITS \
            or not 1 <= int(position) <= MAX_POSITION:
        raise ValueError(f"anchor {text!r}: expected POSITION:HASH with a position from 1 to "
                         f"{MAX_POSITION}")
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"anchor {text!r}: the hash must be 64 lowercase hexadecimal digits")
    return int(position), digest


def verify_chain(rows: Iterable[dict[str, Any]], head: tuple[int, str],
                 anchor: tuple[int, str] | None = None) -> ChainReport:
    """Check positions run 1, 2, 3… without gaps, each row's hash and its link to the previous.

    With an `anchor` (a position and the hash its row had, kept outside the database), the row
    there must still carry that hash (`anchor_mismatch`): the chain then proves every row up to
    it unedited, even by someone who rewrote the rest of the chain, its checkpoints and head.

    Checkpoint rows must carry the log size before them and the Merkle root of every event
    hash since the previous checkpoint (`checkpoint_mismatch` otherwise).
    Problems: `position_gap` (a row deleted, or one inserted with a new position: one at 0 or
    below is named at its own position), `broken_link` (prev_hash differs from the previous
    row's hash: deleted, inserted or reordered rows), `hash_mismatch` (the row's content was
    edited, or a field stored as a type no append writes), `head_mismatch` (rows removed from
    the end or added past the head, or the head row edited).
    """
    expected_position, prev_hash, checked = 1, GENESIS_HASH, 0
    leaves: list[str] = []

    def broken(position: int, problem: str, detail: str) -> ChainReport:
        return ChainReport(False, checked, head[0], position, problem, detail, head[1])

    for row in rows:
        position = row["position"]
        if position != expected_position:
            before = type(position) is int and position < expected_position
            return broken(position if before else expected_position, "position_gap",
                          f"expected position {expected_position}, found {position}")
        if row["prev_hash"] != prev_hash:
            return broken(position, "broken_link", "prev_hash does not match the previous row's hash")
        header = header_of(row)
        misstored = _misstored_field(header, row["data"])
        if misstored is not None:
            return broken(position, "hash_mismatch", misstored)
        recomputed = chain_hash(prev_hash, header, row["data"])
        if recomputed != row["hash"]:
            return broken(position, "hash_mismatch", "the row's content does not match its hash")
        if row["event_type"] == CHECKPOINT_EVENT and row["stream_id"] == CHECKPOINT_STREAM:
            claim = _checkpoint_claim(row["data"])
            if claim.get("log_size") != position - 1 or claim.get("merkle_root") != merkle_root(leaves):
                return broken(position, "checkpoint_mismatch",
                              "the checkpoint's size or Merkle root disagrees with the log")
            leaves = []
        else:
            leaves.append(row["hash"])
        if anchor is not None and position == anchor[0] and row["hash"] != anchor[1]:
            return broken(position, "anchor_mismatch",
                          "the row's hash differs from the anchor kept for it: the log up to "
                          "here was rewritten")
        prev_hash = row["hash"]
        expected_position += 1
        checked += 1
    last_position = expected_position - 1
    if last_position == head[0] and prev_hash != head[1]:
        return broken(last_position, "head_mismatch",
                      f"the head's hash is not that of the last row, {last_position}: the head "
                      "row was edited")
    if last_position != head[0]:
        # The first row missing from the end, or the first past the head.
        return broken(min(last_position, head[0]) + 1, "head_mismatch",
                      f"the log ends at {last_position} but its head says {head[0]}")
    if anchor is not None and last_position < anchor[0]:
        return broken(last_position + 1, "anchor_mismatch",
                      f"the log ends at {last_position}, before the anchor's position {anchor[0]}: "
                      "rows were removed")
    return ChainReport(True, checked, head[0], head_hash=head[1])


def _checkpoint_claim(data: str) -> dict[str, Any]:
    """What a checkpoint row claims: its data's object, or none (so no claim matches) when the
    data is not a JSON object, as no checkpoint is written."""
    try:
        claim = json.loads(data)
    except ValueError:
        return {}
    return claim if isinstance(claim, dict) else {}


def _misstored_field(header: dict[str, Any], data: Any) -> str | None:
    """Which hashed field is stored as a type no append writes (data as anything but text),
    if one is: its value cannot be what was hashed."""
    for name, value in (*header.items(), ("data", data)):
        if type(value) not in _STORED_TYPES or (name == "data" and type(value) is not str):
            return f"{name} is stored as {type(value).__name__}, a type no append writes"
    return None


def verify_log(store: EventStore, anchor: tuple[int, str] | None = None) -> ChainReport:
    """Verify the stored log as one commit left it (`EventStore.snapshot`): every row, whatever
    its position, against the head read with them, so that rows appended meanwhile are neither
    a false break nor a place for a forged row (at 0 or below, or past the head) to hide; and
    against `anchor` if given (see `verify_chain`)."""
    with store.snapshot() as connection:
        try:
            head = store.head(connection)
        except NoResultFound:  # the head row deleted: tampering, not a database failure
            return ChainReport(False, 0, 0, 0, "head_mismatch", "the log's head row is missing")
        return verify_chain(store.read_stored(connection), head, anchor)
