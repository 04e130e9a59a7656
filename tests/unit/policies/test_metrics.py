"""Service-level gate (spec §1.2, example 02, tests/test_metrics.py, §9 bug 2)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from controlplane.policies.metrics import (
    RequestTrace,
    ServiceObjectives,
    evaluate_service,
    evaluate_service_by_class,
    p95_nearest_rank,
)
from controlplane.policies.reasons import PolicyInputError, to_plain

OBJECTIVES = ServiceObjectives(1.0, 0.2, 3.0, 2.0)


def codes(report: object) -> list[str]:
    return [reason.code for reason in report.reasons]  # type: ignore[attr-defined]


def test_example_02_slow_prefill_fails_only_ttft() -> None:
    traces = [RequestTrace("interactive-1", 0.0, 0.4, 1.3, 10),
              RequestTrace("interactive-2", 0.2, 0.7, 1.6, 10),
              RequestTrace("long-prefill", 0.4, 1.6, 2.5, 10)]
    report = evaluate_service(traces, ServiceObjectives(1.0, 0.15, 2.5, 10))
    assert report.p95_ttft_seconds == pytest.approx(1.2)
    assert report.p95_tpot_seconds == pytest.approx(0.1)
    assert report.p95_e2e_seconds == pytest.approx(2.1)
    assert report.output_tokens_per_second == pytest.approx(12.0)
    assert not report.meets_objectives
    assert codes(report) == ["p95_ttft_exceeded"]
    assert report.reasons[0].facts["p95_ttft_seconds"] == pytest.approx(1.2)


def test_known_trace_separates_ttft_tpot_e2e_and_throughput_and_boundaries_pass() -> None:
    report = evaluate_service([RequestTrace("r1", 0, 1, 3, 11)],
                              ServiceObjectives(1.0, 0.2, 3.0, 11 / 3))
    assert report.p95_ttft_seconds == pytest.approx(1.0)
    assert report.p95_tpot_seconds == pytest.approx(0.2)
    assert report.p95_e2e_seconds == pytest.approx(3.0)
    assert report.output_tokens_per_second == pytest.approx(11 / 3)
    assert report.meets_objectives
    assert codes(report) == ["service_objectives_met"]


def test_slow_first_token_breaks_ttft_without_breaking_tpot() -> None:
    report = evaluate_service([RequestTrace("r1", 0, 1.5, 2.4, 10)], OBJECTIVES)
    assert codes(report) == ["p95_ttft_exceeded"]
    assert report.p95_tpot_seconds == pytest.approx(0.1)


def test_throughput_uses_the_shared_observation_window_not_summed_rates() -> None:
    traces = [RequestTrace("r1", 0, 0.2, 1, 5), RequestTrace("r2", 1, 1.2, 2, 5)]
    report = evaluate_service(traces, ServiceObjectives(1, 1, 3, 6))
    assert report.output_tokens_per_second == 5.0
    assert report.observation_window_seconds == 2.0
    assert codes(report) == ["output_throughput_below_minimum"]


def test_every_violation_is_reported_in_fixed_order() -> None:
    report = evaluate_service([RequestTrace("r1", 0, 2, 10, 5)], ServiceObjectives(1, 1, 3, 6))
    assert codes(report) == ["p95_ttft_exceeded", "p95_tpot_exceeded", "p95_e2e_exceeded",
                             "output_throughput_below_minimum"]


def test_single_token_request_has_zero_tpot() -> None:
    report = evaluate_service([RequestTrace("r1", 0, 1, 1.5, 1)], OBJECTIVES)
    assert report.p95_tpot_seconds == 0.0


def test_rejects_impossible_timestamps_instead_of_emitting_negative_latency() -> None:
    with pytest.raises(PolicyInputError) as error:
        evaluate_service([RequestTrace("r1", 1, 0, 2, 2)], OBJECTIVES)
    assert (error.value.code, error.value.field) == (
        "timestamps_impossible", "traces[0].first_token_at_seconds")


def test_zero_length_window_is_refused_rather_than_passing_every_objective() -> None:
    """Regression (spec §9 bug 2): a zero window gave infinite throughput and passed any floor."""
    with pytest.raises(PolicyInputError) as error:
        evaluate_service([RequestTrace("r1", 5, 5, 5, 3)], ServiceObjectives(1, 1, 1, 1_000_000))
    assert error.value.code == "observation_window_empty"


@pytest.mark.parametrize(("traces", "objectives", "code", "field"), [
    ([], OBJECTIVES, "traces_empty", "traces"),
    ([RequestTrace("r1", 0, 1, 2, 2)], ServiceObjectives(1, -0.1, 1, 1), "objective_negative",
     "max_p95_tpot_seconds"),
    ([RequestTrace("r1", 0, 1, 2, 2)], ServiceObjectives(math.nan, 1, 1, 1),
     "objective_not_finite", "max_p95_ttft_seconds"),
    ([RequestTrace("  ", 0, 1, 2, 2)], OBJECTIVES, "trace_identifier_blank",
     "traces[0].identifier"),
    ([RequestTrace("r1", 0, 1, 2, 0)], OBJECTIVES, "output_tokens_not_positive",
     "traces[0].output_tokens"),
    ([RequestTrace("r1", 0, 1, math.inf, 2)], OBJECTIVES, "timestamp_not_finite",
     "traces[0].completed_at_seconds"),
    ([RequestTrace("r1", 0, 2, 1, 2)], OBJECTIVES, "timestamps_impossible",
     "traces[0].completed_at_seconds"),
])
def test_invalid_inputs_are_refused_with_code_and_field(
        traces: list[RequestTrace], objectives: ServiceObjectives, code: str, field: str) -> None:
    with pytest.raises(PolicyInputError) as error:
        evaluate_service(traces, objectives)
    assert (error.value.code, error.value.field) == (code, field)


@pytest.mark.parametrize("trace", [
    RequestTrace("tiny-window", 0, 0, 5e-324, 10),
    RequestTrace("huge-span", -1.7e308, 0, 1.7e308, 2),
])
def test_figures_that_overflow_are_refused_rather_than_reported_as_infinity(
        trace: RequestTrace) -> None:
    with pytest.raises(PolicyInputError) as error:
        evaluate_service([trace], OBJECTIVES)
    assert error.value.code == "figures_not_finite"


def test_duplicate_trace_ids_are_accepted() -> None:
    traces = [RequestTrace("same", 0, 0.1, 1, 2), RequestTrace("same", 0, 0.1, 1, 2)]
    assert evaluate_service(traces, OBJECTIVES).request_count == 2


def test_nearest_rank_p95_is_the_maximum_below_twenty_and_the_19th_of_twenty() -> None:
    assert p95_nearest_rank([float(v) for v in range(1, 20)]) == 19.0
    assert p95_nearest_rank([float(v) for v in range(1, 21)]) == 19.0
    assert p95_nearest_rank([float(v) for v in range(1, 101)]) == 95.0


def test_one_slow_class_does_not_fail_another_class() -> None:
    interactive = [RequestTrace("i1", 0, 0.2, 1.0, 10)]
    batch = [RequestTrace("b1", 0, 30, 100, 10)]
    report = evaluate_service_by_class(
        {"interactive": interactive, "batch": batch},
        {"interactive": ServiceObjectives(0.5, 0.1, 2, 1),
         "batch": ServiceObjectives(10, 10, 60, 0.01)})
    assert report.failing_classes == ("batch",)
    assert report.reports["interactive"].meets_objectives
    assert codes(report) == ["class_objectives_missed"]
    assert report.reasons[0].facts["violations"] == ["p95_ttft_exceeded", "p95_e2e_exceeded"]


@pytest.mark.parametrize(("traces_by_class", "code"), [
    ({"interactive": [RequestTrace("i1", 0, 0.2, 1.0, 10)],
      "unknown": [RequestTrace("u1", 0, 0.2, 1.0, 10)]}, "class_unknown"),
    ({"interactive": []}, "class_empty"),
])
def test_unknown_or_empty_classes_fail_validation(
        traces_by_class: dict[str, list[RequestTrace]], code: str) -> None:
    with pytest.raises(PolicyInputError) as error:
        evaluate_service_by_class(traces_by_class, {"interactive": OBJECTIVES})
    assert error.value.code == code


_times = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def _traces(draw: st.DrawFn) -> list[RequestTrace]:
    count = draw(st.integers(min_value=1, max_value=30))
    traces = []
    for index in range(count):
        moments = sorted(draw(st.lists(_times, min_size=3, max_size=3)))
        tokens = draw(st.integers(min_value=1, max_value=10_000))
        traces.append(RequestTrace(f"r{index}", moments[0], moments[1], moments[2], tokens))
    return traces


@settings(max_examples=100, deadline=None)
@given(_traces(), st.tuples(_times, _times, _times, _times))
@example([RequestTrace("r0", 0.0, 0.0, 5e-324, 1)], (1.0, 1.0, 1.0, 1.0))  # the rate overflows
def test_outputs_are_finite_and_meeting_means_every_bound_holds(
        traces: list[RequestTrace], limits: tuple[float, float, float, float]) -> None:
    try:
        report = evaluate_service(traces, ServiceObjectives(*limits))
    except PolicyInputError as error:
        window = (max(t.completed_at_seconds for t in traces)
                  - min(t.arrived_at_seconds for t in traces))
        if error.code == "figures_not_finite":  # a window so short the rate overflows
            assert window > 0 and math.isinf(sum(t.output_tokens for t in traces) / window)
        else:
            assert error.code == "observation_window_empty" and window == 0
        return
    json.dumps(to_plain(report), allow_nan=False)
    objectives = ServiceObjectives(*limits)
    assert report.meets_objectives == (
        report.p95_ttft_seconds <= objectives.max_p95_ttft_seconds
        and report.p95_tpot_seconds <= objectives.max_p95_tpot_seconds
        and report.p95_e2e_seconds <= objectives.max_p95_e2e_seconds
        and report.output_tokens_per_second >= objectives.min_output_tokens_per_second)
    # Every TTFT is at most its own E2E, so the same rank of each keeps that order.
    assert report.p95_ttft_seconds <= report.p95_e2e_seconds


@settings(max_examples=60, deadline=None)
@given(_traces())
def test_p95_is_bounded_by_the_extremes_and_ignores_input_order(
        traces: list[RequestTrace]) -> None:
    values = [t.completed_at_seconds - t.arrived_at_seconds for t in traces]
    assert min(values) <= p95_nearest_rank(values) <= max(values)
    assert p95_nearest_rank(values) == p95_nearest_rank(list(reversed(values)))
