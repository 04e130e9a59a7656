"""The audited event store: atomic multi-stream appends, gap-free positions, a hash chain."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import NoResultFound

from events import driver
from events.canonical import chain_hash
from events.database import PlannerStatistics, in_lists, is_sqlite
from events.merkle import CHECKPOINT_EVENT, CHECKPOINT_STREAM, merkle_root
from events.model import (
    ConcurrencyConflict,
    DuplicateEventError,
    NewEvent,
    RecordedEvent,
    StreamAppend,
    derived_event_id,
)
from events.projections import SqlProjections
from events.rows import (
    COLUMNS,
    EVENT_COLUMNS_SQL,
    INSERT_EVENTS,
    events_by_command,
    from_row,
    header_of,
    row_for,
    row_values,
    to_recorded,
    with_data,
)
from events.tables import HEAD, events_table

READ_CHUNK = 2_000
MAX_KNOWN_VERSIONS = 100_000

# The append path's statements, run on the driver (`events.driver`).
_HEAD = "SELECT position, hash FROM log_head WHERE id = 1"
_LOCK_HEAD = _HEAD + " FOR UPDATE"
_UPDATE_HEAD = "UPDATE log_head SET position = ?, hash = ? WHERE id = 1"
_EVENTS_BY_ID = f"SELECT {EVENT_COLUMNS_SQL} FROM events WHERE event_id IN ({{in}})"
_EVENT_IDS = "SELECT event_id FROM events WHERE event_id IN ({in})"
_READ_FROM = f"SELECT {EVENT_COLUMNS_SQL} FROM events WHERE position > ? ORDER BY position LIMIT ?"
_READ_RANGE = (f"SELECT {EVENT_COLUMNS_SQL} FROM events WHERE position > ? AND position <= ?"
               " ORDER BY position LIMIT ?")
_MAX_VERSIONS = ("SELECT stream_id, max(stream_version) FROM events WHERE stream_id IN ({in})"
                 " GROUP BY stream_id")


class LogTransaction:
    """A write transaction that holds the log's append lock from its first statement.

    Everything read through it (streams, projections) is exactly the log before the positions it
    appends, which is what makes a recorded decision re-derivable. Appended rows are buffered and
    written in one batch when the transaction commits (`flush`); nothing is written if it fails.
    """

    def __init__(self, connection: Connection, head_position: int, head_hash: str,
                 checkpoint_every: int = 0, known_versions: Mapping[str, int] | None = None) -> None:
        """`known_versions`: stream versions exact at this head (a store's from its last commit),
        read here but never changed: this transaction's own go in `versions`."""
        self.connection = connection
        self.checkpoint_every = checkpoint_every
        self.head_position = head_position
        self.head_hash = head_hash
        self.projections = SqlProjections(connection, head=(head_position, head_hash))
        self.known_versions: Mapping[str, int] = known_versions or {}
        self.versions: dict[str, int] = {}  # read under the lock, or appended, by this transaction
        self._buffer: list[dict[str, Any]] = []
        # The last checkpoint's position and the hashes appended since, when known (a store
        # remembers them from its own last commit); else read from the log when one is due.
        self.since_checkpoint: tuple[int, list[str]] | None = None
        self.appended: list[RecordedEvent] = []

    def stream_version(self, stream_id: str) -> int:
        """The stream's current version, 0 for a stream with no events."""
        version = self.versions.get(stream_id)
        if version is None:
            version = self.known_versions.get(stream_id)
            if version is None:
                self.prefetch_versions([stream_id])
                version = self.versions[stream_id]
        return version

    def prefetch_versions(self, stream_ids: Sequence[str]) -> None:
        """Read the versions of streams a batch is about to use in one query, not one each.

        Read under the append lock, so each is exact until this transaction appends.
        """
        wanted = [s for s in dict.fromkeys(stream_ids)
                  if s not in self.versions and s not in self.known_versions]
        for chunk in in_lists(wanted):
            found: dict[str, int] = dict(driver.fetch(self.connection, _MAX_VERSIONS, in_values=chunk))
            for stream_id in chunk:
                self.versions[stream_id] = found.get(stream_id) or 0

    def stored_event_ids(self, event_ids: Sequence[str]) -> set[str]:
        """Which of `event_ids` the log's table holds (this transaction's unflushed rows aside)."""
        found: set[str] = set()
        for chunk in in_lists(event_ids):
            found.update(event_id for (event_id,) in driver.fetch(self.connection, _EVENT_IDS,
                                                                  in_values=chunk))
        return found

    def events_for_commands(self, command_ids: Sequence[str],
                            excluded_type: str | None = None) -> dict[str, list[RecordedEvent]]:
        """Every event of each command (but those of `excluded_type`), grouped, in order."""
        self.flush()
        return events_by_command(self.connection, command_ids, excluded_type)

    def has_writes(self) -> bool:
        """Whether committing would write anything (appended rows or projection changes)."""
        return bool(self._buffer) or self.projections.has_pending()

    def flush(self) -> None:
        """Write the buffered rows and the new head; the transaction calls it before commit."""
        if not self._buffer:
            return
        driver.execute_many(self.connection, INSERT_EVENTS, [row_values(row) for row in self._buffer])
        driver.execute(self.connection, _UPDATE_HEAD, self.head_position, self.head_hash)
        self._buffer = []

    def append(self, appends: Sequence[StreamAppend],
               check_existing: bool = True) -> list[RecordedEvent]:
        """Append to every stream at its expected version, all or nothing.

        Re-appending events already stored at the same streams and versions returns the
        original records and writes nothing. A stale expected version raises
        `ConcurrencyConflict`; an event id stored elsewhere, or a batch that only partly
        overlaps the log, raises `DuplicateEventError`. A caller that already knows its events
        are new (a decision for a command with none) may skip that look-up with
        `check_existing=False`; `UNIQUE(event_id)` still refuses a duplicate at commit.
        """
        if check_existing:
            existing = self._existing(appends)
            if existing is not None:
                return existing
        rows: list[dict[str, Any]] = []
        decoded: list[Any] = []
        recorded_at = datetime.now(UTC).isoformat(timespec="microseconds")
        position, prev_hash = self.head_position, self.head_hash
        for batch in appends:
            version = self.stream_version(batch.stream_id)
            if batch.expected_version is not None and batch.expected_version != version:
                raise ConcurrencyConflict(batch.stream_id, batch.expected_version, version)
            for new in batch.events:
                position += 1
                version += 1
                row, data = row_for(new, batch.stream_id, version, position, recorded_at)
                row["prev_hash"] = prev_hash
                row["hash"] = prev_hash = chain_hash(prev_hash, header_of(row), row["data"])
                rows.append(row)
                decoded.append(data)
            self.versions[batch.stream_id] = version
        if not rows:
            return []
        if self.checkpoint_every:
            checkpoint = self._checkpoint_row(rows, recorded_at)
            if checkpoint is not None:
                rows.append(checkpoint[0])
                decoded.append(checkpoint[1])
                position, prev_hash = checkpoint[0]["position"], checkpoint[0]["hash"]
        self._buffer.extend(rows)
        self.head_position, self.head_hash = position, prev_hash
        recorded = [with_data(row, data) for row, data in zip(rows, decoded, strict=True)]
        self.appended.extend(recorded)
        return recorded

    def _checkpoint_row(self, rows: list[dict[str, Any]],
                        recorded_at: str) -> tuple[dict[str, Any], Any] | None:
        """A checkpoint after this batch when it crosses a multiple of `checkpoint_every`.

        It carries the log size and the Merkle root of every event hash since the previous
        checkpoint, and is chained like any event, so forging one breaks the chain.
        """
        first, last = rows[0]["position"], rows[-1]["position"]
        every = self.checkpoint_every
        if last // every == (first - 1) // every:
            if self.since_checkpoint is not None:
                self.since_checkpoint[1].extend(row["hash"] for row in rows)
            return None
        if self.since_checkpoint is None:
            self.flush()
            since = self._last_checkpoint_position()
            query = (select(events_table.c.hash).where(events_table.c.position > since)
                     .order_by(events_table.c.position))
            earlier = list(self.connection.execute(query).scalars())
        else:
            since, earlier = self.since_checkpoint
        leaves = [*earlier, *(row["hash"] for row in rows)]
        data = {"log_size": last, "from_position": since + 1, "to_position": last,
                "merkle_root": merkle_root(leaves)}
        version = self.stream_version(CHECKPOINT_STREAM) + 1
        self.versions[CHECKPOINT_STREAM] = version
        new = NewEvent(event_id=derived_event_id("checkpoint", str(last)),
                       event_type=CHECKPOINT_EVENT, data=data, occurred_at=rows[-1]["occurred_at"],
                       actor="log", tenant="system")
        row, decoded = row_for(new, CHECKPOINT_STREAM, version, last + 1, recorded_at)
        row["prev_hash"] = rows[-1]["hash"]
        row["hash"] = chain_hash(row["prev_hash"], header_of(row), row["data"])
        self.since_checkpoint = (last + 1, [])
        return row, decoded

    def _last_checkpoint_position(self) -> int:
        query = select(func.max(events_table.c.position)).where(
            events_table.c.stream_id == CHECKPOINT_STREAM)
        return int(self.connection.execute(query).scalar() or 0)

    def _existing(self, appends: Sequence[StreamAppend]) -> list[RecordedEvent] | None:
        wanted = [(b.stream_id, b.expected_version, i, e) for b in appends
                  for i, e in enumerate(b.events)]
        ids = [entry[3].event_id for entry in wanted]
        if not ids:
            return None
        found: dict[str, RecordedEvent] = {}
        buffered = {row["event_id"]: row for row in self._buffer}
        for event_id in ids:
            if event_id in buffered:
                found[event_id] = to_recorded(buffered[event_id])
        for chunk in in_lists(ids):
            for row in driver.fetch(self.connection, _EVENTS_BY_ID, in_values=chunk):
                stored = from_row(row)
                found[stored.event_id] = stored
        if not found:
            return None
        if len(found) != len(ids):
            raise DuplicateEventError("the batch partly overlaps events already in the log")
        result = []
        for stream_id, expected, index, new in wanted:
            stored = found[new.event_id]
            same_place = (stored.stream_id == stream_id and expected is not None
                          and stored.stream_version == expected + index + 1)
            if not same_place and expected is not None:
                raise DuplicateEventError(
                    f"event {new.event_id} is already stored at {stored.stream_id}"
                    f"@{stored.stream_version}")
            result.append(stored)
        return result


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

    @contextmanager
    def transaction(self, connection: Connection | None = None) -> Iterator[LogTransaction]:
        """A write transaction holding the append lock; commits on success, else rolls back.

        `connection`: one from `reading` the caller has only read on; the transaction goes on
        on it (on PostgreSQL in the database transaction its reads began, if still open, the
        lock taken now; on SQLite, where a reader cannot become the writer, its read transaction
        is ended first). Reads made before the lock may be stale: what the lock protects is read
        again under it. A transaction that fails leaves the shared projection cache untrusted
        until it is revalidated against the stored rows.
        """
        asked = time.perf_counter()
        locked: float | None = None
        tx: LogTransaction | None = None
        try:
            with self._writing(connection) as conn:
                # SQLite: BEGIN IMMEDIATE took the lock; PostgreSQL: the head row's lock.
                head = driver.fetch(conn, _HEAD if is_sqlite(self.engine) else _LOCK_HEAD)
                if len(head) != 1:
                    raise NoResultFound("the log has no head row: run `fleetctl init` on it")
                ((position, head_hash),) = head
                locked = time.perf_counter()
                known = self._known_head == (position, head_hash)
                tx = LogTransaction(conn, position, head_hash, self.checkpoint_every,
                                    self._known_versions if known else None)
                if known and self._known_since_checkpoint is not None:
                    since, hashes = self._known_since_checkpoint
                    tx.since_checkpoint = (since, list(hashes))
                yield tx
                if tx.has_writes():
                    with driver.pipeline(conn):  # PostgreSQL: every write in one round trip
                        tx.flush()
                        tx.projections.write_pending()
                tx.projections.flush(head=(tx.head_position, tx.head_hash))
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

    def head(self) -> tuple[int, str]:
        with self.engine.connect() as conn:
            row = conn.execute(HEAD).one()
            return int(row.position), str(row.hash)

    def read_stream(self, stream_id: str, from_version: int = 0) -> list[RecordedEvent]:
        """The stream's events after `from_version`, in version order."""
        query = (select(events_table).where(events_table.c.stream_id == stream_id,
                                            events_table.c.stream_version > from_version)
                 .order_by(events_table.c.stream_version))
        with self.engine.connect() as conn:
            return [from_row(row) for row in conn.execute(query)]

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
