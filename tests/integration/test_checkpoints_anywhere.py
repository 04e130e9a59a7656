"""Checkpoints may fall anywhere: a mixed fleet decided on a log that checkpoints after nearly
every append decides, replays and verifies as one that checkpoints every 1,000 events."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from controlplane.commands import command_adapter
from controlplane.replay import compare_with_live
from controlplane.replay.verify import verify_decisions
from controlplane.runtime import open_store
from controlplane.service import accept, decide, pending_command_ids
from controlplane.workloads import mixed_fleet
from events.store import EventStore
from events.verify import verify_log

SEED = 20261202


def decided(store: EventStore) -> Counter[str]:
    """Each command's decision outcomes (checkpoints carry no command)."""
    for phase in mixed_fleet(SEED, requests=150):
        accept(store, [command_adapter.validate_python(p) for p in phase])
        while pending := pending_command_ids(store):  # follow-ups too
            decide(store, pending)
    return Counter((e.command_id, e.data["outcome"]) for e in store.read_all()
                   if e.command_id and "outcome" in e.data)


def test_a_log_checkpointing_after_every_append_decides_exactly_as_one_that_rarely_does(
        store: EventStore, tmp_path: Path) -> None:
    dense = EventStore(store.engine, checkpoint_every=2)
    outcomes = decided(dense)
    checkpoints = [e for e in dense.read_all() if e.event_type == "LogCheckpointed"]
    assert len(checkpoints) > 100
    assert verify_log(dense).ok
    assert compare_with_live(dense) == [] and verify_decisions(dense).drifts == []
    sparse = open_store(f"sqlite:///{tmp_path}/sparse.db")
    assert decided(sparse) == outcomes
    sparse.engine.dispose()
