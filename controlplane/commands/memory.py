"""Memory-fit commands."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from controlplane.commands.base import (
    MAX_GPU_MEMORY_GIB,
    MAX_PARAMETERS,
    MAX_TOKENS,
    CommandBase,
    Fraction,
    Frozen,
    Name,
)


class ModelMemorySpec(Frozen):
    """The memory-relevant architecture of a model (spec §1.1)."""

    parameters: Annotated[int, Field(strict=True, gt=0, le=MAX_PARAMETERS)]
    weight_bits: Annotated[int, Field(strict=True, gt=0, le=64)]
    layers: Annotated[int, Field(strict=True, gt=0, le=10_000)]
    kv_heads: Annotated[int, Field(strict=True, gt=0, le=100_000)]
    head_dim: Annotated[int, Field(strict=True, gt=0, le=100_000)]
    kv_element_bytes: Annotated[int, Field(strict=True, gt=0, le=8)] = 2


class DeploymentMemorySpec(Frozen):
    """How one replica is laid out; `usable_fraction` omitted means the memory policy's default."""

    gpu_memory_gib: Annotated[float, Field(strict=True, gt=0, le=MAX_GPU_MEMORY_GIB,
                                           allow_inf_nan=False)]
    tensor_parallel_size: Annotated[int, Field(strict=True, gt=0, le=1_024)]
    kv_shards: Annotated[int, Field(strict=True, gt=0, le=1_024)]
    max_live_tokens_per_request: Annotated[int, Field(strict=True, gt=0, le=MAX_TOKENS)]
    target_concurrency: Annotated[int, Field(strict=True, gt=0, le=10_000_000)]
    runtime_overhead_gib: Annotated[float, Field(strict=True, ge=0, le=MAX_GPU_MEMORY_GIB,
                                                 allow_inf_nan=False)] = 0.0
    usable_fraction: Fraction | None = None


class AssessMemory(CommandBase):
    """Decide whether a model deployment fits its GPUs' memory."""

    type: Literal["AssessMemory"] = "AssessMemory"
    model_name: Name
    model: ModelMemorySpec
    deployment: DeploymentMemorySpec


COMMANDS: list[type[CommandBase]] = [AssessMemory]
