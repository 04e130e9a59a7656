"""The shared budget guard: reserve before any transport, settle or release after (spec §8).

A budget is plain state (`BudgetState`); every movement is a pure function returning the new state,
so the control plane records before/after figures and its projection only copies them. Invariant:
a reservation never takes committed + reserved above the limit. Who may change a budget and who may
draw on it is `BudgetAccess`: only its owner changes it; a tenant attaches only if it may.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from controlplane.policies.gateway import Step, StepVerdict, allow, deny
from controlplane.policies.reasons import Reason, require


@dataclass(frozen=True)
class BudgetState:
    """A budget's figures in tokens (input plus maximum output, spec §8 Q3)."""

    budget_id: str
    limit_units: int
    reserved_units: int = 0
    committed_units: int = 0

    @property
    def available_units(self) -> int:
        return self.limit_units - self.reserved_units - self.committed_units


@dataclass(frozen=True)
class BudgetMovement:
    """One change to a budget: what moved, and the figures before and after."""

    outcome: str
    grant_units: int
    committed_units: int
    released_units: int
    before: BudgetState
    after: BudgetState
    reasons: tuple[Reason, ...]


@dataclass(frozen=True)
class BudgetAccess:
    """A budget's owner and sharers; `open_to_every_tenant` for the operator's budgets."""

    budget_id: str
    owner_tenant: str
    shared_with: frozenset[str] = frozenset()
    open_to_every_tenant: bool = False

    def may_change(self, tenant_id: str) -> bool:
        """Only the tenant that created the budget changes its limit or sharers."""
        return tenant_id == self.owner_tenant

    def may_attach(self, tenant_id: str) -> bool:
        """The owner, a listed sharer, or anyone for an operator's budget may draw on it."""
        return self.open_to_every_tenant or tenant_id == self.owner_tenant or tenant_id in self.shared_with

    def unshared(self, attached_tenants: frozenset[str], shared_with: frozenset[str]) -> list[str]:
        """Tenants drawing on the budget that a new sharer list `shared_with` would lock out."""
        if self.open_to_every_tenant:
            return []
        return sorted(attached_tenants - shared_with - {self.owner_tenant})


def _check_units(value: int, name: str) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
            "units_not_a_count", name, f"{name} must be a non-negative integer")


def reserve(budget: BudgetState | None, units: int) -> tuple[StepVerdict, BudgetState | None]:
    """Reserve `units` if committed + reserved + units stays within the limit; else deny, unchanged."""
    _check_units(units, "units")
    if budget is None:
        return deny(Step.RESERVE, [Reason("budget_not_configured", "the tenant has no budget",
                                          {"units": units})]), None
    facts = {"budget_id": budget.budget_id, "units": units, "limit_units": budget.limit_units,
             "reserved_units": budget.reserved_units, "committed_units": budget.committed_units,
             "available_units": budget.available_units}
    if units > budget.available_units:
        return deny(Step.RESERVE, [Reason("quota_exceeded", "the shared budget cannot cover the request",
                                          facts)]), budget
    after = replace(budget, reserved_units=budget.reserved_units + units)
    return allow(Step.RESERVE, "budget_reserved", "the grant was reserved before any transport",
                 **facts), after


def settle(budget: BudgetState, grant_units: int, used_units: int) -> BudgetMovement:
    """Commit what the provider used and release the rest of the grant.

    Usage above the grant is committed in full and flagged: the work was done and billed, so
    hiding it would understate spend.
    """
    _check_units(grant_units, "grant_units")
    _check_units(used_units, "used_units")
    require(grant_units <= budget.reserved_units, "grant_exceeds_reserved", "grant_units",
            "the grant is larger than what the budget holds reserved")
    released = max(0, grant_units - used_units)
    after = replace(budget, reserved_units=budget.reserved_units - grant_units,
                    committed_units=budget.committed_units + used_units)
    reasons = [Reason("grant_settled", "the grant was committed to actual usage",
                      {"grant_units": grant_units, "used_units": used_units,
                       "released_units": released})]
    if used_units > grant_units:
        reasons.append(Reason("usage_exceeded_grant", "the provider reported more than was reserved",
                              {"grant_units": grant_units, "used_units": used_units}))
    return BudgetMovement("settled", grant_units, used_units, released, budget, after, tuple(reasons))


def release(budget: BudgetState, grant_units: int, code: str = "grant_released") -> BudgetMovement:
    """Return the whole grant: only for work that definitely never happened."""
    _check_units(grant_units, "grant_units")
    require(grant_units <= budget.reserved_units, "grant_exceeds_reserved", "grant_units",
            "the grant is larger than what the budget holds reserved")
    after = replace(budget, reserved_units=budget.reserved_units - grant_units)
    return BudgetMovement("released", grant_units, 0, grant_units, budget, after,
                          (Reason(code, "the grant was released", {"grant_units": grant_units}),))


def reconfigure(budget: BudgetState | None, budget_id: str, limit_units: int) -> BudgetState:
    """A new limit; reservations and commitments already made are kept."""
    _check_units(limit_units, "limit_units")
    if budget is None:
        return BudgetState(budget_id, limit_units)
    return replace(budget, limit_units=limit_units)
