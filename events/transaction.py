"""A write transaction on the log: appends at expected versions, the hash chain, checkpoints."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any, NamedTuple

from sqlalchemy.engine import Connection

from events import driver
from events.database import in_lists
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
    as_recorded,
    events_by_command,
    from_row,
    row_for,
    row_values,
)

# The append path's statements, run on the driver (`events.driver`).
UPDATE_HEAD = "UPDATE log_head SET position = ?, hash = ? WHERE id = 1"
_EVENTS_BY_ID = f"SELECT {EVENT_COLUMNS_SQL} FROM events WHERE event_id IN ({{in}})"
_EVENT_IDS = "SELECT event_id FROM events WHERE event_id IN ({in})"
_LAST_CHECKPOINT = "SELECT max(position) FROM events WHERE stream_id = ?"
_HASHES_AFTER = "SELECT hash FROM events WHERE position > ? ORDER BY position"
_EVENT_ID, _HASH = COLUMNS.index("event_id"), COLUMNS.index("hash")
_MAX_VERSIONS = ("SELECT stream_id, max(stream_version) FROM events WHERE stream_id IN ({in})"
                 " GROUP BY stream_id")


def wall_clock() -> str:
    """The control plane's own clock, as the log records it in `recorded_at` (UTC, ISO 8601 to
    the microsecond). The one place an append reads the time: a test that lets a lease run out
    replaces this function rather than sleeping."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


class ReadAhead(NamedTuple):
    """What a transaction is about to read: stream versions and projection rows (name, key)."""

    stream_ids: Sequence[str]
    rows: Sequence[tuple[str, str]]


class LogTransaction:
    """A write transaction that holds the log's append lock from its first statement.

    Everything read through it (streams, projections) is exactly the log before the positions it
    appends, which is what makes a recorded decision re-derivable. Appended rows are buffered and
    written in one batch when the transaction commits (`flush`); nothing is written if it fails.
    """

    def __init__(self, connection: Connection, head_position: int, head_hash: str,
                 checkpoint_every: int = 0, known_versions: Mapping[str, int] | None = None,
                 holds_lock: bool = True) -> None:
        """`known_versions`: stream versions exact at this head (a store's from its last commit),
        read here but never changed: this transaction's own go in `versions`. `holds_lock`:
        False for a snapshot without the append lock (rolled back), whose projections must
        keep a cache of their own instead of the process's shared one."""
        self.connection = connection
        self.checkpoint_every = checkpoint_every
        self.head_position = head_position
        self.head_hash = head_hash
        self.projections = SqlProjections(connection, head=(head_position, head_hash),
                                          shared=holds_lock)
        self.known_versions: Mapping[str, int] = known_versions or {}
        self.versions: dict[str, int] = {}  # read under the lock, or appended, by this transaction
        # Appended rows not yet written, each as its values in column order (`row_values`).
        self._buffer: list[tuple[Any, ...]] = []
        self._stored_head = (head_position, head_hash)  # the head the table holds
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
                self.prefetch([stream_id], ())
                version = self.versions[stream_id]
        return version

    def prefetch(self, stream_ids: Sequence[str], rows: Iterable[tuple[str, str]],
                 after: driver.Reads | None = None) -> None:
        """Read ahead the versions of `stream_ids` and the projection rows `rows` names (see
        `SqlProjections.prefetch`), in one query per kind, not one each; on PostgreSQL all in one
        round trip, after the queries of `after` if given. Read under the append lock, so each
        is exact until this transaction appends."""
        reads = after or driver.Reads()
        self._read_versions(reads, stream_ids)
        self.projections.read_ahead(reads, rows)
        reads.run(self.connection)

    def _read_versions(self, reads: driver.Reads, stream_ids: Sequence[str]) -> None:
        wanted = [s for s in dict.fromkeys(stream_ids)
                  if s not in self.versions and s not in self.known_versions]
        for chunk in in_lists(wanted):
            reads.add(_MAX_VERSIONS, in_values=chunk, then=partial(self._versions_read, chunk))

    def _versions_read(self, stream_ids: Sequence[str], rows: list[driver.Row]) -> None:
        found: dict[str, int] = dict(rows)
        for stream_id in stream_ids:
            self.versions.setdefault(stream_id, found.get(stream_id) or 0)

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

    def clock(self) -> str:
        """The `recorded_at` an append made now would carry (`wall_clock`). A decider fixes it
        before deciding and passes it to `append`, so a decision can read the very time it is
        recorded at."""
        return wall_clock()

    def has_writes(self) -> bool:
        """Whether committing would write anything (appended rows or projection changes)."""
        return bool(self._buffer) or self.projections.has_pending()

    def copy_bulk(self) -> None:
        """Write a large batch's buffered event rows and projection upserts by COPY
        (PostgreSQL), ahead of `flush` and `SqlProjections.write_pending`.

        Not inside `driver.pipeline`: the store calls it just before the pipeline of its writes.
        """
        if len(self._buffer) >= driver.COPY_MIN_ROWS and driver.can_copy(self.connection):
            driver.copy_rows(self.connection, "events", COLUMNS, self._buffer)
            self._buffer = []
        self.projections.copy_pending()

    def flush(self) -> None:
        """Write the buffered rows and the new head; the transaction calls it before commit."""
        if self._buffer:
            driver.execute_many(self.connection, INSERT_EVENTS, self._buffer)
            self._buffer = []
        if self._stored_head != (self.head_position, self.head_hash):
            driver.execute(self.connection, UPDATE_HEAD, self.head_position, self.head_hash)
            self._stored_head = (self.head_position, self.head_hash)

    def append(self, appends: Sequence[StreamAppend], check_existing: bool = True,
               recorded_at: str | None = None) -> list[RecordedEvent]:
        """Append to every stream at its expected version, all or nothing.

        Re-appending events already stored at the same streams and versions returns the
        original records and writes nothing. A stale expected version raises
        `ConcurrencyConflict`; an event id stored elsewhere, or a batch that only partly
        overlaps the log, raises `DuplicateEventError`. A caller that already knows its events
        are new (a decision for a command with none) may skip that look-up with
        `check_existing=False`; `UNIQUE(event_id)` still refuses a duplicate at commit.
        Every row appended (a checkpoint too) carries `recorded_at`: the time `clock` gave the
        caller, or the clock's now when not given.

        Returns exactly the caller's events, in order, whether new or re-appended: a checkpoint
        the append adds is written (and in `appended`) but not returned, so one event appended
        is one event back wherever the log's position falls.
        """
        if check_existing:
            existing = self._existing(appends)
            if existing is not None:
                return existing
        rows: list[tuple[Any, ...]] = []  # what is stored, in column order
        recorded: list[RecordedEvent] = []
        recorded_at = recorded_at or wall_clock()
        position, prev_hash = self.head_position, self.head_hash
        versions: dict[str, int] = {}  # kept only if the whole call succeeds
        for batch in appends:
            version = versions.get(batch.stream_id)
            if version is None:
                version = self.stream_version(batch.stream_id)
            if batch.expected_version is not None and batch.expected_version != version:
                raise ConcurrencyConflict(batch.stream_id, batch.expected_version, version)
            for new in batch.events:
                position += 1
                version += 1
                row, data = row_for(new, batch.stream_id, version, position, recorded_at,
                                    prev_hash)
                prev_hash = row["hash"]
                rows.append(row_values(row))
                recorded.append(as_recorded(row, data))
            versions[batch.stream_id] = version
        if not rows:
            return []
        checkpoint = self._checkpoint_row(recorded, recorded_at, versions) \
            if self.checkpoint_every else None
        self.versions.update(versions)
        self._buffer.extend(rows)
        self.appended.extend(recorded)
        if checkpoint is not None:
            row, data = checkpoint
            self._buffer.append(row_values(row))
            position, prev_hash = row["position"], row["hash"]
            self.appended.append(as_recorded(row, data))
        self.head_position, self.head_hash = position, prev_hash
        return recorded

    def _checkpoint_row(self, rows: list[RecordedEvent], recorded_at: str,
                        versions: dict[str, int]) -> tuple[dict[str, Any], Any] | None:
        """A checkpoint after this batch when it crosses a multiple of `checkpoint_every`.

        It carries the log size and the Merkle root of every event hash since the previous
        checkpoint, and is chained like any event, so forging one breaks the chain. Its stream
        version goes in `versions`, the calling append's own, kept only if the call succeeds.
        """
        first, last = rows[0].position, rows[-1].position
        every = self.checkpoint_every
        if last // every == (first - 1) // every:
            if self.since_checkpoint is not None:
                self.since_checkpoint[1].extend(row.hash for row in rows)
            return None
        if self.since_checkpoint is None:
            # The stored hashes since the last checkpoint, then this transaction's buffered ones.
            ((since,),) = driver.fetch(self.connection, _LAST_CHECKPOINT, CHECKPOINT_STREAM)
            since = since or 0
            earlier = [hash_ for (hash_,) in driver.fetch(self.connection, _HASHES_AFTER, since)]
            earlier += [row[_HASH] for row in self._buffer]
        else:
            since, earlier = self.since_checkpoint
        leaves = [*earlier, *(row.hash for row in rows)]
        data = {"log_size": last, "from_position": since + 1, "to_position": last,
                "merkle_root": merkle_root(leaves)}
        version = versions.get(CHECKPOINT_STREAM) or self.stream_version(CHECKPOINT_STREAM)
        version = versions[CHECKPOINT_STREAM] = version + 1
        new = NewEvent(event_id=derived_event_id("checkpoint", str(last)),
                       event_type=CHECKPOINT_EVENT, data=data, occurred_at=rows[-1].occurred_at,
                       actor="log", tenant="system")
        row, decoded = row_for(new, CHECKPOINT_STREAM, version, last + 1, recorded_at,
                               rows[-1].hash)
        self.since_checkpoint = (last + 1, [])
        return row, decoded

    def _existing(self, appends: Sequence[StreamAppend]) -> list[RecordedEvent] | None:
        wanted = [(b.stream_id, b.expected_version, i, e) for b in appends
                  for i, e in enumerate(b.events)]
        ids = [entry[3].event_id for entry in wanted]
        if not ids:
            return None
        found: dict[str, RecordedEvent] = {}
        buffered = {row[_EVENT_ID]: row for row in self._buffer}
        for event_id in ids:
            if event_id in buffered:
                found[event_id] = from_row(buffered[event_id])
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
