"""Who may change the gateway's registries, and what a refused change leaves behind.

Profiles, routes and release bundles serve every tenant: only the operator (the default tenant)
changes them, refused at submit and again at decision. A tenant that was never registered gets
no network policy (and so no half-written tenant row).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane.commands.base import CommandBase
from controlplane.commands.gateway import (
    ConfigureBudget,
    CreateReleaseBundle,
    RegisterProfile,
    RegisterTenant,
    SetNetworkPolicy,
)
from controlplane.decisions import DecisionContext
from controlplane.errors import SubmissionRejected
from controlplane.gateway.scenario import GatewayDriver, dispatch, route
from controlplane.handlers import HANDLERS
from controlplane.policy_book import PolicyBook
from controlplane.state import gateway as gw
from controlplane.state.fold import apply_event
from events.store import EventStore
from tests.cli_helpers import run_cli

FORGED_BY_BETA: list[CommandBase] = [
    route("hc-1", private=True).model_copy(update={"tenant": "beta"}),
    route("sh-1", ready=False).model_copy(update={"tenant": "beta"}),
    RegisterProfile(tenant="beta", profile_id="chat-small-v1", model_id="evil", digest="sha256:evil",
                    approved=True, context_window_tokens=8_192, max_output_tokens=1_024,
                    approved_providers=["unvetted"]),
    CreateReleaseBundle(tenant="beta", release_id="rel-self-approved", profile_id="chat-small-v1",
                        gate_status="approved"),
]
FORGED_IDS = ["route_private", "route_not_ready", "profile", "release_bundle"]


def registries(gateway: GatewayDriver) -> dict[str, object]:
    return {f"{kind}/{key}": gateway.projection(gw.REGISTRIES[kind], key)
            for kind, key in (("route", "hc-1"), ("route", "sh-1"), ("profile", "chat-small-v1"),
                              ("release", "rel-self-approved"))}


def rejection_code(gateway: GatewayDriver, command: CommandBase) -> str | None:
    decided = [e for e in gateway.store.events_for_command(command.command_id)
               if e.event_type == "CommandRejected"]
    return decided[0].data["reasons"][0]["code"] if decided else None


@pytest.mark.parametrize("command", FORGED_BY_BETA, ids=FORGED_IDS)
def test_a_tenant_cannot_change_the_operators_routes_profiles_or_release_bundles(
        gateway: GatewayDriver, command: CommandBase) -> None:
    head, before = gateway.store.head(), registries(gateway)
    with pytest.raises(SubmissionRejected) as refused:
        gateway.run(command)
    assert [(p.line, p.field) for p in refused.value.problems] == [(1, "tenant")]
    assert gateway.store.head() == head and registries(gateway) == before
    served = gateway.send(dispatch("alice", "k-private"))
    assert (served["outcome"], served["route_id"]) == ("completed", "sh-1")
    assert gateway.calls("hc-1") == 0


@pytest.mark.parametrize("command", FORGED_BY_BETA, ids=FORGED_IDS)
def test_a_tenants_change_to_the_operators_registries_is_rejected_when_decided(
        gateway: GatewayDriver, command: CommandBase) -> None:
    """Decided without the submit check (as a command accepted before it existed would be)."""
    before = registries(gateway)
    with gateway.store.transaction() as tx:
        ctx = DecisionContext(tx.projections, tx.head_position, tx.stream_version, PolicyBook(), None)
        for event in tx.append(HANDLERS[command.command_type](command, ctx)):
            apply_event(tx.projections, event)
    assert rejection_code(gateway, command) == "operator_only"
    assert registries(gateway) == before


def test_the_operator_still_changes_its_routes(gateway: GatewayDriver) -> None:
    gateway.run(route("sh-1", ready=False))
    assert gateway.projection(gw.REGISTRIES["route"], "sh-1")["ready"] is False  # type: ignore[index]


def test_a_network_policy_for_a_tenant_whose_registration_was_refused_is_refused(
        gateway: GatewayDriver) -> None:
    register = RegisterTenant(tenant="b", network_policy="hosted_allowed", budget_id="b1")
    set_policy = SetNetworkPolicy(tenant="b", network_policy="private_only")
    # One submission: b's registration passes submit (b1 is unknown until decided) and is
    # rejected when decided (b1 is a's, unshared), so the policy is decided for no tenant.
    gateway.run(ConfigureBudget(tenant="a", budget_id="b1", limit_units=1_000), register, set_policy)
    assert rejection_code(gateway, register) == "budget_not_shared"
    assert rejection_code(gateway, set_policy) == "tenant_not_registered"
    assert gateway.projection(gw.REGISTRIES["tenant"], "b") is None


def test_a_profile_that_leaves_no_room_in_its_context_window_exits_2_naming_the_field(
        store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    profile = {"type": "RegisterProfile", "profile_id": "tiny", "model_id": "tiny",
               "digest": "sha256:tiny", "approved": True, "context_window_tokens": 100,
               "max_output_tokens": 5_000, "input_limit_tokens": 9_000}
    source = tmp_path / "profile.jsonl"
    source.write_text(json.dumps(profile))
    head = store.head()
    result = run_cli("submit", str(source))
    assert result.exit_code == 2
    assert "line 1: max_output_tokens" in result.stderr
    assert "line 1: input_limit_tokens" in result.stderr
    assert store.head() == head
