"""A projection row changed outside fleetctl is named, and `replay --rebuild` repairs it.

Projections are disposable: whatever a live row holds, the rebuild writes it again from the
log. Before, a row that was not JSON made every reader (status, replay, a placement's decision)
fail with a JSONDecodeError traceback naming no row, the rebuild included, so the documented
repair could not run; a row of the wrong shape made `status` print a traceback.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from controlplane.commands import command_adapter
from controlplane.replay import compare_with_live
from controlplane.replay.rebuild import rebuild_live
from controlplane.runtime import open_store
from controlplane.service import accept, decide
from events.model import UnreadableRow
from events.projection_cache import forget
from events.store import EventStore
from tests.cli_helpers import run_cli
from tests.factories import place_replica, register_model, register_node
from tests.fleet_helpers import assert_replay_exact, run


def damage(store: EventStore, data: str) -> None:
    """Overwrite node n1's row, as a hand edit would (this process's cached rows forgotten)."""
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE projections SET data = :data WHERE name = 'node' AND key = 'n1'"),
                     {"data": data})
    forget(store.engine)


@pytest.mark.parametrize("data", ["not json", "[]", "7", "{\"gpus\": "])
def test_a_rebuild_repairs_a_row_that_is_not_a_json_object(store: EventStore, data: str) -> None:
    run(store, register_node("n1"), register_model())
    damage(store, data)
    differences = compare_with_live(store)
    assert [(d["projection"], d["key"], d["live"]) for d in differences] == [("node", "n1", data)]
    rebuilt = rebuild_live(store)
    assert (rebuilt.differences_repaired, rebuilt.differences[0]["key"]) == (1, "n1")
    assert_replay_exact(store)


def test_a_decision_reading_a_row_that_is_not_json_names_it(store: EventStore) -> None:
    run(store, register_node("n1"), register_model())
    damage(store, "not json")
    ids = accept(store, [command_adapter.validate_python(place_replica("r1"))])
    with pytest.raises(UnreadableRow, match="projection row node/n1 cannot be read .*--rebuild"):
        decide(store, ids)
    rebuild_live(store)
    assert decide(store, ids)[0].decided_now


@pytest.mark.parametrize(("data", "named"), [
    ("not json", "projection row node/n1 cannot be read (not JSON)"),
    ("{}", "a live projection row is not one fleetctl wrote (KeyError: 'gpus')")])
def test_status_names_a_damaged_row_in_one_line_and_exits_3(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch, data: str, named: str) -> None:
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    store = open_store(sqlite_url)
    run(store, register_node("n1"), register_model())
    damage(store, data)
    store.engine.dispose()
    result = run_cli("status")
    assert result.exit_code == 3, result.stderr
    assert result.stderr.startswith(f"error: {named}") and len(result.stderr.splitlines()) == 1
    assert "replay --rebuild" in result.stderr
    assert run_cli("replay", "--rebuild").exit_code == 1  # repaired, and said so
    assert run_cli("status").exit_code == 0
