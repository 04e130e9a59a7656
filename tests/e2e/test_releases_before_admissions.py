"""Forking workers on a real Redis given the releases' batches before the admissions' batches:
each release waits for its admission, none is rejected, and every live token comes back."""

from __future__ import annotations

from collections import Counter

import pytest
from redis import Redis

from controlplane.commands import command_adapter
from controlplane.replay import compare_with_live
from controlplane.replay.verify import verify_decisions
from controlplane.service import accept, pending_command_ids
from controlplane.settings import Settings
from events.store import EventStore
from tests.e2e.test_placement_race import start_workers
from tests.factories import place_replica, register_model, register_node
from tests.integration.test_admission_commands import POOL, admit, release, set_admission
from workers.queue import enqueue_commands

pytestmark = pytest.mark.slow
REQUESTS, BATCH = 120, 10


def test_releases_decided_before_their_admissions_wait_and_free_every_token(
        store: EventStore, real_redis: Redis) -> None:
    fleet = [register_node("n1", gpus=4), register_model(), set_admission(),
             place_replica("r1"), {"type": "MarkReplicaReady", "replica_id": "r1",
                                   "command_id": "ready-r1"}]
    accept(store, [command_adapter.validate_python(p) for p in fleet])
    enqueue_commands(real_redis, Settings(batch_size=100), pending_command_ids(store))
    for worker in start_workers(1):
        assert worker.wait(timeout=120) == 0
    admissions = accept(store, [command_adapter.validate_python(admit(f"q{i}", 100))
                                for i in range(REQUESTS)])
    releases = accept(store, [command_adapter.validate_python(release(f"q{i}", second=1))
                              for i in range(REQUESTS)])
    # The later batches first: every release reaches a worker before its admission.
    batches = [releases[i:i + BATCH] for i in range(0, REQUESTS, BATCH)][::-1] + \
        [admissions[i:i + BATCH] for i in range(0, REQUESTS, BATCH)][::-1]
    for batch in batches:
        enqueue_commands(real_redis, Settings(batch_size=BATCH), batch)
    for worker in start_workers(2):
        assert worker.wait(timeout=300) == 0
    outcomes = Counter(e.data["outcome"] for e in store.read_all()
                       if e.command_id in set(releases) and "outcome" in e.data
                       and e.stream_id.startswith("request/"))
    assert outcomes == {"release": REQUESTS}
    assert not [e for e in store.read_all() if e.event_type == "CommandRejected"]
    assert store.read_stream(f"pool/{POOL}")[-1].data["result"]["live_tokens"] == 0
    assert pending_command_ids(store) == []
    assert compare_with_live(store) == []
    assert verify_decisions(store).drifts == []
