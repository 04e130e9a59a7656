"""Placement (spec §1.9, example 09, §2.4/§2.5 placement figures, exercise 9)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.placement import (
    GPU,
    Locality,
    PlacementDecision,
    PlacementRequest,
    place_replica,
)
from controlplane.policies.reasons import PolicyInputError, to_plain

FAST = frozenset({"bf16", "fast-collective"})
MODEL = "model@abc"
CAPSTONE_GIB = 34.752177238464355


def gpu(identifier: str, node: str, free: float, capabilities: frozenset[str] = FAST,
        resident: bool = False, **flags: object) -> GPU:
    return GPU(identifier, node, free, capabilities,
               frozenset({MODEL}) if resident else frozenset(), **flags)  # type: ignore[arg-type]


def request(count: int, memory: float, capabilities: frozenset[str] = FAST,
            locality: Locality = Locality.NODE) -> PlacementRequest:
    return PlacementRequest("replica-1", MODEL, count, memory, capabilities, locality)


def capstone_inventory(free: float = 40.0) -> list[GPU]:
    return [gpu(f"{n}{i}", f"node-{n}", free, resident=(n == "a" and i < 2))
            for n in "ab" for i in range(4)]


def refusal_facts(decision: PlacementDecision) -> dict[str, object]:
    assert not decision.placed and decision.gpu_ids == ()
    assert [r.code for r in decision.reasons] == ["no_feasible_group"]
    return dict(decision.reasons[0].facts)


def domain_failures(decision: PlacementDecision) -> dict[str, str]:
    domains = refusal_facts(decision)["domains"]
    return {d["domain"]: d["failed"] for d in domains}  # type: ignore[attr-defined]


def test_prefers_an_eligible_group_with_resident_weights() -> None:
    inventory = [gpu("a0", "node-a", 40), gpu("a1", "node-a", 40),
                 gpu("b0", "node-b", 40, resident=True), gpu("b1", "node-b", 40, resident=True)]
    decision = place_replica(request(2, 30), inventory)
    assert decision.gpu_ids == ("b0", "b1")
    assert decision.reasons[0].code == "group_selected"
    assert decision.reasons[0].facts["resident_copies"] == 2
    assert decision.remaining_gib == pytest.approx(20.0)


def test_free_memory_without_required_capability_is_not_eligible() -> None:
    inventory = [gpu("a0", "n", 80, frozenset({"bf16"})), gpu("a1", "n", 80, frozenset({"bf16"}))]
    decision = place_replica(request(2, 30), inventory)
    assert domain_failures(decision) == {"node:n": "missing_capability"}


def test_same_node_constraint_rejects_scattered_free_gpus() -> None:
    decision = place_replica(request(2, 30), [gpu("a0", "node-a", 40), gpu("b0", "node-b", 40)])
    assert domain_failures(decision) == {"node:node-a": "locality", "node:node-b": "locality"}


def test_cross_node_group_is_allowed_when_locality_is_any() -> None:
    decision = place_replica(request(2, 30, locality=Locality.ANY),
                             [gpu("a0", "node-a", 40), gpu("b0", "node-b", 40)])
    assert decision.gpu_ids == ("a0", "b0")


def test_a_link_domain_can_span_nodes_but_not_leave_its_domain() -> None:
    inventory = [GPU("a0", "node-a", 40, FAST, link_domain="nvl-1"),
                 GPU("b0", "node-b", 40, FAST, link_domain="nvl-1"),
                 GPU("c0", "node-c", 40, FAST, link_domain="nvl-2")]
    decision = place_replica(request(2, 30, locality=Locality.LINK_DOMAIN), inventory)
    assert (decision.gpu_ids, decision.locality_domain) == (("a0", "b0"), "link:nvl-1")
    assert not place_replica(request(2, 30), inventory).placed


def test_tightest_fit_preserves_larger_eligible_devices() -> None:
    inventory = [gpu("large", "n", 80, frozenset({"bf16"})), gpu("tight", "n", 40,
                                                                 frozenset({"bf16"}))]
    decision = place_replica(request(1, 30, frozenset({"bf16"})), inventory)
    assert decision.gpu_ids == ("tight",)
    assert decision.reasons[0].facts["resident_copies"] == 0
    assert decision.remaining_gib == pytest.approx(10.0)


def test_capstone_places_on_the_resident_pair_of_node_a() -> None:
    decision = place_replica(request(2, CAPSTONE_GIB), capstone_inventory())
    assert decision.gpu_ids == ("a0", "a1")
    assert decision.reasons[0].facts["resident_copies"] == 2
    assert decision.remaining_gib == pytest.approx(10.4956, abs=1e-4)


@pytest.mark.parametrize("free", [30.0, (31.939677238464355 + CAPSTONE_GIB) / 2])
def test_capstone_inventory_that_fits_weights_but_not_kv_is_refused_for_memory(
        free: float) -> None:
    decision = place_replica(request(2, CAPSTONE_GIB), capstone_inventory(free))
    assert domain_failures(decision) == {"node:node-a": "insufficient_memory",
                                         "node:node-b": "insufficient_memory"}
    assert refusal_facts(decision)["domains_by_failure"] == {"insufficient_memory": 2}


def test_refusal_names_the_first_failed_constraint_of_every_domain_and_gpu() -> None:
    inventory = [gpu("a0", "node-a", 10, cordoned=True), gpu("a1", "node-a", 40, reserved=True),
                 gpu("b0", "node-b", 40, frozenset({"bf16"})), gpu("b1", "node-b", 28),
                 gpu("c0", "node-c", 40),
                 gpu("d0", "node-d", 40, reserved=True), gpu("d1", "node-d", 40)]
    decision = place_replica(request(2, 30), inventory)
    assert domain_failures(decision) == {"node:node-a": "gpu_cordoned",
                                         "node:node-b": "missing_capability",
                                         "node:node-c": "locality",
                                         "node:node-d": "gpu_reserved"}
    per_gpu = {g["gpu"]: g["failed"] for g in refusal_facts(decision)["gpus"]}  # type: ignore
    assert per_gpu == {"a0": "gpu_cordoned", "a1": "gpu_reserved", "b0": "missing_capability",
                       "b1": "insufficient_memory", "c0": "eligible", "d0": "gpu_reserved",
                       "d1": "eligible"}
    json.dumps(to_plain(decision), allow_nan=False)


def test_too_small_an_inventory_fails_on_size_when_any_gpu_may_join() -> None:
    decision = place_replica(request(3, 30, locality=Locality.ANY), capstone_inventory()[:2])
    assert domain_failures(decision) == {"any": "not_enough_gpus"}


@pytest.mark.parametrize(("change", "field", "code"), [
    (lambda r, i: (dataclasses.replace(r, replica=" "), i), "replica",
     "replica_and_revision_required"),
    (lambda r, i: (dataclasses.replace(r, gpus_required=0), i), "gpus_required",
     "gpu_count_not_positive"),
    (lambda r, i: (dataclasses.replace(r, memory_gib_per_gpu=math.nan), i),
     "memory_gib_per_gpu", "memory_requirement_not_positive"),
    (lambda r, i: (r, [*i, i[0]]), "inventory.identifier", "duplicate_gpu_id"),
    (lambda r, i: (r, [dataclasses.replace(i[0], free_memory_gib=-1.0)]),
     "inventory.free_memory_gib", "free_memory_invalid"),
    (lambda r, i: (r, [dataclasses.replace(i[0], free_memory_gib=math.inf)]),
     "inventory.free_memory_gib", "free_memory_invalid"),
    # Spec 1.9's order: duplicate ids (check 3) before negative free memory (check 4), wherever
    # in the inventory each is.
    (lambda r, i: (r, [dataclasses.replace(i[1], free_memory_gib=-1.0), i[0], i[0]]),
     "inventory.identifier", "duplicate_gpu_id"),
])
def test_invalid_inputs_are_refused_naming_the_field(
        change: Callable[[PlacementRequest, list[GPU]], tuple[PlacementRequest, list[GPU]]],
        field: str, code: str) -> None:
    bad_request, bad_inventory = change(request(2, 30), capstone_inventory())
    with pytest.raises(PolicyInputError) as error:
        place_replica(bad_request, bad_inventory)
    assert (error.value.field, error.value.code) == (field, code)


# --- Exercise 9: fragmentation ------------------------------------------------------------


def most_free_memory_first(need: PlacementRequest, inventory: Sequence[GPU]) -> tuple[str, ...]:
    """The naive baseline: the same-node group with the most free memory."""
    groups = []
    for node in {g.node for g in inventory}:
        usable = sorted((g for g in inventory if g.node == node and not g.reserved
                         and g.free_memory_gib >= need.memory_gib_per_gpu),
                        key=lambda g: (-g.free_memory_gib, g.identifier))[:need.gpus_required]
        if len(usable) == need.gpus_required:
            groups.append((-sum(g.free_memory_gib for g in usable),
                           tuple(sorted(g.identifier for g in usable))))
    return min(groups)[1] if groups else ()


def tightest_memory_fit(need: PlacementRequest, inventory: Sequence[GPU]) -> tuple[str, ...]:
    """The reference rule without the domain term: least remaining memory, then smallest ids."""
    groups = []
    for node in {g.node for g in inventory}:
        usable = [g for g in inventory if g.node == node and not g.reserved
                  and g.free_memory_gib >= need.memory_gib_per_gpu]
        for combo in combinations(usable, need.gpus_required):
            groups.append((sum(g.free_memory_gib for g in combo),
                           tuple(sorted(g.identifier for g in combo))))
    return min(groups)[1] if groups else ()


def run_sequence(policy: Callable[[PlacementRequest, Sequence[GPU]], tuple[str, ...]],
                 inventory: list[GPU]) -> list[tuple[str, ...]]:
    """Plan each replica, then allocate it (mark its GPUs reserved) before planning the next."""
    placed = []
    for count in (1, 2, 4):
        chosen = policy(request(count, 40), inventory)
        placed.append(chosen)
        inventory = [dataclasses.replace(g, reserved=True) if g.identifier in chosen else g
                     for g in inventory]
    return placed


def ours(need: PlacementRequest, inventory: Sequence[GPU]) -> tuple[str, ...]:
    decision = place_replica(need, inventory)
    for g in inventory:
        if g.identifier in decision.gpu_ids:
            assert g.free_memory_gib >= need.memory_gib_per_gpu and not g.reserved
    return decision.gpu_ids


def fragmenting_inventory(node_a_gib: float, node_b_gib: float) -> list[GPU]:
    return ([gpu(f"a{i}", "node-a", node_a_gib) for i in range(4)]
            + [gpu(f"b{i}", "node-b", node_b_gib, reserved=(i == 3)) for i in range(4)])


def test_most_free_memory_first_strands_the_four_gpu_group_that_we_keep() -> None:
    inventory = fragmenting_inventory(80, 48)
    naive = run_sequence(most_free_memory_first, inventory)
    assert naive[:2] == [("a0",), ("a1", "a2")]
    assert naive[2] == ()  # four GPUs stay free in total (a3, b0-b2), but on no single node
    assert run_sequence(ours, inventory) == [("b0",), ("b1", "b2"), ("a0", "a1", "a2", "a3")]


def test_domain_best_fit_keeps_the_intact_node_where_memory_fit_alone_breaks_it() -> None:
    inventory = fragmenting_inventory(80, 80)
    assert run_sequence(tightest_memory_fit, inventory)[2] == ()
    assert run_sequence(ours, inventory)[2] == ("a0", "a1", "a2", "a3")


# --- Equality with exhaustive search -------------------------------------------------------


def reference_domain(g: GPU, locality: Locality) -> str:
    return {Locality.NODE: "n" + g.node, Locality.LINK_DOMAIN: "l" + (g.link_domain or g.node),
            Locality.RACK: "r" + (g.rack or g.node), Locality.ANY: ""}[locality]


def exhaustive(need: PlacementRequest, inventory: Sequence[GPU]) -> tuple[str, ...]:
    eligible = [g for g in inventory if not g.cordoned and not g.reserved
                and need.required_capabilities <= g.capabilities
                and g.free_memory_gib >= need.memory_gib_per_gpu]
    best = None
    for combo in combinations(eligible, need.gpus_required):
        domains = {reference_domain(g, need.locality) for g in combo}
        if len(domains) != 1:
            continue
        (domain,) = domains
        spare = sum(reference_domain(g, need.locality) == domain for g in eligible)
        key = (-sum(need.model_revision in g.resident_models for g in combo),
               spare - need.gpus_required,
               sum((Fraction(g.free_memory_gib) for g in combo), Fraction(0)),
               tuple(sorted(g.identifier for g in combo)))
        best = key if best is None or key < best else best
    return best[3] if best else ()


BOTH = frozenset({"bf16", "fp8"})
# Biased towards eligible GPUs so that several domains compete and the tie-breaks are exercised.
gpus_strategy = st.lists(
    st.builds(GPU, identifier=st.just(""), node=st.sampled_from(["n0", "n1", "n2"]),
              free_memory_gib=st.one_of(st.sampled_from([0.0, 30.0, 40.0, 40.0, 80.0]),
                                        st.floats(0, 100)),
              capabilities=st.sampled_from([BOTH, BOTH, BOTH, frozenset({"bf16"}), frozenset()]),
              resident_models=st.frozensets(st.just(MODEL)),
              rack=st.sampled_from(["", "r0", "r1"]), link_domain=st.sampled_from(["", "l0"]),
              cordoned=st.sampled_from([False] * 7 + [True]),
              reserved=st.sampled_from([False] * 7 + [True])),
    max_size=12)


@settings(max_examples=200, deadline=None)
@given(gpus=gpus_strategy, order=st.randoms(use_true_random=False),
       count=st.integers(1, 4), memory=st.sampled_from([10.0, 30.0, 40.0, 55.5]),
       capabilities=st.sampled_from([frozenset(), frozenset({"bf16"}), BOTH]),
       locality=st.sampled_from(list(Locality)))
def test_choice_equals_exhaustive_search_and_never_violates_a_constraint(
        gpus: list[GPU], order: object, count: int, memory: float,
        capabilities: frozenset[str], locality: Locality) -> None:
    inventory = [dataclasses.replace(g, identifier=f"g{i:02d}") for i, g in enumerate(gpus)]
    order.shuffle(inventory)  # type: ignore[attr-defined]
    need = request(count, memory, capabilities, locality)
    decision = place_replica(need, inventory)
    assert decision.gpu_ids == exhaustive(need, inventory)
    assert decision.placed == bool(decision.gpu_ids)
    chosen = [g for g in inventory if g.identifier in decision.gpu_ids]
    assert all(g.free_memory_gib >= memory and capabilities <= g.capabilities
               and not g.cordoned and not g.reserved for g in chosen)
    assert len({reference_domain(g, locality) for g in chosen}) <= 1
    assert place_replica(need, list(reversed(inventory))) == decision
    json.dumps(to_plain(decision), allow_nan=False)
