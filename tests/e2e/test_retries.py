"""A job RQ retries after a back-off is delivered again by the running workers themselves.

RQ parks a retried job in the ScheduledJobRegistry; without a scheduler it would wait there
until someone ran `reconcile`. Real Redis, a real forking worker, its work horse SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from redis import Redis
from rq import Worker
from rq.registry import ScheduledJobRegistry, StartedJobRegistry

from controlplane.commands import command_adapter
from controlplane.service import accept, pending_command_ids
from controlplane.settings import Settings
from events.store import EventStore
from tests.e2e.test_worker_killed import decision_counts, worker_process
from tests.factories import assess_memory
from workers.processes import descendants, kill_process_tree
from workers.queue import command_queue, enqueue_commands

pytestmark = pytest.mark.slow


@contextmanager
def serving_worker(real_redis: Redis) -> Iterator[subprocess.Popen[bytes]]:
    """`fleetctl worker`, registered on the test's queue; killed with its work horse after.

    It reconciles as it starts, before the test accepts anything: nothing is pending yet.
    """
    worker = worker_process(burst=False)
    try:
        deadline = time.monotonic() + 30
        while Worker.count(queue=command_queue(real_redis)) < 1:
            assert time.monotonic() < deadline and worker.poll() is None, "the worker never started"
            time.sleep(0.02)
        yield worker
    finally:
        # With its work horse (a process group of its own): one left running wrote its job's
        # counts to Redis after the test's keys were removed, leaving keys that never expire.
        kill_process_tree(worker.pid)
        worker.wait(timeout=10)


def test_a_killed_work_horse_is_retried_after_its_back_off_without_a_reconcile(
        store: EventStore, real_redis: Redis) -> None:
    with serving_worker(real_redis) as worker:
        queue = command_queue(real_redis)
        deadline = time.monotonic() + 30
        total = 2_000
        accepted = accept(store, [command_adapter.validate_python(
            assess_memory(f"r{i:04d}", layers=1 + i % 50)) for i in range(total)])
        enqueue_commands(real_redis, Settings(batch_size=total), accepted)  # one job

        started = StartedJobRegistry(queue=queue)
        while not (started.count and descendants(worker.pid)):
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.005)
        for horse in descendants(worker.pid):
            os.kill(horse, signal.SIGKILL)
        assert len(pending_command_ids(store)) == total, "the kill came after the batch committed"

        deadline = time.monotonic() + 60
        while pending_command_ids(store):
            assert time.monotonic() < deadline, "the retried job was never delivered again"
            time.sleep(0.05)
        counts = decision_counts(store)
        assert len(counts) == total and set(counts.values()) == {1}


def test_a_retry_entry_rq_cannot_read_back_never_stops_the_worker(
        store: EventStore, real_redis: Redis) -> None:
    with serving_worker(real_redis) as worker:
        queue = command_queue(real_redis)
        # A job hash left with only a heartbeat (RQ's own code notes how that can happen),
        # due for retry now: RQ cannot restore it.
        real_redis.hset("rq:job:broken-job", "last_heartbeat", "2026-11-30T12:00:00.000000Z")
        real_redis.hset("rq:job:broken-job", "origin", queue.name)  # removed with the queue
        registry = ScheduledJobRegistry(queue=queue)  # type: ignore[no-untyped-call]
        real_redis.zadd(registry.key, {"broken-job": 1.0})
        time.sleep(3)  # several delivery attempts
        assert worker.poll() is None, "the worker stopped"

        accepted = accept(store, [command_adapter.validate_python(assess_memory(f"p{i}"))
                                  for i in range(20)])
        enqueue_commands(real_redis, Settings(), accepted)
        deadline = time.monotonic() + 30
        while pending_command_ids(store):
            assert time.monotonic() < deadline, "the worker no longer decides"
            time.sleep(0.05)
