"""Quantization staging gate (spec §1.5, example 05, tests/test_quantization.py)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.quantization import (
    QuantizationAction,
    QuantizationMeasurement,
    QuantizationRequirements,
    evaluate_quantization,
)
from controlplane.policies.reasons import PolicyInputError, to_plain

BASELINE = QuantizationMeasurement("bf16", 16, True, 0.90, 28, 0.8, 100)
REQUIREMENTS = QuantizationRequirements(0.85, 0.03, 16, 0.9, 1.0)
GATE_ORDER = ["hardware_kernel_unsupported", "quality_below_floor",
              "quality_regression_exceeds_allowance", "weight_memory_exceeds_budget",
              "p95_ttft_exceeds_objective", "relative_throughput_below_requirement"]


def codes(decision: object) -> list[str]:
    return [reason.code for reason in decision.reasons]  # type: ignore[attr-defined]


def test_example_05_int4_is_rejected_for_relative_throughput_alone() -> None:
    decision = evaluate_quantization(
        QuantizationMeasurement("bf16", 16, True, 0.91, 28, 0.9, 100),
        QuantizationMeasurement("int4", 4, True, 0.88, 8, 0.8, 85),
        QuantizationRequirements(0.86, 0.04, 12, 1.0, 1.0))
    assert decision.action is QuantizationAction.REJECT
    assert decision.relative_throughput == pytest.approx(0.85)
    assert decision.quality_drop == pytest.approx(0.03)
    assert codes(decision) == ["relative_throughput_below_requirement"]


def test_measured_candidate_can_advance_to_staging() -> None:
    decision = evaluate_quantization(
        BASELINE, QuantizationMeasurement("int8", 8, True, 0.88, 15, 0.7, 120), REQUIREMENTS)
    assert decision.action is QuantizationAction.STAGE
    assert decision.quality_drop == pytest.approx(0.02)
    assert decision.relative_throughput == pytest.approx(1.2)
    assert codes(decision) == ["staging_gates_passed"]


def test_low_bit_width_does_not_manufacture_a_speedup() -> None:
    decision = evaluate_quantization(
        BASELINE, QuantizationMeasurement("int4", 4, True, 0.88, 8, 0.7, 70), REQUIREMENTS)
    assert decision.action is QuantizationAction.REJECT
    assert decision.relative_throughput == 0.7
    assert codes(decision) == ["relative_throughput_below_requirement"]


def test_hardware_support_is_an_independent_gate() -> None:
    decision = evaluate_quantization(
        BASELINE, QuantizationMeasurement("format-x", 4, False, 0.90, 8, 0.5, 150), REQUIREMENTS)
    assert decision.relative_throughput == 1.5
    assert codes(decision) == ["hardware_kernel_unsupported"]


def test_quality_regression_is_compared_with_a_separate_baseline() -> None:
    decision = evaluate_quantization(
        BASELINE, QuantizationMeasurement("int8", 8, True, 0.86, 15, 0.7, 120), REQUIREMENTS)
    assert codes(decision) == ["quality_regression_exceeds_allowance"]
    assert decision.reasons[0].facts["quality_drop"] == pytest.approx(0.04)


def test_every_failing_gate_is_reported_in_fixed_order() -> None:
    decision = evaluate_quantization(
        BASELINE, QuantizationMeasurement("bad", 2, False, 0.5, 20, 2.0, 10), REQUIREMENTS)
    assert codes(decision) == GATE_ORDER


def test_a_comparison_that_overflows_is_refused_rather_than_reported_as_infinity() -> None:
    with pytest.raises(PolicyInputError) as error:
        evaluate_quantization(replace(BASELINE, quality_score=1e308),
                              replace(BASELINE, quality_score=-1e308), REQUIREMENTS)
    assert (error.value.code, error.value.field) == ("figures_not_finite", "candidate")


def test_decisions_serialise_to_strict_json() -> None:
    decision = evaluate_quantization(
        BASELINE, QuantizationMeasurement("bad", 2, False, 0.5, 20, 2.0, 10), REQUIREMENTS)
    plain = json.loads(json.dumps(to_plain(decision), allow_nan=False))
    assert plain["action"] == "reject"
    assert [reason["code"] for reason in plain["reasons"]] == GATE_ORDER


def test_bit_width_alone_never_changes_the_decision() -> None:
    candidate = QuantizationMeasurement("int8", 8, True, 0.88, 15, 0.7, 120)
    assert (evaluate_quantization(BASELINE, candidate, REQUIREMENTS)
            == evaluate_quantization(BASELINE, replace(candidate, weight_bits=2), REQUIREMENTS))


@pytest.mark.parametrize(("baseline", "candidate", "requirements", "code", "field"), [
    (replace(BASELINE, name=" "), BASELINE, REQUIREMENTS, "measurement_name_blank",
     "baseline.name"),
    (BASELINE, replace(BASELINE, weight_bits=0), REQUIREMENTS, "measurement_not_positive",
     "candidate.weight_bits"),
    (BASELINE, replace(BASELINE, weight_memory_gib=0), REQUIREMENTS, "measurement_not_positive",
     "candidate.weight_memory_gib"),
    (BASELINE, replace(BASELINE, p95_ttft_seconds=-1), REQUIREMENTS, "measured_latency_negative",
     "candidate.p95_ttft_seconds"),
    (replace(BASELINE, output_tokens_per_second=0), BASELINE, REQUIREMENTS,
     "measured_throughput_not_positive", "baseline.output_tokens_per_second"),
    (BASELINE, replace(BASELINE, quality_score=math.nan), REQUIREMENTS, "measurement_not_finite",
     "candidate.quality_score"),
    (BASELINE, BASELINE, replace(REQUIREMENTS, max_quality_drop=-0.01), "requirement_negative",
     "requirements.max_quality_drop"),
    (BASELINE, BASELINE, replace(REQUIREMENTS, min_relative_throughput=math.inf),
     "requirement_not_finite", "requirements.min_relative_throughput"),
])
def test_invalid_inputs_are_refused_with_code_and_field(
        baseline: QuantizationMeasurement, candidate: QuantizationMeasurement,
        requirements: QuantizationRequirements, code: str, field: str) -> None:
    with pytest.raises(PolicyInputError) as error:
        evaluate_quantization(baseline, candidate, requirements)
    assert (error.value.code, error.value.field) == (code, field)


_positive = st.floats(min_value=0.01, max_value=1000, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.booleans(), st.floats(0, 1), st.floats(0, 1), _positive, _positive, _positive)
def test_stage_exactly_when_no_gate_fails_and_failures_keep_the_fixed_order(
        supported: bool, quality: float, floor: float, memory: float, ttft: float,
        throughput: float) -> None:
    candidate = QuantizationMeasurement("candidate", 4, supported, quality, memory, ttft,
                                        throughput)
    requirements = QuantizationRequirements(floor, 0.1, 100, 100, 0.5)
    decision = evaluate_quantization(BASELINE, candidate, requirements)
    failed = codes(decision)
    expected = [code for code, failing in zip(GATE_ORDER, [
        not supported, quality < floor, 0.90 - quality > 0.1, memory > 100, ttft > 100,
        throughput / 100 < 0.5], strict=True) if failing]
    assert (decision.action is QuantizationAction.STAGE) == (not expected)
    assert failed == (expected or ["staging_gates_passed"])


def test_a_quality_drop_or_throughput_ratio_equal_to_its_limit_passes_despite_rounding() -> None:
    # 0.90 - 0.87 is 0.030000000000000027 and 8.1 / 9 is 0.8999999999999999 (spec §1.5: the
    # gates are inclusive); both had rejected the candidate.
    baseline = QuantizationMeasurement("bf16", 16, True, 0.90, 28, 0.8, 9.0)
    at_limit = QuantizationRequirements(0.85, 0.03, 16, 0.9, 0.9)
    decision = evaluate_quantization(
        baseline, QuantizationMeasurement("int8", 8, True, 0.87, 15, 0.7, 8.1), at_limit)
    assert codes(decision) == ["staging_gates_passed"]
    worse = evaluate_quantization(
        baseline, QuantizationMeasurement("int8", 8, True, 0.8699, 15, 0.7, 8.099), at_limit)
    assert codes(worse) == ["quality_regression_exceeds_allowance",
                            "relative_throughput_below_requirement"]
