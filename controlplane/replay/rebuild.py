"""Replay's rebuild in place: the live projections dropped and written again from the log,
atomically, and the rebuild recorded in the log with what it repaired."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from controlplane.replay.diff import diff_tables
from controlplane.replay.fold import ProgressFn
from controlplane.state.fold import apply_event
from events.model import NewEvent, StreamAppend, derived_event_id
from events.projections import MemoryProjections, drop_all, load_all
from events.store import EventStore

PROJECTIONS_REBUILT = "ProjectionsRebuilt"
MAINTENANCE_STREAM = "maintenance/projections"


@dataclass(frozen=True)
class Rebuilt:
    """What `rebuild_live` did: events folded, how many live rows differed from the fold before
    they were rewritten, and the first 20 of them (as `diff_tables` lists them)."""

    events_folded: int
    differences_repaired: int
    differences: list[dict[str, Any]]


def rebuild_live(store: EventStore, progress: ProgressFn | None = None) -> Rebuilt:
    """Drop the live projections and write them again from the log (`progress` is told how many
    events were folded, every 10,000).

    The fold runs in memory under the append lock and only its final rows are written, in the
    same transaction, so nobody sees a half-built state and the write buffer holds the bounded
    state rather than every row the log ever touched. The live rows are compared with the fold
    first: a rebuild repairs a state that was wrong, and says so, rather than hiding it. The
    rebuild is recorded in the log (`ProjectionsRebuilt`, which folds to nothing, with how many
    rows it repaired): the head moves, so every process that keeps projection rows cached for
    the old head reads them again.
    """
    with store.transaction() as tx:
        live = load_all(tx.connection, unreadable_as_text=True)
        drop_all(tx.connection)
        state = MemoryProjections()
        count = 0
        for event in store.read_all(to_position=tx.head_position):
            apply_event(state, event)
            count += 1
            if progress is not None and count % 10_000 == 0:
                progress(count)
        differences = diff_tables(live, state.snapshot(), limit=None)
        repaired, differences = len(differences), differences[:20]
        del live
        for name, rows in state.tables.items():
            for key, value in rows.items():
                tx.projections.put(name, key, value)
        through = tx.head_position
        tx.append([StreamAppend(MAINTENANCE_STREAM, None, [NewEvent(
            event_id=derived_event_id("projections-rebuilt", str(through)),
            event_type=PROJECTIONS_REBUILT,
            data={"events_folded": count, "through_position": through,
                  "differences_repaired": repaired},
            occurred_at=datetime.now(UTC).isoformat(timespec="microseconds"),
            actor="operator", tenant="system")])])
    return Rebuilt(count, repaired, differences)
