"""A batch's operations are marked dispatching one at a time, just before each call; those a
worker never reached stay reserved, never sent, and are resumed, each at most once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.commands.base import CommandBase
from controlplane.commands.gateway import (
    ReconcileOperation,
    RegisterProfile,
    RegisterSource,
    RevokePrincipal,
    RevokeSource,
    SetNetworkPolicy,
)
from controlplane.deciding import Prepared, decide_batch
from controlplane.gateway.fixture_provider import Fault
from controlplane.gateway.scenario import (
    MEMORY_8B,
    GatewayDriver,
    dispatch,
    route,
)
from controlplane.handlers.gateway import MAX_DISPATCH_AHEAD_SECONDS
from controlplane.policy_book import PolicyBook
from controlplane.service import accept, decide, unfinished_command_ids
from controlplane.settings import Settings
from controlplane.state import gateway as gw
from events import transaction
from tests.factories import wall_clock_after
from tests.fleet_helpers import decision
from workers.pipeline import reconcile

KEYS = ("first", "second")


def decided_without_effects(gateway: GatewayDriver, *keys: str, at: datetime) -> list[str]:
    """Dispatches accepted and decided as a worker that died right after its commit left them."""
    store = gateway.store
    commands = [dispatch("alice", key, at=at) for key in keys]
    ids = accept(store, commands)
    accepted = {e.command_id: e for c in ids for e in store.events_for_command(c)}
    decide_batch(store, [Prepared(c.command_id, accepted[c.command_id], c) for c in commands],
                 PolicyBook())
    return ids


def test_operations_a_dead_worker_never_marked_are_reserved_unsent_and_reconcile_resumes_them(
        gateway: GatewayDriver) -> None:
    ids = decided_without_effects(gateway, *KEYS, at=datetime.now(UTC))
    assert [gateway.operation("acme", k)["state"] for k in KEYS] == ["reserved", "reserved"]  # type: ignore[index]
    assert [gateway.calls(key=k) for k in KEYS] == [0, 0]
    assert sorted(unfinished_command_ids(gateway.store)) == sorted(ids)

    resumed = reconcile(Settings.from_env(), gateway.store)

    assert sorted(resumed.accepted_ids) == sorted(ids)
    assert [gateway.operation("acme", k)["state"] for k in KEYS] == ["completed", "completed"]  # type: ignore[index]
    assert [gateway.calls(key=k) for k in KEYS] == [1, 1]
    assert unfinished_command_ids(gateway.store) == []
    # Delivered once more, nothing is sent again: each is marked, so none is reserved.
    decide(gateway.store, ids)
    assert [gateway.calls(key=k) for k in KEYS] == [1, 1]


def test_a_reserved_operation_reconciled_as_not_processed_is_never_sent(
        gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its worker gone and its job given up, after the lease the operator releases the grant:
    a worker resuming it later finds it settled and calls nothing."""
    at = datetime.now(UTC)
    decided_without_effects(gateway, "stuck", at=at)
    early = ReconcileOperation(tenant="acme", idempotency_key="stuck", resolution="not_processed",
                               evidence_ref="ops-ticket", at=at + timedelta(seconds=5))
    done = ReconcileOperation(tenant="acme", idempotency_key="stuck", resolution="completed",
                              evidence_ref="ops-ticket", answer_text="x", output_tokens=1,
                              at=at + timedelta(seconds=901))
    late = ReconcileOperation(tenant="acme", idempotency_key="stuck", resolution="not_processed",
                              evidence_ref="ops-ticket", at=at + timedelta(seconds=902))
    gateway.run(early)
    monkeypatch.setattr(transaction, "wall_clock", wall_clock_after(901))  # the lease runs out
    gateway.run(done, late)
    codes = [decision(gateway.store, c.command_id).data["reasons"][0]["code"]
             for c in (early, done, late)]
    assert codes == ["operation_in_progress", "operation_never_dispatched",
                     "reconciled_not_processed"]
    assert gateway.operation("acme", "stuck")["state"] == "failed"  # type: ignore[index]
    assert gateway.budget()["reserved_units"] == 0
    reconcile(Settings.from_env(), gateway.store)
    assert gateway.calls(key="stuck") == 0


def test_a_reservation_resumed_past_its_lease_is_never_sent_and_its_grant_is_released(
        gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its worker died and the job came back after the lease (wall clock): the caller was told
    the outcome is unknown and the route or its authorisation may have changed since."""
    ids = decided_without_effects(gateway, "stale", at=datetime.now(UTC))
    monkeypatch.setattr(transaction, "wall_clock", wall_clock_after(901))  # past the 900 s lease
    reconcile(Settings.from_env(), gateway.store)
    assert gateway.calls(key="stale") == 0
    operation = gateway.operation("acme", "stale")
    assert operation is not None and (operation["state"], operation["outcome_code"]) == (
        "failed", "reservation_expired")
    assert gateway.budget()["reserved_units"] == 0
    assert unfinished_command_ids(gateway.store) == []
    assert decision(gateway.store, ids[0]).event_type == "OperationReserved"


def test_the_dispatching_mark_carries_the_requests_own_time_as_the_lease_is_measured_in_it(
        gateway: GatewayDriver) -> None:
    """Replays and reconciliations measure the lease against their commands' times: stamped
    with the wall clock, a request dated ahead of it (as far as submit lets it) was unknown
    5 s after being sent."""
    at = datetime.now(UTC) + timedelta(seconds=MAX_DISPATCH_AHEAD_SECONDS - 60)
    # The answer's write and the smaller "unknown" write both fail: it stays dispatching.
    gateway.provider.script(Fault("persist_and_mark_fail", idempotency_key="ahead"))
    gateway.send(dispatch("alice", "ahead", at=at))
    operation = gateway.operation("acme", "ahead")
    assert operation is not None and operation["state"] == "dispatching"
    assert operation["dispatching_at"] == operation["created_at"]
    retry = gateway.send(dispatch("alice", "ahead", at=at + timedelta(seconds=5)))
    assert retry["outcome"] == "operation_in_progress"


@pytest.mark.parametrize("withdrawal", ["route", "principal", "source"])
def test_a_resumed_reservation_whose_authorisation_was_withdrawn_is_never_sent(
        gateway: GatewayDriver, withdrawal: str) -> None:
    """Within the lease, but the route was withdrawn, the caller or a source revoked since the
    reservation: what the decision checked is checked again just before the call."""
    at = datetime.now(UTC)
    decided_without_effects(gateway, "late", at=at)
    later = at + timedelta(seconds=1)
    gateway.run({"route": route("sh-1", approved=False, at=later),
                 "principal": RevokePrincipal(tenant="acme", principal_id="alice", at=later),
                 "source": RevokeSource(tenant="acme", source_ref="doc-a", at=later)}[withdrawal])
    reconcile(Settings.from_env(), gateway.store)
    assert gateway.calls(key="late") == 0
    operation = gateway.operation("acme", "late")
    assert operation is not None and operation["state"] == "failed"
    assert operation["outcome_code"] == {"route": "route_withdrawn", "principal": "identity_revoked",
                                         "source": "source_revoked"}[withdrawal]
    assert gateway.budget()["reserved_units"] == 0


def _small_profile(at: datetime, **changes: object) -> RegisterProfile:
    """The fixture's `chat-small-v1` registered again at `at`, with `changes` applied."""
    fields: dict[str, object] = {
        "profile_id": "chat-small-v1", "model_id": "small-8b", "digest": "sha256:small",
        "approved": True, "context_window_tokens": 8_192, "max_output_tokens": 1_024,
        "approved_providers": ["hostedco", "selfhost"], "memory": MEMORY_8B, **changes}
    return RegisterProfile.model_validate({**fields, "at": at})


def _withdrawal(kind: str, at: datetime) -> CommandBase:
    """A change, after the reservation, that takes away a right its decision relied on."""
    withdrawals: dict[str, CommandBase] = {
        "route_not_ready": route("sh-1", ready=False, at=at),
        "route_not_private": route("sh-1", private=False, at=at),
        # carol (tenant beta) reads acme's doc-a through its access list, until taken off it.
        "reader_removed": RegisterSource(tenant="acme", source_ref="doc-a", version=3,
                                         readers=["bob"], at=at),
        "profile_unapproved": _small_profile(at, approved=False),
        "provider_unapproved": _small_profile(at, approved_providers=["hostedco"]),
        "route_incompatible": route("sh-1", compatible_profiles=["chat-large-v2"], at=at),
        "tenant_private_only": SetNetworkPolicy(tenant="beta", network_policy="private_only", at=at),
    }
    return withdrawals[kind]


# What each withdrawal is settled as: the reason code and, for the route, Select's own code.
WITHDRAWN_AS = {"route_not_ready": ("route_withdrawn", "route_not_ready"),
                "route_not_private": ("route_withdrawn", "private_route_required"),
                "reader_removed": ("source_forbidden", None),
                "profile_unapproved": ("route_withdrawn", "profile_untrusted"),
                "provider_unapproved": ("route_withdrawn", "provider_not_approved"),
                "route_incompatible": ("route_withdrawn", "no_compatible_route"),
                "tenant_private_only": ("route_withdrawn", "private_route_required")}


@pytest.mark.parametrize("resumed_by", ["reconcile", "redelivery"])
@pytest.mark.parametrize("withdrawal", sorted(WITHDRAWN_AS))
def test_a_reservation_resumed_within_its_lease_is_re_authorised_just_before_its_call(
        gateway: GatewayDriver, withdrawal: str, resumed_by: str) -> None:
    """Whatever Authorise and Select granted at reservation (the caller's evidence, the route's
    approval, its provider's and profile's, the tenant's network policy) is granted again before
    the call, whether `reconcile` or the job delivered again resumes it."""
    at = datetime.now(UTC)
    principal = "alice"
    if withdrawal == "reader_removed":  # beta's request, on acme's sources by their list
        principal = "carol"
    if withdrawal == "tenant_private_only":  # beta's request, reserved on the hosted route
        principal = "carol"
        gateway.run(route("sh-1", ready=False, at=at))
    request = dispatch(principal, "late", at=at)
    store = gateway.store
    ids = accept(store, [request])
    (accepted,) = store.events_for_command(request.command_id)
    decide_batch(store, [Prepared(request.command_id, accepted, request)], PolicyBook())
    reserved = gateway.operation(request.tenant, "late")
    assert reserved is not None and reserved["state"] == "reserved"
    assert reserved["route_id"] == ("hc-1" if withdrawal == "tenant_private_only" else "sh-1")
    gateway.run(_withdrawal(withdrawal, at + timedelta(seconds=1)))

    if resumed_by == "reconcile":
        reconcile(Settings.from_env(), store)
    else:
        decide(store, ids)

    assert gateway.calls(key="late") == 0
    operation = gateway.operation(request.tenant, "late")
    assert operation is not None and operation["state"] == "failed"
    settled = store.read_stream(gw.operation_stream(request.tenant, "late"))[-1].data["reasons"][0]
    assert (settled["code"], settled["facts"].get("select_code")) == WITHDRAWN_AS[withdrawal]
    assert operation["outcome_code"] == settled["code"]
    assert gateway.budget()["reserved_units"] == 0
