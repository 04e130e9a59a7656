"""Decoded projection rows and table views kept across a process's write transactions.

A write transaction holds the append lock, so nothing moves under it. The cache is trusted
only when the log head that transaction reads (position and hash) equals the head at which the
cache was last settled, and no transaction left it half-written. Any other append (another
process, another engine on the same database, or a transaction of ours that failed after
writing) leaves a different head. The hash chains every event, so an equal head means an equal
log, hence equal projections. (A transaction may begin the cache at the head it expects, to
read ahead with the lock in one round trip; if the lock shows another head, it marks the cache
untrusted before using anything, see `EventStore._locked`.)

On a different head, rows are forgotten, but a projection that has views is revalidated before
its first use instead: every stored row's text is read again and only the rows whose text
differs from the text this cache holds (canonical JSON: equal text, equal value) are decoded
and told to the views. A read-only transaction keeps a cache of its own for its lifetime, but
for one: a process that has built no view yet may build its views into this cache before it
takes the lock (`EventStore.warm`), reading only, at the head it read before any row. What it
reads is the log at that head or later, so it is trusted only if the lock finds that very
head (nothing appended in between), and revalidated otherwise, as above.

The cache mirrors the projections table: everything written to that table goes through
`SqlProjections` or `drop_all`, both of which keep the cache in step.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol
from weakref import WeakKeyDictionary

from sqlalchemy import Engine
from sqlalchemy.engine import Connection

from events.canonical import decode
from events.model import UnreadableRow
from events.tables import HEAD

if TYPE_CHECKING:
    from events.projections import TableView

# Past this many decoded rows a long-lived process forgets, at its next transaction, every row
# of the projections without views (read again when needed). A projection with views keeps
# all its rows: its views are built from them and revalidated against them.
MAX_CACHED_ROWS = 50_000

Row = dict[str, Any]


def decode_row(name: str, key: str, text: str) -> Row:
    """Row `key` of projection `name` from its stored text; UnreadableRow when that is not a
    JSON object (a decision had failed on a JSONDecodeError naming no row)."""
    try:
        value = decode(text)
    except (ValueError, RecursionError):
        raise UnreadableRow(name, key, "not JSON") from None
    if type(value) is not dict:
        raise UnreadableRow(name, key, f"JSON {type(value).__name__}, not an object")
    return value


class RowSource(Protocol):
    """Where the cache reads what it does not hold: the rows on the current transaction's
    connection. Passed to every call (not a pair of bound methods, made afresh for every row
    a decision reads or writes)."""

    def load_row(self, name: str, key: str) -> Row | None:
        """Row `key` of projection `name` as stored (None: absent)."""
        ...

    def stored_rows(self, name: str) -> dict[str, str]:
        """Every stored row of projection `name`: key to its stored text."""
        ...


class ProjectionCache:
    """Rows (None: known to be absent) and views of one database, as of `head`.

    For a projection with views it also keeps each row's stored text (`texts`, absent while a
    row's write is not yet flushed), which is what revalidation compares.
    """

    def __init__(self) -> None:
        self.head: tuple[int, str] | None = None
        self.dirty = False
        self.rows: dict[str, dict[str, Row | None]] = {}
        self.complete: set[str] = set()
        self.views: dict[str, dict[Hashable, TableView]] = {}
        self.texts: dict[str, dict[str, str]] = {}
        self.stale: set[str] = set()
        self.size = 0

    def clear(self) -> None:
        """Forget everything: the next reads go to the database."""
        self.rows, self.complete, self.views, self.texts, self.stale = {}, set(), {}, {}, set()
        self.size = 0

    def _keep_only_viewed(self, stale: bool) -> None:
        """Forget every row but those of projections with views (revalidated first if `stale`),
        and the stored texts of any other (left by a view whose build failed)."""
        self.rows = {name: self.rows[name] for name in self.views}
        self.texts = {name: texts for name, texts in self.texts.items() if name in self.views}
        self.complete = set(self.views)
        self.size = sum(len(rows) for rows in self.rows.values())
        if stale:
            self.stale = set(self.views)

    def begin(self, connection: Connection, head: tuple[int, str] | None) -> None:
        """Start a write transaction (or a warm-up's reads, see the module's docstring): trust
        the cache only if the log is where it was settled."""
        position, head_hash = head if head is not None else connection.execute(HEAD).one()
        if self.dirty or self.head != (position, head_hash):
            self._keep_only_viewed(stale=True)
        elif self.size > MAX_CACHED_ROWS:
            self._keep_only_viewed(stale=False)
        self.head, self.dirty = (position, head_hash), False

    def settle(self, connection: Connection, head: tuple[int, str] | None) -> None:
        """The transaction wrote everything: the cache now mirrors the log at its new head."""
        position, head_hash = head if head is not None else connection.execute(HEAD).one()
        self.head, self.dirty = (position, head_hash), False

    def flushed(self, name: str, key: str, text: str) -> None:
        """Row `key` of `name` is now stored as `text`."""
        texts = self.texts.get(name)
        if texts is not None:
            texts[key] = text

    def _revalidate(self, name: str, source: RowSource) -> None:
        """Bring a projection with views up to the stored rows, decoding only changed ones.

        Only for a projection in `stale`: callers look first (every read and write of a row
        does, and rarely finds one there).
        """
        rows, texts = self.rows.setdefault(name, {}), self.texts.setdefault(name, {})
        views = self.views.get(name, {}).values()
        current = source.stored_rows(name)
        for key, text in current.items():
            if texts.get(key) != text:
                value = rows[key] = decode_row(name, key, text)
                texts[key] = text
                for view in views:
                    view.apply(key, value)
        for key in [key for key in rows if key not in current]:
            if rows[key] is not None:
                for view in views:
                    view.apply(key, None)
            rows[key] = None
            texts.pop(key, None)
        self.complete.add(name)
        self.stale.discard(name)

    def row(self, name: str, key: str, source: RowSource) -> Row | None:
        if name in self.stale:
            self._revalidate(name, source)
        table = self.rows.get(name)
        if table is not None and key in table:
            return table[key]
        if name in self.complete:
            return None
        value = source.load_row(name, key)
        self.rows.setdefault(name, {})[key] = value
        self.size += 1
        return value

    def missing(self, name: str, keys: list[str], source: RowSource) -> list[str]:
        """Which of `keys` are not known yet (present or absent), each once, for `loaded`."""
        if name in self.stale:
            self._revalidate(name, source)
        if name in self.complete:
            return []
        table = self.rows.get(name, {})
        return [key for key in dict.fromkeys(keys) if key not in table]

    def loaded(self, name: str, keys: Sequence[str], found: dict[str, Row]) -> None:
        """`keys` were read in this transaction: those absent from `found` are known absent.

        A row this transaction wrote meanwhile is newer than the read, and kept.
        """
        table = self.rows.setdefault(name, {})
        for key in keys:
            if key not in table:
                table[key] = found.get(key)
                self.size += 1

    def table(self, name: str, source: RowSource) -> dict[str, Row]:
        """Every present row of `name`; the stored ones are decoded once per head."""
        if name in self.stale:
            self._revalidate(name, source)
        table = self.rows.setdefault(name, {})
        if name not in self.complete:
            for key, text in source.stored_rows(name).items():
                if key not in table:  # a row written in this transaction is newer
                    table[key] = decode_row(name, key, text)
                    self.size += 1
            self.complete.add(name)
        return {key: value for key, value in table.items() if value is not None}

    def write(self, name: str, key: str, value: Row | None, source: RowSource) -> None:
        """A put (or, with None, a delete) of the current transaction, seen by rows and views."""
        if name in self.stale:
            self._revalidate(name, source)
        self.dirty = True
        table = self.rows.get(name)
        if table is None:
            table = self.rows[name] = {}
        if key not in table:
            self.size += 1
        table[key] = value
        texts = self.texts.get(name)
        if texts is not None:
            texts.pop(key, None)  # unknown until flushed
        views = self.views.get(name)
        if views:
            for view in views.values():
                view.apply(key, value)

    def view(self, name: str, view_id: Hashable, build: Callable[[], TableView],
             source: RowSource) -> TableView:
        """The view, built on first use from every row (with their texts, to revalidate later)."""
        if name in self.stale:
            self._revalidate(name, source)
        view = self.views.get(name, {}).get(view_id)
        if view is None:
            if name not in self.texts and not self.rows.get(name):
                # Read the texts with the rows, so a later head can be checked against them.
                texts = source.stored_rows(name)
                rows: dict[str, Row | None] = {key: decode_row(name, key, text)
                                               for key, text in texts.items()}
                self.texts[name], self.rows[name] = texts, rows
                self.size += len(rows)
                self.complete.add(name)
            # Registered once built: a read or build that fails leaves no half-made view.
            view = self.views.setdefault(name, {})[view_id] = build()
        return view


_CACHES: WeakKeyDictionary[Engine, ProjectionCache] = WeakKeyDictionary()


def cache_for(connection: Connection, head: tuple[int, str] | None = None) -> ProjectionCache:
    """The cache of `connection`'s database, checked against the head its transaction holds."""
    cache = _CACHES.get(connection.engine)
    if cache is None:
        cache = _CACHES[connection.engine] = ProjectionCache()
    cache.begin(connection, head)
    return cache


def views_unbuilt(engine: Engine) -> bool:
    """Whether this process has built no view of `engine`'s database yet."""
    cache = _CACHES.get(engine)
    return cache is None or not cache.views


def forget(engine: Engine) -> None:
    """Empty `engine`'s cache in place (the projections table is being rewritten)."""
    cache = _CACHES.get(engine)
    if cache is not None:
        cache.clear()
        cache.dirty = True
