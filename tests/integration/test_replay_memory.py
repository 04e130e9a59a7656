"""Replay in bounded memory: stream versions beyond the kept generations come back from the log,
and re-derivation still uses exactly the versions each decision read; streams are read in
chunks where they can grow with the log."""

from __future__ import annotations

from typing import Any

import pytest

import events.store
from controlplane.explain import explain_id
from controlplane.replay.versions import StreamVersions
from events.model import StreamAppend
from events.store import EventStore
from tests.factories import assess_memory, event
from tests.fleet_helpers import run


def test_stream_versions_dropped_from_memory_are_read_back_from_the_log(store: EventStore) -> None:
    # Twelve streams written round-robin, three events each, one stream per append.
    for round_ in range(3):
        for stream in range(12):
            store.append([StreamAppend(f"s/{stream}", round_,
                                       [event(f"{stream}-{round_}", command_id=f"c{stream}")])])
    versions = StreamVersions(store, limit=2)
    expected: dict[str, int] = {}
    try:
        for recorded in store.read_all():
            versions.folded(recorded)
            expected[recorded.stream_id] = recorded.stream_version
            for stream_id in (*expected, "s/never-written"):
                assert versions(stream_id) == expected.get(stream_id, 0), (recorded.position,
                                                                          stream_id)
        assert versions.dropped_any  # the check above ran on read-back versions too
        assert len(versions.young) + len(versions.old) <= 2 * 2 + 1
    finally:
        versions.close()


def test_a_decision_sees_the_version_before_its_own_first_event_on_each_stream(
        store: EventStore) -> None:
    store.append([StreamAppend("s/a", 0, [event("a1"), event("a2")])])
    store.append([StreamAppend("s/a", 2, [event("a3", command_id="d")]),
                  StreamAppend("s/b", 0, [event("b1", command_id="d")])])
    folded, decision = list(store.read_all())[:2], list(store.read_all())[2:]
    versions = StreamVersions(store, limit=1)
    try:
        for recorded in folded:
            versions.folded(recorded)
        before = versions.before(decision)
        assert (before("s/a"), before("s/b"), before("s/c")) == (2, 0, 0)
    finally:
        versions.close()


def test_a_stream_read_in_chunks_is_the_stream_in_either_order(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.append([StreamAppend("s/a", 0, [event(f"a{i}") for i in range(7)])])
    store.append([StreamAppend("s/b", 0, [event("b0")])])
    monkeypatch.setattr(events.store, "READ_CHUNK", 3)  # chunks of 3, 3 and 1; then of 3 exactly
    whole = store.read_stream("s/a")
    assert [e.event_id for e in store.iter_stream("s/a")] == [e.event_id for e in whole]
    assert [e.event_id for e in store.iter_stream("s/a", newest_first=True)] == \
        [e.event_id for e in reversed(whole)]
    store.append([StreamAppend("s/c", 0, [event(f"c{i}") for i in range(6)])])
    assert len(list(store.iter_stream("s/c", newest_first=True))) == 6
    assert list(store.iter_stream("s/none")) == []


def test_explain_finds_an_entitys_latest_decision_without_reading_its_whole_stream(
        store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """`explain <pool>` read the pool's whole stream (an event per admission) into memory: 385
    MB on a 210,000-event log. It reads newest first, in chunks, and stops at the decision."""
    run(store, *(assess_memory(f"m{i}", model_name="shared") for i in range(9)))
    monkeypatch.setattr(events.store, "READ_CHUNK", 2)
    monkeypatch.setattr(EventStore, "read_stream", None)  # never the whole stream at once
    chunks: list[tuple[str, int]] = []
    fetch = events.store.driver.fetch

    def counted(connection: Any, statement: str, *args: Any, **kwargs: Any) -> Any:
        rows = fetch(connection, statement, *args, **kwargs)
        if "stream_version <" in statement:
            chunks.append((args[0], len(rows)))
        return rows

    monkeypatch.setattr(events.store.driver, "fetch", counted)
    explained = explain_id(store, "shared")
    assert explained["chain"][0]["command_id"] == "m8"  # the latest of nine
    # One chunk of the model's stream read: its newest event was the decision.
    assert [chunk for chunk in chunks if chunk[1]] == [("memory/shared", 2)]
