"""Placement through the log: atomic reservations, refusals that explain themselves, release."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.errors import SubmissionRejected
from controlplane.explain import explain_id
from controlplane.faults.invariants import gpu_holds
from controlplane.replay import compare_with_live, verify_decisions
from events.store import EventStore
from tests.factories import place_replica, register_model, register_node
from tests.fleet_helpers import run

pytestmark = pytest.mark.usefixtures("embedded_queue")




def decisions(store: EventStore, event_type: str) -> list[Any]:
    return [e for e in store.read_all() if e.event_type == event_type]


def test_a_placement_reserves_its_gpus_on_every_node_stream_at_once(store: EventStore) -> None:
    run(store, register_node("n1", gpus=2), register_node("n2", gpus=2), register_model(),
        place_replica("r1", tp=2), place_replica("r2", tp=2))
    placed = decisions(store, "ReplicaPlaced")
    assert [e.data["result"]["replica_id"] for e in placed] == ["r1", "r2"]
    groups = [e.data["result"]["gpus"] for e in placed]
    assert groups[0] != groups[1]
    assert set(gpu_holds(store.read_all()).values()) == {1}
    reservations = decisions(store, "GpusReserved")
    assert all(r.data["causes"] == [placed[i // 1].event_id] for i, r in enumerate(reservations))


def test_a_refused_placement_lists_every_candidate_and_its_first_failed_constraint(
        store: EventStore) -> None:
    run(store, register_node("n1", gpus=2), register_node("n2", gpus=1, capabilities=("fp16",)),
        register_model(), place_replica("r1", tp=1, required_capabilities=["bf16"]),
        place_replica("r2", tp=2,
                                                                   required_capabilities=["bf16"]))
    refused = decisions(store, "PlacementRefused")
    assert len(refused) == 1
    explanation = explain_id(store, "place-r2")
    decision = explanation["chain"][0]
    assert decision["outcome"] == "refused"
    refusal = next(r for r in decision["reasons"] if r["code"] == "no_feasible_group")
    gates = {gpu["gpu"]: gpu["failed"] for gpu in refusal["facts"]["gpus"]}
    assert gates == {"n1:g0": "gpu_reserved", "n1:g1": "eligible", "n2:g0": "missing_capability"}
    domains = {d["domain"]: d["failed"] for d in refusal["facts"]["domains"]}
    assert domains == {"node:n1": "gpu_reserved", "node:n2": "locality"}


def test_cordoned_nodes_take_no_new_replicas(store: EventStore) -> None:
    run(store, register_node("n1", gpus=1), register_model(),
        {"type": "CordonNode", "node_id": "n1", "command_id": "cordon-n1"}, place_replica("r1"))
    refusal = decisions(store, "PlacementRefused")[0]
    facts = next(r for r in refusal.data["reasons"] if r["code"] == "no_feasible_group")["facts"]
    assert facts["gpus"][0]["failed"] == "gpu_cordoned"


def test_release_frees_gpus_and_drain_releases_every_replica_on_a_node(store: EventStore) -> None:
    run(store, register_node("n1", gpus=2), register_model(), place_replica("r1"),
        place_replica("r2"), {"type": "ReleaseReplica", "replica_id": "r1", "command_id": "rel"},
        place_replica("r3"), {"type": "DrainNode", "node_id": "n1", "command_id": "drain"})
    assert len(decisions(store, "ReplicaPlaced")) == 3
    assert set(gpu_holds(store.read_all()).values()) == {0}
    released = [e.data["result"]["replica_id"] for e in decisions(store, "ReplicaReleased")]
    assert released == ["r1", "r2", "r3"]
    assert compare_with_live(store) == [] and verify_decisions(store).drifts == []


def test_a_warming_replica_adds_no_pool_capacity_until_ready(store: EventStore) -> None:
    run(store, register_node("n1", gpus=1), register_model(), place_replica("r1"))
    from controlplane.replay import state_at

    pool = state_at(store).get("pool", "chat")
    assert pool is not None and pool["live_token_budget"] == 0 and "r1" in pool["warming"]
    run(store, {"type": "MarkReplicaReady", "replica_id": "r1", "command_id": "ready-r1"})
    pool = state_at(store).get("pool", "chat")
    assert pool is not None and pool["live_token_budget"] == pool["ready"]["r1"] > 0


def test_commands_naming_unknown_things_are_refused_and_write_nothing(store: EventStore) -> None:
    run(store, register_node("n1"), register_model())
    head = store.head()
    for payload, field in [
        ({"type": "CordonNode", "node_id": "ghost", "command_id": "x1"}, "node_id"),
        (place_replica("r1", model_id="ghost-model"), "model_id"),
        ({"type": "ReleaseReplica", "replica_id": "ghost", "command_id": "x3"}, "replica_id"),
        ({"type": "MarkReplicaReady", "replica_id": "ghost", "command_id": "x4"}, "replica_id"),
        ({"type": "SetPolicy", "name": "placement", "parameters": {"usable_fraction": 2},
          "command_id": "x5"}, "parameters"),
        ({**register_node("n1"), "command_id": "again"}, "node_id"),
    ]:
        with pytest.raises(SubmissionRejected) as raised:
            run(store, payload)
        assert [p.field for p in raised.value.problems] == [field]
    assert store.head() == head


def test_a_command_may_reference_what_an_earlier_line_of_its_submission_creates(
        store: EventStore) -> None:
    run(store, register_node("n1"), register_model(), place_replica("r1"),
        {"type": "MarkReplicaReady", "replica_id": "r1", "command_id": "ready"})
    assert len(decisions(store, "ReplicaReady")) == 1


def test_decisions_record_the_policy_version_they_used(store: EventStore) -> None:
    run(store, register_node("n1", gpus=2), register_model(), place_replica("r1"),
        {"type": "SetPolicy", "name": "placement", "parameters": {"usable_fraction": 0.8},
         "command_id": "policy-1"}, place_replica("r2"))
    versions = [e.data["policy"]["version"] for e in decisions(store, "ReplicaPlaced")]
    assert versions == [0, 1]
    assert verify_decisions(store).drifts == []
