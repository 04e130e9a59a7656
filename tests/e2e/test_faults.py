"""Seeded fault runs of the mixed scenario on real forking workers, real Redis and the real
databases: after every run each accepted command is decided exactly once, no GPU is held twice,
no live-token budget is overspent, the chain verifies, replay equals live, nothing drifts.

Each run prints its seed and the command that reproduces it; `FLEET_FAULT_SEED` moves every
seed at once (the default keeps CI reproducible). `bench/reliability_report.py` runs the same
plan (`planned_runs(2)`) with the same seeds and prints the figures of RELIABILITY.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from redis import Redis

from controlplane.faults import FaultRun, FaultTarget, run_fault, seed_for
from controlplane.workloads import mixed_fleet

pytestmark = pytest.mark.slow
REQUESTS = 80


def run_seeded(kind: str, index: int, database_url: str, redis_url: str, queue: str,
               scratch: Path) -> FaultRun:
    """One seeded run; fails naming the seed and every violation."""
    seed = seed_for(kind, index, "sqlite" if database_url.startswith("sqlite") else "postgresql")
    run = run_fault(kind, seed, FaultTarget(database_url, redis_url, queue, scratch), REQUESTS)
    print(f"fault={kind} seed={seed} database={run.database} faults={run.faults_injected} "
          f"commands={run.commands_decided} seconds={run.seconds:.1f}; reproduce: {run.reproduce()}")
    context = f"seed {seed} ({run.reproduce()}); notes {run.notes}; logs in {scratch}"
    assert run.violations == [], f"{context}:\n" + "\n".join(run.violations[:20])
    assert run.records_lost == 0, context
    assert run.faults_injected >= 1, f"no fault was injected: {context}"
    scenario = sum(len(phase) for phase in mixed_fleet(seed, REQUESTS, nodes=4, gpus_per_node=4,
                                                      replicas=4))
    assert run.commands_decided == run.commands_accepted >= scenario, context
    return run


@pytest.mark.parametrize("index", range(2))
def test_a_worker_killed_with_sigkill_mid_batch_loses_and_duplicates_nothing(
        database_url: str, real_redis: Redis, index: int, tmp_path: Path) -> None:
    run = run_seeded("worker_sigkill", index, database_url, os.environ["FLEET_TEST_REDIS_URL"],
                     os.environ["FLEET_QUEUE"], tmp_path)
    assert run.workers_killed == run.faults_injected


@pytest.mark.parametrize("index", range(2))
def test_redis_restarted_with_its_queue_lost_is_reconciled_from_the_inbox(
        database_url: str, redis_server_binary: None, index: int, tmp_path: Path) -> None:
    run_seeded("redis_restart", index, database_url, "redis://unused", "fleet-faults", tmp_path)


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("index", range(4))
def test_a_postgres_connection_dropped_mid_transaction_commits_nothing_half_done(
        database_url: str, real_redis: Redis, index: int, tmp_path: Path) -> None:
    run_seeded("postgres_dropped", index, database_url, os.environ["FLEET_TEST_REDIS_URL"],
               os.environ["FLEET_QUEUE"], tmp_path)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("index", range(4))
def test_workers_wait_out_another_sqlite_writer_and_decide_everything_once(
        database_url: str, real_redis: Redis, index: int, tmp_path: Path) -> None:
    run_seeded("sqlite_locked", index, database_url, os.environ["FLEET_TEST_REDIS_URL"],
               os.environ["FLEET_QUEUE"], tmp_path)


@pytest.mark.parametrize("index", range(2))
def test_the_same_jobs_delivered_twice_append_nothing_new(
        database_url: str, real_redis: Redis, index: int, tmp_path: Path) -> None:
    run = run_seeded("duplicate_delivery", index, database_url,
                     os.environ["FLEET_TEST_REDIS_URL"], os.environ["FLEET_QUEUE"], tmp_path)
    assert run.duplicates_delivered > 0


@pytest.mark.parametrize("index", range(2))
def test_a_job_abandoned_to_rqs_registry_cleanup_is_decided_once_by_a_new_worker(
        database_url: str, real_redis: Redis, index: int, tmp_path: Path) -> None:
    run = run_seeded("abandoned_job", index, database_url, os.environ["FLEET_TEST_REDIS_URL"],
                     os.environ["FLEET_QUEUE"], tmp_path)
    assert run.workers_killed >= run.faults_injected
