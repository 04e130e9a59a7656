"""Prefetching projection rows for a batch: fewer queries, never a different answer."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

from controlplane.runtime import open_store
from events.store import EventStore


def test_prefetched_rows_read_as_without_prefetch_and_cost_no_query_each(store: EventStore) -> None:
    with store.transaction() as tx:
        tx.projections.put("things", "a", {"n": 1})
        tx.projections.put("things", "b", {"n": 2})
    # Another process's view of the database: nothing of it is cached here.
    store = open_store(store.engine.url.render_as_string(hide_password=False))
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(str(args[2]))

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        with store.transaction() as tx:
            tx.projections.put("things", "b", {"n": 20})  # this transaction's write wins
            wanted = [("things", "a"), ("things", "b"), ("things", "missing")]
            before = len(statements)
            tx.projections.prefetch(wanted)
            fetched = len(statements) - before
            got = [tx.projections.get(name, key) for name, key in wanted]
            after_gets = len(statements) - before - fetched
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
        store.engine.dispose()
    assert got == [{"n": 1}, {"n": 20}, None]
    assert fetched <= 2 and after_gets == 0
