"""Real forking RQ workers on a real Redis, killed with SIGKILL in the middle of a batch."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

import pytest
from redis import Redis
from rq.registry import StartedJobRegistry

from controlplane.commands import command_adapter
from controlplane.decisions import ACCEPTED
from controlplane.service import accept, pending_command_ids
from controlplane.settings import Settings
from events.store import EventStore
from tests.factories import assess_memory
from workers.processes import kill_process_tree
from workers.queue import command_queue, enqueue_commands

pytestmark = pytest.mark.slow


def worker_process(burst: bool = True) -> subprocess.Popen[bytes]:
    """`fleetctl worker` in its own session; `kill_process_tree` takes its work horse too (RQ
    gives each horse a process group of its own)."""
    args = [sys.executable, "-m", "controlplane.cli.main", "worker"] + (["--burst"] if burst else [])
    return subprocess.Popen(args, env=dict(os.environ), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def decision_counts(store: EventStore) -> Counter[str]:
    return Counter(e.command_id for e in store.read_all()
                   if e.event_type != ACCEPTED and e.command_id)


def test_a_worker_killed_mid_batch_leaves_every_command_decided_once(
        store: EventStore, real_redis: Redis) -> None:
    total = 1_000
    commands = [command_adapter.validate_python(assess_memory(f"k{i:04d}", layers=1 + i % 50))
                for i in range(total)]
    accepted = accept(store, commands)
    enqueue_commands(real_redis, Settings(batch_size=25), accepted)

    victim = worker_process(burst=False)
    registry = StartedJobRegistry(queue=command_queue(real_redis))
    deadline = time.monotonic() + 60
    # Wait until some batches are committed and another is under way, then kill mid-batch.
    while time.monotonic() < deadline:
        decided = total - len(pending_command_ids(store))
        if decided >= 75 and registry.count > 0:
            break
        time.sleep(0.01)
    else:
        kill_process_tree(victim.pid)
        pytest.fail("the worker never got going")
    kill_process_tree(victim.pid)
    victim.wait(timeout=10)
    decided_at_kill = total - len(pending_command_ids(store))
    assert decided_at_kill < total, "the kill came too late to interrupt anything"

    rescuer = worker_process(burst=True)  # reconciles first, then drains the queue
    assert rescuer.wait(timeout=240) == 0
    counts = decision_counts(store)
    assert len(counts) == total, f"{total - len(counts)} command(s) never decided"
    assert set(counts.values()) == {1}, "a command was decided twice"
    assert pending_command_ids(store) == []
