"""The catalog data: formulas reproduce the sourced figures, ids resolve, GPUs state their facts."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from controlplane.catalog.architecture import AttentionKind
from controlplane.catalog.dtypes import DType
from controlplane.catalog.errors import CatalogError, UnknownCatalogIdError
from controlplane.catalog.gpus import LinkClass, MemoryBasis
from controlplane.catalog.registry import FIXTURES_ENV, fixtures_dir, load_catalog
from controlplane.catalog.sizing import architecture_kv_bytes_per_token, count_parameters
from controlplane.policies.memory import GIB

CATALOG = load_catalog()

# KV bytes per BF16 token from research-data README §1 (2 x L x KV x hd x 2; MLA: L x 576 x 2).
EXPECTED_KV_BYTES = {
    "meta-llama/Llama-3.1-8B": 131_072,
    "meta-llama/Llama-3.1-70B": 327_680,
    "meta-llama/Llama-3.1-405B": 516_096,
    "meta-llama/Llama-3.3-70B-Instruct": 327_680,
    "mistralai/Mistral-7B-v0.3": 131_072,
    "mistralai/Mixtral-8x7B-v0.1": 131_072,
    "Qwen/Qwen2.5-7B": 57_344,
    "Qwen/Qwen2.5-7B-Instruct": 57_344,
    "Qwen/Qwen2.5-72B": 327_680,
    "Qwen/Qwen2.5-72B-Instruct": 327_680,
    "google/gemma-2-9b": 344_064,
    "google/gemma-2-27b": 376_832,
    "microsoft/Phi-3-mini-4k-instruct": 393_216,
    "deepseek-ai/DeepSeek-V2-Lite": 31_104,
    "deepseek-ai/DeepSeek-V3": 70_272,
}


def test_catalog_holds_exactly_the_expected_models() -> None:
    assert set(CATALOG.models) == set(EXPECTED_KV_BYTES)


@pytest.mark.parametrize("model_id", sorted(EXPECTED_KV_BYTES))
def test_kv_bytes_per_token_follow_the_formula_for_every_catalog_model(model_id: str) -> None:
    entry = CATALOG.models[model_id]
    arch = entry.architecture
    if arch.latent is not None:
        by_hand = arch.layers * (arch.latent.kv_lora_rank + arch.latent.qk_rope_head_dim) * 2
    else:
        by_hand = 2 * arch.layers * arch.kv_heads * arch.head_dim * 2
    assert architecture_kv_bytes_per_token(arch, 2) == by_hand == EXPECTED_KV_BYTES[model_id]
    assert entry.kv_bytes_per_token_bf16 == by_hand


@pytest.mark.parametrize("model_id", sorted(EXPECTED_KV_BYTES))
def test_parameter_formula_reproduces_the_catalog_counts(model_id: str) -> None:
    entry = CATALOG.models[model_id]
    assert count_parameters(entry.architecture) == entry.parameters
    assert entry.bf16_weight_bytes == 2 * entry.parameters.total


def test_moe_models_hold_all_experts_but_activate_few() -> None:
    mixtral = CATALOG.models["mistralai/Mixtral-8x7B-v0.1"].parameters
    assert (mixtral.total, mixtral.active) == (46_702_792_704, 12_879_925_248)
    v3 = CATALOG.models["deepseek-ai/DeepSeek-V3"].parameters
    assert (v3.total, v3.active) == (671_026_404_352, 37_552_282_624)


def test_every_entry_carries_an_attribution() -> None:
    assert all(entry.attribution.strip() for entry in CATALOG.models.values())
    assert all(gpu.attribution.strip() for gpu in CATALOG.gpus.values())


# --- id resolution ----------------------------------------------------------------------------


@pytest.mark.parametrize(("requested", "resolved"), [
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B"),
    ("llama-3.1-70b-instruct", "meta-llama/Llama-3.1-70B"),
    ("google/gemma-2-27b-it", "google/gemma-2-27b"),
    ("deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-ai/DeepSeek-V2-Lite"),
    ("meta-llama/Llama-3.3-70B", "meta-llama/Llama-3.3-70B-Instruct"),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),
    ("Qwen2.5-72B-Chat", "Qwen/Qwen2.5-72B"),
    ("Phi-3-mini-4k", "microsoft/Phi-3-mini-4k-instruct"),
])
def test_fine_tuned_names_resolve_to_their_architecture(requested: str, resolved: str) -> None:
    assert CATALOG.model(requested).model_id == resolved


def test_llama_3_3_70b_reuses_the_llama_3_1_70b_architecture() -> None:
    assert (CATALOG.model("meta-llama/Llama-3.3-70B-Instruct").architecture
            == CATALOG.model("meta-llama/Llama-3.1-70B").architecture)


def test_unknown_model_lists_close_matches() -> None:
    with pytest.raises(UnknownCatalogIdError) as caught:
        CATALOG.model("meta-llama/Llama-3.1-9B")
    assert (caught.value.code, caught.value.field) == ("unknown_model", "model")
    assert "meta-llama/Llama-3.1-8B" in caught.value.suggestions


def test_unknown_gpu_lists_close_matches_and_aliases_resolve() -> None:
    assert CATALOG.gpu("h100").gpu_id == "H100-SXM-80GB"
    assert CATALOG.gpu("A100 40GB").gpu_id == "A100-SXM-40GB"
    with pytest.raises(UnknownCatalogIdError) as caught:
        CATALOG.gpu("H101")
    assert caught.value.code == "unknown_gpu" and "H100-SXM-80GB" in caught.value.suggestions


def test_fixtures_dir_follows_the_environment(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(fixtures_dir() / "catalog", tmp_path / "catalog")
    gpus_path = tmp_path / "catalog" / "gpus.json"
    document = json.loads(gpus_path.read_text(encoding="utf-8"))
    document["gpus"] = {"TEST-GPU": document["gpus"]["L4-24GB"]}
    gpus_path.write_text(json.dumps(document), encoding="utf-8")
    monkeypatch.setenv(FIXTURES_ENV, str(tmp_path))
    assert fixtures_dir() == tmp_path
    assert list(load_catalog().gpus) == ["TEST-GPU"]


def test_a_missing_catalog_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError) as caught:
        load_catalog(tmp_path)
    assert caught.value.code == "catalog_unreadable"


def test_a_malformed_gpu_entry_names_the_entry(tmp_path: Path) -> None:
    shutil.copytree(fixtures_dir() / "catalog", tmp_path / "catalog")
    gpus_path = tmp_path / "catalog" / "gpus.json"
    document = json.loads(gpus_path.read_text(encoding="utf-8"))
    document["gpus"]["L4-24GB"]["memory_gib"] = float("nan")
    gpus_path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(CatalogError) as caught:
        load_catalog(tmp_path)
    assert (caught.value.code, caught.value.field) == ("catalog_entry_invalid",
                                                       "L4-24GB.memory_gib")


# --- GPUs --------------------------------------------------------------------------------------


def test_fp8_is_supported_on_hopper_ada_and_mi300_but_not_ampere() -> None:
    with_fp8 = {gpu_id for gpu_id, gpu in CATALOG.gpus.items() if gpu.supports(DType.FP8)}
    assert with_fp8 == {"H100-SXM-80GB", "H100-PCIe-80GB", "H200-SXM-141GB", "L4-24GB",
                        "L40S-48GB", "MI300X-192GB"}
    assert all(gpu.architecture == "ampere" for gpu_id, gpu in CATALOG.gpus.items()
               if gpu_id not in with_fp8)


def test_link_classes() -> None:
    links = {gpu_id: gpu.link_class for gpu_id, gpu in CATALOG.gpus.items()}
    assert links["H100-SXM-80GB"] is links["A100-SXM-40GB"] is LinkClass.NVLINK
    assert links["MI300X-192GB"] is LinkClass.XGMI
    assert links["L4-24GB"] is links["L40S-48GB"] is links["A10G-24GB"] is LinkClass.PCIE


# --- research-data README §6 pitfalls that concern memory ---------------------------------------


def test_pitfall_1_llama_405b_has_8_kv_heads_and_16_would_double_its_kv() -> None:
    arch = CATALOG.model("meta-llama/Llama-3.1-405B").architecture
    assert arch.kv_heads == 8
    assert architecture_kv_bytes_per_token(replace(arch, kv_heads=16), 2) == 1_032_192


def test_pitfall_2_hidden_over_heads_would_misjudge_gemma_2_kv_by_an_eighth() -> None:
    for model_id, direction in (("google/gemma-2-9b", -1), ("google/gemma-2-27b", +1)):
        arch = CATALOG.model(model_id).architecture
        naive = 2 * arch.layers * arch.kv_heads * (arch.hidden_size // arch.attention_heads) * 2
        right = architecture_kv_bytes_per_token(arch, 2)
        assert (naive - right) / right == pytest.approx(direction * 0.125)


def test_pitfall_3_phi_3_mini_caches_more_per_token_than_llama_70b() -> None:
    phi = CATALOG.model("microsoft/Phi-3-mini-4k-instruct").architecture
    assert phi.kv_heads == phi.attention_heads == 32
    assert architecture_kv_bytes_per_token(phi, 2) > architecture_kv_bytes_per_token(
        CATALOG.model("meta-llama/Llama-3.1-70B").architecture, 2)


def test_pitfall_4_mla_kv_heads_are_nominal() -> None:
    arch = CATALOG.model("deepseek-ai/DeepSeek-V3").architecture
    assert arch.attention is AttentionKind.LATENT and arch.kv_heads == 128
    per_head_reading = 2 * arch.layers * arch.kv_heads * arch.head_dim * 2
    assert architecture_kv_bytes_per_token(arch, 2) == 70_272 < per_head_reading


def test_pitfall_5_deepseek_v3_weights_are_fp8_though_the_config_says_bf16() -> None:
    entry = CATALOG.model("deepseek-ai/DeepSeek-V3")
    assert entry.config["torch_dtype"] == "bfloat16"
    assert entry.architecture.checkpoint_weight_dtype is DType.FP8
    assert entry.bf16_weight_bytes == 1_342_052_808_704  # the BF16 conversion: ~1.34 TB


def test_pitfall_8_h100_80gb_is_79_19_gib_as_the_runtime_reports_it() -> None:
    h100 = CATALOG.gpu("H100-SXM-80GB")
    assert (h100.memory_gib, h100.memory_gib_basis) == (79.19, MemoryBasis.RUNTIME_REPORTED)
    assert h100.memory_gib != h100.nominal_memory_gb
    for gpu in CATALOG.gpus.values():
        if gpu.memory_gib_basis is MemoryBasis.NOMINAL_GB_CONVERTED:
            assert gpu.memory_gib == pytest.approx(gpu.nominal_memory_gb * 1e9 / GIB)


def test_pitfall_9_qwen_instruct_context_differs_from_base_and_mistral_has_no_window() -> None:
    assert CATALOG.model("Qwen/Qwen2.5-7B").architecture.max_position_embeddings == 131_072
    assert CATALOG.model("Qwen/Qwen2.5-7B-Instruct").architecture.max_position_embeddings == 32_768
    for model_id in ("mistralai/Mistral-7B-v0.3", "mistralai/Mixtral-8x7B-v0.1"):
        assert CATALOG.model(model_id).architecture.sliding_window_tokens is None


def test_pitfall_11_gemma_2_reserves_more_activation_than_llama_8b() -> None:
    gemma = CATALOG.model("google/gemma-2-9b").activation_reserve_gib
    llama = CATALOG.model("meta-llama/Llama-3.1-8B").activation_reserve_gib
    assert (gemma, llama) == (3.65, 1.9)


def test_pitfalls_6_and_7_tflops_are_dense_and_a10g_is_unknown() -> None:
    assert CATALOG.gpu("H100-SXM-80GB").bf16_dense_tflops == 989
    assert CATALOG.gpu("L4-24GB").bf16_dense_tflops == 121
    assert CATALOG.gpu("A10G-24GB").bf16_dense_tflops is None
