"""Rollouts (spec §1.11, example 11, §2.4/§2.5 rollout figures, exercise 11)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.reasons import PolicyInputError, Reason, to_plain
from controlplane.policies.rollouts import (
    GateEvidence,
    ReleaseMeasurement,
    ReleaseRequirements,
    RolloutAction,
    RolloutDecision,
    RolloutPlan,
    RolloutStage,
    RolloutState,
    TrafficMode,
    advance_rollout,
    evaluate_rollout,
)

HOLD, PROMOTE, ROLLBACK = RolloutAction.HOLD, RolloutAction.PROMOTE, RolloutAction.ROLLBACK
BASELINE = ReleaseMeasurement("stable", TrafficMode.CANARY, True, 10000, 0.90, 0.8, 0.1, 100,
                              0.001)
CANDIDATE = ReleaseMeasurement("candidate", TrafficMode.CANARY, True, 1000, 0.89, 0.8, 0.1, 105,
                               0.002)
REQUIREMENTS = ReleaseRequirements(500, 0.85, 0.03, 1.0, 0.15, 0.95, 0.01)
FAILURE_ORDER = ["quality_below_floor", "quality_regression_exceeds_allowance",
                 "p95_ttft_exceeds_objective", "p95_tpot_exceeds_objective",
                 "relative_throughput_below_objective", "error_rate_exceeds_objective",
                 "gate_evidence_failed"]


def codes(decision: RolloutDecision) -> list[str]:
    return [reason.code for reason in decision.reasons]


def candidate(**changes: object) -> ReleaseMeasurement:
    return dataclasses.replace(CANDIDATE, **changes)  # type: ignore[arg-type]


def test_warmed_canary_promotes_after_all_independent_gates_pass() -> None:
    decision = evaluate_rollout(BASELINE, CANDIDATE, REQUIREMENTS)
    assert (decision.action, codes(decision)) == (PROMOTE, ["all_gates_passed"])


def test_unwarmed_candidate_holds_before_regression_evaluation() -> None:
    decision = evaluate_rollout(BASELINE, candidate(warmed=False, quality_score=0.1),
                                REQUIREMENTS)
    assert (decision.action, codes(decision)) == (HOLD, ["candidate_not_warmed"])


def test_an_undersized_sample_holds_and_reports_both_readiness_gaps() -> None:
    decision = evaluate_rollout(BASELINE, candidate(warmed=False, sample_count=499),
                                REQUIREMENTS)
    assert (decision.action, codes(decision)) == (HOLD, ["candidate_not_warmed",
                                                         "insufficient_samples"])
    assert decision.reasons[1].facts["min_sample_count"] == 500


def test_passing_shadow_cannot_prove_the_user_traffic_path() -> None:
    decision = evaluate_rollout(BASELINE, candidate(mode=TrafficMode.SHADOW), REQUIREMENTS)
    assert (decision.action, codes(decision)) == (HOLD, ["shadow_passed_canary_required"])


def test_one_tail_latency_regression_flips_the_rollout() -> None:
    decision = evaluate_rollout(BASELINE, candidate(p95_tpot_seconds=0.2), REQUIREMENTS)
    assert (decision.action, codes(decision)) == (ROLLBACK, ["p95_tpot_exceeds_objective"])


def test_threshold_does_not_come_from_candidate_measurement() -> None:
    strict = dataclasses.replace(REQUIREMENTS, max_error_rate=0.001)
    decision = evaluate_rollout(BASELINE, CANDIDATE, strict)
    assert (decision.action, codes(decision)) == (ROLLBACK, ["error_rate_exceeds_objective"])


def test_example_11_shadow_holds_and_the_same_candidate_on_canary_promotes() -> None:
    assert evaluate_rollout(BASELINE, candidate(mode=TrafficMode.SHADOW),
                            REQUIREMENTS).action is HOLD
    assert evaluate_rollout(BASELINE, CANDIDATE, REQUIREMENTS).action is PROMOTE


CAPSTONE_BASELINE = ReleaseMeasurement("stable", TrafficMode.CANARY, True, 10_000, 0.90, 0.8,
                                       0.10, 330, 0.001)
CAPSTONE_CANDIDATE = ReleaseMeasurement("model@abc", TrafficMode.CANARY, True, 1_000, 0.89, 0.8,
                                        0.10, 350, 0.002)
CAPSTONE_REQUIREMENTS = ReleaseRequirements(500, 0.86, 0.03, 1.0, 0.15, 0.95, 0.01)


def test_capstone_canary_promotes_with_its_relative_throughput() -> None:
    decision = evaluate_rollout(CAPSTONE_BASELINE, CAPSTONE_CANDIDATE, CAPSTONE_REQUIREMENTS)
    assert decision.action is PROMOTE
    assert decision.reasons[0].facts["relative_throughput"] == pytest.approx(350 / 330)


def test_capstone_canary_with_a_tpot_regression_rolls_back() -> None:
    regressed = dataclasses.replace(CAPSTONE_CANDIDATE, p95_tpot_seconds=0.3)
    decision = evaluate_rollout(CAPSTONE_BASELINE, regressed, CAPSTONE_REQUIREMENTS)
    assert (decision.action, codes(decision)) == (ROLLBACK, ["p95_tpot_exceeds_objective"])
    assert decision.reasons[0].facts["p95_tpot_seconds"] == pytest.approx(0.3)


def test_every_failing_gate_is_reported_in_the_fixed_order() -> None:
    awful = candidate(quality_score=0.5, p95_ttft_seconds=2.0, p95_tpot_seconds=0.5,
                      output_tokens_per_second=10, error_rate=0.5)
    gates = [GateEvidence("speculation", False, (Reason("misses_speedup_gate", "", {}),)),
             GateEvidence("quantization", False), GateEvidence("memory", True)]
    decision = evaluate_rollout(BASELINE, awful, REQUIREMENTS, gates)
    assert decision.action is ROLLBACK
    assert codes(decision) == FAILURE_ORDER + ["gate_evidence_failed"]
    assert [r.facts.get("gate") for r in decision.reasons[-2:]] == ["quantization",
                                                                    "speculation"]
    assert decision.reasons[-1].facts["gate_reason_codes"] == ["misses_speedup_gate"]


def test_passing_gate_evidence_does_not_block_promotion() -> None:
    decision = evaluate_rollout(BASELINE, CANDIDATE, REQUIREMENTS,
                                [GateEvidence("quantization", True)])
    assert decision.action is PROMOTE


def test_missing_required_gate_evidence_holds_instead_of_promoting() -> None:
    requirements = dataclasses.replace(REQUIREMENTS, required_gates=frozenset({"quantization"}))
    decision = evaluate_rollout(BASELINE, CANDIDATE, requirements)
    assert (decision.action, codes(decision)) == (HOLD, ["required_gate_evidence_missing"])
    supplied = evaluate_rollout(BASELINE, CANDIDATE, requirements,
                                [GateEvidence("quantization", True)])
    assert supplied.action is PROMOTE


@pytest.mark.parametrize(("baseline", "cand", "requirements", "field"), [
    (BASELINE, candidate(revision=" "), REQUIREMENTS, "candidate.revision"),
    (BASELINE, candidate(sample_count=-1), REQUIREMENTS, "candidate.sample_count"),
    (dataclasses.replace(BASELINE, output_tokens_per_second=0), CANDIDATE, REQUIREMENTS,
     "baseline.output_tokens_per_second"),
    # Both positive and finite, but their ratio overflows to infinity.
    (dataclasses.replace(BASELINE, output_tokens_per_second=5e-324), CANDIDATE, REQUIREMENTS,
     "baseline.output_tokens_per_second"),
    (BASELINE, candidate(error_rate=math.nan), REQUIREMENTS, "candidate.error_rate"),
    (BASELINE, candidate(p95_tpot_seconds=-0.1), REQUIREMENTS, "candidate.p95_tpot_seconds"),
    (BASELINE, CANDIDATE, dataclasses.replace(REQUIREMENTS, min_sample_count=0),
     "min_sample_count"),
    (BASELINE, CANDIDATE, dataclasses.replace(REQUIREMENTS, max_error_rate=-1),
     "max_error_rate"),
])
def test_invalid_inputs_are_refused_naming_the_field(
        baseline: ReleaseMeasurement, cand: ReleaseMeasurement,
        requirements: ReleaseRequirements, field: str) -> None:
    with pytest.raises(PolicyInputError) as error:
        evaluate_rollout(baseline, cand, requirements)
    assert error.value.field == field


def test_duplicate_gate_names_are_refused() -> None:
    with pytest.raises(PolicyInputError) as error:
        evaluate_rollout(BASELINE, CANDIDATE, REQUIREMENTS,
                         [GateEvidence("q", True), GateEvidence("q", False)])
    assert error.value.code == "gate_names_invalid"


# --- Exercise 11: the staged ladder -----------------------------------------------------


PLAN = RolloutPlan((1.0, 10.0))
SHADOW_EVIDENCE = candidate(mode=TrafficMode.SHADOW)


def test_the_ladder_walks_warmup_shadow_one_and_ten_percent_then_promotes() -> None:
    state = RolloutState()
    walk = []
    for evidence in [candidate(sample_count=0), SHADOW_EVIDENCE, CANDIDATE, CANDIDATE,
                     CANDIDATE]:
        step, state = advance_rollout(state, BASELINE, evidence, REQUIREMENTS, PLAN)
        walk.append((step.action, step.to_stage, step.candidate_traffic_percent))
    assert walk == [
        (RolloutAction.ADVANCE, RolloutStage.SHADOW, 0.0),
        (RolloutAction.ADVANCE, RolloutStage.CANARY, 1.0),
        (RolloutAction.ADVANCE, RolloutStage.CANARY, 10.0),
        (PROMOTE, RolloutStage.PROMOTED, 100.0),
        (HOLD, RolloutStage.PROMOTED, 100.0),
    ]
    json.dumps(to_plain(state), allow_nan=False)


def test_an_unwarmed_candidate_stays_in_warmup_with_no_traffic() -> None:
    step, state = advance_rollout(RolloutState(), BASELINE, candidate(warmed=False),
                                  REQUIREMENTS, PLAN)
    assert (step.action, state.stage, step.candidate_traffic_percent) == \
        (HOLD, RolloutStage.WARMUP, 0.0)
    assert step.reasons[0].code == "candidate_not_warmed"


def test_shadow_cannot_promote_directly_nor_accept_canary_evidence() -> None:
    shadow = RolloutState(RolloutStage.SHADOW)
    step, state = advance_rollout(shadow, BASELINE, SHADOW_EVIDENCE, REQUIREMENTS,
                                  RolloutPlan((50.0,)))
    assert (step.action, state.stage, state.candidate_traffic_percent) == \
        (RolloutAction.ADVANCE, RolloutStage.CANARY, 50.0)
    with pytest.raises(PolicyInputError) as error:
        advance_rollout(shadow, BASELINE, CANDIDATE, REQUIREMENTS, PLAN)
    assert error.value.code == "evidence_mode_mismatch"


def test_insufficient_canary_evidence_holds_the_current_step() -> None:
    canary = RolloutState(RolloutStage.CANARY, 0, 1.0)
    step, state = advance_rollout(canary, BASELINE, candidate(sample_count=10), REQUIREMENTS,
                                  PLAN)
    assert (step.action, state) == (HOLD, canary)
    assert step.reasons[0].code == "insufficient_samples"


def test_a_regression_at_ten_percent_removes_traffic_and_names_the_gate() -> None:
    canary = RolloutState(RolloutStage.CANARY, 1, 10.0)
    step, state = advance_rollout(canary, BASELINE, candidate(quality_score=0.8), REQUIREMENTS,
                                  PLAN)
    assert (step.action, step.from_stage, step.to_stage, step.candidate_traffic_percent) == \
        (ROLLBACK, RolloutStage.CANARY, RolloutStage.ROLLED_BACK, 0.0)
    assert state.deciding_codes == ("quality_below_floor",
                                     "quality_regression_exceeds_allowance")
    again, after = advance_rollout(state, BASELINE, CANDIDATE, REQUIREMENTS, PLAN)
    assert (again.action, after, again.reasons[0].code) == (HOLD, state, "rollout_finished")
    assert after.candidate_traffic_percent == 0.0


def test_a_failing_shadow_rolls_back_before_any_user_traffic() -> None:
    step, state = advance_rollout(RolloutState(RolloutStage.SHADOW), BASELINE,
                                  dataclasses.replace(SHADOW_EVIDENCE, error_rate=0.5),
                                  REQUIREMENTS, PLAN)
    assert (step.action, state.stage, state.candidate_traffic_percent) == \
        (ROLLBACK, RolloutStage.ROLLED_BACK, 0.0)


@pytest.mark.parametrize("steps", [(), (0.0,), (10.0, 5.0), (100.0,), (math.nan,)])
def test_invalid_canary_ladders_are_refused(steps: tuple[float, ...]) -> None:
    with pytest.raises(PolicyInputError) as error:
        advance_rollout(RolloutState(), BASELINE, CANDIDATE, REQUIREMENTS, RolloutPlan(steps))
    assert error.value.code == "canary_steps_invalid"


measurements = st.builds(
    ReleaseMeasurement, st.sampled_from(["r1", "r2"]), st.sampled_from(list(TrafficMode)),
    st.booleans(), st.integers(0, 2000), st.floats(0, 1), st.floats(0, 2), st.floats(0, 0.3),
    st.floats(1, 500), st.floats(0, 0.05))
gate_lists = st.lists(st.builds(GateEvidence, st.sampled_from(["a", "b", "c"]), st.booleans()),
                      unique_by=lambda g: g.name)


@settings(max_examples=150, deadline=None)
@given(baseline=measurements, cand=measurements, gates=gate_lists)
def test_gate_outcomes_follow_the_decision_order(
        baseline: ReleaseMeasurement, cand: ReleaseMeasurement,
        gates: list[GateEvidence]) -> None:
    decision = evaluate_rollout(baseline, cand, REQUIREMENTS, gates)
    required = REQUIREMENTS
    expected = [code for code, failed in zip(FAILURE_ORDER, [
        cand.quality_score < required.min_quality_score,
        baseline.quality_score - cand.quality_score > required.max_quality_drop,
        cand.p95_ttft_seconds > required.max_p95_ttft_seconds,
        cand.p95_tpot_seconds > required.max_p95_tpot_seconds,
        cand.output_tokens_per_second / baseline.output_tokens_per_second
        < required.min_relative_throughput,
        cand.error_rate > required.max_error_rate], strict=False) if failed]
    expected += ["gate_evidence_failed"] * sum(not g.passed for g in gates)
    if not cand.warmed or cand.sample_count < required.min_sample_count:
        assert decision.action is HOLD
    elif expected:
        assert (decision.action, codes(decision)) == (ROLLBACK, expected)
    else:
        assert decision.action is (HOLD if cand.mode is TrafficMode.SHADOW else PROMOTE)
    assert not (decision.action is PROMOTE and cand.mode is TrafficMode.SHADOW)
    assert evaluate_rollout(baseline, cand, REQUIREMENTS, list(reversed(gates))) == decision
    json.dumps(to_plain(decision), allow_nan=False)


def test_a_quality_drop_or_throughput_ratio_equal_to_its_limit_passes_despite_rounding() -> None:
    # 0.90 - 0.87 is 0.030000000000000027 and 8.1 / 9 is 0.8999999999999999: both equal their
    # limits, and "equality passes" (spec §1.11). Both had rolled the canary back.
    at_limit = dataclasses.replace(REQUIREMENTS, min_relative_throughput=0.9)
    baseline = dataclasses.replace(BASELINE, output_tokens_per_second=9.0)
    decision = evaluate_rollout(baseline, candidate(quality_score=0.87, output_tokens_per_second=8.1),
                                at_limit)
    assert (decision.action, codes(decision)) == (PROMOTE, ["all_gates_passed"])
    worse = evaluate_rollout(baseline, candidate(quality_score=0.8699, output_tokens_per_second=8.099),
                             at_limit)
    assert codes(worse) == ["quality_regression_exceeds_allowance",
                            "relative_throughput_below_objective"]


def test_a_throughput_that_is_not_positive_is_named_before_other_bad_values() -> None:
    # Spec §1.11 validates throughput <= 0 before negative quality, latency or error values.
    with pytest.raises(PolicyInputError) as raised:
        evaluate_rollout(BASELINE, candidate(quality_score=-0.1, output_tokens_per_second=0.0),
                         REQUIREMENTS)
    assert (raised.value.code, raised.value.field) == (
        "throughput_not_positive", "candidate.output_tokens_per_second")
