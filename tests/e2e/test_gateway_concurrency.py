"""Eight forking workers on a real Redis dispatch against one shared budget; a worker dies mid-call.

The budget is never overspent, every request ends in one recorded decision, every operation in a
recorded state, and no (tenant, key) reaches the provider twice, whichever process handles it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from controlplane.commands.gateway import ReconcileOperation
from controlplane.decisions import ACCEPTED
from controlplane.gateway.fixture_provider import FIXTURE_DIR_ENV, Behaviour, Fault, FixtureProvider
from controlplane.gateway.responses import response_for
from controlplane.gateway.scenario import (
    GatewayDriver,
    common_fixture,
    dispatch,
)
from controlplane.replay import compare_with_live
from controlplane.replay.verify import verify_decisions
from controlplane.service import accept, decide, pending_command_ids
from controlplane.settings import Settings
from controlplane.state import gateway as gw
from events import transaction
from events.projections import SqlProjections
from events.store import EventStore
from tests.factories import wall_clock_after
from workers.queue import enqueue_commands

pytestmark = pytest.mark.slow
LIMIT_UNITS, GRANT_UNITS = 5_000, 356  # room for exactly 14 operations
DECISIONS = (gw.DISPATCH_DENIED, gw.OPERATION_RESERVED, gw.OPERATION_REPLAYED)


def start_workers(count: int) -> list[subprocess.Popen[bytes]]:
    args = [sys.executable, "-m", "controlplane.cli.main", "worker", "--burst"]
    return [subprocess.Popen(args, env=dict(os.environ), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(count)]


@pytest.fixture
def gateway(store: EventStore, real_redis: Redis, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> GatewayDriver:
    monkeypatch.setenv(FIXTURE_DIR_ENV, str(tmp_path / "provider"))
    # Workers reconcile on start; one-command batches keep their jobs identical to ours.
    monkeypatch.setenv("FLEET_BATCH_SIZE", "1")
    provider = FixtureProvider(tmp_path / "provider")
    setup = common_fixture(budget_limit_units=LIMIT_UNITS)
    decide(store, accept(store, setup))  # the registries, decided in-process before the race
    return GatewayDriver(Settings.from_env(), store, provider)


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_eight_workers_never_overspend_one_budget_and_never_call_a_key_twice(
        gateway: GatewayDriver, real_redis: Redis) -> None:
    store, provider = gateway.store, gateway.provider
    provider.set_behaviour(Behaviour(latency_seconds=0.02))
    provider.script(Fault("timeout_after_send", tenant="acme", times=3),
                    Fault("persist_fails", tenant="beta", times=1))
    # 24 distinct keys over two tenants sharing the budget, every third one sent three times.
    requests = []
    for index in range(24):
        principal = ("alice", "bob", "carol")[index % 3]
        copies = 3 if index % 3 == 0 else 1
        requests += [dispatch(principal, f"race-{index:02d}") for _ in range(copies)]
    accepted = accept(store, requests)
    assert len(accepted) == len(requests)
    enqueue_commands(real_redis, Settings(batch_size=1), accepted)
    for worker in start_workers(8):
        assert worker.wait(timeout=240) == 0

    assert pending_command_ids(store) == []
    decisions = Counter(e.command_id for e in store.read_all()
                        if e.event_type in DECISIONS and e.command_id in set(accepted))
    assert len(decisions) == len(requests) and set(decisions.values()) == {1}
    operations = {key: row for key, row in _rows(store, gw.OPERATIONS)}
    states = Counter(row["state"] for row in operations.values())
    assert len(operations) == LIMIT_UNITS // GRANT_UNITS == 14
    assert set(states) <= {"completed", "unknown"}, states
    for row in operations.values():
        assert gateway.calls(tenant=row["tenant"], key=row["idempotency_key"]) == 1
    assert gateway.calls() == len(operations)
    budget = gateway.budget()
    assert budget["reserved_units"] + budget["committed_units"] <= LIMIT_UNITS
    assert budget["reserved_units"] == GRANT_UNITS * states["unknown"]
    assert budget["committed_units"] == GRANT_UNITS * states["completed"]
    denied = [response_for(store, c.command_id) for c in requests]
    assert {r["code"] for r in denied if r["outcome"] == "denied"} <= {"quota_exceeded"}
    # A forking worker runs each job in a child: its parent is the worker process.
    assert len({call["parent_pid"] for call in provider.calls()}) > 1, "one worker made every call"
    assert verify_decisions(store).drifts == []
    assert compare_with_live(store) == []


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_worker_dying_mid_call_leaves_the_operation_dispatching_and_never_calls_again(
        gateway: GatewayDriver, real_redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    store, provider = gateway.store, gateway.provider
    provider.script(Fault("crash_after_send", idempotency_key="crash"))
    sent_at = datetime.now(UTC)
    first = dispatch("alice", "crash", at=sent_at)
    enqueue_commands(real_redis, Settings(batch_size=1), accept(store, [first]))
    for worker in start_workers(1):
        worker.wait(timeout=120)
    time.sleep(1.5)  # let RQ's retry of the failed job fall due, then serve it
    for worker in start_workers(1):
        assert worker.wait(timeout=120) == 0
    operation = gateway.operation("acme", "crash")
    assert operation is not None and operation["state"] == "dispatching"
    assert gateway.calls(key="crash") == 1
    assert gateway.budget()["reserved_units"] == GRANT_UNITS
    # A retry by the caller is a replay: in progress, then unknown once the lease has run out
    # (on the control plane's clock too: this process decides the retries, on a clock moved on).
    for at, outcome in ((sent_at + timedelta(seconds=5), "operation_in_progress"),
                        (sent_at + timedelta(seconds=901), "outcome_unknown")):
        if outcome == "outcome_unknown":
            monkeypatch.setattr(transaction, "wall_clock", wall_clock_after(901))
        retry = dispatch("alice", "crash", at=at)
        decide(store, accept(store, [retry]))
        assert response_for(store, retry.command_id)["outcome"] == outcome
    evidence = provider.calls(idempotency_key="crash")[0]
    reconcile = ReconcileOperation(tenant="acme", idempotency_key="crash", resolution="not_processed",
                                   evidence_ref=f"ledger:{evidence['route_call_number']}",
                                   at=sent_at + timedelta(seconds=902))
    decide(store, accept(store, [reconcile]))
    assert gateway.operation("acme", "crash")["state"] == "failed"  # type: ignore[index]
    assert gateway.budget()["reserved_units"] == 0
    assert gateway.calls(key="crash") == 1
    assert sum(1 for e in store.read_all() if e.event_type == ACCEPTED) > 0
    assert verify_decisions(store).drifts == []


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_worker_dying_during_one_call_leaves_its_batchs_other_operations_unsent_then_resumed(
        gateway: GatewayDriver, real_redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Marked together with the decision, the batch's other operations had stayed dispatching,
    never sent, until the lease made them unknown outcomes; marked one at a time, they stay
    reserved until the job delivered again (or a worker's reconcile) sends each once."""
    store, provider = gateway.store, gateway.provider
    monkeypatch.setenv("FLEET_BATCH_SIZE", "3")
    keys = ("crash", "next-1", "next-2")
    provider.script(Fault("crash_after_send", idempotency_key="crash"))
    now = datetime.now(UTC)
    batch = [dispatch("alice", key, at=now) for key in keys]
    enqueue_commands(real_redis, Settings(batch_size=len(keys)), accept(store, batch))
    for worker in start_workers(1):
        worker.wait(timeout=120)  # its work horse dies in the first call
    time.sleep(1.5)  # let RQ's retry of the failed job fall due, then serve it
    for worker in start_workers(1):
        assert worker.wait(timeout=120) == 0
    states = [gateway.operation("acme", key)["state"] for key in keys]  # type: ignore[index]
    assert states == ["dispatching", "completed", "completed"]
    assert [gateway.calls(key=key) for key in keys] == [1, 1, 1]
    assert gateway.budget()["reserved_units"] == GRANT_UNITS  # the crashed call's grant only
    assert verify_decisions(store).drifts == []
    assert compare_with_live(store) == []


def _rows(store: EventStore, name: str) -> list[tuple[str, dict[str, Any]]]:
    with store.engine.connect() as conn:
        return list(SqlProjections(conn).items(name))
