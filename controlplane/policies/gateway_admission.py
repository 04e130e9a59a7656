"""Admission of a new operation: steps 1 to 4 in order, ending in a dispatch plan or one denial.

Guarantee (spec G1, G5): a plan exists only when authorise, select, bound and reserve all allowed;
a denial stops at the first failing step, names it, and carries that step's failing gates. The
release pointer is resolved before evidence is authorised because the bundle's refs are the
original evidence (spec §5.1 step 3). Reserve first prices the grant on the chosen route: a route
whose worst-case cost is not a finite number is denied there, so no provider is ever called for
work whose cost could not be recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.policies.gateway import (
    AdapterKind,
    DispatchRequest,
    NetworkPolicy,
    Principal,
    Profile,
    ReleaseBundle,
    ReleasePointer,
    Route,
    Source,
    SourceRef,
    Step,
    StepVerdict,
    Tenant,
    deny,
)
from controlplane.policies.gateway_authorise import (
    authorise_evidence,
    authorise_identity,
    evidence_set,
)
from controlplane.policies.gateway_bound import Bounds, bound_request
from controlplane.policies.gateway_budget import BudgetState, reserve
from controlplane.policies.gateway_select import (
    effective_network_policy,
    resolve_release,
    select_route,
)
from controlplane.policies.gateway_worksheet import request_cost
from controlplane.policies.reasons import PolicyInputError, Reason


@dataclass(frozen=True)
class GatewayView:
    """The state admission reads, as of one log position."""

    tenant: Tenant | None
    principal: Principal | None
    pointer: ReleasePointer | None
    bundle: ReleaseBundle | None
    sources: Mapping[str, Source]
    profiles: Mapping[str, Profile]
    routes: tuple[Route, ...]
    budget: BudgetState | None


@dataclass(frozen=True)
class DispatchPlan:
    """Everything pinned at admission: it never changes after dispatch (spec §13.8)."""

    release_id: str
    profile_id: str
    model_id: str
    route_id: str
    adapter_kind: AdapterKind
    provider: str
    pool: str | None
    network_policy: NetworkPolicy
    evidence: tuple[SourceRef, ...]
    input_tokens: int
    max_output_tokens: int
    grant_units: int
    budget_id: str


@dataclass(frozen=True)
class Admission:
    """`admitted` with a plan and the budget after reservation, or `denied` at one step."""

    outcome: str
    steps: tuple[StepVerdict, ...]
    reasons: tuple[Reason, ...]
    plan: DispatchPlan | None = None
    budget_after: BudgetState | None = None

    @property
    def denial(self) -> StepVerdict | None:
        return next((step for step in self.steps if not step.allowed), None)


def _denied(steps: list[StepVerdict]) -> Admission:
    return Admission("denied", tuple(steps), steps[-1].reasons)


def unpriceable(route: Route, bounds: Bounds) -> StepVerdict | None:
    """A reserve denial when the route cannot price the grant's worst case finitely; else None."""
    try:
        request_cost(route.prices, route.economics, bounds.input_tokens, bounds.max_output_tokens)
    except PolicyInputError as error:
        return deny(Step.RESERVE, [Reason(error.code, error.message, {
            "field": error.field, "route_id": route.route_id, "input_tokens": bounds.input_tokens,
            "max_output_tokens": bounds.max_output_tokens})])
    return None


def admit(request: DispatchRequest, view: GatewayView) -> Admission:
    """Run authorise, select, bound and reserve for a new operation, stopping at the first denial."""
    steps = [authorise_identity(request.tenant_id, request.principal_id, view.principal, view.tenant)]
    if not steps[-1].allowed:
        return _denied(steps)
    assert view.principal is not None and view.tenant is not None
    steps.append(resolve_release(request.tenant_id, request.pointer_name, view.pointer, view.bundle))
    if not steps[-1].allowed:
        return _denied(steps)
    assert view.bundle is not None
    evidence = evidence_set(view.bundle.source_refs, request.source_refs)
    steps.append(authorise_evidence(view.principal, evidence, view.sources, request.source_refs))
    if not steps[-1].allowed:
        return _denied(steps)
    # A downgrade request is denied in Bound; selection meanwhile honours the stricter policy.
    policy = effective_network_policy(view.tenant.network_policy, request.network_preference)
    selection = select_route(view.bundle, view.profiles, view.routes, policy)
    steps.append(selection.verdict)
    if not steps[-1].allowed:
        return _denied(steps)
    assert selection.profile is not None and selection.route is not None
    bounds = bound_request(request, selection.profile, view.tenant)
    steps.append(bounds.verdict)
    if not steps[-1].allowed:
        return _denied(steps)
    route, profile = selection.route, selection.profile
    unpriced = unpriceable(route, bounds)
    if unpriced is not None:
        return _denied([*steps, unpriced])
    verdict, after = reserve(view.budget, bounds.grant_units)
    steps.append(verdict)
    if not verdict.allowed:
        return _denied(steps)
    plan = DispatchPlan(
        release_id=view.bundle.release_id, profile_id=profile.profile_id, model_id=profile.model_id,
        route_id=route.route_id, adapter_kind=route.adapter_kind, provider=route.provider,
        pool=route.pool, network_policy=bounds.network_policy, evidence=evidence,
        input_tokens=bounds.input_tokens, max_output_tokens=bounds.max_output_tokens,
        grant_units=bounds.grant_units, budget_id=view.tenant.budget_id)
    reasons = tuple(reason for step in steps for reason in step.reasons)
    return Admission("admitted", tuple(steps), reasons, plan, after)


def step_summary(steps: tuple[StepVerdict, ...]) -> list[dict[str, object]]:
    """Each evaluated step as plain data: step, outcome and reason codes."""
    return [{"step": s.step.value, "outcome": s.outcome, "codes": [r.code for r in s.reasons]}
            for s in steps]

