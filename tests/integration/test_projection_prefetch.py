"""Prefetching projection rows for a batch: fewer queries, never a different answer."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from controlplane.runtime import open_store
from events import driver
from events.store import EventStore


def test_prefetched_rows_read_as_without_prefetch_and_cost_no_query_each(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    with store.transaction() as tx:
        tx.projections.put("things", "a", {"n": 1})
        tx.projections.put("things", "b", {"n": 2})
    # Another process's view of the database: nothing of it is cached here.
    store = open_store(store.engine.url.render_as_string(hide_password=False))
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(str(args[2]))

    run_on_driver = driver._run

    def count_driver(connection: Any, template: str, *args: Any, **kwargs: Any) -> Any:
        statements.append(template)
        return run_on_driver(connection, template, *args, **kwargs)

    # Statements through SQLAlchemy and on the driver's cursor (`events.driver`) alike.
    event.listen(store.engine, "before_cursor_execute", count)
    monkeypatch.setattr(driver, "_run", count_driver)
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
    assert 1 <= fetched <= 2 and after_gets == 0
