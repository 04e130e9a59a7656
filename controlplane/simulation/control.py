"""The simulation's path to the log: every control decision is a command, accepted, then decided.

Commands are accepted into the inbox and decided by `controlplane.service.decide` in batches,
in-process, in the order given; follow-up commands a decision issues (a scale-up's placements,
a measurement's evaluation) are decided right after, in the same call. Every decision seen is
counted by command type, so the report's counts can be checked against the log.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.commands import CommandBase
from controlplane.decisions import ACCEPTED
from controlplane.service import accept, decide
from events.model import RecordedEvent
from events.store import EventStore


@dataclass(frozen=True)
class Decided:
    """One decided command: its type and the events its decision appended (accepts excluded)."""

    command_id: str
    command_type: str
    events: tuple[RecordedEvent, ...]

    def first(self, *event_types: str) -> RecordedEvent | None:
        return next((e for e in self.events if e.event_type in event_types), None)

    def of_type(self, *event_types: str) -> Iterator[RecordedEvent]:
        return (e for e in self.events if e.event_type in event_types)

    @property
    def result(self) -> dict[str, Any]:
        decision = next((e for e in self.events if "outcome" in e.data), None)
        return decision.data["result"] if decision is not None else {}


class ControlPlane:
    """Submits commands to the log and returns their decisions, follow-ups included."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.decisions: Counter[str] = Counter()

    def run(self, commands: Sequence[CommandBase]) -> list[Decided]:
        """Accept `commands`, decide them in order, then decide what their decisions issued."""
        if not commands:
            return []
        types = {c.command_id: c.command_type for c in commands}
        accept(self.store, commands)
        decided: list[Decided] = []
        pending = [c.command_id for c in commands]
        while pending:
            outcomes = decide(self.store, pending)
            pending = []
            for outcome in outcomes:
                if not outcome.decided_now:
                    raise RuntimeError(f"command {outcome.command_id} was already decided; "
                                       "a simulation needs a log of its own")
                events = tuple(e for e in outcome.events if e.event_type != ACCEPTED)
                for issued in (e for e in outcome.events if e.event_type == ACCEPTED):
                    if issued.command_id is not None:
                        types[issued.command_id] = issued.data["command"]["type"]
                        pending.append(issued.command_id)
                command_type = types[outcome.command_id]
                self.decisions[command_type] += 1
                decided.append(Decided(outcome.command_id, command_type, events))
        return decided
