"""The fault suite's invariant checker itself: silent on a clean fleet, and each invariant
reports its own code when the log breaks it (a checker that cannot fail proves nothing)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from controlplane.commands import command_adapter
from controlplane.faults import assert_fleet_invariants, check_fleet_invariants
from controlplane.runtime import open_store
from controlplane.service import accept, decide, pending_command_ids
from controlplane.state.fleet import GPUS_RESERVED
from controlplane.workloads import mixed_fleet
from events.model import NewEvent, RecordedEvent, StreamAppend
from events.store import EventStore

SEED = 7


@pytest.fixture
def fleet(sqlite_url: str) -> EventStore:
    """A small mixed fleet decided in-process: placements, admissions, a scale-up, canaries."""
    store = open_store(sqlite_url)
    for phase in mixed_fleet(SEED, 40, nodes=4, gpus_per_node=4, replicas=4):
        accept(store, [command_adapter.validate_python(p) for p in phase])
        while pending := pending_command_ids(store):
            decide(store, pending)
    return store


def forge(store: EventStore, stream_id: str, event_type: str, command_id: str,
          data: dict[str, object]) -> None:
    """Append an event straight to the log, bypassing every handler."""
    event = NewEvent(event_id=str(uuid.uuid4()), event_type=event_type, data=data,
                     occurred_at="2026-11-30T13:00:00Z", command_id=command_id)
    store.append([StreamAppend(stream_id, None, [event])])


def codes(store: EventStore) -> set[str]:
    return {violation.split(":")[0] for violation in check_fleet_invariants(store).violations}


def test_a_clean_fleet_keeps_every_invariant_and_each_check_looked_at_something(
        fleet: EventStore) -> None:
    report = assert_fleet_invariants(fleet)
    assert report.commands_decided == report.commands_accepted > 100
    assert report.reservations_folded >= 4 and report.budget_checks >= 40
    assert report.decisions_rederived == report.commands_decided
    assert report.events_chained == fleet.head()[0]


def recorded(store: EventStore, event_type: str, command_id: str) -> RecordedEvent:
    return next(e for e in store.events_for_command(command_id) if e.event_type == event_type)


def test_a_command_decided_a_second_time_is_reported(fleet: EventStore) -> None:
    first = recorded(fleet, "RequestAdmitted", "admit-chat-req-000003")
    forge(fleet, first.stream_id, first.event_type, "admit-chat-req-000003",
          {**first.data, "read_position": fleet.head()[0]})
    assert "decided_twice" in codes(fleet)


def test_a_gpu_reserved_while_another_replica_holds_it_is_reported(fleet: EventStore) -> None:
    held = next(e for e in fleet.read_all() if e.event_type == GPUS_RESERVED)
    forge(fleet, f"node/{held.data['result']['node_id']}", GPUS_RESERVED, "place-intruder",
          {"outcome": "applied", "reasons": [], "read_position": fleet.head()[0],
           "result": {**held.data["result"], "replica_id": "intruder"}})
    assert "gpu_reserved_twice" in codes(fleet)


def test_live_tokens_beyond_the_pools_budget_are_reported(fleet: EventStore) -> None:
    admitted = recorded(fleet, "RequestAdmitted", "admit-chat-req-000005")
    reason = {**admitted.data["reasons"][0], "facts": {"live_tokens_after": 2_000_001,
                                                       "max_live_tokens": 2_000_000}}
    forge(fleet, admitted.stream_id, admitted.event_type, "admit-chat-req-000005",
          {**admitted.data, "reasons": [reason]})
    assert "budget_overspent" in codes(fleet)


def test_an_accepted_command_left_undecided_is_reported(fleet: EventStore) -> None:
    accept(fleet, [command_adapter.validate_python(
        {"type": "ReleaseRequest", "command_id": "release-late", "request_id": "chat-req-000001",
         "at": "2026-11-30T13:00:00Z"})])
    assert "undecided" in codes(fleet)


def test_an_edited_row_breaks_the_chain_and_the_replay(fleet: EventStore) -> None:
    with fleet.engine.begin() as conn:
        conn.execute(text("UPDATE events SET data = replace(data, '\"shed\"', '\"admit\"') "
                          "WHERE event_type = 'PoolAdmissionChanged'"))
        conn.execute(text("UPDATE events SET data = replace(data, 'registered', 'forged') "
                          "WHERE event_type = 'NodeRegistered'"))
    assert "chain_broken" in codes(fleet)
