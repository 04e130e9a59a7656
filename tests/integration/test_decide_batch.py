"""A batch reads its commands before taking the append lock, and still decides each only once."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Connection

from controlplane.commands import command_adapter
from controlplane.runtime import open_store
from controlplane.service import accept, decide
from controlplane.state.fleet import NODE
from controlplane.workloads import inventory, model, placement
from events.projection_cache import views_unbuilt
from events.projections import SqlProjections
from events.store import EventStore
from events.transaction import LogTransaction, ReadAhead
from tests.fleet_helpers import assert_replay_exact, decision


class InterleavedStore(EventStore):
    """A store on which another writer runs `before_lock` just before the lock is next taken."""

    def __init__(self, store: EventStore) -> None:
        super().__init__(store.engine, store.checkpoint_every)
        self.before_lock: Callable[[], None] | None = None

    def transaction(self, connection: Connection | None = None,
                    read_ahead: ReadAhead | None = None
                    ) -> AbstractContextManager[LogTransaction]:
        if self.before_lock is not None:
            action, self.before_lock = self.before_lock, None
            action()
        return super().transaction(connection, read_ahead)


def accepted(store: EventStore, *payloads: dict[str, Any]) -> list[str]:
    return accept(store, [command_adapter.validate_python(p) for p in payloads])


def test_a_command_decided_elsewhere_after_its_batch_read_the_inbox_is_not_decided_again(
        store: EventStore) -> None:
    decide(store, accepted(store, *inventory(1, 2), model()))
    interleaved = InterleavedStore(store)
    ids = accepted(store, placement("a", "chat"), placement("b", "chat"))
    interleaved.before_lock = lambda: decide(store, ids[:1])
    outcomes = decide(interleaved, ids)
    assert [o.decided_now for o in outcomes] == [False, True]
    for command_id in ids:
        events = [e for e in store.events_for_command(command_id)
                  if e.event_type != "CommandAccepted"]
        assert [e.event_type for e in events].count("ReplicaPlaced") == 1
    assert outcomes[0].events == (decision(store, ids[0]), *outcomes[0].events[1:])
    assert_replay_exact(store)


def test_a_batch_decides_on_state_another_writer_changed_after_it_read_the_inbox(
        store: EventStore) -> None:
    decide(store, accepted(store, *inventory(1, 2), model()))
    interleaved = InterleavedStore(store)
    mine = accepted(store, placement("mine", "chat", tensor_parallel_size=2))
    theirs = accepted(store, placement("theirs", "chat", tensor_parallel_size=2))
    interleaved.before_lock = lambda: decide(store, theirs)
    decide(interleaved, mine)
    assert decision(store, theirs[0]).event_type == "ReplicaPlaced"
    assert decision(store, mine[0]).event_type == "PlacementRefused"
    assert_replay_exact(store)


def test_a_batch_whose_store_committed_last_decides_on_what_another_process_appended_since(
        store: EventStore) -> None:
    """The store expects the head its last commit left (on PostgreSQL it reads ahead with the
    lock on that guess, its cache trusted at it); another process (an engine and cache of its
    own) moved it: nothing read or cached at the guess is used."""
    other = open_store(store.engine.url.render_as_string(hide_password=False))
    try:
        decide(store, accepted(store, *inventory(1, 2), model()))
        interleaved = InterleavedStore(store)
        warm, mine, theirs = (accepted(store, placement(name, "chat")) for name in
                              ("warm", "mine", "theirs"))
        decide(interleaved, warm)  # its last commit: the head it will guess, GPU view cached
        interleaved.before_lock = lambda: decide(other, theirs)  # takes the last free GPU
        decide(interleaved, mine)
        assert decision(store, theirs[0]).event_type == "ReplicaPlaced"
        assert decision(store, mine[0]).event_type == "PlacementRefused"
        assert_replay_exact(store)
    finally:
        other.engine.dispose()


def test_a_fresh_process_decides_on_what_was_appended_after_it_built_its_gpu_index(
        store: EventStore) -> None:
    """A fresh process (a work horse) builds its GPU index before taking the append lock;
    another process's placement committed in between is seen under the lock."""
    horse, mine, theirs = _horse_racing(store)
    built_before_lock: list[bool] = []
    try:
        interleaved = InterleavedStore(horse)
        interleaved.before_lock = lambda: (built_before_lock.append(not views_unbuilt(horse.engine)),
                                           decide(store, theirs))
        decide(interleaved, mine)
        assert built_before_lock == [True]
        _theirs_placed_mine_refused(store, mine, theirs)
    finally:
        horse.engine.dispose()


def _horse_racing(store: EventStore) -> tuple[EventStore, list[str], list[str]]:
    """A fresh process's store, and two placements on one node of two GPUs: the horse's own
    (one GPU) and another process's (both), which the horse must see once it is committed."""
    decide(store, accepted(store, *inventory(1, 2), model()))
    mine = accepted(store, placement("mine", "chat"))
    theirs = accepted(store, placement("theirs", "chat", tensor_parallel_size=2))
    horse = open_store(store.engine.url.render_as_string(hide_password=False), migrate=False)
    return horse, mine, theirs


def _theirs_placed_mine_refused(store: EventStore, mine: list[str], theirs: list[str]) -> None:
    assert decision(store, theirs[0]).event_type == "ReplicaPlaced"
    assert decision(store, mine[0]).event_type == "PlacementRefused"
    assert_replay_exact(store)


def test_a_fresh_process_sees_what_was_appended_before_its_warm_up_read_the_head(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Committed after the horse read its inbox, before the warm-up began (on SQLite its read
    transaction had already begun: the warm-up must read the head in it, not elsewhere)."""
    horse, mine, theirs = _horse_racing(store)
    warm = horse.warm

    def after_another_commit(connection: Connection, build: Callable[[Any], object]) -> None:
        decide(store, theirs)
        warm(connection, build)

    monkeypatch.setattr(horse, "warm", after_another_commit)
    try:
        decide(horse, mine)
        _theirs_placed_mine_refused(store, mine, theirs)
    finally:
        horse.engine.dispose()


def test_a_fresh_process_sees_what_was_appended_while_its_warm_up_read_the_nodes(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Committed just after the warm-up read the node table: the head it begins the cache at
    must be the one read before the rows (on PostgreSQL the next statement sees the commit)."""
    horse, mine, theirs = _horse_racing(store)
    stored = SqlProjections.stored_rows
    fired: list[bool] = []

    def then_another_commit(projections: SqlProjections, name: str) -> dict[str, str]:
        rows = stored(projections, name)
        if name == NODE and projections.connection.engine is horse.engine and not fired:
            fired.append(True)
            decide(store, theirs)
        return rows

    monkeypatch.setattr(SqlProjections, "stored_rows", then_another_commit)
    try:
        decide(horse, mine)
        assert fired
        _theirs_placed_mine_refused(store, mine, theirs)
    finally:
        horse.engine.dispose()


def test_a_warm_up_that_writes_is_refused_and_nothing_is_stored(store: EventStore) -> None:
    """Only a write transaction writes projection rows; a warm-up's would be lost."""
    with store.reading() as connection, pytest.raises(ValueError, match="may only read"):
        store.warm(connection, lambda state: state.put("things", "a", {"n": 1}))
    with store.reading() as connection:
        assert SqlProjections(connection).get("things", "a") is None


def test_each_decision_is_logged_at_debug_level_and_only_counted_at_info(
        store: EventStore, capsys: Any) -> None:
    from controlplane.logging import configure_logging

    ids = accepted(store, *inventory(nodes=2, gpus_per_node=2), model())
    try:
        configure_logging("DEBUG")
        decide(store, ids[:1])
        debug = capsys.readouterr().err
        configure_logging("INFO")
        decide(store, ids[1:2])
        info = capsys.readouterr().err
    finally:
        with capsys.disabled():  # log to the real stderr again, not to this test's capture
            configure_logging(None)
    assert '"command_decided"' in debug and ids[0] in debug
    assert "command_decided" not in info and ids[1] not in info


def test_a_batch_logs_how_long_it_waited_for_the_append_lock_and_held_it(
        store: EventStore, capsys: Any) -> None:
    import json
    import threading
    import time

    from controlplane.logging import configure_logging
    from controlplane.runtime import store_for_process
    from controlplane.settings import Settings
    from workers.jobs import decide_commands

    ids = accepted(store, *inventory(nodes=1, gpus_per_node=2), model())
    assert store_for_process(Settings.from_env()) is not store
    holding = threading.Event()

    def hold_the_lock() -> None:  # another writer (its own engine) holds the lock for 1 s
        with store.transaction():
            holding.set()
            time.sleep(1.0)

    other = threading.Thread(target=hold_the_lock)
    try:
        configure_logging("INFO")
        other.start()
        holding.wait(5)
        decide_commands(ids)
        other.join()
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()
                 if line.startswith("{")]
    finally:
        with capsys.disabled():
            configure_logging(None)
    (batch,) = [line for line in lines if line["event"] == "batch_decided"]
    assert batch["decided_now"] == len(ids)
    assert batch["lock_wait_ms"] >= 500  # it waited for the other writer...
    assert 0 < batch["lock_held_ms"] < 1_000  # ...whose 1 s hold is not counted as its own


def test_a_decision_reads_its_commands_and_appends_on_one_connection(store: EventStore) -> None:
    """The inbox read and the append share one connection (on PostgreSQL one transaction):
    one checkout, one ping, instead of two."""
    decide(store, accepted(store, *inventory(1, 2), model()))
    ids = accepted(store, placement("one", "chat"))
    checkouts: list[object] = []

    def count(*args: object) -> None:
        checkouts.append(args)

    event.listen(store.engine, "checkout", count)
    try:
        [outcome] = decide(store, ids)
    finally:
        event.remove(store.engine, "checkout", count)
    assert outcome.decided_now and len(checkouts) == 1
    assert decision(store, ids[0]).event_type == "ReplicaPlaced"
    assert_replay_exact(store)
