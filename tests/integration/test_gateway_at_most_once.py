"""For any tenant and key the adapter is called at most once, ever (spec G2).

A property test over random sequences of dispatches, replays, conflicting inputs, injected faults
(refused before sending, timed out after sending, final write failing, even the unknown mark
failing), release moves, revocations and reconciliations, all run through the queue and the log in
random batches (so duplicates can share one transaction). Each example gets a tenant of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.commands.base import CommandBase
from controlplane.commands.gateway import (
    ConfigureBudget,
    CreateReleaseBundle,
    MoveReleasePointer,
    ReconcileOperation,
    RegisterPrincipal,
    RegisterSource,
    RegisterTenant,
    RestoreSource,
    RevokeSource,
    SourceRefSpec,
)
from controlplane.gateway.fixture_provider import FIXTURE_DIR_ENV, Fault, FixtureProvider
from controlplane.gateway.scenario import GatewayDriver, common_fixture, dispatch, words
from controlplane.replay import compare_with_live
from controlplane.replay.verify import verify_decisions
from controlplane.runtime import open_store
from controlplane.service import pending_command_ids
from controlplane.settings import Settings

KEYS = ("k0", "k1")
FAULTS = ("refuse_before_send", "timeout_after_send", "persist_fails", "persist_and_mark_fail")
LIMIT_UNITS = 2_000
_tenants = itertools.count()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayDriver]:
    directory = tmp_path_factory.mktemp("gateway-property")
    url = f"sqlite:///{directory}/fleet.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLEET_DATABASE_URL", url)
        patch.setenv(FIXTURE_DIR_ENV, str(directory / "provider"))
        patch.delenv("FLEET_REDIS_URL", raising=False)
        store = open_store(url)
        driver = GatewayDriver(Settings.from_env(), store, FixtureProvider(directory / "provider"))
        driver.run(*common_fixture())
        yield driver
        assert verify_decisions(store).drifts == []
        assert compare_with_live(store) == []
        store.engine.dispose()


def tenant_setup(tenant: str) -> list[CommandBase]:
    """A tenant with two principals, two sources and two releases of its own."""
    refs = [SourceRefSpec(source_ref=f"{tenant}-s{i}", version=1) for i in (1, 2)]
    return [ConfigureBudget(budget_id=f"{tenant}-budget", limit_units=LIMIT_UNITS),
            RegisterTenant(tenant=tenant, network_policy="hosted_allowed",
                           budget_id=f"{tenant}-budget"),
            *[RegisterPrincipal(tenant=tenant, principal_id=f"{tenant}-p{i}") for i in (0, 1)],
            *[RegisterSource(tenant=tenant, source_ref=r.source_ref, version=1) for r in refs],
            CreateReleaseBundle(release_id=f"{tenant}-r0", profile_id="chat-small-v1",
                                gate_status="approved", source_refs=refs),
            CreateReleaseBundle(release_id=f"{tenant}-r1", profile_id="chat-large-v2",
                                gate_status="approved", source_refs=refs[1:]),
            MoveReleasePointer(tenant=tenant, pointer_name=f"{tenant}/assistant",
                               release_id=f"{tenant}-r0")]


@dataclass(frozen=True)
class Action:
    kind: str
    key: str = "k0"
    variant: int = 0
    flush: bool = True


actions = st.one_of(
    # Mostly the same request again (a replay), sometimes another input or another caller.
    st.builds(Action, st.just("dispatch"), st.sampled_from(KEYS), st.sampled_from([0, 0, 0, 1, 2]),
              st.booleans()),
    st.builds(Action, st.just("dispatch"), st.sampled_from(KEYS), st.just(0), st.booleans()),
    st.builds(Action, st.sampled_from(FAULTS), st.sampled_from(KEYS)),
    st.builds(Action, st.just("move"), variant=st.integers(0, 1), flush=st.booleans()),
    st.builds(Action, st.sampled_from(["revoke", "restore"]), variant=st.integers(1, 2),
              flush=st.booleans()),
    st.builds(Action, st.just("reconcile"), st.sampled_from(KEYS), st.integers(0, 1), st.booleans()),
)


def command_for(action: Action, tenant: str, now: datetime) -> CommandBase:
    if action.kind == "dispatch":
        # Variants 0 and 1 are the same caller with two inputs; 2 is another caller.
        principal = f"{tenant}-p{1 if action.variant == 2 else 0}"
        return dispatch(principal, action.key, tenant=tenant, max_output_tokens=100,
                        text=words(50, "ab"[action.variant % 2]), at=now)
    if action.kind == "move":
        return MoveReleasePointer(tenant=tenant, pointer_name=f"{tenant}/assistant",
                                  release_id=f"{tenant}-r{action.variant}", at=now)
    if action.kind in ("revoke", "restore"):
        kind = RevokeSource if action.kind == "revoke" else RestoreSource
        return kind(tenant=tenant, source_ref=f"{tenant}-s{action.variant}", at=now)
    completed = action.variant == 1
    # Logical time far past the lease, so lost "dispatching" operations can be reconciled too.
    return ReconcileOperation(tenant=tenant, idempotency_key=action.key, evidence_ref="ledger",
                              resolution="completed" if completed else "not_processed",
                              answer_text="reconciled" if completed else None,
                              output_tokens=10 if completed else None,
                              at=now + timedelta(days=1))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(actions, min_size=1, max_size=14))
def test_the_adapter_is_called_at_most_once_per_key_whatever_happens(
        world: GatewayDriver, steps: list[Action]) -> None:
    tenant = f"t{next(_tenants)}"
    world.run(*tenant_setup(tenant))
    now = datetime.now(UTC)
    batch: list[CommandBase] = []
    for step in steps:
        if step.kind in FAULTS:
            world.provider.script(Fault(step.kind, tenant=tenant, idempotency_key=step.key))
            continue
        batch.append(command_for(step, tenant, now))
        if step.flush:
            world.run(*batch)
            batch.clear()
    world.run(*batch)
    world.provider.clear_faults()

    assert pending_command_ids(world.store) == []
    reserved = committed = 0
    for key in KEYS:
        calls = world.calls(tenant=tenant, key=key)
        operation = world.operation(tenant, key)
        assert calls <= 1, f"{key} was sent {calls} times"
        if operation is None:
            assert calls == 0
            continue
        # Never called unless marked dispatching first; marked means "may have reached the
        # provider". Only a reconciliation that got in before the mark (or before the call),
        # or an authorisation withdrawn before the mark (settled failed, never sent), leaves it
        # unmarked (or uncalled).
        assert calls <= operation["dispatch_count"]
        settled_unsent = operation["state"] == "failed" and operation["dispatch_count"] == 0
        assert operation["dispatch_count"] == 1 or operation.get("reconciled_event_id") \
            or settled_unsent
        assert calls == 1 or operation.get("reconciled_event_id") or settled_unsent
        assert operation["state"] in ("completed", "unknown", "failed", "dispatching")
        if operation["state"] in ("unknown", "dispatching"):
            reserved += operation["grant_units"]
        elif operation["state"] == "completed":
            committed += operation["input_tokens"] + (
                10 if operation.get("reconciled_event_id") else operation["max_output_tokens"])
    budget = world.budget(f"{tenant}-budget")
    assert (budget["reserved_units"], budget["committed_units"]) == (reserved, committed)
    assert reserved + committed <= LIMIT_UNITS


def test_the_property_world_records_each_call_in_the_ledger(world: GatewayDriver) -> None:
    tenant = f"t{next(_tenants)}"
    world.run(*tenant_setup(tenant))
    world.run(dispatch(f"{tenant}-p0", "solo", tenant=tenant), dispatch(f"{tenant}-p0", "solo",
                                                                         tenant=tenant))
    assert world.calls(tenant=tenant, key="solo") == 1
    assert world.operation(tenant, "solo")["replays"] == 1  # type: ignore[index]
    assert Path(world.provider.ledger).exists()
