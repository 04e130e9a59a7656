"""Events folded into fresh in-memory projections: the one fold every replay starts from."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from controlplane.state.fold import apply_event
from events.model import RecordedEvent
from events.projections import MemoryProjections

# Told how many events have been folded, every 10,000.
ProgressFn = Callable[[int], None]


def fold(events: Iterator[RecordedEvent], progress: ProgressFn | None = None) \
        -> MemoryProjections:
    """Fold events into fresh in-memory projections."""
    state = MemoryProjections()
    for count, event in enumerate(events, 1):
        apply_event(state, event)
        if progress is not None and count % 10_000 == 0:
            progress(count)
    return state
