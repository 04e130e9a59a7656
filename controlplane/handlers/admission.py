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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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
from controlplane.handlers.base import Handler
from controlplane.policies.admission import (
    AdmissionAction,
    AdmissionDecision,
    AdmissionPolicy,
    AdmissionRecord,
    AdmissionRequest,
    PoolState,
    decide_admission,
    release,
)
from controlplane.policies.reasons import PolicyInputError, Reason
from controlplane.policy_book import PolicyInForce
from controlplane.state.admission import (
    ADMISSION,
    ADMISSION_REPLAYED,
    ADMISSION_REQUEST,
    POOL_ADMISSION_CHANGED,
    REQUEST_ADMITTED,
    REQUEST_QUEUED,
    REQUEST_RELEASED,
    REQUEST_SHED,
    empty_pool_admission,
)
from controlplane.state.fleet import POOL, REPLICA
from events.model import NewEvent, StreamAppend
from events.projections import StateView

EVENT_TYPES = {AdmissionAction.ADMIT: REQUEST_ADMITTED, AdmissionAction.QUEUE: REQUEST_QUEUED,
               AdmissionAction.SHED: REQUEST_SHED, AdmissionAction.RELEASE: REQUEST_RELEASED}
_SETTLED = ("shed", "release")


@dataclass(frozen=True)
class PoolCapacity:
    """What a pool can serve now (ready replicas) and what is still warming."""

    pool_id: str
    ready: dict[str, int]
    warming: dict[str, int]
    budget_tokens: int
    budget_fraction: float
    placement_event_ids: list[str]

    def facts(self) -> dict[str, Any]:
        return {"pool_id": self.pool_id, "ready_replicas": sorted(self.ready),
                "ready_kv_capacity_tokens": sum(self.ready.values()),
                "live_token_budget": self.budget_tokens,
                "live_token_budget_fraction": self.budget_fraction,
                "warming_replicas": sorted(self.warming),
                "warming_kv_capacity_tokens": sum(self.warming.values())}


def pool_capacity(state: StateView, pool_id: str, policy: PolicyInForce) -> PoolCapacity:
    """The pool's budget from its ready replicas' KV capacity, and its warming replicas."""
    pool = state.get(POOL, pool_id) or {"ready": {}, "warming": {}, "live_token_budget": 0}
    fraction = policy.parameters["live_token_budget_fraction"]
    warming = dict(sorted(pool["warming"].items()))
    replicas = [state.get(REPLICA, replica_id) for replica_id in warming]
    return PoolCapacity(pool_id, dict(sorted(pool["ready"].items())), warming,
                        math.floor(pool["live_token_budget"] * fraction), fraction,
                        [r["decision_event_id"] for r in replicas if r is not None])


def _policy(policy: PolicyInForce, budget_tokens: int) -> AdmissionPolicy:
    parameters = policy.parameters
    return AdmissionPolicy(max_live_tokens=budget_tokens,
                           max_queued_requests=parameters["max_queued_requests"],
                           max_tokens_per_request=parameters["max_tokens_per_request"],
                           record_ttl_seconds=parameters["record_ttl_seconds"])


def _record(row: dict[str, Any]) -> AdmissionRecord:
    request = AdmissionRequest(row["request_id"], row["prompt_tokens"], row["max_output_tokens"],
                               row["deadline_at_seconds"])
    decision = AdmissionDecision(row["request_id"], AdmissionAction(row["action"]),
                                 row["reserved_tokens"], ())
    return AdmissionRecord(request, decision, row["decided_at_seconds"])


def _still_recorded(row: dict[str, Any] | None, now: float, policy: PolicyInForce) -> bool:
    """The policy's expiry rule: settled records are forgotten after the record TTL."""
    return row is not None and not (
        row["action"] in _SETTLED
        and row["decided_at_seconds"] + policy.parameters["record_ttl_seconds"] <= now)


def _request_event(command: CommandBase, ctx: DecisionContext, slot: str,
                   decision: AdmissionDecision, request: AdmissionRequest, pool_id: str,
                   now: float, policy: PolicyInForce, inputs: dict[str, Any],
                   causes: list[str]) -> NewEvent:
    result = {"request_id": request.identifier, "pool_id": pool_id,
              "action": decision.action.value, "reserved_tokens": decision.reserved_tokens,
              "prompt_tokens": request.prompt_tokens, "max_output_tokens": request.max_output_tokens,
              "deadline_at_seconds": request.deadline_at_seconds, "decided_at_seconds": now}
    data = decision_data(outcome=decision.action.value, reasons=decision.reasons, result=result,
                         policy=policy, inputs=inputs, ctx=ctx, causes=causes)
    return new_event(command, ctx, slot, EVENT_TYPES[decision.action], data)


def _pool_event(command: CommandBase, ctx: DecisionContext, before: dict[str, Any],
                live_tokens: int, queue: list[str], decided: list[NewEvent]) -> StreamAppend:
    counts = dict(before["decisions"])
    for event in decided:
        counts[event.data["outcome"]] += 1
    after = {"pool_id": before["pool_id"], "live_tokens": live_tokens, "queue": queue,
             "decisions": counts}
    reason = Reason("pool_admission_changed", "live-token reservations and queue after the decision",
                    {"live_tokens_before": before["live_tokens"], "live_tokens_after": live_tokens,
                     "queued_before": len(before["queue"]), "queued_after": len(queue)})
    data = decision_data(outcome="applied", reasons=[reason], result=after, policy=None, inputs={},
                         ctx=ctx, causes=[event.event_id for event in decided])
    return append_to(f"pool/{before['pool_id']}", ctx,
                     new_event(command, ctx, "pool", POOL_ADMISSION_CHANGED, data))


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
                    policy: PolicyInForce) -> AdmissionDecision:
    """A shed's facts carry the pool's state and policy version, and name capacity on its way."""
    pool_facts = {**capacity.facts(), "policy_version": policy.version}
    first, *rest = decision.reasons
    reasons = [Reason(first.code, first.message, {**first.facts, **pool_facts}), *rest]
    if capacity.warming:
        reasons.append(Reason(
            "scale_up_still_warming", "replicas are warming and add no ready capacity yet",
            {"warming_replicas": sorted(capacity.warming),
             "warming_kv_capacity_tokens": sum(capacity.warming.values()),
             "placement_event_ids": capacity.placement_event_ids}))
    return AdmissionDecision(decision.request_id, decision.action, 0, tuple(reasons))


def handle_admit_request(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Admit, queue or shed against the pool's budget; a known request id is answered again."""
    assert isinstance(command, AdmitRequest)
    policy = ctx.policies.in_force(ctx.state, "admission")
    now = seconds(command.at)
    request = AdmissionRequest(command.request_id, command.prompt_tokens,
                               command.max_output_tokens, seconds(command.deadline_at))
    row = ctx.state.get(ADMISSION_REQUEST, command.request_id)
    if row is not None and _still_recorded(row, now, policy):
        same = _record(row).request == request and row["pool_id"] == command.pool_id
        return _answer_again(command, ctx, row, same, policy)
    capacity = pool_capacity(ctx.state, command.pool_id, policy)
    admission = ctx.state.get(ADMISSION, command.pool_id) or empty_pool_admission(command.pool_id)
    inputs = {"command": command.payload(), "pool": capacity.facts(),
              "admission": {"live_tokens": admission["live_tokens"], "queue": admission["queue"]}}
    if capacity.budget_tokens == 0:
        reason = Reason("no_ready_capacity", "the pool has no ready replica to reserve tokens on", {
            "request_tokens": request.maximum_live_tokens, "live_tokens": admission["live_tokens"],
            "queued_requests": len(admission["queue"]), "retryable": bool(capacity.warming),
            "retry_with_new_id": True})
        decision = AdmissionDecision(command.request_id, AdmissionAction.SHED, 0, (reason,))
    else:
        try:
            decision = decide_admission(
                PoolState(admission["live_tokens"], tuple(admission["queue"])), request, now,
                command.estimated_queue_seconds, _policy(policy, capacity.budget_tokens))
        except PolicyInputError as error:
            return rejection(command, ctx, error, f"request/{command.request_id}")
    causes: list[str] = []
    if decision.action is AdmissionAction.SHED:
        decision = _explained_shed(decision, capacity, policy)
        causes = capacity.placement_event_ids
    event = _request_event(command, ctx, "decision", decision, request, command.pool_id, now,
                           policy, inputs, causes)
    queue = list(admission["queue"])
    if decision.action is AdmissionAction.QUEUE:
        queue.append(command.request_id)
    return [append_to(f"request/{command.request_id}", ctx, event),
            _pool_event(command, ctx, admission, admission["live_tokens"] + decision.reserved_tokens,
                        queue, [event])]


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
    rows = {command.request_id: row}
    rows.update({rid: found for rid in queue
                 if (found := ctx.state.get(ADMISSION_REQUEST, rid)) is not None})
    # With no ready capacity nothing can be promoted: the policy sees no queue to walk.
    promote = capacity.budget_tokens > 0
    state = PoolState(admission["live_tokens"], queue if promote else (),
                      tuple(_record(r) for r in rows.values()))
    try:
        decisions, after = release(state, command.request_id, now,
                                   _policy(policy, max(capacity.budget_tokens, 1)))
    except PolicyInputError as error:
        return rejection(command, ctx, error, stream)
    if row["action"] == AdmissionAction.RELEASE.value:
        return _answer_again(command, ctx, row, True, policy)
    inputs = {"command": command.payload(), "pool": capacity.facts(),
              "admission": {"live_tokens": admission["live_tokens"], "queue": list(queue)}}
    released = _request_event(command, ctx, "decision", decisions[0],
                              _record(row).request, pool_id, now, policy, inputs, [])
    followers = [_request_event(command, ctx, f"promote/{d.request_id}", d,
                                _record(rows[d.request_id]).request, pool_id, now, policy,
                                inputs, [released.event_id]) for d in decisions[1:]]
    appends = [append_to(stream, ctx, released)]
    appends += [append_to(f"request/{e.data['result']['request_id']}", ctx, e) for e in followers]
    remaining = list(after.queue) if promote else [rid for rid in queue if rid != command.request_id]
    appends.append(_pool_event(command, ctx, admission, after.live_tokens, remaining,
                               [released, *followers]))
    return appends


HANDLERS: dict[str, Handler] = {
    "AdmitRequest": handle_admit_request,
    "ReleaseRequest": handle_release_request,
}
