"""Deciding one batch of parsed commands under the append lock, with its reads fetched ahead.

`decide_batch` is the only way decisions are appended. Every decision is exactly re-derivable:
it is decided in the transaction that holds the append lock and appends it, so the state it
read is the log before its position, which it records.

Deciding on a snapshot without the lock, then appending if nothing read had moved (the
parallel design DESIGN.md allows), was built and measured here and removed: appending and
folding a decision is most of its cost, so the lock was held nearly as long, and on a shared
pool or fleet most snapshots had moved and were decided twice (PostgreSQL, 1/2/4 workers:
mixed workload 980/795/789 decisions/s with snapshots, 938/1,054/955 without; independent
memory assessments 786/792/804 with, 811/1,068/1,129 without).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy.engine import Connection

from controlplane.commands import CommandBase
from controlplane.decisions import ACCEPTED, REJECTED, DecisionContext
from controlplane.handlers import READS, STREAMS, WARMS, decide_command, rules_version
from controlplane.policy_book import POLICY_MODELS, POLICY_PROJECTION, PolicyBook
from controlplane.state.fold import PENDING, apply_event, pending_creators
from events.model import ConcurrencyConflict, RecordedEvent, StreamAppend
from events.store import EventStore
from events.transaction import LogTransaction, ReadAhead

log = structlog.get_logger(__name__)
MAX_CONFLICT_RETRIES = 5
# Every policy's recorded version, read ahead with a batch (a cached row is not read again):
# a fresh work horse would otherwise read each policy its batch consults on its own.
POLICY_ROWS = [(POLICY_PROJECTION, name) for name in POLICY_MODELS]


def _no_reads(command: CommandBase) -> list[tuple[str, str]]:
    return []


def _no_streams(command: CommandBase) -> list[str]:
    return []


@dataclass(frozen=True)
class Outcome:
    """What happened to one command: its decision events, and whether this call made them.

    `waits_for` names the undecided commands, accepted before it, that create what it
    references: its decision (a rejection) was not recorded, and it stays undecided until they
    are (`_waits_for`).
    """

    command_id: str
    decided_now: bool
    events: tuple[RecordedEvent, ...]
    waits_for: tuple[str, ...] = ()

    def summary(self) -> dict[str, Any]:
        decision = next((e for e in self.events if "outcome" in e.data), None)
        return {
            "command_id": self.command_id,
            "outcome": decision.data["outcome"] if decision else None,
            "reasons": [r["code"] for r in decision.data["reasons"]] if decision else [],
            "event_ids": [e.event_id for e in self.events],
            "positions": [e.position for e in self.events],
        }


@dataclass(frozen=True)
class Prepared:
    """A command read from the inbox and parsed before the append lock is taken."""

    command_id: str
    accepted: RecordedEvent
    command: CommandBase


def decide_batch(store: EventStore, prepared: list[Prepared], policies: PolicyBook,
                 connection: Connection | None = None) -> list[Outcome]:
    """Decide and append the batch in one transaction holding the append lock (on `connection`,
    the one the batch was read on, when given: see `EventStore.transaction`).

    A process that has built no view yet first builds, on `connection`, those its handlers
    declare (`WARMS`: the GPU index), before the lock (see `EventStore.warm`). A version
    conflict (another writer moved a stream) starts over with fresh state, a bounded number of
    times.
    """
    ids = [p.command_id for p in prepared]
    warms = {WARMS[t] for t in {p.command.command_type for p in prepared} if t in WARMS}
    if warms and connection is not None:  # a fresh process's views, built before the lock
        store.warm(connection, lambda state: [warm(state, policies) for warm in warms])
    read_ahead = ReadAhead(
        [key for p in prepared for key in _streams_hinted(p.command)],
        [*((PENDING, command_id) for command_id in ids), *POLICY_ROWS,
         *(row for p in prepared for row in READS.get(p.command.command_type, _no_reads)(p.command))])
    for attempt in range(MAX_CONFLICT_RETRIES):
        try:
            with store.transaction(connection, read_ahead) as tx:
                outcomes = _decide_in(tx, prepared, policies)
        except ConcurrencyConflict as conflict:
            log.warning("decision_conflict_retry", attempt=attempt, stream_id=conflict.stream_id)
            continue
        _log_outcomes(outcomes)
        return outcomes
    raise RuntimeError(f"gave up after {MAX_CONFLICT_RETRIES} version conflicts")


def _log_outcomes(outcomes: list[Outcome]) -> None:
    """One DEBUG line per command, once its decision is committed (never under the lock, and
    never for a transaction that rolled back).

    DEBUG, not INFO: at a thousand decisions a second a line each was a tenth of a worker's
    time; each batch's INFO line (`batch_decided`) counts them, and the log itself records every
    decision (`fleetctl explain`).
    """
    batch_log = log.bind()  # bound once per batch, and each line built only if kept
    if not batch_log.is_enabled_for(logging.DEBUG):
        return
    for outcome in outcomes:
        if outcome.decided_now:
            batch_log.debug("command_decided", command_id=outcome.command_id,
                            stream_ids=sorted({e.stream_id for e in outcome.events}),
                            event_ids=[e.event_id for e in outcome.events])
        else:
            batch_log.debug("command_already_decided", command_id=outcome.command_id)


def _decide_in(tx: LogTransaction, prepared: list[Prepared], policies: PolicyBook) -> list[Outcome]:
    """Decide each command against `tx`'s state (the rows and versions they name read ahead
    by `decide_batch`)."""
    outcomes = []
    ids = [p.command_id for p in prepared]
    # Decided since `_prepare` read the inbox, by another worker: checked under the lock. A
    # command leaves the pending index with its decision, so only those gone are looked up.
    settled = [command_id for command_id in ids if tx.projections.get(PENDING, command_id) is None]
    decided_meanwhile = tx.events_for_commands(settled, ACCEPTED) if settled else {}
    creators = _PendingCreators(tx)
    for item in prepared:
        decided = decided_meanwhile.get(item.command_id)
        if decided:
            outcomes.append(Outcome(item.command_id, False, tuple(decided)))
            continue
        # The time the decision is recorded at, fixed before it is made: the handler reads it
        # (a lease on the control plane's own clock) and its events carry it.
        recorded_at = tx.clock()
        # Built with its command type's rules version, so `decide_command` need not copy it.
        context = DecisionContext(tx.projections, tx.head_position, tx.stream_version, policies,
                                  item.accepted.event_id,
                                  rules_version=rules_version(item.command.command_type),
                                  recorded_at=recorded_at)
        decision = decide_command(item.command, context)
        waits_for = _waits_for(item, decision, creators)
        if waits_for:
            outcomes.append(Outcome(item.command_id, False, (), waits_for))
            continue
        # No event of this command exists (checked above): skip the look-up.
        appended = tx.append(decision, check_existing=False, recorded_at=recorded_at)
        for event in appended:
            apply_event(tx.projections, event)
        outcomes.append(Outcome(item.command_id, True, tuple(appended)))
    return outcomes


class _PendingCreators:
    """Each key an undecided command creates, with its accepted position and id: read from
    the pending table on first need (a rejection of a command that references something)."""

    def __init__(self, tx: LogTransaction) -> None:
        self._tx = tx
        self._by_key: dict[str, tuple[int, str]] | None = None

    def before(self, key: str, position: int) -> str | None:
        """The id of the command accepted before `position` that creates `key`, if it is
        still undecided."""
        if self._by_key is None:
            self._by_key = pending_creators(self._tx.projections)
        found = self._by_key.get(key)
        if found is None or found[0] >= position \
                or self._tx.projections.get(PENDING, found[1]) is None:
            return None
        return found[1]


def _waits_for(item: Prepared, decision: list[StreamAppend],
               creators: _PendingCreators) -> tuple[str, ...]:
    """The undecided commands accepted before `item` that create what it references, when its
    decision is a rejection; else none.

    With several workers a later batch can take the append lock first: a release decided
    before its request's admission was rejected (`unknown_request_id`) for good, and the
    admission then held its live tokens forever. Such a command is decided after its creators
    instead (`service.decide` enqueues them together, creators first).
    """
    # The rejection first: most decisions are not one, and every command references something.
    if not _rejects(decision):
        return ()
    waiting = {creators.before(key, item.accepted.position) for _, key in item.command.references()}
    return tuple(sorted(c for c in waiting if c is not None))


def _rejects(decision: list[StreamAppend]) -> bool:
    """Whether any event of the decision is a rejection (a loop: no generator per decision)."""
    for append in decision:
        for event in append.events:
            if event.event_type == REJECTED:
                return True
    return False


def _streams_hinted(command: CommandBase) -> list[str]:
    """Streams the command's decision will likely append to: what it names and creates, and
    what its handler declares (`STREAMS`).

    Entity keys (`pool/p`, `request/r`) are stream ids; a hint that is not one costs nothing
    but a row in the prefetch, and a stream missed here is read when first used.
    """
    return [*command.creates(), *(key for _, key in command.references()),
            *STREAMS.get(command.command_type, _no_streams)(command)]
