"""The automatic tensor-parallel width through the log: the smallest width that actually places.

Models below are sized so each width's need per GPU is known (16-bit weights, 8 KV heads, the
factory's 4,096 tokens x 4 requests, 2 GiB overhead, usable fraction 0.9):
- 50B parameters: width 1 needs 97.1 GiB, 2 needs 49.6, 4 needs 25.8 per GPU;
- 110B parameters: 1 needs 208.9, 2 needs 105.4, 4 needs 53.7, 8 needs 27.9.
An 80 GB GPU offers 72 usable GiB, a 40 GB one 36.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from controlplane.policies import placement
from controlplane.policies.memory import ModelMemory
from controlplane.policies.placement import Locality, domain_of
from controlplane.policies.placement_width import (
    GroupOffers,
    MemorySizing,
    ReplicaShape,
    place_at_width,
)
from controlplane.replay import state_at
from controlplane.state.gpu_index import GpuIndex
from events.model import RecordedEvent
from events.store import EventStore
from tests.factories import place_replica, register_model, register_node
from tests.fleet_helpers import assert_replay_exact, decision, run

pytestmark = pytest.mark.usefixtures("embedded_queue")
FRACTION = 0.9


def model(model_id: str, parameters: int) -> dict[str, Any]:
    return {"type": "RegisterModel", "command_id": f"model-{model_id}", "model_id": model_id,
            "memory": {"parameters": parameters, "weight_bits": 16, "layers": 32,
                       "kv_heads": 8, "head_dim": 128}}


def layout(event: RecordedEvent) -> dict[str, Any]:
    reason: dict[str, Any] = event.data["reasons"][0]
    return reason


def outcomes(event: RecordedEvent) -> list[tuple[int, str]]:
    return [(t["tensor_parallel"], t["outcome"]) for t in layout(event)["facts"]["tried"]]


def test_a_width_the_largest_gpu_fits_but_no_node_can_group_gives_way_to_a_wider_one(
        store: EventStore) -> None:
    """Sized on node a's lone free 80 GB GPU the width was 2, which a cannot give twice and b's
    40 GB GPUs are too small for: refused, though width 4 fits four of b's GPUs."""
    run(store, register_node("a", gpus=1, memory_gib=80.0),
        register_node("b", gpus=8, memory_gib=40.0), model("m50", 50_000_000_000),
        place_replica("auto", model_id="m50", tp=None))
    placed = decision(store, "place-auto")
    assert placed.event_type == "ReplicaPlaced"
    result = placed.data["result"]
    assert (result["tensor_parallel"], result["gpus"]) == (4, {"b": ["g0", "g1", "g2", "g3"]})
    assert layout(placed)["code"] == "layout_smallest_fitting"
    assert outcomes(placed) == [(1, "exceeds_largest_gpu"), (2, "too_few_gpus"), (4, "taken")]
    tried = layout(placed)["facts"]["tried"]
    # Width 2 fits the 80 GB GPU (72 usable) but two GPUs of one node offer only 36 GiB each.
    assert tried[1]["required_gib_per_gpu"] > 36.0
    assert tried[1]["largest_group_usable_gib"] == pytest.approx(36.0)
    # The width was judged, and the replica's capacity computed, on b's 40 GB GPUs.
    assert result["memory"]["usable_gib_per_gpu"] == pytest.approx(36.0)
    assert result["memory"]["fits"] is True
    assert result["kv_capacity_tokens"] == result["memory"]["kv_capacity_tokens"]
    assert_replay_exact(store)


def test_a_width_wider_than_any_node_is_passed_over_for_one_a_node_can_hold(
        store: EventStore) -> None:
    """On nodes of three 80 GB GPUs width 4 was tried node-local and refused on every node,
    though width 8 fits node y's eight 40 GB GPUs."""
    run(store, register_node("x1", gpus=3, memory_gib=80.0),
        register_node("x2", gpus=3, memory_gib=80.0), register_node("y", gpus=8, memory_gib=40.0),
        model("m110", 110_000_000_000), place_replica("auto", model_id="m110", tp=None))
    placed = decision(store, "place-auto")
    assert placed.event_type == "ReplicaPlaced"
    assert (placed.data["result"]["tensor_parallel"], sorted(placed.data["result"]["gpus"])) == (
        8, ["y"])
    assert outcomes(placed) == [(1, "exceeds_largest_gpu"), (2, "exceeds_largest_gpu"),
                                (4, "too_few_gpus"), (8, "taken")]
    assert_replay_exact(store)


def test_a_fleet_where_no_width_places_is_refused_naming_why_each_width_was_not_taken(
        store: EventStore) -> None:
    run(store, register_node("x1", gpus=3, memory_gib=80.0),
        register_node("x2", gpus=3, memory_gib=80.0), model("m110", 110_000_000_000),
        place_replica("auto", model_id="m110", tp=None))
    refused = decision(store, "place-auto")
    assert refused.event_type == "PlacementRefused"
    assert layout(refused)["code"] == "layout_none_fits"
    assert outcomes(refused) == [(1, "exceeds_largest_gpu"), (2, "exceeds_largest_gpu"),
                                 (4, "too_few_gpus"), (8, "too_few_gpus")]
    tried = layout(refused)["facts"]["tried"]
    assert [t["largest_group_usable_gib"] for t in tried] == [None, None, None, None]
    assert all(f"width {tp} needs" in layout(refused)["message"] for tp in (1, 2, 4, 8))
    # The GPU-level facts are those of the first width only GPUs stopped: 4, on every node.
    assert refused.data["result"]["tensor_parallel"] == 4
    group = next(r for r in refused.data["reasons"] if r["code"] == "no_feasible_group")
    assert (group["facts"]["gpus_required"], group["facts"]["domains_by_failure"]) == (
        4, {"locality": 2})
    assert_replay_exact(store)


def test_a_fleet_with_no_gpu_to_take_says_so_rather_than_counting_gpus_it_has(
        store: EventStore) -> None:
    """Every GPU cordoned: the refusal had said the node offered "no 1 such GPUs" (it has two)."""
    run(store, register_node("x1", gpus=2, memory_gib=80.0), register_model(),
        {"type": "CordonNode", "command_id": "cordon-x1", "node_id": "x1"},
        place_replica("auto", tp=None))
    refused = decision(store, "place-auto")
    assert refused.event_type == "PlacementRefused"
    assert {outcome for _, outcome in outcomes(refused)} == {"no_gpu_available"}
    assert "no GPU can be taken" in layout(refused)["message"]
    assert "offers no" not in layout(refused)["message"]
    assert_replay_exact(store)


def test_the_width_search_honours_a_wider_locality(store: EventStore) -> None:
    """Width 4 that no 3-GPU node holds places across two nodes of one rack."""
    run(store, register_node("x1", gpus=3, memory_gib=80.0),
        register_node("x2", gpus=3, memory_gib=80.0), model("m110", 110_000_000_000),
        place_replica("auto", model_id="m110", tp=None, locality="rack"))
    placed = decision(store, "place-auto")
    assert placed.event_type == "ReplicaPlaced"
    assert placed.data["result"]["tensor_parallel"] == 4
    assert sum(len(ids) for ids in placed.data["result"]["gpus"].values()) == 4
    assert outcomes(placed) == [(1, "exceeds_largest_gpu"), (2, "exceeds_largest_gpu"),
                                (4, "taken")]
    assert_replay_exact(store)


def test_a_commanded_width_is_tried_alone(store: EventStore) -> None:
    run(store, register_node("a", gpus=1, memory_gib=80.0),
        register_node("b", gpus=8, memory_gib=40.0), model("m50", 50_000_000_000),
        place_replica("two", model_id="m50", tp=2))
    refused = decision(store, "place-two")
    assert refused.event_type == "PlacementRefused"
    assert (layout(refused)["code"], refused.data["result"]["tensor_parallel"]) == (
        "layout_commanded", 2)
    assert_replay_exact(store)


# The rule itself, against its definition on random fleets: the width taken is the smallest
# power of two at which `place_replica`, scanning every GPU, finds a group for that width's need.

MEMORIES_GIB = (24.0, 40.0, 48.0, 80.0)


@st.composite
def fleets(draw: st.DrawFn) -> list[tuple[str, dict[str, Any]]]:
    """Node rows of one to eight GPUs, some reserved, some nodes cordoned, over two racks."""
    rows = []
    for node in range(draw(st.integers(1, 5))):
        # Mostly one GPU model a node, as fleets are; now and then a node of mixed GPUs.
        node_memory = st.sampled_from(MEMORIES_GIB) if draw(st.integers(0, 4)) == 0 \
            else st.just(draw(st.sampled_from(MEMORIES_GIB)))
        capabilities = ["bf16", "fp8"] if draw(st.booleans()) else ["bf16"]
        gpus = {f"g{i}": {"gpu_id": f"g{i}", "gpu_type": "H100-SXM-80GB",
                          "memory_gib": draw(node_memory),
                          "capabilities": capabilities,
                          "reserved_by": draw(st.sampled_from([None] * 7 + ["other"])),
                          "resident_models": []}
                for i in range(draw(st.sampled_from([1, 2, 3, 4, 8, 8])))}
        rows.append((f"n{node}", {"node_id": f"n{node}", "gpus": gpus,
                                  # A blank rack or link domain is the node's own domain.
                                  "rack": draw(st.sampled_from(["rack-0", "rack-1", ""])),
                                  "link_domain": draw(st.sampled_from(["", "nvl-0", "nvl-1"])),
                                  "cordoned": draw(st.integers(0, 6)) == 0}))
    return rows


def row(node_id: str, gpus: int, memory_gib: float) -> tuple[str, dict[str, Any]]:
    return node_id, {"node_id": node_id, "rack": "rack-0", "link_domain": "", "cordoned": False,
                     "gpus": {f"g{i}": {"gpu_id": f"g{i}", "gpu_type": "H100-SXM-80GB",
                                        "memory_gib": memory_gib, "capabilities": ["bf16"],
                                        "reserved_by": None, "resident_models": []}
                              for i in range(gpus)}}


# Random fleets rarely hide the smallest width behind a node too small: the examples above, too.
@example(rows=[row("a", 1, 80.0), row("b", 8, 40.0)], parameters=50_000_000_000,
         capabilities=frozenset(), locality=Locality.NODE, max_tensor_parallel=8)
@example(rows=[row("x1", 3, 80.0), row("x2", 3, 80.0), row("y", 8, 40.0)],
         parameters=110_000_000_000, capabilities=frozenset(), locality=Locality.NODE,
         max_tensor_parallel=8)
@settings(max_examples=300, deadline=None)
@given(rows=fleets(), parameters=st.one_of(st.sampled_from([50_000_000_000, 110_000_000_000]),
                                  st.integers(30_000_000_000, 150_000_000_000)),
       capabilities=st.sampled_from([frozenset(), frozenset({"fp8"})]),
       locality=st.sampled_from([Locality.NODE, Locality.NODE, Locality.RACK,
                                 Locality.LINK_DOMAIN, Locality.ANY]),
       max_tensor_parallel=st.sampled_from([2, 8, 8, 16]))
def test_the_automatic_width_is_the_smallest_power_of_two_whose_need_a_group_of_gpus_meets(
        rows: list[tuple[str, dict[str, Any]]], parameters: int, capabilities: frozenset[str],
        locality: Locality, max_tensor_parallel: int) -> None:
    fleet = GpuIndex(FRACTION)
    for node_id, node_row in rows:
        fleet.apply(node_id, node_row)
    available = fleet.largest_available_gib(capabilities)
    largest = available if available is not None else fleet.largest_free_gib()
    assert largest is not None  # every fleet drawn has a GPU
    sizing = MemorySizing(ModelMemory(parameters, 16, 32, 8, 128), 4_096, 4, 2.0, FRACTION)
    shape = ReplicaShape("r", "m", capabilities, locality)
    widths = [tp for tp in (1, 2, 4, 8, 16) if tp <= max_tensor_parallel]
    needs = {tp: sizing.assess(tp, largest).required_gib_per_gpu for tp in widths}
    scanned = {tp: placement.place_replica(shape.at(tp, needs[tp]), fleet.inventory())
               for tp in widths}
    expected = next((tp for tp in widths if scanned[tp].placed), None)
    width = place_at_width(shape, sizing, fleet, None, available, largest, max_tensor_parallel)
    assert width.decision.placed is (expected is not None)
    if expected is not None:
        assert width.tensor_parallel == expected
        assert width.decision.gpu_ids == scanned[expected].gpu_ids
    tried = width.layout.facts["tried"]
    assert [t["tensor_parallel"] for t in tried] == (
        widths[:widths.index(expected) + 1] if expected is not None else widths)
    eligible: dict[str, list[float]] = {}
    for gpu in fleet.inventory():
        if not gpu.cordoned and not gpu.reserved and capabilities <= gpu.capabilities:
            eligible.setdefault(domain_of(gpu, locality), []).append(gpu.free_memory_gib)
    for tp in widths:
        offers = [sorted(frees, reverse=True)[tp - 1] for frees in eligible.values()
                  if len(frees) >= tp]
        offer = max(offers) if offers else None
        assert GroupOffers(fleet, capabilities, locality).most_for(tp) == offer
        # What a width was sized on is what `tp` GPUs of one domain offer, once memory let it.
        entry = next((t for t in tried if t["tensor_parallel"] == tp), None)
        if entry is not None and entry["outcome"] != "exceeds_largest_gpu":
            assert entry["largest_group_usable_gib"] == offer


def test_the_automatic_width_passes_over_one_the_models_heads_do_not_split_over(
        store: EventStore) -> None:
    """Qwen2.5-7B has 28 attention heads: on L4-sized GPUs only width 8 fits its memory, and
    `fleetctl fit` refuses that width, but the placement took it: a runtime would not start."""
    run(store, register_node("l4", gpus=8, memory_gib=22.35),
        register_model("qwen", "Qwen/Qwen2.5-7B-Instruct"),
        place_replica("auto", model_id="qwen", tp=None, max_live_tokens_per_request=32_768,
                      target_concurrency=35))
    refused = decision(store, "place-auto")
    assert refused.event_type == "PlacementRefused"
    assert outcomes(refused)[-1] == (8, "heads_do_not_split")
    assert "gpus" not in refused.data["result"] and state_at(store).get("replica", "auto") is None
    assert "width 8 needs" in layout(refused)["message"]
    assert "heads do not split over that many GPUs" in layout(refused)["message"]
    run(store, place_replica("four", model_id="qwen", tp=None, max_live_tokens_per_request=8_192,
                             target_concurrency=8))
    placed = decision(store, "place-four")
    assert placed.event_type == "ReplicaPlaced" and 28 % placed.data["result"]["tensor_parallel"] == 0
    assert_replay_exact(store)


def test_a_commanded_width_the_models_heads_do_not_split_over_is_refused_naming_both_counts(
        store: EventStore) -> None:
    run(store, register_node("n1", gpus=4), register_model(),
        place_replica("three", tp=3))
    refused = decision(store, "place-three")
    assert refused.event_type == "PlacementRefused"
    assert [r["code"] for r in refused.data["reasons"]] == [
        "attention_heads_not_divisible_by_tp", "kv_heads_incompatible_with_tp"]
    assert refused.data["reasons"][0]["facts"] == {"attention_heads": 32,
                                                   "tensor_parallel_size": 3}
    assert_replay_exact(store)
