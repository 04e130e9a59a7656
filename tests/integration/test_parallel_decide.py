"""Deciding on a snapshot, outside the append lock, is exactly as if decided under it.

Each test makes another writer append between a batch's snapshot and its lock (a second store
on the same database, as another worker process would), on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest

from controlplane.commands import command_adapter
from controlplane.service import accept, decide
from controlplane.workloads import at, inventory, model, placement, ready
from events.store import EventStore, LogTransaction
from events.verify import verify_chain
from tests.fleet_helpers import assert_replay_exact, decision


class InterleavedStore(EventStore):
    """A store that finds the append lock busy, and lets another writer append meanwhile.

    `try_transaction` answers None (as when another process holds the lock), so batches are
    decided on a snapshot; `before_lock` runs once, just before the lock is then taken.
    """

    def __init__(self, store: EventStore) -> None:
        super().__init__(store.engine, store.checkpoint_every)
        self.before_lock: Callable[[], None] | None = None
        self.snapshots = 0

    @contextmanager
    def try_transaction(self) -> Iterator[LogTransaction | None]:
        yield None

    def snapshot(self) -> AbstractContextManager[LogTransaction]:
        self.snapshots += 1
        return super().snapshot()

    def transaction(self) -> AbstractContextManager[LogTransaction]:
        if self.before_lock is not None:
            action, self.before_lock = self.before_lock, None
            action()
        return super().transaction()


def accepted(store: EventStore, *payloads: dict[str, Any]) -> list[str]:
    return accept(store, [command_adapter.validate_python(p) for p in payloads])


@pytest.fixture
def fleet(store: EventStore) -> Iterator[InterleavedStore]:
    """One node of two GPUs and a registered model, decided."""
    decide(store, accepted(store, *inventory(1, 2), model()))
    yield InterleavedStore(store)


def test_a_decision_whose_reads_moved_is_decided_again_under_the_lock(
        store: EventStore, fleet: InterleavedStore) -> None:
    # The batch sees two free GPUs on its snapshot; meanwhile another worker takes both.
    mine = accepted(store, placement("mine", "chat", tensor_parallel_size=2))
    theirs = accepted(store, placement("theirs", "chat", tensor_parallel_size=2))
    fleet.before_lock = lambda: decide(store, theirs)
    decide(fleet, mine)
    assert decision(store, theirs[0]).event_type == "ReplicaPlaced"
    refused = decision(store, mine[0])
    assert refused.event_type == "PlacementRefused"
    assert refused.data["read_position"] > decision(store, theirs[0]).position
    assert_replay_exact(store)


def test_a_decision_whose_reads_did_not_move_is_appended_after_others_and_replays_exactly(
        store: EventStore, fleet: InterleavedStore) -> None:
    # Another worker registers another model meanwhile: nothing the placement read changed.
    mine = accepted(store, placement("mine", "chat", tensor_parallel_size=1))
    theirs = accepted(store, model("llama-copy"))
    fleet.before_lock = lambda: decide(store, theirs)
    decide(fleet, mine)
    placed = decision(store, mine[0])
    other = decision(store, theirs[0])
    assert placed.event_type == "ReplicaPlaced" and placed.position > other.position
    # It records the position it is exact at: after the other writer's events.
    assert placed.data["read_position"] == placed.position - 1
    assert verify_chain(store.read_all(raw=True), store.head()).ok
    assert_replay_exact(store)


def test_a_batch_nobody_raced_is_adopted_as_decided_on_its_snapshot(
        store: EventStore, fleet: InterleavedStore) -> None:
    ids = accepted(store, placement("a", "chat"), placement("b", "chat"), ready("a"))
    outcomes = decide(fleet, ids)
    assert fleet.snapshots == 1
    assert [o.decided_now for o in outcomes] == [True, True, True]
    stored = {e.event_id: e for o in outcomes for e in store.events_for_command(o.command_id)}
    assert all(stored[e.event_id] == e for o in outcomes for e in o.events)
    assert verify_chain(store.read_all(raw=True), store.head()).ok
    assert_replay_exact(store)


def test_a_command_decided_by_another_worker_meanwhile_is_not_decided_twice(
        store: EventStore, fleet: InterleavedStore) -> None:
    ids = accepted(store, placement("a", "chat"))
    fleet.before_lock = lambda: decide(store, ids)
    outcomes = decide(fleet, ids)
    assert [o.decided_now for o in outcomes] == [False]
    events = [e for e in store.events_for_command(ids[0]) if e.event_type != "CommandAccepted"]
    assert [e.event_type for e in events].count("ReplicaPlaced") == 1
    assert_replay_exact(store)


def test_a_read_of_state_another_stream_changed_is_caught_not_only_version_conflicts(
        store: EventStore, fleet: InterleavedStore) -> None:
    # Readiness is appended to the replica's stream but changes the pool's budget, which the
    # admission reads while appending to the request's and pool's streams: no version conflict.
    decide(store, accepted(store, placement("r", "chat")))
    admit = accepted(store, {"type": "AdmitRequest", "command_id": "admit-q", "request_id": "q",
                             "pool_id": "chat", "at": at(5), "prompt_tokens": 100,
                             "max_output_tokens": 100, "deadline_at": at(60)})
    marked = accepted(store, ready("r", seconds=3))
    fleet.before_lock = lambda: decide(store, marked)
    decide(fleet, admit)
    assert decision(store, admit[0]).event_type == "RequestAdmitted"
    assert_replay_exact(store)


def test_a_decider_that_finds_the_lock_free_decides_under_it(store: EventStore) -> None:
    decide(store, accepted(store, *inventory(1, 2), model()))
    counting = InterleavedStore(store)
    counting.try_transaction = lambda: EventStore.try_transaction(counting)  # type: ignore[method-assign]
    decide(counting, accepted(store, placement("a", "chat")))
    assert counting.snapshots == 0
    assert_replay_exact(store)


def test_a_decider_that_finds_the_lock_held_decides_on_a_snapshot_then_appends(
        store: EventStore) -> None:
    decide(store, accepted(store, *inventory(1, 2), model()))
    counting = InterleavedStore(store)
    counting.try_transaction = lambda: EventStore.try_transaction(counting)  # type: ignore[method-assign]
    ids = accepted(store, placement("a", "chat"))
    holding, released = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with EventStore(store.engine).transaction():
            holding.set()
            released.wait(10)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    holding.wait(10)
    threading.Timer(0.3, released.set).start()
    decide(counting, ids)
    holder.join()
    assert counting.snapshots == 1
    assert decision(store, ids[0]).event_type == "ReplicaPlaced"
    assert_replay_exact(store)
