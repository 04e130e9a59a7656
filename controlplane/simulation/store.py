"""The simulation's event store: the ordinary log, with reads answered from a mirror in memory.

A simulation owns its log alone (a fresh database nobody else writes while it runs), so what
the log's projections and stream versions hold can only change through this store's own
transactions. Every write takes the ordinary path (same appends, hash chain, projection rows,
inbox); only reads of projections and stream versions are served from a mirror that each
transaction updates after it commits, and rollbacks leave untouched. Deleted projection rows
are removed in one statement batch. A test proves the log it writes is the plain store's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, bindparam, delete, func, select
from sqlalchemy.engine import Connection

from events.model import StreamAppend
from events.projections import SqlProjections, load_all
from events.store import EventStore, LogTransaction
from events.tables import events_table, projections_table

Tables = dict[str, dict[str, str]]
_DELETED = None


class _MirroredProjections:
    """The projection port of one transaction: reads from the mirror, writes buffered."""

    def __init__(self, connection: Connection, inner: SqlProjections, tables: Tables) -> None:
        self.connection = connection
        self.inner = inner
        self.tables = tables
        self.overlay: dict[tuple[str, str], dict[str, Any] | None] = {}

    def get(self, name: str, key: str) -> dict[str, Any] | None:
        if (name, key) in self.overlay:
            value = self.overlay[(name, key)]
            return dict(value) if value is not None else None
        text = self.tables.get(name, {}).get(key)
        return json.loads(text) if text is not None else None

    def items(self, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
        rows: dict[str, dict[str, Any]] = {key: json.loads(text)
                                           for key, text in self.tables.get(name, {}).items()}
        for (table, key), value in self.overlay.items():
            if table != name:
                continue
            if value is None:
                rows.pop(key, None)
            else:
                rows[key] = value
        yield from sorted(rows.items())

    def put(self, name: str, key: str, value: dict[str, Any]) -> None:
        self.overlay[(name, key)] = value

    def delete(self, name: str, key: str) -> None:
        self.overlay[(name, key)] = _DELETED

    def flush(self) -> None:
        """Write the transaction's final rows: upserts through the ordinary port, deletes at once."""
        deleted = [{"row_name": name, "row_key": key}
                   for (name, key), value in self.overlay.items() if value is None]
        for (name, key), value in self.overlay.items():
            if value is not None:
                self.inner.put(name, key, value)
        self.inner.flush()
        if deleted:
            self.connection.execute(delete(projections_table).where(
                projections_table.c.name == bindparam("row_name"),
                projections_table.c.key == bindparam("row_key")), deleted)

    def commit(self) -> None:
        """Fold the committed transaction's rows into the mirror."""
        for (name, key), value in self.overlay.items():
            if value is None:
                self.tables.get(name, {}).pop(key, None)
            else:
                self.tables.setdefault(name, {})[key] = json.dumps(value)


class _MirroredVersions:
    """`stream_version` of one transaction: what it appended, else the mirror's."""

    def __init__(self, tx: LogTransaction, committed: dict[str, int]) -> None:
        # The append path records each stream's new version here as it goes, batch by batch.
        self.appended: dict[str, int] = tx._versions  # noqa: SLF001
        self.committed = committed

    def __call__(self, stream_id: str) -> int:
        version = self.appended.get(stream_id)
        return version if version is not None else self.committed.get(stream_id, 0)

    def commit(self) -> None:
        self.committed.update(self.appended)


class SimulationStore(EventStore):
    """An EventStore for a log this process alone writes; reads never leave memory."""

    def __init__(self, engine: Engine, checkpoint_every: int = 1_000) -> None:
        super().__init__(engine, checkpoint_every)
        with engine.connect() as conn:
            self._event_ids: set[str] = set(conn.execute(select(events_table.c.event_id)).scalars())
            self._tables: Tables = {name: {key: json.dumps(value) for key, value in rows.items()}
                                    for name, rows in load_all(conn).items()}
            query = select(events_table.c.stream_id, func.max(events_table.c.stream_version)) \
                .group_by(events_table.c.stream_id)
            self._versions: dict[str, int] = {row[0]: int(row[1]) for row in conn.execute(query)}

    @classmethod
    def of(cls, store: EventStore) -> SimulationStore:
        """The same log as `store`, same checkpoint cadence, its reads mirrored."""
        return cls(store.engine, store.checkpoint_every)

    @contextmanager
    def transaction(self) -> Iterator[LogTransaction]:
        """The ordinary write transaction, its reads served by the mirror."""
        with super().transaction() as tx:
            projections = _MirroredProjections(tx.connection, tx.projections, self._tables)
            versions = _MirroredVersions(tx, self._versions)
            # The transaction's read ports are replaced; its append path is untouched.
            tx.projections = projections  # type: ignore[assignment]
            setattr(tx, "stream_version", versions)  # noqa: B010
            setattr(tx, "_existing", self._existing_check(tx))  # noqa: B010
            yield tx
        projections.commit()
        versions.commit()
        self._event_ids.update(event.event_id for event in tx.appended)

    def _existing_check(self, tx: LogTransaction) -> Callable[[Sequence[StreamAppend]], Any]:
        """The append's duplicate check, asked of the log only when an id is already stored."""
        ordinary = LogTransaction._existing.__get__(tx)  # noqa: SLF001

        def existing(appends: Sequence[StreamAppend]) -> Any:
            known = self._event_ids
            if any(event.event_id in known for batch in appends for event in batch.events):
                return ordinary(appends)
            return None
        return existing
