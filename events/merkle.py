"""Merkle roots over event hashes, for checkpoints that pin a stretch of the log."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

CHECKPOINT_STREAM = "checkpoint"
CHECKPOINT_EVENT = "LogCheckpointed"


def merkle_root(leaf_hashes: Sequence[str]) -> str:
    """The root of a binary Merkle tree over hex leaf hashes (an odd node is paired with itself).

    Leaves and inner nodes are domain-separated, so a leaf can never pose as an inner node.
    """
    if not leaf_hashes:
        return hashlib.sha256(b"empty").hexdigest()
    level = [hashlib.sha256(b"\x00" + bytes.fromhex(h)).digest() for h in leaf_hashes]
    while len(level) > 1:
        if len(level) % 2:
            level.append(level[-1])
        level = [hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest()
                 for i in range(0, len(level), 2)]
    return level[0].hex()
