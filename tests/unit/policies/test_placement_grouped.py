"""The placement GPU index: deciding on it equals scanning every GPU, and it stays current."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.handlers.placement import inventory
from controlplane.policies.placement import GPU, Locality, PlacementRequest, place_replica
from controlplane.policies.placement_grouped import place_grouped
from controlplane.policies.reasons import PolicyInputError, to_plain
from controlplane.state.fleet import NODE
from controlplane.state.gpu_index import GpuIndex, gpu_index
from events.projections import MemoryProjections

MODELS = ("llama-8b", "qwen-7b")
MEMORIES = (40.0, 80.0)
CAPABILITIES = (("bf16",), ("bf16", "fp8"))
NODE_IDS = ("n0", "n1", "n1-x", "n10", "n2", "n3", "n4", "a", "a-b", "a:b")
FRACTION = 0.9


@st.composite
def node_rows(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A node projection row: a few GPUs, some reserved, some holding cached weights.

    Few distinct values, so that many nodes tie on every ranking term and only the GPU ids
    settle the choice.
    """
    # Mostly clean ids; "a:b" makes the fleet unclean, which must fall back to the scan.
    node_id = draw(st.sampled_from(NODE_IDS))
    gpus = {}
    for index in range(draw(st.integers(1, 4))):
        gpus[f"g{index}"] = {
            "gpu_id": f"g{index}", "gpu_type": "H100-SXM-80GB",
            "memory_gib": draw(st.sampled_from(MEMORIES)),
            "capabilities": list(draw(st.sampled_from(CAPABILITIES))),
            "reserved_by": draw(st.sampled_from([None, None, "r-other"])),
            "resident_models": draw(st.sampled_from([[], [], [MODELS[0]], [MODELS[1]]]))}
    return node_id, {"node_id": node_id, "rack": draw(st.sampled_from(["rack-0", "rack-1"])),
                     "link_domain": draw(st.sampled_from([node_id, "nvl-0"])),
                     "cordoned": draw(st.integers(0, 5)) == 0, "gpus": gpus}


fleets = st.lists(node_rows(), min_size=0, max_size=12)
requests = st.builds(
    PlacementRequest, replica=st.just("r1"), model_revision=st.sampled_from(MODELS),
    gpus_required=st.integers(1, 3), memory_gib_per_gpu=st.sampled_from([20.0, 36.0, 72.0]),
    required_capabilities=st.sampled_from([frozenset(), frozenset(), frozenset({"fp8"})]),
    locality=st.sampled_from([Locality.NODE, Locality.NODE, Locality.NODE, Locality.RACK,
                              Locality.LINK_DOMAIN, Locality.ANY]))


def state_of(rows: list[tuple[str, dict[str, Any]]]) -> MemoryProjections:
    state = MemoryProjections()
    for node_id, row in rows:
        state.put(NODE, node_id, row)
    return state


def outcome(decide: Any, *args: Any) -> Any:
    try:
        return to_plain(decide(*args))
    except PolicyInputError as error:
        return ("refused input", error.code, error.field)


@settings(max_examples=500, deadline=None)
@given(fleets, requests)
def test_a_placement_decided_on_the_index_equals_one_decided_by_scanning_every_gpu(
        rows: list[tuple[str, dict[str, Any]]], request: PlacementRequest) -> None:
    state = state_of(rows)
    scanned = outcome(place_replica, request, inventory(state, FRACTION))
    assert outcome(place_grouped, request, gpu_index(state, FRACTION)) == scanned


@settings(max_examples=150, deadline=None)
@given(fleets, fleets, requests)
def test_an_index_kept_current_row_by_row_equals_one_built_from_the_final_rows(
        before: list[tuple[str, dict[str, Any]]], changes: list[tuple[str, dict[str, Any]]],
        request: PlacementRequest) -> None:
    state = state_of(before)
    kept = gpu_index(state, FRACTION)  # built now, then told of each change
    for node_id, row in changes:
        outcome(place_grouped, request, kept)  # decisions in between use (and cache) its GPUs
        kept.inventory()
        state.put(NODE, node_id, row)
    fresh = GpuIndex(FRACTION)
    for node_id, row in state.items(NODE):
        fresh.apply(node_id, row)
    assert gpu_index(state, FRACTION) is kept
    assert list(kept.inventory()) == list(fresh.inventory()) == inventory(state, FRACTION)
    assert list(kept.available()) == list(fresh.available())
    assert kept.signatures() == fresh.signatures()
    assert (kept.clean, kept.gpu_count, kept.largest_free_gib()) == \
        (fresh.clean, fresh.gpu_count, fresh.largest_free_gib())
    assert outcome(place_grouped, request, kept) == outcome(place_replica, request, fresh.inventory())


def test_equal_nodes_are_settled_by_the_smallest_gpu_ids_not_the_smallest_node_id() -> None:
    # "a" < "a-b" as node ids, but "a-b:g0" < "a:g0" as GPU ids: the scan picks node a-b.
    state = state_of([(name, {"node_id": name, "rack": "r", "link_domain": name, "cordoned": False,
                              "gpus": {"g0": {"gpu_id": "g0", "memory_gib": 80.0, "capabilities": [],
                                              "reserved_by": None, "resident_models": []}}})
                      for name in ("a", "a-b")])
    request = PlacementRequest("r1", MODELS[0], 1, 30.0)
    decision = place_grouped(request, gpu_index(state, FRACTION))
    assert decision.gpu_ids == ("a-b:g0",)
    assert decision == place_replica(request, inventory(state, FRACTION))


def gpu_row(memory_gib: float, resident: bool = False) -> dict[str, Any]:
    return {"memory_gib": memory_gib, "capabilities": [], "reserved_by": None,
            "resident_models": [MODELS[0]] if resident else []}


def test_a_group_is_ranked_by_the_free_memory_of_the_gpus_it_takes_only() -> None:
    # Both nodes: one resident GPU and one spare; their best pairs both hold 40 + 40 GiB, so the
    # smaller GPU ids win (n1), although n1's untaken GPU is larger than n2's.
    state = state_of([(name, {"node_id": name, "rack": "r", "link_domain": name, "cordoned": False,
                              "gpus": {"g0": gpu_row(40.0, resident=True), "g1": gpu_row(40.0),
                                       "g2": gpu_row(other)}})
                      for name, other in (("n1", 80.0), ("n2", 40.0))])
    request = PlacementRequest("r1", MODELS[0], 2, 30.0)
    decision = place_grouped(request, gpu_index(state, FRACTION))
    assert decision.gpu_ids == ("n1:g0", "n1:g1")
    assert decision == place_replica(request, inventory(state, FRACTION))


def test_a_refusal_on_the_index_still_lists_every_gpu_and_its_first_failed_gate() -> None:
    state = state_of([("n1", {"node_id": "n1", "rack": "r", "link_domain": "n1", "cordoned": True,
                              "gpus": {"g0": {"gpu_id": "g0", "memory_gib": 80.0, "capabilities": [],
                                              "reserved_by": None, "resident_models": []}}}),
                      ("n2", {"node_id": "n2", "rack": "r", "link_domain": "n2", "cordoned": False,
                              "gpus": {"g0": {"gpu_id": "g0", "memory_gib": 80.0, "capabilities": [],
                                              "reserved_by": "r0", "resident_models": []}}})])
    decision = place_grouped(PlacementRequest("r1", MODELS[0], 1, 30.0), gpu_index(state, FRACTION))
    assert not decision.placed
    gates = {gpu["gpu"]: gpu["failed"] for gpu in decision.reasons[0].facts["gpus"]}  # type: ignore[attr-defined]
    assert gates == {"n1:g0": "gpu_cordoned", "n2:g0": "gpu_reserved"}


@pytest.mark.parametrize("usable_fraction", [0.8, 0.9])
def test_the_index_holds_every_gpu_with_the_usable_share_of_its_memory(usable_fraction: float) -> None:
    state = state_of([("n1", {"node_id": "n1", "rack": "r", "link_domain": "l", "cordoned": False,
                              "gpus": {"g1": {"gpu_id": "g1", "memory_gib": 80.0, "capabilities": ["bf16"],
                                              "reserved_by": "r0", "resident_models": ["m"]}}})])
    assert list(gpu_index(state, usable_fraction).inventory()) == [
        GPU("n1:g1", "n1", 80.0 * usable_fraction, frozenset({"bf16"}), frozenset({"m"}), "r", "l",
            False, True)]
