"""Projection storage: named key/value read models folded from the log.

Two implementations of one port: `SqlProjections` writes in the appending transaction (so
authoritative state moves with the decision that changed it), `MemoryProjections` serves replay,
`status --at` and re-derivation. Fold functions see only the port and cannot tell them apart.

A table view (`table_view`) is a structure derived from every row of one projection, such as
the placement GPU index: stores that support views build it once and tell it of every put and
delete, so it always equals a fresh build from the rows the store would return.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar

from sqlalchemy import delete, select
from sqlalchemy.engine import Connection

from events import driver
from events.canonical import canonical_json
from events.database import in_lists
from events.model import UnreadableRow
from events.projection_cache import ProjectionCache, cache_for, decode_row, forget
from events.tables import projections_table

_DELETED = object()
# Every decision reads and writes rows, so these run on the driver (`events.driver`).
_GET_ROWS = "SELECT key, data FROM projections WHERE name = ? AND key IN ({in})"
_TABLE_ROWS = "SELECT key, data FROM projections WHERE name = ?"
_DELETE_ROWS = "DELETE FROM projections WHERE name = ? AND key IN ({in})"
# The row writes, also used by the benchmark that times them (`bench/bulk_write_bench.py`).
PROJECTION_COLUMNS = ("name", "key", "data")
UPSERT_ROWS = ("INSERT INTO projections (name, key, data) VALUES (?, ?, ?)"
                " ON CONFLICT (name, key) DO UPDATE SET data = excluded.data")


class StateView(Protocol):
    """Read access to projections."""

    def get(self, name: str, key: str) -> dict[str, Any] | None: ...

    def items(self, name: str) -> Iterator[tuple[str, dict[str, Any]]]: ...


class StateStore(StateView, Protocol):
    """Read and write access to projections."""

    def put(self, name: str, key: str, value: dict[str, Any]) -> None: ...

    def delete(self, name: str, key: str) -> None: ...


class TableView(Protocol):
    """A structure derived from every row of one projection, told of each change to a row.

    `apply(key, None)` means the row is gone; the result may not depend on the order rows are
    applied in. A view copies what it keeps: the row it is given may be shared with the store.
    """

    def apply(self, key: str, value: dict[str, Any] | None) -> None: ...


V = TypeVar("V", bound=TableView)


def table_view(state: StateView, name: str, view_id: Hashable, build: Callable[[], V]) -> V:
    """The view `view_id` of projection `name`, equal to `build()` fed every row of `state`.

    A store with views keeps one per (name, view_id) and keeps it current; any other state
    gets a fresh one. `view_id` must name everything `build` depends on besides the rows.
    """
    views = getattr(state, "view", None)
    if views is not None:
        return views(name, view_id, build)  # type: ignore[no-any-return]
    return _built(state, name, build)


def _built(state: StateView, name: str, build: Callable[[], V]) -> V:
    view = build()
    for key, value in state.items(name):
        view.apply(key, value)
    return view


class MemoryProjections:
    """Projections held in memory; `snapshot()` gives canonical plain data for comparisons."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, dict[str, Any]]] = {}
        self._views: dict[str, dict[Hashable, TableView]] = {}

    # get, put and delete run for every event a replay folds: no throwaway dicts, no loop over
    # an empty mapping of views.
    def get(self, name: str, key: str) -> dict[str, Any] | None:
        table = self.tables.get(name)
        return table.get(key) if table is not None else None

    def items(self, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
        yield from sorted(self.tables.get(name, {}).items())

    def put(self, name: str, key: str, value: dict[str, Any]) -> None:
        table = self.tables.get(name)
        if table is None:
            table = self.tables[name] = {}
        table[key] = value
        views = self._views.get(name)
        if views:
            for view in views.values():
                view.apply(key, value)

    def delete(self, name: str, key: str) -> None:
        table = self.tables.get(name)
        if table is not None and table.pop(key, None) is not None:
            views = self._views.get(name)
            if views:
                for view in views.values():
                    view.apply(key, None)

    def view(self, name: str, view_id: Hashable, build: Callable[[], V]) -> V:
        """See `table_view`: built from the rows on first use, then kept current."""
        views = self._views.setdefault(name, {})
        if view_id not in views:
            views[view_id] = _built(self, name, build)
        return views[view_id]  # type: ignore[return-value]

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every non-empty table as `{name: {key: value}}`, keys sorted."""
        return {name: dict(sorted(rows.items()))
                for name, rows in sorted(self.tables.items()) if rows}


class SqlProjections:
    """Projections in the `projections` table, read-your-writes within one transaction.

    Writes are buffered and flushed in one statement batch before commit; the buffer belongs to
    the transaction, so nothing is written if it rolls back. Rows are decoded once and views
    built once per transaction (a `ProjectionCache` of its own). In a write transaction (one
    that holds the append lock) they come from the process's shared cache instead, current with
    the log head the transaction read, so they outlive one decision without ever serving state
    from before another process's append.
    """

    def __init__(self, connection: Connection, head: tuple[int, str] | None = None,
                 shared: bool = False) -> None:
        """`shared`: use the process's shared cache; only the one `LogTransaction` of a write
        transaction holding the append lock may, passing the log `head` (position, hash) it
        read under the lock, or the head it expects to read there (`EventStore._locked`, which
        drops the cache if the lock shows another); and, reading only, `EventStore.warm` before
        such a transaction, at the head it read before any row. Any other (a reader, or a
        second one on a writer's connection) has a cache of its own, so it can never rewind the
        shared one mid-transaction."""
        self.connection = connection
        self._pending: dict[tuple[str, str], Any] = {}
        self._shared = shared
        self._cache = cache_for(connection, head) if shared else ProjectionCache()

    def get(self, name: str, key: str) -> dict[str, Any] | None:
        value = self._cache.row(name, key, self)
        return dict(value) if value is not None else None

    def load_row(self, name: str, key: str) -> dict[str, Any] | None:
        """Row `key` of `name` as stored (for the cache, on a miss)."""
        return _decoded(name, driver.fetch(self.connection, _GET_ROWS, name,
                                           in_values=[key])).get(key)

    def prefetch(self, keys: Iterable[tuple[str, str]]) -> None:
        """Read the rows `keys` (name, key) names in one query per projection, ahead of `get`
        (on PostgreSQL all in one round trip).

        Only a speed-up: `get` returns exactly what it would have without it.
        """
        reads = driver.Reads()
        self.read_ahead(reads, keys)
        reads.run(self.connection)

    def read_ahead(self, reads: driver.Reads, keys: Iterable[tuple[str, str]]) -> None:
        """Add to `reads` the queries `prefetch` would run (for a caller with reads of its own)."""
        by_name: dict[str, list[str]] = {}
        for name, key in keys:
            if (name, key) not in self._pending:
                by_name.setdefault(name, []).append(key)
        for name, wanted in by_name.items():
            for chunk in in_lists(self._cache.missing(name, wanted, self)):
                reads.add(_GET_ROWS, name, in_values=chunk, then=partial(self._loaded, name, chunk))

    def _loaded(self, name: str, keys: Sequence[str], rows: list[driver.Row]) -> None:
        self._cache.loaded(name, keys, _decoded(name, rows))

    def stored_rows(self, name: str) -> dict[str, str]:
        """Every stored row of `name` as its text (for the cache)."""
        return dict(driver.fetch(self.connection, _TABLE_ROWS, name))

    def items(self, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
        table = self._cache.table(name, self)
        yield from sorted((key, dict(value)) for key, value in table.items())

    def view(self, name: str, view_id: Hashable, build: Callable[[], V]) -> V:
        """See `table_view`: built on first use from the rows, then kept current by every write."""
        return self._cache.view(  # type: ignore[return-value]
            name, view_id, lambda: _built(self, name, build), self)

    def put(self, name: str, key: str, value: dict[str, Any]) -> None:
        self._pending[(name, key)] = value
        self._cache.write(name, key, value, self)

    def delete(self, name: str, key: str) -> None:
        pending = (name, key)
        if self._pending.get(pending) is _DELETED:
            # Already deleted in this transaction, and the cache and views told: each event of
            # a decision settles its command (`apply_event`), but the first deletes the row.
            return
        self._pending[pending] = _DELETED
        self._cache.write(name, key, None, self)

    def settle(self, head: tuple[int, str] | None = None) -> None:
        """The buffered changes are written (`write_pending`, perhaps pipelined) and known to
        have succeeded: the shared cache now mirrors the log at `head`, the head the transaction
        leaves (read here when the caller does not have it)."""
        if self._shared:
            self._cache.settle(self.connection, head)

    def has_pending(self) -> bool:
        return bool(self._pending)

    def abandon(self) -> None:
        """The transaction failed: the shared cache is not trusted until revalidated."""
        if self._shared:
            self._cache.dirty = True

    def copy_pending(self) -> None:
        """Write a large batch's buffered upserts by COPY (PostgreSQL), ahead of
        `write_pending`, before the pipeline of the other writes (COPY is a round trip of
        its own)."""
        puts = sum(1 for value in self._pending.values() if value is not _DELETED)
        if puts < driver.COPY_MIN_ROWS or not driver.can_stage(self.connection):
            return
        upserts = self._upserts()
        driver.copy_upsert(self.connection, "projections", PROJECTION_COLUMNS, "name, key", upserts)
        self._written(upserts)

    def write_pending(self) -> None:
        """Issue the buffered deletes and upserts (inside a pipeline, not yet known to succeed)."""
        if not self._pending:
            return
        deletes: dict[str, list[str]] = {}
        for (name, key), value in self._pending.items():
            if value is _DELETED:
                deletes.setdefault(name, []).append(key)
        upserts = self._upserts()
        # One statement per projection, not one per row: on PostgreSQL a row-by-row delete (even
        # pipelined) took a sixth of a worker's time.
        for name, keys in deletes.items():
            for chunk in in_lists(keys):
                driver.execute(self.connection, _DELETE_ROWS, name, in_values=chunk)
        if upserts:
            driver.execute_many(self.connection, UPSERT_ROWS, upserts)
        self._written(upserts)
        self._pending.clear()

    def _upserts(self) -> list[tuple[str, str, str]]:
        return [(name, key, canonical_json(value))
                for (name, key), value in self._pending.items() if value is not _DELETED]

    def _written(self, upserts: list[tuple[str, str, str]]) -> None:
        """`upserts` are issued: the cache learns their stored text, and they are not pending."""
        for name, key, text in upserts:
            self._cache.flushed(name, key, text)
            del self._pending[(name, key)]


def _decoded(name: str, rows: Iterable[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """Stored (key, JSON text) rows of projection `name` as {key: value}."""
    return {key: decode_row(name, key, text) for key, text in rows}


class UnreadableText(str):
    """A stored row `load_all` could not read (`UnreadableRow`), as its text: shown as it is
    stored, and unequal to any row (a row is a JSON object), so replay lists it as a
    difference and `replay --rebuild` rewrites it."""

    __slots__ = ()


def load_all(connection: Connection, unreadable_as_text: bool = False) -> dict[str, dict[str, Any]]:
    """Every stored projection row as `{name: {key: value}}`, for comparing with a rebuild.
    UnreadableRow for a row that is not a JSON object, or with `unreadable_as_text` that row as
    an `UnreadableText`."""
    tables: dict[str, dict[str, Any]] = {}
    query = select(projections_table).order_by(projections_table.c.name, projections_table.c.key)
    for row in connection.execute(query):
        try:
            value: Any = decode_row(row.name, row.key, row.data)
        except UnreadableRow:
            if not unreadable_as_text:
                raise
            value = UnreadableText(row.data)
        tables.setdefault(row.name, {})[row.key] = value
    return tables


def drop_all(connection: Connection) -> None:
    """Delete every projection row; this process's cached rows and views go with them."""
    forget(connection.engine)
    connection.execute(delete(projections_table))
