"""A budget is changed only by the tenant that created it; another tenant attaches to it only when
the owner lists it in `shared_with` (the operator's budgets are open to all), and an attached sharer
cannot be unlisted. Refused at submit when the log already shows it, else decided as a rejection."""

from __future__ import annotations

import pytest

from controlplane.commands.base import CommandBase
from controlplane.commands.gateway import ConfigureBudget, RegisterTenant
from controlplane.errors import SubmissionRejected
from controlplane.gateway.scenario import GatewayDriver, dispatch
from controlplane.state import gateway as gw


def refused_at_submit(gateway: GatewayDriver, command: CommandBase) -> list[str]:
    head = gateway.store.head()
    with pytest.raises(SubmissionRejected) as refused:
        gateway.run(command)
    assert gateway.store.head() == head
    return [problem.field for problem in refused.value.problems]


def rejection_code(gateway: GatewayDriver, command: CommandBase) -> str | None:
    decided = [e for e in gateway.store.events_for_command(command.command_id)
               if e.event_type == "CommandRejected"]
    return decided[0].data["reasons"][0]["code"] if decided else None


def test_another_tenant_cannot_change_a_budget_even_within_the_creating_submission(
        gateway: GatewayDriver) -> None:
    create = ConfigureBudget(tenant="acme", budget_id="acme-only", limit_units=1_000)
    hijack = ConfigureBudget(tenant="beta", budget_id="acme-only", limit_units=0)
    gateway.run(create, hijack)  # the submit-time check cannot see the budget yet: the decision can
    assert rejection_code(gateway, hijack) == "budget_tenant_mismatch"
    assert refused_at_submit(gateway, ConfigureBudget(tenant="beta", budget_id="acme-only",
                                                      limit_units=0)) == ["budget_id"]
    assert gateway.budget("acme-only")["limit_units"] == 1_000


def test_a_tenant_cannot_change_the_operators_budget(gateway: GatewayDriver) -> None:
    assert refused_at_submit(gateway, ConfigureBudget(tenant="acme", budget_id="shared-1",
                                                      limit_units=0)) == ["budget_id"]
    assert gateway.budget()["limit_units"] == 10_000


def test_a_tenant_cannot_attach_to_a_budget_its_owner_has_not_shared(gateway: GatewayDriver) -> None:
    create = ConfigureBudget(tenant="acme", budget_id="acme-only", limit_units=1_000)
    attach = RegisterTenant(tenant="beta", network_policy="hosted_allowed", budget_id="acme-only")
    gateway.run(create, attach)
    assert rejection_code(gateway, attach) == "budget_not_shared"
    assert refused_at_submit(gateway, RegisterTenant(tenant="beta", network_policy="hosted_allowed",
                                                     budget_id="acme-only")) == ["budget_id"]
    assert gateway.projection(gw.REGISTRIES["tenant"], "beta")["budget_id"] == "shared-1"  # type: ignore[index]


def test_a_listed_sharer_draws_on_the_owners_budget_and_cannot_be_unlisted_while_attached(
        gateway: GatewayDriver) -> None:
    gateway.run(ConfigureBudget(tenant="acme", budget_id="acme-pool", limit_units=5_000,
                                shared_with=["beta"]),
                RegisterTenant(tenant="acme", network_policy="private_only", budget_id="acme-pool"),
                RegisterTenant(tenant="beta", network_policy="hosted_allowed", budget_id="acme-pool"))
    assert gateway.send(dispatch("alice", "k-a"))["outcome"] == "completed"
    assert gateway.send(dispatch("carol", "k-b"))["outcome"] == "completed"
    assert gateway.budget("acme-pool")["committed_units"] == 2 * 356
    assert refused_at_submit(gateway, ConfigureBudget(tenant="acme", budget_id="acme-pool",
                                                      limit_units=5_000)) == ["shared_with"]
    # Once beta moves to another budget, the owner may stop sharing.
    gateway.run(RegisterTenant(tenant="beta", network_policy="hosted_allowed", budget_id="shared-1"))
    gateway.run(ConfigureBudget(tenant="acme", budget_id="acme-pool", limit_units=4_000))
    assert gateway.budget("acme-pool")["limit_units"] == 4_000
