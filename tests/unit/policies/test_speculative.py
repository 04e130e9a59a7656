"""Speculative decoding gate (spec §1.6, example 06, tests/test_speculative.py, §9 bug 1)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.reasons import PolicyInputError, to_plain
from controlplane.policies.speculative import (
    SpeculationCosts,
    SpeculationRound,
    evaluate_speculation,
    evaluate_speculation_rounds,
)

COSTS = SpeculationCosts(1.0, 0.1, 1.0)
TARGET = (1, 2, 3, 4, 5)


def test_example_06_good_draft_enables_and_poor_draft_does_not() -> None:
    good = evaluate_speculation((1, 2, 3, 4), TARGET, COSTS, 1.2)
    poor = evaluate_speculation((9, 8, 7, 6), TARGET, COSTS, 1.2)
    assert (good.acceptance_rate, good.drafted_tokens, good.emitted_tokens) == (1.0, 4, 5)
    assert good.estimated_speedup == pytest.approx(5 / 1.4)
    assert good.enable and good.reasons[0].code == "speedup_clears_gate"
    assert (poor.acceptance_rate, poor.drafted_tokens, poor.emitted_tokens) == (0.0, 4, 1)
    assert poor.estimated_speedup == pytest.approx(1 / 1.4)
    assert not poor.enable and poor.reasons[0].code == "speedup_misses_gate"
    assert poor.reasons[0].facts["minimum_speedup"] == 1.2


def test_high_actual_acceptance_can_repay_a_verification_round() -> None:
    decision = evaluate_speculation((1, 2, 3, 4), TARGET, COSTS, 2.0)
    assert decision.enable
    assert decision.accepted_tokens == 4
    assert decision.estimated_speedup == pytest.approx(5 / 1.4)
    assert decision.speculative_seconds == pytest.approx(1.4)


def test_fully_accepted_round_emits_the_extra_verified_position() -> None:
    """Regression (spec §9 bug 1, v1): full acceptance emitted k tokens, losing the bonus token."""
    decision = evaluate_speculation((1, 2, 3, 4), TARGET, COSTS)
    assert (decision.accepted_tokens, decision.drafted_tokens, decision.emitted_tokens,
            decision.acceptance_rate) == (4, 4, 5, 1.0)


def test_low_acceptance_can_make_speculation_slower() -> None:
    decision = evaluate_speculation((9, 8, 7, 6), TARGET, COSTS)
    assert not decision.enable
    assert (decision.accepted_tokens, decision.emitted_tokens) == (0, 1)
    assert decision.estimated_speedup == pytest.approx(0.7142857)


def test_first_mismatch_emits_verified_target_token_after_accepted_prefix() -> None:
    decision = evaluate_speculation((1, 2, 9, 9), TARGET, COSTS)
    assert (decision.accepted_tokens, decision.emitted_tokens, decision.acceptance_rate) == (
        2, 3, 0.5)
    assert decision.estimated_speedup == pytest.approx(2.142857)
    assert decision.reasons[0].code == "speedup_clears_gate"
    assert decision.reasons[0].facts["minimum_speedup"] == 1.0


def test_bonus_token_must_come_from_a_supplied_verified_position() -> None:
    """Regression (spec §9 bug 1, v2): a target as long as the draft was accepted."""
    with pytest.raises(PolicyInputError) as error:
        evaluate_speculation((1, 2, 3, 4), (1, 2, 3, 4), COSTS)
    assert (error.value.code, error.value.field) == ("target_missing_bonus_position",
                                                     "target_tokens")


def test_speedup_gate_is_independent_of_token_inputs() -> None:
    lenient = evaluate_speculation((1, 2), (1, 2, 3), COSTS, 2.0)
    strict = evaluate_speculation((1, 2), (1, 2, 3), COSTS, 3.0)
    assert lenient.estimated_speedup == strict.estimated_speedup == pytest.approx(2.5)
    assert lenient.enable and not strict.enable
    assert strict.reasons[0].code == "speedup_misses_gate"
    assert strict.reasons[0].facts["minimum_speedup"] == 3.0


def test_gate_is_inclusive_at_exact_equality() -> None:
    decision = evaluate_speculation((1,), (1, 2), SpeculationCosts(1.0, 1.0, 1.0), 1.0)
    assert decision.estimated_speedup == 1.0
    assert decision.enable


def test_target_tokens_beyond_the_bonus_position_are_ignored() -> None:
    assert (evaluate_speculation((1, 2), (1, 2, 3), COSTS)
            == evaluate_speculation((1, 2), (1, 2, 3, 4, 5, 6), COSTS))


@pytest.mark.parametrize(("draft", "target", "costs", "minimum", "code", "field"), [
    ((), (1,), COSTS, 1.0, "tokens_empty", "draft_tokens"),
    ((1,), (), COSTS, 1.0, "tokens_empty", "target_tokens"),
    ((1, 2), (1, 2), COSTS, 1.0, "target_missing_bonus_position", "target_tokens"),
    ((1,), (1, 2), SpeculationCosts(0, 0.1, 1), 1.0, "cost_not_positive",
     "baseline_seconds_per_token"),
    ((1,), (1, 2), SpeculationCosts(1, math.nan, 1), 1.0, "cost_not_finite",
     "draft_seconds_per_token"),
    ((1,), (1, 2), COSTS, 0.0, "cost_not_positive", "minimum_speedup"),
])
def test_invalid_inputs_are_refused_with_code_and_field(
        draft: tuple[int, ...], target: tuple[int, ...], costs: SpeculationCosts,
        minimum: float, code: str, field: str) -> None:
    with pytest.raises(PolicyInputError) as error:
        evaluate_speculation(draft, target, costs, minimum)
    assert (error.value.code, error.value.field) == (code, field)


def test_a_speedup_that_overflows_is_refused_rather_than_reported_as_infinity() -> None:
    with pytest.raises(PolicyInputError) as error:
        evaluate_speculation((1,), (1, 2), SpeculationCosts(1e308, 1e-320, 1e-320))
    assert error.value.code == "figures_not_finite"


def test_many_rounds_report_acceptance_by_position_and_compare_drafts() -> None:
    strong = [SpeculationRound((1, 2, 3, 4), TARGET), SpeculationRound((1, 2, 9, 9), TARGET)]
    weak = [SpeculationRound((9, 2, 3, 4), TARGET), SpeculationRound((1, 9, 9, 9), TARGET)]
    summary = evaluate_speculation_rounds(strong, COSTS, 1.5)
    assert summary.acceptance_by_position == (1.0, 1.0, 0.5, 0.5)
    assert (summary.accepted_tokens, summary.emitted_tokens, summary.drafted_tokens) == (6, 8, 8)
    assert summary.estimated_speedup == pytest.approx(8 / 2.8)
    assert summary.p95_round_seconds == pytest.approx(1.4)
    assert summary.enable
    json.dumps(to_plain(summary), allow_nan=False)
    cheap_weak = evaluate_speculation_rounds(weak, SpeculationCosts(1.0, 0.01, 1.0), 1.5)
    assert not cheap_weak.enable  # a cheap draft still loses when it is rarely accepted


def test_a_malformed_round_fails_the_whole_evaluation_instead_of_being_dropped() -> None:
    rounds = [SpeculationRound((1, 2), (1, 2, 3)), SpeculationRound((1, 2), (1, 2))]
    with pytest.raises(PolicyInputError) as error:
        evaluate_speculation_rounds(rounds, COSTS)
    assert error.value.field == "rounds[1].target_tokens"


_tokens = st.lists(st.integers(0, 3), min_size=1, max_size=6)
_cost = st.floats(min_value=0.001, max_value=10, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.data(), _tokens, _cost, _cost, _cost)
def test_a_round_emits_between_one_and_k_plus_one_and_one_round_summary_agrees(
        data: st.DataObject, draft: list[int], baseline: float, per_draft: float,
        verification: float) -> None:
    agreeing = data.draw(st.integers(0, len(draft)))
    tail = data.draw(st.lists(st.integers(0, 3), min_size=len(draft) + 1 - agreeing,
                              max_size=len(draft) + 3 - agreeing))
    target = (*draft[:agreeing], *tail)
    costs = SpeculationCosts(baseline, per_draft, verification)
    decision = evaluate_speculation(draft, target, costs)
    assert agreeing <= decision.accepted_tokens <= len(draft)
    assert decision.emitted_tokens == decision.accepted_tokens + 1
    assert math.isfinite(decision.estimated_speedup)
    assert decision.enable == (decision.estimated_speedup >= 1.0)
    summary = evaluate_speculation_rounds([SpeculationRound(tuple(draft), target)], costs)
    assert summary.estimated_speedup == decision.estimated_speedup
    assert summary.emitted_tokens == decision.emitted_tokens
