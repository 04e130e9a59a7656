"""What one engine step costs on one replica, from what its GPUs hold and how fast they are.

A decode step reads every weight once (memory-bound) plus each running request's cached KV; a
prefill token costs two multiply-adds per active parameter (compute-bound). What a GPU holds is
what the replica's placement decision sized it at (`PlacedMemory`): the weights at the precision
the model was registered at (a checkpoint's own, FP8 for DeepSeek-V3) and the KV per token after
tensor parallelism's split, which leaves latent (MLA) KV whole on every GPU. The efficiencies
below are assumptions of the model, stated once here, not measurements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.catalog.gpus import GpuType
from controlplane.catalog.registry import CatalogModel
from controlplane.errors import InputError
from controlplane.policies.memory import GIB

HBM_EFFICIENCY = 0.75  # share of peak memory bandwidth a decode step achieves
PREFILL_MFU = 0.5  # share of dense bf16 peak a prefill chunk achieves
STEP_OVERHEAD_SECONDS = 0.0005  # scheduling and sampling per engine iteration
PREFILL_TOKENS_PER_STEP = 2_048  # chunked-prefill budget of one iteration
MAX_RUNNING_REQUESTS = 256
NOMINAL_BATCH_REQUESTS = 32  # the batch the autoscaler's service rate is calibrated at


@dataclass(frozen=True)
class EngineCosts:
    """Seconds per engine step: `step_base_seconds`, plus per decoding request its KV read,
    plus per prefilled token its compute. At most `prefill_tokens_per_step` prompt tokens and
    `max_running_requests` requests share one step."""

    step_base_seconds: float
    kv_read_seconds_per_token: float
    prefill_seconds_per_token: float
    prefill_tokens_per_step: int = PREFILL_TOKENS_PER_STEP
    max_running_requests: int = MAX_RUNNING_REQUESTS

    def decode_seconds_per_step(self, context_tokens: float) -> float:
        """What one decoding request with `context_tokens` of KV adds to every step."""
        return context_tokens * self.kv_read_seconds_per_token


@dataclass(frozen=True)
class PlacedMemory:
    """What each GPU of a placed replica holds, as its placement decision sized it."""

    weight_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float

    @classmethod
    def from_record(cls, memory: Mapping[str, Any]) -> PlacedMemory:
        """From a `ReplicaPlaced` result's `memory` record (the memory policy's assessment)."""
        return cls(weight_bytes_per_gpu=float(memory["weight_gib_per_gpu"]) * GIB,
                   kv_bytes_per_token_per_gpu=float(memory["kv_bytes_per_token_per_gpu"]))


def dense_bf16_tflops(gpu: GpuType) -> float:
    """`gpu`'s dense bf16 TFLOPS, which prefill is costed at; InputError naming --gpu when the
    catalog has no such figure. `resolve_catalog` asks it with the other input checks, so such
    a GPU is refused before any log exists."""
    if gpu.bf16_dense_tflops is None:
        raise InputError(f"--gpu {gpu.gpu_id}: the catalog has no dense bf16 compute figure for "
                         "it, which the simulated engines need; pick another --gpu")
    return gpu.bf16_dense_tflops


def engine_costs(model: CatalogModel, gpu: GpuType, tensor_parallel: int,
                 placed: PlacedMemory) -> EngineCosts:
    """Step costs of `model` on `tensor_parallel` GPUs of type `gpu`: a decode step reads the
    bytes each GPU holds (`placed`), a prefill token computes over the active parameters."""
    bandwidth_bytes_per_second = gpu.memory_bandwidth_gb_per_second * 1e9 * HBM_EFFICIENCY
    compute_flops = dense_bf16_tflops(gpu) * 1e12 * PREFILL_MFU
    return EngineCosts(
        step_base_seconds=STEP_OVERHEAD_SECONDS
        + placed.weight_bytes_per_gpu / bandwidth_bytes_per_second,
        kv_read_seconds_per_token=placed.kv_bytes_per_token_per_gpu / bandwidth_bytes_per_second,
        prefill_seconds_per_token=2 * model.parameters.active / tensor_parallel / compute_flops)


def service_tokens_per_second(costs: EngineCosts, mean_prompt_tokens: float,
                              mean_output_tokens: float,
                              batch_requests: int = NOMINAL_BATCH_REQUESTS) -> float:
    """Prompt plus output tokens per second one replica serves for the mean request, with
    `batch_requests` requests sharing each decode step: the autoscaler's service rate."""
    context_tokens = mean_prompt_tokens + mean_output_tokens / 2
    seconds_per_request = (
        mean_prompt_tokens * costs.prefill_seconds_per_token
        + mean_output_tokens * (costs.step_base_seconds / batch_requests
                                + costs.decode_seconds_per_step(context_tokens)))
    return (mean_prompt_tokens + mean_output_tokens) / seconds_per_request
