"""Projection storage: named key/value read models folded from the log.

Two implementations of one port: `SqlProjections` writes in the appending transaction (so
authoritative state moves with the decision that changed it), `MemoryProjections` serves replay,
`status --at` and re-derivation. Fold functions see only the port and cannot tell them apart.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Protocol

from sqlalchemy import bindparam, delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from events.canonical import canonical_json
from events.tables import projections_table

_DELETED = object()
_GET_ROW = select(projections_table.c.data).where(
    projections_table.c.name == bindparam("row_name"), projections_table.c.key == bindparam("row_key"))


class StateView(Protocol):
    """Read access to projections."""

    def get(self, name: str, key: str) -> dict[str, Any] | None: ...

    def items(self, name: str) -> Iterator[tuple[str, dict[str, Any]]]: ...


class StateStore(StateView, Protocol):
    """Read and write access to projections."""

    def put(self, name: str, key: str, value: dict[str, Any]) -> None: ...

    def delete(self, name: str, key: str) -> None: ...


class MemoryProjections:
    """Projections held in memory; `snapshot()` gives canonical plain data for comparisons."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, dict[str, Any]]] = {}

    def get(self, name: str, key: str) -> dict[str, Any] | None:
        return self.tables.get(name, {}).get(key)

    def items(self, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
        yield from sorted(self.tables.get(name, {}).items())

    def put(self, name: str, key: str, value: dict[str, Any]) -> None:
        self.tables.setdefault(name, {})[key] = value

    def delete(self, name: str, key: str) -> None:
        self.tables.get(name, {}).pop(key, None)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every non-empty table as `{name: {key: value}}`, keys sorted."""
        return {name: dict(sorted(rows.items()))
                for name, rows in sorted(self.tables.items()) if rows}


class SqlProjections:
    """Projections in the `projections` table, read-your-writes within one transaction.

    Writes are buffered and flushed in one statement batch before commit; the buffer belongs to
    the transaction, so nothing is written if it rolls back.
    """

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._pending: dict[tuple[str, str], Any] = {}
        self._read: dict[tuple[str, str], dict[str, Any] | None] = {}

    def get(self, name: str, key: str) -> dict[str, Any] | None:
        pending = self._pending.get((name, key))
        if pending is _DELETED:
            return None
        if pending is not None:
            return dict(pending)
        if (name, key) not in self._read:
            text = self.connection.execute(_GET_ROW, {"row_name": name, "row_key": key}).scalar()
            self._read[(name, key)] = json.loads(text) if text is not None else None
        value = self._read[(name, key)]
        return dict(value) if value is not None else None

    def items(self, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
        query = select(projections_table.c.key, projections_table.c.data).where(
            projections_table.c.name == name)
        stored = {row.key: json.loads(row.data) for row in self.connection.execute(query)}
        for (pending_name, key), value in self._pending.items():
            if pending_name != name:
                continue
            if value is _DELETED:
                stored.pop(key, None)
            else:
                stored[key] = value
        yield from sorted(stored.items())

    def put(self, name: str, key: str, value: dict[str, Any]) -> None:
        self._pending[(name, key)] = value

    def delete(self, name: str, key: str) -> None:
        self._pending[(name, key)] = _DELETED

    def flush(self) -> None:
        """Write the buffered changes; called by the transaction just before it commits."""
        if not self._pending:
            return
        deletes = [{"row_name": name, "row_key": key}
                   for (name, key), value in self._pending.items() if value is _DELETED]
        upserts = [{"name": name, "key": key, "data": canonical_json(value)}
                   for (name, key), value in self._pending.items() if value is not _DELETED]
        if deletes:
            self.connection.execute(delete(projections_table).where(
                projections_table.c.name == bindparam("row_name"),
                projections_table.c.key == bindparam("row_key")), deletes)
        if upserts:
            dialect = self.connection.dialect.name
            insert = pg_insert if dialect == "postgresql" else sqlite_insert
            statement = insert(projections_table)
            statement = statement.on_conflict_do_update(
                index_elements=["name", "key"], set_={"data": statement.excluded.data})
            self.connection.execute(statement, upserts)
        self._pending.clear()
        self._read.clear()


def load_all(connection: Connection) -> dict[str, dict[str, Any]]:
    """Every stored projection row as `{name: {key: value}}`, for comparing with a rebuild."""
    tables: dict[str, dict[str, Any]] = {}
    query = select(projections_table).order_by(projections_table.c.name, projections_table.c.key)
    for row in connection.execute(query):
        tables.setdefault(row.name, {})[row.key] = json.loads(row.data)
    return tables


def drop_all(connection: Connection) -> None:
    connection.execute(delete(projections_table))
