"""Memory fit (spec §1.1, §2.4, §3 example 01, §4 tests/test_memory.py) and its extensions."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.memory import (
    GIB,
    DeploymentMemory,
    ModelMemory,
    assess_memory,
    effective_window_tokens,
    kv_bytes_per_token,
    kv_shards_under_tensor_parallel,
    largest_stage_window_tokens,
)
from controlplane.policies.reasons import PolicyInputError, to_plain

# §4: GIB params at 8 bits is exactly 1 GiB of weights; 1 layer x 1 head x dim 1 x 1 B = 2 B/token.
UNIT_MODEL = ModelMemory(parameters=GIB, weight_bits=8, layers=1, kv_heads=1, head_dim=1,
                         kv_element_bytes=1)


def unit_deployment(**changes: object) -> DeploymentMemory:
    base = DeploymentMemory(gpu_memory_gib=2, tensor_parallel_size=1, kv_shards=1,
                            max_live_tokens_per_request=GIB // 4, target_concurrency=1,
                            runtime_overhead_gib=0.25, usable_fraction=1)
    return replace(base, **changes)  # type: ignore[arg-type]


def codes(assessment: object) -> list[str]:
    return [reason.code for reason in assessment.reasons]  # type: ignore[attr-defined]


# --- spec §4 tests/test_memory.py -------------------------------------------------------------


def test_accounts_for_weight_kv_and_runtime_memory_separately() -> None:
    result = assess_memory(UNIT_MODEL, unit_deployment())
    assert (result.weight_gib_per_gpu, result.kv_gib_per_gpu) == (1.0, 0.5)
    assert result.overhead_gib_per_gpu == 0.25
    assert result.required_gib_per_gpu == 1.75
    assert result.fits and codes(result) == ["fits_with_headroom"]
    assert result.reasons[0].facts["headroom_gib_per_gpu"] == pytest.approx(0.25)
    assert result.max_concurrency == 1


def test_context_growth_can_flip_weight_fit_to_service_no_fit() -> None:
    short = assess_memory(UNIT_MODEL, unit_deployment(max_live_tokens_per_request=GIB // 8))
    long = assess_memory(UNIT_MODEL, unit_deployment(max_live_tokens_per_request=GIB // 2))
    assert (short.kv_gib_per_gpu, short.required_gib_per_gpu, short.fits) == (0.25, 1.5, True)
    assert (long.kv_gib_per_gpu, long.required_gib_per_gpu, long.fits) == (1.0, 2.25, False)
    assert codes(long) == ["exceeds_usable_memory"]
    assert long.reasons[0].facts["shortfall_gib_per_gpu"] == pytest.approx(0.25)
    assert short.weight_gib_per_gpu == long.weight_gib_per_gpu


def test_tensor_and_kv_sharding_are_independent_inputs() -> None:
    deployment = unit_deployment(gpu_memory_gib=1, tensor_parallel_size=2, target_concurrency=2,
                                 runtime_overhead_gib=0)
    unsharded = assess_memory(UNIT_MODEL, deployment)
    sharded = assess_memory(UNIT_MODEL, replace(deployment, kv_shards=2))
    assert (unsharded.weight_gib_per_gpu, unsharded.kv_gib_per_gpu) == (0.5, 1.0)
    assert not unsharded.fits
    assert (sharded.weight_gib_per_gpu, sharded.kv_gib_per_gpu) == (0.5, 0.5)
    assert sharded.required_gib_per_gpu == sharded.usable_gib_per_gpu == 1.0
    assert sharded.fits and codes(sharded) == ["fits_with_headroom"]
    assert sharded.reasons[0].facts["headroom_gib_per_gpu"] == 0.0


def test_rejects_zero_or_negative_capacity() -> None:
    with pytest.raises(PolicyInputError) as caught:
        assess_memory(UNIT_MODEL, unit_deployment(gpu_memory_gib=0))
    assert (caught.value.code, caught.value.field) == ("deployment_field_not_positive",
                                                       "gpu_memory_gib")


# --- spec §3 example 01 and the §2.4 capstone figures ------------------------------------------


def test_example_01_seven_billion_4bit_model_fits_sixteen_8k_requests_on_24_gib() -> None:
    model = ModelMemory(parameters=7_000_000_000, weight_bits=4, layers=32, kv_heads=8,
                        head_dim=128, kv_element_bytes=2)
    deployment = DeploymentMemory(gpu_memory_gib=24, tensor_parallel_size=1, kv_shards=1,
                                  max_live_tokens_per_request=8192, target_concurrency=8,
                                  runtime_overhead_gib=2)
    result = assess_memory(model, deployment)
    assert result.weight_gib_per_gpu == pytest.approx(3.5e9 / GIB)
    assert round(result.weight_gib_per_gpu, 2) == 3.26
    assert result.kv_bytes_per_token == 131_072
    assert result.kv_gib_per_gpu == 8.0  # 131,072 B x 8,192 tokens = exactly 1 GiB, x 8
    assert result.usable_gib_per_gpu == pytest.approx(21.6)
    assert result.required_gib_per_gpu == pytest.approx(13.2596, abs=1e-4)
    assert round(result.reasons[0].facts["headroom_gib_per_gpu"], 2) == 8.34
    assert result.max_concurrency == 16
    assert result.fits and codes(result) == ["fits_with_headroom"]
    available_bytes = (21.6 - (3.5e9 / GIB + 2)) * GIB
    assert result.kv_capacity_tokens == math.floor(available_bytes / 131_072)


CAPSTONE_MODEL = ModelMemory(parameters=30_000_000_000, weight_bits=16, layers=60, kv_heads=8,
                             head_dim=128)
CAPSTONE_DEPLOYMENT = DeploymentMemory(gpu_memory_gib=40, tensor_parallel_size=2, kv_shards=2,
                                       max_live_tokens_per_request=4096, target_concurrency=6,
                                       runtime_overhead_gib=4, usable_fraction=0.9)


def test_capstone_memory_figures_are_exact() -> None:
    result = assess_memory(CAPSTONE_MODEL, CAPSTONE_DEPLOYMENT)
    assert result.weight_gib_per_gpu == 27.939677238464355
    assert result.kv_bytes_per_token == 245_760
    assert result.kv_gib_per_gpu == 2.8125
    assert result.required_gib_per_gpu == 34.752177238464355
    assert result.usable_gib_per_gpu == 36.0
    assert result.max_concurrency == 8
    assert result.fits and round(result.reasons[0].facts["headroom_gib_per_gpu"], 2) == 1.25


def test_capstone_overhead_is_echoed_unchanged_so_json_shows_an_integer() -> None:
    plain = to_plain(assess_memory(CAPSTONE_MODEL, CAPSTONE_DEPLOYMENT))
    assert '"overhead_gib_per_gpu": 4,' in json.dumps(plain)


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("model_change", "deployment_change", "code", "field"), [
    ({"layers": 0}, {}, "model_field_not_positive", "layers"),
    ({"kv_element_bytes": -1}, {}, "model_field_not_positive", "kv_element_bytes"),
    ({"parameters": 7.5e9}, {}, "model_field_not_integer", "parameters"),
    ({"head_dim": True}, {}, "model_field_not_integer", "head_dim"),
    ({"kv_latent_dim": -1}, {}, "model_field_negative", "kv_latent_dim"),
    ({}, {"target_concurrency": 0}, "deployment_field_not_positive", "target_concurrency"),
    ({}, {"gpu_memory_gib": math.nan}, "deployment_field_not_positive", "gpu_memory_gib"),
    ({}, {"gpu_memory_gib": math.inf}, "deployment_field_not_positive", "gpu_memory_gib"),
    ({}, {"kv_shards": 1.5}, "deployment_field_not_integer", "kv_shards"),
    ({}, {"runtime_overhead_gib": -0.1}, "runtime_overhead_negative", "runtime_overhead_gib"),
    ({}, {"runtime_overhead_gib": math.nan}, "runtime_overhead_not_finite", "runtime_overhead_gib"),
    ({}, {"usable_fraction": 1.01}, "usable_fraction_out_of_range", "usable_fraction"),
    ({}, {"usable_fraction": math.nan}, "usable_fraction_out_of_range", "usable_fraction"),
    ({}, {"pipeline_parallel_size": 0}, "deployment_field_not_positive", "pipeline_parallel_size"),
    ({}, {"pipeline_parallel_size": 2}, "pipeline_stages_exceed_layers", "pipeline_parallel_size"),
    ({}, {"kv_window_tokens": 0}, "deployment_field_not_positive", "kv_window_tokens"),
])
def test_invalid_input_is_refused_with_a_code_naming_the_field(
        model_change: dict[str, object], deployment_change: dict[str, object], code: str,
        field: str) -> None:
    with pytest.raises(PolicyInputError) as caught:
        assess_memory(replace(UNIT_MODEL, **model_change),  # type: ignore[arg-type]
                      unit_deployment(**deployment_change))
    assert (caught.value.code, caught.value.field) == (code, field)


def test_model_errors_are_reported_before_deployment_errors() -> None:
    with pytest.raises(PolicyInputError) as caught:
        assess_memory(replace(UNIT_MODEL, layers=0), unit_deployment(gpu_memory_gib=0))
    assert caught.value.field == "layers"


def test_weights_alone_over_budget_leave_no_kv_and_say_so() -> None:
    result = assess_memory(UNIT_MODEL, unit_deployment(gpu_memory_gib=1, runtime_overhead_gib=0.5))
    assert not result.fits and result.max_concurrency == 0 and result.kv_capacity_tokens == 0
    assert codes(result) == ["exceeds_usable_memory", "no_memory_left_for_kv_cache"]
    assert result.reasons[1].facts["fixed_gib_per_gpu"] == 1.5


# --- extensions: latent KV, KV sharding rule, pipeline stages, windows, KV precision ------------


def test_latent_kv_is_layers_times_latent_elements_and_ignores_kv_heads() -> None:
    # DeepSeek-V3: 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 B = 70,272 B.
    mla = ModelMemory(parameters=10, weight_bits=16, layers=61, kv_heads=128, head_dim=128,
                      kv_latent_dim=576)
    assert kv_bytes_per_token(mla) == 70_272
    assert kv_bytes_per_token(replace(mla, kv_heads=1)) == 70_272


@pytest.mark.parametrize(("kv_heads", "tp", "shards"), [
    (8, 1, 1), (8, 2, 2), (8, 8, 8), (8, 16, 8), (32, 4, 4), (1, 8, 1), (4, 8, 4),
])
def test_per_gpu_kv_heads_are_max_of_one_and_kv_heads_over_tp(kv_heads: int, tp: int,
                                                              shards: int) -> None:
    assert kv_shards_under_tensor_parallel(kv_heads, tp) == shards
    assert kv_heads // shards == max(1, kv_heads // tp)


def test_kv_sharding_errs_towards_replication_when_tp_and_kv_heads_do_not_divide() -> None:
    assert kv_shards_under_tensor_parallel(8, 3) == 1
    assert kv_shards_under_tensor_parallel(12, 8) == 4


def test_latent_kv_is_replicated_under_tensor_parallelism() -> None:
    assert kv_shards_under_tensor_parallel(128, 8, latent=True) == 1


def test_pipeline_stages_split_weights_and_size_kv_by_the_largest_stage() -> None:
    model = ModelMemory(parameters=61 * GIB, weight_bits=8, layers=61, kv_heads=1, head_dim=1,
                        kv_latent_dim=576)
    deployment = DeploymentMemory(gpu_memory_gib=80, tensor_parallel_size=1, kv_shards=1,
                                  max_live_tokens_per_request=1, target_concurrency=1,
                                  runtime_overhead_gib=0, pipeline_parallel_size=2)
    result = assess_memory(model, deployment)
    assert result.weight_gib_per_gpu == 31.0  # ceil(61 / 2) layers of 1 GiB on the larger stage
    assert result.kv_bytes_per_token_per_gpu == 31 * 576 * 2  # ceil(61 / 2) layers
    assert result.kv_bytes_per_token == 61 * 576 * 2


def test_a_shorter_window_reduces_kv_without_changing_weights_and_crosses_the_boundary() -> None:
    # 2 B/token x GIB//2 tokens = 1 GiB of KV: 1 + 1 + 0.25 = 2.25 > 2 GiB. A window of GIB//4
    # tokens keeps 0.5 GiB: 1.75 <= 2.
    full = assess_memory(UNIT_MODEL, unit_deployment(max_live_tokens_per_request=GIB // 2))
    windowed = assess_memory(UNIT_MODEL, unit_deployment(max_live_tokens_per_request=GIB // 2,
                                                         kv_window_tokens=GIB // 4))
    assert (full.kv_gib_per_gpu, full.required_gib_per_gpu, full.fits) == (1.0, 2.25, False)
    assert (windowed.kv_gib_per_gpu, windowed.required_gib_per_gpu) == (0.5, 1.75)
    assert windowed.fits and windowed.kv_tokens_per_request == GIB // 4
    assert windowed.weight_gib_per_gpu == full.weight_gib_per_gpu


def test_a_window_longer_than_the_context_changes_nothing() -> None:
    plain = assess_memory(UNIT_MODEL, unit_deployment())
    wide = assess_memory(UNIT_MODEL, unit_deployment(kv_window_tokens=GIB))
    assert wide.kv_gib_per_gpu == plain.kv_gib_per_gpu and wide.kv_tokens_per_request == GIB // 4


def test_effective_window_averages_windowed_and_global_layers() -> None:
    # Gemma-2-9B: 21 of 42 layers slide over 4,096 tokens; at 8,192 tokens the cache holds 6,144.
    assert effective_window_tokens(42, 21, 8192, 4096) == 6144
    assert effective_window_tokens(32, 32, 8192, 4096) == 4096
    assert effective_window_tokens(32, 0, 8192, 4096) == 8192
    assert effective_window_tokens(3, 1, 10, 5) == 9  # (2 x 10 + 5) / 3 = 8.33, rounded up
    with pytest.raises(PolicyInputError) as caught:
        effective_window_tokens(4, 5, 10, 5)
    assert caught.value.field == "windowed_layers"


def test_fp8_kv_halves_kv_bytes_and_leaves_weights_alone() -> None:
    bf16 = assess_memory(CAPSTONE_MODEL, CAPSTONE_DEPLOYMENT)
    fp8 = assess_memory(replace(CAPSTONE_MODEL, kv_element_bytes=1), CAPSTONE_DEPLOYMENT)
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token == 245_760
    assert fp8.kv_gib_per_gpu * 2 == bf16.kv_gib_per_gpu
    assert fp8.weight_gib_per_gpu == bf16.weight_gib_per_gpu


# --- properties (§1.1 invariants, §7) ------------------------------------------------------------

models = st.builds(
    ModelMemory,
    parameters=st.integers(1, 10**12), weight_bits=st.sampled_from([4, 8, 16, 32]),
    layers=st.integers(1, 128), kv_heads=st.integers(1, 128), head_dim=st.sampled_from([64, 128]),
    kv_element_bytes=st.sampled_from([1, 2, 4]),
    kv_latent_dim=st.sampled_from([0, 0, 576]))
deployments = st.builds(
    DeploymentMemory,
    gpu_memory_gib=st.floats(1, 200), tensor_parallel_size=st.sampled_from([1, 2, 4, 8]),
    kv_shards=st.sampled_from([1, 2, 4, 8]), max_live_tokens_per_request=st.integers(1, 131_072),
    target_concurrency=st.integers(1, 256), runtime_overhead_gib=st.floats(0, 8),
    usable_fraction=st.floats(0.05, 1.0), pipeline_parallel_size=st.just(1),
    kv_window_tokens=st.none() | st.integers(1, 131_072))


@settings(max_examples=200, deadline=None)
@given(models, deployments, st.integers(1, 256), st.integers(1, 131_072))
def test_weights_and_max_concurrency_do_not_depend_on_load(
        model: ModelMemory, deployment: DeploymentMemory, other_concurrency: int,
        other_tokens: int) -> None:
    base = assess_memory(model, deployment)
    more = assess_memory(model, replace(deployment, target_concurrency=other_concurrency))
    longer = assess_memory(model, replace(deployment, max_live_tokens_per_request=other_tokens))
    assert base.weight_gib_per_gpu == more.weight_gib_per_gpu == longer.weight_gib_per_gpu
    assert base.max_concurrency == more.max_concurrency
    assert base.kv_capacity_tokens == longer.kv_capacity_tokens


@settings(max_examples=200, deadline=None)
@given(models, deployments)
def test_fits_exactly_when_target_concurrency_is_within_max_concurrency(
        model: ModelMemory, deployment: DeploymentMemory) -> None:
    result = assess_memory(model, deployment)
    on_the_edge = math.isclose(result.required_gib_per_gpu, result.usable_gib_per_gpu,
                               rel_tol=1e-9, abs_tol=1e-9)
    if not on_the_edge:
        assert result.fits == (deployment.target_concurrency <= result.max_concurrency)
    if result.weight_gib_per_gpu + result.overhead_gib_per_gpu > result.usable_gib_per_gpu:
        assert result.max_concurrency == 0 and not result.fits
    tokens = result.kv_tokens_per_request
    assert abs(result.kv_capacity_tokens // tokens - result.max_concurrency) <= 1
    json.dumps(to_plain(result), allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(models, deployments, st.sampled_from([1, 2, 4, 8]))
def test_kv_sharding_never_changes_weights_and_only_shrinks_kv(
        model: ModelMemory, deployment: DeploymentMemory, more_shards: int) -> None:
    base = assess_memory(model, replace(deployment, kv_shards=1))
    sharded = assess_memory(model, replace(deployment, kv_shards=more_shards))
    assert sharded.weight_gib_per_gpu == base.weight_gib_per_gpu
    assert sharded.kv_gib_per_gpu == pytest.approx(base.kv_gib_per_gpu / more_shards)


@settings(max_examples=100, deadline=None)
@given(models, deployments, st.integers(1, 131_072))
def test_a_narrower_window_never_needs_more_memory(
        model: ModelMemory, deployment: DeploymentMemory, window: int) -> None:
    unwindowed = assess_memory(model, replace(deployment, kv_window_tokens=None))
    windowed = assess_memory(model, replace(deployment, kv_window_tokens=window))
    assert windowed.kv_gib_per_gpu <= unwindowed.kv_gib_per_gpu
    assert windowed.weight_gib_per_gpu == unwindowed.weight_gib_per_gpu
    assert windowed.max_concurrency >= unwindowed.max_concurrency


@pytest.mark.parametrize(("model_change", "deployment_change", "code", "field"), [
    ({"parameters": 10**400}, {}, "model_field_out_of_range", "parameters"),
    ({"head_dim": 10**16}, {}, "model_field_out_of_range", "head_dim"),
    ({}, {"max_live_tokens_per_request": 10**308}, "deployment_field_out_of_range",
     "max_live_tokens_per_request"),
    ({}, {"target_concurrency": 10**400}, "deployment_field_out_of_range", "target_concurrency"),
    ({}, {"gpu_memory_gib": 1e308}, "deployment_field_out_of_range", "gpu_memory_gib"),
])
def test_numbers_past_any_deployment_are_refused_not_overflowed(
        model_change: dict[str, object], deployment_change: dict[str, object], code: str,
        field: str) -> None:
    """A count past a float's range had raised OverflowError; finite inputs whose products
    overflow had given infinite figures that no decision can record."""
    with pytest.raises(PolicyInputError) as caught:
        assess_memory(replace(UNIT_MODEL, **model_change),  # type: ignore[arg-type]
                      unit_deployment(**deployment_change))
    assert (caught.value.code, caught.value.field) == (code, field)


def test_pipeline_stages_cache_what_their_own_layers_keep_not_the_models_average() -> None:
    """Gemma-2-9B's 42 layers alternate sliding (even) and full (odd). Over two stages of 21,
    the last holds 11 full-context layers and 10 windowed: 131,072 tokens over 21 layers, 6,242
    each rounded up, where the model's average (6,144) undercounted that stage."""
    alternating = tuple(index % 2 == 0 for index in range(42))
    assert largest_stage_window_tokens(alternating, 1, 8192, 4096) == \
        effective_window_tokens(42, 21, 8192, 4096) == 6144
    assert largest_stage_window_tokens(alternating, 2, 8192, 4096) == 6242
    trailing = tuple(index >= 28 for index in range(32))  # Qwen2: the last 4 slide
    assert largest_stage_window_tokens(trailing, 4, 8192, 1024) == 8192  # stage 1 slides none
    assert largest_stage_window_tokens((True,) * 32, 4, 8192, 1024) == 1024


@pytest.mark.parametrize(("model_change", "deployment_change", "message"), [
    ({"parameters": 10**400}, {}, "model parameters must be at most 1e+15"),
    ({}, {"target_concurrency": 10**400}, "deployment target_concurrency must be at most 1e+15"),
    ({}, {"gpu_memory_gib": 1e308}, "deployment gpu_memory_gib must be at most 1e+09 GiB"),
    ({"parameters": 7.5e9}, {}, "model parameters must be an integer"),
    ({"layers": 0}, {}, "model layers must be positive"),
    ({}, {"target_concurrency": 0}, "deployment target_concurrency must be positive"),
    ({}, {"gpu_memory_gib": math.inf}, "deployment gpu_memory_gib must be a finite number"),
    ({}, {"kv_shards": 1.5}, "deployment kv_shards must be an integer"),
    ({}, {"pipeline_parallel_size": 2}, "2 pipeline stages cannot split 1 layers"),
])
def test_a_refused_input_keeps_the_message_its_rejection_records(
        model_change: dict[str, object], deployment_change: dict[str, object],
        message: str) -> None:
    """A placement's rejection records the message in the log: formatting it only when its
    check fails must not change a character of it."""
    with pytest.raises(PolicyInputError) as caught:
        assess_memory(replace(UNIT_MODEL, **model_change),  # type: ignore[arg-type]
                      unit_deployment(**deployment_change))
    assert caught.value.message == message
