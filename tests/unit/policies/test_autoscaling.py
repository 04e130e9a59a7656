"""Autoscaling (spec §1.10, example 10, §2.4/§2.5 autoscaling figures, bugs 6 and 8)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.autoscaling import (
    AutoscalingPolicy,
    ScaleAction,
    ScaleDecision,
    ScaleObservation,
    ScaleState,
    recommend_replicas,
)
from controlplane.policies.reasons import PolicyInputError, to_plain

POLICY = AutoscalingPolicy(1, 10, 100, 0.8, 10, 5, 60)
NARROW = AutoscalingPolicy(2, 4, 100, 1.0, 10, 5, 60)
CAPSTONE = AutoscalingPolicy(2, 8, 350, 0.75, 10, 5, 60)


def codes(decision: ScaleDecision) -> list[str]:
    return [reason.code for reason in decision.reasons]


def observe(at: float, queued: int, arrival: float, cpu: float = 0.0) -> ScaleObservation:
    return ScaleObservation(at, queued, arrival, cpu)


def test_arrival_rate_and_backlog_both_contribute_to_scale_up() -> None:
    decision = recommend_replicas([observe(100, 800, 160, 0.1)], ScaleState(1, 1, 0, 0), POLICY,
                                  now=100)
    assert (decision.calculated_demand_replicas, decision.target_replicas) == (3, 3)
    assert decision.action is ScaleAction.SCALE_UP
    assert codes(decision) == ["scale_up_cleared_cooldown"]


def test_cpu_signal_does_not_manufacture_token_demand() -> None:
    decision = recommend_replicas([observe(100, 0, 0, 1.0)], ScaleState(1, 1, 0, 0), POLICY,
                                  now=100)
    assert decision.target_replicas == 1
    assert codes(decision) == ["demand_matches_desired"]


def test_warming_replicas_are_not_counted_as_ready_throughput() -> None:
    decision = recommend_replicas([observe(100, 0, 160, 0.5)], ScaleState(2, 1, 1, 0), POLICY,
                                  now=100)
    assert decision.target_replicas == 2
    assert decision.ready_capacity_tokens_per_second == pytest.approx(80)


def test_example_10_warming_replica_adds_no_ready_capacity_while_demand_scales_up() -> None:
    """Regression (bug 8): the example used to show no warming replica at all."""
    decision = recommend_replicas([observe(100, 800, 160, 0.12)], ScaleState(2, 1, 1, 0),
                                  POLICY, now=100)
    assert (decision.calculated_demand_replicas, decision.target_replicas) == (3, 3)
    assert decision.ready_capacity_tokens_per_second == pytest.approx(80)
    assert codes(decision) == ["scale_up_cleared_cooldown"]


def test_a_declined_move_cannot_carry_a_target_past_the_fleet_ceiling() -> None:
    """Regression (bug 6): without a final clamp a held desired count of 9 exceeded max 4."""
    decision = recommend_replicas([observe(95, 0, 10)], ScaleState(9, 9, 0, 0), NARROW, now=100)
    assert (decision.calculated_demand_replicas, decision.target_replicas) == (2, 4)
    assert codes(decision) == ["scale_down_window_incomplete", "clamped_to_policy_bound"]
    assert decision.reasons[1].facts["unclamped_target_replicas"] == 9
    assert decision.ready_capacity_tokens_per_second == pytest.approx(900)
    assert decision.action is ScaleAction.SCALE_DOWN


def test_a_declined_move_cannot_carry_a_target_below_the_replica_floor() -> None:
    """Regression (bug 6): a scale-up held by the cooldown used to leave 1 below min 2."""
    decision = recommend_replicas([observe(100, 0, 10)], ScaleState(1, 1, 0, 99), NARROW,
                                  now=100)
    assert (decision.calculated_demand_replicas, decision.target_replicas) == (2, 2)
    assert codes(decision) == ["scale_up_inside_cooldown", "clamped_to_policy_bound"]
    assert decision.reasons[1].facts["unclamped_target_replicas"] == 1


def test_scale_down_requires_a_complete_stable_window() -> None:
    state = ScaleState(3, 3, 0, 0)
    covered = recommend_replicas([observe(0, 0, 20), observe(60, 0, 20)], state, POLICY, now=60)
    assert covered.target_replicas == 1
    assert codes(covered) == ["scale_down_after_stable_window"]
    partial = recommend_replicas([observe(30, 0, 20), observe(60, 0, 20)], state, POLICY, now=60)
    assert partial.target_replicas == 3
    assert codes(partial) == ["scale_down_window_incomplete"]


def test_scale_down_waits_a_full_window_after_the_last_scale_change() -> None:
    observations = [observe(0, 0, 20), observe(60, 0, 20)]
    recent = recommend_replicas(observations, ScaleState(3, 3, 0, 30), POLICY, now=60)
    assert (recent.target_replicas, codes(recent)) == (3, ["scale_down_inside_cooldown"])
    settled = recommend_replicas(observations, ScaleState(3, 3, 0, 0), POLICY, now=60)
    assert settled.target_replicas == 1


def test_an_unfinished_scale_down_goes_on_inside_the_window_down_to_its_own_target() -> None:
    observations = [observe(0, 0, 20), observe(60, 0, 20)]  # demand 1 throughout
    # The scale-down at 30 s was to 2 and kept a replica: it goes now, and no further.
    kept = ScaleState(3, 3, 0, 30, unfinished_scale_down_to=2)
    continued = recommend_replicas(observations, kept, POLICY, now=60)
    assert (continued.target_replicas, codes(continued)) == (2, ["scale_down_continued"])
    # Reached (or above the desired count): a new scale-down waits out the window.
    for unfinished in (3, 4):
        state = dataclasses.replace(kept, unfinished_scale_down_to=unfinished)
        held = recommend_replicas(observations, state, POLICY, now=60)
        assert (held.target_replicas, codes(held)) == (3, ["scale_down_inside_cooldown"])
    # The window's demand rules as ever: a peak at the desired count holds it.
    peak = recommend_replicas([observe(0, 0, 20), observe(30, 0, 240), observe(60, 0, 20)],
                              kept, POLICY, now=60)
    assert (peak.target_replicas, codes(peak)) == (3, ["scale_down_demand_not_sustained"])


def test_scale_down_goes_to_the_highest_demand_in_the_window_not_the_newest() -> None:
    observations = [observe(0, 0, 100), observe(30, 0, 20), observe(60, 0, 20)]
    decision = recommend_replicas(observations, ScaleState(3, 3, 0, 0), POLICY, now=60)
    assert (decision.calculated_demand_replicas, decision.target_replicas) == (1, 2)


def test_a_demand_spike_inside_the_window_holds_scale_down() -> None:
    observations = [observe(0, 0, 20), observe(30, 0, 240), observe(60, 0, 20)]
    decision = recommend_replicas(observations, ScaleState(3, 3, 0, 0), POLICY, now=60)
    assert (decision.target_replicas, codes(decision)) == (3, ["scale_down_demand_not_sustained"])


def test_observations_older_than_the_window_cannot_justify_scale_down() -> None:
    decision = recommend_replicas([observe(0, 0, 20)], ScaleState(3, 3, 0, 0), POLICY, now=100)
    assert (decision.target_replicas, codes(decision)) == (3, ["scale_down_observations_stale"])


def test_capstone_demand_matches_four_replicas_with_1050_ready_tokens_per_second() -> None:
    decision = recommend_replicas([observe(100, 0, 825.0, 0.15)], ScaleState(4, 4, 0, 0),
                                  CAPSTONE, now=100)
    assert (decision.target_replicas, decision.calculated_demand_replicas) == (4, 4)
    assert decision.ready_capacity_tokens_per_second == pytest.approx(1050.0)
    assert (decision.action, codes(decision)) == (ScaleAction.HOLD, ["demand_matches_desired"])


def test_capstone_without_the_generation_workload_targets_the_floor_of_two() -> None:
    decision = recommend_replicas([observe(100, 0, 225.0, 0.15)], ScaleState(2, 2, 0, 0),
                                  CAPSTONE, now=100)
    assert (decision.target_replicas, decision.calculated_demand_replicas) == (2, 2)
    assert decision.ready_capacity_tokens_per_second == pytest.approx(525.0)


def test_an_overflowing_demand_ratio_is_capped_at_the_ceiling() -> None:
    tiny = dataclasses.replace(POLICY, service_tokens_per_second_per_replica=1e-300)
    decision = recommend_replicas([observe(100, 10**30, 1e300)], ScaleState(1, 1, 0, 0), tiny,
                                  now=100)
    assert decision.target_replicas == 10


@pytest.mark.parametrize(("observations", "state", "policy", "field"), [
    ([], ScaleState(1, 1, 0, 0), POLICY, "observations"),
    ([observe(1, 0, 1)], ScaleState(1, 1, 0, 0), dataclasses.replace(POLICY, min_replicas=0),
     "min_replicas"),
    ([observe(1, 0, 1)], ScaleState(1, 1, 0, 0), dataclasses.replace(POLICY, max_replicas=0),
     "max_replicas"),
    ([observe(1, 0, 1)], ScaleState(1, 1, 0, 0),
     dataclasses.replace(POLICY, service_tokens_per_second_per_replica=math.nan),
     "service_tokens_per_second_per_replica"),
    ([observe(1, 0, 1)], ScaleState(1, 1, 0, 0),
     dataclasses.replace(POLICY, target_utilization=1.5), "target_utilization"),
    ([observe(1, 0, 1)], ScaleState(1, 1, 0, 0),
     dataclasses.replace(POLICY, queue_drain_seconds=0), "queue_drain_seconds"),
    ([observe(1, 0, 1)], ScaleState(1, 1, 0, 0),
     dataclasses.replace(POLICY, scale_up_cooldown_seconds=-1), "scale_up_cooldown_seconds"),
    ([observe(1, 0, 1)], ScaleState(1, -1, 0, 0), POLICY, "ready_replicas"),
    ([observe(1, 0, 1)], ScaleState(1, 1, 1, 0), POLICY, "desired_replicas"),
    ([observe(101, 0, 1)], ScaleState(1, 1, 0, 0), POLICY, "timestamp_seconds"),
    ([observe(1, 0, -1)], ScaleState(1, 1, 0, 0), POLICY, "arrival_tokens_per_second"),
    ([observe(1, 0, math.inf)], ScaleState(1, 1, 0, 0), POLICY, "arrival_tokens_per_second"),
    # Each parameter in range, but a replica's tokens at target utilisation underflow to 0.
    ([observe(1, 0, 1)], ScaleState(1, 1, 0, 0),
     dataclasses.replace(POLICY, service_tokens_per_second_per_replica=5e-324,
                         target_utilization=0.5), "service_tokens_per_second_per_replica"),
])
def test_invalid_inputs_are_refused_naming_the_field(
        observations: list[ScaleObservation], state: ScaleState, policy: AutoscalingPolicy,
        field: str) -> None:
    with pytest.raises(PolicyInputError) as error:
        recommend_replicas(observations, state, policy, now=100)
    assert error.value.field == field


MAX_FLOAT = 1.7976931348623157e308


@pytest.mark.parametrize(("observation", "state", "policy", "now", "code", "field"), [
    # Each input finite and in range, yet a figure the decision reports would overflow.
    (observe(1, 0, 1), ScaleState(10**307, 10**307, 0, 0), POLICY, 100,
     "ready_capacity_not_finite", "ready_replicas"),
    pytest.param(observe(1, 0, 1), ScaleState(10**400, 10**400, 0, 0), POLICY, 100,
                 "ready_capacity_not_finite", "ready_replicas", id="ready_replicas-10**400"),
    (observe(1, 0, 1), ScaleState(2, 2, 0, 0),
     dataclasses.replace(POLICY, service_tokens_per_second_per_replica=MAX_FLOAT,
                         target_utilization=1.0), 100,
     "ready_capacity_not_finite", "ready_replicas"),
    pytest.param(observe(1, 10**400, 1), ScaleState(1, 1, 0, 0), POLICY, 100,
                 "queued_tokens_out_of_range", "queued_tokens", id="queued_tokens-10**400"),
    (observe(-MAX_FLOAT, 0, 1), ScaleState(1, 1, 0, -MAX_FLOAT), POLICY, MAX_FLOAT,
     "time_not_finite", "last_scale_at_seconds"),
    (observe(-MAX_FLOAT, 0, 1), ScaleState(1, 1, 0, -MAX_FLOAT),
     dataclasses.replace(POLICY, scale_down_stabilization_seconds=MAX_FLOAT), -MAX_FLOAT,
     "timing_window_invalid", "scale_down_stabilization_seconds"),
])
def test_inputs_whose_derived_figures_overflow_are_refused_naming_the_field(
        observation: ScaleObservation, state: ScaleState, policy: AutoscalingPolicy, now: float,
        code: str, field: str) -> None:
    """Regression: ready capacity = ready x service x utilisation overflowed to infinity, and
    the decision failed with `non-finite number inf in a decision` instead of naming the input."""
    with pytest.raises(PolicyInputError) as error:
        recommend_replicas([observation], state, policy, now=now)
    assert (error.value.code, error.value.field) == (code, field)


def test_the_largest_finite_ready_capacity_is_still_decided() -> None:
    state = ScaleState(10**300, 10**300, 0, 0)
    decision = recommend_replicas([observe(100, 0, 160)], state, POLICY, now=100)
    assert decision.ready_capacity_tokens_per_second == pytest.approx(8e301)
    json.dumps(to_plain(decision), allow_nan=False)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[ScaleObservation], ScaleState, AutoscalingPolicy]:
    low = draw(st.integers(1, 6))
    policy = AutoscalingPolicy(low, draw(st.integers(low, 12)), draw(st.floats(1, 1000)),
                               draw(st.floats(0.05, 1.0)), draw(st.floats(0.5, 120)),
                               draw(st.floats(0, 60)), draw(st.floats(0, 300)))
    desired = draw(st.integers(0, 20))
    ready = draw(st.integers(0, desired))
    state = ScaleState(desired, ready, draw(st.integers(0, desired - ready)),
                       draw(st.floats(0, 1000)))
    observations = draw(st.lists(st.builds(
        ScaleObservation, st.floats(0, 1000), st.integers(0, 10**7), st.floats(0, 10**6),
        st.floats(0, 1)), min_size=1, max_size=6))
    return observations, state, policy


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_target_stays_within_bounds_and_warming_adds_no_ready_capacity(
        scenario: tuple[list[ScaleObservation], ScaleState, AutoscalingPolicy]) -> None:
    observations, state, policy = scenario
    now = 1000.0
    decision = recommend_replicas(observations, state, policy, now=now)
    assert policy.min_replicas <= decision.target_replicas <= policy.max_replicas
    assert policy.min_replicas <= decision.calculated_demand_replicas <= policy.max_replicas
    expected_action = (ScaleAction.SCALE_UP if decision.target_replicas > state.desired_replicas
                       else ScaleAction.SCALE_DOWN
                       if decision.target_replicas < state.desired_replicas
                       else ScaleAction.HOLD)
    assert decision.action is expected_action
    more_warming = dataclasses.replace(state, desired_replicas=state.desired_replicas + 3,
                                       warming_replicas=state.warming_replicas + 3)
    assert recommend_replicas(observations, more_warming, policy, now=now) \
        .ready_capacity_tokens_per_second == decision.ready_capacity_tokens_per_second
    shuffled = recommend_replicas(list(reversed(observations)), state, policy, now=now)
    assert shuffled.target_replicas == decision.target_replicas
    json.dumps(to_plain(decision), allow_nan=False)
