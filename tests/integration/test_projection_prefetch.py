"""Prefetching projection rows for a batch: fewer queries, never a different answer."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from controlplane.runtime import open_store
from events import driver
from events.model import StreamAppend
from events.store import EventStore
from tests.factories import append_marker
from tests.factories import event as log_event


def test_prefetched_rows_read_as_without_prefetch_and_cost_no_query_each(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    with store.transaction() as tx:
        append_marker(tx)
        tx.projections.put("things", "a", {"n": 1})
        tx.projections.put("things", "b", {"n": 2})
    # Another process's view of the database: nothing of it is cached here.
    store = open_store(store.engine.url.render_as_string(hide_password=False))
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(str(args[2]))

    # Statements through SQLAlchemy and on the driver (`events.driver`) alike.
    event.listen(store.engine, "before_cursor_execute", count)
    _count_driver_statements(monkeypatch, statements)
    try:
        with store.transaction() as tx:
            tx.projections.put("things", "b", {"n": 20})  # this transaction's write wins
            wanted = [("things", "a"), ("things", "b"), ("things", "missing")]
            before = len(statements)
            tx.projections.prefetch(wanted)
            fetched = len(statements) - before
            got = [tx.projections.get(name, key) for name, key in wanted]
            after_gets = len(statements) - before - fetched
            append_marker(tx)
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
        store.engine.dispose()
    assert got == [{"n": 1}, {"n": 20}, None]
    assert 1 <= fetched <= 2 and after_gets == 0


def test_versions_and_rows_read_ahead_together_answer_as_without_and_need_no_later_query(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.append([StreamAppend("s/1", 0, [log_event("a", {}), log_event("b", {})])])
    with store.transaction() as tx:
        append_marker(tx)
        tx.projections.put("things", "a", {"n": 1})
    # Another process's view of the database: nothing of it is cached here.
    store = open_store(store.engine.url.render_as_string(hide_password=False))
    streams, rows = ["s/1", "s/new", "s/1"], [("things", "a"), ("things", "gone"), ("other", "x")]
    try:
        with store.transaction() as tx:
            plain = ([tx.stream_version(s) for s in streams],
                     [tx.projections.get(name, key) for name, key in rows])
        store.engine.dispose()
        store = open_store(store.engine.url.render_as_string(hide_password=False))
        statements: list[str] = []
        with store.transaction() as tx:
            _count_driver_statements(monkeypatch, statements)
            tx.prefetch(streams, rows)
            ahead = len(statements)
            read = ([tx.stream_version(s) for s in streams],
                    [tx.projections.get(name, key) for name, key in rows])
            monkeypatch.undo()
    finally:
        store.engine.dispose()
    assert read == plain == ([2, 0, 2], [{"n": 1}, None, None])
    assert ahead == 3 and len(statements) == ahead  # one query per projection and for versions


def _count_driver_statements(monkeypatch: pytest.MonkeyPatch, statements: list[str]) -> None:
    """Note every statement the driver sends: on SQLite each is `_run` alone; on PostgreSQL
    each goes to the server in one of `_pipelined`'s batches."""
    run, pipelined = driver._run, driver._pipelined

    def counted_run(connection: Any, template: str, *args: Any, **kwargs: Any) -> Any:
        if not driver.gathers(connection):
            statements.append(template)
        return run(connection, template, *args, **kwargs)

    def counted_batch(connection: Any, sent: list[Any], *args: Any) -> Any:
        statements.extend(sql.decode() for sql, *_ in sent)
        return pipelined(connection, sent, *args)

    monkeypatch.setattr(driver, "_run", counted_run)
    monkeypatch.setattr(driver, "_pipelined", counted_batch)
