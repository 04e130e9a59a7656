"""A model's architecture as memory sizing needs it: typed, validated, family-aware.

Built from a Hugging Face `config.json` by `controlplane.catalog.hf_config.parse_hf_config`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from controlplane.catalog.dtypes import DType

# Families whose parameter formula was checked against published counts (research-data §1.3).
VERIFIED_FAMILIES = frozenset({"llama", "mistral", "mixtral", "qwen2", "gemma2", "phi3",
                               "deepseek_v2", "deepseek_v3"})


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
            windowed = alternating_windowed_layers(layers)
        else:
            windowed = max(0, layers - (self.layers - self.sliding_window_layers))
        return replace(self, layers=layers, sliding_window_layers=windowed)


def windowed_layer_flags(architecture: Architecture) -> tuple[bool, ...]:
    """Which decoder layers, in order, keep a sliding window of KV: Gemma-2's even-indexed
    ones, the others' last `sliding_window_layers` (see `Architecture.with_layers`)."""
    layers, windowed = architecture.layers, architecture.sliding_window_layers
    if architecture.sliding_window_tokens is None:
        return (False,) * layers
    if architecture.model_type == "gemma2":
        return tuple(index % 2 == 0 for index in range(layers))
    return tuple(index >= layers - windowed for index in range(layers))


def alternating_windowed_layers(layers: int) -> int:
    """Gemma-2's windowed layers: even-indexed layers slide, odd ones attend globally
    (transformers' Gemma2DecoderLayer: `is_sliding = not bool(layer_idx % 2)`)."""
    return -(-layers // 2)
