"""Only a budget's owner changes it; a tenant draws on it only as its owner, a listed sharer, or on
an operator's budget; unsharing never strands an attached tenant."""

from __future__ import annotations

from controlplane.policies.gateway_budget import BudgetAccess

OWNED = BudgetAccess("acme-pool", "acme", frozenset({"beta"}))
OPERATORS = BudgetAccess("shared-1", "default", open_to_every_tenant=True)


def test_only_the_owner_may_change_a_budget_even_an_open_one() -> None:
    assert OWNED.may_change("acme") and not OWNED.may_change("beta")
    assert OPERATORS.may_change("default") and not OPERATORS.may_change("acme")


def test_a_tenant_attaches_only_as_owner_listed_sharer_or_to_an_operators_budget() -> None:
    assert [OWNED.may_attach(t) for t in ("acme", "beta", "gamma")] == [True, True, False]
    assert OPERATORS.may_attach("gamma")


def test_unsharing_names_the_attached_tenants_it_would_lock_out_but_never_the_owner() -> None:
    attached = frozenset({"acme", "beta"})
    assert OWNED.unshared(attached, frozenset()) == ["beta"]
    assert OWNED.unshared(attached, frozenset({"beta"})) == []
    assert OPERATORS.unshared(attached, frozenset()) == []
