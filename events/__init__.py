"""The audited log: envelope, store (append, read, hash chain), projections storage, verify."""

from events.model import (
    ConcurrencyConflict,
    DuplicateEventError,
    LogError,
    NewEvent,
    RecordedEvent,
    StreamAppend,
    derived_event_id,
)
from events.store import EventStore
from events.transaction import LogTransaction

__all__ = [
    "ConcurrencyConflict", "DuplicateEventError", "EventStore", "LogError", "LogTransaction",
    "NewEvent", "RecordedEvent", "StreamAppend", "derived_event_id",
]
