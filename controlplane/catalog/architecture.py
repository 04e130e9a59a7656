"""A Hugging Face `config.json` read into a typed, validated model architecture."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from controlplane.catalog.dtypes import DType, parse_dtype
from controlplane.catalog.errors import CatalogError
from controlplane.policies.memory import MAX_COUNT

# Families whose parameter formula was checked against published counts (research-data §1.3).
VERIFIED_FAMILIES = frozenset({"llama", "mistral", "mixtral", "qwen2", "gemma2", "phi3",
                               "deepseek_v2", "deepseek_v3"})

# DeepSeek's own inference configs (`inference/configs/*.json`) use other names for HF keys.
_DEEPSEEK_NATIVE_KEYS = {"dim": "hidden_size", "n_layers": "num_hidden_layers",
                         "n_heads": "num_attention_heads", "inter_dim": "intermediate_size",
                         "moe_inter_dim": "moe_intermediate_size",
                         "n_activated_experts": "num_experts_per_tok",
                         "n_dense_layers": "first_k_dense_replace"}


class ConfigValueError(CatalogError):
    """A value of a model config that cannot be used: `field` is its key (nested keys dotted,
    `vision_config.hidden_size`) and `config_file` the file it was read from (None for a config
    given as a mapping), so an error names the key and the file, never a command-line flag."""

    def __init__(self, code: str, field: str, message: str, config_file: str | None) -> None:
        super().__init__(code, field, message)
        self.config_file = config_file

    def as_dict(self) -> dict[str, str]:
        located = {"config_key": self.field}
        return {**super().as_dict(), **located,
                **({"config_file": self.config_file} if self.config_file else {})}


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
class VisionTower:
    """A multimodal config's vision encoder (`vision_config`) and its projector into the text
    model. `parameters` is None when they cannot be counted from the config (an encoder other
    than CLIP under a LLaVA projector, or keys the count needs are absent): the weights then
    leave them out, and `fleetctl fit` says so in its notes."""

    model_type: str
    parameters: int | None


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
    vision: VisionTower | None = None

    @property
    def attention(self) -> AttentionKind:
        return AttentionKind.LATENT if self.latent is not None else AttentionKind.PER_HEAD

    @property
    def family_verified(self) -> bool:
        return self.model_type in VERIFIED_FAMILIES

    def with_layers(self, layers: int) -> Architecture:
        """This architecture with `layers` decoder layers, its sliding-window layers following
        the family's pattern: Gemma-2 alternates (even-indexed layers slide, so ceil(layers / 2)
        do); the others slide from a first windowed layer on (Qwen2's `max_window_layers`; 0,
        every layer, for Mistral and Phi-3), which stays where the config put it."""
        if self.sliding_window_tokens is None:
            windowed = 0
        elif self.model_type == "gemma2":
            windowed = _alternating_windowed_layers(layers)
        else:
            windowed = max(0, layers - (self.layers - self.sliding_window_layers))
        return replace(self, layers=layers, sliding_window_layers=windowed)


# A model's config.json is kilobytes; a file is read no further than this.
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def load_config(source: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """Return a config as a dict from a mapping, a JSON file, or a directory with config.json."""
    if isinstance(source, Mapping):
        return dict(source)
    path = config_path(source)
    if path.is_dir():
        raise CatalogError("config_missing", "config",
                           f"directory {str(source)!r} has no config.json")
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


def config_path(source: str | Path) -> Path:
    """The file a config is read from: `source` (`~` expanded), or its config.json when it is a
    directory."""
    path = Path(source).expanduser()
    return path / "config.json" if path.is_dir() and (path / "config.json").exists() else path


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} in config")


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
        vision=_vision(raw, hidden),
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
    if value > MAX_COUNT:  # beyond any real model: its sizes would not be finite figures
        raise CatalogError("config_field_out_of_range", key,
                           f"config {key} must be at most {MAX_COUNT:.0e}, got {value}")
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
    window: int = _count(config, "sliding_window")
    if model_type == "gemma2":
        return window, _alternating_windowed_layers(layers)
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


def _alternating_windowed_layers(layers: int) -> int:
    """Gemma-2's windowed layers: even-indexed layers slide, odd ones attend globally
    (transformers' Gemma2DecoderLayer: `is_sliding = not bool(layer_idx % 2)`)."""
    return -(-layers // 2)


# LLaVA projectors: per wrapper model_type, the text-width vectors beside the two linear layers
# (LLaVA-NeXT's `image_newline`).
_LLAVA_PROJECTORS = {"llava": 0, "llava_next": 1}
_CLIP_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "image_size", "patch_size")


def _vision(config: Mapping[str, Any], text_hidden: int) -> VisionTower | None:
    """The vision encoder of a multimodal config, counted when it is CLIP under a LLaVA
    projector and the config gives the sizes (every encoder layer is counted, though a runtime
    may stop at the feature layer)."""
    vision = config.get("vision_config")
    if vision is None:
        return None
    if not isinstance(vision, Mapping):
        raise CatalogError("config_field_invalid", "vision_config",
                           f"config vision_config must be a JSON object, got {vision!r}")
    kind = str(vision.get("model_type") or "unknown")
    extra_vectors = _LLAVA_PROJECTORS.get(str(config.get("model_type")))
    if (kind != "clip_vision_model" or extra_vectors is None
            or any(vision.get(key) is None for key in _CLIP_KEYS)):
        return VisionTower(kind, None)
    try:
        h, inner, layers, image, patch = (_count(vision, key) for key in _CLIP_KEYS)
        channels = _count(vision, "num_channels", default=3)
    except CatalogError as error:
        raise CatalogError(error.code, f"vision_config.{error.field}",
                           error.message.replace("config ", "config vision_config.", 1)) from None
    # Patch convolution (no bias), class embedding, one position per patch and the class token.
    embeddings = channels * patch * patch * h + h + ((image // patch) ** 2 + 1) * h
    # q, k, v, o with biases; two layer norms; the MLP's two linear layers with biases.
    layer = 4 * (h * h + h) + 4 * h + (h * inner + inner) + (inner * h + h)
    encoder = embeddings + 2 * h + layers * layer + 2 * h  # pre- and post-layernorm
    return VisionTower(kind, encoder + _llava_projector(config, h, text_hidden, extra_vectors))


def _llava_projector(config: Mapping[str, Any], vision_hidden: int, text_hidden: int,
                     extra_vectors: int) -> int:
    feature_layer = config.get("vision_feature_layer", -2)
    features = len(feature_layer) if isinstance(feature_layer, list) else 1
    bias = config.get("multimodal_projector_bias", True) is not False
    first = vision_hidden * features * text_hidden + (text_hidden if bias else 0)
    second = text_hidden * text_hidden + (text_hidden if bias else 0)
    return first + second + extra_vectors * text_hidden
