"""Placement through the log: atomic reservations, refusals that explain themselves, release."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controlplane.errors import SubmissionRejected
from controlplane.explain import explain_id
from controlplane.faults.invariants import gpu_holds
from controlplane.replay import compare_with_live, verify_decisions
from controlplane.submission import read_submission
from events.store import EventStore
from tests.factories import place_replica, register_model, register_node
from tests.fleet_helpers import assert_replay_exact, decision, run

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


def test_a_drain_records_each_release_before_the_gpus_it_frees(store: EventStore) -> None:
    """The cordon, then per replica its release and the GPUs that release frees on the node:
    with every node event merged into the cordon's append, the GPUs were recorded freed before
    the releases that caused them."""
    run(store, register_node("n1", gpus=2), register_model(), place_replica("r1"),
        place_replica("r2"), {"type": "DrainNode", "node_id": "n1", "command_id": "drain"})
    recorded = [(e.event_type, e.stream_id) for e in store.events_for_command("drain")
                if e.event_type != "CommandAccepted"]
    assert recorded == [("NodeCordoned", "node/n1"),
                        ("ReplicaReleased", "replica/r1"), ("GpusReleased", "node/n1"),
                        ("ReplicaReleased", "replica/r2"), ("GpusReleased", "node/n1")]
    assert_replay_exact(store)


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


def test_a_node_id_with_the_gpu_separator_is_refused_at_submit() -> None:
    """GPUs are named `<node>:<gpu>`: node `a:b`'s GPU `g0` read back as node `a`'s GPU `b:g0`,
    so its reservation went to another node's stream and the GPU could be reserved twice."""
    with pytest.raises(SubmissionRejected) as refused:
        read_submission(json.dumps(register_node("a:b", gpus=1)))
    assert [problem.field for problem in refused.value.problems] == ["node_id"]


def test_duplicate_gpu_ids_are_refused_naming_the_gpus_field() -> None:
    node = register_node("n1", gpus=1)
    node["gpus"] = node["gpus"] * 2
    with pytest.raises(SubmissionRejected) as refused:
        read_submission(json.dumps(node))
    assert [problem.field for problem in refused.value.problems] == ["gpus"]


def test_the_automatic_width_is_sized_on_the_gpus_a_placement_could_take(
        store: EventStore) -> None:
    """A drained 141 GiB node had set the width to 1 (a 50B model fits one such GPU), and every
    automatic placement was refused, though two free 80 GiB GPUs fit it at width 2."""
    model = {"type": "RegisterModel", "command_id": "model-m", "model_id": "m",
             "memory": {"parameters": 50_000_000_000, "weight_bits": 16, "layers": 32,
                        "kv_heads": 8, "head_dim": 128}}
    run(store, register_node("small", gpus=2, memory_gib=80.0),
        register_node("big", gpus=1, memory_gib=141.0), model,
        {"type": "DrainNode", "command_id": "drain-big", "node_id": "big"},
        place_replica("auto", model_id="m", tp=None))
    placed = decision(store, "place-auto")
    assert placed.data["outcome"] == "placed"
    assert (placed.data["result"]["tensor_parallel"], placed.data["result"]["gpus"]) == (
        2, {"small": ["g0", "g1"]})
    assert verify_decisions(store).drifts == [] and compare_with_live(store) == []


def test_a_placement_on_a_fleet_with_no_gpu_is_refused_not_rejected_as_bad_input(
        store: EventStore) -> None:
    run(store, register_model(), place_replica("r1", tp=None))
    refused = decision(store, "place-r1")
    assert (refused.event_type, [r["code"] for r in refused.data["reasons"]]) == (
        "PlacementRefused", ["no_gpus"])
    assert verify_decisions(store).drifts == [] and compare_with_live(store) == []


def test_a_placed_replicas_memory_record_is_assessed_on_the_gpus_it_was_given(
        store: EventStore) -> None:
    """The width is sized on the largest GPU the placement could take (80 GiB); the replica
    lands on the 24 GiB one, and its memory block agrees with the capacity it records."""
    run(store, register_node("big", gpus=1, memory_gib=80.0),
        register_node("small", gpus=1, memory_gib=24.0), register_model(),
        place_replica("r1", tp=None))
    result = decision(store, "place-r1").data["result"]
    assert result["gpus"] == {"small": ["g0"]}
    memory = result["memory"]
    assert memory["usable_gib_per_gpu"] == pytest.approx(24.0 * 0.9)
    assert (memory["kv_capacity_tokens"], memory["max_concurrency"]) == (
        result["kv_capacity_tokens"], result["max_concurrency"])
    assert memory["required_gib_per_gpu"] == result["required_gib_per_gpu"]
