"""Logs written by earlier versions still verify, and re-derive with no drift.

`fixtures/logs/gateway_dispatch_marked_in_decision.jsonl` holds every row of a log written
before the gateway's effects marked their operations themselves: the gateway's common fixture
and one completed Dispatch, whose decision then held its `OperationDispatching` mark between
`OperationReserved` and `BudgetReserved`. The mark is an observation now.
"""

from __future__ import annotations

import json
from pathlib import Path

from controlplane.replay.verify import verify_decisions
from controlplane.runtime import open_store
from events import driver
from events.rows import INSERT_EVENTS, row_values
from events.transaction import UPDATE_HEAD
from events.verify import verify_log

LEGACY = Path(__file__).resolve().parents[2] / "fixtures/logs/gateway_dispatch_marked_in_decision.jsonl"


def test_a_log_whose_dispatch_decisions_held_their_mark_verifies_and_re_derives(
        tmp_path: Path) -> None:
    rows = [json.loads(line) for line in LEGACY.read_text(encoding="utf-8").splitlines()]
    dispatch = [row["event_type"] for row in rows if row["command_id"].startswith("d-")]
    assert dispatch[1:4] == ["OperationReserved", "OperationDispatching", "BudgetReserved"]
    store = open_store(f"sqlite:///{tmp_path}/legacy.db")
    with store.engine.connect().execution_options(fleet_write=True) as conn, conn.begin():
        driver.execute_many(conn, INSERT_EVENTS, [row_values(row) for row in rows])
        driver.execute(conn, UPDATE_HEAD, rows[-1]["position"], rows[-1]["hash"])
    assert verify_log(store).ok
    report = verify_decisions(store)
    assert report.decisions_checked == 24 and report.drifts == []
    store.engine.dispose()
