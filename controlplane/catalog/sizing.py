"""Parameter counts, weight bytes and KV bytes per token derived from an Architecture."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.catalog.architecture import Architecture, LatentAttention
from controlplane.policies.memory import ModelMemory, kv_bytes_per_token


@dataclass(frozen=True)
class ParameterCount:
    """Total parameters (what memory must hold) and those active per token (MoE routing)."""

    total: int
    active: int


def count_parameters(arch: Architecture) -> ParameterCount:
    """Count parameters with the research-data §1.3 formulas (exact for the verified families)."""
    d = arch.hidden_size
    attention = _latent_attention(arch, arch.latent) if arch.latent else _head_attention(arch)
    per_layer_fixed = attention + arch.norms_per_layer * d
    dense_ffn = 3 * d * arch.intermediate_size
    experts = arch.experts
    if experts is None:
        ffn_total = ffn_active = arch.layers * dense_ffn
    else:
        expert_ffn = 3 * d * experts.expert_intermediate_size
        router = experts.routed_experts * d
        moe_layers = arch.layers - experts.dense_layers
        total_moe = (experts.routed_experts + experts.shared_experts) * expert_ffn + router
        active_moe = (experts.experts_per_token + experts.shared_experts) * expert_ffn + router
        ffn_total = experts.dense_layers * dense_ffn + moe_layers * total_moe
        ffn_active = experts.dense_layers * dense_ffn + moe_layers * active_moe
    embeddings = arch.vocab_size * d * (1 if arch.tie_word_embeddings else 2)
    shared = arch.layers * per_layer_fixed + embeddings + d  # + d: the final norm
    return ParameterCount(total=shared + ffn_total, active=shared + ffn_active)


def _head_attention(arch: Architecture) -> int:
    d, heads, kv, hd = arch.hidden_size, arch.attention_heads, arch.kv_heads, arch.head_dim
    projections = d * heads * hd + 2 * d * kv * hd + heads * hd * d
    bias = (heads * hd + 2 * kv * hd if arch.qkv_bias else 0) + (d if arch.output_bias else 0)
    return projections + bias


def _latent_attention(arch: Architecture, mla: LatentAttention) -> int:
    d, heads = arch.hidden_size, arch.attention_heads
    qk_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    if mla.q_lora_rank:
        query = d * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * heads * qk_dim
    else:
        query = d * heads * qk_dim
    key_value = (d * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank
                 + mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim))
    return query + key_value + heads * mla.v_head_dim * d


def weight_bytes(parameters: int, weight_bits: int) -> int:
    """Bytes of weights at `weight_bits` per parameter (scales and zero-points not included)."""
    return parameters * weight_bits // 8


def model_memory(arch: Architecture, parameters: int, weight_bits: int,
                 kv_element_bytes: int) -> ModelMemory:
    """The policy's view of `arch`: MLA models size KV by their latent, not their KV heads."""
    latent = arch.latent.cached_elements_per_layer if arch.latent else 0
    return ModelMemory(parameters=parameters, weight_bits=weight_bits, layers=arch.layers,
                       kv_heads=arch.kv_heads, head_dim=arch.head_dim,
                       kv_element_bytes=kv_element_bytes, kv_latent_dim=latent)


def architecture_kv_bytes_per_token(arch: Architecture, kv_element_bytes: int) -> int:
    """KV bytes cached per token over all layers for `arch` at `kv_element_bytes` per element."""
    return kv_bytes_per_token(model_memory(arch, 1, 16, kv_element_bytes))
