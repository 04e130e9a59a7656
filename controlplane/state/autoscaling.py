"""Autoscaler read model, one row per pool: desired count, cooldown clock, observation window.

Besides its own `ScaleDecided` events it folds the fleet's placement facts into the same row:
the replica shape to copy on a scale-up (the pool's latest placement), when each live replica
was placed (scale-down releases the newest first), and which issued placements are still
undecided (they count toward desired capacity so a second scale-up does not repeat them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from controlplane.decisions import REJECTED
from controlplane.policies.autoscaling import AutoscalingPolicy, ScaleObservation, demand_replicas
from controlplane.state.base import Projector
from controlplane.state.fleet import PLACEMENT_REFUSED, REPLICA_PLACED, REPLICA_RELEASED
from events.model import RecordedEvent
from events.projections import StateStore

Demand = Callable[[dict[str, Any]], int]
AUTOSCALER = "autoscaler"
SCALE_DECIDED = "ScaleDecided"
TEMPLATE_FIELDS = ("model_id", "max_live_tokens_per_request", "target_concurrency",
                   "runtime_overhead_gib", "required_capabilities", "locality")


def empty_autoscaler(pool_id: str) -> dict[str, Any]:
    """A pool's autoscaler before anything happened to it."""
    return {"pool_id": pool_id, "desired_replicas": None, "last_scale_at_seconds": None,
            "last_action": None, "last_decision_event_id": None, "last_scale_event_id": None,
            "window": [],
            "replica_template": None, "members": {}, "pending_placements": [],
            "replicas_issued": 0, "unfinished_scale_down_to": None}


def observation_key(observation: dict[str, Any]) -> tuple[float, int, float]:
    """The window's order: by time, ties broken by the values themselves."""
    return (observation["timestamp_seconds"], observation["queued_tokens"],
            observation["arrival_tokens_per_second"])


def window_bucket_seconds(stabilization_seconds: float, limit: int) -> float | None:
    """The span of time a retained window merges its observations over once it holds more than
    `limit`: the stabilisation window fits in about half of `limit` such spans."""
    if limit < 4 or stabilization_seconds <= 0:
        return None
    return 2 * stabilization_seconds / (limit - 2)


# The autoscaling parameters an observation's demand depends on: what a decision records
# (`window_demand`) for the fold to merge its kept window by.
DEMAND_FIELDS = ("min_replicas", "max_replicas", "service_tokens_per_second_per_replica",
                 "target_utilization", "queue_drain_seconds")


def demand_of(parameters: dict[str, Any]) -> Demand:
    """The replicas an observation needs (`policies.autoscaling.demand_replicas`) under the
    autoscaling policy's DEMAND_FIELDS in `parameters`."""
    # Demand reads neither timing window: they are set only to build the policy value.
    rules = AutoscalingPolicy(**{name: parameters[name] for name in DEMAND_FIELDS},
                              scale_up_cooldown_seconds=0.0, scale_down_stabilization_seconds=0.0)
    return lambda o: demand_replicas(ScaleObservation(
        o["timestamp_seconds"], o["queued_tokens"], o["arrival_tokens_per_second"]), rules)


def next_window(window: list[dict[str, Any]], keep_from_seconds: float | None, limit: int,
                bucket_seconds: float | None = None,
                demand: Demand | None = None) -> list[dict[str, Any]]:
    """The retained observations: none older than `keep_from_seconds`, at most `limit`.

    Past `limit`, with `bucket_seconds` (`window_bucket_seconds`), the oldest observation and
    the newest are kept as they are and those between are merged per span of `bucket_seconds`
    (aligned on multiples of it): one observation stamped at the newest of the span's, with
    the values of the one among them of the highest `demand` (the latest of equals). The
    oldest is what can prove a later decision's stabilisation window covered: keeping only the
    newest `limit` had kept a pool observed every second (256 kept, a 300 s window) from ever
    scaling down. A merged observation is a real one's demand, the span's highest, so under
    the same policy the window's highest demand is what it would be without merging, and a
    scale-down may wait up to one span longer (the stamp), never come sooner or go elsewhere;
    a span entirely before the window's start is dropped with everything older than the
    observation that covers it. Without `demand` (decisions recorded before rules version 4,
    whose results hold no `window_demand`) the span takes the largest queued tokens and
    arrival rate of any of its observations, as it did then (a demand none of them might have
    had); without `bucket_seconds` (before version 2) the newest `limit` are kept.
    """
    kept = sorted(window, key=observation_key)
    if keep_from_seconds is not None:
        kept = [o for o in kept if o["timestamp_seconds"] >= keep_from_seconds]
    if len(kept) <= limit:
        return kept
    if bucket_seconds is None:
        return kept[-limit:]
    spans: dict[int, dict[str, Any]] = {}
    for observation in kept[1:-1]:
        span = math.floor(observation["timestamp_seconds"] / bucket_seconds)
        earlier = spans.get(span)
        spans[span] = observation if earlier is None else _merged(earlier, observation, demand)
    thinned = [*spans.values(), kept[-1]]
    return [kept[0], *thinned[len(thinned) - (limit - 1):]] if len(thinned) >= limit \
        else [kept[0], *thinned]


def _merged(earlier: dict[str, Any], later: dict[str, Any],
            demand: Demand | None) -> dict[str, Any]:
    """One observation for two of a span, stamped at the later (see `next_window`)."""
    if demand is not None:
        values = earlier if demand(earlier) > demand(later) else later
        return {**values, "timestamp_seconds": later["timestamp_seconds"]}
    return {"timestamp_seconds": later["timestamp_seconds"],
            "queued_tokens": max(earlier["queued_tokens"], later["queued_tokens"]),
            "arrival_tokens_per_second": max(earlier["arrival_tokens_per_second"],
                                             later["arrival_tokens_per_second"])}


def _row(state: StateStore, pool_id: str) -> dict[str, Any]:
    return state.get(AUTOSCALER, pool_id) or empty_autoscaler(pool_id)


def _scale_decided(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    row = _row(state, result["pool_id"])
    row.update(
        desired_replicas=result["desired_replicas_after"],
        last_scale_at_seconds=result["last_scale_at_seconds"], last_action=result["action"],
        last_decision_event_id=event.event_id,
        last_scale_event_id=event.event_id if result["action"] != "hold"
        else row["last_scale_event_id"],
        window=next_window(row["window"] + result["observations"],
                           result["window_keep_from_seconds"], result["window_limit"],
                           result.get("window_bucket_seconds"),
                           demand_of(result["window_demand"]) if "window_demand" in result
                           else None),
        pending_placements=row["pending_placements"]
        + [placement["replica_id"] for placement in result["placements"]],
        replicas_issued=result["replicas_issued"],
        # Absent before ObserveLoad rules version 7: no scale-down was continued then.
        unfinished_scale_down_to=result.get("unfinished_scale_down_to"))
    state.put(AUTOSCALER, result["pool_id"], row)


def _settle_pending(row: dict[str, Any], replica_id: str) -> None:
    row["pending_placements"] = [r for r in row["pending_placements"] if r != replica_id]


def _replica_placed(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    row = _row(state, result["pool_id"])
    command = event.data["inputs"]["command"]
    row["replica_template"] = {**{name: command[name] for name in TEMPLATE_FIELDS},
                               "tensor_parallel_size": result["tensor_parallel"]}
    row["members"] = {**row["members"], result["replica_id"]: event.position}
    _settle_pending(row, result["replica_id"])
    state.put(AUTOSCALER, result["pool_id"], row)


def _placement_refused(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    row = state.get(AUTOSCALER, result["pool_id"])
    if row is not None and result["replica_id"] in row["pending_placements"]:
        _settle_pending(row, result["replica_id"])
        state.put(AUTOSCALER, result["pool_id"], row)


def _placement_rejected(state: StateStore, event: RecordedEvent) -> None:
    # A PlaceReplica refused before placement (e.g. the replica id exists) is settled too.
    command = event.data.get("inputs") or {}
    if command.get("type") != "PlaceReplica":
        return
    row = state.get(AUTOSCALER, command["pool_id"])
    if row is not None and command["replica_id"] in row["pending_placements"]:
        _settle_pending(row, command["replica_id"])
        state.put(AUTOSCALER, command["pool_id"], row)


def _replica_released(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    row = state.get(AUTOSCALER, result["pool_id"])
    if row is not None and result["replica_id"] in row["members"]:
        row["members"] = {k: v for k, v in row["members"].items() if k != result["replica_id"]}
        state.put(AUTOSCALER, result["pool_id"], row)


PROJECTORS: dict[str, list[Projector]] = {
    SCALE_DECIDED: [_scale_decided],
    REPLICA_PLACED: [_replica_placed],
    PLACEMENT_REFUSED: [_placement_refused],
    REJECTED: [_placement_rejected],
    REPLICA_RELEASED: [_replica_released],
}
