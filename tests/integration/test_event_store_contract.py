"""The event-store contract, run on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import threading

import pytest
from sqlalchemy import func, select, text

import events.store
from events.model import ConcurrencyConflict, DuplicateEventError, StreamAppend
from events.store import EventStore
from events.tables import events_table
from tests.factories import event


def count_events(store: EventStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(events_table)).scalar() or 0)


def test_append_at_a_stale_version_raises_a_conflict(store: EventStore) -> None:
    store.append([StreamAppend("node/a", 0, [event("1"), event("2")])])
    with pytest.raises(ConcurrencyConflict) as raised:
        store.append([StreamAppend("node/a", 1, [event("3")])])
    assert raised.value.actual_version == 2
    assert count_events(store) == 2


def test_a_multi_stream_append_commits_to_all_streams_or_none(store: EventStore) -> None:
    store.append([StreamAppend("node/b", 0, [event("b1")])])
    with pytest.raises(ConcurrencyConflict):
        store.append([StreamAppend("node/a", 0, [event("a1")]),
                      StreamAppend("node/b", 0, [event("b2")])])
    assert store.read_stream("node/a") == []
    recorded = store.append([StreamAppend("node/a", 0, [event("a1")]),
                             StreamAppend("node/b", 1, [event("b2")])])
    assert [(e.stream_id, e.stream_version, e.position) for e in recorded] == [
        ("node/a", 1, 2), ("node/b", 2, 3)]


def test_reappending_the_same_events_returns_the_original_positions_and_writes_nothing(
        store: EventStore) -> None:
    batch = [StreamAppend("replica/r1", 0, [event("x"), event("y")])]
    first = store.append(batch)
    head_before = store.head()
    again = store.append(batch)
    assert [e.position for e in again] == [e.position for e in first] == [1, 2]
    assert store.head() == head_before
    assert count_events(store) == 2


def test_reappending_events_still_buffered_in_the_transaction_returns_them_and_writes_nothing(
        store: EventStore) -> None:
    batch = [StreamAppend("replica/r1", 0, [event("x"), event("y")])]
    with store.transaction() as tx:
        first = tx.append(batch)
        again = tx.append(batch)
    assert again == first
    assert [(e.position, e.stream_version, e.data) for e in again] == [
        (1, 1, first[0].data), (2, 2, first[1].data)]
    assert [e.as_dict() for e in store.read_stream("replica/r1")] == [e.as_dict() for e in first]
    assert count_events(store) == 2


def test_the_same_event_id_at_another_version_is_an_error(store: EventStore) -> None:
    store.append([StreamAppend("pool/p", 0, [event("x")])])
    store.append([StreamAppend("pool/p", 1, [event("y")])])
    with pytest.raises(DuplicateEventError):
        store.append([StreamAppend("pool/p", 1, [event("x")])])
    with pytest.raises(DuplicateEventError):
        store.append([StreamAppend("pool/q", 0, [event("x")])])
    assert count_events(store) == 2


def test_a_batch_that_partly_overlaps_the_log_is_an_error(store: EventStore) -> None:
    store.append([StreamAppend("pool/p", 0, [event("x")])])
    with pytest.raises(DuplicateEventError):
        store.append([StreamAppend("pool/p", 0, [event("x"), event("new")])])
    assert count_events(store) == 1


def test_concurrent_appenders_leave_a_gap_free_order_in_commit_order(store: EventStore) -> None:
    per_thread = 1_000
    errors: list[BaseException] = []

    def appender(name: str) -> None:
        try:
            for index in range(per_thread):
                store.append([StreamAppend(f"thread/{name}", None,
                                           [event(f"{name}-{index}", {"i": index},
                                                  command_id=name)])])
        except BaseException as error:  # surfaced below; a thread cannot fail the test itself
            errors.append(error)

    threads = [threading.Thread(target=appender, args=(name,)) for name in ("left", "right")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    rows = list(store.read_all())
    assert [e.position for e in rows] == list(range(1, len(rows) + 1))
    assert sum(1 for e in rows if e.stream_id.startswith("thread/")) == 2 * per_thread
    for name in ("left", "right"):
        mine = [e.data["i"] for e in rows if e.stream_id == f"thread/{name}"]
        assert mine == list(range(per_thread)), "a thread's events appear out of commit order"
        versions = [e.stream_version for e in rows if e.stream_id == f"thread/{name}"]
        assert versions == list(range(1, per_thread + 1))


def test_reads_by_stream_and_from_a_position(store: EventStore) -> None:
    store.append([StreamAppend("s/1", 0, [event("a"), event("b")]),
                  StreamAppend("s/2", 0, [event("c")])])
    store.append([StreamAppend("s/1", 2, [event("d")])])
    assert [e.data["slot"] for e in store.read_stream("s/1")] == ["a", "b", "d"]
    assert [e.data["slot"] for e in store.read_stream("s/1", from_version=2)] == ["d"]
    assert [e.position for e in store.read_all(from_position=2)] == [3, 4]
    assert [e.position for e in store.read_all(from_position=1, to_position=3)] == [2, 3]


def test_the_log_is_read_whole_across_chunks_within_any_range(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events.store, "READ_CHUNK", 2)
    store.append([StreamAppend("s/1", 0, [event(str(i)) for i in range(7)])])
    assert [e.position for e in store.read_all()] == list(range(1, 8))
    assert [e.position for e in store.read_all(from_position=1, to_position=5)] == [2, 3, 4, 5]
    raw = list(store.read_all(from_position=4, raw=True))
    assert [row["position"] for row in raw] == [5, 6, 7]
    assert [json.loads(row["data"])["slot"] for row in raw] == ["4", "5", "6"]


def test_a_failed_transaction_leaves_no_gap_in_positions(store: EventStore) -> None:
    with pytest.raises(RuntimeError), store.transaction() as tx:
        tx.append([StreamAppend("s/1", 0, [event("lost")])])
        raise RuntimeError("handler crashed after appending")
    store.append([StreamAppend("s/1", 0, [event("kept")])])
    assert [(e.position, e.data["slot"]) for e in store.read_all()] == [(1, "kept")]


def test_a_failed_transaction_leaves_the_stream_versions_the_store_remembers_unchanged(
        store: EventStore) -> None:
    store.append([StreamAppend("s/1", 0, [event("a")])])  # the store now knows s/1 is at 1
    with pytest.raises(RuntimeError), store.transaction() as tx:
        tx.append([StreamAppend("s/1", 1, [event("lost")]), StreamAppend("s/2", 0, [event("x")])])
        raise RuntimeError("handler crashed after appending")
    with store.transaction() as tx:
        assert (tx.stream_version("s/1"), tx.stream_version("s/2")) == (1, 0)
    store.append([StreamAppend("s/1", 1, [event("b")]), StreamAppend("s/2", 0, [event("y")])])
    with store.transaction() as tx:
        assert (tx.stream_version("s/1"), tx.stream_version("s/2")) == (2, 1)
    assert [e.data["slot"] for e in store.read_stream("s/1")] == ["a", "b"]


def test_the_database_refuses_a_duplicate_stream_version(store: EventStore) -> None:
    """Uniqueness is the database's job, not only the store's check."""
    store.append([StreamAppend("s/1", 0, [event("a")])])
    with store.engine.connect() as conn, pytest.raises(Exception) as raised:
        conn.execute(text(
            "INSERT INTO events (position, stream_id, stream_version, event_id, event_type, "
            "schema_version, data, actor, tenant, occurred_at, recorded_at, prev_hash, hash) "
            "VALUES (99, 's/1', 1, 'other-id', 'T', 1, '{}', 'a', 't', 'x', 'x', 'h', 'h')"))
        conn.commit()
    assert "unique" in str(raised.value).lower()


def test_a_refused_append_caught_inside_the_transaction_changes_no_stream_version(
        store: EventStore) -> None:
    store.append([StreamAppend("s/2", 0, [event("b", {})])])
    with store.transaction() as tx:
        with pytest.raises(ConcurrencyConflict):
            tx.append([StreamAppend("s/1", 0, [event("a", {})]), StreamAppend("s/2", 5, [])])
        assert tx.stream_version("s/1") == 0  # the refused call appended nothing to it
        tx.append([StreamAppend("s/1", 0, [event("a2", {})])])
    assert [e.stream_version for e in store.read_stream("s/1")] == [1]
    store.append([StreamAppend("s/1", 1, [event("a3", {})])])  # the store remembers version 1
    assert [e.stream_version for e in store.read_stream("s/1")] == [1, 2]
