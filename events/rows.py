"""Stored rows and events: the hashed header, a row for a new event, events from rows."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from events import driver
from events.canonical import canonical_json, chain_hash, decode, encode
from events.database import in_lists
from events.model import NewEvent, RecordedEvent, UnreadableEvent
from events.tables import events_table

HEADER_FIELDS = (
    "position", "stream_id", "stream_version", "event_id", "event_type", "schema_version",
    "command_id", "causation_id", "correlation_id", "actor", "tenant", "occurred_at",
    "recorded_at",
)


def header_of(row: dict[str, Any] | RowMapping) -> dict[str, Any]:
    """The hashed envelope fields of a stored row (everything but data and the hashes)."""
    return {name: row[name] for name in HEADER_FIELDS}


def as_written(event: RecordedEvent) -> bool:
    """Whether `event`'s content still matches its own hash, as the appender wrote it: false
    for a row edited since (`fleetctl verify` checks the whole chain). Tells an edited row
    from one an earlier or later version of fleetctl wrote, which reads differently today."""
    try:
        text = canonical_json(event.data)
    except (TypeError, ValueError):
        return False
    return chain_hash(event.prev_hash, header_of(event.as_dict()), text) == event.hash


COLUMNS = tuple(column.name for column in events_table.columns)
EVENT_COLUMNS_SQL = ", ".join(COLUMNS)
# Appending: a row's values in column order, for the driver's executemany (`events.driver`).
INSERT_EVENTS = (f"INSERT INTO events ({EVENT_COLUMNS_SQL})"
                 f" VALUES ({', '.join('?' * len(COLUMNS))})")
row_values = operator.itemgetter(*COLUMNS)
EVENTS_BY_COMMAND = (f"SELECT {EVENT_COLUMNS_SQL} FROM events WHERE command_id IN ({{in}})"
                     " ORDER BY position")
_EVENTS_BY_COMMAND_EXCEPT = (f"SELECT {EVENT_COLUMNS_SQL} FROM events WHERE event_type <> ?"
                             " AND command_id IN ({in}) ORDER BY position")
_DATA = COLUMNS.index("data")
# Rows read as tuples become events positionally: the table's columns are the event's fields.
assert list(COLUMNS) == list(RecordedEvent.__dataclass_fields__)


_new_object = object.__new__
_set_attribute = object.__setattr__


def _event(fields: dict[str, Any]) -> RecordedEvent:
    """A RecordedEvent whose attributes are `fields` (a dict of exactly its fields, nothing
    else holds), set without the frozen dataclass's per-field `object.__setattr__` and without
    copying them: most of the cost of building one (replay builds one per stored row)."""
    event: RecordedEvent = _new_object(RecordedEvent)
    _set_attribute(event, "__dict__", fields)
    return event


def from_row(row: Sequence[Any]) -> RecordedEvent:
    """A stored row, read as a tuple of every column in table order, as an event;
    `UnreadableEvent` when its data is not a JSON object."""
    fields = dict(zip(COLUMNS, row, strict=True))
    fields["data"] = _data_of(fields)
    return _event(fields)


def to_recorded(row: RowMapping | dict[str, Any]) -> RecordedEvent:
    """A stored row, read by column name, as an event; `UnreadableEvent` when its data is not
    a JSON object."""
    return with_data(row, _data_of(row))


def _data_of(row: RowMapping | dict[str, Any]) -> dict[str, Any]:
    """The row's data, decoded; every event's data is a JSON object (a row edited outside the
    control plane may hold anything)."""
    try:
        data = decode(row["data"])
    except (ValueError, TypeError) as error:  # JSONDecodeError is a ValueError; NULL a TypeError
        raise UnreadableEvent(row["position"], row["event_type"], row["stream_id"],
                              f"its data is not JSON ({error})") from None
    if type(data) is not dict:
        raise UnreadableEvent(row["position"], row["event_type"], row["stream_id"],
                              f"its data is a JSON {type(data).__name__}, not an object")
    return data


def with_data(row: RowMapping | dict[str, Any], data: dict[str, Any]) -> RecordedEvent:
    """The row as an event whose data is `data`: the row's text, decoded (by its writer).

    A row given as a dict holds every column and nothing else (as `row_for` makes them).
    """
    fields = row.copy() if type(row) is dict else {name: row[name] for name in COLUMNS}
    fields["data"] = data
    return _event(fields)


def as_recorded(row: dict[str, Any], data: dict[str, Any]) -> RecordedEvent:
    """The event `row_for` made `row` for, taking `row` over (its caller keeps only the values
    it stores, `row_values`): its data becomes `data`, as the writer decoded it. One dict copy
    less per appended event than `with_data`."""
    row["data"] = data
    return _event(row)


def events_by_command(connection: Connection, command_ids: Sequence[str],
                      excluded_type: str | None = None) -> dict[str, list[RecordedEvent]]:
    """Each command's events in position order, without those of `excluded_type` if given."""
    grouped: dict[str, list[RecordedEvent]] = {command_id: [] for command_id in command_ids}
    ids = list(grouped)
    query, excluded = ((EVENTS_BY_COMMAND, ()) if excluded_type is None
                       else (_EVENTS_BY_COMMAND_EXCEPT, (excluded_type,)))
    for chunk in in_lists(ids):
        for row in driver.fetch(connection, query, *excluded, in_values=chunk):
            event = from_row(row)
            grouped[event.command_id or ""].append(event)
    return grouped


def row_for(new: NewEvent, stream_id: str, version: int, position: int, recorded_at: str,
            prev_hash: str) -> tuple[dict[str, Any], Any]:
    """The row that stores `new` at its place, chained after `prev_hash` (`chain_hash`), and
    its data as a reader of the log decodes it."""
    text, data = encode(new.data)
    row = {  # `header_of` the row, built first and hashed, then given the rest of the row
        "position": position, "stream_id": stream_id, "stream_version": version,
        "event_id": new.event_id, "event_type": new.event_type,
        "schema_version": new.schema_version,
        "command_id": new.command_id, "causation_id": new.causation_id,
        "correlation_id": new.correlation_id, "actor": new.actor, "tenant": new.tenant,
        "occurred_at": new.occurred_at, "recorded_at": recorded_at,
    }
    row["hash"] = chain_hash(prev_hash, row, text)
    row["data"], row["prev_hash"] = text, prev_hash
    return row, data
