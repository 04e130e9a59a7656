"""The log's hot statements on the driver's cursor: values bound, errors as SQLAlchemy's."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, NoResultFound, OperationalError

from controlplane.commands import command_adapter
from controlplane.runtime import open_store
from controlplane.service import accept, decide
from controlplane.workloads import assessment, inventory, model, placement
from events import database, driver
from events.canonical import GENESIS_HASH
from events.model import StatementFailed, StreamAppend
from events.projections import UPSERT_ROWS, SqlProjections
from events.store import EventStore
from events.tables import log_head_table
from events.transaction import LogTransaction, ReadAhead
from tests.conftest import reset_postgres
from tests.factories import append_marker, event
from tests.libpq_trace import checkouts_traced, protocol_trace, round_trips

EVENT_IDS = "SELECT event_id FROM events WHERE stream_id = ? AND event_id IN ({in}) ORDER BY event_id"


def test_values_are_bound_never_written_into_the_statement(store: EventStore) -> None:
    store.append([StreamAppend("s/1", 0, [event("a", {}), event("b", {})])])
    hostile = "a') OR 1=1 --"
    with store.engine.connect() as conn:
        assert driver.fetch(conn, EVENT_IDS, "s/1", in_values=[hostile]) == []
        ids = [e.event_id for e in store.read_stream("s/1")]
        assert driver.fetch(conn, EVENT_IDS, "s/1", in_values=ids) == [(i,) for i in sorted(ids)]


def test_a_driver_error_is_sqlalchemys_and_the_transaction_writes_nothing(store: EventStore) -> None:
    store.append([StreamAppend("s/1", 0, [event("a", {})])])
    with pytest.raises(IntegrityError), store.transaction() as tx:
        driver.execute(tx.connection, "UPDATE log_head SET position = 99 WHERE id = 1")
        driver.execute_many(tx.connection, "INSERT INTO log_head (id, position, hash) VALUES (?, ?, ?)",
                            [(1, 5, "x")])
    assert store.head()[0] == 1
    with pytest.raises(DBAPIError), store.engine.connect() as conn:
        driver.fetch(conn, "SELECT no_such_column FROM events")


def test_a_driver_with_an_unknown_parameter_style_is_refused() -> None:
    with pytest.raises(ValueError, match="named"):
        driver._text("SELECT ?", 0, "named")


def test_a_sqlite_writer_that_cannot_have_the_lock_gets_sqlalchemys_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database, "SQLITE_BUSY_TIMEOUT_MS", 100)
    store = open_store(f"sqlite:///{tmp_path}/locked.db")
    holder = sqlite3.connect(tmp_path / "locked.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(OperationalError, match="locked"), store.transaction():
            pass
    finally:
        holder.rollback()
        holder.close()
    store.append([StreamAppend("s/1", 0, [event("a", {})])])  # the lock is free again
    assert store.head()[0] == 1


def test_a_log_without_its_head_row_is_refused_with_sqlalchemys_error(store: EventStore) -> None:
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM log_head")
    try:
        with pytest.raises(NoResultFound, match="no head row"), store.transaction():
            pass
    finally:  # the PostgreSQL database outlives this test: put the empty log's head back
        with store.engine.begin() as conn:
            conn.execute(log_head_table.insert().values(id=1, position=0, hash=GENESIS_HASH))


@pytest.mark.parametrize("through", ["driver", "sqlalchemy"])
def test_a_write_transaction_whose_failed_statement_was_caught_commits_nothing(
        store: EventStore, through: str) -> None:
    """SQLite would commit the statements that succeeded around one that failed; PostgreSQL
    would refuse the commit. Either way: StatementFailed, and nothing of the transaction stored."""
    store.append([StreamAppend("s/1", 0, [event("a", {})])])
    duplicate_head = "INSERT INTO log_head (id, position, hash) VALUES (1, 0, 'x')"
    with pytest.raises(StatementFailed), store.transaction() as tx:
        tx.append([StreamAppend("s/1", 1, [event("b", {})])])
        tx.flush()  # the event and the new head are written in the transaction
        with pytest.raises(IntegrityError):
            if through == "driver":
                driver.execute(tx.connection, duplicate_head)
            else:
                tx.connection.execute(text(duplicate_head))
    assert store.head()[0] == 1
    assert [e.stream_version for e in store.read_stream("s/1")] == [1]
    store.append([StreamAppend("s/1", 1, [event("b", {})])])  # the next transaction commits
    assert store.head()[0] == 2


def test_after_a_failed_statement_a_write_transaction_runs_no_other(store: EventStore) -> None:
    """Some SQLite errors end the whole transaction; a statement after one would be stored
    at once, outside it: none runs."""
    with pytest.raises(StatementFailed), store.transaction() as tx:
        with pytest.raises(DBAPIError):
            driver.fetch(tx.connection, "SELECT no_such_column FROM events")
        with pytest.raises(StatementFailed):
            driver.execute(tx.connection, UPSERT_ROWS, "things", "a", '{"n":1}')
        append_marker(tx)
        tx.projections.put("things", "a", {"n": 1})
    assert store.head()[0] == 0
    with store.engine.connect() as conn:
        assert SqlProjections(conn).get("things", "a") is None


def test_a_statement_that_failed_outside_a_write_transaction_does_not_refuse_the_next(
        store: EventStore) -> None:
    """The mark stays on the pooled connection; a write transaction starts without it, also one
    taken over from a reader (as a decision does)."""
    store.append([StreamAppend("s/1", 0, [event("a", {})])])
    with store.engine.connect() as conn, pytest.raises(DBAPIError):
        driver.fetch(conn, "SELECT no_such_column FROM events")
    with store.reading() as conn, store.transaction(conn) as tx:
        tx.append([StreamAppend("s/1", 1, [event("b", {})])])
    with store.engine.connect() as conn, pytest.raises(DBAPIError):
        driver.fetch(conn, "SELECT no_such_column FROM events")
    store.append([StreamAppend("s/1", 2, [event("c", {})])])
    assert store.head()[0] == 3


def test_an_error_in_pipelined_writes_is_sqlalchemys_and_nothing_is_written(
        store: EventStore) -> None:
    store.append([StreamAppend("s/1", 0, [event("a", {})])])
    head = store.head()
    with pytest.raises(IntegrityError), store.transaction() as tx, driver.pipeline(tx.connection):
        driver.execute(tx.connection, "UPDATE log_head SET position = 99 WHERE id = 1")
        driver.execute_many(tx.connection,
                            "INSERT INTO log_head (id, position, hash) VALUES (?, ?, ?)",
                            [(1, 5, "x")])
        driver.execute(tx.connection, "UPDATE log_head SET position = 98 WHERE id = 1")
    assert store.head() == head


def test_a_duplicate_event_id_is_refused_when_the_batch_is_written_and_the_log_is_unchanged(
        store: EventStore) -> None:
    """The appender writes a batch's rows without waiting for each (`driver.pipeline`): the
    database's UNIQUE(event_id) still refuses a duplicate the caller vouched was new."""
    store.append([StreamAppend("s/1", 0, [event("a", {})])])
    head = store.head()
    with pytest.raises(IntegrityError), store.transaction() as tx:
        tx.append([StreamAppend("s/2", 0, [event("b", {}), event("a", {})])],
                  check_existing=False)
        tx.projections.put("tested", "k", {"v": 1})
    assert store.head() == head
    assert [e.event_id for e in store.read_stream("s/2")] == []
    with store.transaction() as tx:
        assert tx.projections.get("tested", "k") is None
    store.append([StreamAppend("s/2", 0, [event("b", {})])])  # the store goes on
    assert store.head()[0] == head[0] + 1


def test_gathered_reads_hand_each_query_its_own_rows_in_order(store: EventStore) -> None:
    store.append([StreamAppend("s/1", 0, [event("a", {}), event("b", {})]),
                  StreamAppend("s/2", 0, [event("c", {})])])
    ids = {s: [e.event_id for e in store.read_stream(s)] for s in ("s/1", "s/2")}
    got: list[tuple[str, list[tuple[str, ...]]]] = []
    with store.engine.connect() as conn:
        reads = driver.Reads()
        for stream_id in ("s/2", "s/1", "s/none"):
            reads.add(EVENT_IDS, stream_id, in_values=ids["s/1"] + ids["s/2"],
                      then=lambda rows, s=stream_id: got.append((s, rows)))
        reads.run(conn)
        reads.run(conn)  # run once: nothing is handed out twice
        expected = [(s, driver.fetch(conn, EVENT_IDS, s, in_values=ids["s/1"] + ids["s/2"]))
                    for s in ("s/2", "s/1", "s/none")]
    assert got == expected
    assert [len(rows) for _, rows in got] == [1, 2, 0]


def test_a_failing_gathered_read_is_sqlalchemys_error_and_hands_out_no_rows(
        store: EventStore) -> None:
    store.append([StreamAppend("s/1", 0, [event("a", {})])])
    handed: list[object] = []
    reads = driver.Reads()
    reads.add("SELECT event_id FROM events", then=handed.append)
    reads.add("SELECT no_such_column FROM events", then=handed.append)
    with pytest.raises(DBAPIError), store.transaction() as tx:
        reads.run(tx.connection)
    assert handed == []  # not even the query that succeeded
    assert store.head()[0] == 1  # the transaction rolled back; the store goes on
    store.append([StreamAppend("s/1", 1, [event("b", {})])])
    assert store.head()[0] == 2


def test_gathered_reads_cost_one_round_trip_on_postgresql(postgres_database: str,
                                                          tmp_path: Path) -> None:
    store = open_store(postgres_database)
    trace = tmp_path / "libpq-trace"
    try:
        with store.engine.connect() as conn:
            driver.fetch(conn, "SELECT 1")  # the transaction has begun: only the reads are counted
            reads = driver.Reads()
            rows: list[object] = []
            for value in range(4):
                reads.add("SELECT ? + 1", value, then=rows.extend)
            with protocol_trace(conn.connection.driver_connection, trace):
                reads.run(conn)
        assert rows == [(1,), (2,), (3,), (4,)]
        assert round_trips(trace.read_text()) == 1
    finally:
        store.engine.dispose()


def test_a_transactions_read_ahead_costs_one_round_trip_on_postgresql(
        pg_store: EventStore, postgres_database: str, tmp_path: Path) -> None:
    trace = tmp_path / "libpq-trace"
    pg_store.append([StreamAppend("s/1", 0, [event("a", {})])])
    with pg_store.transaction() as tx:
        append_marker(tx)
        tx.projections.put("things", "a", {"n": 1})
    other = open_store(postgres_database)  # another process's view: nothing of it cached
    try:
        with other.transaction() as tx:
            with protocol_trace(tx.connection.connection.driver_connection, trace):
                tx.prefetch(["s/1", "s/2"], [("things", "a"), ("things", "b"), ("other", "c")])
            assert tx.stream_version("s/1") == 1 and tx.projections.get("things", "a") == {"n": 1}
    finally:
        other.engine.dispose()
    assert round_trips(trace.read_text()) == 1


def test_a_write_transaction_costs_two_round_trips_on_postgresql(pg_store: EventStore,
                                                                  tmp_path: Path) -> None:
    """Where its store left the log: BEGIN with the head's lock and the read-ahead; the rows,
    the head and COMMIT."""
    trace = tmp_path / "libpq-trace"
    pg_store.append([StreamAppend("s/1", 0, [event("a", {})])])
    with checkouts_traced(pg_store.engine, trace):
        read_ahead = ReadAhead(["s/1", "s/2"], [("things", "a"), ("things", "b")])
        with pg_store.transaction(read_ahead=read_ahead) as tx:
            tx.append([StreamAppend("s/1", 1, [event("b", {})])], check_existing=False)
            tx.projections.put("things", "a", {"n": 1})
    assert round_trips(trace.read_text()) == 2
    assert pg_store.head()[0] == 2
    with pg_store.engine.connect() as conn:
        assert SqlProjections(conn).get("things", "a") == {"n": 1}


def test_a_one_command_placement_costs_three_round_trips_on_postgresql(
        pg_store: EventStore, tmp_path: Path) -> None:
    """BEGIN with the inbox read; the head lock with every row and version the decision reads
    (none read alone afterwards: not the policy, not a pool not seen before); the writes with
    COMMIT. The process's first placement also reads the head and every node row once, before
    the lock, for its GPU index (`EventStore.warm`)."""
    trace = tmp_path / "libpq-trace"
    decide(pg_store, accept(pg_store, [command_adapter.validate_python(p)
                                       for p in [*inventory(2, 2), model()]]))
    # "batch": a pool not seen yet
    for replica, pool, trips in (("r1", "chat", 5), ("r2", "batch", 3), ("r3", "chat", 3)):
        assert _decided_alone(pg_store, placement(replica, pool), trace) == (
            "ReplicaPlaced", trips), replica


def test_a_one_command_assessment_of_a_new_model_costs_three_round_trips_on_postgresql(
        pg_store: EventStore, tmp_path: Path) -> None:
    """As a placement: the new model's stream version goes with the lock, not alone after."""
    trace = tmp_path / "libpq-trace"
    decide(pg_store, accept(pg_store, [command_adapter.validate_python(assessment("a0", "m0"))]))
    for name in ("m1", "m2"):
        assert _decided_alone(pg_store, assessment(f"assess-{name}", name), trace) == (
            "MemoryAssessed", 3), name


def _decided_alone(store: EventStore, payload: dict[str, Any], trace: Path) -> tuple[str, int]:
    """`payload` accepted, then decided alone: its first event's type, and the round trips the
    decision cost (libpq's trace of every connection it used)."""
    [command_id] = accept(store, [command_adapter.validate_python(payload)])
    with checkouts_traced(store.engine, trace):
        [outcome] = decide(store, [command_id])
    return outcome.events[0].event_type, round_trips(trace.read_text())


def test_a_store_guesses_the_head_only_while_it_keeps_finding_its_own(
        postgres_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-ahead goes with the lock on the guess that the log is where this store left it;
    after another writer proved that wrong, it waits to find its own head again."""
    reset_postgres(postgres_database)
    store, other = open_store(postgres_database), open_store(postgres_database)
    with_lock: list[bool] = []
    prefetch = LogTransaction.prefetch

    def spied(tx: LogTransaction, *args: Any, after: Any = None) -> None:
        with_lock.append(after is not None)
        prefetch(tx, *args, after=after)

    monkeypatch.setattr(LogTransaction, "prefetch", spied)
    read_ahead = ReadAhead(["s/1"], [("things", "a")])

    def mine(version: int) -> list[bool]:
        with_lock.clear()
        with store.transaction(read_ahead=read_ahead) as tx:
            tx.append([StreamAppend("s/1", version, [event(f"m{version}", {})])])
        return list(with_lock)

    try:
        store.append([StreamAppend("s/1", 0, [event("a", {})])])
        assert mine(1) == [True]  # found where it left it
        other.append([StreamAppend("s/2", 0, [event("b", {})])])
        assert mine(2) == [True, False]  # guessed, wrong: read again at the head
        other.append([StreamAppend("s/2", 1, [event("c", {})])])
        assert mine(3) == [False]  # no guess after a wrong one
        assert mine(4) == [False]  # ... until it finds its own head (it did, just now)
        assert mine(5) == [True]
    finally:
        store.engine.dispose()
        other.engine.dispose()


def test_a_connection_lost_under_a_driver_statement_is_invalidated_and_the_store_goes_on(
        pg_store: EventStore, postgres_database: str) -> None:
    admin = create_engine(postgres_database, isolation_level="AUTOCOMMIT")
    try:
        with pg_store.engine.connect() as conn:
            ((pid,),) = driver.fetch(conn, "SELECT pg_backend_pid()")
            with admin.connect() as killer:
                killer.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            with pytest.raises(DBAPIError) as lost:
                driver.fetch(conn, "SELECT 1")
            assert lost.value.connection_invalidated and conn.invalidated
        pg_store.append([StreamAppend("s/1", 0, [event("a", {})])])  # a fresh connection
        assert pg_store.head()[0] == 1
    finally:
        admin.dispose()


def _pooled_connection_killed(store: EventStore, admin: Engine) -> int:
    """Terminate the backend of the connection the store's pool holds; returns its pid."""
    with store.engine.connect() as conn:
        ((pid,),) = driver.fetch(conn, "SELECT pg_backend_pid()")
    with admin.connect() as killer:
        killer.execute(text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pid})
    return int(pid)


def _never_pinged(_dbapi_connection: Any) -> bool:
    raise AssertionError("pinged")


def test_a_pooled_connection_the_server_closed_is_replaced_without_a_ping(
        pg_store: EventStore, postgres_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not pinged (as if back from use a moment ago): what the server wrote as it closed the
    connection is enough."""
    monkeypatch.setattr(pg_store.engine.dialect, "do_ping", _never_pinged)
    monkeypatch.setattr(database, "PING_AFTER_IDLE_SECONDS", 3600.0)
    admin = create_engine(postgres_database, isolation_level="AUTOCOMMIT")
    try:
        pg_store.append([StreamAppend("s/1", 0, [event("a", {})])])
        _pooled_connection_killed(pg_store, admin)
        pg_store.append([StreamAppend("s/1", 1, [event("b", {})])])
        assert [e.stream_version for e in pg_store.read_stream("s/1")] == [1, 2]
        killed = _pooled_connection_killed(pg_store, admin)
        with pg_store.reading() as conn:
            ((pid,),) = driver.fetch(conn, "SELECT pg_backend_pid()")
        assert pid != killed
    finally:
        admin.dispose()


def test_a_pooled_connection_idle_a_while_is_pinged(postgres_database: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(postgres_database)
    pings: list[object] = []
    monkeypatch.setattr(store.engine.dialect, "do_ping", pings.append)
    try:
        store.head()
        store.head()
        assert pings == []  # back from use a moment ago
        monkeypatch.setattr(database, "PING_AFTER_IDLE_SECONDS", 0.0)
        store.head()
        assert len(pings) == 1
    finally:
        store.engine.dispose()


def test_postgresql_transactions_read_committed_whatever_the_servers_default(
        postgres_database: str) -> None:
    admin = create_engine(postgres_database, isolation_level="AUTOCOMMIT")
    database = make_url(postgres_database).database
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{database}" SET default_transaction_isolation'
                          " = 'serializable'"))
    store = None
    try:
        store = open_store(postgres_database)
        with store.engine.connect() as conn:
            assert driver.fetch(conn, "SHOW default_transaction_isolation") == [("serializable",)]
            assert driver.fetch(conn, "SHOW transaction_isolation") == [("read committed",)]
        with store.transaction() as tx:
            assert driver.fetch(tx.connection, "SHOW transaction_isolation") == [("read committed",)]
    finally:
        if store is not None:
            store.engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{database}" RESET default_transaction_isolation'))
        admin.dispose()
