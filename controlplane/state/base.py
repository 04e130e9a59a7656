"""The projector signature: fold one recorded event into projections."""

from __future__ import annotations

from collections.abc import Callable

from events.model import RecordedEvent
from events.projections import StateStore

Projector = Callable[[StateStore, RecordedEvent], None]
