"""Reading HF config.json into an Architecture, and the sizes derived from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controlplane.catalog.architecture import AttentionKind
from controlplane.catalog.dtypes import DType, kv_element_bytes, parse_dtype
from controlplane.catalog.errors import CatalogError
from controlplane.catalog.hf_config import parse_hf_config
from controlplane.catalog.registry import fixtures_dir, load_catalog
from controlplane.catalog.sizing import (
    architecture_kv_bytes_per_token,
    count_parameters,
    weight_bytes,
)

LLAMA_8B: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "tie_word_embeddings": False, "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


def catalog_config(model_id: str) -> dict[str, Any]:
    return dict(load_catalog().model(model_id).config)


def test_llama_head_dim_is_hidden_over_heads_when_the_config_has_none() -> None:
    arch = parse_hf_config(LLAMA_8B)
    assert (arch.head_dim, arch.kv_heads, arch.attention) == (128, 8, AttentionKind.PER_HEAD)
    assert architecture_kv_bytes_per_token(arch, 2) == 131_072  # 2 x 32 x 8 x 128 x 2


def test_explicit_head_dim_wins_over_hidden_over_heads_for_gemma_2() -> None:
    nine, twenty_seven = (parse_hf_config(catalog_config(m))
                          for m in ("google/gemma-2-9b", "google/gemma-2-27b"))
    assert (nine.head_dim, nine.hidden_size // nine.attention_heads) == (256, 224)
    assert (twenty_seven.head_dim, twenty_seven.hidden_size // twenty_seven.attention_heads) == (
        128, 144)
    assert architecture_kv_bytes_per_token(nine, 2) == 344_064


def test_missing_kv_heads_means_no_gqa() -> None:
    config = {key: value for key, value in LLAMA_8B.items() if key != "num_key_value_heads"}
    assert parse_hf_config(config).kv_heads == 32


def test_deepseek_native_inference_configs_parse_to_the_catalog_architecture() -> None:
    configs = fixtures_dir() / "catalog" / "configs"
    for file_name, model_id in (("deepseek-v2-lite_inference_config_16B.json",
                                 "deepseek-ai/DeepSeek-V2-Lite"),
                                ("deepseek-v3_inference_config_671B.json",
                                 "deepseek-ai/DeepSeek-V3")):
        native = parse_hf_config(configs / file_name)
        entry = load_catalog().model(model_id)
        assert native.attention is AttentionKind.LATENT
        assert native.latent == entry.architecture.latent
        assert native.experts == entry.architecture.experts
        assert count_parameters(native) == entry.parameters
        assert architecture_kv_bytes_per_token(native, 2) == entry.kv_bytes_per_token_bf16


def test_deepseek_v3_native_dtype_fp8_is_the_checkpoint_weight_format() -> None:
    native = parse_hf_config(fixtures_dir() / "catalog" / "configs" /
                             "deepseek-v3_inference_config_671B.json")
    assert native.checkpoint_weight_dtype is DType.FP8


def test_quantization_config_overrides_torch_dtype_for_the_weights() -> None:
    arch = parse_hf_config(catalog_config("deepseek-ai/DeepSeek-V3"))
    assert (arch.compute_dtype, arch.checkpoint_weight_dtype) == (DType.BF16, DType.FP8)
    awq = parse_hf_config({**LLAMA_8B, "quantization_config": {"quant_method": "awq", "bits": 4}})
    assert awq.checkpoint_weight_dtype is DType.INT4
    unknown = parse_hf_config({**LLAMA_8B, "quantization_config": {"quant_method": "hqq"}})
    assert (unknown.quantization_method, unknown.checkpoint_weight_dtype) == ("hqq", None)


def test_sliding_windows_are_read_per_family() -> None:
    gemma = parse_hf_config(catalog_config("google/gemma-2-9b"))
    assert (gemma.sliding_window_tokens, gemma.sliding_window_layers) == (4096, 21)
    mistral = parse_hf_config(catalog_config("mistralai/Mistral-7B-v0.3"))
    assert (mistral.sliding_window_tokens, mistral.sliding_window_layers) == (None, 0)
    qwen_off = parse_hf_config({**LLAMA_8B, "model_type": "qwen2", "sliding_window": 131072,
                                "use_sliding_window": False})
    assert qwen_off.sliding_window_tokens is None
    qwen_on = parse_hf_config({**LLAMA_8B, "model_type": "qwen2", "sliding_window": 4096,
                               "use_sliding_window": True, "max_window_layers": 28})
    assert qwen_on.sliding_window_layers == 4
    phi = parse_hf_config(catalog_config("microsoft/Phi-3-mini-4k-instruct"))
    assert (phi.sliding_window_tokens, phi.sliding_window_layers) == (2047, 32)


@pytest.mark.parametrize("first_windowed", [1.5, -1, 33, True, "28"])
def test_a_qwen2_max_window_layers_that_is_not_a_layer_index_is_refused(
        first_windowed: object) -> None:
    """It had been truncated (1.5 -> 1), let the windowed count pass the layer count (-1), or
    crashed the fit with a traceback."""
    with pytest.raises(CatalogError) as refused:
        parse_hf_config({**LLAMA_8B, "model_type": "qwen2", "sliding_window": 4096,
                         "use_sliding_window": True, "max_window_layers": first_windowed})
    assert refused.value.field == "max_window_layers"


def test_tied_embeddings_follow_the_transformers_default_per_family() -> None:
    assert parse_hf_config({**LLAMA_8B, "tie_word_embeddings": None}).tie_word_embeddings is False
    gemma = {**LLAMA_8B, "model_type": "gemma2", "tie_word_embeddings": None}
    assert parse_hf_config(gemma).tie_word_embeddings is True


def test_nested_text_config_is_read_for_multimodal_wrappers() -> None:
    wrapper = {"model_type": "llava", "text_config": LLAMA_8B}
    assert parse_hf_config(wrapper).layers == 32


def test_config_is_read_from_a_file_or_a_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B), encoding="utf-8")
    assert parse_hf_config(tmp_path).layers == parse_hf_config(tmp_path / "config.json").layers


@pytest.mark.parametrize(("change", "code", "field"), [
    ({"num_hidden_layers": None}, "config_field_missing", "num_hidden_layers"),
    ({"hidden_size": "4096"}, "config_field_invalid", "hidden_size"),
    ({"num_key_value_heads": 0}, "config_field_invalid", "num_key_value_heads"),
    ({"num_attention_heads": True}, "config_field_invalid", "num_attention_heads"),
    ({"num_attention_heads": 30}, "config_field_missing", "head_dim"),
    ({"tie_word_embeddings": "no"}, "config_field_invalid", "tie_word_embeddings"),
    ({"torch_dtype": "complex64"}, "dtype_unknown", "torch_dtype"),
    ({"n_routed_experts": 8, "moe_layer_freq": 2}, "config_field_unsupported", "moe_layer_freq"),
    ({"kv_lora_rank": 512}, "config_field_missing", "qk_nope_head_dim"),
])
def test_invalid_configs_raise_a_typed_error_naming_the_field(change: dict[str, Any], code: str,
                                                              field: str) -> None:
    with pytest.raises(CatalogError) as caught:
        parse_hf_config({**LLAMA_8B, **change})
    assert (caught.value.code, caught.value.field) == (code, field)


@pytest.mark.parametrize(("text", "code"), [
    ('{"num_hidden_layers": NaN}', "config_unreadable"),
    ("{not json", "config_unreadable"),
    ("[1, 2]", "config_not_an_object"),
])
def test_unreadable_config_files_are_refused(tmp_path: Path, text: str, code: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CatalogError) as caught:
        parse_hf_config(path)
    assert (caught.value.code, caught.value.field) == (code, "config")


def test_a_missing_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CatalogError) as caught:
        parse_hf_config(tmp_path / "absent.json")
    assert caught.value.code == "config_unreadable"


def test_dtype_names_and_kv_formats() -> None:
    assert parse_dtype("bfloat16", "x") is DType.BF16 and parse_dtype("FP8", "x") is DType.FP8
    assert [kv_element_bytes(d) for d in (DType.FP32, DType.BF16, DType.FP8)] == [4, 2, 1]
    with pytest.raises(CatalogError) as caught:
        kv_element_bytes(DType.INT4)
    assert (caught.value.code, caught.value.field) == ("kv_dtype_unsupported", "kv_dtype")


def test_weight_bytes_scale_with_bits() -> None:
    assert weight_bytes(8_030_261_248, 16) == 16_060_522_496  # the Llama-3.1-8B index total_size
    assert weight_bytes(8_000_000_000, 4) == 4_000_000_000
