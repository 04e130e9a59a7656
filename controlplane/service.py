"""The application service: accept commands into the inbox, decide them exactly once."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import structlog
from sqlalchemy.engine import Connection

from controlplane.commands import CommandBase, parse_recorded
from controlplane.commands.refused import RefusedCommand
from controlplane.deciding import Outcome, Prepared, decide_batch
from controlplane.decisions import ACCEPTED, INBOX_STREAM, inbox_record, is_issued_id
from controlplane.errors import FieldProblem, SubmissionRejected
from controlplane.handlers import EFFECTS, PRECHECKS, RESUMABLE, UNFINISHED
from controlplane.handlers.base import RefuseExisting
from controlplane.policy_book import PolicyBook
from controlplane.state.fold import ENTITY, PENDING, apply_event, pending_creators
from events.model import NewEvent, RecordedEvent, StreamAppend, derived_event_id
from events.projections import SqlProjections
from events.store import EventStore
from events.transaction import LogTransaction

log = structlog.get_logger(__name__)
__all__ = ["Outcome", "accept", "decide", "pending_command_ids", "precheck", "run_effects",
           "unfinished_command_ids"]


def accepted_event_id(command_id: str) -> str:
    return derived_event_id(command_id, "accepted")


def accept(store: EventStore, commands: Sequence[CommandBase],
           lines: Sequence[int] | None = None) -> list[str]:
    """Record `commands` in the inbox in one transaction; return the ids newly accepted.

    A command id already in the inbox is skipped, so submitting the same file twice accepts
    each command once. Every command's references (a node, pool, replica…) must name something
    the fleet has, or that an earlier command of this submission or an undecided one creates;
    otherwise `SubmissionRejected` lists each problem and nothing is written.
    """
    with store.transaction() as tx:
        event_ids = [accepted_event_id(c.command_id) for c in commands]
        known = tx.stored_event_ids(event_ids)
        fresh, fresh_ids, seen = [], [], {}
        fresh_lines = []
        for index, (command, event_id) in enumerate(zip(commands, event_ids, strict=True)):
            if event_id in known or command.command_id in seen:
                continue
            seen[command.command_id] = command
            fresh.append(command)
            fresh_ids.append(event_id)
            fresh_lines.append(lines[index] if lines is not None else index + 1)
        problems = _reused_ids(tx, commands, lines, seen,
                               [c.command_id for c, e in zip(commands, event_ids, strict=True)
                                if e in known])
        problems += [FieldProblem(line, "command_id", f"command id {c.command_id!r} has the form "
                                  "of a command the control plane issues (<id>:place:<n>, "
                                  "<id>:evaluate, <id>:<plan stage>); choose another")
                     for c, line in zip(fresh, fresh_lines, strict=True) if is_issued_id(c.command_id)]
        problems += precheck(tx, fresh, fresh_lines)
        if problems:
            raise SubmissionRejected(problems)
        events = [NewEvent(event_id=event_id, event_type=ACCEPTED,
                           data=inbox_record(c),
                           occurred_at=c.occurred_at,
                           command_id=c.command_id,
                           correlation_id=c.correlation_id or c.command_id,
                           actor=c.actor, tenant=c.tenant)
                  for c, event_id in zip(fresh, fresh_ids, strict=True)]
        if not events:
            return []
        for event in tx.append([StreamAppend(INBOX_STREAM, None, events)]):
            apply_event(tx.projections, event)
    return [c.command_id for c in fresh]


def _reused_ids(tx: LogTransaction, commands: Sequence[CommandBase], lines: Sequence[int] | None,
                first: dict[str, CommandBase], accepted_ids: list[str]) -> list[FieldProblem]:
    """Commands whose id is already accepted, or used earlier in this submission, for another
    command: resubmitting the same command is harmless (it is accepted once), but a different
    one under a used id had been dropped without a word, its submitter shown the other's
    decision. Compared on the fields either one sets, so a defaulted time does not differ."""
    stored = {command_id: next(e.data["command"] for e in events if e.event_type == ACCEPTED)
              for command_id, events in tx.events_for_commands(accepted_ids).items()
              if events} if accepted_ids else {}
    problems = []
    for index, command in enumerate(commands):
        earlier = first.get(command.command_id)
        other = stored.get(command.command_id) if command.command_id in stored else (
            earlier.payload() if earlier is not None and earlier is not command else None)
        if other is None:
            continue
        explicit = (command.model_fields_set | (earlier.model_fields_set if earlier else set())) \
            - command.IDENTITY_IGNORES
        mine = command.payload()
        if any(mine.get(field) != other.get(field) for field in explicit | {"type"}):
            problems.append(FieldProblem(lines[index] if lines is not None else index + 1,
                                         "command_id", f"command id {command.command_id!r} is "
                                         "already used for a different command"))
    return problems


def precheck(tx: LogTransaction, commands: Sequence[CommandBase],
             lines: Sequence[int]) -> list[FieldProblem]:
    """Problems with `commands` against the fleet as it stands and as pending commands leave it."""
    if not any(c.references() or c.command_type in PRECHECKS for c in commands):
        return []
    checks = [PRECHECKS.get(c.command_type) for c in commands]
    creators = [(c, check) for c, check in zip(commands, checks, strict=True)
                if isinstance(check, RefuseExisting)]
    references = [(ENTITY, key) for c in commands for _, key in c.references()]
    # What undecided commands create: read (the whole pending table) only if a check needs it.
    declared = set(pending_creators(tx.projections)) if references or creators else set()
    # The rows the checks below read, in one query per projection rather than one per command.
    tx.projections.prefetch([*references, *(check.key(c) for c, check in creators)])
    problems = []
    for line, command, check in zip(lines, commands, checks, strict=True):
        for field, key in command.references():
            if key not in declared and tx.projections.get(ENTITY, key) is None:
                kind, _, name = key.partition("/")
                problems.append(FieldProblem(line, field, f"unknown {kind} {name!r}"))
        if isinstance(check, RefuseExisting) and check.entity(command) in declared:
            problems.append(FieldProblem(line, *check.created_meanwhile(command)))
        elif check is not None:
            problems.extend(FieldProblem(line, field, message)
                            for field, message in check(command, tx.projections))
        declared.update(command.creates())
    return problems


Enqueue = Callable[[list[str]], object]


def decide(store: EventStore, command_ids: Sequence[str],
           policies: PolicyBook | None = None, enqueue: Enqueue | None = None,
           effects_until: float | None = None, hand_off: Enqueue | None = None) -> list[Outcome]:
    """Decide each command once; append every decision of the batch in one transaction.

    A command already decided is not decided again: its recorded events are returned, so a job
    delivered twice appends nothing. Unknown ids are skipped with a warning. Follow-up commands
    a decision issued are passed to `enqueue` after commit; so are those of a command delivered
    again that are still undecided (the delivery that decided it died before enqueueing them).
    Outside effects run after commit, until `effects_until`; the rest go to `hand_off`
    (`run_effects`).

    The inbox is read and parsed before the append lock is taken; the batch is then decided
    and appended under the lock (`controlplane.deciding.decide_batch`), which checks again that
    no other worker decided any of its commands meanwhile.
    """
    policies = policies or PolicyBook()
    ids = list(dict.fromkeys(command_ids))
    # One connection for the inbox read and the decisions' transaction (on PostgreSQL, one
    # database transaction: a one-command decision had spent half its time in round trips).
    with store.reading() as connection:
        done, prepared = _prepare(store, connection, ids)
        decided = decide_batch(store, prepared, policies, connection) if prepared else []
    by_id = {outcome.command_id: outcome for outcome in [*done, *decided]}
    outcomes = [by_id[command_id] for command_id in ids if command_id in by_id]
    issued = [e.command_id for o in outcomes if o.decided_now for e in o.events
              if e.event_type == ACCEPTED and e.command_id]
    # Commands left undecided until their creators are, enqueued after them (`_waits_for`).
    waiting = [o for o in outcomes if o.waits_for]
    issued += [*(c for o in waiting for c in o.waits_for), *(o.command_id for o in waiting)]
    issued = list(dict.fromkeys(issued))
    redelivered = [o for o in outcomes if not o.decided_now and not o.waits_for]
    if redelivered and enqueue is not None:  # a delivery that died after its commit
        issued += _undecided_follow_ups(store, redelivered)
    if issued and enqueue is not None:
        enqueue(issued)  # before the effects: one that raises (to be resumed) leaves them queued
    run_effects(store, outcomes, effects_until, hand_off)
    return outcomes


def _undecided_follow_ups(store: EventStore, outcomes: Sequence[Outcome]) -> list[str]:
    """The still undecided commands that these recorded decisions issued (scale-ups issue
    placements): a delivery that died between its commit and enqueueing them left them only
    in the inbox. Found by causation, as `issue_command` records it."""
    causes = {e.event_id for o in outcomes for e in o.events}
    # Issued commands carry the reserved id forms (`is_issued_id`): only those can be one, so a
    # backlog of submitted commands costs a scan of ids, not a read of all their events.
    pending = [c for c in pending_command_ids(store) if is_issued_id(c)]
    if not causes or not pending:
        return []
    recorded = store.events_for_commands(pending)
    return [c for c in pending
            if any(e.event_type == ACCEPTED and e.causation_id in causes for e in recorded[c])]


def _prepare(store: EventStore, connection: Connection,
             command_ids: list[str]) -> tuple[list[Outcome], list[Prepared]]:
    """Before any lock: outcomes of commands already decided, and the rest parsed.

    Accepted commands never change, so reading the inbox needs no lock; whether a command is
    still undecided is checked again when its decision is appended.
    """
    done, prepared = [], []
    for command_id, recorded in store.events_for_commands(command_ids, connection).items():
        # Split in one pass (most commands have only their acceptance): the first acceptance,
        # and every other event in order.
        accepted: RecordedEvent | None = None
        decided: list[RecordedEvent] = []
        for event in recorded:
            if event.event_type != ACCEPTED:
                decided.append(event)
            elif accepted is None:
                accepted = event
        if accepted is None:
            log.warning("unknown_command_skipped", command_id=command_id)
        elif decided:
            log.debug("command_already_decided", command_id=command_id)
            done.append(Outcome(command_id, False, tuple(decided)))
        else:
            # A command today's validation refuses is read as a RefusedCommand, rejected when
            # decided: failing to parse it had failed its whole batch on every retry.
            command = parse_recorded(accepted)
            if isinstance(command, RefusedCommand) and command.newer:
                # Accepted by a newer fleetctl (a rolling upgrade): left in the inbox for a
                # worker that knows it (`reconcile` enqueues it again), never rejected here.
                log.error("command_from_a_newer_fleetctl", command_id=command_id,
                          command_type=command.recorded_type, problems=command.problems)
                done.append(Outcome(command_id, False, ()))
                continue
            prepared.append(Prepared(command_id, accepted, command))
    return done, prepared


def run_effects(store: EventStore, outcomes: Sequence[Outcome], until: float | None = None,
                hand_off: Enqueue | None = None) -> None:
    """Run the outside effects of events this call committed, never on a replay; and, for a
    command delivered again after it was decided, those `RESUMABLE` (each acts at most once by
    itself: a worker that died after committing a decision had left them undone).

    Effects run one after another (a gateway call each). Once `time.monotonic()` reaches
    `until`, and at least one has run, the commands whose resumable effects have not started
    are passed to `hand_off` (enqueued again: delivered again, a command resumes them): a batch
    of slow calls had run past its job's timeout, the timeout recorded a healthy call as an
    unknown outcome, and calls late in the batch found their reservation's lease run out. An
    effect that cannot be resumed always runs here."""
    handed: dict[str, None] = {}  # in order, each command once
    ran = 0
    for outcome in outcomes:
        for event in outcome.events:
            effect = EFFECTS.get(event.event_type)
            resumable = event.event_type in RESUMABLE
            if effect is None or not (outcome.decided_now or resumable):
                continue
            if resumable and hand_off is not None and until is not None and ran \
                    and (handed or time.monotonic() >= until):
                handed[outcome.command_id] = None
                continue
            effect(store, event)
            ran += 1
    if handed and hand_off is not None:
        log.info("effects_handed_off", commands=len(handed), ran=ran)
        hand_off(list(handed))


def unfinished_command_ids(store: EventStore) -> list[str]:
    """Decided commands whose resumable effects are still undone (`handlers.UNFINISHED`)."""
    with store.engine.connect() as conn:
        state = SqlProjections(conn)
        return [command_id for find in UNFINISHED for command_id in find(state)]


def pending_command_ids(store: EventStore) -> list[str]:
    """Accepted commands that have no decision yet, in acceptance order."""
    with store.engine.connect() as conn:
        rows = list(SqlProjections(conn).items(PENDING))
    rows.sort(key=lambda item: item[1]["accepted_position"])
    return [command_id for command_id, _ in rows]
