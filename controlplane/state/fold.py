"""Fold events into fleet-state projections. Rebuilding state never calls a policy."""

from __future__ import annotations

from collections.abc import Callable

from controlplane.decisions import ACCEPTED
from controlplane.handlers import MEMORY_ASSESSED
from events.model import RecordedEvent
from events.projections import StateStore

Projector = Callable[[StateStore, RecordedEvent], None]
PENDING = "pending"
MEMORY_FIT = "memory_fit"


def _accepted(state: StateStore, event: RecordedEvent) -> None:
    command = event.data["command"]
    state.put(PENDING, command["command_id"], {"type": command["type"],
                                               "accepted_position": event.position})


def _memory_assessed(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    state.put(MEMORY_FIT, event.data["inputs"]["model_name"], {
        "fits": result["fits"],
        "required_gib_per_gpu": result["required_gib_per_gpu"],
        "usable_gib_per_gpu": result["usable_gib_per_gpu"],
        "max_concurrency": result["max_concurrency"],
        "command_id": event.command_id,
        "position": event.position,
    })


PROJECTORS: dict[str, list[Projector]] = {
    ACCEPTED: [_accepted],
    MEMORY_ASSESSED: [_memory_assessed],
}


def apply_event(state: StateStore, event: RecordedEvent) -> None:
    """Fold one event: any decision settles its command; typed projectors do the rest."""
    if event.event_type != ACCEPTED and event.command_id is not None:
        state.delete(PENDING, event.command_id)
    for projector in PROJECTORS.get(event.event_type, ()):
        projector(state, event)
