"""Large batches on PostgreSQL: rows and projection upserts by COPY, stored as small ones are."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DataError, IntegrityError, ProgrammingError

from controlplane.runtime import open_store
from events import driver
from events.model import StreamAppend
from events.projections import load_all
from events.store import EventStore
from events.verify import verify_log
from tests.factories import append_marker, event

LARGE = driver.COPY_MIN_ROWS


def _counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Call sizes of `driver.<name>` from now on (rows handed to it), the call still made.

    `copy_upsert` stages its rows with `copy_rows`: counting `copy_rows` counts both."""
    calls: list[int] = []
    real = getattr(driver, name)

    def counted(*args: Any) -> None:
        calls.append(len(args[-1]))
        real(*args)

    monkeypatch.setattr(driver, name, counted)
    return calls


def test_a_large_batch_is_stored_exactly_as_a_small_one_and_copied_on_postgresql(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    copied = _counting(monkeypatch, "copy_rows")
    small = [event(f"s{n}", {"n": n, "text": "tab\there, line\nthere, back\\slash, ü"})
             for n in range(3)]
    large = [event(f"l{n}", {"n": n, "none": None}) for n in range(LARGE)]
    store.append([StreamAppend("s/small", 0, small)])
    store.append([StreamAppend("s/large", 0, large)])
    assert copied == ([LARGE] if store.engine.dialect.name == "postgresql" else [])
    stored = store.read_stream("s/small") + store.read_stream("s/large")
    assert [(e.event_id, e.data) for e in stored] == [(e.event_id, e.data) for e in small + large]
    assert verify_log(store).ok


def test_a_duplicate_in_a_copied_batch_is_refused_and_nothing_is_written(
        store: EventStore) -> None:
    store.append([StreamAppend("s/1", 0, [event("a", {})])])
    head = store.head()
    batch = [event(f"b{n}", {}) for n in range(LARGE)] + [event("a", {})]
    with pytest.raises(IntegrityError), store.transaction() as tx:
        tx.append([StreamAppend("s/2", 0, batch)], check_existing=False)
    assert store.head() == head and store.read_stream("s/2") == []
    store.append([StreamAppend("s/2", 0, batch[:-1])])  # the store goes on
    assert store.head()[0] == head[0] + LARGE


def test_large_projection_batches_are_stored_as_small_ones_and_staged_on_postgresql(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    staged = _counting(monkeypatch, "copy_upsert")
    with store.transaction() as tx:
        append_marker(tx)
        for n in range(LARGE):
            tx.projections.put("things", f"k{n}", {"n": n, "text": "tab\there ü"})
        tx.projections.put("small", "only", {"n": 0})
    with store.transaction() as tx:  # the stored rows change; some are deleted
        append_marker(tx)
        for n in range(0, LARGE, 2):
            tx.projections.put("things", f"k{n}", {"n": -n})
        for n in range(1, 11, 2):
            tx.projections.delete("things", f"k{n}")
        tx.projections.put("things", "new", {"n": 1})
    postgres = store.engine.dialect.name == "postgresql"
    assert staged == ([LARGE + 1] if postgres else [])  # the second batch's 51 go pipelined
    expected = {f"k{n}": {"n": -n if n % 2 == 0 else n, "text": "tab\there ü"}
                for n in range(LARGE) if not (n % 2 and n < 11)}
    for key in expected:
        if expected[key]["n"] <= 0:
            expected[key] = {"n": expected[key]["n"]}
    expected["new"] = {"n": 1}
    with store.engine.connect() as conn:
        assert load_all(conn) == {"things": expected, "small": {"only": {"n": 0}}}
    with store.transaction() as tx:  # and the shared cache agrees with the table
        assert dict(tx.projections.items("things")) == expected


def test_staged_upserts_twice_in_one_transaction_keep_the_last_value(pg_store: EventStore) -> None:
    store = pg_store
    with store.engine.begin() as conn:
        driver.copy_upsert(conn, "projections", ("name", "key", "data"), "name, key",
                           [("t", f"k{n}", "1") for n in range(3)])
        driver.copy_upsert(conn, "projections", ("name", "key", "data"), "name, key",
                           [("t", "k1", "2"), ("t", "k3", "2")])
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT key, data FROM projections WHERE name = 't' ORDER BY key"))
        assert [tuple(row) for row in rows] == [("k0", "1"), ("k1", "2"), ("k2", "1"), ("k3", "2")]


def test_a_failing_staged_upsert_writes_nothing_and_the_connection_goes_on(
        pg_store: EventStore) -> None:
    store = pg_store
    unstorable = "k\x00"  # PostgreSQL text holds no NUL character
    with store.reading() as connection:  # one session throughout: its staging table is reused
        with store.transaction(connection) as tx:
            append_marker(tx)
            for n in range(LARGE):
                tx.projections.put("things", f"k{n}", {"n": 0})
        with pytest.raises(DataError), store.transaction(connection) as tx:
            tx.append([StreamAppend("s/1", 0, [event("a", {})])])
            for n in range(LARGE):
                tx.projections.put("things", f"k{n}", {"n": -1})
            tx.projections.put("things", unstorable, {"n": -1})
        assert _staged_rows(connection) == 0
        with store.transaction(connection) as tx:
            append_marker(tx)
            for n in range(LARGE):
                tx.projections.put("things", f"k{n}", {"n": n})
        assert _staged_rows(connection) == 0
    assert store.head()[0] == 2 and store.read_stream("s/1") == []  # the two markers only
    with store.engine.connect() as conn:
        assert load_all(conn) == {"things": {f"k{n}": {"n": n} for n in range(LARGE)}}


def test_the_staging_table_holds_nothing_between_transactions(pg_store: EventStore) -> None:
    """Temporary tables are never vacuumed: rows deleted but left in its pages would pile up
    over a long-lived session's batches. It is truncated at each commit instead."""
    with pg_store.reading() as connection:
        for batch in range(3):
            with pg_store.transaction(connection) as tx:
                append_marker(tx)
                for n in range(LARGE):
                    tx.projections.put("things", f"k{n}", {"batch": batch})
            size = connection.execute(text(
                "SELECT pg_relation_size('pg_temp.projections_staged')")).scalar()
            connection.rollback()
            assert size == 0


def _staged_rows(connection: Any) -> int:
    count = connection.execute(text("SELECT count(*) FROM pg_temp.projections_staged")).scalar()
    connection.rollback()  # the read began a transaction: end it, as a reader would
    return int(count)


@pytest.fixture
def role_without_temporary_tables(postgres_database: str) -> Iterator[str]:
    """A URL of the test database for a role that may write the log but not create temporary
    tables (TEMPORARY revoked from PUBLIC on this database, the test's own)."""
    admin = create_engine(postgres_database, isolation_level="AUTOCOMMIT")
    role = f"fleet_no_temp_{uuid.uuid4().hex[:8]}"
    database = make_url(postgres_database).database
    with admin.connect() as conn:
        conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
        conn.execute(text(f'REVOKE TEMPORARY ON DATABASE "{database}" FROM PUBLIC'))
        conn.execute(text(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public'
                          f' TO "{role}"'))
    try:
        yield make_url(postgres_database).set(username=role).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'GRANT TEMPORARY ON DATABASE "{database}" TO PUBLIC'))
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))
        admin.dispose()


def test_a_role_that_cannot_create_temporary_tables_still_writes_large_batches(
        pg_store: EventStore, role_without_temporary_tables: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = pg_store
    staged = _counting(monkeypatch, "copy_upsert")
    limited = open_store(role_without_temporary_tables, migrate=False)
    try:
        with limited.transaction() as tx:
            tx.append([StreamAppend("s/1", 0, [event(f"e{n}", {}) for n in range(LARGE)])])
            for n in range(LARGE):
                tx.projections.put("things", f"k{n}", {"n": n})
    finally:
        limited.engine.dispose()
    assert staged == []
    with store.engine.connect() as conn:
        assert load_all(conn) == {"things": {f"k{n}": {"n": n} for n in range(LARGE)}}
    assert len(store.read_stream("s/1")) == LARGE


def test_a_temporary_privilege_revoked_while_running_costs_one_failed_batch(
        pg_store: EventStore, role_without_temporary_tables: str, postgres_database: str) -> None:
    role_url = make_url(role_without_temporary_tables)
    admin = create_engine(postgres_database, isolation_level="AUTOCOMMIT")

    def privilege(statement: str) -> None:
        with admin.connect() as conn:
            conn.execute(text(f'{statement} TEMPORARY ON DATABASE "{role_url.database}"'
                              f' {"TO" if statement == "GRANT" else "FROM"} "{role_url.username}"'))

    def write(store: EventStore, batch: int) -> None:
        with store.transaction() as tx:
            append_marker(tx)
            for n in range(LARGE):
                tx.projections.put("things", f"k{n}", {"batch": batch})

    privilege("GRANT")
    limited = open_store(role_without_temporary_tables, migrate=False)
    try:
        write(limited, 0)  # staged: the privilege is asked once and remembered
        privilege("REVOKE")
        limited.engine.dispose()  # new sessions from here on; the engine is the same
        with pytest.raises(ProgrammingError):
            write(limited, 1)
        write(limited, 2)  # asked again after the refusal: pipelined
    finally:
        limited.engine.dispose()
        admin.dispose()
    with pg_store.engine.connect() as conn:
        assert load_all(conn) == {"things": {f"k{n}": {"batch": 2} for n in range(LARGE)}}
