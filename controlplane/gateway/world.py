"""Read the gateway's folded state into the policies' frozen inputs.

The same functions serve the live decision and its re-derivation, so both see identical inputs.
"""

from __future__ import annotations

from typing import Any

from controlplane.policies.gateway import (
    AdapterKind,
    GateStatus,
    GpuPlan,
    NetworkPolicy,
    Principal,
    Profile,
    ReleaseBundle,
    ReleasePointer,
    Route,
    Source,
    SourceRef,
    Tenant,
    TokenCounting,
)
from controlplane.policies.gateway_admission import GatewayView
from controlplane.policies.gateway_budget import BudgetAccess, BudgetState
from controlplane.policies.gateway_worksheet import ServingEconomics, TokenPrices
from controlplane.policies.memory import ModelMemory
from controlplane.state.gateway import BUDGET_ACCESS, BUDGETS, REGISTRIES
from events.projections import StateView


def refs_of(items: list[dict[str, Any]]) -> tuple[SourceRef, ...]:
    return tuple(SourceRef(item["source_ref"], item["version"]) for item in items)


def tenant_of(state: StateView, tenant_id: str) -> Tenant | None:
    """The registered tenant, or None (also for a row without a budget, as older logs may hold)."""
    row = state.get(REGISTRIES["tenant"], tenant_id)
    if row is None or "budget_id" not in row:
        return None
    allowed = row.get("allowed_capabilities")
    return Tenant(tenant_id, NetworkPolicy(row["network_policy"]), row["budget_id"],
                  frozenset(allowed) if allowed is not None else None)


def principal_of(state: StateView, principal_id: str) -> Principal | None:
    row = state.get(REGISTRIES["principal"], principal_id)
    return Principal(principal_id, row["tenant_id"], row["active"]) if row else None


def sources_of(state: StateView) -> dict[str, Source]:
    return {ref: Source(ref, row["tenant_id"], row["current_version"], row["active"],
                        frozenset(row["readers"]))
            for ref, row in state.items(REGISTRIES["source"])}


def bundle_of(state: StateView, release_id: str) -> ReleaseBundle | None:
    row = state.get(REGISTRIES["release"], release_id)
    if row is None:
        return None
    return ReleaseBundle(release_id, row["profile_id"], GateStatus(row["gate_status"]),
                         refs_of(row["source_refs"]), row["profile_digest"])


def pointer_of(state: StateView, pointer_name: str) -> ReleasePointer | None:
    row = state.get(REGISTRIES["release-pointer"], pointer_name)
    if row is None:
        return None
    return ReleasePointer(pointer_name, row["tenant_id"], row["release_id"], row["version"])


def _profile(profile_id: str, row: dict[str, Any]) -> Profile:
    memory = row.get("memory")
    return Profile(
        profile_id=profile_id, model_id=row["model_id"], digest=row["digest"],
        approved=row["approved"], context_window_tokens=row["context_window_tokens"],
        max_output_tokens=row["max_output_tokens"], capabilities=frozenset(row["capabilities"]),
        approved_providers=frozenset(row["approved_providers"]),
        input_limit_tokens=row.get("input_limit_tokens"),
        memory=ModelMemory(**memory) if memory else None,
        # A profile recorded before counting rules existed counts as it always did.
        token_counting=TokenCounting(row.get("token_counting", TokenCounting.WHITESPACE_WORDS)))


def profiles_of(state: StateView) -> dict[str, Profile]:
    return {profile_id: _profile(profile_id, row)
            for profile_id, row in state.items(REGISTRIES["profile"])}


def profile_of(state: StateView, profile_id: str) -> dict[str, Profile]:
    """The registered profile `profile_id` alone, keyed as `profiles_of` keys every one."""
    row = state.get(REGISTRIES["profile"], profile_id)
    return {profile_id: _profile(profile_id, row)} if row is not None else {}


def _route(route_id: str, row: dict[str, Any]) -> Route:
    plan = row.get("gpu_plan")
    prices, economics = route_pricing(row)
    return Route(
        route_id=route_id, adapter_kind=AdapterKind(row["adapter_kind"]),
        provider=row["provider"], private=row["private"], approved=row["approved"],
        ready=row["ready"], compatible_profiles=frozenset(row["compatible_profiles"]),
        pool=row.get("pool"), gpu_plan=GpuPlan(**plan) if plan else None,
        prices=prices, economics=economics)


def routes_of(state: StateView) -> tuple[Route, ...]:
    return tuple(_route(route_id, row) for route_id, row in state.items(REGISTRIES["route"]))


def route_of(state: StateView, route_id: str) -> Route | None:
    row = state.get(REGISTRIES["route"], route_id)
    return _route(route_id, row) if row is not None else None


def route_pricing(row: dict[str, Any]) -> tuple[TokenPrices | None, ServingEconomics | None]:
    """A route record's tariff and serving economics, whichever it has."""
    prices, economics = row.get("prices"), row.get("economics")
    return (TokenPrices(**prices) if prices else None,
            ServingEconomics(**economics) if economics else None)


def budget_of(state: StateView, budget_id: str) -> BudgetState | None:
    row = state.get(BUDGETS, budget_id)
    if row is None:
        return None
    return BudgetState(budget_id, row["limit_units"], row["reserved_units"], row["committed_units"])


def budget_access_of(state: StateView, budget_id: str) -> BudgetAccess | None:
    row = state.get(BUDGET_ACCESS, budget_id)
    if row is None:
        return None
    return BudgetAccess(budget_id, row["owner_tenant"], frozenset(row["shared_with"]),
                        row["open_to_every_tenant"])


def tenants_drawing_on(state: StateView, budget_id: str) -> frozenset[str]:
    """The registered tenants attached to `budget_id`."""
    return frozenset(tenant_id for tenant_id, row in state.items(REGISTRIES["tenant"])
                     if row.get("budget_id") == budget_id)


def gateway_view(state: StateView, tenant_id: str, principal_id: str, pointer_name: str) -> GatewayView:
    """Everything admission of one request reads."""
    tenant = tenant_of(state, tenant_id)
    pointer = pointer_of(state, pointer_name)
    return GatewayView(
        tenant=tenant, principal=principal_of(state, principal_id), pointer=pointer,
        bundle=bundle_of(state, pointer.release_id) if pointer is not None else None,
        sources=sources_of(state), profiles=profiles_of(state), routes=routes_of(state),
        budget=budget_of(state, tenant.budget_id) if tenant is not None else None)


def cause_ids(state: StateView, keys: list[tuple[str, str]]) -> list[str]:
    """The event ids that last set each (projection, key): what a decision depended on."""
    ids = []
    for name, key in keys:
        row = state.get(name, key)
        if row is not None and row.get("event_id"):
            ids.append(str(row["event_id"]))
    return ids
