"""Request admission through the log: admit, queue or shed against budgets from ready replicas.

The live-token budget is the pool's ready KV capacity (`pool.live_token_budget`, folded from the
replicas' memory plans) times the admission policy's `live_token_budget_fraction`; a warming
replica adds nothing. Each request decision goes to `request/<id>`; the pool's resulting
admission state goes to `pool/<id>` in the same transaction.

Choices (spec 1.8 and 8): a request id already decided gets its recorded decision again
(`AdmissionReplayed`, changing nothing) and a different payload under it is refused with
`replay_payload_mismatch`; a shed is permanent until its record expires; a release promotes the
queue in FIFO order, each promotion its own decision. A pool with no ready capacity sheds with
`no_ready_capacity` and, while it has no budget, promotes nothing. A shed links (`causes`) to the
placements of the pool's warming replicas: the capacity that was on its way.

A settled record is gone once past its TTL, even before a decision forgets it from the
projection; `admission_pool` says how decisions bound what is kept and record what they forget.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from controlplane.commands.base import CommandBase
from controlplane.commands.traffic import AdmitRequest, ReleaseRequest, seconds
from controlplane.decisions import (
    REJECTED,
    DecisionContext,
    append_to,
    decision_data,
    new_event,
    rejection,
)
from controlplane.handlers.admission_pool import (
    PoolCapacity,
    admission_policy,
    pool_capacity,
    pool_event,
    settled_sequences,
    warming_placements,
)
from controlplane.handlers.base import Handler, Reads
from controlplane.policies.admission import (
    QUEUE_CLEARED,
    AdmissionAction,
    AdmissionDecision,
    AdmissionPolicy,
    AdmissionRecord,
    AdmissionRequest,
    PoolState,
    decide_admission,
    promote,
    release,
    shed_without_capacity,
)
from controlplane.policies.admission_records import SETTLED, settled_record_expired
from controlplane.policies.reasons import PolicyInputError, Reason
from controlplane.policy_book import PolicyInForce
from controlplane.state.admission import (
    ADMISSION,
    ADMISSION_REPLAYED,
    ADMISSION_REQUEST,
    REQUEST_ADMITTED,
    REQUEST_QUEUED,
    REQUEST_RELEASED,
    REQUEST_SHED,
    empty_pool_admission,
)
from controlplane.state.fleet import POOL
from events.model import NewEvent, StreamAppend
from events.projections import StateView

EVENT_TYPES = {AdmissionAction.ADMIT: REQUEST_ADMITTED, AdmissionAction.QUEUE: REQUEST_QUEUED,
               AdmissionAction.SHED: REQUEST_SHED, AdmissionAction.RELEASE: REQUEST_RELEASED}


def admission_record(row: dict[str, Any]) -> AdmissionRecord:
    """A request's `admission_request` row as the pure policy's record."""
    request = AdmissionRequest(row["request_id"], row["prompt_tokens"], row["max_output_tokens"],
                               row["deadline_at_seconds"])
    decision = AdmissionDecision(row["request_id"], AdmissionAction(row["action"]),
                                 row["reserved_tokens"], ())
    return AdmissionRecord(request, decision, row["decided_at_seconds"])


def _still_recorded(row: dict[str, Any] | None, now: float, rules: AdmissionPolicy) -> bool:
    """The policy's expiry rule: a settled record past its TTL is gone, even before it is pruned."""
    return row is not None and not (
        AdmissionAction(row["action"]) in SETTLED
        and settled_record_expired(row["decided_at_seconds"], now, rules))


def request_event(command: CommandBase, ctx: DecisionContext, slot: str,
                   decision: AdmissionDecision, request: AdmissionRequest, pool_id: str,
                   now: float, policy: PolicyInForce, inputs: dict[str, Any],
                   causes: list[str], sequences: Iterator[int]) -> NewEvent:
    """A request's decision; a settled one takes the pool's next settled sequence number."""
    result = {"request_id": request.identifier, "pool_id": pool_id,
              "action": decision.action.value, "reserved_tokens": decision.reserved_tokens,
              "prompt_tokens": request.prompt_tokens, "max_output_tokens": request.max_output_tokens,
              "deadline_at_seconds": request.deadline_at_seconds, "decided_at_seconds": now}
    if decision.action in SETTLED:
        result["settled_sequence"] = next(sequences)
    data = decision_data(outcome=decision.action.value, reasons=decision.reasons, result=result,
                         policy=policy, inputs=inputs, ctx=ctx, causes=causes)
    return new_event(command, ctx, slot, EVENT_TYPES[decision.action], data)


def queued_records(state: StateView, queue: Sequence[str]) -> dict[str, AdmissionRecord]:
    """The records of a pool's queued requests (from their `admission_request` rows), in queue
    order."""
    return {rid: admission_record(found) for rid in queue
            if (found := state.get(ADMISSION_REQUEST, rid)) is not None}


def walked_events(command: CommandBase, ctx: DecisionContext, decisions: Sequence[AdmissionDecision],
                  records: dict[str, AdmissionRecord], pool_id: str, now: float,
                  policy: PolicyInForce, inputs: dict[str, Any], causes: list[str],
                  sequences: Iterator[int]) -> list[NewEvent]:
    """The decisions a walk of the queue made (promotions, sheds), each in its own slot."""
    return [request_event(command, ctx, f"promote/{d.request_id}", d,
                          records[d.request_id].request, pool_id, now, policy,
                          inputs, causes, sequences) for d in decisions]


def _answer_again(command: CommandBase, ctx: DecisionContext, row: dict[str, Any],
                  same_payload: bool, policy: PolicyInForce) -> list[StreamAppend]:
    """A request id already decided: the recorded decision again, or a mismatch refusal."""
    facts = {"recorded_action": row["action"], "recorded_at_seconds": row["decided_at_seconds"],
             "recorded_pool_id": row["pool_id"], "recorded_event_id": row["decision_event_id"]}
    result = {"request_id": row["request_id"], "pool_id": row["pool_id"], "action": row["action"],
              "reserved_tokens": row["reserved_tokens"]}
    if same_payload:
        reason = Reason("request_already_decided", "this request id was decided; the decision stands",
                        facts)
        outcome, event_type = row["action"], ADMISSION_REPLAYED
    else:
        reason = Reason("replay_payload_mismatch",
                        "this request id was already decided for a different payload", facts)
        outcome, event_type = "rejected", REJECTED
    data = decision_data(outcome=outcome, reasons=[reason], result=result, policy=policy,
                         inputs=command.payload(), ctx=ctx, causes=[row["decision_event_id"]])
    return [append_to(f"request/{row['request_id']}", ctx,
                      new_event(command, ctx, "decision", event_type, data))]


def _explained_shed(decision: AdmissionDecision, capacity: PoolCapacity,
                    policy: PolicyInForce, placements: list[str]) -> AdmissionDecision:
    """A shed's facts carry the pool's state and policy version, and name capacity on its way."""
    pool_facts = {**capacity.facts(), "policy_version": policy.version}
    first, *rest = decision.reasons
    reasons = [Reason(first.code, first.message, {**first.facts, **pool_facts}), *rest]
    if capacity.warming:
        reasons.append(Reason(
            "scale_up_still_warming", "replicas are warming and add no ready capacity yet",
            {"warming_replicas": sorted(capacity.warming),
             "warming_kv_capacity_tokens": sum(capacity.warming.values()),
             "placement_event_ids": placements}))
    return AdmissionDecision(decision.request_id, decision.action, 0, tuple(reasons))


def handle_admit_request(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Admit, queue or shed against the pool's budget; a known request id is answered again."""
    assert isinstance(command, AdmitRequest)
    policy = ctx.policies.in_force(ctx.state, "admission")
    now = seconds(command.at)
    request = AdmissionRequest(command.request_id, command.prompt_tokens,
                               command.max_output_tokens, seconds(command.deadline_at))
    row = ctx.state.get(ADMISSION_REQUEST, command.request_id)
    if row is not None and _still_recorded(row, now, admission_policy(policy)):
        same = admission_record(row).request == request and row["pool_id"] == command.pool_id
        return _answer_again(command, ctx, row, same, policy)
    capacity = pool_capacity(ctx.state, command.pool_id, policy)
    admission = ctx.state.get(ADMISSION, command.pool_id) or empty_pool_admission(command.pool_id)
    inputs = {"command": command.payload(), "pool": capacity.facts(),
              "admission": {"live_tokens": admission["live_tokens"], "queue": admission["queue"]}}
    walked: tuple[AdmissionDecision, ...] = ()
    walked_records: dict[str, AdmissionRecord] = {}
    live, queue = admission["live_tokens"], tuple(admission["queue"])
    # One value serves the whole decision: with no budget only its token bound and retention
    # rules are read, which do not depend on it.
    rules = admission_policy(policy, max(capacity.budget_tokens, 1), capacity)
    try:
        if capacity.budget_tokens == 0:
            decision = shed_without_capacity(
                request, now, command.estimated_queue_seconds, rules,
                {"live_tokens": admission["live_tokens"],
                 "queued_requests": len(admission["queue"])}, retryable=bool(capacity.warming))
        else:
            walked, walked_records, (live, queue) = _walk_at_the_door(ctx, admission, now, rules)
            decision = decide_admission(PoolState(live, queue), request, now,
                                        command.estimated_queue_seconds, rules)
    except PolicyInputError as error:
        return rejection(command, ctx, error, f"request/{command.request_id}")
    sequences = settled_sequences(admission)
    followers = walked_events(command, ctx, walked, walked_records, command.pool_id, now,
                              policy, inputs, [], sequences)
    causes: list[str] = []
    if decision.action is AdmissionAction.SHED:
        causes = warming_placements(ctx.state, capacity)
        decision = _explained_shed(decision, capacity, policy, causes)
    event = request_event(command, ctx, "decision", decision, request, command.pool_id, now,
                           policy, inputs, causes, sequences)
    after_queue = list(queue)
    if decision.action is AdmissionAction.QUEUE:
        after_queue.append(command.request_id)
    return [append_to(f"request/{command.request_id}", ctx, event),
            *(append_to(f"request/{e.data['result']['request_id']}", ctx, e) for e in followers),
            pool_event(command, ctx, admission, live + decision.reserved_tokens, after_queue,
                       [*followers, event], now, rules)]


def _walk_at_the_door(ctx: DecisionContext, admission: dict[str, Any], now: float,
                      rules: AdmissionPolicy) -> tuple[tuple[AdmissionDecision, ...],
                                                       dict[str, AdmissionRecord],
                                                       tuple[int, tuple[str, ...]]]:
    """Before a newcomer is judged, the queue's heads whose deadline passed (or that the token
    bound now refuses) are shed, and the heads that then fit are admitted, FIFO: otherwise a
    head that can no longer be served held every later request behind it, queued or shed as
    `live_budget_and_queue_full`, until some release walked the queue. Returns those decisions,
    the records of the requests they decide, and the pool's (live tokens, queue) after them.

    The head alone is read first: a head that is still waiting for tokens decides nothing.
    """
    live, queue = admission["live_tokens"], tuple(admission["queue"])
    head = ctx.state.get(ADMISSION_REQUEST, queue[0]) if queue else None
    if head is None or not _head_moves(admission_record(head), live, now, rules):
        return (), {}, (live, queue)
    records = queued_records(ctx.state, queue)
    decisions, after = promote(PoolState(live, queue, tuple(records.values())), now, rules,
                               QUEUE_CLEARED)
    return decisions, records, (after.live_tokens, after.queue)


def _head_moves(head: AdmissionRecord, live: int, now: float, rules: AdmissionPolicy) -> bool:
    """Whether walking the queue would decide its head: shed (late, over the token bound) or
    admitted (it fits)."""
    tokens = head.request.maximum_live_tokens
    return (now > head.request.deadline_at_seconds or tokens > rules.max_tokens_per_request
            or live + tokens <= rules.max_live_tokens)


def handle_release_request(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Free a reservation or queue slot, then promote the queue head while it fits (FIFO)."""
    assert isinstance(command, ReleaseRequest)
    stream = f"request/{command.request_id}"
    policy = ctx.policies.in_force(ctx.state, "admission")
    now = seconds(command.at)
    row = ctx.state.get(ADMISSION_REQUEST, command.request_id)
    if row is None:
        return rejection(command, ctx, PolicyInputError(
            "unknown_request_id", "request_id", f"no admission record for {command.request_id}"),
            stream)
    pool_id = row["pool_id"]
    capacity = pool_capacity(ctx.state, pool_id, policy)
    admission = ctx.state.get(ADMISSION, pool_id) or empty_pool_admission(pool_id)
    queue = tuple(admission["queue"])
    records = {command.request_id: admission_record(row), **queued_records(ctx.state, queue)}
    # With no ready capacity nothing can be promoted: the policy sees no queue to walk.
    promote = capacity.budget_tokens > 0
    state = PoolState(admission["live_tokens"], queue if promote else (), tuple(records.values()))
    rules = admission_policy(policy, max(capacity.budget_tokens, 1), capacity)
    try:
        decisions, after = release(state, command.request_id, now, rules)
    except PolicyInputError as error:
        return rejection(command, ctx, error, stream)
    if row["action"] == AdmissionAction.RELEASE.value:
        return _answer_again(command, ctx, row, True, policy)
    inputs = {"command": command.payload(), "pool": capacity.facts(),
              "admission": {"live_tokens": admission["live_tokens"], "queue": list(queue)}}
    sequences = settled_sequences(admission)
    released = request_event(command, ctx, "decision", decisions[0],
                              records[command.request_id].request, pool_id, now, policy, inputs, [],
                              sequences)
    followers = walked_events(command, ctx, decisions[1:], records, pool_id, now, policy, inputs,
                              [released.event_id], sequences)
    appends = [append_to(stream, ctx, released)]
    appends += [append_to(f"request/{e.data['result']['request_id']}", ctx, e) for e in followers]
    remaining = list(after.queue) if promote else [rid for rid in queue if rid != command.request_id]
    appends.append(pool_event(command, ctx, admission, after.live_tokens, remaining,
                              [released, *followers], now, rules))
    return appends


HANDLERS: dict[str, Handler] = {
    "AdmitRequest": handle_admit_request,
    "ReleaseRequest": handle_release_request,
}

# Versions of the decision rules, each with what changed (see `handlers/base.py`).
RULES_VERSIONS: dict[str, int] = {
    # 2: an arrival first sheds the queue heads past their deadline or token bound, and admits
    #    the heads that then fit, before it is judged.
    # 3: a pool with no ready capacity sheds a request over the token bound for that (not
    #    retryable), not as `no_ready_capacity`; a start predicted at the deadline to within a
    #    microsecond queues (sums at epoch seconds had rounded past it and shed).
    # 4: a request (or queue head) needing more live tokens than the pool's largest replica,
    #    ready or warming, holds is shed (`larger_than_any_replica`): the pooled budget had
    #    admitted requests no single replica could serve.
    "AdmitRequest": 4,
    # 2: a promoted head whose tokens exceed a lowered `max_tokens_per_request` is shed.
    # 3: so is a head needing more live tokens than the pool's largest replica holds.
    "ReleaseRequest": 3,
}


def _admit_reads(command: CommandBase) -> list[tuple[str, str]]:
    assert isinstance(command, AdmitRequest)
    return [(ADMISSION_REQUEST, command.request_id), (POOL, command.pool_id),
            (ADMISSION, command.pool_id)]


def _release_reads(command: CommandBase) -> list[tuple[str, str]]:
    assert isinstance(command, ReleaseRequest)
    return [(ADMISSION_REQUEST, command.request_id)]


READS: dict[str, Reads] = {"AdmitRequest": _admit_reads, "ReleaseRequest": _release_reads}
