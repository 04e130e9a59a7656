"""Regressions from the gateway review: who may read a source, leases on two clocks, memory fit
that must be shown, and what the adapter is told (spec §5.1 steps 3, 4, 8; §4; §8 Q5; §13.2).

Each test runs on the `gateway` fixture, which afterwards re-derives every decision and rebuilds
every projection from the log: decisions that read the control plane's clock stay exact.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from controlplane.commands.gateway import (
    CreateReleaseBundle,
    MoveReleasePointer,
    ReconcileOperation,
    RegisterPrincipal,
    RegisterProfile,
    SetNetworkPolicy,
)
from controlplane.deciding import Prepared, decide_batch
from controlplane.decisions import DecisionContext
from controlplane.errors import SubmissionRejected
from controlplane.gateway import execute
from controlplane.gateway.adapters import Adapter, AdapterRequest, AdapterResult, adapter_for
from controlplane.gateway.fixture_provider import FIXTURE_DIR_ENV, Fault, FixtureProvider
from controlplane.gateway.scenario import (
    GatewayDriver,
    common_fixture,
    dispatch,
    route,
)
from controlplane.handlers import HANDLERS, RULES_VERSIONS, gateway_reconcile
from controlplane.policy_book import PolicyBook
from controlplane.replay.verify import verify_decisions
from controlplane.service import accept, decide
from controlplane.settings import Settings
from controlplane.state import gateway as gw
from controlplane.state.fold import apply_event
from events import transaction
from events.store import EventStore
from tests.factories import wall_clock_after
from tests.fleet_helpers import decision
from tests.integration.test_gateway_resume import decided_without_effects
from workers.pipeline import reconcile

LEASE_SECONDS = 900  # the gateway policy's default dispatch_lease_seconds


def _reconcile(key: str, at: datetime, resolution: str = "not_processed") -> ReconcileOperation:
    evidence: dict[str, Any] = {"answer_text": "late", "output_tokens": 10} \
        if resolution == "completed" else {}
    return ReconcileOperation(tenant="acme", idempotency_key=key, resolution=resolution,
                              evidence_ref="provider-ledger", at=at, **evidence)


def _left_dispatching(gateway: GatewayDriver, key: str, at: datetime) -> None:
    """A request sent and never settled: its answer's write and the smaller unknown mark both
    fail, so it stays dispatching, as a call still running does."""
    gateway.provider.script(Fault("persist_and_mark_fail", idempotency_key=key))
    assert gateway.send(dispatch("alice", key, at=at))["outcome"] == "dispatching"


# Defect 1: a source of the caller's own tenant is readable whatever its access list.

def test_a_principal_of_the_sources_tenant_off_its_access_list_is_served_and_replayed(
        gateway: GatewayDriver) -> None:
    """doc-a and doc-b list alice, bob and carol; dave is acme's too, so they are his to use
    (spec §5.1 step 3: the tenant's, or the caller's access list allows it), new or replayed."""
    gateway.run(RegisterPrincipal(tenant="acme", principal_id="dave"))
    first = gateway.send(dispatch("dave", "kd"))
    assert (first["outcome"], first["route_id"]) == ("completed", "sh-1")
    replay = gateway.send(dispatch("dave", "kd"))
    assert (replay["outcome"], replay["replayed"]) == ("completed", True)
    assert gateway.calls(key="kd") == 1


# Defect 2: a lease runs out only when the control plane's clock agrees with the commands'.

def test_a_reconcile_dated_past_the_lease_is_refused_until_the_control_planes_clock_agrees(
        gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    sent_at = datetime.now(UTC)
    _left_dispatching(gateway, "kl", sent_at)
    early = _reconcile("kl", sent_at + timedelta(seconds=LEASE_SECONDS + 1))
    gateway.run(early)
    refused = decision(gateway.store, early.command_id)
    assert (refused.event_type, refused.data["reasons"][0]["code"]) == \
        (gw.RECONCILE_REFUSED, "operation_in_progress")
    assert refused.data["reasons"][0]["facts"]["since_dispatch_wall_seconds"] < LEASE_SECONDS
    assert refused.data["rules_version"] == 2
    assert gateway.operation("acme", "kl")["state"] == "dispatching"  # type: ignore[index]

    monkeypatch.setattr(transaction, "wall_clock", wall_clock_after(LEASE_SECONDS + 1))
    late = _reconcile("kl", sent_at + timedelta(seconds=LEASE_SECONDS + 2))
    gateway.run(late)
    assert decision(gateway.store, late.command_id).event_type == gw.OPERATION_RECONCILED
    assert gateway.operation("acme", "kl")["state"] == "failed"  # type: ignore[index]


class _MeanwhileAdapter:
    """The fixture adapter, with something else happening while each call is out."""

    def __init__(self, inner: Adapter, meanwhile: Callable[[], None]) -> None:
        self.inner, self.meanwhile = inner, meanwhile

    def call(self, request: AdapterRequest) -> AdapterResult:
        self.meanwhile()
        return self.inner.call(request)


def test_a_reconcile_dated_ahead_cannot_drop_the_result_of_a_call_still_running(
        gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The review's race: a reconciliation sent 2 s after dispatch and dated 901 s ahead had
    settled the operation while its call ran and released its grant; the provider's answer was
    then dropped and its work never charged (spec §8 Q5)."""
    sent_at = datetime.now(UTC)
    early = _reconcile("kr", sent_at + timedelta(seconds=LEASE_SECONDS + 1))

    def reconcile_during_the_call() -> None:
        decide(gateway.store, accept(gateway.store, [early]))

    during = _MeanwhileAdapter(adapter_for("self_hosted"), reconcile_during_the_call)
    monkeypatch.setattr(execute, "adapter_for", lambda adapter_kind: during)
    served = gateway.send(dispatch("alice", "kr", at=sent_at))

    assert decision(gateway.store, early.command_id).event_type == gw.RECONCILE_REFUSED
    assert (served["outcome"], served["answer"]) == ("completed", {"text": "ANSWER-sh-1-1"})
    operation = gateway.operation("acme", "kr")
    assert operation is not None and (operation["state"], operation["outcome_code"]) == \
        ("completed", "completed")
    budget = gateway.budget()
    assert (budget["reserved_units"], budget["committed_units"]) == (0, 356)
    assert gateway.calls(key="kr") == 1


def test_a_replay_dated_past_the_lease_is_in_progress_until_the_control_planes_clock_agrees(
        gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first request stamped 1,000 s in the past and replayed 2 s later had answered
    `outcome_unknown` while its call ran, then `completed`: an unknown outcome must repeat."""
    sent_at = datetime.now(UTC) - timedelta(seconds=1_000)
    _left_dispatching(gateway, "kp", sent_at)
    assert gateway.send(dispatch("alice", "kp"))["outcome"] == "operation_in_progress"
    monkeypatch.setattr(transaction, "wall_clock", wall_clock_after(LEASE_SECONDS))
    assert gateway.send(dispatch("alice", "kp"))["outcome"] == "outcome_unknown"
    assert gateway.calls(key="kp") == 1


def test_a_reservation_reconciled_with_a_time_past_its_lease_waits_for_the_control_planes_clock(
        gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never marked, so never sent: but its worker may be about to send it, so its lease from the
    reservation must have run out on the control plane's clock too."""
    at = datetime.now(UTC)
    decided_without_effects(gateway, "kq", at=at)
    early = _reconcile("kq", at + timedelta(seconds=LEASE_SECONDS + 1))
    gateway.run(early)
    assert decision(gateway.store, early.command_id).data["reasons"][0]["code"] == \
        "operation_in_progress"
    monkeypatch.setattr(transaction, "wall_clock", wall_clock_after(LEASE_SECONDS + 1))
    late = _reconcile("kq", at + timedelta(seconds=LEASE_SECONDS + 2))
    gateway.run(late)
    assert decision(gateway.store, late.command_id).event_type == gw.OPERATION_RECONCILED
    reconcile(Settings.from_env(), gateway.store)
    assert gateway.calls(key="kq") == 0 and gateway.budget()["reserved_units"] == 0


def test_decisions_judged_on_the_control_planes_clock_re_derive_exactly(
        gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replay gives each re-derived decision the time its events were recorded at, so the lease
    is judged as it was live: one refused before the clock moved on, one settled after."""
    sent_at = datetime.now(UTC)
    _left_dispatching(gateway, "kx", sent_at)
    gateway.run(_reconcile("kx", sent_at + timedelta(seconds=LEASE_SECONDS + 1)))
    monkeypatch.setattr(transaction, "wall_clock", wall_clock_after(LEASE_SECONDS + 1))
    gateway.run(_reconcile("kx", sent_at + timedelta(seconds=LEASE_SECONDS + 2)))
    assert gateway.stream_types("acme", "kx")[-2:] == [gw.RECONCILE_REFUSED,
                                                        gw.OPERATION_RECONCILED]
    report = verify_decisions(gateway.store)
    assert report.drifts == [] and report.decisions_checked > 0


def test_a_decisions_events_carry_the_time_its_handler_was_given(
        gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock is read once per decision, before its handler runs, and the events carry it:
    what re-derivation reads back is exactly what the live decision judged by."""
    ticks = iter(f"2031-01-01T00:00:{second:02d}.000000+00:00" for second in range(60))
    monkeypatch.setattr(transaction, "wall_clock", lambda: next(ticks))
    seen: list[str | None] = []
    handler = HANDLERS["ReconcileOperation"]

    def spy(command: Any, ctx: DecisionContext) -> Any:
        seen.append(ctx.recorded_at)
        return handler(command, ctx)

    monkeypatch.setitem(HANDLERS, "ReconcileOperation", spy)
    command = _reconcile("nothing-here", datetime.now(UTC))
    gateway.run(command)
    recorded = decision(gateway.store, command.command_id)
    assert seen == [recorded.recorded_at]


@pytest.fixture
def unverified_gateway(store: EventStore, tmp_path: Path,
                       monkeypatch: pytest.MonkeyPatch) -> GatewayDriver:
    """The common fixture, without the `gateway` fixture's demand that nothing drifts."""
    monkeypatch.setenv(FIXTURE_DIR_ENV, str(tmp_path / "provider"))
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    driver = GatewayDriver(Settings.from_env(), store, FixtureProvider(tmp_path / "provider"))
    driver.run(*common_fixture())
    return driver


def test_a_reconciliation_decided_before_the_two_clock_lease_is_reported_as_older_rules(
        unverified_gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded as rules version 1 decided it (the commands' times alone), it re-derives as
    refused today: `replay --verify` reports it decided under older rules, not as a fault."""
    gateway = unverified_gateway
    sent_at = datetime.now(UTC)
    _left_dispatching(gateway, "ko", sent_at)
    with monkeypatch.context() as old_rules:
        old_rules.setitem(RULES_VERSIONS, "ReconcileOperation", 1)
        old_rules.setattr(gateway_reconcile, "wall_seconds_since", lambda recorded_at, ctx: None)
        gateway.run(_reconcile("ko", sent_at + timedelta(seconds=LEASE_SECONDS + 1)))
    assert gateway.operation("acme", "ko")["state"] == "failed"  # type: ignore[index]
    report = verify_decisions(gateway.store)
    assert [(d.event_type, d.rules_version, d.current_rules_version) for d in report.drifts] == \
        [(gw.OPERATION_RECONCILED, 1, 2)]
    assert report.unexplained == []


# Defect 3: a self-hosted route serves a profile only when its memory fit is shown.

def test_a_self_hosted_route_without_a_gpu_plan_is_refused_at_submit_naming_the_field(
        gateway: GatewayDriver) -> None:
    head = gateway.store.head()
    with pytest.raises(SubmissionRejected) as refused:
        gateway.run(route("sh-1", gpu_plan=None))
    assert [(p.line, p.field) for p in refused.value.problems] == [(1, "gpu_plan")]
    assert gateway.store.head() == head
    assert gateway.projection(gw.REGISTRIES["route"], "sh-1")["gpu_plan"] is not None  # type: ignore[index]


def test_a_self_hosted_route_without_a_gpu_plan_is_rejected_when_decided(
        gateway: GatewayDriver) -> None:
    """Decided without the submit check (as a command accepted before it existed would be)."""
    command = route("sh-1", gpu_plan=None)
    with gateway.store.transaction() as tx:
        ctx = DecisionContext(tx.projections, tx.head_position, tx.stream_version, PolicyBook(), None)
        for event in tx.append(HANDLERS["ConfigureRoute"](command, ctx)):
            apply_event(tx.projections, event)
    (rejected,) = gateway.store.events_for_command(command.command_id)
    assert (rejected.event_type, rejected.data["reasons"][0]["code"]) == \
        ("CommandRejected", "gpu_plan_required")
    assert gateway.projection(gw.REGISTRIES["route"], "sh-1")["gpu_plan"] is not None  # type: ignore[index]


def test_a_profile_without_memory_parameters_is_not_served_by_a_self_hosted_route(
        gateway: GatewayDriver) -> None:
    """Nothing shows the profile fits sh-1's GPUs, so sh-1 is not compatible; acme is private
    only, so no route is left (spec §5.1 step 4, test 10's integration)."""
    gateway.run(
        RegisterProfile(profile_id="chat-unsized", model_id="unsized", digest="sha256:unsized",
                        approved=True, context_window_tokens=8_192, max_output_tokens=1_024,
                        capabilities=["text"], approved_providers=["selfhost", "hostedco"]),
        route("sh-1", compatible_profiles=["chat-small-v1", "chat-unsized"]),
        CreateReleaseBundle(release_id="rel-unsized", profile_id="chat-unsized",
                            gate_status="approved"),
        MoveReleasePointer(tenant="acme", pointer_name="acme/assistant", release_id="rel-unsized"))
    denied = gateway.send(dispatch("alice", "ku"))
    assert (denied["outcome"], denied["code"]) == ("denied", "no_compatible_route")
    facts = gateway.store.read_stream(gw.operation_stream("acme", "ku"))[-1] \
        .data["reasons"][0]["facts"]
    assert facts["rulings"]["sh-1"] == "memory_fit_unproven"
    assert facts["memory"] == [{"route_id": "sh-1", "profile_id": "chat-unsized",
                                "missing": ["memory"]}]
    assert gateway.calls() == 0 and gateway.operation("acme", "ku") is None


# Defect 4: the adapter is told everything spec §5.1 step 8 names.

def test_the_adapter_receives_the_profile_and_model_ids_and_the_effective_network_policy(
        gateway: GatewayDriver) -> None:
    served = gateway.send(dispatch("carol", "kc", network_preference="private"))
    assert (served["outcome"], served["route_id"]) == ("completed", "sh-1")
    (call,) = gateway.provider.calls(idempotency_key="kc")
    assert (call["profile_id"], call["model_id"], call["network_policy"], call["max_output_tokens"]) \
        == ("chat-small-v1", "small-8b", "private_only", 256)
    assert call["provider_idempotency_key"] == served["operation_id"]


def test_a_call_resumed_after_its_tenant_tightened_its_policy_is_made_under_the_stricter_one(
        gateway: GatewayDriver) -> None:
    """beta allowed hosted routes when carol's request was reserved on sh-1 (private); beta is
    private only by the time it is sent, so that is the policy the adapter is given."""
    at = datetime.now(UTC)
    request = dispatch("carol", "kt", at=at)
    store = gateway.store
    ids = accept(store, [request])
    (accepted,) = store.events_for_command(request.command_id)
    decide_batch(store, [Prepared(request.command_id, accepted, request)], PolicyBook())
    assert gateway.operation("beta", "kt")["network_policy"] == "hosted_allowed"  # type: ignore[index]
    gateway.run(SetNetworkPolicy(tenant="beta", network_policy="private_only",
                                 at=at + timedelta(seconds=1)))
    decide(store, ids)
    (call,) = gateway.provider.calls(idempotency_key="kt")
    assert (call["route_id"], call["network_policy"]) == ("sh-1", "private_only")
