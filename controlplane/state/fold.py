"""Fold events into fleet-state projections. Rebuilding state never calls a policy.

Each domain module lists its projectors in `PROJECTORS`; this is the one registry.
"""

from __future__ import annotations

import sys

from controlplane.decisions import ACCEPTED
from controlplane.discovery import domain_modules
from controlplane.state import memory
from controlplane.state.base import Projector
from events.model import RecordedEvent, UnreadableEvent
from events.projections import StateStore

PENDING = "pending"
# Every named thing the fleet knows (`node/n1`, `pool/p`, …): what command references resolve to.
ENTITY = "entity"
MEMORY_FIT = memory.MEMORY_FIT


def _accepted(state: StateStore, event: RecordedEvent) -> None:
    command = event.data["command"]
    state.put(PENDING, command["command_id"], {"type": command["type"],
                                               "accepted_position": event.position,
                                               "creates": event.data.get("creates", [])})


ALL_PROJECTORS: dict[str, list[Projector]] = {ACCEPTED: [_accepted]}
for _domain in domain_modules(sys.modules[__package__ or "controlplane.state"], "PROJECTORS"):
    for _event_type, _projectors in _domain.PROJECTORS.items():
        ALL_PROJECTORS.setdefault(_event_type, []).extend(_projectors)


# What a projector raises on data without the shape its event type carries.
_MISSHAPEN = (LookupError, TypeError, ValueError, AttributeError)


def apply_event(state: StateStore, event: RecordedEvent) -> None:
    """Fold one event: any decision settles its command; typed projectors do the rest.

    An event whose data a projector cannot fold (a key or a GPU it names missing, a value of
    the wrong type: a row edited outside the control plane) raises `UnreadableEvent` naming it.
    """
    if event.event_type != ACCEPTED and event.command_id is not None:
        state.delete(PENDING, event.command_id)
    try:
        for projector in ALL_PROJECTORS.get(event.event_type, ()):
            projector(state, event)
    except _MISSHAPEN as error:
        raise UnreadableEvent(event.position, event.event_type, event.stream_id,
                              f"it cannot be folded ({type(error).__name__}: {error})") from error
