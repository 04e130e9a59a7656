"""Replay in bounded memory: stream versions beyond the kept generations come back from the log,
and re-derivation still uses exactly the versions each decision read."""

from __future__ import annotations

from controlplane.replay.versions import StreamVersions
from events.model import StreamAppend
from events.store import EventStore
from tests.factories import event


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
