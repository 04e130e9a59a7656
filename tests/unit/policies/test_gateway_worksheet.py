"""The course worksheet's figures, and the serving-memory arithmetic Select relies on (spec §9)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.gateway_worksheet import (
    hosted_request_cost,
    latency_before_persist,
    self_hosted_allocation,
)
from controlplane.policies.memory import (
    GIB,
    DeploymentMemory,
    ModelMemory,
    assess_memory,
    kv_bytes_per_token,
)
from controlplane.policies.reasons import PolicyInputError, to_plain

MODEL_8B = ModelMemory(8_000_000_000, 16, 32, 8, 128)
MODEL_70B = ModelMemory(70_000_000_000, 16, 80, 8, 128)


def plan(model: ModelMemory, tp: int = 1, sequences: int = 1, fraction: float = 0.9) -> DeploymentMemory:
    return DeploymentMemory(gpu_memory_gib=80.0, tensor_parallel_size=tp, kv_shards=tp,
                            max_live_tokens_per_request=8_192, target_concurrency=sequences,
                            runtime_overhead_gib=0.0, usable_fraction=fraction)


def test_latency_worksheet_gives_9_5_seconds_before_persistence() -> None:
    estimate = latency_before_persist(0.3, 0.2, 300, 0.030)
    assert estimate.total_before_persist_seconds == pytest.approx(9.5)
    assert estimate.first_token_seconds == pytest.approx(0.5)
    assert estimate.decode_seconds == pytest.approx(9.0)
    assert estimate.reasons[0].code == "latency_estimated"


def test_self_hosted_allocation_is_about_0_000278_units_per_request() -> None:
    allocation = self_hosted_allocation(10.0, 20.0, 0.5)
    assert allocation.cost_units == pytest.approx(10 / 36_000)
    assert round(allocation.cost_units, 6) == 0.000278
    assert allocation.reasons[0].facts["served_requests_per_hour"] == pytest.approx(36_000)


def test_lower_utilisation_raises_the_cost_per_success() -> None:
    assert self_hosted_allocation(10.0, 20.0, 0.25).cost_units == pytest.approx(2 * 10 / 36_000)


def test_hosted_cost_is_input_times_input_price_plus_output_times_output_price() -> None:
    cost = hosted_request_cost(1_000, 300, 0.000_003, 0.000_015)
    assert cost.cost_units == pytest.approx(1_000 * 0.000_003 + 300 * 0.000_015)
    assert hosted_request_cost(0, 0, 1.0, 1.0).cost_units == 0


@pytest.mark.parametrize(("call", "field"), [
    (lambda: self_hosted_allocation(10.0, 0.0, 0.5), "busy_requests_per_second"),
    (lambda: self_hosted_allocation(10.0, 20.0, 0.0), "utilisation"),
    (lambda: self_hosted_allocation(10.0, 20.0, 1.5), "utilisation"),
    (lambda: self_hosted_allocation(math.nan, 20.0, 0.5), "cost_units_per_hour"),
    (lambda: hosted_request_cost(-1, 0, 1.0, 1.0), "input_tokens"),
    (lambda: hosted_request_cost(1, 1, math.inf, 1.0), "input_price_per_token"),
    (lambda: latency_before_persist(0.3, -0.2, 300, 0.03), "prefill_seconds"),
    (lambda: latency_before_persist(0.3, 0.2, -1, 0.03), "output_tokens"),
])
def test_invalid_worksheet_inputs_are_refused_naming_the_field(call: object, field: str) -> None:
    with pytest.raises(PolicyInputError) as error:
        call()  # type: ignore[operator]
    assert (error.value.code, error.value.field) == ("worksheet_value_out_of_range", field)


@settings(max_examples=100, deadline=None)
@given(st.floats(0, 1e6), st.floats(1e-3, 1e6), st.floats(1e-3, 1.0))
def test_allocations_are_finite_plain_data(cost: float, rate: float, utilisation: float) -> None:
    allocation = self_hosted_allocation(cost, rate, utilisation)
    assert math.isfinite(allocation.cost_units)
    to_plain(allocation)


def test_memory_arithmetic_reproduces_the_per_token_kv_and_weight_figures() -> None:
    assert kv_bytes_per_token(MODEL_8B) == 131_072
    assert kv_bytes_per_token(MODEL_70B) == 327_680
    assessment = assess_memory(MODEL_8B, plan(MODEL_8B))
    assert assessment.weight_gib_per_gpu * GIB == pytest.approx(16_000_000_000)
    assert assessment.usable_gib_per_gpu == pytest.approx(72.0)


def test_8b_at_8192_tokens_holds_57_sequences_of_exactly_one_gib() -> None:
    assessment = assess_memory(MODEL_8B, plan(MODEL_8B, sequences=57))
    assert assessment.kv_gib_per_gpu == pytest.approx(57.0)
    assert assessment.max_concurrency == 57 and assessment.fits
    assert not assess_memory(MODEL_8B, plan(MODEL_8B, sequences=58)).fits


def test_70b_bf16_does_not_fit_at_tp1_and_holds_5_sequences_at_tp2() -> None:
    assert not assess_memory(MODEL_70B, plan(MODEL_70B)).fits
    tp2 = assess_memory(MODEL_70B, plan(MODEL_70B, tp=2, sequences=5))
    free_bytes = (tp2.usable_gib_per_gpu - tp2.weight_gib_per_gpu) * GIB
    assert free_bytes == pytest.approx(7_309_411_328)
    assert tp2.max_concurrency == 5 and tp2.fits


@pytest.mark.parametrize("fraction", [0.0, 1.5, -0.1])
def test_a_usable_fraction_outside_zero_to_one_is_refused(fraction: float) -> None:
    with pytest.raises(PolicyInputError) as error:
        assess_memory(MODEL_8B, plan(MODEL_8B, fraction=fraction))
    assert error.value.field == "usable_fraction"


def test_a_negative_parameter_count_is_refused() -> None:
    with pytest.raises(PolicyInputError) as error:
        assess_memory(ModelMemory(-1, 16, 32, 8, 128), plan(MODEL_8B))
    assert error.value.field == "parameters"


@pytest.mark.parametrize(("model", "tp", "tokens", "sequences"), [
    (MODEL_8B, 1, 467_753, 57),
    (MODEL_70B, 2, 44_613, 5),
    (ModelMemory(70_000_000_000, 4, 80, 8, 128), 1, 129_118, 15),  # int4 weights, bf16 KV
], ids=["8b_tp1", "70b_tp2", "70b_int4_tp1"])
def test_token_capacity_and_sequences_match_the_spec_worked_table(
        model: ModelMemory, tp: int, tokens: int, sequences: int) -> None:
    # Spec §9's worked values: floor(free / per-token KV) and floor(free / (per-token KV x 8,192)).
    assessment = assess_memory(model, plan(model, tp=tp))
    assert assessment.kv_capacity_tokens == tokens
    assert assessment.max_concurrency == sequences
