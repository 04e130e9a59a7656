"""Fleet placement for a plan: place replicas one after another, each on GPUs none before took.

The reference places a single replica; `all-replicas` places every replica the capacity plan
requires, marking each chosen GPU reserved in the inventory the next placement sees, so no GPU
is ever reserved twice. Placement stops at the first refusal: the inventory only shrinks, so an
identical later request could not succeed either. A layout the memory plan does not cover
requests nothing at all (spec §9 bug 7: never a "convenient" fallback request shape).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from controlplane.policies.fleet_plan_scenario import PlacementMode
from controlplane.policies.parallelism import ClusterTopology
from controlplane.policies.placement import (
    GPU,
    Locality,
    PlacementDecision,
    PlacementRequest,
    place_replica,
)
from controlplane.policies.reasons import Reason, require


@dataclass(frozen=True)
class ReplicaPlacement:
    replica: str
    decision: PlacementDecision


@dataclass(frozen=True)
class FleetPlacement:
    """`placed` only when every requested replica was placed; `replicas` lists each attempt."""

    placed: bool
    mode: PlacementMode
    requested_replicas: int
    placed_replicas: int
    reserved_gpu_ids: tuple[str, ...]
    replicas: tuple[ReplicaPlacement, ...]
    reasons: tuple[Reason, ...]


def reserve_gpus(inventory: Sequence[GPU], gpu_ids: Sequence[str]) -> tuple[GPU, ...]:
    """The inventory with `gpu_ids` marked reserved; reserving an unknown or reserved GPU fails."""
    wanted = set(gpu_ids)
    available = {gpu.identifier for gpu in inventory if not gpu.reserved}
    if not wanted <= available:
        raise ValueError(f"cannot reserve {sorted(wanted - available)}: unknown or reserved")
    return tuple(replace(gpu, reserved=True) if gpu.identifier in wanted else gpu
                 for gpu in inventory)


def place_fleet(*, model_revision: str, gpus_per_replica: int, memory_gib_per_gpu: float,
                required_capabilities: frozenset[str], inventory: Sequence[GPU],
                requested_replicas: int, mode: PlacementMode) -> FleetPlacement:
    """Place `requested_replicas` node-local replicas in order, never reusing a GPU."""
    require(requested_replicas > 0, "requested_replicas_not_positive", "requested_replicas",
            "at least one replica must be requested")
    current = tuple(inventory)
    attempts: list[ReplicaPlacement] = []
    reserved: list[str] = []
    for number in range(1, requested_replicas + 1):
        request = PlacementRequest(f"replica-{number}", model_revision, gpus_per_replica,
                                   memory_gib_per_gpu, required_capabilities, Locality.NODE)
        decision = place_replica(request, current)
        attempts.append(ReplicaPlacement(request.replica, decision))
        if not decision.placed:
            break
        current = reserve_gpus(current, decision.gpu_ids)
        reserved.extend(decision.gpu_ids)
    placed = sum(attempt.decision.placed for attempt in attempts)
    facts = {"placement_mode": mode.value, "requested_replicas": requested_replicas,
             "placed_replicas": placed, "gpus_per_replica": gpus_per_replica,
             "memory_gib_per_gpu": memory_gib_per_gpu,
             "replica_gpu_ids": {a.replica: list(a.decision.gpu_ids) for a in attempts}}
    last = attempts[-1]
    if last.decision.placed:
        summary = Reason("all_replicas_placed",
                         f"placed {placed}/{requested_replicas} replicas on {len(reserved)} "
                         "GPUs, none shared", facts)
        detail = tuple(reason for attempt in attempts for reason in attempt.decision.reasons)
    else:
        summary = Reason("replica_placement_refused",
                         f"{last.replica} found no GPU group after {placed}/"
                         f"{requested_replicas} replicas were placed",
                         {**facts, "refused_replica": last.replica})
        detail = last.decision.reasons
    return FleetPlacement(placed == requested_replicas, mode, requested_replicas, placed,
                          tuple(reserved), tuple(attempts), (summary, *detail))


def placement_not_requested(*, mode: PlacementMode, requested_replicas: int,
                            layout_facts: dict[str, object]) -> FleetPlacement:
    """The placement outcome when the layout differs from the memory plan: nothing requested."""
    reason = Reason("placement_not_requested_layout_mismatch",
                    "no layout matches the memory plan, so no GPU group was requested",
                    {"placement_mode": mode.value, "requested_replicas": requested_replicas,
                     **layout_facts})
    return FleetPlacement(False, mode, requested_replicas, 0, (), (), (reason,))


def inventory_shape_reason(topology: ClusterTopology, inventory: Sequence[GPU]) -> Reason | None:
    """Why a refused placement may not be the layout's fault: the layout was sized for the
    scenario's declared topology, and the inventory has another shape (a node count, or GPUs on
    some node, that differ). None when the shapes agree."""
    per_node: dict[str, int] = {}
    for gpu in inventory:
        per_node[gpu.node] = per_node.get(gpu.node, 0) + 1
    sizes = sorted(set(per_node.values()))
    if len(per_node) == topology.nodes and sizes == [topology.gpus_per_node]:
        return None
    shown = "no" if not sizes else str(sizes[0]) if len(sizes) == 1 \
        else f"{sizes[0]} to {sizes[-1]}"
    return Reason("inventory_differs_from_topology",
                  f"the layout was sized for {topology.nodes} nodes of {topology.gpus_per_node} "
                  f"GPUs, but the inventory has {len(per_node)} nodes of {shown} "
                  f"GPU{'' if sizes == [1] else 's'}",
                  {"topology_nodes": topology.nodes,
                   "topology_gpus_per_node": topology.gpus_per_node,
                   "inventory_nodes": len(per_node), "inventory_gpus_per_node": sizes})
