"""A batch's provider calls run one after another after its commit; one job runs them for at
most half its timeout (or `EFFECTS_BUDGET_SECONDS`), then hands the rest to a job of their own."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from fakeredis import FakeRedis

from controlplane.gateway.fixture_provider import Behaviour
from controlplane.gateway.responses import response_for
from controlplane.gateway.scenario import GatewayDriver, dispatch
from controlplane.service import accept, unfinished_command_ids
from controlplane.state.fold import PENDING
from events.projections import SqlProjections
from workers import jobs
from workers.connections import embedded_server
from workers.pipeline import submit
from workers.queue import RESUME, command_queue, enqueue_commands


def test_slow_calls_of_one_batch_all_complete_within_their_jobs_timeouts(
        gateway: GatewayDriver) -> None:
    """Six calls of 0.4 s in a job with a 2-second timeout: the timeout had struck the fifth
    call mid-flight, recording a healthy call as an unknown outcome and holding its grant."""
    slow = GatewayDriver(replace(gateway.settings, job_timeout_seconds=2), gateway.store,
                         gateway.provider)
    gateway.provider.set_behaviour(Behaviour(latency_seconds=0.4))
    batch = [dispatch("alice", f"t{i}", max_output_tokens=64) for i in range(6)]
    slow.run(*batch)
    outcomes = [response_for(gateway.store, c.command_id)["outcome"] for c in batch]
    assert outcomes == ["completed"] * 6
    assert [gateway.calls(tenant="acme", key=f"t{i}") for i in range(6)] == [1] * 6
    assert gateway.budget()["reserved_units"] == 0


def test_calls_past_the_effects_budget_are_handed_to_a_job_of_their_own(
        gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the budget, the commands not yet called go to a `resume-` job (delivered again, a
    decided command resumes its calls); each is still called exactly once."""
    monkeypatch.setattr(jobs, "EFFECTS_BUDGET_SECONDS", 0.25)
    gateway.provider.set_behaviour(Behaviour(latency_seconds=0.2))
    handed: list[list[str]] = []
    enqueue = jobs.enqueue_commands

    def watched(connection, settings, ids, kind="decide"):  # type: ignore[no-untyped-def]
        if kind == "resume":
            handed.append(list(ids))
        return enqueue(connection, settings, ids, kind)

    monkeypatch.setattr(jobs, "enqueue_commands", watched)
    batch = [dispatch("alice", f"h{i}", max_output_tokens=64) for i in range(4)]
    gateway.run(*batch)
    assert [response_for(gateway.store, c.command_id)["outcome"] for c in batch] == \
        ["completed"] * 4
    assert [gateway.calls(tenant="acme", key=f"h{i}") for i in range(4)] == [1] * 4
    # The job runs at least one call (each job makes progress), then hands off the rest.
    assert handed and batch[0].command_id not in [c for ids in handed for c in ids]


def test_handed_off_calls_jump_the_queue(gateway: GatewayDriver) -> None:
    """A resume job queued behind every job waiting had let handed-off reservations outlive
    their lease under a backlog, and be settled as never sent."""
    connection = FakeRedis(server=embedded_server())
    settings = gateway.settings
    enqueue_commands(connection, settings, ["waiting-1", "waiting-2"])
    enqueue_commands(connection, settings, ["handed-off"], kind=RESUME)
    head = command_queue(connection, settings.command_queue).job_ids[0]
    assert head.startswith(f"{RESUME}-")
    connection.delete(command_queue(connection, settings.command_queue).key)


def test_an_embedded_submit_past_its_deadline_still_makes_the_calls_it_reserved(
        gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """`submit --wait --timeout` on the embedded queue stops after the job in hand; the calls
    that job handed off were left in this process's fake Redis, lost with it, unsent."""
    monkeypatch.setattr(jobs, "EFFECTS_BUDGET_SECONDS", 0.25)
    gateway.provider.set_behaviour(Behaviour(latency_seconds=0.2))
    batch = [dispatch("alice", f"w{i}", max_output_tokens=64) for i in range(5)]
    submit(gateway.settings, gateway.store, batch, deadline=time.monotonic() + 0.1)
    assert [gateway.operation("acme", f"w{i}")["state"] for i in range(5)] == ["completed"] * 5  # type: ignore[index]
    assert unfinished_command_ids(gateway.store) == []


def test_a_dispatch_is_checked_without_reading_every_pending_command(
        gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Dispatch precheck had made every submission read the whole pending table under the
    append lock, though nothing a Dispatch is checked for needs it."""
    read: list[str] = []
    items = SqlProjections.items

    def watched(self: SqlProjections, name: str):  # type: ignore[no-untyped-def]
        read.append(name)
        return items(self, name)

    monkeypatch.setattr(SqlProjections, "items", watched)
    accept(gateway.store, [dispatch("alice", "p1")])
    assert PENDING not in read
