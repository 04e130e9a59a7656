"""Capacity and cost (spec §1.12, example 12, tests/test_capacity.py, §2.4, §2.5, §9 bug 4)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.capacity import (
    CapacityDimension,
    CapacityRequirements,
    ReplicaBenchmark,
    WorkloadClass,
    plan_capacity,
)
from controlplane.policies.reasons import PolicyInputError, to_plain

DECODE = CapacityDimension.DECODE_TOKENS
FLOOR = CapacityDimension.MINIMUM_REPLICA_FLOOR
PREFILL = CapacityDimension.PREFILL_TOKENS
CONCURRENCY = CapacityDimension.REQUEST_CONCURRENCY

BENCHMARK = ReplicaBenchmark("measured-gpu", 200, 200, 10, 10)
REQUIREMENTS = CapacityRequirements(1, 10, 0.2, 100)
CHAT = WorkloadClass("chat", 1, 100, 100, 1, 1)

CAPSTONE_WORKLOADS = (WorkloadClass("interactive", 1.5, 400, 100, 2.0, 1.5),
                      WorkloadClass("generation", 0.5, 200, 600, 5.0, 2.0))
CAPSTONE_BENCHMARK = ReplicaBenchmark("staging:model@abc:gpu-x", 1000, 350, 8, 4.25)
CAPSTONE_REQUIREMENTS = CapacityRequirements(2, 8, 0.25, 40)


def codes(plan: object) -> list[str]:
    return [reason.code for reason in plan.reasons]  # type: ignore[attr-defined]


def test_capstone_default_is_four_replicas_bound_by_decode_tokens() -> None:
    plan = plan_capacity(CAPSTONE_WORKLOADS, CAPSTONE_BENCHMARK, CAPSTONE_REQUIREMENTS)
    assert (plan.prompt_tokens_per_second, plan.output_tokens_per_second,
            plan.concurrent_requests) == (1100.0, 825.0, 9.5)
    assert (plan.required_replicas, plan.bottleneck, plan.binding_dimensions) == (
        4, DECODE, (DECODE,))
    assert plan.hourly_cost == 17.0
    assert plan.cost_per_million_output_tokens == 5.723905723905724
    assert plan.reserved_headroom_fraction == 0.25
    assert plan.release_ready and plan.violations == ()
    assert codes(plan) == ["fleet_sized_by_bottleneck"]
    demand = {d.dimension: d.unrounded_replicas for d in plan.demands}
    assert demand == pytest.approx({FLOOR: 2.0, PREFILL: 1100 / 750, DECODE: 825 / 262.5,
                                    CONCURRENCY: 9.5 / 6})


def test_capstone_without_generation_is_held_at_the_replica_floor() -> None:
    plan = plan_capacity(CAPSTONE_WORKLOADS[:1], CAPSTONE_BENCHMARK, CAPSTONE_REQUIREMENTS)
    assert (plan.prompt_tokens_per_second, plan.output_tokens_per_second,
            plan.concurrent_requests) == (900.0, 225.0, 4.5)
    assert plan.required_replicas == 2
    assert plan.binding_dimensions == (FLOOR, PREFILL)
    assert plan.bottleneck is FLOOR
    assert plan.hourly_cost == 8.5
    assert plan.cost_per_million_output_tokens == pytest.approx(10.4938, abs=1e-4)
    assert {d.dimension: d.required_replicas for d in plan.demands} == {
        FLOOR: 2, PREFILL: 2, DECODE: 1, CONCURRENCY: 1}


def test_example_12_names_prefill_among_two_binding_dimensions() -> None:
    plan = plan_capacity(
        (WorkloadClass("interactive", 1.5, 900, 80, 1.5, 1.5),
         WorkloadClass("generation", 0.5, 400, 500, 5, 2.0)),
        ReplicaBenchmark("staging-profile", 1000, 300, 16, 4.25),
        CapacityRequirements(2, 20, 0.25, 50))
    assert (plan.prompt_tokens_per_second, plan.output_tokens_per_second) == (2425.0, 680.0)
    assert plan.concurrent_requests == pytest.approx(8.375)
    assert plan.required_replicas == 4
    assert plan.binding_dimensions == (DECODE, PREFILL)
    assert plan.bottleneck is PREFILL
    assert sorted(((d.unrounded_replicas, d.dimension) for d in plan.demands), reverse=True) == [
        (pytest.approx(3.2333, abs=1e-4), PREFILL), (pytest.approx(3.0222, abs=1e-4), DECODE),
        (2.0, FLOOR), (pytest.approx(0.6979, abs=1e-4), CONCURRENCY)]
    assert plan.hourly_cost == 17.0
    assert plan.cost_per_million_output_tokens == pytest.approx(6.944444)
    assert plan.release_ready


def test_burst_multiplier_changes_required_capacity() -> None:
    calm = plan_capacity([CHAT], BENCHMARK, REQUIREMENTS)
    bursty = plan_capacity([replace(CHAT, burst_multiplier=2)], BENCHMARK, REQUIREMENTS)
    assert (calm.required_replicas, bursty.required_replicas) == (1, 2)
    demand = {d.dimension: d.unrounded_replicas for d in bursty.demands}
    assert demand[PREFILL] == demand[DECODE] == 1.25


def test_rounding_tie_reports_every_binding_dimension() -> None:
    plan = plan_capacity([CHAT], BENCHMARK, REQUIREMENTS)
    assert plan.required_replicas == 1
    assert plan.binding_dimensions == (DECODE, FLOOR, PREFILL, CONCURRENCY)


def test_rounding_tie_names_the_largest_unrounded_demand_not_the_greatest_name() -> None:
    """Regression (spec §9 bug 4): ranking by (rounded, name) named request concurrency, the
    slackest dimension (0.125); the floor's unrounded 1.0 is the real constraint."""
    plan = plan_capacity([CHAT], BENCHMARK, REQUIREMENTS)
    demand = {d.dimension: d.unrounded_replicas for d in plan.demands}
    assert demand == {DECODE: 0.625, FLOOR: 1.0, PREFILL: 0.625, CONCURRENCY: 0.125}
    assert plan.bottleneck is FLOOR
    assert plan.reasons[0].facts["bottleneck"] == "minimum_replica_floor"


def test_replica_floor_is_named_when_no_workload_dimension_exceeds_it() -> None:
    plan = plan_capacity([WorkloadClass("trickle", 0.1, 10, 10, 0.5, 1)], BENCHMARK,
                         replace(REQUIREMENTS, min_replicas=3))
    assert (plan.required_replicas, plan.bottleneck, plan.binding_dimensions) == (
        3, FLOOR, (FLOOR,))
    assert plan.cost_per_million_output_tokens == pytest.approx(8333.33, abs=0.01)


def test_workload_mix_identifies_decode_as_the_actual_bottleneck() -> None:
    plan = plan_capacity([WorkloadClass("short-answer", 1, 100, 10, 1, 1),
                          WorkloadClass("generation", 1, 10, 500, 3, 1)], BENCHMARK, REQUIREMENTS)
    assert (plan.prompt_tokens_per_second, plan.output_tokens_per_second,
            plan.concurrent_requests) == (110, 510, 4)
    assert (plan.required_replicas, plan.bottleneck, plan.binding_dimensions) == (
        4, DECODE, (DECODE,))


def test_budget_failure_does_not_shrink_the_required_fleet() -> None:
    plan = plan_capacity([replace(CHAT, burst_multiplier=2)], BENCHMARK,
                         replace(REQUIREMENTS, max_hourly_cost=15))
    assert (plan.required_replicas, plan.hourly_cost, plan.release_ready) == (2, 20, False)
    assert [v.code for v in plan.violations] == ["hourly_cost_exceeds_budget"]
    assert plan.violations[0].facts == {"required_replicas": 2, "hourly_cost": 20,
                                        "max_hourly_cost": 15}
    # An exact unrounded tie (1.25 and 1.25) goes to the greater name: prefill tokens.
    assert plan.bottleneck is PREFILL


def test_supplied_price_changes_cost_but_not_capacity() -> None:
    cheap = plan_capacity([CHAT], BENCHMARK, REQUIREMENTS)
    dear = plan_capacity([CHAT], replace(BENCHMARK, hourly_cost=20), REQUIREMENTS)
    assert cheap.required_replicas == dear.required_replicas
    assert dear.hourly_cost == 2 * cheap.hourly_cost


def test_every_violation_is_reported_in_fixed_order() -> None:
    plan = plan_capacity([replace(CHAT, requests_per_second=20)], BENCHMARK,
                         replace(REQUIREMENTS, max_hourly_cost=50))
    assert plan.required_replicas == 13
    assert codes(plan) == ["fleet_sized_by_bottleneck", "replicas_exceed_ceiling",
                           "hourly_cost_exceeds_budget"]
    assert plan.violations == plan.reasons[1:]


@pytest.mark.parametrize(("workloads", "benchmark", "requirements", "code", "field"), [
    ([], BENCHMARK, REQUIREMENTS, "workloads_empty", "workloads"),
    ([CHAT, CHAT], BENCHMARK, REQUIREMENTS, "workload_name_invalid", "workloads[0].name"),
    ([replace(CHAT, name=" ")], BENCHMARK, REQUIREMENTS, "workload_name_invalid",
     "workloads[0].name"),
    ([replace(CHAT, burst_multiplier=0.5)], BENCHMARK, REQUIREMENTS, "workload_rate_invalid",
     "workloads[0].burst_multiplier"),
    ([replace(CHAT, mean_service_seconds=0)], BENCHMARK, REQUIREMENTS, "workload_rate_invalid",
     "workloads[0].mean_service_seconds"),
    ([replace(CHAT, prompt_tokens=math.nan)], BENCHMARK, REQUIREMENTS,
     "workload_rate_not_finite", "workloads[0].prompt_tokens"),
    ([replace(CHAT, output_tokens=0)], BENCHMARK, REQUIREMENTS, "output_demand_not_positive",
     "workloads"),
    ([replace(CHAT, burst_multiplier=3, requests_per_second=0)], BENCHMARK, REQUIREMENTS,
     "output_demand_not_positive", "workloads"),
    ([CHAT], replace(BENCHMARK, output_tokens_per_second=0), REQUIREMENTS, "benchmark_invalid",
     "benchmark.output_tokens_per_second"),
    ([CHAT], replace(BENCHMARK, hourly_cost=-1), REQUIREMENTS, "benchmark_invalid",
     "benchmark.hourly_cost"),
    ([CHAT], replace(BENCHMARK, hourly_cost=math.inf), REQUIREMENTS, "benchmark_not_finite",
     "benchmark.hourly_cost"),
    ([CHAT], BENCHMARK, replace(REQUIREMENTS, min_replicas=0), "replica_bounds_invalid",
     "requirements.min_replicas"),
    ([CHAT], BENCHMARK, replace(REQUIREMENTS, max_replicas=0), "replica_bounds_invalid",
     "requirements.max_replicas"),
    ([CHAT], BENCHMARK, replace(REQUIREMENTS, reserved_headroom_fraction=1.0),
     "headroom_out_of_range", "requirements.reserved_headroom_fraction"),
    ([CHAT], BENCHMARK, replace(REQUIREMENTS, max_hourly_cost=-1), "hourly_budget_negative",
     "requirements.max_hourly_cost"),
])
def test_invalid_inputs_are_refused_with_code_and_field(
        workloads: list[WorkloadClass], benchmark: ReplicaBenchmark,
        requirements: CapacityRequirements, code: str, field: str) -> None:
    with pytest.raises(PolicyInputError) as error:
        plan_capacity(workloads, benchmark, requirements)
    assert (error.value.code, error.value.field) == (code, field)


def test_demand_that_overflows_is_refused_rather_than_sized_at_infinity() -> None:
    with pytest.raises(PolicyInputError) as error:
        plan_capacity([replace(CHAT, requests_per_second=1e300, prompt_tokens=1e300)],
                      BENCHMARK, REQUIREMENTS)
    assert (error.value.code, error.value.field) == ("demand_not_finite", "workloads")


def test_a_zero_cost_quote_is_accepted() -> None:
    plan = plan_capacity([CHAT], replace(BENCHMARK, hourly_cost=0), REQUIREMENTS)
    assert (plan.hourly_cost, plan.cost_per_million_output_tokens) == (0.0, 0.0)


_rate = st.floats(min_value=0.01, max_value=50, allow_nan=False)
_tokens = st.floats(min_value=1, max_value=20_000, allow_nan=False)
_workloads = st.lists(
    st.tuples(_rate, _tokens, _tokens, st.floats(0.1, 60), st.floats(1, 4)),
    min_size=1, max_size=4,
).map(lambda rows: [WorkloadClass(f"w{index}", *row) for index, row in enumerate(rows)])
_benchmarks = st.tuples(st.floats(100, 50_000), st.floats(10, 5_000), st.floats(1, 256),
                        st.floats(0, 100)).map(lambda row: ReplicaBenchmark("bench", *row))


@settings(max_examples=200, deadline=None)
@given(_workloads, _benchmarks, st.integers(1, 5), st.floats(0, 0.9), st.floats(0, 1e4),
       st.floats(0, 1e4))
def test_cost_never_shrinks_the_fleet(
        workloads: list[WorkloadClass], benchmark: ReplicaBenchmark, floor: int,
        headroom: float, budget: float, other_quote: float) -> None:
    requirements = CapacityRequirements(floor, floor + 10, headroom, budget)
    plan = plan_capacity(workloads, benchmark, requirements)
    unbudgeted = plan_capacity(workloads, replace(benchmark, hourly_cost=other_quote),
                               replace(requirements, max_hourly_cost=1e12))
    assert plan.required_replicas == unbudgeted.required_replicas
    assert plan.required_replicas == max(d.required_replicas for d in plan.demands)
    over_budget = plan.hourly_cost > budget
    assert ("hourly_cost_exceeds_budget" in [v.code for v in plan.violations]) == over_budget
    assert plan.release_ready == (not plan.violations)
    json.dumps(to_plain(plan), allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(_workloads, _benchmarks, st.integers(1, 5), st.floats(0, 0.9))
def test_bottleneck_binds_after_rounding_and_has_the_largest_unrounded_demand(
        workloads: list[WorkloadClass], benchmark: ReplicaBenchmark, floor: int,
        headroom: float) -> None:
    plan = plan_capacity(workloads, benchmark, CapacityRequirements(floor, 100, headroom, 1e9))
    binding = [d for d in plan.demands if d.dimension in plan.binding_dimensions]
    assert list(plan.binding_dimensions) == sorted(plan.binding_dimensions)
    assert all(d.required_replicas == plan.required_replicas for d in binding)
    assert plan.bottleneck in plan.binding_dimensions
    top = max(d.unrounded_replicas for d in binding)
    assert {d.dimension: d.unrounded_replicas for d in plan.demands}[plan.bottleneck] == top


def test_a_replica_floor_past_a_floats_range_is_refused_not_overflowed() -> None:
    with pytest.raises(PolicyInputError) as error:
        plan_capacity([CHAT], BENCHMARK, CapacityRequirements(10**400, 10**400, 0.2, 100))
    assert (error.value.code, error.value.field) == ("replica_bounds_invalid",
                                                     "requirements.min_replicas")
