"""A Hugging Face `config.json` read into a typed, validated model architecture."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from controlplane.catalog.dtypes import DType, parse_dtype
from controlplane.catalog.errors import CatalogError

# Families whose parameter formula was checked against published counts (research-data §1.3).
VERIFIED_FAMILIES = frozenset({"llama", "mistral", "mixtral", "qwen2", "gemma2", "phi3",
                               "deepseek_v2", "deepseek_v3"})

# DeepSeek's own inference configs (`inference/configs/*.json`) use other names for HF keys.
_DEEPSEEK_NATIVE_KEYS = {"dim": "hidden_size", "n_layers": "num_hidden_layers",
                         "n_heads": "num_attention_heads", "inter_dim": "intermediate_size",
                         "moe_inter_dim": "moe_intermediate_size",
                         "n_activated_experts": "num_experts_per_tok",
                         "n_dense_layers": "first_k_dense_replace"}


class AttentionKind(StrEnum):
    PER_HEAD = "per_head"  # MHA, GQA and MQA: K and V per KV head
    LATENT = "latent"  # MLA: one compressed latent per layer, shared by every head


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention dimensions (DeepSeek-V2/V3)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def cached_elements_per_layer(self) -> int:
        """Elements cached per token per layer: the KV latent plus the decoupled RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class MixtureOfExperts:
    """Expert layout; `dense_layers` leading layers keep a dense FFN (DeepSeek)."""

    routed_experts: int
    shared_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    dense_layers: int


@dataclass(frozen=True)
class Architecture:
    """What memory sizing needs from a model configuration, validated."""

    model_type: str
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None
    compute_dtype: DType | None
    checkpoint_weight_dtype: DType | None
    quantization_method: str | None
    sliding_window_tokens: int | None
    sliding_window_layers: int
    norms_per_layer: int
    qkv_bias: bool
    output_bias: bool
    latent: LatentAttention | None = None
    experts: MixtureOfExperts | None = None

    @property
    def attention(self) -> AttentionKind:
        return AttentionKind.LATENT if self.latent is not None else AttentionKind.PER_HEAD

    @property
    def family_verified(self) -> bool:
        return self.model_type in VERIFIED_FAMILIES


# A model's config.json is kilobytes; a file is read no further than this.
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def load_config(source: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """Return a config as a dict from a mapping, a JSON file, or a directory with config.json."""
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        with path.open("rb") as handle:  # bounded: a FIFO or /dev/zero never ends
            raw = handle.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ValueError(f"larger than {MAX_CONFIG_BYTES} bytes")
        loaded = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise CatalogError("config_unreadable", "config",
                           f"cannot read model config {str(path)!r}: "
                           f"{str(error).split(';')[0]}") from None
    except RecursionError:
        raise CatalogError("config_unreadable", "config",
                           f"cannot read model config {str(path)!r}: nested too deeply") from None
    if not isinstance(loaded, dict):
        raise CatalogError("config_not_an_object", "config", "a model config must be a JSON object")
    return loaded


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} in config")


def parse_hf_config(source: Mapping[str, Any] | str | Path) -> Architecture:
    """Read an HF config (dict, file or directory) into an Architecture; bad fields raise."""
    config = _normalise(load_config(source))
    model_type = str(config.get("model_type") or "unknown")
    layers = _count(config, "num_hidden_layers")
    hidden = _count(config, "hidden_size")
    heads = _count(config, "num_attention_heads")
    kv_heads = _count(config, "num_key_value_heads", default=heads)
    head_dim = _head_dim(config, hidden, heads)
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
        intermediate_size=_count(config, "intermediate_size"),
        vocab_size=_count(config, "vocab_size"),
        tie_word_embeddings=_tied(config, model_type),
        max_position_embeddings=_count(config, "max_position_embeddings", default=None),
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


def _count(config: Mapping[str, Any], key: str, default: Any = ...) -> Any:
    if config.get(key) is None:
        if default is ...:
            raise CatalogError("config_field_missing", key, f"config has no {key}")
        return default
    value = config[key]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CatalogError("config_field_invalid", key,
                           f"config {key} must be a positive integer, got {value!r}")
    return value


def _head_dim(config: Mapping[str, Any], hidden: int, heads: int) -> int:
    if config.get("head_dim") is not None:
        explicit: int = _count(config, "head_dim")
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
        q_lora_rank=0 if q_rank in (None, 0) else _count(config, "q_lora_rank"),
        kv_lora_rank=_count(config, "kv_lora_rank"),
        qk_nope_head_dim=_count(config, "qk_nope_head_dim"),
        qk_rope_head_dim=_count(config, "qk_rope_head_dim"),
        v_head_dim=_count(config, "v_head_dim"),
    )


def _experts(config: Mapping[str, Any], model_type: str) -> MixtureOfExperts | None:
    if config.get("num_local_experts") is not None:  # Mixtral: every layer is MoE, FFN per expert
        return MixtureOfExperts(_count(config, "num_local_experts"), 0,
                                _count(config, "num_experts_per_tok"),
                                _count(config, "intermediate_size"), 0)
    if config.get("n_routed_experts") is None:
        return None
    if config.get("moe_layer_freq", 1) != 1:
        raise CatalogError("config_field_unsupported", "moe_layer_freq",
                           f"{model_type}: only moe_layer_freq 1 is supported")
    dense_layers = config.get("first_k_dense_replace") or 0
    if not isinstance(dense_layers, int) or isinstance(dense_layers, bool) or dense_layers < 0:
        raise CatalogError("config_field_invalid", "first_k_dense_replace",
                           "first_k_dense_replace must be a non-negative integer")
    return MixtureOfExperts(_count(config, "n_routed_experts"),
                            _count(config, "n_shared_experts", default=0),
                            _count(config, "num_experts_per_tok"),
                            _count(config, "moe_intermediate_size"), dense_layers)


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
    if not isinstance(quant, Mapping):
        return None, None
    method = str(quant.get("quant_method", "unknown")).lower()
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
    window: int = _count(config, "sliding_window")
    if model_type == "gemma2":
        return window, -(-layers // 2)  # even-indexed layers slide, odd ones attend globally
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
