"""Every event records actor and tenant; one tenant cannot read or change another tenant's
operations, registry entries, budget or prefix-cache blocks (as far as the gateway exists today)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.commands import parse_command
from controlplane.commands.gateway import (
    ConfigureBudget,
    MoveReleasePointer,
    ReconcileOperation,
    RegisterPrincipal,
    RegisterSource,
    RevokePrincipal,
    RevokeSource,
)
from controlplane.decisions import ACCEPTED
from controlplane.errors import SubmissionRejected
from controlplane.gateway.fixture_provider import FIXTURE_DIR_ENV, Fault, FixtureProvider
from controlplane.gateway.observations import EXECUTOR
from controlplane.gateway.scenario import GatewayDriver, common_fixture, dispatch
from controlplane.handlers import OBSERVATIONS
from controlplane.policies.prefix_cache import CacheScope, PrefixCache, ScopeSelector
from controlplane.runtime import open_store
from controlplane.settings import Settings
from events.model import RecordedEvent
from tests.factories import assess_memory
from tests.fuzz.harness import decisions_of, embedded_fleet
from tests.fuzz.strategies import fuzz_settings
from workers.pipeline import submit

AT = "2026-11-30T12:05:00Z"


@pytest.fixture(scope="module")
def mixed_events(tmp_path_factory: pytest.TempPathFactory) -> list[RecordedEvent]:
    """The events of one submission mixing domains, actors and tenants (with follow-up commands
    an autoscaler issues and observations the gateway's executor records)."""
    payloads = [
        {**assess_memory("who-memory"), "actor": "ci-bot", "tenant": "team-a"},
        {"type": "CordonNode", "command_id": "who-cordon", "node_id": "n2", "actor": "sre@example",
         "tenant": "ops", "at": AT},
        {**dispatch("alice", "who-k").model_dump(mode="json"), "command_id": "who-dispatch",
         "actor": "app-1"},
        {"type": "AdmitRequest", "command_id": "who-admit", "request_id": "who-req", "pool_id": "chat",
         "prompt_tokens": 10, "max_output_tokens": 10, "deadline_at": "2026-11-30T12:06:00Z",
         "at": AT, "actor": "router", "tenant": "beta"},
        {"type": "ObserveLoad", "command_id": "who-load", "pool_id": "chat", "actor": "metrics",
         "tenant": "ops", "at": AT, "observations": [
             {"observed_at": AT, "queued_tokens": 10**9, "arrival_tokens_per_second": 10**6}]},
    ]
    with embedded_fleet(tmp_path_factory.mktemp("who")) as store:
        head = store.head()[0]
        submit(Settings.from_env(), store, [parse_command(p) for p in payloads])
        assert all(decisions_of(store, [p["command_id"] for p in payloads]).values())
        return list(store.read_all(from_position=head))


def _commands(events: list[RecordedEvent]) -> dict[str, dict[str, Any]]:
    return {str(e.command_id): e.data["command"] for e in events if e.event_type == ACCEPTED}


def test_every_event_of_a_mixed_submission_records_its_commands_actor_and_tenant(
        mixed_events: list[RecordedEvent]) -> None:
    commands = _commands(mixed_events)
    assert {"who-memory", "who-cordon", "who-dispatch", "who-admit", "who-load"} <= set(commands)
    assert any(e.event_type in OBSERVATIONS for e in mixed_events)
    assert any(c["actor"] == "autoscaler" for c in commands.values())  # follow-ups were issued
    for event in mixed_events:
        assert event.actor and event.tenant, event
        if event.command_id is None:
            continue
        command = commands[event.command_id]
        assert event.tenant == command["tenant"], (event.event_type, event.tenant, command["tenant"])
        if event.event_type != ACCEPTED:
            expected_actor = EXECUTOR if event.event_type in OBSERVATIONS else command["actor"]
            assert event.actor == expected_actor, (event.event_type, event.actor, expected_actor)


def test_an_issued_commands_inbox_event_records_that_commands_own_actor(
        mixed_events: list[RecordedEvent]) -> None:
    commands = _commands(mixed_events)
    mismatched = [(e.command_id, e.actor, commands[str(e.command_id)]["actor"]) for e in mixed_events
                  if e.event_type == ACCEPTED and e.actor != commands[str(e.command_id)]["actor"]]
    assert mismatched == []


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[GatewayDriver]:
    url = f"sqlite:///{tmp_path}/fleet.db"
    monkeypatch.setenv("FLEET_DATABASE_URL", url)
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    monkeypatch.setenv("FLEET_QUEUE", "fleet-tenants")
    monkeypatch.setenv(FIXTURE_DIR_ENV, str(tmp_path / "provider"))
    store = open_store(url)
    driver = GatewayDriver(Settings.from_env(), store, FixtureProvider(tmp_path / "provider"))
    driver.run(*common_fixture())
    yield driver
    store.engine.dispose()


def test_a_principal_claiming_another_tenant_cannot_read_its_saved_answer(gateway: GatewayDriver) -> None:
    assert gateway.send(dispatch("alice", "k1"))["outcome"] == "completed"
    operation, budget, calls = gateway.operation("acme", "k1"), gateway.budget(), gateway.calls()
    stolen = gateway.send(dispatch("carol", "k1", tenant="acme"))  # carol belongs to beta
    assert (stolen["outcome"], stolen["code"], stolen["answer"]) == ("denied", "tenant_mismatch", None)
    assert gateway.operation("acme", "k1") == operation
    assert (gateway.budget(), gateway.calls()) == (budget, calls)


def test_another_tenant_cannot_settle_an_operation_it_does_not_own(gateway: GatewayDriver) -> None:
    gateway.provider.script(Fault("timeout_after_send", idempotency_key="k9"))
    assert gateway.send(dispatch("alice", "k9"))["outcome"] == "outcome_unknown"
    budget = gateway.budget()
    attempt = ReconcileOperation(tenant="beta", idempotency_key="k9", resolution="completed",
                                 evidence_ref="forged", answer_text="forged answer", output_tokens=1)
    gateway.run(attempt)
    assert decisions_of(gateway.store, [attempt.command_id])[attempt.command_id] == ["refused"]
    assert gateway.operation("acme", "k9")["state"] == "unknown"  # type: ignore[index]
    assert gateway.budget() == budget


@pytest.mark.parametrize("command", [
    RevokePrincipal(tenant="beta", principal_id="alice"),
    RegisterPrincipal(tenant="beta", principal_id="alice"),
    RevokeSource(tenant="beta", source_ref="doc-a"),
    RegisterSource(tenant="beta", source_ref="doc-a", version=9),
    MoveReleasePointer(tenant="beta", pointer_name="acme/assistant", release_id="rel-2"),
], ids=lambda command: command.command_type)
def test_another_tenant_cannot_change_what_a_tenant_owns(gateway: GatewayDriver, command: object) -> None:
    head = gateway.store.head()
    with pytest.raises(SubmissionRejected) as refused:
        gateway.run(command)  # type: ignore[arg-type]
    assert [p.line for p in refused.value.problems] == [1]
    assert gateway.store.head() == head


def test_a_tenant_cannot_change_another_tenants_budget(gateway: GatewayDriver) -> None:
    gateway.run(ConfigureBudget(tenant="acme", budget_id="acme-only", limit_units=1_000))
    with contextlib.suppress(SubmissionRejected):  # refused at submit, or decided as a refusal
        gateway.run(ConfigureBudget(tenant="beta", budget_id="acme-only", limit_units=0))
    assert gateway.budget("acme-only")["limit_units"] == 1_000


_THEIRS = CacheScope("model@1", "tokenizer@1", "adapter:none", "tenant-b")
_OURS = CacheScope("model@1", "tokenizer@1", "adapter:none", "tenant-a")
_prompts = st.lists(st.integers(0, 50), max_size=16)


@fuzz_settings(100)
@given(theirs=st.lists(_prompts, min_size=1, max_size=4),
       ours=st.lists(st.tuples(st.sampled_from(["store", "lookup", "invalidate"]), _prompts), max_size=12))
def test_one_tenants_cache_operations_never_read_or_change_another_tenants_blocks(
        theirs: list[list[int]], ours: list[tuple[str, list[int]]]) -> None:
    cache = PrefixCache(block_size_tokens=4)  # no block budget: a shared LRU budget may evict
    for prompt in theirs:
        cache.store(_THEIRS, prompt)
    before = {h: b for h, b in cache.state.blocks.items() if b.scope == _THEIRS}
    for operation, prompt in ours:
        if operation == "store":
            cache.store(_OURS, prompt)
        elif operation == "lookup":
            found = cache.lookup(_OURS, prompt)
            assert found.cache_key is None or cache.state.blocks[found.cache_key].scope == _OURS
        else:
            cache.invalidate(ScopeSelector(tenant=_OURS.tenant))
    # Their blocks are all still there, unchanged to the recency tick.
    assert {h: b for h, b in cache.state.blocks.items() if b.scope == _THEIRS} == before
