"""Replay: the fleet state as of any position, and where the live projections differ from it.

Rebuilding folds stored facts and never calls a policy. Memory is flat in the log's length:
events are read in chunks and folded one at a time (`replay.fold`), and the projections
themselves are bounded (settled admission records are forgotten by the decisions that say so).

The rest of replay: `replay.rebuild` writes the live projections again from the log,
`replay.verify` re-derives recorded decisions (verify and what-if), `replay.boundaries` finds
where a decision's events begin and end, `replay.diff` compares stored values.
"""

from __future__ import annotations

from typing import Any

from controlplane.replay.diff import diff_tables
from controlplane.replay.fold import ProgressFn, fold
from controlplane.replay.verify import verify_decisions
from events.projections import MemoryProjections, load_all
from events.store import EventStore

# The package's entry points: state and comparison here, re-derivation from `replay.verify`.
__all__ = ["compare_with_live", "state_at", "verify_decisions"]


def state_at(store: EventStore, position: int | None = None,
             progress: ProgressFn | None = None) -> MemoryProjections:
    """The fleet state as of `position` (the whole log when None); `progress` is told the
    events folded, every 10,000."""
    return fold(store.read_all(to_position=position), progress)


def compare_with_live(store: EventStore, progress: ProgressFn | None = None) \
        -> list[dict[str, Any]]:
    """Rebuild every projection in memory and list where the live tables differ, both as of one
    head: the live rows are read with it (`EventStore.snapshot`), the log folded up to it, so
    what other processes append meanwhile is in neither. `progress` as for `state_at`."""
    with store.snapshot() as conn:
        head, _ = store.head(conn)
        live = load_all(conn, unreadable_as_text=True)
    return diff_tables(live, state_at(store, head, progress).snapshot())
