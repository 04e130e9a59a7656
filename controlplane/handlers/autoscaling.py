"""Token-demand autoscaling through the log: observe load, decide a target, act on it.

`ObserveLoad` adds observations to the pool's window and asks `recommend_replicas` (spec 1.10)
for a target with the autoscaling policy in force. Desired capacity is what the pool has asked
for: ready plus warming replicas plus issued placements not yet decided. The decision's
consequences are part of it, in the same transaction:
- a scale-up ISSUES one `PlaceReplica` per missing replica (child command ids
  `<command_id>:place:<n>`, replica ids `<pool_id>-as<seq>`), shaped like the pool's latest
  placement; they are decided later, start warming and add no ready capacity until ready;
- a scale-down releases replicas at once, warming before ready and newest placement first, but
  never a ready replica whose capacity admitted requests still hold: it releases only while the
  pool's live-token budget after the release (ready capacity x the admission policy's
  `live_token_budget_fraction`) still covers the tokens admitted and not yet released. The rest
  wait for a later observation (`scale_down_held_by_admitted_load`);
- a scale-down never releases a replica in place of a placement it issued and has not decided
  yet (`placements_pending`): those cannot be withdrawn and will land. The excess over the
  target is charged to them first (they are the newest) and only the rest releases replicas,
  so a ready one goes only when the excess is more than the pending placements; the first
  observation after they land releases them, warming before ready, and the pool converges to
  the target within [min_replicas, max_replicas]. (Releasing as if they did not exist shed the
  ready replicas and left warming ones only; holding every release while any placement is
  pending would keep a lowered `max_replicas` waiting on one slow placement.)
`target_replicas` (= `desired_replicas_after`) is what the pool asks for after the decision;
where that is not the policy's target, a reason says why and names it (`policy_target_replicas`).
A decision that releases and places nothing is a hold: no cooldown or stabilisation restarts.
Every consequence is caused by (`causes`, `causation_id`) the `ScaleDecided` event.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from controlplane.commands.base import CommandBase
from controlplane.commands.traffic import ObserveLoad, seconds
from controlplane.decisions import (
    DecisionContext,
    append_to,
    decision_data,
    issue_command,
    merge_appends,
    new_event,
    rejection,
)
from controlplane.handlers.autoscaling_scale_down import scale_down_candidates
from controlplane.handlers.autoscaling_scale_up import scale_up_placements
from controlplane.handlers.autoscaling_streams import (
    autoscaler_stream,
    observe_load_reads,
    observe_load_streams,
)
from controlplane.handlers.base import Handler, Reads, Streams
from controlplane.handlers.placement import release_events
from controlplane.policies.autoscaling import (
    AutoscalingPolicy,
    ScaleAction,
    ScaleDecision,
    ScaleObservation,
    ScaleState,
    recommend_replicas,
)
from controlplane.policies.reasons import PolicyInputError, Reason
from controlplane.state.admission import ADMISSION
from controlplane.state.autoscaling import (
    AUTOSCALER,
    DEMAND_FIELDS,
    SCALE_DECIDED,
    demand_of,
    empty_autoscaler,
    next_window,
    observation_key,
    window_bucket_seconds,
)
from controlplane.state.fleet import POOL, REPLICA
from events.model import StreamAppend

POLICY_FIELDS = ("min_replicas", "max_replicas", "service_tokens_per_second_per_replica",
                 "target_utilization", "queue_drain_seconds", "scale_up_cooldown_seconds",
                 "scale_down_stabilization_seconds")


def _fresh(command: ObserveLoad) -> list[dict[str, Any]]:
    return [{"timestamp_seconds": seconds(o.observed_at), "queued_tokens": o.queued_tokens,
             "arrival_tokens_per_second": o.arrival_tokens_per_second}
            for o in command.observations]


def _keep_from(window: list[dict[str, Any]], now: float, stabilization_seconds: float) -> float | None:
    """The oldest time a later decision can need: the newest observation at or before the
    stabilisation window's start proves the window is covered."""
    start = now - stabilization_seconds
    covering = [o["timestamp_seconds"] for o in window if o["timestamp_seconds"] <= start]
    return max(covering) if covering else None


def autoscaler_clock(command: ObserveLoad, row: dict[str, Any]) -> tuple[float, Reason | None]:
    """The time a decision is made at: the command's `at`, unless the pool's autoscaler has
    already decided on a later time (a newer observation in its window, or a later scale).

    With several workers an observation accepted first can be decided after a later one (see
    the README's "Order across batches"), and an operator's scrapers can report late: the late
    observation still joins the window, and the autoscaler's clock never runs backwards (a
    decision at its own older `at` would find the window's newer observations in its future
    and be rejected). Returns the time and, when it is not `at`, the reason saying so.
    """
    at = seconds(command.at)
    latest = max([o["timestamp_seconds"] for o in row["window"]]
                 + [row["last_scale_at_seconds"] or at, at])
    if latest == at:
        return at, None
    return latest, Reason(
        "observation_late",
        f"decided at {latest:g} s, the autoscaler's latest time (a later observation or scale "
        f"of this pool was decided first), not at the command's own time {at:g} s; its "
        "observations join the window as observed",
        {"command_at_seconds": at, "decided_at_seconds": latest})


def _admitted_load(ctx: DecisionContext, pool_id: str) -> dict[str, Any]:
    """The tokens the pool's admitted requests hold, the admission policy's budget fraction, and
    the admission decision that left them so (None before the pool's first)."""
    admission = ctx.state.get(ADMISSION, pool_id) or {"live_tokens": 0, "last_event_id": None}
    policy = ctx.policies.in_force(ctx.state, "admission")
    return {"live_tokens": admission["live_tokens"],
            "live_token_budget_fraction": policy.parameters["live_token_budget_fraction"],
            "admission_event_id": admission["last_event_id"]}


def _releasable(pool: dict[str, Any], victims: list[str], live_tokens: int,
                fraction: float) -> tuple[list[str], Reason | None]:
    """The leading `victims` a scale-down may release now, and why it stops short, if it does.

    A warming replica serves nothing and always goes; a ready one goes only if the budget left
    (`floor(ready tokens after x fraction)`, as admission computes it) covers `live_tokens`.
    The order is kept: the first replica that must stay keeps every one after it.
    """
    remaining = sum(pool["ready"].values())
    for index, replica_id in enumerate(victims):
        tokens = pool["ready"].get(replica_id, 0)
        budget_without = math.floor((remaining - tokens) * fraction)
        if tokens and budget_without < live_tokens:
            deferred = victims[index:]
            return victims[:index], Reason(
                "scale_down_held_by_admitted_load",
                f"{len(deferred)} replica(s) kept: admitted requests hold {live_tokens} tokens, "
                f"which the budget without {replica_id} ({budget_without} tokens) would not cover",
                {"live_tokens": live_tokens, "live_token_budget_fraction": fraction,
                 "ready_tokens_kept": remaining, "deferred_replicas": deferred})
        remaining -= tokens
    return victims, None


def _state(pool: dict[str, Any], row: dict[str, Any]) -> ScaleState:
    ready, warming = len(pool["ready"]), len(pool["warming"])
    return ScaleState(desired_replicas=ready + warming + len(row["pending_placements"]),
                      ready_replicas=ready, warming_replicas=warming,
                      last_scale_at_seconds=row["last_scale_at_seconds"] or 0.0,
                      unfinished_scale_down_to=row.get("unfinished_scale_down_to"))


def handle_observe_load(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Decide a replica target from token demand; place or release replicas to reach it."""
    assert isinstance(command, ObserveLoad)
    stream = autoscaler_stream(command.pool_id)
    policy = ctx.policies.in_force(ctx.state, "autoscaling")
    parameters = policy.parameters
    pool = ctx.state.get(POOL, command.pool_id) or {"ready": {}, "warming": {}}
    row = ctx.state.get(AUTOSCALER, command.pool_id) or empty_autoscaler(command.pool_id)
    now, late = autoscaler_clock(command, row)
    window = sorted(row["window"] + _fresh(command), key=observation_key)
    state = _state(pool, row)
    try:
        decision = recommend_replicas(
            [ScaleObservation(o["timestamp_seconds"], o["queued_tokens"],
                              o["arrival_tokens_per_second"]) for o in window],
            state, AutoscalingPolicy(**{name: parameters[name] for name in POLICY_FIELDS}), now=now)
    except PolicyInputError as error:
        return rejection(command, ctx, error, stream)
    reasons = [*decision.reasons, *([late] if late is not None else [])]
    to_add = max(0, decision.target_replicas - state.desired_replicas)
    if to_add and row["replica_template"] is None:
        # Nothing can be placed, so nothing scales: a hold, which starts no cooldown (recorded
        # as a scale-up it had delayed the first real one by the whole cooldown).
        reasons.append(Reason(
            "no_replica_template",
            f"the pool has no placed replica to copy: it stays at {state.desired_replicas} "
            f"replica(s), short of the policy's target of {decision.target_replicas}",
            {"missing_replicas": to_add, "policy_target_replicas": decision.target_replicas,
             "min_replicas": parameters["min_replicas"],
             "max_replicas": parameters["max_replicas"]}))
        to_add = 0
        decision = dataclasses.replace(decision, action=ScaleAction.HOLD,
                                       target_replicas=state.desired_replicas)
    children, issued = scale_up_placements(command, ctx, row, to_add)
    victims: list[str] = []
    admitted: dict[str, Any] | None = None
    held: Reason | None = None
    unfinished: int | None = None
    if decision.action is ScaleAction.SCALE_DOWN:
        candidates, awaiting = scale_down_candidates(
            pool, row, state.desired_replicas - decision.target_replicas)
        admitted = _admitted_load(ctx, command.pool_id)
        victims, held = _releasable(pool, candidates, admitted["live_tokens"],
                                    admitted["live_token_budget_fraction"])
        reasons += [dataclasses.replace(
            r, facts={**r.facts, "policy_target_replicas": decision.target_replicas})
            for r in (awaiting, held) if r is not None]
        if state.desired_replicas - len(victims) > decision.target_replicas:
            unfinished = decision.target_replicas  # the policy's, which the pool falls short of
        # The target recorded is what the pool still asks for; releasing nothing is a hold.
        decision = dataclasses.replace(
            decision, target_replicas=state.desired_replicas - len(victims),
            action=ScaleAction.SCALE_DOWN if victims else ScaleAction.HOLD)
    acted = decision.action is not ScaleAction.HOLD
    result = {**_result(command, decision, state, parameters, window, now),
              "placements": [{"replica_id": c.replica_id, "command_id": c.command_id}
                             for c in children],
              "releases": victims, "replicas_issued": issued,
              "unfinished_scale_down_to": unfinished,
              "last_scale_at_seconds": now if acted else row["last_scale_at_seconds"]}
    inputs = {"command": command.payload(), "state": state,
              "window": window, "pool": {"ready": pool["ready"], "warming": pool["warming"]},
              **({"admitted": admitted} if admitted is not None else {})}
    # A hold is explained by the last scale change (its cooldown or window), or by the admission
    # decision that left the load a release would not fit; an action by demand.
    held_by = (admitted["admission_event_id"] if held is not None and admitted
               else row["last_scale_event_id"] if not acted else None)
    data = decision_data(outcome=decision.action.value, reasons=reasons, result=result,
                         policy=policy, inputs=inputs, ctx=ctx, causes=[held_by] if held_by else [])
    decided = new_event(command, ctx, "decision", SCALE_DECIDED, data)
    appends = [append_to(stream, ctx, decided)]
    appends += [issue_command(command, ctx, child, decided.event_id) for child in children]
    for replica_id in victims:
        replica = ctx.state.get(REPLICA, replica_id)
        if replica is not None:
            appends = merge_appends(appends, release_events(command, ctx, replica, "scaled_down",
                                                            decided.event_id))
    return appends


def _result(command: ObserveLoad, decision: ScaleDecision, state: ScaleState,
            parameters: dict[str, Any], window: list[dict[str, Any]],
            now: float) -> dict[str, Any]:
    stabilization = parameters["scale_down_stabilization_seconds"]
    keep_from = _keep_from(window, now, stabilization)
    limit = parameters["max_window_observations"]
    bucket = window_bucket_seconds(stabilization, limit)
    # What the fold merges the kept window by: this decision's demand rule.
    window_demand = {name: parameters[name] for name in DEMAND_FIELDS}
    return {"pool_id": command.pool_id, "action": decision.action.value,
            "target_replicas": decision.target_replicas,
            "calculated_demand_replicas": decision.calculated_demand_replicas,
            "ready_capacity_tokens_per_second": decision.ready_capacity_tokens_per_second,
            "desired_replicas_before": state.desired_replicas,
            "desired_replicas_after": decision.target_replicas,
            "ready_replicas": state.ready_replicas, "warming_replicas": state.warming_replicas,
            "observations": _fresh(command), "window_keep_from_seconds": keep_from,
            "window_limit": limit, "window_bucket_seconds": bucket, "window_demand": window_demand,
            "window_size_after": len(next_window(window, keep_from, limit, bucket,
                                                 demand_of(window_demand)))}


HANDLERS: dict[str, Handler] = {"ObserveLoad": handle_observe_load}

# Versions of the decision rules, each with what changed (see `handlers/base.py`).
RULES_VERSIONS: dict[str, int] = {
    # 2: the kept window keeps its oldest observation and merges the middle per span; a
    #    scale-up with no replica to copy is a hold.
    # 3: a scale-down never releases capacity admitted requests still hold.
    # 4: the kept window merges a span into its observation of the highest demand, not into
    #    the largest queued tokens and arrival rate of any (a demand none of them had).
    # 5: a scale-down charges its excess to undecided placements first and releases no replica
    #    in their place (`placements_pending`); a hold names the policy's target it falls short of.
    # 6: a late observation (its `at` before the autoscaler's newest observation or scale) is
    #    decided at the autoscaler's latest time (`observation_late`), not rejected as
    #    `observation_in_future`; a scale-down's freed GPUs follow each release in the log.
    # 7: the replicas a scale-down had to keep (admitted load, undecided placements) go at a
    #    later observation without waiting a new stabilisation window (`scale_down_continued`):
    #    the partial release had restarted it, so they stayed a full window longer than when
    #    every release was held.
    "ObserveLoad": 7,
}
READS: dict[str, Reads] = {"ObserveLoad": observe_load_reads}
STREAMS: dict[str, Streams] = {"ObserveLoad": observe_load_streams}
