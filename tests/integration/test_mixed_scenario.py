"""A mixed fleet of over 10,000 decisions: live state equals the rebuilt one, decisions re-derive
exactly, and the state at past positions equals what the live state was then."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from controlplane.commands import command_adapter
from controlplane.decisions import is_issued_id
from controlplane.replay import compare_with_live
from controlplane.replay.verify import verify_decisions
from controlplane.runtime import open_store
from controlplane.service import accept, decide, pending_command_ids
from controlplane.workloads import mixed_fleet
from events.projections import load_all
from events.store import EventStore
from tests.cli_helpers import run_cli

pytestmark = pytest.mark.slow
SEED = 20261130


def decide_all(store: EventStore, payloads: list[dict], batch: int = 500) -> None:
    commands = [command_adapter.validate_python(p) for p in payloads]
    accept(store, commands)
    while pending := pending_command_ids(store):  # follow-ups (placements, evaluations) too
        for start in range(0, len(pending), batch):
            decide(store, pending[start:start + batch])


def test_ten_thousand_mixed_decisions_replay_exactly(sqlite_url: str) -> None:
    print(f"seed {SEED}")
    store = open_store(sqlite_url)
    snapshots: dict[int, dict] = {}
    for phase in mixed_fleet(SEED, requests=5_200):
        for start in range(0, len(phase), 2_000):
            decide_all(store, phase[start:start + 2_000])
            position = store.head()[0]
            with store.engine.connect() as conn:
                snapshots[position] = load_all(conn)
    decisions = Counter(e.event_type for e in store.read_all()
                        if e.event_type not in ("CommandAccepted", "LogCheckpointed")
                        and "outcome" in e.data)
    assert sum(decisions.values()) >= 10_000, decisions
    for kind in ("NodeRegistered", "ReplicaPlaced", "RequestAdmitted", "RequestReleased",
                 "ScaleDecided", "RolloutPromoted", "RolloutRolledBack"):
        assert decisions[kind] > 0, f"the scenario never produced {kind}"
    # The ids decisions give the commands they issue are the ones submissions may not take.
    issued = [e.command_id or "" for e in store.read_all()
              if e.event_type == "CommandAccepted" and e.causation_id]
    assert all(is_issued_id(command_id) for command_id in issued)
    assert any(":place:" in c for c in issued) and any(c.endswith(":evaluate") for c in issued)
    assert compare_with_live(store) == []
    report = verify_decisions(store)
    assert report.decisions_checked >= 10_000 and report.drifts == []
    for position in sorted(snapshots)[:: max(1, len(snapshots) // 4)]:
        result = run_cli("status", "--at", str(position), "--json")
        assert result.exit_code == 0
        assert json.loads(result.output)["projections"] == snapshots[position], position
