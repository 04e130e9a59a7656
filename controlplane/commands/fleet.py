"""Fleet inventory and replica commands: nodes, models, policies, placement and lifecycle."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from controlplane.commands.base import (
    MAX_GPU_MEMORY_GIB,
    MAX_TOKENS,
    CommandBase,
    Frozen,
    Name,
    NodeId,
)
from controlplane.commands.memory import ModelMemorySpec
from controlplane.policies.parallelism import MAX_GPUS_PER_NODE  # one bound: a plan's and a node's

Capability = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")]


class GpuSpec(Frozen):
    """One GPU of a node: its type, the memory the runtime reports, and what it can do."""

    gpu_id: Name
    gpu_type: Name
    memory_gib: Annotated[float, Field(strict=True, gt=0, le=MAX_GPU_MEMORY_GIB, allow_inf_nan=False)]
    capabilities: Annotated[list[Capability], Field(max_length=32)] = []


class RegisterNode(CommandBase):
    """Add a node and its GPUs to the inventory, with its failure and link domains."""

    type: Literal["RegisterNode"] = "RegisterNode"
    node_id: NodeId
    rack: Name = "rack-0"
    link_domain: Name | None = None
    gpus: Annotated[list[GpuSpec], Field(min_length=1, max_length=MAX_GPUS_PER_NODE)]

    @field_validator("gpus")
    @classmethod
    def _unique_gpu_ids(cls, gpus: list[GpuSpec]) -> list[GpuSpec]:
        ids = [gpu.gpu_id for gpu in gpus]
        if len(set(ids)) != len(ids):
            raise ValueError("gpu ids must be unique within a node")
        return gpus

    def creates(self) -> list[str]:
        return [f"node/{self.node_id}"]


class CordonNode(CommandBase):
    """Stop placing replicas on a node; replicas already there keep running."""

    type: Literal["CordonNode"] = "CordonNode"
    node_id: NodeId
    reason: Annotated[str, Field(max_length=500)] = ""

    def references(self) -> list[tuple[str, str]]:
        return [("node_id", f"node/{self.node_id}")]


class DrainNode(CommandBase):
    """Cordon a node and release every replica on it."""

    type: Literal["DrainNode"] = "DrainNode"
    node_id: NodeId
    reason: Annotated[str, Field(max_length=500)] = ""

    def references(self) -> list[tuple[str, str]]:
        return [("node_id", f"node/{self.node_id}")]


class RegisterModel(CommandBase):
    """Add a model to the fleet catalog: a catalog id, or a declared memory architecture.

    `weight_bits` sets a catalog model's bits per weight; omitted, they are the precision its
    checkpoint is served in (DeepSeek-V3's FP8: 8), as `fleetctl fit` takes them. A declared
    `memory` carries its own. (Before rules version 2 of RegisterModel the default was 16, and
    commands recorded then carry that 16 in their payload, so they re-derive as they were.)
    """

    type: Literal["RegisterModel"] = "RegisterModel"
    model_id: Name
    catalog_id: Name | None = None
    memory: ModelMemorySpec | None = None
    weight_bits: Annotated[int, Field(strict=True, gt=0, le=32)] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> RegisterModel:
        if (self.catalog_id is None) == (self.memory is None):
            raise ValueError("give exactly one of catalog_id or memory")
        return self

    def creates(self) -> list[str]:
        return [f"model/{self.model_id}"]


class SetPolicy(CommandBase):
    """Set a policy's parameters; each change is a new version that later decisions record."""

    type: Literal["SetPolicy"] = "SetPolicy"
    name: Literal["memory", "placement", "admission", "autoscaling", "rollout"]
    parameters: dict[str, Any]


class PlaceReplica(CommandBase):
    """Find GPUs for a replica of a model in a pool, and reserve them atomically."""

    type: Literal["PlaceReplica"] = "PlaceReplica"
    replica_id: Name
    model_id: Name
    pool_id: Name
    tensor_parallel_size: Annotated[int, Field(strict=True, gt=0, le=MAX_GPUS_PER_NODE)] | None = None
    max_live_tokens_per_request: Annotated[int, Field(strict=True, gt=0, le=MAX_TOKENS)] = 8_192
    target_concurrency: Annotated[int, Field(strict=True, gt=0, le=100_000)] = 8
    runtime_overhead_gib: Annotated[float, Field(strict=True, ge=0, le=1_000, allow_inf_nan=False)] = 2.0
    required_capabilities: Annotated[list[Capability], Field(max_length=32)] = []
    locality: Literal["node", "link_domain", "rack", "any"] = "node"

    def references(self) -> list[tuple[str, str]]:
        return [("model_id", f"model/{self.model_id}")]

    def creates(self) -> list[str]:
        return [f"replica/{self.replica_id}", f"pool/{self.pool_id}"]


class ReleaseReplica(CommandBase):
    """Stop a replica and free its GPUs."""

    type: Literal["ReleaseReplica"] = "ReleaseReplica"
    replica_id: Name
    reason: Annotated[str, Field(max_length=500)] = ""

    def references(self) -> list[tuple[str, str]]:
        return [("replica_id", f"replica/{self.replica_id}")]


class MarkReplicaReady(CommandBase):
    """A warming replica finished loading and serves traffic."""

    type: Literal["MarkReplicaReady"] = "MarkReplicaReady"
    replica_id: Name

    def references(self) -> list[tuple[str, str]]:
        return [("replica_id", f"replica/{self.replica_id}")]


COMMANDS: list[type[CommandBase]] = [RegisterNode, CordonNode, DrainNode, RegisterModel, SetPolicy,
                                     PlaceReplica, ReleaseReplica, MarkReplicaReady]
