"""Helpers the command tests share: submit payloads embedded, find decisions, prove replay."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from controlplane.commands import command_adapter
from controlplane.replay import compare_with_live
from controlplane.replay.verify import verify_decisions
from controlplane.runtime import open_store
from controlplane.settings import Settings
from events.model import RecordedEvent
from events.store import EventStore
from workers.pipeline import submit


def run(store: EventStore, *payloads: dict[str, Any]) -> None:
    """Submit payloads as one submission and decide them (in-process on the embedded queue)."""
    submit(Settings(), store, [command_adapter.validate_python(p) for p in payloads])


def decision(store: EventStore, command_id: str) -> RecordedEvent:
    """The first decision event of a command."""
    return next(e for e in store.events_for_command(command_id)
                if e.event_type != "CommandAccepted")


def assert_replay_exact(store: EventStore) -> None:
    """Every decision re-derives identically, the rebuilt projections equal the live ones and
    every cause precedes its effect."""
    assert verify_decisions(store).drifts == []
    assert compare_with_live(store) == []
    assert_causes_precede_effects(store)


def assert_causes_precede_effects(store: EventStore) -> None:
    """Every event's causation and recorded `causes` are earlier in the log than the event."""
    events = list(store.read_all())
    positions = {e.event_id: e.position for e in events}
    forward = [(e.position, e.event_type, cause, positions[cause]) for e in events
               for cause in [e.causation_id, *(e.data.get("causes") or [])]
               if cause in positions and positions[cause] >= e.position]
    assert forward == []


@contextmanager
def store_at(url: str) -> Iterator[EventStore]:
    """A store on `url` for a look at what a CLI run left, its connections closed after."""
    store = open_store(url)
    try:
        yield store
    finally:
        store.engine.dispose()


def log_size(url: str) -> int:
    """How many events the log at `url` holds."""
    with store_at(url) as store:
        return store.head()[0]
