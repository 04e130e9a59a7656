"""Placement: choose the concrete GPU group for one replica, or say why every candidate failed.

A GPU is eligible when it is not cordoned, not reserved, has every required capability and has
at least the per-GPU memory free (inclusive); gates are checked in that fixed order. A group is
`gpus_required` eligible GPUs inside one locality domain (a node, a link domain, a rack, or the
whole inventory). Among feasible groups the best one minimises, lexicographically:

1. fewer resident copies of the model revision (negated: most resident copies win);
2. eligible GPUs left over in the group's domain (fragmentation-aware best fit: fill the most
   used domain and keep large intact domains for later, larger replicas);
3. the exact sum of free memory on the group (tightest fit, so big devices stay free);
4. the sorted GPU ids (lexicographically smallest).

Terms 1, 2 and 4 are exact; term 3 compares sums exactly (rational arithmetic on ties of the
rounded sum), so the result equals exhaustive search over every combination, in O(n log n).
The function reserves nothing: the caller re-checks the inventory and reserves atomically.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

from controlplane.policies.reasons import Reason, require

GATES = ("gpu_cordoned", "gpu_reserved", "missing_capability", "insufficient_memory")


class Locality(StrEnum):
    NODE = "node"
    LINK_DOMAIN = "link_domain"
    RACK = "rack"
    ANY = "any"


@dataclass(frozen=True)
class GPU:
    """One device. A blank rack or link domain means the node alone forms it."""

    identifier: str
    node: str
    free_memory_gib: float
    capabilities: frozenset[str] = frozenset()
    resident_models: frozenset[str] = frozenset()
    rack: str = ""
    link_domain: str = ""
    cordoned: bool = False
    reserved: bool = False


@dataclass(frozen=True)
class PlacementRequest:
    replica: str
    model_revision: str
    gpus_required: int
    memory_gib_per_gpu: float
    required_capabilities: frozenset[str] = frozenset()
    locality: Locality = Locality.NODE


@dataclass(frozen=True)
class PlacementDecision:
    placed: bool
    gpu_ids: tuple[str, ...]
    locality_domain: str | None
    reasons: tuple[Reason, ...]
    remaining_gib: float | None = field(default=None)


def domain_of(gpu: GPU, locality: Locality) -> str:
    """The locality domain a GPU belongs to; GPUs in one group must share it."""
    if locality is Locality.NODE:
        return f"node:{gpu.node}"
    if locality is Locality.LINK_DOMAIN:
        return f"link:{gpu.link_domain}" if gpu.link_domain else f"node:{gpu.node}"
    if locality is Locality.RACK:
        return f"rack:{gpu.rack}" if gpu.rack else f"node:{gpu.node}"
    return "any"


def first_failed_gate(gpu: GPU, request: PlacementRequest) -> str | None:
    """The first per-GPU gate this GPU fails, in the fixed order of `GATES`, or None."""
    if gpu.cordoned:
        return "gpu_cordoned"
    if gpu.reserved:
        return "gpu_reserved"
    if not request.required_capabilities <= gpu.capabilities:
        return "missing_capability"
    if gpu.free_memory_gib < request.memory_gib_per_gpu:
        return "insufficient_memory"
    return None


def validate_request(request: PlacementRequest) -> None:
    """PolicyInputError unless the request names a replica and revision and asks for GPUs."""
    require(bool(request.replica.strip()) and bool(request.model_revision.strip()),
            "replica_and_revision_required", "replica", "replica and model revision are required")
    require(isinstance(request.gpus_required, int) and not isinstance(request.gpus_required, bool)
            and request.gpus_required > 0,
            "gpu_count_not_positive", "gpus_required", "gpus_required must be a positive integer")
    need = request.memory_gib_per_gpu
    require(math.isfinite(need) and need > 0, "memory_requirement_not_positive",
            "memory_gib_per_gpu", "the per-GPU memory requirement must be positive and finite")


def validate_inventory(inventory: Sequence[GPU]) -> None:
    """Refuse an inventory placement cannot trust, in the spec's order (1.9): every GPU
    identified and on a node with no identifier twice, then every free memory finite and
    non-negative."""
    seen: set[str] = set()
    for gpu in inventory:
        require(bool(gpu.identifier) and bool(gpu.node), "gpu_identity_required",
                "inventory.identifier", "every GPU needs an identifier and a node")
        require(gpu.identifier not in seen, "duplicate_gpu_id", "inventory.identifier",
                f"GPU identifier {gpu.identifier!r} appears twice")
        seen.add(gpu.identifier)
    for gpu in inventory:
        require(0 <= gpu.free_memory_gib < math.inf, "free_memory_invalid",
                "inventory.free_memory_gib",
                f"GPU {gpu.identifier!r} free memory must be finite and non-negative")


def best_in_domain(eligible: list[GPU], request: PlacementRequest) -> list[GPU]:
    """Most resident copies, then least free memory, then smallest ids: the domain's best group."""
    count = request.gpus_required
    resident = sorted((g for g in eligible if request.model_revision in g.resident_models),
                      key=lambda g: (g.free_memory_gib, g.identifier))
    others = sorted((g for g in eligible if request.model_revision not in g.resident_models),
                    key=lambda g: (g.free_memory_gib, g.identifier))
    chosen = resident[:count]
    return chosen + others[:count - len(chosen)]


def exact_free(group: list[GPU]) -> Fraction:
    """The group's free memory summed exactly (the tightest-fit term, without rounding)."""
    return sum((Fraction(g.free_memory_gib) for g in group), Fraction(0))


def place_replica(request: PlacementRequest, inventory: Sequence[GPU]) -> PlacementDecision:
    """Pick the best feasible group (equal to exhaustive search), or explain every refusal."""
    validate_request(request)
    count = request.gpus_required
    domains: dict[str, list[GPU]] = {}
    need, capabilities = request.memory_gib_per_gpu, request.required_capabilities
    by_node = request.locality is Locality.NODE
    valid = True
    # The hot path: one pass that screens the inventory and applies the gates of
    # `first_failed_gate`; the precise validation runs only when something looks wrong.
    for gpu in inventory:
        free = gpu.free_memory_gib
        if not 0 <= free < math.inf:
            valid = False
        elif (not gpu.cordoned and not gpu.reserved and capabilities <= gpu.capabilities
                and free >= need):
            key = gpu.node if by_node else domain_of(gpu, request.locality)
            domains.setdefault(key, []).append(gpu)
    identifiers = {gpu.identifier for gpu in inventory}
    if (not valid or len(identifiers) != len(inventory) or "" in identifiers
            or not all(gpu.node for gpu in inventory)):
        validate_inventory(inventory)
    if by_node:
        domains = {f"node:{node}": gpus for node, gpus in domains.items()}
    feasible = {name: gpus for name, gpus in domains.items() if len(gpus) >= count}
    if not feasible:
        return _refusal(request, inventory)
    # Only the domains tied on the two exact integer terms can win, so only they are sorted.
    def coarse(name: str) -> tuple[int, int]:
        gpus = feasible[name]
        resident = sum(request.model_revision in g.resident_models for g in gpus)
        return (-min(count, resident), len(gpus) - count)

    keys = {name: coarse(name) for name in feasible}
    best_key = min(keys.values())
    contenders = [(name, best_in_domain(feasible[name], request))
                  for name in sorted(feasible) if keys[name] == best_key]
    rounded = {name: math.fsum(g.free_memory_gib for g in group) for name, group in contenders}
    least = min(rounded.values())
    # A correctly rounded sum orders exact sums except on ties, which are settled exactly.
    tied = [(name, group) for name, group in contenders if rounded[name] == least]
    exact = {name: exact_free(group) for name, group in tied}
    least_exact = min(exact.values())
    name, group = min(((n, g) for n, g in tied if exact[n] == least_exact),
                      key=lambda item: sorted(g.identifier for g in item[1]))
    return selection(request, name, group, best_key[1], len(feasible))


def selection(request: PlacementRequest, domain: str, group: list[GPU], domain_spare_gpus: int,
              feasible_domains: int) -> PlacementDecision:
    """The decision to place on `group`, the best group of `domain`, with its deciding facts."""
    count = request.gpus_required
    gpu_ids = tuple(sorted(g.identifier for g in group))
    resident = sum(request.model_revision in g.resident_models for g in group)
    remaining = math.fsum(g.free_memory_gib - request.memory_gib_per_gpu for g in group)
    reason = Reason(
        "group_selected",
        f"selected {request.locality.value}-local group with {resident}/{count} resident model "
        f"copies and {remaining:.2f} GiB remaining",
        {"gpu_ids": list(gpu_ids), "locality": request.locality.value, "locality_domain": domain,
         "resident_copies": resident, "gpus_required": count, "remaining_gib": remaining,
         "domain_spare_gpus": domain_spare_gpus, "feasible_domains": feasible_domains,
         "memory_gib_per_gpu": request.memory_gib_per_gpu})
    return PlacementDecision(True, gpu_ids, domain, (reason,), remaining)


def _refusal(request: PlacementRequest, inventory: Sequence[GPU]) -> PlacementDecision:
    """Every domain and GPU considered, each with the first constraint it failed."""
    count = request.gpus_required
    per_domain: dict[str, list[GPU]] = {}
    for gpu in inventory:
        per_domain.setdefault(domain_of(gpu, request.locality), []).append(gpu)
    gpus: list[dict[str, object]] = []
    domain_facts: list[dict[str, object]] = []
    failures: dict[str, int] = {}
    for name in sorted(per_domain):
        members = sorted(per_domain[name], key=lambda g: g.identifier)
        gates = [first_failed_gate(g, request) for g in members]
        gpus += [{"gpu": g.identifier, "domain": name, "failed": gate or "eligible",
                  "free_memory_gib": g.free_memory_gib}
                 for g, gate in zip(members, gates, strict=True)]
        # A domain fails at the first gate after which it can no longer supply the group; a
        # domain too small to begin with fails on locality (or on size when any GPU may join).
        failed = "not_enough_gpus" if request.locality is Locality.ANY else "locality"
        if len(members) >= count:
            left = len(members)
            for gate in GATES:
                left -= gates.count(gate)
                if left < count:
                    failed = gate
                    break
        failures[failed] = failures.get(failed, 0) + 1
        domain_facts.append({"domain": name, "gpus": len(members),
                             "eligible_gpus": gates.count(None), "failed": failed})
    reason = Reason(
        "no_feasible_group",
        "no GPU group satisfies the cordon, reservation, capability, memory and locality gates",
        {"gpus_required": count, "memory_gib_per_gpu": request.memory_gib_per_gpu,
         "locality": request.locality.value,
         "required_capabilities": sorted(request.required_capabilities),
         "domains_by_failure": failures, "domains": domain_facts, "gpus": gpus})
    return PlacementDecision(False, (), None, (reason,), None)
