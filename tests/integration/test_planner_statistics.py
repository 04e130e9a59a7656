"""On PostgreSQL the planner's count of the log follows it as it grows, so reads use indexes.

Autovacuum alone would leave a fast-growing log without statistics for a minute or more, and
the batch reads (a batch's commands, its streams' versions) would scan the whole table.
"""

from __future__ import annotations

import pytest
from sqlalchemy import event as sqlalchemy_event
from sqlalchemy import text

from controlplane.commands import command_adapter
from controlplane.runtime import open_store
from controlplane.service import accept, decide
from controlplane.workloads import assessment
from events import driver
from events.database import MIN_ROWS_FOR_STATISTICS
from events.model import StreamAppend
from events.rows import EVENTS_BY_COMMAND
from events.store import EventStore
from tests.factories import event

BELIEVED = text("SELECT reltuples FROM pg_class WHERE oid = CAST('events' AS regclass)")


def test_the_planner_counts_a_fast_growing_log_within_a_factor_of_two(store: EventStore) -> None:
    if store.engine.dialect.name != "postgresql":
        pytest.skip("SQLite's planner uses the indexes without statistics")
    appended = 0
    for batch in range(8):
        with store.transaction() as tx:
            tx.append([StreamAppend(f"s/{batch}-{i}", 0, [event("e", {"n": i}, f"command-e{batch}-{i}")])
                       for i in range(500)])
        appended += 500
        with store.engine.connect() as conn:
            believed = conn.execute(BELIEVED).scalar()
        if appended >= MIN_ROWS_FOR_STATISTICS:
            assert believed is not None and believed * 2 >= store.head()[0], (appended, believed)

    wanted = [f"command-e7-{i}" for i in range(20)]
    with store.engine.connect() as conn:
        plan = "\n".join(row[0] for row in driver.fetch(conn, f"EXPLAIN {EVENTS_BY_COMMAND}",
                                                        in_values=wanted))
    assert "ix_events_command_id" in plan, plan


def test_a_write_commits_and_returns_when_statistics_cannot_be_taken(store: EventStore) -> None:
    if store.engine.dialect.name != "postgresql":
        pytest.skip("statistics are taken on PostgreSQL only")
    # Another session's maintenance (a manual VACUUM, CREATE INDEX CONCURRENTLY) holds the lock
    # ANALYZE needs, for longer than any lock timeout.
    with store.engine.connect() as holder:
        holder.execute(text("LOCK TABLE events IN SHARE UPDATE EXCLUSIVE MODE"))
        recorded = store.append([StreamAppend(f"s/{i}", 0, [event("e", {"n": i}, f"c{i}")])
                                 for i in range(MIN_ROWS_FOR_STATISTICS + 200)])
        # Committed: the head is past every event (and the checkpoint the batch crossed).
        assert store.head()[0] == recorded[-1].position + 1 > MIN_ROWS_FOR_STATISTICS + 200
        holder.rollback()


def test_a_fresh_process_learns_the_planners_count_without_a_connection_of_its_own(
        store: EventStore) -> None:
    """Every work horse is a fresh process: its first decision asks the planner's count with
    the lock's reads, on its one connection, and opens no other (one did before: a connection
    a job)."""
    if store.engine.dialect.name != "postgresql":
        pytest.skip("statistics are taken on PostgreSQL only")
    store.append([StreamAppend(f"s/{i}", 0, [event("e", {"n": i}, f"c{i}")])
                  for i in range(MIN_ROWS_FOR_STATISTICS + 200)])  # and analysed: counted
    [command_id] = accept(store, [command_adapter.validate_python(assessment("a-1", "m1"))])
    horse = open_store(store.engine.url.render_as_string(hide_password=False), migrate=False)
    opened: list[object] = []
    sqlalchemy_event.listen(horse.engine, "connect", lambda *_: opened.append(1))
    try:
        [outcome] = decide(horse, [command_id])
        assert outcome.decided_now
        assert len(opened) == 1
    finally:
        horse.engine.dispose()
