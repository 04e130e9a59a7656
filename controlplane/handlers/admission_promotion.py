"""Promoting a pool's admission queue when its budget grows without a release.

A replica becoming ready adds its KV capacity; a new admission policy version may raise the
budget fraction. Either way the queue is walked FIFO in the decision that grew the budget, as a
`ReleaseRequest` walks it after freeing tokens (`controlplane.handlers.admission`).
"""

from __future__ import annotations

from typing import Any

from controlplane.commands.base import CommandBase
from controlplane.commands.traffic import seconds
from controlplane.decisions import DecisionContext, append_to
from controlplane.handlers.admission import queued_records, walked_events
from controlplane.handlers.admission_pool import (
    PoolCapacity,
    admission_policy,
    pool_capacity,
    pool_event,
    settled_sequences,
)
from controlplane.policies.admission import CAPACITY_READY, PoolState, promote
from controlplane.policy_book import PolicyInForce
from controlplane.state.admission import ADMISSION
from events.model import StreamAppend


def promote_on_ready(command: CommandBase, ctx: DecisionContext, replica: dict[str, Any],
                     cause_event_id: str) -> list[StreamAppend]:
    """Queued requests a replica's new ready capacity admits, in the decision making it ready.

    The pool's budget grows by the replica's KV capacity times the admission policy's fraction.
    """
    policy = ctx.policies.in_force(ctx.state, "admission")
    before = pool_capacity(ctx.state, replica["pool_id"], policy)
    after = before.with_ready(replica["replica_id"],
                              before.warming.get(replica["replica_id"], replica["kv_capacity_tokens"]))
    return promote_queue(command, ctx, before, after, policy, cause_event_id)


def promote_on_policy(command: CommandBase, ctx: DecisionContext, policy: PolicyInForce,
                      cause_event_id: str) -> list[StreamAppend]:
    """Queued requests a new admission policy version admits, in the decision that sets it.

    A larger `live_token_budget_fraction` grows every pool's budget; each pool with a queue is
    promoted under the new version (`policy`, what later decisions will read).
    """
    old = ctx.policies.in_force(ctx.state, "admission")
    appends: list[StreamAppend] = []
    for pool_id, admission in ctx.state.items(ADMISSION):
        if admission["queue"]:
            appends += promote_queue(command, ctx, pool_capacity(ctx.state, pool_id, old),
                                     pool_capacity(ctx.state, pool_id, policy), policy,
                                     cause_event_id, pool_slot=f"pool/{pool_id}",
                                     why="a larger budget under the new admission policy admits "
                                         "the head of the queue")
    return appends


def promote_queue(command: CommandBase, ctx: DecisionContext, before: PoolCapacity,
                  after: PoolCapacity, policy: PolicyInForce, cause_event_id: str,
                  pool_slot: str = "pool", why: str = CAPACITY_READY) -> list[StreamAppend]:
    """Promote a pool's queue when its budget grows from `before` to `after`, under `policy`.

    The queue is walked from its head (FIFO) while the head fits, a head past its deadline
    shed. Each promotion is a decision of its own on `request/<id>`, caused by
    `cause_event_id` (what grew the budget), and the pool's admission state follows (its event
    in slot `pool_slot`), as a release promotes; `why` is their message. A budget that did not
    grow decides nothing.
    """
    admission = ctx.state.get(ADMISSION, after.pool_id)
    if admission is None or not admission["queue"] or after.budget_tokens <= before.budget_tokens:
        return []
    now = seconds(command.at)
    queue = tuple(admission["queue"])
    records = queued_records(ctx.state, queue)
    rules = admission_policy(policy, after.budget_tokens, after)
    decisions, state = promote(PoolState(admission["live_tokens"], queue, tuple(records.values())),
                               now, rules, why)
    if not decisions:
        return []
    inputs = {"command": command.payload(), "pool": after.facts(),
              "admission": {"live_tokens": admission["live_tokens"], "queue": list(queue)}}
    sequences = settled_sequences(admission)
    promoted = walked_events(command, ctx, decisions, records, after.pool_id, now, policy, inputs,
                             [cause_event_id], sequences)
    appends = [append_to(f"request/{e.data['result']['request_id']}", ctx, e) for e in promoted]
    appends.append(pool_event(command, ctx, admission, state.live_tokens, list(state.queue),
                              promoted, now, rules, slot=pool_slot))
    return appends
