"""Autoscaling: replicas from token demand (arrivals plus backlog), never from CPU (spec §1.10).

Demand per observation = ceil(arrival / (service x target utilisation)) + ceil(queued /
(service x drain window)), clamped to [min, max]. Choices on the reference's quirks (spec §8):

- Scale-up acts on the newest demand once `scale_up_cooldown_seconds` have passed since the last
  scale change. Scale-down needs (a) observations covering the whole stabilisation window,
  (b) every demand in the window below the desired count, and (c) a full stabilisation window
  since the last scale change (the reference ignored it); it then goes to the *highest* demand
  in the window, not the newest. This asymmetry is the hysteresis: a brief dip never sheds
  capacity, and a scale-up is not undone before a full window has passed. A scale-down that
  could release only part of its excess (admitted requests or undecided placements kept the
  rest: `ScaleState.unfinished_scale_down_to`) is not a new change to wait a window after: the
  replicas it kept go once they may, while (a) and (b) hold, down to its target at most.
- The backlog term drains at the undiscounted service rate, on purpose: the extra replicas exist
  to clear a transient queue, while the arrival term already keeps utilisation headroom.
- The target is clamped to [min, max] last, whatever the path (bug 6), and says so in a reason.
- Warming replicas count toward desired capacity but add no ready throughput (bug 8).
- `cpu_utilization` is accepted and ignored: CPU has no authority over token demand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from controlplane.policies.reasons import Reason, require


class ScaleAction(StrEnum):
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    HOLD = "hold"


@dataclass(frozen=True)
class ScaleObservation:
    timestamp_seconds: float
    queued_tokens: int
    arrival_tokens_per_second: float
    cpu_utilization: float = 0.0


@dataclass(frozen=True)
class ScaleState:
    """The pool as the autoscaler counts it. `unfinished_scale_down_to`: the target of the last
    scale-down when it released fewer replicas than it decided (admitted load or undecided
    placements kept some); None once a scale change reaches its target or the demand it
    judged is gone."""

    desired_replicas: int
    ready_replicas: int
    warming_replicas: int
    last_scale_at_seconds: float
    unfinished_scale_down_to: int | None = None


@dataclass(frozen=True)
class AutoscalingPolicy:
    min_replicas: int
    max_replicas: int
    service_tokens_per_second_per_replica: float
    target_utilization: float
    queue_drain_seconds: float
    scale_up_cooldown_seconds: float
    scale_down_stabilization_seconds: float


@dataclass(frozen=True)
class ScaleDecision:
    action: ScaleAction
    target_replicas: int
    calculated_demand_replicas: int
    ready_capacity_tokens_per_second: float
    reasons: tuple[Reason, ...]


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _count(value: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _product(*factors: float) -> float:
    """The factors' product as a float; infinity when it, or an integer factor, overflows."""
    try:
        return math.prod(float(factor) for factor in factors)
    except OverflowError:
        return math.inf


def _validate(observations: Sequence[ScaleObservation], state: ScaleState,
              policy: AutoscalingPolicy, now: float) -> None:
    require(len(observations) > 0, "no_observations", "observations",
            "at least one scale observation is required")
    require(_count(policy.min_replicas) and policy.min_replicas > 0, "replica_bounds_invalid",
            "min_replicas", "min_replicas must be a positive integer")
    require(_count(policy.max_replicas) and policy.max_replicas >= policy.min_replicas,
            "replica_bounds_invalid", "max_replicas", "max_replicas may not be below min_replicas")
    service = policy.service_tokens_per_second_per_replica
    require(_finite(service) and service > 0, "service_rate_not_positive",
            "service_tokens_per_second_per_replica", "service rate must be positive and finite")
    utilization = policy.target_utilization
    require(_finite(utilization) and 0 < utilization <= 1, "target_utilization_out_of_range",
            "target_utilization", "target_utilization must be in (0, 1]")
    for name in ("queue_drain_seconds", "scale_up_cooldown_seconds",
                 "scale_down_stabilization_seconds"):
        value = getattr(policy, name)
        require(_finite(value) and value >= 0, "timing_window_invalid", name,
                f"{name} must be finite and non-negative")
    require(policy.queue_drain_seconds > 0, "timing_window_invalid", "queue_drain_seconds",
            "queue_drain_seconds must be positive")
    # Each is in range, yet the tokens a replica serves can still underflow to nothing.
    require(service * utilization > 0, "service_rate_not_positive",
            "service_tokens_per_second_per_replica",
            "service rate times target_utilization must be a positive number")
    require(service * policy.queue_drain_seconds > 0, "service_rate_not_positive",
            "service_tokens_per_second_per_replica",
            "service rate times queue_drain_seconds must be a positive number")
    for name in ("desired_replicas", "ready_replicas", "warming_replicas"):
        require(_count(getattr(state, name)) and getattr(state, name) >= 0,
                "replica_count_negative", name, f"{name} must be a non-negative integer")
    require(state.ready_replicas + state.warming_replicas <= state.desired_replicas,
            "ready_and_warming_exceed_desired", "desired_replicas",
            "ready plus warming replicas exceed desired replicas")
    require(_finite(state.last_scale_at_seconds), "time_not_finite", "last_scale_at_seconds",
            "last_scale_at_seconds must be finite")
    require(_finite(now), "time_not_finite", "now", "now must be finite")
    for observation in observations:
        require(_finite(observation.timestamp_seconds) and observation.timestamp_seconds <= now,
                "observation_in_future", "timestamp_seconds",
                "observations must be finite times no later than now")
        require(_count(observation.queued_tokens) and observation.queued_tokens >= 0
                and _finite(observation.arrival_tokens_per_second)
                and observation.arrival_tokens_per_second >= 0,
                "observation_demand_negative", "arrival_tokens_per_second",
                "observed demand must be finite and non-negative")
        require(_finite(_product(observation.queued_tokens)), "queued_tokens_out_of_range",
                "queued_tokens", "queued_tokens is out of numeric range")
    # Each input is in range, yet a figure the decision reports can still overflow: refuse it
    # here rather than decide with an infinity no log can hold (capacity checks the same way).
    require(_finite(_product(state.ready_replicas, service, utilization)),
            "ready_capacity_not_finite", "ready_replicas",
            "ready_replicas x service_tokens_per_second_per_replica x target_utilization is out "
            "of numeric range")
    require(_finite(now - state.last_scale_at_seconds), "time_not_finite",
            "last_scale_at_seconds", "the time since last_scale_at_seconds is out of numeric range")
    require(_finite(now - policy.scale_down_stabilization_seconds), "timing_window_invalid",
            "scale_down_stabilization_seconds",
            "the stabilisation window reaches back out of numeric range")


def _clamp(value: int, policy: AutoscalingPolicy) -> int:
    return max(policy.min_replicas, min(policy.max_replicas, value))


def _ceil_at_most(value: float, cap: int) -> int:
    # The sum is clamped to max_replicas anyway; capping first keeps an overflowing ratio finite.
    return math.ceil(value) if value <= cap else cap


def demand_replicas(observation: ScaleObservation, policy: AutoscalingPolicy) -> int:
    """Replicas one observation needs: arrivals at target utilisation plus backlog drain."""
    service = policy.service_tokens_per_second_per_replica
    cap = policy.max_replicas
    rate = _ceil_at_most(
        observation.arrival_tokens_per_second / (service * policy.target_utilization), cap)
    backlog = _ceil_at_most(observation.queued_tokens / (service * policy.queue_drain_seconds),
                            cap)
    return _clamp(rate + backlog, policy)


def recommend_replicas(observations: Sequence[ScaleObservation], state: ScaleState,
                       policy: AutoscalingPolicy, *, now: float) -> ScaleDecision:
    """Recommend a target that is always within [min_replicas, max_replicas]."""
    _validate(observations, state, policy, now)
    # Ties on time are broken by the observation's own values, so input order never matters;
    # among simultaneous observations the busiest counts as the newest.
    ordered = sorted(observations, key=lambda o: (o.timestamp_seconds, demand_replicas(o, policy),
                                                  o.queued_tokens, o.arrival_tokens_per_second))
    demands = [demand_replicas(o, policy) for o in ordered]
    newest = demands[-1]
    desired = state.desired_replicas
    since_scale = now - state.last_scale_at_seconds
    facts: dict[str, object] = {
        "desired_replicas": desired, "demand_replicas": newest,
        "newest_arrival_tokens_per_second": ordered[-1].arrival_tokens_per_second,
        "newest_queued_tokens": ordered[-1].queued_tokens,
        "seconds_since_last_scale": since_scale}
    target = desired
    if newest > desired:
        if since_scale >= policy.scale_up_cooldown_seconds:
            target = newest
            reason = Reason("scale_up_cleared_cooldown",
                            "arrival and queued-token demand cleared the scale-up cooldown",
                            facts)
        else:
            reason = Reason("scale_up_inside_cooldown", "scale-up demand is inside the cooldown",
                            {**facts, "cooldown_seconds": policy.scale_up_cooldown_seconds})
    elif newest < desired:
        window_start = now - policy.scale_down_stabilization_seconds
        in_window = [d for o, d in zip(ordered, demands, strict=True)
                     if o.timestamp_seconds >= window_start]
        facts = {**facts, "window_start_seconds": window_start,
                 "oldest_observation_seconds": ordered[0].timestamp_seconds,
                 "window_peak_demand_replicas": max(in_window) if in_window else None}
        if ordered[0].timestamp_seconds > window_start:
            reason = Reason("scale_down_window_incomplete",
                            "observations do not yet cover the stabilisation window", facts)
        elif not in_window:
            reason = Reason("scale_down_observations_stale",
                            "no observation falls inside the stabilisation window", facts)
        elif max(in_window) >= desired:
            reason = Reason("scale_down_demand_not_sustained",
                            "demand inside the stabilisation window reached the desired count",
                            facts)
        elif since_scale < policy.scale_down_stabilization_seconds \
                and state.unfinished_scale_down_to is not None \
                and state.unfinished_scale_down_to < desired:
            # The replicas the last scale-down had to keep go once they may, the window still
            # low: it already waited out a full window, and it is still the same scale change.
            target = max(max(in_window), state.unfinished_scale_down_to)
            reason = Reason("scale_down_continued",
                            "the last scale-down kept replicas it could not release yet; lower "
                            "demand persists, so it goes on toward its target",
                            {**facts, "unfinished_scale_down_to": state.unfinished_scale_down_to})
        elif since_scale < policy.scale_down_stabilization_seconds:
            reason = Reason("scale_down_inside_cooldown",
                            "the last scale change is more recent than the stabilisation window",
                            facts)
        else:
            target = max(in_window)
            reason = Reason("scale_down_after_stable_window",
                            "lower token demand persisted for the full stabilisation window",
                            facts)
    else:
        reason = Reason("demand_matches_desired",
                        "current desired capacity matches calculated token demand", facts)
    reasons = [reason]
    bounded = _clamp(target, policy)
    if bounded != target:
        reasons.append(Reason("clamped_to_policy_bound",
                              f"clamped from {target} to the policy bound {bounded}",
                              {"unclamped_target_replicas": target, "target_replicas": bounded,
                               "min_replicas": policy.min_replicas,
                               "max_replicas": policy.max_replicas}))
    action = (ScaleAction.SCALE_UP if bounded > desired
              else ScaleAction.SCALE_DOWN if bounded < desired else ScaleAction.HOLD)
    ready_capacity = _product(state.ready_replicas, policy.service_tokens_per_second_per_replica,
                              policy.target_utilization)
    return ScaleDecision(action, bounded, newest, ready_capacity, tuple(reasons))
