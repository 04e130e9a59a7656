"""Four forking workers on a real Redis race 500 placements for room for exactly 300."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

import pytest
from redis import Redis

from controlplane.commands import command_adapter
from controlplane.replay import compare_with_live
from controlplane.replay.verify import verify_decisions
from controlplane.service import accept, pending_command_ids
from controlplane.settings import Settings
from events.store import EventStore
from tests.factories import place_replica, register_model, register_node
from workers.processes import kill_process_tree
from workers.queue import enqueue_commands

pytestmark = pytest.mark.slow
NODES, GPUS_PER_NODE, REPLICAS = 75, 4, 500  # 300 GPUs, one replica per GPU


def start_workers(count: int) -> list[subprocess.Popen[bytes]]:
    args = [sys.executable, "-m", "controlplane.cli.main", "worker", "--burst"]
    return [subprocess.Popen(args, env=dict(os.environ), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(count)]


def setup_fleet(store: EventStore, redis: Redis) -> list[str]:
    inventory = [register_node(f"n{i:03d}", gpus=GPUS_PER_NODE, rack=f"rack-{i % 5}")
                 for i in range(NODES)] + [register_model()]
    accept(store, [command_adapter.validate_python(p) for p in inventory])
    enqueue_commands(redis, Settings(batch_size=100), pending_command_ids(store))
    for worker in start_workers(1):
        assert worker.wait(timeout=120) == 0
    placements = [command_adapter.validate_python(place_replica(f"r{i:03d}"))
                  for i in range(REPLICAS)]
    return accept(store, placements)


def assert_guarantees(store: EventStore) -> None:
    decided: Counter[str] = Counter()
    holds: Counter[tuple[str, str]] = Counter()
    outcomes: Counter[str] = Counter()
    for event in store.read_all():
        if (event.event_type in ("ReplicaPlaced", "PlacementRefused") and event.command_id
                and event.command_id.startswith("place-")):
            decided[event.command_id] += 1
            outcomes[event.event_type] += 1
        if event.event_type == "GpusReserved":
            for gpu_id in event.data["result"]["gpu_ids"]:
                holds[(event.data["result"]["node_id"], gpu_id)] += 1
    assert len(decided) == REPLICAS and set(decided.values()) == {1}, "decided once each"
    assert outcomes == {"ReplicaPlaced": 300, "PlacementRefused": 200}
    assert len(holds) == 300 and set(holds.values()) == {1}, "a GPU was reserved twice"
    refusals = [e for e in store.read_all() if e.event_type == "PlacementRefused"]
    assert all(any(r["code"] == "no_feasible_group" for r in e.data["reasons"]) for e in refusals)
    assert compare_with_live(store) == []
    assert verify_decisions(store).drifts == []


def test_racing_workers_place_exactly_the_capacity_and_refuse_the_rest(
        store: EventStore, real_redis: Redis) -> None:
    accepted = setup_fleet(store, real_redis)
    enqueue_commands(real_redis, Settings(batch_size=10), accepted)
    workers = start_workers(4)
    for worker in workers:
        assert worker.wait(timeout=300) == 0
    assert_guarantees(store)


def test_racing_workers_keep_every_guarantee_when_one_is_killed_mid_batch(
        store: EventStore, real_redis: Redis) -> None:
    accepted = setup_fleet(store, real_redis)
    enqueue_commands(real_redis, Settings(batch_size=10), accepted)
    workers = start_workers(4)
    deadline = time.monotonic() + 120
    while len(pending_command_ids(store)) > REPLICAS - 60 and time.monotonic() < deadline:
        time.sleep(0.01)
    kill_process_tree(workers[0].pid)
    for worker in workers[1:]:
        assert worker.wait(timeout=300) == 0
    workers[0].wait(timeout=10)
    # A fresh worker reconciles what the killed one held, then drains.
    for worker in start_workers(1):
        assert worker.wait(timeout=300) == 0
    assert_guarantees(store)
