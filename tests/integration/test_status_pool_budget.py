"""`fleetctl status` shows each pool's live-token budget as admission computes it: before, it
showed the ready replicas' KV capacity under that name, twice what a decision under a budget
fraction of 0.5 used, so a queued request looked as if it fitted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from tests.fleet_helpers import decision, store_at

REPRO = [
    {"type": "RegisterNode", "command_id": "n1", "node_id": "n1", "rack": "r1",
     "gpus": [{"gpu_id": "g0", "gpu_type": "H100", "memory_gib": 80.0}]},
    {"type": "RegisterModel", "command_id": "m1", "model_id": "llama8b",
     "memory": {"parameters": 8030261248, "weight_bits": 16, "layers": 32, "kv_heads": 8,
                "head_dim": 128}},
    {"type": "SetPolicy", "command_id": "sp1", "name": "admission",
     "parameters": {"live_token_budget_fraction": 0.5}},
    {"type": "PlaceReplica", "command_id": "p1", "replica_id": "r1", "model_id": "llama8b",
     "pool_id": "pool1", "at": "2026-01-01T00:00:00Z"},
    {"type": "MarkReplicaReady", "command_id": "ready1", "replica_id": "r1",
     "at": "2026-01-01T00:00:10Z"},
    *({"type": "AdmitRequest", "command_id": f"a{i}", "request_id": f"q{i}", "pool_id": "pool1",
       "prompt_tokens": 100000, "max_output_tokens": 30000,
       "deadline_at": "2026-01-01T00:00:21Z", "at": "2026-01-01T00:00:20Z"} for i in (1, 2)),
]


@pytest.fixture(autouse=True)
def embedded(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("FLEET_REDIS_URL", raising=False)
    return sqlite_url


def test_status_shows_the_budget_admission_decided_against(tmp_path: Path, embedded: str) -> None:
    source = tmp_path / "c.jsonl"
    source.write_text("\n".join(json.dumps(c) for c in REPRO), encoding="utf-8")
    assert run_cli("submit", str(source), "--wait").exit_code == 0
    with store_at(embedded) as store:
        queued = decision(store, "a2").data
    assert queued["outcome"] == "queue"
    budget = queued["inputs"]["pool"]["live_token_budget"]
    report = json.loads(run_cli("status", "--json").output)
    capacity = report["projections"]["pool"]["pool1"]["live_token_budget"]
    assert report["pool_budgets"] == {"pool1": budget} and budget == capacity // 2
    text = run_cli("status").output
    assert f"pool1  1      0        {capacity}           {budget}" in text
