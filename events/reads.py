"""What a decision read, and whether it still holds: the check behind deciding in parallel.

A decider that decided on a snapshot of the log may append its decision at a later head only if
everything it read is the same there: then deciding at the later head reads the same values and
makes the same decision, so the decision is exactly re-derivable at the position it is appended
after. `RecordingView` notes the projection rows, whole projections and stream versions a
decider read; `reads_unchanged` compares them between the snapshot and the locked transaction,
by their stored text, which is canonical JSON (equal text, equal value).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Connection

from events.projections import StateView
from events.tables import events_table, projections_table

_ROWS = select(projections_table.c.name, projections_table.c.key, projections_table.c.data).where(
    projections_table.c.name == bindparam("row_name"),
    projections_table.c.key.in_(bindparam("row_keys", expanding=True)))
_TABLE = select(projections_table.c.key, projections_table.c.data).where(
    projections_table.c.name == bindparam("row_name"))
_VERSIONS = (select(events_table.c.stream_id, func.max(events_table.c.stream_version))
             .where(events_table.c.stream_id.in_(bindparam("stream_ids", expanding=True)))
             .group_by(events_table.c.stream_id))
CHUNK = 500


class RecordingView:
    """A state view that remembers every row, projection and stream version it was asked for."""

    def __init__(self, inner: StateView, stream_version: Callable[[str], int]) -> None:
        self.inner = inner
        self._stream_version = stream_version
        self.rows: dict[str, set[str]] = {}
        self.tables: set[str] = set()
        self.streams: set[str] = set()

    def get(self, name: str, key: str) -> dict[str, Any] | None:
        self.rows.setdefault(name, set()).add(key)
        return self.inner.get(name, key)

    def items(self, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
        self.tables.add(name)
        return self.inner.items(name)

    def view(self, name: str, view_id: Hashable, build: Callable[[], Any]) -> Any:
        """A table view depends on every row of `name` (see `events.projections.table_view`)."""
        from events.projections import table_view

        self.tables.add(name)
        return table_view(self.inner, name, view_id, build)

    def stream_version(self, stream_id: str) -> int:
        self.streams.add(stream_id)
        return self._stream_version(stream_id)


def reads_unchanged(before: Connection, after: Connection, reads: RecordingView) -> bool:
    """Whether every row, projection and stream version in `reads` is the same in both.

    `before` is the snapshot the decisions read (its own appends only buffered, never
    written); `after` holds the append lock at the current head.
    """
    for name in sorted(reads.tables):
        if _table(before, name) != _table(after, name):
            return False
    for name, keys in sorted(reads.rows.items()):
        if name in reads.tables:
            continue
        ordered = sorted(keys)
        for start in range(0, len(ordered), CHUNK):
            chunk = {"row_name": name, "row_keys": ordered[start:start + CHUNK]}
            if set(before.execute(_ROWS, chunk)) != set(after.execute(_ROWS, chunk)):
                return False
    streams = sorted(reads.streams)
    for start in range(0, len(streams), CHUNK):
        chunk = {"stream_ids": streams[start:start + CHUNK]}
        if set(before.execute(_VERSIONS, chunk)) != set(after.execute(_VERSIONS, chunk)):
            return False
    return True


def _table(connection: Connection, name: str) -> dict[str, str]:
    return {key: data for key, data in connection.execute(_TABLE, {"row_name": name})}
