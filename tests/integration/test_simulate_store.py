"""The simulation's store writes exactly the log the ordinary store would, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from controlplane.replay import compare_with_live, verify_decisions
from controlplane.runtime import open_store
from controlplane.simulation.config import SimulationConfig
from controlplane.simulation.run import Simulation, SimulationRun
from controlplane.simulation.store import SimulationStore
from controlplane.simulation.traces import read_trace
from events.merkle import CHECKPOINT_STREAM
from events.store import EventStore
from tests.integration.test_simulate import MOONCAKE_CONV, decided_commands_by_type

# Busy enough to scale up, short rollout intervals so the ladder moves within the slice.
CONFIG = SimulationConfig(speedup=4.0, warmup_seconds=3.0, autoscale_interval_seconds=3.0,
                          rollout_start_fraction=0.0, rollout_interval_seconds=4.0,
                          canary_min_samples=3, max_queued_requests=8, deadline_seconds=20.0)


def comparable(store: EventStore) -> list[tuple[Any, ...]]:
    # recorded_at (and so every hash and checkpoint root) is wall-clock; everything else must match.
    return [(e.position, e.stream_id, e.stream_version, e.event_type, e.command_id,
             e.causation_id, e.occurred_at, e.data if e.stream_id != CHECKPOINT_STREAM else None)
            for e in store.read_all()]


def run(store: EventStore) -> SimulationRun:
    return Simulation(read_trace(MOONCAKE_CONV, 120), CONFIG, store).run()


def test_the_mirrored_store_writes_the_ordinary_stores_log(database_url: str, tmp_path: Path) -> None:
    # A checkpoint every 50 events, so the mirror must follow the checkpoint stream too.
    mirrored = SimulationStore(open_store(database_url).engine, checkpoint_every=50)
    ordinary = EventStore(open_store(f"sqlite:///{tmp_path}/ordinary.db").engine, checkpoint_every=50)
    mirrored_run, ordinary_run = run(mirrored), run(ordinary)
    assert comparable(mirrored) == comparable(ordinary)
    assert sum(1 for e in mirrored.read_all() if e.stream_id == CHECKPOINT_STREAM) >= 5
    assert mirrored_run.decisions == ordinary_run.decisions
    # The slice exercised every kind of control decision the simulation makes.
    assert {"PlaceReplica", "MarkReplicaReady", "ObserveLoad", "StartRollout",
            "RecordCanaryMeasurement", "EvaluateCanary"} <= set(mirrored_run.decisions)
    assert compare_with_live(mirrored) == []
    assert verify_decisions(mirrored).identical
    assert decided_commands_by_type(mirrored) == Counter(mirrored_run.decisions)
