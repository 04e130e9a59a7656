"""Fleet sizing from a workload mix and a measured replica benchmark, then cost (spec §1.12).

Sizing comes first and the budget gate second: a fleet that costs too much is reported as a
violation at its required size, never shrunk until it fits the budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from controlplane.policies.reasons import Reason, require


class CapacityDimension(StrEnum):
    DECODE_TOKENS = "decode_tokens"
    MINIMUM_REPLICA_FLOOR = "minimum_replica_floor"
    PREFILL_TOKENS = "prefill_tokens"
    REQUEST_CONCURRENCY = "request_concurrency"


@dataclass(frozen=True)
class WorkloadClass:
    """One class of traffic, by its mean request shape and its burst factor."""

    name: str
    requests_per_second: float
    prompt_tokens: float
    output_tokens: float
    mean_service_seconds: float
    burst_multiplier: float = 1.0


@dataclass(frozen=True)
class ReplicaBenchmark:
    """What one replica measured, plus the supplied price of running it for an hour."""

    name: str
    prefill_tokens_per_second: float
    output_tokens_per_second: float
    max_concurrent_requests: float
    hourly_cost: float


@dataclass(frozen=True)
class CapacityRequirements:
    min_replicas: int
    max_replicas: int
    reserved_headroom_fraction: float
    max_hourly_cost: float


@dataclass(frozen=True)
class DimensionDemand:
    dimension: CapacityDimension
    unrounded_replicas: float
    required_replicas: int


@dataclass(frozen=True)
class CapacityPlan:
    release_ready: bool
    required_replicas: int
    bottleneck: CapacityDimension
    binding_dimensions: tuple[CapacityDimension, ...]
    prompt_tokens_per_second: float
    output_tokens_per_second: float
    concurrent_requests: float
    reserved_headroom_fraction: float
    hourly_cost: float
    cost_per_million_output_tokens: float
    demands: tuple[DimensionDemand, ...]
    violations: tuple[Reason, ...]
    reasons: tuple[Reason, ...]


def _finite(value: float, code: str, field: str) -> None:
    require(math.isfinite(value), code, field, f"{field} must be finite")


MAX_REPLICAS = 10**15


def _validate(workloads: Sequence[WorkloadClass], benchmark: ReplicaBenchmark,
              requirements: CapacityRequirements) -> None:
    require(len(workloads) > 0, "workloads_empty", "workloads",
            "at least one workload class is required")
    names = [workload.name for workload in workloads]
    for index, workload in enumerate(workloads):
        require(bool(workload.name.strip()) and names.count(workload.name) == 1,
                "workload_name_invalid", f"workloads[{index}].name",
                "workload names must be present and unique")
    for index, workload in enumerate(workloads):
        where = f"workloads[{index}]"
        for name, floor_ok in (("requests_per_second", workload.requests_per_second >= 0),
                               ("prompt_tokens", workload.prompt_tokens >= 0),
                               ("output_tokens", workload.output_tokens >= 0),
                               ("mean_service_seconds", workload.mean_service_seconds > 0),
                               ("burst_multiplier", workload.burst_multiplier >= 1)):
            _finite(getattr(workload, name), "workload_rate_not_finite", f"{where}.{name}")
            require(floor_ok, "workload_rate_invalid", f"{where}.{name}",
                    f"{name} is out of range")
    # Cost per output token is undefined without output demand.
    require(sum(w.output_tokens * w.requests_per_second for w in workloads) > 0,
            "output_demand_not_positive", "workloads",
            "positive output-token demand is required to normalise cost")
    require(bool(benchmark.name.strip()), "benchmark_invalid", "benchmark.name",
            "the benchmark must be named")
    for name, may_be_zero in (("prefill_tokens_per_second", False),
                              ("output_tokens_per_second", False),
                              ("max_concurrent_requests", False), ("hourly_cost", True)):
        value = getattr(benchmark, name)
        _finite(value, "benchmark_not_finite", f"benchmark.{name}")
        require(value >= 0 if may_be_zero else value > 0, "benchmark_invalid",
                f"benchmark.{name}", "benchmark capacities must be positive and cost non-negative")
    for name in ("min_replicas", "max_replicas"):
        value = getattr(requirements, name)
        require(isinstance(value, int) and not isinstance(value, bool), "replica_bounds_invalid",
                f"requirements.{name}", "replica bounds are whole replicas")
        # A float holds any count below this exactly; past a float's range it had overflowed.
        require(value <= MAX_REPLICAS, "replica_bounds_invalid", f"requirements.{name}",
                f"replica bounds are at most {MAX_REPLICAS:.0e}")
    require(requirements.min_replicas > 0, "replica_bounds_invalid", "requirements.min_replicas",
            "at least one replica is required")
    require(requirements.max_replicas >= requirements.min_replicas, "replica_bounds_invalid",
            "requirements.max_replicas", "the replica ceiling is below the floor")
    headroom = requirements.reserved_headroom_fraction
    _finite(headroom, "headroom_not_finite", "requirements.reserved_headroom_fraction")
    require(0 <= headroom < 1, "headroom_out_of_range", "requirements.reserved_headroom_fraction",
            "reserved headroom must be in [0, 1)")
    _finite(requirements.max_hourly_cost, "hourly_budget_not_finite",
            "requirements.max_hourly_cost")
    require(requirements.max_hourly_cost >= 0, "hourly_budget_negative",
            "requirements.max_hourly_cost", "the hourly budget may not be negative")


def _bottleneck(demands: Sequence[DimensionDemand], required: int) -> CapacityDimension:
    # Only dimensions that bind after rounding qualify; among them the largest unrounded demand
    # wins, and an exact unrounded tie goes to the greatest name (the reference's tie rule).
    # Ranking by the rounded value instead once named the slackest dimension (spec §9 bug 4).
    binding = [d for d in demands if d.required_replicas == required]
    return max(binding, key=lambda d: (d.unrounded_replicas, d.dimension.value)).dimension


def plan_capacity(workloads: Sequence[WorkloadClass], benchmark: ReplicaBenchmark,
                  requirements: CapacityRequirements) -> CapacityPlan:
    """Size the fleet by its most demanding dimension; cost is reported, never used to shrink it."""
    _validate(workloads, benchmark, requirements)
    usable_fraction = 1 - requirements.reserved_headroom_fraction
    prompt_tps = float(sum(w.requests_per_second * w.prompt_tokens * w.burst_multiplier
                           for w in workloads))
    output_tps = float(sum(w.requests_per_second * w.output_tokens * w.burst_multiplier
                           for w in workloads))
    # Little's law: concurrency is arrival rate times time in service.
    concurrent = float(sum(w.requests_per_second * w.mean_service_seconds * w.burst_multiplier
                           for w in workloads))
    unrounded = {
        CapacityDimension.MINIMUM_REPLICA_FLOOR: float(requirements.min_replicas),
        CapacityDimension.PREFILL_TOKENS:
            prompt_tps / (benchmark.prefill_tokens_per_second * usable_fraction),
        CapacityDimension.DECODE_TOKENS:
            output_tps / (benchmark.output_tokens_per_second * usable_fraction),
        CapacityDimension.REQUEST_CONCURRENCY:
            concurrent / (benchmark.max_concurrent_requests * usable_fraction),
    }
    # Finite inputs can still overflow to infinity, which no replica count can answer.
    require(all(math.isfinite(value) for value in unrounded.values()), "demand_not_finite",
            "workloads", "the workload demand is out of numeric range")
    demands = tuple(DimensionDemand(dimension, value, math.ceil(value))
                    for dimension, value in sorted(unrounded.items()))
    required = max(d.required_replicas for d in demands)
    binding = tuple(d.dimension for d in demands if d.required_replicas == required)
    bottleneck = _bottleneck(demands, required)
    hourly_cost = float(required * benchmark.hourly_cost)
    cost_per_million = hourly_cost / (output_tps * 3600) * 1_000_000
    require(math.isfinite(hourly_cost) and math.isfinite(cost_per_million), "cost_not_finite",
            "benchmark.hourly_cost", "the fleet cost is out of numeric range")
    sizing = Reason(
        "fleet_sized_by_bottleneck",
        f"{bottleneck.value.replace('_', ' ')} sets {required} replicas",
        {"required_replicas": required, "bottleneck": bottleneck.value,
         "binding_dimensions": [d.value for d in binding],
         "unrounded_replicas": {d.dimension.value: d.unrounded_replicas for d in demands}})
    violations: list[Reason] = []
    if required > requirements.max_replicas:
        violations.append(Reason("replicas_exceed_ceiling",
                                 "the required fleet is larger than the replica ceiling",
                                 {"required_replicas": required,
                                  "max_replicas": requirements.max_replicas}))
    if hourly_cost > requirements.max_hourly_cost:
        violations.append(Reason("hourly_cost_exceeds_budget",
                                 "the required fleet costs more per hour than the budget",
                                 {"required_replicas": required, "hourly_cost": hourly_cost,
                                  "max_hourly_cost": requirements.max_hourly_cost}))
    return CapacityPlan(
        release_ready=not violations,
        required_replicas=required,
        bottleneck=bottleneck,
        binding_dimensions=binding,
        prompt_tokens_per_second=prompt_tps,
        output_tokens_per_second=output_tps,
        concurrent_requests=concurrent,
        reserved_headroom_fraction=requirements.reserved_headroom_fraction,
        hourly_cost=hourly_cost,
        cost_per_million_output_tokens=cost_per_million,
        demands=demands,
        violations=tuple(violations),
        reasons=(sizing, *violations),
    )
