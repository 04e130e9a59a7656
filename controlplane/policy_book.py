"""Policy parameters: validated defaults, versions set through the log, and what-if overrides."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controlplane.errors import InputError
from events.projections import StateView


class MemoryPolicy(BaseModel):
    """Parameters of the memory-fit decision."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    usable_fraction: Annotated[float, Field(strict=True, gt=0, le=1)] = 0.90


class PlacementPolicy(BaseModel):
    """Parameters of replica placement."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    usable_fraction: Annotated[float, Field(strict=True, gt=0, le=1)] = 0.90
    max_tensor_parallel: Annotated[int, Field(strict=True, gt=0, le=64)] = 8


POLICY_MODELS: dict[str, type[BaseModel]] = {"memory": MemoryPolicy, "placement": PlacementPolicy}
POLICY_PROJECTION = "policy"


@dataclass(frozen=True)
class PolicyInForce:
    """The parameters a decision used, and which version they were."""

    name: str
    version: int | str
    parameters: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "parameters": self.parameters}


def validate_parameters(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """Validate parameters for policy `name`, filling defaults; raises InputError naming fields."""
    model = POLICY_MODELS.get(name)
    if model is None:
        raise InputError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICY_MODELS))}")
    try:
        return model.model_validate(parameters).model_dump(mode="json")
    except ValidationError as error:
        problems = "; ".join(
            f"{name}.{'.'.join(str(p) for p in item['loc'])}: {item['msg']}"
            for item in error.errors())
        raise InputError(f"invalid policy parameters: {problems}") from None


class PolicyBook:
    """Resolves the policy in force from state; what-if overrides replace it wholesale."""

    def __init__(self, overrides: dict[str, dict[str, Any]] | None = None) -> None:
        self.overrides = overrides or {}

    def in_force(self, state: StateView, name: str) -> PolicyInForce:
        if name in self.overrides:
            return PolicyInForce(name, "what-if", self.overrides[name])
        recorded = state.get(POLICY_PROJECTION, name)
        if recorded is not None:
            return PolicyInForce(name, recorded["version"], recorded["parameters"])
        return PolicyInForce(name, 0, validate_parameters(name, {}))


def load_overrides(path: Path) -> dict[str, dict[str, Any]]:
    """Read a what-if policy file: `{"memory": {"usable_fraction": 0.8}, ...}`."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise InputError(f"cannot read policy file {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise InputError(f"policy file {path} is not JSON: {error.msg} at line {error.lineno}") \
            from None
    if not isinstance(raw, dict):
        raise InputError(f"policy file {path} must hold an object of policy name -> parameters")
    return {name: validate_parameters(name, params if isinstance(params, dict) else {"": params})
            for name, params in raw.items()}
