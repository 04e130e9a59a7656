"""Decoded projection rows and table views kept across a process's write transactions.

A write transaction holds the append lock, so nothing moves under it. The cache is trusted
only when the log head that transaction reads (position and hash) equals the head at which the
cache was last settled, and no transaction left it half-written. Any other append (another
process, another engine on the same database, or a transaction of ours that failed after
writing) leaves a different head, and the cache starts empty again. The hash chains every
event, so an equal head means an equal log, hence equal projections.

The cache mirrors the projections table: everything written to that table goes through
`SqlProjections` or `drop_all`, both of which keep the cache in step.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from sqlalchemy import Engine, select
from sqlalchemy.engine import Connection

from events.tables import log_head_table

if TYPE_CHECKING:
    from events.projections import TableView

# A long-lived process keeps at most this many decoded rows; beyond it, rows are read again.
MAX_CACHED_ROWS = 200_000
_HEAD = select(log_head_table.c.position, log_head_table.c.hash).where(log_head_table.c.id == 1)

Row = dict[str, Any]


class ProjectionCache:
    """Rows (None: known to be absent) and views of one database, as of `head`."""

    def __init__(self) -> None:
        self.head: tuple[int, str] | None = None
        self.dirty = False
        self.rows: dict[str, dict[str, Row | None]] = {}
        self.complete: set[str] = set()
        self.views: dict[str, dict[Hashable, TableView]] = {}
        self.size = 0

    def clear(self) -> None:
        """Forget everything: the next reads go to the database."""
        self.rows, self.complete, self.views, self.size = {}, set(), {}, 0

    def begin(self, connection: Connection, head: tuple[int, str] | None) -> None:
        """Start a write transaction: keep the cache only if the log is where it was settled."""
        position, head_hash = head if head is not None else connection.execute(_HEAD).one()
        if self.dirty or self.head != (position, head_hash):
            self.clear()
        elif self.size > MAX_CACHED_ROWS:
            # Views stay: they are kept current by every write, whatever rows are cached.
            self.rows, self.complete, self.size = {}, set(), 0
        self.head, self.dirty = (position, head_hash), False

    def settle(self, connection: Connection, head: tuple[int, str] | None) -> None:
        """The transaction wrote everything: the cache now mirrors the log at its new head."""
        position, head_hash = head if head is not None else connection.execute(_HEAD).one()
        self.head, self.dirty = (position, head_hash), False

    def row(self, name: str, key: str, load: Callable[[str, str], Row | None]) -> Row | None:
        table = self.rows.get(name)
        if table is not None and key in table:
            return table[key]
        if name in self.complete:
            return None
        value = load(name, key)
        self.rows.setdefault(name, {})[key] = value
        self.size += 1
        return value

    def table(self, name: str, stored: Callable[[str], dict[str, str]]) -> dict[str, Row]:
        """Every present row of `name`; the stored ones are decoded once per head."""
        table = self.rows.setdefault(name, {})
        if name not in self.complete:
            for key, text in stored(name).items():
                if key not in table:  # a row written in this transaction is newer
                    table[key] = json.loads(text)
                    self.size += 1
            self.complete.add(name)
        return {key: value for key, value in table.items() if value is not None}

    def write(self, name: str, key: str, value: Row | None) -> None:
        """A put (or, with None, a delete) of the current transaction, seen by rows and views."""
        self.dirty = True
        table = self.rows.setdefault(name, {})
        if key not in table:
            self.size += 1
        table[key] = value
        for view in self.views.get(name, {}).values():
            view.apply(key, value)

    def view(self, name: str, view_id: Hashable, build: Callable[[], TableView]) -> TableView:
        views = self.views.setdefault(name, {})
        if view_id not in views:
            views[view_id] = build()
        return views[view_id]


_CACHES: WeakKeyDictionary[Engine, ProjectionCache] = WeakKeyDictionary()


def cache_for(connection: Connection, head: tuple[int, str] | None = None) -> ProjectionCache:
    """The cache of `connection`'s database, checked against the head its transaction holds."""
    cache = _CACHES.get(connection.engine)
    if cache is None:
        cache = _CACHES[connection.engine] = ProjectionCache()
    cache.begin(connection, head)
    return cache


def forget(engine: Engine) -> None:
    """Empty `engine`'s cache in place (the projections table is being rewritten)."""
    cache = _CACHES.get(engine)
    if cache is not None:
        cache.clear()
        cache.dirty = True
