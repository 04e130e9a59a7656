"""A batch's provider calls run one after another after its commit; one job runs them for at
most half its timeout (or `EFFECTS_BUDGET_SECONDS`), then hands the rest to a job of their own."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.gateway.fixture_provider import Behaviour
from controlplane.gateway.responses import response_for
from controlplane.gateway.scenario import GatewayDriver, dispatch
from workers import jobs


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
    decided command resumes its calls); each is still called exactly once, in order."""
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
