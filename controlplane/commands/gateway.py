"""Inference gateway commands: its registries (tenants, principals, evidence, releases, profiles,
routes, budgets), `Dispatch` and `ReconcileOperation` (gateway spec).

`tenant` on every command is the tenant it acts for: the owner of a principal, source or pointer,
the caller's claimed tenant on `Dispatch`. Tenant names and idempotency keys exclude "/", so the
stream `operation/<tenant>/<key>` names exactly one (tenant, key). Their value types (names,
keys, pricing and its bounds) are in `controlplane.commands.gateway_specs`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool, ValidationInfo, field_validator, model_validator

from controlplane.commands.base import (
    MAX_TOKENS,
    CommandBase,
    Name,
)
from controlplane.commands.gateway_specs import (
    MAX_INPUT_CHARACTERS,
    Capability,
    Digest,
    GpuPlanSpec,
    IdempotencyKey,
    NetworkPolicyName,
    ServingEconomicsSpec,
    SourceRefSpec,
    TenantName,
    TokenPricesSpec,
    Tokens,
    Units,
)
from controlplane.commands.memory import ModelMemorySpec

# The tenant of a command that names none: the operator's scope (global routes, releases, budgets).
OPERATOR_TENANT: str = CommandBase.model_fields["tenant"].default


def _unique(values: list[str], field: str) -> list[str]:
    if len(set(values)) != len(values):
        raise ValueError(f"{field} lists a value twice")
    return values


class _TenantCommand(CommandBase):
    tenant: TenantName = "default"


class RegisterTenant(_TenantCommand):
    """Register (or re-register) `tenant` with its network policy and shared budget."""

    type: Literal["RegisterTenant"] = "RegisterTenant"
    network_policy: NetworkPolicyName
    budget_id: Name
    allowed_capabilities: Annotated[list[Capability], Field(max_length=64)] | None = None

    def references(self) -> list[tuple[str, str]]:
        return [("budget_id", f"budget/{self.budget_id}")]

    def creates(self) -> list[str]:
        return [f"tenant/{self.tenant}"]


class SetNetworkPolicy(_TenantCommand):
    type: Literal["SetNetworkPolicy"] = "SetNetworkPolicy"
    network_policy: NetworkPolicyName

    def references(self) -> list[tuple[str, str]]:
        return [("tenant", f"tenant/{self.tenant}")]


class RegisterPrincipal(_TenantCommand):
    type: Literal["RegisterPrincipal"] = "RegisterPrincipal"
    principal_id: Name

    def references(self) -> list[tuple[str, str]]:
        return [("tenant", f"tenant/{self.tenant}")]

    def creates(self) -> list[str]:
        return [f"principal/{self.principal_id}"]


class RevokePrincipal(_TenantCommand):
    type: Literal["RevokePrincipal"] = "RevokePrincipal"
    principal_id: Name

    def references(self) -> list[tuple[str, str]]:
        return [("principal_id", f"principal/{self.principal_id}")]


class RestorePrincipal(_TenantCommand):
    """Make a revoked principal active again: registering it again does not."""

    type: Literal["RestorePrincipal"] = "RestorePrincipal"
    principal_id: Name

    def references(self) -> list[tuple[str, str]]:
        return [("principal_id", f"principal/{self.principal_id}")]


class RegisterSource(_TenantCommand):
    """Register an evidence source owned by `tenant`, or publish its new version."""

    type: Literal["RegisterSource"] = "RegisterSource"
    source_ref: Name
    version: Annotated[int, Field(strict=True, gt=0, le=10**9)]
    readers: Annotated[list[Name], Field(max_length=1_000)] = []

    def references(self) -> list[tuple[str, str]]:
        return [("tenant", f"tenant/{self.tenant}")]

    def creates(self) -> list[str]:
        return [f"source/{self.source_ref}"]


class RevokeSource(_TenantCommand):
    type: Literal["RevokeSource"] = "RevokeSource"
    source_ref: Name

    def references(self) -> list[tuple[str, str]]:
        return [("source_ref", f"source/{self.source_ref}")]


class RestoreSource(_TenantCommand):
    type: Literal["RestoreSource"] = "RestoreSource"
    source_ref: Name

    def references(self) -> list[tuple[str, str]]:
        return [("source_ref", f"source/{self.source_ref}")]


class RegisterProfile(CommandBase):
    """Register (or replace) a profile in the trusted registry.

    Its output maximum and input limit each leave at least one token of the context window to the
    other, so some request can fit (the input limit defaults to the window minus one, spec §5.1).
    `token_counting` is how its requests' input tokens are counted
    (`controlplane.policies.gateway.TokenCounting`): the spec's whitespace words by default, or
    `utf8_bytes`, an upper bound no input's text can undercut.
    """

    type: Literal["RegisterProfile"] = "RegisterProfile"
    OMITTED_AT_DEFAULT = ("token_counting",)
    profile_id: Name
    model_id: Name
    digest: Digest
    approved: StrictBool
    context_window_tokens: Tokens
    max_output_tokens: Tokens
    input_limit_tokens: Tokens | None = None
    capabilities: Annotated[list[Capability], Field(max_length=64)] = ["text"]
    approved_providers: Annotated[list[Name], Field(max_length=64)] = []
    memory: ModelMemorySpec | None = None
    token_counting: Literal["whitespace_words", "utf8_bytes"] = "whitespace_words"

    @field_validator("capabilities", "approved_providers")
    @classmethod
    def _no_repeats(cls, values: list[str]) -> list[str]:
        return _unique(values, "the list")

    @field_validator("max_output_tokens", "input_limit_tokens")
    @classmethod
    def _within_context_window(cls, tokens: int | None, info: ValidationInfo) -> int | None:
        window = info.data.get("context_window_tokens")  # absent when itself invalid
        if tokens is not None and window is not None and tokens >= window:
            raise ValueError(f"must be below context_window_tokens ({window}), leaving room for "
                             "the rest of a request")
        return tokens

    def creates(self) -> list[str]:
        return [f"profile/{self.profile_id}"]


class ConfigureRoute(CommandBase):
    """Create or replace a route: a hosted provider, or self-hosted on a named fleet pool.

    A self-hosted route also needs its `gpu_plan`, the memory its profiles' fit is proven
    against: refused at submit without one (`gpu_plan_required`, a precheck rather than a
    validator here, so routes recorded before that rule still parse when replayed).
    """

    type: Literal["ConfigureRoute"] = "ConfigureRoute"
    route_id: Name
    adapter_kind: Literal["hosted", "self_hosted"]
    provider: Name
    private: StrictBool
    approved: StrictBool
    ready: StrictBool
    compatible_profiles: Annotated[list[Name], Field(max_length=1_000)] = []
    pool: Name | None = None
    gpu_plan: GpuPlanSpec | None = None
    prices: TokenPricesSpec | None = None
    economics: ServingEconomicsSpec | None = None

    @model_validator(mode="after")
    def _pool_matches_kind(self) -> ConfigureRoute:
        if self.adapter_kind == "self_hosted" and self.pool is None:
            raise ValueError("a self_hosted route needs the fleet pool it runs on")
        if self.adapter_kind == "hosted" and (self.pool is not None or self.gpu_plan is not None):
            raise ValueError("a hosted route has no fleet pool or GPU plan")
        return self

    def creates(self) -> list[str]:
        return [f"route/{self.route_id}"]


class CreateReleaseBundle(CommandBase):
    """Create an immutable release bundle with its gate verdict."""

    type: Literal["CreateReleaseBundle"] = "CreateReleaseBundle"
    release_id: Name
    profile_id: Name
    profile_digest: Digest | None = None
    source_refs: Annotated[list[SourceRefSpec], Field(max_length=1_000)] = []
    gate_status: Literal["approved", "rejected", "pending"]

    def creates(self) -> list[str]:
        return [f"release/{self.release_id}"]


class MoveReleasePointer(_TenantCommand):
    """Point `tenant`'s pointer at a release; `expected_version` makes the move compare-and-set."""

    type: Literal["MoveReleasePointer"] = "MoveReleasePointer"
    pointer_name: Name
    release_id: Name
    expected_version: Annotated[int, Field(strict=True, ge=0)] | None = None

    def references(self) -> list[tuple[str, str]]:
        return [("release_id", f"release/{self.release_id}")]

    def creates(self) -> list[str]:
        return [f"release-pointer/{self.pointer_name}"]


class ConfigureBudget(_TenantCommand):
    """Create a budget owned by `tenant`, or (its owner only) change its limit and sharers.

    Tenants other than the owner may attach to it (`RegisterTenant`) only when listed in
    `shared_with`; a budget the operator creates (the default tenant) is open to every tenant,
    as the operator's routes and releases are. A sharer still attached cannot be unlisted.
    """

    type: Literal["ConfigureBudget"] = "ConfigureBudget"
    budget_id: Name
    limit_units: Units
    shared_with: Annotated[list[TenantName], Field(max_length=1_000)] = []

    @field_validator("shared_with")
    @classmethod
    def _no_repeats(cls, values: list[str]) -> list[str]:
        return _unique(values, "shared_with")

    def creates(self) -> list[str]:
        return [f"budget/{self.budget_id}"]


class Dispatch(_TenantCommand):
    """Serve one inference request as a durable operation keyed by (tenant, idempotency_key)."""

    type: Literal["Dispatch"] = "Dispatch"
    principal_id: Name
    idempotency_key: IdempotencyKey
    pointer_name: Name
    input: Annotated[str, Field(min_length=1, max_length=MAX_INPUT_CHARACTERS)]
    max_output_tokens: Tokens | None = None
    capabilities_requested: Annotated[list[Capability], Field(max_length=64)] = []
    network_preference: Literal["private", "hosted"] | None = None
    source_refs: Annotated[list[SourceRefSpec], Field(max_length=1_000)] = []

    @field_validator("capabilities_requested")
    @classmethod
    def _no_repeats(cls, values: list[str]) -> list[str]:
        return _unique(values, "capabilities_requested")


class ReconcileOperation(_TenantCommand):
    """Settle an unknown outcome from out-of-band evidence; never calls a provider."""

    type: Literal["ReconcileOperation"] = "ReconcileOperation"
    idempotency_key: IdempotencyKey
    resolution: Literal["completed", "not_processed"]
    evidence_ref: Name
    answer_text: Annotated[str, Field(min_length=1, max_length=MAX_INPUT_CHARACTERS)] | None = None
    output_tokens: Annotated[int, Field(strict=True, ge=0, le=MAX_TOKENS)] | None = None
    note: Annotated[str, Field(max_length=500)] = ""

    @model_validator(mode="after")
    def _answer_matches_resolution(self) -> ReconcileOperation:
        completed = self.resolution == "completed"
        if completed and (self.answer_text is None or self.output_tokens is None):
            raise ValueError("a completed resolution needs the provider's answer_text and output_tokens")
        if not completed and (self.answer_text is not None or self.output_tokens is not None):
            raise ValueError("a not_processed resolution carries no answer")
        return self


COMMANDS: list[type[CommandBase]] = [
    RegisterTenant, SetNetworkPolicy, RegisterPrincipal, RevokePrincipal, RestorePrincipal,
    RegisterSource,
    RevokeSource, RestoreSource, RegisterProfile, ConfigureRoute, CreateReleaseBundle,
    MoveReleasePointer, ConfigureBudget, Dispatch, ReconcileOperation,
]
