"""`status --at` inside a decision shows the state before it and says so, as `replay --to`."""

from __future__ import annotations

import json

from sqlalchemy import text

from controlplane.replay.boundaries import whole_decisions_cut
from events.store import EventStore
from tests.cli_helpers import run_cli
from tests.factories import place_replica, register_model, register_node
from tests.fleet_helpers import run


def test_status_at_a_position_inside_a_decision_says_where_it_cut(store: EventStore) -> None:
    run(store, register_node("n1"), register_model())
    run(store, place_replica("r1"))
    with store.engine.connect() as conn:  # the placement's events: ReplicaPlaced, GpusReserved
        placed, reserved = conn.execute(text(
            "SELECT position FROM events WHERE command_id = 'place-r1' "
            "AND event_type != 'CommandAccepted' ORDER BY position")).scalars().all()
    text_report = run_cli("status", "--at", str(placed))
    assert text_report.exit_code == 0
    assert text_report.output.splitlines()[0] == (
        f"position {placed} is inside a decision's (or an effect's) events: the state as of "
        f"{placed - 1}, before them")
    report = json.loads(run_cli("status", "--at", str(placed), "--json").output)
    assert (report["requested_position"], report["position"]) == (placed, placed - 1)
    whole = json.loads(run_cli("status", "--at", str(reserved), "--json").output)
    assert "requested_position" not in whole and whole["position"] == reserved


def test_a_cut_deep_inside_a_decisions_issued_commands_moves_before_the_decision(
        store: EventStore) -> None:
    """A scale-up issuing 99 placements is one decision of 100 events. Every cut inside it
    moves to just before it: more than 63 events in, the first window read back held only the
    issued commands' acceptances, and the cut stayed where it was, on a state never committed."""
    run(store, *[register_node(f"n{i}", gpus=8) for i in range(20)], register_model(),
        {"type": "SetPolicy", "command_id": "autoscaling-policy", "name": "autoscaling",
         "parameters": {"service_tokens_per_second_per_replica": 100.0,
                        "target_utilization": 1.0, "max_replicas": 150}},
        place_replica("r1"), {"type": "MarkReplicaReady", "replica_id": "r1",
                              "command_id": "ready-r1"},
        {"type": "ObserveLoad", "command_id": "spike", "pool_id": "chat",
         "at": "2026-11-30T12:01:40Z",
         "observations": [{"observed_at": "2026-11-30T12:01:40Z", "queued_tokens": 0,
                           "arrival_tokens_per_second": 10_000.0}]})
    with store.engine.connect() as conn:
        first, last = conn.execute(text(
            "SELECT min(position), max(position) FROM events WHERE command_id = 'spike' "
            "AND event_type != 'CommandAccepted' OR causation_id IN (SELECT event_id FROM "
            "events WHERE command_id = 'spike' AND event_type = 'ScaleDecided')")).one()
    assert last - first == 99
    assert [p for p in range(first, last) if whole_decisions_cut(store, p) != first - 1] == []
    assert whole_decisions_cut(store, last) == last
