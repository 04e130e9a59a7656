"""What every decision handler shares: its context and the shape of a decision event."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controlplane.commands import CommandBase
from controlplane.policies.fleet_plan_stages import STAGES
from controlplane.policies.reasons import PolicyInputError, Reason, to_plain
from controlplane.policy_book import PolicyBook, PolicyInForce
from events.canonical import Plain
from events.model import NewEvent, StreamAppend, derived_event_id
from events.projections import StateView

ACCEPTED = "CommandAccepted"
REJECTED = "CommandRejected"
INBOX_STREAM = "inbox"
# The ids of commands decisions issue (`issue_command`): a scale-up's placements
# `<id>:place:<n>` (handlers.autoscaling_scale_up), a measurement's evaluation `<id>:evaluate`
# (handlers.rollout), a plan's stages `<id>:<stage>` (commands.plan.stage_command_id). Reserved:
# a submitted command under one would make the issuing decision collide with it, and the whole
# batch holding it could never commit.
_ISSUED_ID = re.compile(rf".*:(place:[0-9]+|evaluate|{'|'.join(map(re.escape, STAGES))})")


def is_issued_id(command_id: str) -> bool:
    """True for an id of the form decisions give the commands they issue."""
    return _ISSUED_ID.fullmatch(command_id) is not None


# Where a decision's inputs hold what it read from outside the log (`DecisionContext.read_outside`).
OUTSIDE_READS = "outside_reads"


@dataclass
class OutsideReads:
    """What one decision read from outside the log, by key: `{"value": ...}` for a value read,
    `{"error": {"code", "field", "message"}}` for a `PolicyInputError` the read raised.

    Live, `replayed` is None: every read is made, and kept (`made`) for the decision's inputs.
    Re-deriving a decision that recorded its reads (`recorded_by`), `replayed` holds them: a key
    found there is never read again, so the decision re-derives from the log alone. Re-deriving
    one recorded before reads were recorded (its inputs hold no `outside_reads`), `keep` is
    False: the outside world is read as it is today, as the rules that made it did, and nothing
    is added to its inputs, so it re-derives to the record it has.
    """

    replayed: Mapping[str, Any] | None = None
    keep: bool = True
    made: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def recorded_by(cls, decision: Mapping[str, Any]) -> OutsideReads:
        """The reads of the recorded decision `decision` (its data), to re-derive it with."""
        inputs = decision.get("inputs")
        recorded = inputs.get(OUTSIDE_READS) if isinstance(inputs, dict) else None
        return cls(recorded) if isinstance(recorded, dict) else cls({}, keep=False)


@dataclass(frozen=True, init=False)
class DecisionContext:
    """Everything a handler may read: state as of `read_position`, the policies in force, and
    what `read_outside` returns.

    Live, the state is the appending transaction's; in replay, a fold of the log up to the same
    position. Handlers cannot tell the two apart, which is what makes re-derivation exact. One
    context serves one decision (its outside reads are that decision's).
    """

    state: StateView
    read_position: int
    stream_version: Callable[[str], int]
    policies: PolicyBook
    accepted_event_id: str | None
    # The command type's `RULES_VERSIONS` entry, set by `handlers.decide_command`.
    rules_version: int = 1
    # The control plane's clock at this decision: the `recorded_at` its events carry, fixed
    # before the handler runs (live) or read from the recorded events (replay), so a handler
    # may judge elapsed wall-clock time and still re-derive exactly. None: no clock was given
    # (a context built by hand), and no wall-clock time may be taken to have passed.
    recorded_at: str | None = None
    # What the decision read from outside the log: see `read_outside`.
    outside: OutsideReads = field(default_factory=OutsideReads)

    # Written out, not generated (one context per decision), as `events.model.NewEvent`'s is;
    # `outside` left out is a fresh `OutsideReads`, as its default factory makes.
    def __init__(self, state: StateView, read_position: int, stream_version: Callable[[str], int],
                 policies: PolicyBook, accepted_event_id: str | None, rules_version: int = 1,
                 recorded_at: str | None = None, outside: OutsideReads | None = None) -> None:
        object.__setattr__(self, "__dict__", {
            "state": state, "read_position": read_position, "stream_version": stream_version,
            "policies": policies, "accepted_event_id": accepted_event_id,
            "rules_version": rules_version, "recorded_at": recorded_at,
            "outside": OutsideReads() if outside is None else outside})

    def read_outside(self, key: str, read: Callable[[], Any]) -> Any:
        """`read()`, an input from outside the log (a catalog file), recorded under `key` in
        the decision's inputs; a `PolicyInputError` it raises is recorded and raised again.

        Guarantee: re-deriving (`replay --verify`, what-if `replay --policy`) returns the value,
        or raises the error, that the decision recorded, without calling `read`: a decision
        re-derives from the log alone, whatever the outside world holds by then. Exception: a
        decision recorded before its handler read through here has nothing recorded, and is
        re-derived by reading the outside world today (`OutsideReads`). `read` returns plain
        data (made plain before use, so live and replay see the same value); another exception
        it raises is not recorded and propagates.
        """
        replayed = self.outside.replayed
        if replayed is not None and key in replayed:
            outcome = replayed[key]
        else:
            try:
                outcome = {"value": to_plain(read())}
            except PolicyInputError as error:
                outcome = {"error": {"code": error.code, "field": error.field,
                                     "message": error.message}}
        if self.outside.keep:
            self.outside.made[key] = outcome
        if "error" in outcome:
            error_record = outcome["error"]
            raise PolicyInputError(error_record["code"], error_record["field"],
                                   error_record["message"])
        return outcome["value"]


def inbox_record(command: CommandBase) -> Plain:
    """What `CommandAccepted` records: the command's payload and the entity keys it creates,
    built afresh. pydantic's JSON mode gives plain data (float fields refuse NaN and infinity
    at validation; a NaN inside a free-form field is written as null, as it always was)."""
    return Plain({"command": command.payload(), "creates": list(command.creates())})


def new_event(command: CommandBase, ctx: DecisionContext, slot: str, event_type: str,
              data: dict[str, Any]) -> NewEvent:
    """An event of `command`'s decision, with an id stable across re-handling."""
    # Its id read once, not three times: every read of a pydantic model's field goes through
    # the model's __getattr__ hook (no specialised attribute read), dearer than a local's.
    command_id = command.command_id
    return NewEvent(
        event_id=derived_event_id(command_id, slot),
        event_type=event_type,
        data=data,
        occurred_at=command.occurred_at,
        command_id=command_id,
        causation_id=ctx.accepted_event_id,
        correlation_id=command.correlation_id or command_id,
        actor=command.actor,
        tenant=command.tenant,
    )


def decision_data(*, outcome: str, reasons: tuple[Reason, ...] | list[Reason],
                  result: dict[str, Any], policy: PolicyInForce | None, inputs: dict[str, Any],
                  ctx: DecisionContext, causes: list[str] | None = None) -> dict[str, Any]:
    """The recorded decision: outcome, reasons with facts, policy, inputs (with what the
    decision read from outside the log, under `outside_reads`, when it read any), read position
    and the version of the rules that decided it.

    Every part is made plain here (`to_plain`: fresh containers, finite numbers), so the record
    is a `Plain` dict that the log encodes without checking it again.
    """
    if ctx.outside.made:
        inputs = {**inputs, OUTSIDE_READS: ctx.outside.made}
    # Scalars are plain as they are (`to_plain` returns them): every decision has two.
    return Plain({
        "outcome": outcome if type(outcome) is str else to_plain(outcome),
        "reasons": to_plain(reasons),  # a new list, whether given a list or a tuple
        "result": to_plain(result),
        "policy": to_plain(policy.as_dict()) if policy is not None else None,
        "inputs": to_plain(inputs),
        "read_position": ctx.read_position if type(ctx.read_position) is int
        else to_plain(ctx.read_position),
        "causes": to_plain(causes) if causes else [],
        "rules_version": ctx.rules_version,
    })


def append_to(stream_id: str, ctx: DecisionContext, *events: NewEvent) -> StreamAppend:
    """Append `events` to `stream_id` at the version the handler read."""
    return StreamAppend(stream_id, ctx.stream_version(stream_id), list(events))


def issue_command(parent: CommandBase, ctx: DecisionContext, child: CommandBase,
                  cause_event_id: str) -> StreamAppend:
    """Accept a follow-up command as part of a decision (a scale-up's placements).

    The child is recorded in the inbox in the deciding transaction, caused by `cause_event_id`;
    it is enqueued after commit, and `reconcile` finds it if that never happens.
    """
    event = NewEvent(
        event_id=derived_event_id(child.command_id, "accepted"), event_type=ACCEPTED,
        data=inbox_record(child), occurred_at=child.occurred_at,
        command_id=child.command_id, causation_id=cause_event_id,
        correlation_id=parent.correlation_id or parent.command_id, actor=child.actor,
        tenant=child.tenant)
    return StreamAppend(INBOX_STREAM, None, [event])


def rejection(command: CommandBase, ctx: DecisionContext, error: PolicyInputError,
              stream_id: str) -> list[StreamAppend]:
    """A valid-looking command the policy cannot decide: recorded so it is never retried."""
    data = decision_data(outcome="rejected", reasons=[Reason(error.code, error.message,
                                                             {"field": error.field})],
                         result={}, policy=None, inputs=command.payload(), ctx=ctx)
    return [append_to(stream_id, ctx, new_event(command, ctx, "rejected", REJECTED, data))]


# What a handler can raise from its command and the state it read alone (a division that
# underflowed, a non-finite number, a row missing a key): raised again on every retry and on
# re-derivation, so the command is rejected instead. Anything else (the database, the network,
# a version conflict) fails the batch, which is retried.
DECISION_FAILURES: tuple[type[Exception], ...] = (ArithmeticError, ValueError, TypeError,
                                                  LookupError, AttributeError)
MAX_FAILURE_DETAIL = 500


def failed_decision(command: CommandBase, ctx: DecisionContext,
                    error: Exception) -> list[StreamAppend]:
    """A command whose handler raised one of `DECISION_FAILURES`: rejected in the inbox, beside
    its acceptance, naming the error, so the rest of its batch is decided and it is never
    retried (resubmit it under a new id once its cause is fixed)."""
    reason = Reason("decision_failed", "the decision could not be made from this command "
                    "and the fleet's state", {"error": type(error).__name__,
                                              "detail": str(error)[:MAX_FAILURE_DETAIL]})
    data = decision_data(outcome="rejected", reasons=[reason], result={}, policy=None,
                         inputs=command.payload(), ctx=ctx)
    return [StreamAppend(INBOX_STREAM, None, [new_event(command, ctx, "rejected", REJECTED, data)])]


def merge_appends(appends: list[StreamAppend], more: list[StreamAppend]) -> list[StreamAppend]:
    """`appends` then `more`, in order, where a stream appended again continues at the version
    its earlier events in this decision end at.

    Every event stays after the events that cause it: a drain's cordon, then each replica's
    release followed by the GPUs it frees on the node. (Each stream had appeared once, at the
    place of its first events, so a node's GPUs were recorded freed before the releases that
    freed them, and their causes pointed forward in the log.)
    """
    ends: dict[str, int | None] = {}
    for append in appends:
        ends[append.stream_id] = _end(append, append.expected_version)
    merged = list(appends)
    for extra in more:
        expected = ends.get(extra.stream_id, extra.expected_version)
        merged.append(StreamAppend(extra.stream_id, expected, extra.events))
        ends[extra.stream_id] = _end(extra, expected)
    return merged


def _end(append: StreamAppend, expected: int | None) -> int | None:
    """The stream's version after `append`'s events, from the version they are appended at."""
    return None if expected is None else expected + len(append.events)
