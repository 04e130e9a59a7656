"""`fleetctl simulate` under overload: every request's fate is the one its log records.

An admission walks the queue before it judges the arrival: it sheds heads past their deadline
and admits heads that then fit, each a decision on that request's own stream. The simulation
must act on those too: route and release what was admitted, count what was shed.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from controlplane.replay import state_at
from controlplane.runtime import open_store
from controlplane.simulation.config import SimulationConfig
from controlplane.simulation.report import build_report
from controlplane.simulation.run import Simulation
from controlplane.simulation.traces import read_trace
from controlplane.simulation.world import Fate, RequestState
from events.store import EventStore

TRACES = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
MOONCAKE_CONV = TRACES / "conversation_trace.first5000.jsonl"
REQUEST_DECISIONS = ("RequestAdmitted", "RequestQueued", "RequestShed", "RequestReleased")
# The log's last decision on a request, and the fate the simulation must report for it.
FATE_OF_LAST_DECISION = {"RequestReleased": Fate.COMPLETED, "RequestShed": Fate.SHED,
                         "RequestQueued": Fate.UNFINISHED}


@pytest.fixture(scope="module")
def overloaded(tmp_path_factory: pytest.TempPathFactory) \
        -> tuple[dict[str, Any], list[RequestState], EventStore]:
    """300 conversation requests on one replica: the queue fills, heads time out in it."""
    log = tmp_path_factory.mktemp("overload") / "sim.db"
    store = open_store(f"sqlite:///{log}")
    config = SimulationConfig(max_replicas=1, rollout=False)
    run = Simulation(read_trace(MOONCAKE_CONV, 300), config, store).run()
    return build_report(run, 0.0, str(log), None), run.requests, store


def test_overload_reports_the_fates_the_log_records_admitted_and_shed(
        overloaded: tuple[dict[str, Any], list[RequestState], EventStore]) -> None:
    report, requests, store = overloaded
    in_log = Counter(e.event_type for e in store.read_all() if e.event_type in REQUEST_DECISIONS)
    walked_sheds = [e for e in store.read_all() if e.event_type == "RequestShed"
                    and e.data["reasons"][0]["code"] == "deadline_passed_in_queue"
                    and e.command_id is not None and e.command_id.startswith("admit-")]
    assert walked_sheds, "the run must exercise a walk of the queue at an arrival's door"
    served = report["requests"]
    assert served["shed"] == in_log["RequestShed"]
    assert served["completed"] == in_log["RequestAdmitted"] == in_log["RequestReleased"]
    assert served["completed"] + served["shed"] + served["unfinished"] == len(requests) == 300
    last: dict[str, str] = {}
    for event in store.read_all():
        if event.event_type in REQUEST_DECISIONS:
            last[event.stream_id.removeprefix("request/")] = event.event_type
    assert {r.request_id: r.fate for r in requests} == {
        rid: FATE_OF_LAST_DECISION[kind] for rid, kind in last.items()}


def test_overload_leaves_no_live_tokens_reserved_only_the_unfinished_queued(
        overloaded: tuple[dict[str, Any], list[RequestState], EventStore]) -> None:
    report, requests, store = overloaded
    pool = state_at(store).get("admission", SimulationConfig().pool_id)
    assert pool is not None and pool["live_tokens"] == 0
    unfinished = sorted(r.request_id for r in requests if r.fate is Fate.UNFINISHED)
    assert sorted(pool["queue"]) == unfinished and len(unfinished) == report["requests"]["unfinished"]
