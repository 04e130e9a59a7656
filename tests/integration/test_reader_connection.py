"""A decision reads its commands and appends on one connection, which it leaves as it found it.

`EventStore.reading` gives the connection; `EventStore.transaction(connection)` goes on on it
under the append lock (SQLite: BEGIN IMMEDIATE after the read transaction ends; PostgreSQL: the
head row's lock, in the transaction the reads began).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from controlplane import deciding
from controlplane.commands import command_adapter
from controlplane.service import accept, decide
from controlplane.workloads import inventory, model, placement
from events.model import ConcurrencyConflict, StreamAppend
from events.projections import SqlProjections
from events.store import EventStore
from tests.factories import append_marker, event
from tests.fleet_helpers import assert_replay_exact, decision


@contextmanager
def another_writer_refused(store: EventStore) -> Iterator[None]:
    """Inside the block, a second writer cannot take the append lock (it would wait)."""
    if store.engine.dialect.name == "sqlite":
        raw = sqlite3.connect(str(store.engine.url.database), timeout=0, isolation_level=None)
        try:
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                raw.execute("BEGIN IMMEDIATE")
        finally:
            raw.close()
    else:
        with store.engine.connect() as other, pytest.raises(OperationalError, match="lock"):
            other.exec_driver_sql("SELECT position FROM log_head WHERE id = 1 FOR UPDATE NOWAIT")
    yield


def test_a_transaction_on_a_readers_connection_holds_the_lock_and_leaves_it_as_it_was(
        store: EventStore) -> None:
    store.append([StreamAppend("s/1", 0, [event("a")])])
    with store.reading() as connection:
        assert [e.event_id for e in store.events_for_commands(["cmd"], connection)["cmd"]]
        with store.transaction(connection) as tx, another_writer_refused(store):
            assert connection.get_execution_options()["fleet_write"] is True
            tx.append([StreamAppend("s/1", 1, [event("b")])])
        assert not connection.in_transaction()
        assert connection.get_execution_options().get("fleet_write") is False
        with pytest.raises(RuntimeError), store.transaction(connection) as tx:
            tx.append([StreamAppend("s/1", 2, [event("lost")])])
            raise RuntimeError("handler crashed")
        assert not connection.in_transaction()
        assert connection.get_execution_options().get("fleet_write") is False
    assert [e.data["slot"] for e in store.read_stream("s/1")] == ["a", "b"]


def test_a_conflict_retried_on_the_readers_connection_decides_once(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    decide(store, accept(store, [command_adapter.validate_python(p)
                                 for p in (*inventory(1, 2), model())]))
    ids = accept(store, [command_adapter.validate_python(placement("r", "chat"))])
    real = deciding._decide_in
    calls: list[int] = []

    def conflicting_once(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            real(*args)  # appends and folds, then another writer is found to have moved on
            raise ConcurrencyConflict("node/n-0", 0, 1)
        return real(*args)

    monkeypatch.setattr(deciding, "_decide_in", conflicting_once)
    [outcome] = decide(store, ids)
    assert outcome.decided_now and len(calls) == 2
    assert decision(store, ids[0]).event_type == "ReplicaPlaced"
    assert [e.event_type for e in store.events_for_command(ids[0])].count("ReplicaPlaced") == 1
    assert_replay_exact(store)


def test_a_transaction_that_fails_after_settling_the_cache_leaves_only_stored_rows_trusted(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its rows were cached and the cache settled, then it failed: the next transaction must see
    exactly the stored rows. On SQLite the commit comes after, so nothing was stored (and the
    head did not move); on PostgreSQL the COMMIT rode with the writes, so the row stands."""
    with store.transaction() as tx:
        tx.projections.get("tested", "k")  # cached as absent, at this head
    settle = SqlProjections.settle

    def settle_then_fail(self: SqlProjections, head: Any = None) -> None:
        settle(self, head)
        raise OperationalError("COMMIT", {}, Exception("the commit failed"))

    monkeypatch.setattr(SqlProjections, "settle", settle_then_fail)
    with pytest.raises(OperationalError), store.transaction() as tx:
        append_marker(tx)
        tx.projections.put("tested", "k", {"v": 1})
    monkeypatch.setattr(SqlProjections, "settle", settle)
    with store.engine.connect() as fresh:
        stored = SqlProjections(fresh).get("tested", "k")
    assert stored == (None if store.engine.dialect.name == "sqlite" else {"v": 1})
    with store.transaction() as tx:
        assert tx.projections.get("tested", "k") == stored
