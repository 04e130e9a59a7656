"""Policy parameters: validated defaults, versions set through the log, and what-if overrides."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from controlplane.errors import InputError
from controlplane.files import json_kind, read_json
from controlplane.gateway.parameters import GatewayParameters
from events.projections import StateView


class PolicyParameters(BaseModel):
    """Base of every policy's parameters: strict, immutable, finite."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class MemoryPolicy(PolicyParameters):
    """Parameters of the memory-fit decision."""

    usable_fraction: Annotated[float, Field(strict=True, gt=0, le=1)] = 0.90


class PlacementPolicy(PolicyParameters):
    """Parameters of replica placement."""

    usable_fraction: Annotated[float, Field(strict=True, gt=0, le=1)] = 0.90
    max_tensor_parallel: Annotated[int, Field(strict=True, gt=0, le=64)] = 8


class AdmissionParameters(PolicyParameters):
    """Parameters of request admission; the live-token budget itself comes from ready replicas."""

    # The share of the pool's ready KV capacity that admission may reserve (headroom below 1).
    live_token_budget_fraction: Annotated[float, Field(strict=True, gt=0, le=1)] = 1.0
    max_queued_requests: Annotated[int, Field(strict=True, ge=0, le=1_000_000)] = 64
    max_tokens_per_request: Annotated[int, Field(strict=True, gt=0, le=100_000_000)] = 131_072
    record_ttl_seconds: Annotated[float, Field(strict=True, gt=0, le=31_536_000)] = 3_600.0
    # Settled (shed or released) request records a pool keeps to answer a replayed id; bounded
    # because lowering it makes one decision name every record it forgets.
    max_settled_records: Annotated[int, Field(strict=True, gt=0, le=100_000)] = 10_000


class AutoscalingParameters(PolicyParameters):
    """Parameters of the token-demand autoscaler (spec 1.10)."""

    min_replicas: Annotated[int, Field(strict=True, gt=0, le=10_000)] = 1
    max_replicas: Annotated[int, Field(strict=True, gt=0, le=10_000)] = 8
    service_tokens_per_second_per_replica: Annotated[float, Field(strict=True, gt=0, le=1e9)] = 350.0
    target_utilization: Annotated[float, Field(strict=True, gt=0, le=1)] = 0.75
    queue_drain_seconds: Annotated[float, Field(strict=True, gt=0, le=86_400)] = 30.0
    scale_up_cooldown_seconds: Annotated[float, Field(strict=True, ge=0, le=86_400)] = 60.0
    scale_down_stabilization_seconds: Annotated[float, Field(strict=True, ge=0, le=86_400)] = 300.0
    max_window_observations: Annotated[int, Field(strict=True, gt=0, le=10_000)] = 256

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingParameters:
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas may not be below min_replicas")
        service = self.service_tokens_per_second_per_replica
        if not service * self.target_utilization > 0 or not service * self.queue_drain_seconds > 0:
            raise ValueError("service_tokens_per_second_per_replica is too small: times "
                             "target_utilization or queue_drain_seconds it is no tokens at all")
        return self


class RolloutParameters(PolicyParameters):
    """Default release requirements and canary ladder, used when a rollout declares none."""

    min_sample_count: Annotated[int, Field(strict=True, gt=0, le=1_000_000_000)] = 500
    min_quality_score: Annotated[float, Field(strict=True, ge=0, le=1e6)] = 0.85
    max_quality_drop: Annotated[float, Field(strict=True, ge=0, le=1e6)] = 0.03
    max_p95_ttft_seconds: Annotated[float, Field(strict=True, ge=0, le=3_600)] = 1.0
    max_p95_tpot_seconds: Annotated[float, Field(strict=True, ge=0, le=3_600)] = 0.15
    min_relative_throughput: Annotated[float, Field(strict=True, ge=0, le=1e6)] = 0.95
    max_error_rate: Annotated[float, Field(strict=True, ge=0, le=1e6)] = 0.01
    canary_traffic_percents: Annotated[list[Annotated[float, Field(strict=True, gt=0, lt=100)]],
                                       Field(min_length=1, max_length=20)] = [1.0, 10.0]
    speculation_minimum_speedup: Annotated[float, Field(strict=True, gt=0, le=1_000)] = 1.0
    required_gates: Annotated[list[Literal["quantization", "speculation"]], Field(max_length=2)] = []

    # Rules of one field are that field's validators, so a what-if naming the field is refused
    # before any log is read (`validate_overrides`); only rules across fields wait for it.
    @field_validator("canary_traffic_percents")
    @classmethod
    def _increasing(cls, steps: list[float]) -> list[float]:
        if any(a >= b for a, b in zip(steps, steps[1:], strict=False)):
            raise ValueError("canary_traffic_percents must increase")
        return steps

    @field_validator("required_gates")
    @classmethod
    def _distinct(cls, gates: list[str]) -> list[str]:
        if len(set(gates)) != len(gates):
            raise ValueError("required_gates must not repeat")
        return gates


POLICY_MODELS: dict[str, type[BaseModel]] = {"memory": MemoryPolicy, "placement": PlacementPolicy,
                                             "admission": AdmissionParameters,
                                             "autoscaling": AutoscalingParameters,
                                             "rollout": RolloutParameters,
                                             "gateway": GatewayParameters}
POLICY_PROJECTION = "policy"


@dataclass(frozen=True)
class PolicyInForce:
    """The parameters a decision used, and which version they were."""

    name: str
    version: int | str
    parameters: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "parameters": self.parameters}


def _model(name: str) -> type[BaseModel]:
    model = POLICY_MODELS.get(name)
    if model is None:
        raise InputError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICY_MODELS))}")
    return model


def _problems(name: str, errors: list[Any]) -> str:
    return "; ".join(f"{name}{''.join('.' + str(p) for p in item['loc'])}: {item['msg']}"
                     for item in errors)


def validate_parameters(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """Validate parameters for policy `name`, filling defaults; raises InputError naming fields."""
    try:
        return _model(name).model_validate(parameters).model_dump(mode="json")
    except ValidationError as error:
        raise InputError(f"invalid policy parameters: {_problems(name, error.errors())}") from None


def validate_overrides(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """A what-if's parameters for policy `name`: only those given, each checked as a field of
    the policy (InputError naming it otherwise). Rules across fields (`min_replicas` <=
    `max_replicas`) are checked once they are merged onto the parameters in force
    (`PolicyBook.in_force`), which they may depend on."""
    try:
        dumped = _model(name).model_validate({**orjson.loads(_defaults(name)), **given}) \
            .model_dump(mode="json")
    except ValidationError as error:
        fields = [item for item in error.errors() if item["loc"]]
        if fields:
            raise InputError(f"invalid policy parameters: {_problems(name, fields)}") from None
        return dict(given)  # every field valid as given; only a rule across fields failed
    return {key: dumped[key] for key in given}


class PolicyBook:
    """Resolves the policy in force from state. A what-if (`overrides`) changes only the
    parameters it names: each decision sees the version in force then with those replaced."""

    def __init__(self, overrides: dict[str, dict[str, Any]] | None = None) -> None:
        self.overrides = overrides or {}
        self._merged: dict[tuple[str, int], bytes] = {}

    def after_set(self, name: str, version: int, parameters: dict[str, Any]) -> PolicyInForce:
        """What `in_force` will resolve once version `version` of `name` is recorded."""
        if name in self.overrides:
            return self._what_if(name, version, parameters)
        return PolicyInForce(name, version, parameters)

    def as_recorded(self, name: str, version: int, parameters: dict[str, Any]) -> PolicyInForce:
        """Version `version` of `name` as a decision copied it (`parameters`), for a later
        decision that reads the copy: those parameters, or under a what-if those with the
        what-if's replacing the ones it names (as `in_force` resolves that version)."""
        if name in self.overrides:
            return self._what_if(name, version, parameters)
        return PolicyInForce(name, version, parameters)

    def in_force(self, state: StateView, name: str) -> PolicyInForce:
        recorded = state.get(POLICY_PROJECTION, name)
        if name in self.overrides:
            return self._what_if(name, recorded["version"] if recorded else 0,
                                 recorded["parameters"] if recorded else orjson.loads(_defaults(name)))
        if recorded is not None:
            return PolicyInForce(name, recorded["version"], recorded["parameters"])
        return PolicyInForce(name, 0, orjson.loads(_defaults(name)))

    def _what_if(self, name: str, version: int, parameters: dict[str, Any]) -> PolicyInForce:
        """Version `version`'s parameters with the what-if's replacing those it names; an
        InputError when together they break a rule of the policy (naming the version)."""
        key = (name, version)
        if key not in self._merged:
            try:
                merged = validate_parameters(name, {**parameters, **self.overrides[name]})
            except InputError as error:
                in_force = (f"version {version} in force in the log" if version else
                            f"the defaults in force (the log sets no {name} policy)")
                raise InputError(f"the what-if's {name} parameters do not fit {in_force}: "
                                 f"{error}") from None
            self._merged[key] = orjson.dumps(merged)
        return PolicyInForce(name, "what-if", orjson.loads(self._merged[key]))


@cache
def _defaults(name: str) -> bytes:
    """A policy's default parameters as JSON, validated once: every decision without a
    recorded version reads them, each time as a fresh copy it cannot share with another."""
    return orjson.dumps(validate_parameters(name, {}))


# Policy parameters are a few hundred bytes; a what-if file is read no further than this.
MAX_POLICY_FILE_BYTES = 1_000_000


def load_overrides(path: Path) -> dict[str, dict[str, Any]]:
    """Read a what-if policy file: `{"memory": {"usable_fraction": 0.8}, ...}`; a file that
    cannot be read, or is not UTF-8 JSON of policy parameters, is an InputError naming it."""
    raw = read_json(path, MAX_POLICY_FILE_BYTES, "policy file ")
    if not isinstance(raw, dict):
        raise InputError(f"policy file {path} must hold an object of policy name -> parameters")
    for name, params in raw.items():
        if not isinstance(params, dict):
            _model(name)  # an unknown policy is named as such first
            raise InputError(f"policy file {path}: {name!r} must be an object of parameter -> "
                             f"value, not {json_kind(params)}")
    return {name: validate_overrides(name, params) for name, params in raw.items()}
