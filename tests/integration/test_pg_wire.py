"""The log's statements on PostgreSQL through libpq directly (`events.pg_wire`): prepared once
per connection, errors as the driver's, a broken batch never leaves a connection half-used."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError, ProgrammingError

from events import driver
from events.model import StatementFailed, StreamAppend
from events.store import EventStore
from tests.factories import append_marker, event
from tests.libpq_trace import protocol_trace, round_trips


def _named_parses(trace: str) -> list[str]:
    """The statement names the client asked the server to prepare (Parse with a name)."""
    return [line.split("\t")[4].split('"')[1] for line in trace.splitlines()
            if "\tF\t" in line and "\tParse\t" in line and not line.split("\t")[4].startswith(' ""')]


def _backend(store: EventStore) -> int:
    with store.reading() as conn:
        ((pid,),) = driver.fetch(conn, "SELECT pg_backend_pid()")
    return int(pid)


def test_a_statement_is_prepared_once_per_connection(pg_store: EventStore, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    with pg_store.engine.connect() as conn, protocol_trace(conn.connection.driver_connection, trace):
        answers = [driver.fetch(conn, "SELECT ? + 1", n) for n in (1, 2, 3)]
    assert answers == [[(2,)], [(3,)], [(4,)]]
    assert len(_named_parses(trace.read_text())) == 1


def test_a_statement_prepared_in_a_transaction_that_rolled_back_runs_again(
        pg_store: EventStore, tmp_path: Path) -> None:
    """The server keeps a session's prepared statements whatever becomes of the transaction;
    so does psycopg's rollback, even after SQLAlchemy ran one statement of its own many times
    (psycopg would have prepared it, and its rollback deallocates everything)."""
    query = "SELECT count(*) FROM events WHERE stream_id = ?"
    trace = tmp_path / "trace"
    with pg_store.engine.connect() as conn, \
            protocol_trace(conn.connection.driver_connection, trace):
        assert driver.fetch(conn, query, "s/1") == [(0,)]
        conn.rollback()
        for _ in range(8):
            conn.execute(text("SELECT count(*) FROM events"))
        conn.rollback()
        pg_store.append([StreamAppend("s/1", 0, [event("a", {})])])
        assert driver.fetch(conn, query, "s/1") == [(1,)]
    assert len(_named_parses(trace.read_text())) == 1


def test_a_statement_whose_prepare_an_earlier_error_skipped_is_prepared_again(
        pg_store: EventStore) -> None:
    """In a batch, the server skips everything after a failure, its Parse messages too: the
    statement is not taken for prepared."""
    later = "SELECT ? || '!'"
    reads = driver.Reads()
    handed: list[Any] = []
    reads.add("SELECT no_such_column FROM events", then=handed.append)
    reads.add(later, "first", then=handed.append)
    with pg_store.engine.connect() as conn:
        with pytest.raises(DBAPIError, match="no_such_column"):
            reads.run(conn)
        conn.rollback()
        assert driver.fetch(conn, later, "second") == [("second!",)]
    assert handed == []


def test_values_of_another_type_get_a_statement_of_their_own(pg_store: EventStore) -> None:
    """psycopg sends a small int as int2 and a large one as int8: each types its own prepared
    statement, so neither is refused for the other's type."""
    with pg_store.engine.connect() as conn:
        assert [driver.fetch(conn, "SELECT ?::bigint", value)
                for value in (1, 10**12, 2, 10**15)] == [[(1,)], [(10**12,)], [(2,)], [(10**15,)]]


def test_a_value_the_driver_cannot_adapt_sends_nothing_and_the_connection_goes_on(
        pg_store: EventStore) -> None:
    pid = _backend(pg_store)
    with pg_store.engine.connect() as conn:
        with pytest.raises(ProgrammingError, match="cannot adapt"):
            driver.fetch(conn, "SELECT ?", object())
        assert driver.fetch(conn, "SELECT ?::int", 7) == [(7,)]
    assert _backend(pg_store) == pid


def test_an_interrupted_batch_closes_its_connection_and_the_store_goes_on(
        pg_store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted while waiting for the answers: the connection is in a state no later
    statement can trust, so it is closed, and the pool hands out a new one."""
    pid = _backend(pg_store)

    def interrupted(self: psycopg.Connection[Any], *_: Any, **__: Any) -> None:
        raise KeyboardInterrupt

    with pg_store.engine.connect() as conn:
        monkeypatch.setattr(psycopg.Connection, "wait", interrupted)
        with pytest.raises(KeyboardInterrupt):
            driver.fetch(conn, "SELECT 1")
        monkeypatch.undo()
        assert conn.invalidated
    pg_store.append([StreamAppend("s/1", 0, [event("a", {})])])
    assert pg_store.head()[0] == 1
    assert _backend(pg_store) != pid


def test_prepared_statements_the_session_lost_are_prepared_again(pg_store: EventStore) -> None:
    """After DISCARD ALL (or a pooler handing the statements' session to someone else), the
    statement fails once, as SQLAlchemy's error, and is prepared again from then on."""
    query = "SELECT ? * 2"
    with pg_store.engine.connect() as conn:
        assert driver.fetch(conn, query, 2) == [(4,)]
        conn.rollback()
        driver_connection = conn.connection.driver_connection
        driver_connection.autocommit = True
        driver_connection.execute("DISCARD ALL")
        driver_connection.autocommit = False
        with pytest.raises(DBAPIError, match="does not exist"):
            driver.fetch(conn, query, 3)
        conn.rollback()
        assert driver.fetch(conn, query, 4) == [(8,)]


def test_a_fetch_inside_a_pipeline_block_sees_the_statements_queued_before_it(
        pg_store: EventStore, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    with pg_store.engine.connect() as conn:
        with protocol_trace(conn.connection.driver_connection, trace), driver.pipeline(conn):
            driver.execute(conn, "UPDATE log_head SET hash = ? WHERE id = 1", "queued")
            assert driver.fetch(conn, "SELECT hash FROM log_head WHERE id = 1") == [("queued",)]
            driver.execute(conn, "UPDATE log_head SET hash = ? WHERE id = 1", "again")
        assert driver.fetch(conn, "SELECT hash FROM log_head WHERE id = 1") == [("again",)]
        conn.rollback()
    assert round_trips(trace.read_text()) == 2


def test_a_pipeline_block_left_by_an_exception_sends_nothing_it_held(
        pg_store: EventStore, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    with pg_store.engine.connect() as conn:
        driver.fetch(conn, "SELECT 1")
        with protocol_trace(conn.connection.driver_connection, trace), \
                pytest.raises(ValueError), driver.pipeline(conn, commit=True):
            driver.execute(conn, "UPDATE log_head SET hash = 'never' WHERE id = 1")
            raise ValueError("the caller gave up")
        conn.rollback()
    assert trace.read_text() == ""
    assert pg_store.head()[1] != "never"


def test_a_prepared_statement_a_schema_change_broke_is_prepared_afresh(
        pg_store: EventStore, postgres_database: str) -> None:
    admin = create_engine(postgres_database, isolation_level="AUTOCOMMIT")
    query = "SELECT k, v FROM wire_scratch WHERE k = ?"
    try:
        with admin.connect() as other:
            other.execute(text("CREATE TABLE wire_scratch (k text, v integer)"))
            other.execute(text("INSERT INTO wire_scratch VALUES ('a', 1)"))
        with pg_store.engine.connect() as conn:
            assert driver.fetch(conn, query, "a") == [("a", 1)]
            conn.rollback()
            with admin.connect() as other:
                other.execute(text("ALTER TABLE wire_scratch ALTER COLUMN v TYPE text"))
            with pytest.raises(DBAPIError, match="cached plan"):
                driver.fetch(conn, query, "a")
            conn.rollback()
            assert driver.fetch(conn, query, "a") == [("a", "1")]
    finally:
        with admin.connect() as other:
            other.execute(text("DROP TABLE IF EXISTS wire_scratch"))
        admin.dispose()


def test_in_lists_of_any_length_share_a_few_prepared_statements(pg_store: EventStore) -> None:
    """An IN list is padded to a power of two (its last value repeated: the same rows match),
    so a connection does not keep a statement per length."""
    pg_store.append([StreamAppend(f"s/{n}", 0, [event(f"e{n}", {})]) for n in range(40)])
    template = "SELECT stream_id FROM events WHERE stream_id IN ({in}) ORDER BY stream_id"
    with pg_store.engine.connect() as conn:
        for length in range(1, 41):
            wanted = [f"s/{n}" for n in range(length)]
            assert driver.fetch(conn, template, in_values=wanted) == [(s,) for s in sorted(wanted)]
        ((kept,),) = driver.fetch(conn, "SELECT count(*) FROM pg_prepared_statements"
                                        " WHERE statement LIKE ?", template[:45] + "%")
    assert kept == 7  # lists of 1, 2, 4, 8, 16, 32 and 64


def test_nothing_to_read_costs_no_round_trip(pg_store: EventStore, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    with pg_store.engine.connect() as conn, protocol_trace(conn.connection.driver_connection, trace):
        driver.Reads().run(conn)
        with driver.pipeline(conn):
            pass
    assert trace.read_text() == ""


def test_reads_and_copies_inside_a_pipeline_block_run_after_what_it_holds(
        pg_store: EventStore) -> None:
    """A fresh session: the staging table `copy_upsert` creates is created (held) before the
    COPY into it runs."""
    seen: list[Any] = []
    with pg_store.transaction() as tx:
        conn = tx.connection
        with driver.pipeline(conn):
            driver.execute(conn, "UPDATE log_head SET hash = ? WHERE id = 1", "held")
            reads = driver.Reads()
            reads.add("SELECT hash FROM log_head WHERE id = 1", then=seen.extend)
            reads.run(conn)
            driver.copy_upsert(conn, "projections", ("name", "key", "data"), "name, key",
                               [("things", "a", '{"n":1}')])
            driver.execute(conn, "UPDATE log_head SET hash = ? WHERE id = 1", "after")
            seen.extend(driver.fetch(conn, "SELECT data FROM projections WHERE key = 'a'"))
        conn.rollback()
    assert seen == [("held",), ('{"n":1}',)]


def test_a_write_transaction_that_caught_a_pipeline_blocks_exception_commits_nothing(
        pg_store: EventStore) -> None:
    """The block dropped the writes it held: the transaction must not commit without them."""
    with pytest.raises(StatementFailed), pg_store.transaction() as tx:
        append_marker(tx)
        tx.flush()
        try:
            with driver.pipeline(tx.connection):
                driver.execute(tx.connection, "UPDATE log_head SET hash = 'x' WHERE id = 1")
                raise ValueError("the caller gave up")
        except ValueError:
            pass
    assert pg_store.head()[0] == 0


def test_a_batch_interrupted_while_the_server_works_drops_its_connection(
        pg_store: EventStore) -> None:
    """A real interrupt (a signal whose handler raises KeyboardInterrupt, as Ctrl-C does) while
    the server runs a slow statement: psycopg cancels it, the connection is dropped rather
    than trusted, and the store goes on with a new one."""
    pid = _backend(pg_store)

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
    started = time.monotonic()
    try:
        with pg_store.engine.connect() as conn:
            with pytest.raises(KeyboardInterrupt):
                timer.start()
                try:
                    driver.fetch(conn, "SELECT pg_sleep(10)")
                finally:
                    timer.join()
            assert conn.invalidated
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert time.monotonic() - started < 8  # cancelled, not waited out
    pg_store.append([StreamAppend("s/1", 0, [event("a", {})])])
    assert pg_store.head()[0] == 1
    assert _backend(pg_store) != pid
