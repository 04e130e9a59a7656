"""A Hugging Face `config.json` parsed into an `Architecture`, family by family.

Llama-style keys are read as they are; a `text_config` (multimodal wrappers) and DeepSeek's own
inference configs (`dim`, `n_layers`, ...) are normalised to them first. Every value that decides
a size is validated, and one that cannot be used raises `ConfigValueError` naming its key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from controlplane.catalog.architecture import (
    Architecture,
    LatentAttention,
    MixtureOfExperts,
    alternating_windowed_layers,
)
from controlplane.catalog.config_file import config_path, load_config
from controlplane.catalog.config_values import ConfigValueError, config_count
from controlplane.catalog.dtypes import DType, parse_dtype
from controlplane.catalog.errors import CatalogError
from controlplane.catalog.vision import vision_tower

# DeepSeek's own inference configs (`inference/configs/*.json`) use other names for HF keys.
_DEEPSEEK_NATIVE_KEYS = {"dim": "hidden_size", "n_layers": "num_hidden_layers",
                         "n_heads": "num_attention_heads", "inter_dim": "intermediate_size",
                         "moe_inter_dim": "moe_intermediate_size",
                         "n_activated_experts": "num_experts_per_tok",
                         "n_dense_layers": "first_k_dense_replace"}


def parse_hf_config(source: Mapping[str, Any] | str | Path) -> Architecture:
    """Read an HF config (dict, file or directory) into an Architecture.

    A value that cannot be used raises ConfigValueError naming its key and, for a file, the file.
    """
    raw = load_config(source)
    try:
        return _parse(raw)
    except ConfigValueError:
        raise
    except CatalogError as error:
        where = None if isinstance(source, Mapping) else str(config_path(source))
        raise ConfigValueError(error.code, error.field, error.message, where) from None


def _parse(raw: dict[str, Any]) -> Architecture:
    config = _normalise(raw)
    model_type = str(config.get("model_type") or "unknown")
    layers = config_count(config, "num_hidden_layers")
    hidden = config_count(config, "hidden_size")
    heads = config_count(config, "num_attention_heads")
    head_dim = _head_dim(config, hidden, heads)
    kv_heads = _kv_heads(config, heads)
    latent = _latent(config)
    dtype_name = config.get("torch_dtype", config.get("dtype"))
    declared = parse_dtype(dtype_name, "torch_dtype") if isinstance(dtype_name, str) else None
    compute = declared if declared is not None and declared.is_float_compute else None
    quant_method, quant_dtype = _quantization(config)
    window, window_layers = _sliding_window(config, model_type, layers)
    attention_bias = config.get("attention_bias") is True
    return Architecture(
        model_type=model_type,
        layers=layers,
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=config_count(config, "intermediate_size"),
        vocab_size=config_count(config, "vocab_size"),
        tie_word_embeddings=_tied(config, model_type),
        max_position_embeddings=config_count(config, "max_position_embeddings", default=None),
        compute_dtype=compute,
        checkpoint_weight_dtype=quant_dtype if quant_method else declared,
        quantization_method=quant_method,
        sliding_window_tokens=window,
        sliding_window_layers=window_layers,
        norms_per_layer=4 if model_type == "gemma2" else 2,
        # Qwen2 always has q/k/v biases; `attention_bias` (Llama style) adds them and o's.
        qkv_bias=model_type == "qwen2" or attention_bias,
        output_bias=attention_bias and model_type != "qwen2",
        latent=latent,
        experts=_experts(config, model_type),
        vision=vision_tower(raw, hidden),
    )


def _normalise(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(text, Mapping):
        config = {**config, **text}
    if "dim" in config and "n_layers" in config:
        renamed = {_DEEPSEEK_NATIVE_KEYS.get(key, key): value for key, value in config.items()}
        renamed.setdefault("model_type", "deepseek_v3" if "n_expert_groups" in config
                           else "deepseek_v2")
        renamed.setdefault("num_key_value_heads", renamed.get("num_attention_heads"))
        config = renamed
    return config


def _kv_heads(config: Mapping[str, Any], heads: int) -> int:
    """The KV heads, each serving an equal group of the query heads: a count above the
    attention heads, or one that does not divide them, is a shape no runtime loads."""
    kv_heads: int = config_count(config, "num_key_value_heads", default=heads)
    if heads % kv_heads:
        raise CatalogError("config_field_invalid", "num_key_value_heads",
                           f"config num_key_value_heads {kv_heads} must divide "
                           f"num_attention_heads {heads}: each KV head serves an equal group "
                           "of query heads")
    return kv_heads


def _head_dim(config: Mapping[str, Any], hidden: int, heads: int) -> int:
    if config.get("head_dim") is not None:
        explicit: int = config_count(config, "head_dim")
        return explicit  # Gemma-2's head_dim is not hidden/heads: always prefer the config
    if hidden % heads:
        raise CatalogError("config_field_missing", "head_dim",
                           f"no head_dim; hidden_size {hidden} is not a multiple of {heads}")
    return hidden // heads


def _latent(config: Mapping[str, Any]) -> LatentAttention | None:
    if config.get("kv_lora_rank") is None:
        return None
    q_rank = config.get("q_lora_rank")
    return LatentAttention(
        q_lora_rank=0 if q_rank in (None, 0) else config_count(config, "q_lora_rank"),
        kv_lora_rank=config_count(config, "kv_lora_rank"),
        qk_nope_head_dim=config_count(config, "qk_nope_head_dim"),
        qk_rope_head_dim=config_count(config, "qk_rope_head_dim"),
        v_head_dim=config_count(config, "v_head_dim"),
    )


def _experts(config: Mapping[str, Any], model_type: str) -> MixtureOfExperts | None:
    if config.get("num_local_experts") is not None:  # Mixtral: every layer is MoE, FFN per expert
        return MixtureOfExperts(config_count(config, "num_local_experts"), 0,
                                config_count(config, "num_experts_per_tok"),
                                config_count(config, "intermediate_size"), 0)
    if config.get("n_routed_experts") is None:
        return None
    if config.get("moe_layer_freq", 1) != 1:
        raise CatalogError("config_field_unsupported", "moe_layer_freq",
                           f"{model_type}: only moe_layer_freq 1 is supported")
    dense_layers = config.get("first_k_dense_replace") or 0
    if not isinstance(dense_layers, int) or isinstance(dense_layers, bool) or dense_layers < 0:
        raise CatalogError("config_field_invalid", "first_k_dense_replace",
                           "first_k_dense_replace must be a non-negative integer")
    return MixtureOfExperts(config_count(config, "n_routed_experts"),
                            config_count(config, "n_shared_experts", default=0),
                            config_count(config, "num_experts_per_tok"),
                            config_count(config, "moe_intermediate_size"), dense_layers)


def _tied(config: Mapping[str, Any], model_type: str) -> bool:
    value = config.get("tie_word_embeddings")
    if value is None:
        # transformers' own defaults: Gemma configs tie embeddings, the other families do not.
        return model_type.startswith("gemma")
    if not isinstance(value, bool):
        raise CatalogError("config_field_invalid", "tie_word_embeddings", "must be true or false")
    return value


def _quantization(config: Mapping[str, Any]) -> tuple[str | None, DType | None]:
    quant = config.get("quantization_config")
    if quant is None:
        return None, None
    if not isinstance(quant, Mapping):  # ignoring it would size quantized weights as unquantized
        raise CatalogError("config_field_invalid", "quantization_config",
                           f"config quantization_config must be a JSON object, got {quant!r}")
    method = quant.get("quant_method", "unknown")
    if not isinstance(method, str):
        raise CatalogError("config_field_invalid", "quantization_config.quant_method",
                           f"config quantization_config.quant_method must be a string, "
                           f"got {method!r}")
    method = method.lower()
    if method == "fp8":
        return method, DType.FP8
    bits = quant.get("bits")
    if method in ("awq", "gptq") and bits in (4, 8):
        return method, DType.INT4 if bits == 4 else DType.INT8
    return method, None  # known to be quantized, but to what is for the operator to declare


def _sliding_window(config: Mapping[str, Any], model_type: str,
                    layers: int) -> tuple[int | None, int]:
    if config.get("sliding_window") is None or config.get("use_sliding_window") is False:
        return None, 0
    window: int = config_count(config, "sliding_window")
    if model_type == "gemma2":
        return window, alternating_windowed_layers(layers)
    if model_type == "qwen2":  # layers from max_window_layers on slide
        first_windowed = config.get("max_window_layers")
        if first_windowed is None:
            first_windowed = 0
        if not isinstance(first_windowed, int) or isinstance(first_windowed, bool) \
                or not 0 <= first_windowed <= layers:
            raise CatalogError("config_field_invalid", "max_window_layers",
                               f"config max_window_layers must be an integer from 0 to the "
                               f"{layers} layers, got {first_windowed!r}")
        return window, layers - first_windowed
    return window, layers

