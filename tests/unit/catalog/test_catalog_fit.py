"""`plan_fit`: the course worked example, catalog models on catalog GPUs, gates and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.catalog.dtypes import DType
from controlplane.catalog.fit import DEFAULT_RUNTIME_OVERHEAD_GIB, FitReport, FitRequest, plan_fit
from controlplane.catalog.registry import load_catalog
from controlplane.catalog.subject import ArchitectureOverrides
from controlplane.policies.memory import GIB
from controlplane.policies.reasons import PolicyInputError, to_plain

CATALOG = load_catalog()
COURSE_ARCHITECTURE = ArchitectureOverrides(parameters=8_000_000_000, layers=32, kv_heads=8,
                                            head_dim=128)


def course(**changes: Any) -> FitReport:
    """The course's worked example: FP16 KV, a 4 GiB reserve inside a 24 GiB budget."""
    settings_: dict[str, Any] = {
        "overrides": COURSE_ARCHITECTURE, "gpu_memory_gib": 24, "weight_dtype": DType.FP16,
        "kv_dtype": DType.FP16, "max_model_len_tokens": 4096, "target_concurrency": 8,
        "usable_fraction": 1.0, "runtime_overhead_gib": 4}
    return plan_fit(FitRequest(**{**settings_, **changes}), CATALOG)


def codes(reasons: tuple[Any, ...]) -> list[str]:
    return [reason.code for reason in reasons]


# --- the course worked example ----------------------------------------------------------------


def test_course_baseline_fits_22_90_gib_in_24() -> None:
    report = course()
    assert report.weight_gib_per_gpu == pytest.approx(16e9 / GIB)
    assert round(report.weight_gib_per_gpu, 2) == 14.90
    assert report.kv_bytes_per_token == 131_072  # 128 KiB
    assert report.kv_gib_per_gpu == 4.0
    assert round(report.required_gib_per_gpu, 2) == 22.90
    assert report.fits and codes(report.reasons) == ["fits_with_headroom"]


def test_course_longer_contexts_need_26_90_gib_and_do_not_fit() -> None:
    report = course(max_model_len_tokens=8192)
    assert report.kv_gib_per_gpu == 8.0 and round(report.required_gib_per_gpu, 2) == 26.90
    assert not report.fits and codes(report.reasons) == ["exceeds_usable_memory"]


def test_course_four_bit_weights_need_11_73_gib_with_kv_still_fp16() -> None:
    report = course(weight_dtype=DType.INT4)
    assert round(report.weight_gib_per_gpu, 2) == 3.73 and report.kv_gib_per_gpu == 4.0
    assert round(report.required_gib_per_gpu, 2) == 11.73 and report.fits
    assert course(weight_dtype=None, weight_bits=4).required_gib_per_gpu == (
        report.required_gib_per_gpu)


def test_course_smaller_memory_does_not_fit() -> None:
    report = course(gpu_memory_gib=16)
    assert not report.fits
    assert codes(report.reasons) == ["exceeds_usable_memory", "no_memory_left_for_kv_cache"]


def test_course_one_sequence_needs_19_40_gib() -> None:
    report = course(target_concurrency=1)
    assert report.kv_gib_per_gpu == 0.5 and round(report.required_gib_per_gpu, 2) == 19.40


def test_kv_capacity_counts_tokens_in_the_replicas_kv_budget() -> None:
    report = course()
    free_bytes = (24 - 16e9 / GIB - 4) * GIB
    assert report.kv_capacity_tokens == int(free_bytes // 131_072) == 41_769
    assert report.max_concurrency == 10  # 41,769 // 4,096


# --- catalog models on catalog GPUs -----------------------------------------------------------


def test_catalog_model_defaults_to_its_context_dtype_and_overhead() -> None:
    report = plan_fit(FitRequest(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100"), CATALOG)
    assert report.model_id == "meta-llama/Llama-3.1-8B" and report.parameter_basis == "catalog"
    assert (report.weight_dtype, report.kv_dtype, report.max_model_len_tokens) == (
        DType.BF16, DType.BF16, 131_072)
    assert report.weight_gib_per_gpu == pytest.approx(16_060_522_496 / GIB)
    assert (report.overhead_gib_per_gpu, report.runtime_overhead_basis) == (
        1.9, "catalog_observed_activation")
    assert report.usable_gib_per_gpu == pytest.approx(79.19 * 0.9)
    assert report.fits  # one 128K sequence: 16 GiB of KV beside 15 GiB of weights


def test_tensor_parallel_splits_gqa_kv_until_each_gpu_holds_one_head() -> None:
    per_gpu = {tp: plan_fit(FitRequest(model="meta-llama/Llama-3.1-8B", gpu="H100",
                                       tensor_parallel_size=tp), CATALOG)
               for tp in (1, 2, 8, 16)}
    assert [per_gpu[tp].kv_bytes_per_token_per_gpu for tp in (1, 2, 8, 16)] == [
        131_072, 65_536, 16_384, 16_384]
    assert "kv_cache_replicated" in codes(per_gpu[16].notes)
    assert per_gpu[16].notes[0].facts["copies_per_kv_shard"] == 2
    assert "kv_cache_replicated" not in codes(per_gpu[8].notes)


def test_latent_kv_is_replicated_on_every_tensor_parallel_gpu() -> None:
    report = plan_fit(FitRequest(model="deepseek-ai/DeepSeek-V3", gpu="H200",
                                 tensor_parallel_size=8, max_model_len_tokens=8192), CATALOG)
    assert report.kv_shards == 1 and report.kv_bytes_per_token_per_gpu == 70_272
    assert report.notes[0].code == "kv_cache_replicated"
    assert report.notes[0].facts["latent_attention"] is True


def test_deepseek_v3_defaults_to_its_fp8_checkpoint_and_bf16_doubles_it() -> None:
    common: dict[str, Any] = {"model": "deepseek-ai/DeepSeek-V3", "gpu": "H200",
                              "tensor_parallel_size": 8, "max_model_len_tokens": 4096}
    fp8 = plan_fit(FitRequest(**common), CATALOG)
    bf16 = plan_fit(FitRequest(**common, weight_dtype=DType.BF16), CATALOG)
    assert fp8.weight_dtype is DType.FP8 and fp8.kv_dtype is DType.BF16
    assert fp8.weight_gib_per_gpu * 8 * GIB == pytest.approx(671_026_404_352)
    assert bf16.weight_gib_per_gpu == pytest.approx(2 * fp8.weight_gib_per_gpu)
    assert "checkpoint_quantized" in codes(fp8.notes)
    assert fp8.fits and not bf16.fits  # 78 GiB of FP8 weights per H200 fit; 156 GiB do not


def test_fp8_kv_halves_the_kv_and_leaves_the_weights() -> None:
    common: dict[str, Any] = {"model": "meta-llama/Llama-3.1-70B", "gpu": "H100",
                              "tensor_parallel_size": 4, "max_model_len_tokens": 32_768,
                              "target_concurrency": 16}
    bf16 = plan_fit(FitRequest(**common), CATALOG)
    fp8 = plan_fit(FitRequest(**common, kv_dtype=DType.FP8), CATALOG)
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token == 327_680
    assert fp8.kv_gib_per_gpu * 2 == bf16.kv_gib_per_gpu == 40.0
    assert fp8.weight_gib_per_gpu == bf16.weight_gib_per_gpu
    assert not bf16.fits and fp8.fits  # 74.85 GiB > 71.27 usable; 54.85 GiB fits


def test_fp8_on_ampere_is_refused_and_the_same_request_fits_on_hopper() -> None:
    common: dict[str, Any] = {"model": "meta-llama/Llama-3.1-8B", "weight_dtype": DType.FP8,
                              "kv_dtype": DType.FP8, "max_model_len_tokens": 8192}
    ampere = plan_fit(FitRequest(**common, gpu="A100-SXM-80GB"), CATALOG)
    hopper = plan_fit(FitRequest(**common, gpu="H100-SXM-80GB"), CATALOG)
    assert not ampere.fits
    assert codes(ampere.reasons) == ["weight_dtype_unsupported_by_gpu",
                                     "kv_dtype_unsupported_by_gpu"]
    assert ampere.reasons[0].facts["weight_dtype"] == "fp8"
    assert hopper.fits


def test_every_failing_gate_is_reported_in_a_fixed_order() -> None:
    report = plan_fit(FitRequest(model="microsoft/Phi-3-mini-4k-instruct", gpu="A10G",
                                 weight_dtype=DType.FP8, kv_dtype=DType.FP8,
                                 tensor_parallel_size=3, max_model_len_tokens=1_000_000,
                                 target_concurrency=64), CATALOG)
    assert codes(report.reasons) == [
        "weight_dtype_unsupported_by_gpu", "kv_dtype_unsupported_by_gpu",
        "attention_heads_not_divisible_by_tp", "kv_heads_incompatible_with_tp",
        "context_exceeds_model_maximum", "exceeds_usable_memory"]


def test_kv_heads_fewer_than_tp_are_accepted_when_tp_is_a_multiple() -> None:
    report = plan_fit(FitRequest(model="Qwen/Qwen2.5-7B", gpu="L4", tensor_parallel_size=28,
                                 max_model_len_tokens=4096), CATALOG)
    assert "kv_heads_incompatible_with_tp" not in codes(report.reasons)  # 28 % 4 == 0


def test_405b_with_the_mp16_checkpoints_16_kv_heads_doubles_kv_and_recounts_parameters() -> None:
    common: dict[str, Any] = {"model": "meta-llama/Llama-3.1-405B", "gpu": "H200",
                              "tensor_parallel_size": 8, "max_model_len_tokens": 8192}
    eight = plan_fit(FitRequest(**common), CATALOG)
    sixteen = plan_fit(FitRequest(**common, overrides=ArchitectureOverrides(kv_heads=16)), CATALOG)
    assert (eight.kv_bytes_per_token, sixteen.kv_bytes_per_token) == (516_096, 1_032_192)
    assert sixteen.parameter_basis == "formula"
    assert sixteen.parameters - eight.parameters == 126 * 2 * 16_384 * 8 * 128


# --- declared windows --------------------------------------------------------------------------


def test_gemma_2_window_caps_only_its_sliding_layers() -> None:
    report = plan_fit(FitRequest(model="google/gemma-2-9b", gpu="L4", kv_window_tokens=4096),
                      CATALOG)
    assert report.kv_tokens_per_sequence == 6144  # (21 x 8,192 + 21 x 4,096) / 42
    unwindowed = plan_fit(FitRequest(model="google/gemma-2-9b", gpu="L4"), CATALOG)
    assert report.kv_gib_per_gpu == pytest.approx(unwindowed.kv_gib_per_gpu * 0.75)
    assert report.weight_gib_per_gpu == unwindowed.weight_gib_per_gpu


def test_a_declared_window_caps_every_layer_of_a_declared_architecture() -> None:
    report = course(max_model_len_tokens=8192, kv_window_tokens=4096)
    assert report.kv_tokens_per_sequence == 4096 and report.fits


@pytest.mark.parametrize(("model", "window", "code"), [
    ("mistralai/Mistral-7B-v0.3", 4096, "model_has_no_sliding_window"),
    ("google/gemma-2-9b", 1024, "kv_window_below_model_window"),
])
def test_windows_that_would_undercount_the_cache_are_refused(model: str, window: int,
                                                             code: str) -> None:
    with pytest.raises(PolicyInputError) as caught:
        plan_fit(FitRequest(model=model, gpu="L4", kv_window_tokens=window), CATALOG)
    assert (caught.value.code, caught.value.field) == (code, "kv_window_tokens")


# --- other sources and bad input -----------------------------------------------------------------


def test_a_config_file_or_mapping_is_sized_with_the_formula(tmp_path: Path) -> None:
    config = dict(CATALOG.model("meta-llama/Llama-3.1-8B").config)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    from_file = plan_fit(FitRequest(model=str(path), gpu="H100"), CATALOG)
    from_mapping = plan_fit(FitRequest(config=config, gpu="H100"), CATALOG)
    assert from_file.model_source == "config_file" and from_mapping.model_source == "config"
    assert from_file.parameters == from_mapping.parameters == 8_030_261_248
    assert from_file.parameter_basis == "formula"
    assert (from_file.runtime_overhead_basis, from_file.overhead_gib_per_gpu) == (
        "default_assumption", DEFAULT_RUNTIME_OVERHEAD_GIB)
    assert "runtime_overhead_assumed" in codes(from_file.notes)


def test_an_unverified_family_is_flagged_as_estimated() -> None:
    config = {**CATALOG.model("meta-llama/Llama-3.1-8B").config, "model_type": "newarch"}
    report = plan_fit(FitRequest(config=config, gpu="H100"), CATALOG)
    assert report.parameter_basis == "formula_unverified_family"
    assert "parameter_count_estimated" in codes(report.notes)


@pytest.mark.parametrize(("request_fields", "code", "field"), [
    ({"overrides": ArchitectureOverrides(parameters=1, layers=2, kv_heads=1)},
     "architecture_incomplete", "head_dim"),
    ({"overrides": COURSE_ARCHITECTURE}, "max_model_len_required", "max_model_len_tokens"),
    ({"model": "meta-llama/Llama-3.1-8B", "gpu_memory_gib": None}, "gpu_required", "gpu"),
    ({"model": "meta-llama/Llama-3.1-8B", "gpu": "H100"}, "gpu_source_conflict",
     "gpu_memory_gib"),
    ({"model": "meta-llama/Llama-3.1-8B", "weight_dtype": DType.FP8, "weight_bits": 8},
     "weight_format_conflict", "weight_bits"),
    ({"model": "meta-llama/Llama-3.1-8B", "weight_bits": 0}, "weight_bits_out_of_range",
     "weight_bits"),
    ({"model": "meta-llama/Llama-3.1-8B", "kv_dtype": DType.INT8}, "kv_dtype_unsupported",
     "kv_dtype"),
    ({"model": "deepseek-ai/DeepSeek-V3", "overrides": ArchitectureOverrides(kv_heads=8)},
     "override_not_applicable", "kv_heads"),
    ({"model": "meta-llama/Llama-3.1-8B", "overrides": ArchitectureOverrides(layers=-1)},
     "declared_field_not_positive", "layers"),
    ({"model": "meta-llama/Llama-3.1-8B", "tensor_parallel_size": 0},
     "deployment_field_not_positive", "tensor_parallel_size"),
    ({"model": "meta-llama/Llama-3.1-8B", "max_model_len_tokens": 0},
     "deployment_field_not_positive", "max_model_len_tokens"),
    ({"model": "meta-llama/Llama-3.1-8B", "gpu_memory_gib": float("nan")},
     "deployment_field_not_positive", "gpu_memory_gib"),
    ({"model": "meta-llama/Llama-3.1-8B", "pipeline_parallel_size": 33},
     "pipeline_stages_exceed_layers", "pipeline_parallel_size"),
    ({"model": "Llama-3.1-9B"}, "unknown_model", "model"),
    ({"config": {"num_hidden_layers": 2}}, "config_field_missing", "hidden_size"),
    ({"config": {**CATALOG.model("meta-llama/Llama-3.1-8B").config,
                 "quantization_config": {"quant_method": "hqq"}}},
     "weight_dtype_unknown", "weight_dtype"),
])
def test_bad_input_raises_a_typed_error_naming_the_field(request_fields: dict[str, Any],
                                                         code: str, field: str) -> None:
    fields = {"gpu_memory_gib": 80.0, **request_fields}
    with pytest.raises(PolicyInputError) as caught:
        plan_fit(FitRequest(**fields), CATALOG)
    assert (caught.value.code, caught.value.field) == (code, field)


# --- properties ----------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(sorted(CATALOG.models)), gpu=st.sampled_from(sorted(CATALOG.gpus)),
       tp=st.sampled_from([1, 2, 4, 8]), concurrency=st.integers(1, 64),
       length=st.integers(1, 32_768), kv=st.sampled_from([None, DType.FP8, DType.FP16]))
def test_every_catalog_fit_is_json_safe_and_consistent(model: str, gpu: str, tp: int,
                                                       concurrency: int, length: int,
                                                       kv: DType | None) -> None:
    report = plan_fit(FitRequest(model=model, gpu=gpu, tensor_parallel_size=tp,
                                 target_concurrency=concurrency, max_model_len_tokens=length,
                                 kv_dtype=kv), CATALOG)
    json.dumps(to_plain(report), allow_nan=False)
    assert report.fits == (report.required_gib_per_gpu <= report.usable_gib_per_gpu
                           and codes(report.reasons) == ["fits_with_headroom"])
    assert report.kv_bytes_per_token_per_gpu * report.kv_shards == report.kv_bytes_per_token
    assert report.reasons  # a decision always says why
