"""Deciding one batch of parsed commands: on a snapshot in parallel, or under the append lock.

`decide_batch` is the only way decisions are appended. Every decision is exactly re-derivable:
it records the log position whose state it read, and that state is what it read.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import structlog

from controlplane.commands import CommandBase
from controlplane.decisions import ACCEPTED, DecisionContext
from controlplane.handlers import HANDLERS, READS
from controlplane.policy_book import PolicyBook
from controlplane.state.fold import apply_event
from events.model import ConcurrencyConflict, RecordedEvent, StreamAppend
from events.projections import StateView
from events.reads import RecordingView, reads_unchanged
from events.store import EventStore, LogTransaction

log = structlog.get_logger(__name__)
MAX_CONFLICT_RETRIES = 5


def _no_reads(command: CommandBase) -> list[tuple[str, str]]:
    return []


@dataclass(frozen=True)
class Outcome:
    """What happened to one command: its decision events, and whether this call made them."""

    command_id: str
    decided_now: bool
    events: tuple[RecordedEvent, ...]

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


@dataclass(frozen=True)
class Decided:
    """A command's outcome, with what it appended and the position it read, for re-appending."""

    outcome: Outcome
    appends: tuple[StreamAppend, ...] = ()
    read_position: int = 0


def _decide_in(tx: LogTransaction, prepared: list[Prepared], policies: PolicyBook,
               reads: RecordingView | None = None) -> list[Decided]:
    """Decide each command against `tx`'s state, through `reads` when it records them."""
    decided_list = []
    # Decided since `_prepare` read the inbox (by another worker).
    decided_meanwhile = tx.events_for_commands([p.command_id for p in prepared], ACCEPTED)
    tx.prefetch_versions([key for p in prepared for key in _streams_hinted(p.command)])
    tx.projections.prefetch(row for p in prepared
                            for row in READS.get(p.command.command_type, _no_reads)(p.command))
    state: StateView = reads if reads is not None else tx.projections
    versions = reads.stream_version if reads is not None else tx.stream_version
    for item in prepared:
        decided = decided_meanwhile.get(item.command_id)
        if decided:
            log.info("command_already_decided", command_id=item.command_id)
            decided_list.append(Decided(Outcome(item.command_id, False, tuple(decided))))
            continue
        read_position = tx.head_position
        context = DecisionContext(state, read_position, versions, policies, item.accepted.event_id)
        appends = tuple(HANDLERS[item.command.command_type](item.command, context))
        # No event of this command exists (checked above): skip the look-up.
        appended = tx.append(appends, check_existing=False)
        for event in appended:
            apply_event(tx.projections, event)
        log.info("command_decided", command_id=item.command_id,
                 stream_ids=sorted({e.stream_id for e in appended}),
                 event_ids=[e.event_id for e in appended])
        decided_list.append(Decided(Outcome(item.command_id, True, tuple(appended)), appends,
                                    read_position))
    return decided_list


def _streams_hinted(command: CommandBase) -> list[str]:
    """Streams the command's decision will likely append to: what it names and creates.

    Entity keys (`pool/p`, `request/r`) are stream ids; a hint that is not one costs nothing
    but a row in the prefetch, and a stream missed here is read when first used.
    """
    return [*command.creates(), *(key for _, key in command.references())]


def decide_batch(store: EventStore, prepared: list[Prepared],
                 policies: PolicyBook) -> list[Outcome]:
    """Decide and append the batch; a version conflict starts over, a bounded number of times.

    If the append lock is free, the batch is decided under it. If another writer holds it, the
    batch is decided on a snapshot meanwhile, so deciders work in parallel instead of queueing,
    and appended when the lock comes free (see `_decide_on_snapshot` for why that is exact).
    """
    for attempt in range(MAX_CONFLICT_RETRIES):
        try:
            with store.try_transaction() as tx:
                if tx is not None:
                    return [item.outcome for item in _decide_in(tx, prepared, policies)]
            return _decide_on_snapshot(store, prepared, policies)
        except ConcurrencyConflict as conflict:
            log.warning("decision_conflict_retry", attempt=attempt, stream_id=conflict.stream_id)
    raise RuntimeError(f"gave up after {MAX_CONFLICT_RETRIES} version conflicts")


def _decide_on_snapshot(store: EventStore, prepared: list[Prepared],
                        policies: PolicyBook) -> list[Outcome]:
    """Decide on a snapshot without the lock, then append under it, exactly as if decided there.

    Under the lock: if nothing was appended since the snapshot, its rows are adopted as they
    are. Otherwise, if every row, projection and stream version the decisions read is unchanged
    and none of the commands was decided meanwhile, deciding now would read the same values and
    decide the same, so the same decisions are appended at the current head, each recording the
    position it is exact at. Else the batch is decided again under the lock.
    """
    with store.snapshot() as snapshot:
        reads = RecordingView(snapshot.projections, snapshot.stream_version)
        planned = _decide_in(snapshot, prepared, policies, reads)
        with store.transaction() as tx:
            if snapshot.adoptable() and tx.start == snapshot.start:
                for event in tx.adopt(snapshot):
                    apply_event(tx.projections, event)
                return [item.outcome for item in planned]
            if _still_valid(tx, snapshot, reads, prepared):
                return _append_again(tx, planned)
            log.info("decision_reads_moved", commands=len(prepared))
            return [item.outcome for item in _decide_in(tx, prepared, policies)]


def _still_valid(tx: LogTransaction, snapshot: LogTransaction, reads: RecordingView,
                 prepared: list[Prepared]) -> bool:
    decided = tx.events_for_commands([p.command_id for p in prepared], ACCEPTED)
    return not any(decided.values()) and reads_unchanged(snapshot.connection, tx.connection, reads)


def _append_again(tx: LogTransaction, planned: list[Decided]) -> list[Outcome]:
    """Append decisions made on an older snapshot whose reads are unchanged at this head."""
    outcomes = []
    for item in planned:
        if not item.outcome.decided_now:
            outcomes.append(item.outcome)
            continue
        appends = [_read_at(append, item.read_position, tx.head_position) for append in item.appends]
        appended = tx.append(appends, check_existing=False)
        for event in appended:
            apply_event(tx.projections, event)
        outcomes.append(Outcome(item.outcome.command_id, True, tuple(appended)))
    return outcomes


def _read_at(append: StreamAppend, read: int, now: int) -> StreamAppend:
    """The append with its decision events recording `now` as the position they read."""
    events = [replace(e, data={**e.data, "read_position": now})
              if e.data.get("read_position") == read else e for e in append.events]
    return StreamAppend(append.stream_id, append.expected_version, events)
