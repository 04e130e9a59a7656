"""Memory-fit read model: the latest assessment of each model deployment."""

from __future__ import annotations

from controlplane.state.base import Projector
from events.model import RecordedEvent
from events.projections import StateStore

MEMORY_ASSESSED = "MemoryAssessed"
MEMORY_FIT = "memory_fit"


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


PROJECTORS: dict[str, list[Projector]] = {MEMORY_ASSESSED: [_memory_assessed]}
