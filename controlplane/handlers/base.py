"""The signatures a domain's handler module may export.

- `HANDLERS: dict[str, Handler]`: command type -> decide (pure apart from reading the context).
- `PRECHECKS: dict[str, Precheck]`: command type -> problems found against current state when
  the command is submitted (an unknown node, pool, replica); any problem refuses the whole
  submission and nothing is written.
- `EFFECTS: dict[str, Effect]`: event type -> an action with outside effects (a provider call)
  run after the transaction that appended that event has committed, by the worker that
  committed it. It records what it observed through the store.
- `RESUMABLE: set[str]`: event types whose effect also runs when their command is delivered
  again after it was decided (a worker died before running it). Such an effect makes sure by
  itself, under the append lock, that it acts at most once; the others run only once, by the
  deciding worker, and never again.
- `UNFINISHED: list[Unfinished]`: functions naming the decided commands whose `RESUMABLE`
  effects are still undone, found from the state; `reconcile` delivers them again.
- `OBSERVATIONS: set[str]`: event types that effects append; replay folds them but never
  re-derives them, since no policy produced them.
- `READS: dict[str, Reads]`: command type -> projection rows (name, key) its handler will read,
  fetched for a whole batch in a few queries before deciding. Only a speed-up: a row left out
  is read when asked for, and a row named but not read costs one row of a query.
- `STREAMS: dict[str, Streams]`: command type -> streams its decision appends to that the
  command neither names (`references`) nor creates (`creates`), their versions read ahead with
  the batch's. Only a speed-up, as `READS`: a stream left out costs a query of its own (on
  PostgreSQL a round trip under the append lock) in each transaction whose store does not
  already know its version (a store knows them only while the log is where it left it).
- `RULES_VERSIONS: dict[str, int]`: command type -> the version of its decision rules (1 when
  not given), recorded in each of its decisions (`rules_version`). Bump it, saying what changed,
  whenever the handler (or a policy it calls) would decide differently on the same log: a
  decision recorded under an older version that re-derives differently is then reported by
  `replay --verify` as made under older rules (an upgrade), not as a fault. A decision recorded
  before versions were recorded carries none and counts as version 1.
- `WARMS: dict[str, Warm]`: command type -> reads that build the views its handler uses (the
  GPU index), run before the append lock by a process that has built none yet
  (`EventStore.warm`). Only a speed-up: the lock's transaction revalidates what they built.
"""

from __future__ import annotations

from collections.abc import Callable

from controlplane.commands.base import CommandBase
from controlplane.decisions import DecisionContext
from controlplane.policy_book import PolicyBook
from events.model import RecordedEvent, StreamAppend
from events.projections import StateView
from events.store import EventStore

Handler = Callable[[CommandBase, DecisionContext], list[StreamAppend]]
Precheck = Callable[[CommandBase, StateView], list[tuple[str, str]]]
Effect = Callable[[EventStore, RecordedEvent], None]
Reads = Callable[[CommandBase], list[tuple[str, str]]]
Streams = Callable[[CommandBase], list[str]]
Unfinished = Callable[[StateView], list[str]]
Warm = Callable[[StateView, PolicyBook], object]


class RefuseExisting:
    """The precheck of a command that brings an entity into being: refused at submit, naming
    `field`, when the fleet already has a `projection` row under that field's value.

    `service.precheck` reads every such row of a submission in one query (`key`) and refuses,
    too, a command whose entity (`entity`, a key of `CommandBase.creates`) an earlier line of
    the submission or a command not yet decided creates; one accepted with another that
    creates it is left to the handler, a recorded rejection."""

    def __init__(self, projection: str, field: str, noun: str) -> None:
        self.projection, self.field, self.noun = projection, field, noun

    def key(self, command: CommandBase) -> tuple[str, str]:
        """The projection row (name, key) whose presence refuses `command`."""
        return self.projection, getattr(command, self.field)

    def entity(self, command: CommandBase) -> str:
        return f"{self.noun}/{getattr(command, self.field)}"

    def created_meanwhile(self, command: CommandBase) -> tuple[str, str]:
        """The problem when an earlier line or an undecided command creates the entity."""
        return self.field, (f"{self.noun} {getattr(command, self.field)!r} is created by an "
                            "earlier line or by a command not yet decided")

    def __call__(self, command: CommandBase, state: StateView) -> list[tuple[str, str]]:
        value = getattr(command, self.field)
        row = state.get(self.projection, value)
        if row is None:
            return []
        # A released replica keeps its row, and its id: say so, or "exists" reads as a bug.
        status = f" ({row['state']}; an id is used once)" if isinstance(row.get("state"), str) \
            else ""
        return [(self.field, f"{self.noun} {value!r} already exists{status}")]

