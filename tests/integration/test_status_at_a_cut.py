"""`status --at` inside a decision shows the state before it and says so, as `replay --to`."""

from __future__ import annotations

import json

from sqlalchemy import text

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
