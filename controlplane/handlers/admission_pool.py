"""A pool's side of an admission decision: its budget, and its admission state afterwards.

The budget is the pool's ready KV capacity times `live_token_budget_fraction`. The state after a
decision (`PoolAdmissionChanged`) also says which settled records the decision forgets: the
pool's settled records are walked from the oldest and forgotten, with the pure policy's rule,
while past their TTL or beyond `max_settled_records`. The event names them and the fold deletes
exactly those, so what a later decision reads is what replay rebuilds. A record replaced after it
expired (its id judged afresh) leaves its numbered slot behind; the slot still counts until it is
the oldest and is dropped, so a pool keeps at most `max_settled_records` settled records.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from controlplane.commands.base import CommandBase
from controlplane.decisions import DecisionContext, append_to, decision_data, new_event
from controlplane.policies.admission import AdmissionPolicy
from controlplane.policies.admission_records import forgets_oldest_settled
from controlplane.policies.reasons import Reason
from controlplane.policy_book import PolicyInForce
from controlplane.state.admission import (
    ADMISSION_REQUEST,
    FORGOTTEN,
    POOL_ADMISSION_CHANGED,
    settled_request,
    settled_window,
)
from controlplane.state.fleet import POOL, REPLICA
from events.model import NewEvent, StreamAppend
from events.projections import StateView


@dataclass(frozen=True)
class PoolCapacity:
    """What a pool can serve now (ready replicas) and what is still warming."""

    pool_id: str
    ready: dict[str, int]
    warming: dict[str, int]
    budget_tokens: int
    budget_fraction: float

    def with_ready(self, replica_id: str, tokens: int) -> PoolCapacity:
        """The capacity once `replica_id` serves `tokens` of KV capacity: warming no more, and
        the budget the pool's row will fold to (ready tokens times the same fraction)."""
        ready = dict(sorted({**self.ready, replica_id: tokens}.items()))
        warming = {key: value for key, value in self.warming.items() if key != replica_id}
        return PoolCapacity(self.pool_id, ready, warming,
                            math.floor(sum(ready.values()) * self.budget_fraction),
                            self.budget_fraction)

    def largest_replica_tokens(self) -> int | None:
        """The most KV tokens one replica, ready or warming, holds; None with no replica."""
        return max([*self.ready.values(), *self.warming.values()], default=None)

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
    return PoolCapacity(pool_id, dict(sorted(pool["ready"].items())),
                        dict(sorted(pool["warming"].items())),
                        math.floor(pool["live_token_budget"] * fraction), fraction)


def warming_placements(state: StateView, capacity: PoolCapacity) -> list[str]:
    """The placement decisions of the pool's warming replicas: the capacity on its way.

    Read only when a shed names them, so an admission does not read every warming replica.
    """
    replicas = [state.get(REPLICA, replica_id) for replica_id in capacity.warming]
    return [r["decision_event_id"] for r in replicas if r is not None]


def admission_policy(policy: PolicyInForce, budget_tokens: int = 1,
                     capacity: PoolCapacity | None = None) -> AdmissionPolicy:
    """The pure policy; its retention rules (TTL, settled maximum) do not depend on the budget.
    With `capacity`, no request is admitted that its largest replica cannot hold."""
    parameters = policy.parameters
    return AdmissionPolicy(max_live_tokens=budget_tokens,
                           max_queued_requests=parameters["max_queued_requests"],
                           max_tokens_per_request=parameters["max_tokens_per_request"],
                           record_ttl_seconds=parameters["record_ttl_seconds"],
                           max_settled_records=parameters.get(
                               "max_settled_records", AdmissionPolicy.max_settled_records),
                           max_tokens_per_replica=capacity.largest_replica_tokens()
                           if capacity is not None else None)


def settled_sequences(admission: dict[str, Any]) -> Iterator[int]:
    """The sequence numbers this decision's settled records take, in the order they settle."""
    return itertools.count(settled_window(admission)[1])


def _forget_settled(state: StateView, before: dict[str, Any], decided: list[NewEvent],
                    now: float, rules: AdmissionPolicy) -> tuple[int, int, list[str]]:
    """The pool's settled window after `decided`, and the request ids it forgets, oldest first.

    A slot whose record was since replaced (its id judged afresh) is stale: dropped when it is
    the oldest, forgetting nothing, since the row belongs to the newer decision.
    """
    pool_id = before["pool_id"]
    first, following = settled_window(before)
    fresh = {e.data["result"]["request_id"]: e.data["result"] for e in decided}
    new_slots = {r["settled_sequence"]: request_id for request_id, r in fresh.items()
                 if "settled_sequence" in r}
    following += len(new_slots)
    forgotten: list[str] = []
    while first < following:
        request_id = new_slots.get(first) or settled_request(state, pool_id, first)
        row = None if request_id is None else (
            fresh.get(request_id) or state.get(ADMISSION_REQUEST, request_id))
        if row is not None and row["pool_id"] == pool_id and row.get("settled_sequence") == first:
            if not forgets_oldest_settled(following - first, row["decided_at_seconds"], now, rules):
                break
            forgotten.append(row["request_id"])
        first += 1
    return first, following, forgotten


def pool_event(command: CommandBase, ctx: DecisionContext, before: dict[str, Any],
               live_tokens: int, queue: list[str], decided: list[NewEvent], now: float,
               rules: AdmissionPolicy, slot: str = "pool") -> StreamAppend:
    """The pool's admission state after `decided`, with the settled records it forgets; `slot`
    names the event within its command's decision (one per pool the command changes)."""
    counts = dict(before["decisions"])
    for event in decided:
        counts[event.data["outcome"]] += 1
    first, following, forgotten = _forget_settled(ctx.state, before, decided, now, rules)
    after = {"pool_id": before["pool_id"], "live_tokens": live_tokens, "queue": queue,
             "decisions": counts, "settled_first": first, "settled_next": following,
             FORGOTTEN: forgotten}
    reasons = [Reason("pool_admission_changed", "live-token reservations and queue after the decision",
                      {"live_tokens_before": before["live_tokens"], "live_tokens_after": live_tokens,
                       "queued_before": len(before["queue"]), "queued_after": len(queue),
                       "settled_kept_after": following - first})]
    if forgotten:
        reasons.append(Reason(
            "settled_records_forgotten",
            "settled records past their TTL or beyond the kept maximum are forgotten",
            {"forgotten": len(forgotten), "record_ttl_seconds": rules.record_ttl_seconds,
             "max_settled_records": rules.max_settled_records}))
    data = decision_data(outcome="applied", reasons=reasons, result=after, policy=None, inputs={},
                         ctx=ctx, causes=[event.event_id for event in decided])
    return append_to(f"pool/{before['pool_id']}", ctx,
                     new_event(command, ctx, slot, POOL_ADMISSION_CHANGED, data))
