"""The command vocabulary: the public JSON contract of `fleetctl submit`.

Commands are imperative, immutable and strict: unknown fields, wrong types, negative counts,
NaN or infinity and absurd sizes are refused at the edge, before anything is written.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$")]
CommandId = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]
Count = Annotated[int, Field(strict=True, gt=0)]
NonNegativeFloat = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
PositiveFloat = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(strict=True, gt=0, le=1, allow_inf_nan=False)]

MAX_PARAMETERS = 100_000_000_000_000  # 100 trillion: far past any model, short of overflow tricks
MAX_TOKENS = 100_000_000
MAX_GPU_MEMORY_GIB = 100_000.0


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class CommandBase(Frozen):
    """Fields every command carries. `at` is the command's logical time: policies read no clock."""

    command_id: CommandId = Field(default_factory=lambda: str(uuid.uuid4()))
    at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    actor: Name = "operator"
    tenant: Name = "default"
    correlation_id: CommandId | None = None

    @field_validator("at")
    @classmethod
    def _aware_utc(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    @property
    def occurred_at(self) -> str:
        return self.at.isoformat(timespec="microseconds").replace("+00:00", "Z")

    def payload(self) -> dict[str, Any]:
        """The command as plain JSON data, exactly as it is recorded in the inbox."""
        return self.model_dump(mode="json")


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


Command = Annotated[AssessMemory, Field(discriminator="type")]
COMMAND_TYPES: dict[str, type[CommandBase]] = {"AssessMemory": AssessMemory}
command_adapter: TypeAdapter[Command] = TypeAdapter(Command)


def parse_command(payload: dict[str, Any]) -> CommandBase:
    """Rebuild a recorded command from its inbox payload."""
    return command_adapter.validate_python(payload)
