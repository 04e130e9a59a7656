"""The audited event store: atomic multi-stream appends, gap-free positions, a hash chain."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import NoResultFound

from events import driver
from events.database import PlannerStatistics, is_sqlite
from events.model import RecordedEvent, StatementFailed, StreamAppend
from events.projection_cache import views_unbuilt
from events.projections import SqlProjections, StateView
from events.rows import COLUMNS, EVENT_COLUMNS_SQL, events_by_command, from_row, to_recorded
from events.tables import events_table
from events.transaction import LogTransaction, ReadAhead

READ_CHUNK = 2_000
MAX_KNOWN_VERSIONS = 100_000

# The store's statements, run on the driver (`events.driver`).
_HEAD = "SELECT position, hash FROM log_head WHERE id = 1"
_LOCK_HEAD = _HEAD + " FOR UPDATE"
_READ_FROM = f"SELECT {EVENT_COLUMNS_SQL} FROM events WHERE position > ? ORDER BY position LIMIT ?"
_READ_RANGE = (f"SELECT {EVENT_COLUMNS_SQL} FROM events WHERE position > ? AND position <= ?"
               " ORDER BY position LIMIT ?")
_READ_FIRST = f"SELECT {EVENT_COLUMNS_SQL} FROM events ORDER BY position LIMIT ?"
_FIRST_HASH = "SELECT hash FROM events WHERE position = 1"
_STREAM_VERSION = COLUMNS.index("stream_version")
_STREAM_AFTER = (f"SELECT {EVENT_COLUMNS_SQL} FROM events WHERE stream_id = ? AND stream_version > ?"
                 " ORDER BY stream_version LIMIT ?")
_STREAM_BEFORE = (f"SELECT {EVENT_COLUMNS_SQL} FROM events WHERE stream_id = ? AND stream_version < ?"
                  " AND stream_version > ? ORDER BY stream_version DESC LIMIT ?")


def _one_head(rows: Sequence[driver.Row]) -> tuple[int, str]:
    if len(rows) != 1:
        raise NoResultFound("the log has no head row (table log_head), which fleetctl never "
                            "deletes: it was removed outside fleetctl; `fleetctl verify` checks "
                            "the events")
    ((position, head_hash),) = rows
    return int(position), str(head_hash)


class EventStore:
    """Append and read the log. Concurrency is enforced by the database, never in Python.

    One store per process (`controlplane.runtime.store_for_process`), used by one thread at a
    time: what it remembers of its last commit (head, stream versions, hashes since the last
    checkpoint) is updated without a lock.
    """

    def __init__(self, engine: Engine, checkpoint_every: int = 1_000) -> None:
        self.engine = engine
        self.checkpoint_every = checkpoint_every
        # Stream versions as of the head this store last committed: still true while the head
        # read under the lock is that same (position, hash), i.e. nobody else has appended.
        self._known_head: tuple[int, str] | None = None
        self._known_versions: dict[str, int] = {}
        self._known_since_checkpoint: tuple[int, list[str]] | None = None
        # Whether the last transaction found the log at that head: the next one then reads
        # ahead with the lock, on the guess that it still is (`_locked`).
        self._guessed_right = True
        self.statistics = PlannerStatistics(engine)
        # Seconds this store spent taking the append lock, and holding it (to the end of the
        # commit), over every write transaction so far: where contention between workers shows.
        self.lock_wait_seconds = 0.0
        self.lock_held_seconds = 0.0

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A connection to read the log on before taking the append lock, then to pass to
        `transaction`: one connection for both (on PostgreSQL, one database transaction unless a
        failed transaction is retried on it)."""
        with self.engine.connect() as connection:
            yield connection

    def warm(self, connection: Connection, build: Callable[[StateView], object]) -> None:
        """Let `build` read (and so build the views it asks for) into this process's shared
        projection cache, on `connection` before a write transaction takes the append lock,
        when the process has built no view of this database yet (a fresh RQ work horse).

        A fresh process built its views (the GPU index: every node row decoded) under the lock,
        where every other worker waits; built here, the lock's transaction only revalidates
        them: the stored texts compared, the rows changed since decoded. The cache is begun at
        the head read before any row, so what `build` reads is the log at that head or later:
        if the lock finds the same head, nothing was appended in between and the cache is
        exact; if not, it is revalidated, as after any other process's append.
        """
        if not views_unbuilt(self.engine):
            return
        head = _one_head(driver.fetch(connection, _HEAD))
        projections = SqlProjections(connection, head=head, shared=True)
        build(projections)
        if projections.has_pending():  # it would be lost: only a write transaction writes
            raise ValueError("a warm-up wrote projection rows; it may only read")

    @contextmanager
    def transaction(self, connection: Connection | None = None,
                    read_ahead: ReadAhead | None = None) -> Iterator[LogTransaction]:
        """A write transaction holding the append lock; commits on success, else rolls back
        (but see the end of this docstring for PostgreSQL).

        `connection`: one from `reading` the caller has only read on; the transaction goes on
        on it (on PostgreSQL in the database transaction its reads began, if still open, the
        lock taken now; on SQLite, where a reader cannot become the writer, its read transaction
        is ended first). Reads made before the lock may be stale: what the lock protects is read
        again under it. A transaction that fails leaves the shared projection cache untrusted
        until it is revalidated against the stored rows. One in which any statement failed is
        rolled back with `StatementFailed` even if the caller caught that statement's error (SQLite
        would otherwise commit the statements around it). Projection rows may change only in a
        transaction that also appends (as folding and `rebuild_live` do; one that does not is
        refused with ValueError and rolled back): other processes know their cached rows are
        current by the head, which only an append moves.

        `read_ahead`: the stream versions and projection rows the transaction will read, read
        as soon as the lock is held (`LogTransaction.prefetch`); on PostgreSQL in the lock's
        own round trip when the log is where this store's last commit left it (that read-ahead
        then counts in `lock_wait_seconds`, not `lock_held_seconds`).

        On PostgreSQL the COMMIT goes in the round trip of the writes (`driver.pipeline`): an
        error raised after that (only a failure of this process: the rest is bookkeeping in
        memory) finds the transaction committed, and the cache untrusted until revalidated, as
        after any failure.
        """
        asked = time.perf_counter()
        locked: float | None = None
        tx: LogTransaction | None = None
        try:
            with self._writing(connection) as conn:
                driver.forget_failures(conn)  # a mark left on the pooled connection by earlier use
                tx, locked = self._locked(conn, read_ahead)
                yield tx
                if driver.statement_failed(conn):
                    raise StatementFailed(
                        "a statement of this write transaction failed and its error was caught:"
                        " the transaction is rolled back rather than committed without it")
                if tx.projections.has_pending() and not tx.appended:
                    raise ValueError(
                        "projection rows changed without an event appended in the same"
                        " transaction: other processes would keep their cached rows")
                if tx.has_writes():
                    tx.copy_bulk()  # a large batch's rows by COPY, which cannot be pipelined
                    # PostgreSQL: the other writes and the COMMIT in one round trip.
                    with driver.pipeline(conn, commit=True):
                        tx.flush()
                        tx.projections.write_pending()
                tx.projections.settle(head=(tx.head_position, tx.head_hash))
        except BaseException:
            if tx is not None:
                tx.projections.abandon()  # rows it cached were rolled back, or may have been
            raise
        finally:
            released = time.perf_counter()
            locked = released if locked is None else locked  # never took it: all of it waiting
            self.lock_wait_seconds += locked - asked
            self.lock_held_seconds += released - locked
        assert tx is not None
        # Committed: remember the versions, bounded so a long-lived process stays small. Those
        # known before were read, never changed, by the transaction: only its own are added.
        versions = self._known_versions if tx.known_versions is self._known_versions else {}
        versions.update(tx.versions)
        self._known_head = (tx.head_position, tx.head_hash)
        self._known_versions = versions if len(versions) <= MAX_KNOWN_VERSIONS else {}
        self._known_since_checkpoint = tx.since_checkpoint
        self.statistics.after_commit(tx.head_position)

    def _locked(self, conn: Connection, read_ahead: ReadAhead | None
                ) -> tuple[LogTransaction, float]:
        """The transaction, once the append lock is held (SQLite: BEGIN IMMEDIATE took it;
        PostgreSQL: the head row's lock), with `read_ahead` read under it; and when the lock
        was known to be held (`time.perf_counter`).

        On PostgreSQL the read-ahead goes with the lock in one round trip, computed as if the
        log were still at the head this store's last commit left (`guess`), when its previous
        transaction found it so (with other writers busy it rarely does: the guess is then not
        made, so its reads are not wasted): versions and cached rows known at the guess are not
        read. The reads run after the lock is granted, so what they return is exact whatever the
        head. If the head read is the guess, nothing was
        appended since this store's commit, so what it knew there (and any row its cache
        revalidated while computing the reads, before the lock) is still exact: the log only
        grows, and projection rows change only with an append. If the head moved, everything
        computed at the guess is dropped (the cache untrusted) and the read-ahead made again
        at the head read: two round trips, as without the guess.
        """
        guess = self._known_head
        tx: LogTransaction | None = None
        try:
            if (read_ahead is not None and guess is not None and self._guessed_right
                    and driver.gathers(conn)):
                tx = self._at_head(conn, guess)
                heads, found = driver.Reads(), list[driver.Row]()
                heads.add(_LOCK_HEAD, then=found.extend)
                self.statistics.count_with(heads)
                tx.prefetch(*read_ahead, after=heads)
                locked, head = time.perf_counter(), _one_head(found)
                self._guessed_right = head == guess
                if self._guessed_right:
                    return tx, locked
                tx.projections.abandon()  # computed at a head the log has left
            else:
                head = _one_head(driver.fetch(conn, _HEAD if is_sqlite(self.engine)
                                              else _LOCK_HEAD))
                locked = time.perf_counter()
                self._guessed_right = guess in (None, head)
            tx = self._at_head(conn, head)
            if read_ahead is not None:
                count = driver.Reads()
                tx.prefetch(*read_ahead, after=count if self.statistics.count_with(count) else None)
            return tx, locked
        except BaseException:
            if tx is not None:
                tx.projections.abandon()
            raise

    def _at_head(self, conn: Connection, head: tuple[int, str]) -> LogTransaction:
        """A transaction at `head`, with what this store knows of it if it left the log there."""
        known = self._known_head == head
        tx = LogTransaction(conn, *head, self.checkpoint_every,
                            self._known_versions if known else None)
        if known and self._known_since_checkpoint is not None:
            since, hashes = self._known_since_checkpoint
            tx.since_checkpoint = (since, list(hashes))
        return tx

    @contextmanager
    def _writing(self, connection: Connection | None) -> Iterator[Connection]:
        """A connection in a write transaction (`fleet_write`), committed when the block ends
        without an error, else rolled back: a new one, or the reader's `connection` taken over."""
        if connection is None:
            with self.engine.connect().execution_options(fleet_write=True) as conn, conn.begin():
                yield conn
            return
        if is_sqlite(self.engine) and connection.in_transaction():
            connection.rollback()  # only read: BEGIN IMMEDIATE must start the writer's transaction
        before = connection.get_execution_options().get("fleet_write", False)
        connection.execution_options(fleet_write=True)
        try:
            with connection.get_transaction() or connection.begin():
                yield connection
        finally:
            connection.execution_options(fleet_write=before)

    def append(self, appends: Sequence[StreamAppend]) -> list[RecordedEvent]:
        """Atomically append to one or several streams (see `LogTransaction.append`)."""
        with self.transaction() as tx:
            return tx.append(appends)

    def log_id(self) -> str | None:
        """The hash of the log's first event, which no other log shares (None while the log is
        empty): what names this log to processes that share a queue with others."""
        with self.engine.connect() as conn:
            rows = driver.fetch(conn, _FIRST_HASH)
        return str(rows[0][0]) if rows else None

    def head(self, connection: Connection | None = None) -> tuple[int, str]:
        """The log's last position and hash (read on `connection`, from `snapshot`, when given)."""
        if connection is not None:
            return _one_head(driver.fetch(connection, _HEAD))
        with self.engine.connect() as conn:
            return _one_head(driver.fetch(conn, _HEAD))

    @contextmanager
    def snapshot(self) -> Iterator[Connection]:
        """A connection on which every read sees the log as one commit left it: the head, the
        rows and the projection rows together, whatever other processes append meanwhile.

        On SQLite one read transaction (under WAL, writers go on beside it); on PostgreSQL one
        REPEATABLE READ transaction. Only for reading: what it holds is rolled back at the end.
        """
        with self.engine.connect() as conn:
            if not is_sqlite(self.engine):
                conn.execution_options(isolation_level="REPEATABLE READ")
            conn.begin()  # closing the connection rolls it back
            yield conn

    def read_stored(self, connection: Connection) -> Iterator[dict[str, Any]]:
        """Every stored row as its mapping (data as its stored text), in position order, read in
        chunks on `connection` (from `snapshot`): whatever its position, a row at 0 or below
        (which no append writes) or past the head too, so that verification sees it."""
        rows = driver.fetch(connection, _READ_FIRST, READ_CHUNK)
        while rows:
            for row in rows:
                yield dict(zip(COLUMNS, row, strict=True))
            rows = driver.fetch(connection, _READ_FROM, rows[-1][0], READ_CHUNK)

    def read_stream(self, stream_id: str, from_version: int = 0) -> list[RecordedEvent]:
        """The stream's events after `from_version`, in version order, all at once (for a
        stream that stays small; `iter_stream` for one that grows with the log)."""
        return list(self.iter_stream(stream_id, from_version))

    def iter_stream(self, stream_id: str, from_version: int = 0,
                    newest_first: bool = False) -> Iterator[RecordedEvent]:
        """The stream's events after `from_version` in version order (or newest first), read in
        chunks: memory does not grow with the stream (a pool's or a shared budget's holds an
        event per decision about it), and a reader that stops early reads only what it looked
        at."""
        last = 2**62 if newest_first else from_version
        while True:
            with self.engine.connect() as conn:  # a connection per chunk: no long transaction
                rows = (driver.fetch(conn, _STREAM_BEFORE, stream_id, last, from_version,
                                     READ_CHUNK) if newest_first
                        else driver.fetch(conn, _STREAM_AFTER, stream_id, last, READ_CHUNK))
            for row in rows:
                yield from_row(row)
            if len(rows) < READ_CHUNK:
                return
            last = rows[-1][_STREAM_VERSION]

    def read_all(self, from_position: int = 0, to_position: int | None = None,
                 raw: bool = False) -> Iterator[Any]:
        """Events after `from_position` up to `to_position`, in position order, read in chunks.

        With `raw=True` yields the stored row mappings (data as its stored JSON text).
        """
        last = from_position
        while True:
            with self.engine.connect() as conn:  # a connection per chunk: no long transaction
                rows = (driver.fetch(conn, _READ_FROM, last, READ_CHUNK) if to_position is None
                        else driver.fetch(conn, _READ_RANGE, last, to_position, READ_CHUNK))
            if not rows:
                return
            for row in rows:
                yield dict(zip(COLUMNS, row, strict=True)) if raw else from_row(row)
            last = rows[-1][0]

    def events_for_command(self, command_id: str) -> list[RecordedEvent]:
        return self.events_for_commands([command_id]).get(command_id, [])

    def events_for_commands(self, command_ids: Sequence[str], connection: Connection | None = None
                            ) -> dict[str, list[RecordedEvent]]:
        """Every event of each command, grouped by command id, in position order (read on
        `connection`, from `reading`, when given)."""
        if connection is not None:
            return events_by_command(connection, command_ids)
        with self.engine.connect() as conn:
            return events_by_command(conn, command_ids)

    def find_event(self, event_id: str) -> RecordedEvent | None:
        query = select(events_table).where(events_table.c.event_id == event_id)
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        return to_recorded(row) if row is not None else None
