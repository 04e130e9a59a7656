"""The event envelope and the typed errors of the log."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# Event ids derived from a command id are stable, so handling a command twice yields the same ids.
EVENT_NAMESPACE = uuid.UUID("6f1c2a4e-9d3b-4c8e-a1f0-2b7d5e9c3a10")
_NAMESPACE_BYTES = EVENT_NAMESPACE.bytes
# A hex digit with its top two bits set to the RFC 4122 variant (binary 10).
_VARIANT_DIGIT = {digit: f"{int(digit, 16) & 0x3 | 0x8:x}" for digit in "0123456789abcdef"}


def derived_event_id(command_id: str, slot: str) -> str:
    """A UUID that depends only on the command id and the event's slot in its decision.

    It is `str(uuid.uuid5(EVENT_NAMESPACE, f"{command_id}/{slot}"))`, computed without building
    UUID objects (every decision derives several): SHA-1 of namespace and name, the first 16
    bytes with the version (5) and RFC 4122 variant bits set, written straight into the hex
    text (the version is its 13th digit, the variant the top two bits of its 17th).
    """
    text = hashlib.sha1(_NAMESPACE_BYTES + f"{command_id}/{slot}".encode()).hexdigest()
    return (f"{text[:8]}-{text[8:12]}-5{text[13:16]}-{_VARIANT_DIGIT[text[16]]}{text[17:20]}"
            f"-{text[20:32]}")


@dataclass(frozen=True, init=False)
class NewEvent:
    """An event to append; the store assigns its position, stream version and hashes."""

    event_id: str
    event_type: str
    data: dict[str, Any]
    occurred_at: str
    schema_version: int = 1
    command_id: str | None = None
    causation_id: str | None = None
    correlation_id: str | None = None
    actor: str = "system"
    tenant: str = "default"

    # Written out, not generated: a frozen dataclass's own __init__ sets each field through
    # `object.__setattr__`, and a decision builds two or three events (tests/unit/
    # test_event_model.py checks this one sets exactly the fields, with their defaults).
    def __init__(self, event_id: str, event_type: str, data: dict[str, Any], occurred_at: str,
                 schema_version: int = 1, command_id: str | None = None,
                 causation_id: str | None = None, correlation_id: str | None = None,
                 actor: str = "system", tenant: str = "default") -> None:
        _set_attribute(self, "__dict__", {
            "event_id": event_id, "event_type": event_type, "data": data,
            "occurred_at": occurred_at, "schema_version": schema_version,
            "command_id": command_id, "causation_id": causation_id,
            "correlation_id": correlation_id, "actor": actor, "tenant": tenant})


_set_attribute = object.__setattr__  # sets a frozen instance's whole __dict__ at once


@dataclass(frozen=True, init=False)
class StreamAppend:
    """Events for one stream, appended only if the stream is at `expected_version`.

    `expected_version=None` appends at the end whatever the version (used by the inbox).
    """

    stream_id: str
    expected_version: int | None
    events: Sequence[NewEvent] = field(default_factory=tuple)

    # Written out, as NewEvent's is: every decision builds one per stream it appends to (two
    # or three), and the generated one sets each field through `object.__setattr__`.
    def __init__(self, stream_id: str, expected_version: int | None,
                 events: Sequence[NewEvent] = ()) -> None:
        _set_attribute(self, "__dict__", {"stream_id": stream_id,
                                          "expected_version": expected_version, "events": events})


@dataclass(frozen=True)
class RecordedEvent:
    """An event as stored in the log."""

    position: int
    stream_id: str
    stream_version: int
    event_id: str
    event_type: str
    schema_version: int
    data: dict[str, Any]
    command_id: str | None
    causation_id: str | None
    correlation_id: str | None
    actor: str
    tenant: str
    occurred_at: str
    recorded_at: str
    prev_hash: str
    hash: str

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class LogError(Exception):
    """Base of the log's typed errors."""


class ConcurrencyConflict(LogError):
    """A stream was not at the version an append expected; reload and decide again."""

    def __init__(self, stream_id: str, expected_version: int | None, actual_version: int) -> None:
        super().__init__(
            f"stream {stream_id!r} is at version {actual_version}, expected {expected_version}"
        )
        self.stream_id = stream_id
        self.expected_version = expected_version
        self.actual_version = actual_version


class DuplicateEventError(LogError):
    """An event id already stored elsewhere, or a batch that only partly overlaps the log."""


class UnreadableEvent(LogError):
    """A stored event that cannot be read or folded: its data is not a JSON object, or lacks
    what its type carries. The log was changed outside the control plane (the hash chain shows
    where), or a defect wrote it."""

    def __init__(self, position: int, event_type: str, stream_id: str, detail: str) -> None:
        super().__init__(f"event {position} ({event_type} on {stream_id}) cannot be read: "
                         f"{detail}")
        self.position = position


class NewerLog(LogError):
    """The log holds a command of a type this version does not know: a newer fleetctl wrote
    it, and folding it here would leave out what that command's decision did."""

    def __init__(self, position: int, command_type: str) -> None:
        super().__init__(f"event {position} accepts a {command_type!r} command, a type this "
                         "fleetctl does not know: a newer fleetctl wrote this log; read it with "
                         "that version")
        self.position = position


class UnreadableRow(LogError):
    """A stored projection row that is not a JSON object: changed outside the control plane.
    Projections are disposable: `fleetctl replay --rebuild` writes every row again from the
    log."""

    def __init__(self, name: str, key: str, detail: str) -> None:
        super().__init__(f"projection row {name}/{key} cannot be read ({detail}): it was changed "
                         "outside fleetctl; `fleetctl replay --rebuild` writes the projections "
                         "again from the log")
        self.name, self.key = name, key


class StatementFailed(LogError):
    """A statement of a write transaction failed and its error was caught inside the
    transaction: the transaction is rolled back, never committed without that statement."""
