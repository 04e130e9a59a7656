"""Placement over a fleet whose available GPUs are grouped by node signature.

`place_grouped(request, fleet)` returns exactly what `place_replica(request, fleet.inventory())`
returns, but for the common node-local request it ranks a few signatures instead of every GPU.

Why the decision is the same. A cordoned or reserved GPU is never eligible, so only available
GPUs can be chosen. A node's signature is the multiset of its available GPUs' shapes (required
capabilities, free memory, resident models); every ranking term of `place_replica` for a node
domain (resident copies, spare eligible GPUs, the exact free memory of its best group) depends
on the signature alone, so nodes sharing one rank together. Among nodes equal on all of those
terms, `place_replica` takes the group with the smallest sorted GPU identifiers; on a clean
fleet every identifier of a node starts with its prefix `node:` and no prefix begins another, so
that is the node with the smallest prefix. Everything else (another locality, a fleet that is
not clean, a refusal) is `place_replica` itself: on the available GPUs when that places (the
eligible GPUs are the same), on the whole inventory otherwise, so a refusal still lists every
GPU and the first constraint it failed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set
from fractions import Fraction
from typing import Protocol

from controlplane.policies.placement import (
    GPU,
    Locality,
    PlacementDecision,
    PlacementRequest,
    best_in_domain,
    first_failed_gate,
    place_replica,
    selection,
    validate_request,
)

Shape = tuple[frozenset[str], float, frozenset[str]]
"""An available GPU as a ranking sees it: capabilities, free memory (GiB), resident models."""
Signature = frozenset[tuple[Shape, int]]
"""A node's available GPUs: each shape with how many GPUs of the node have it."""


def prefix_of(node: str) -> str:
    """How every GPU identifier of `node` begins on a clean fleet."""
    return f"{node}:"


class GroupedInventory(Protocol):
    """A fleet's GPUs, with its available (uncordoned, unreserved) ones grouped by signature.

    `clean` promises: every node id is non-empty and holds no ':', every GPU identifier is its
    node's prefix followed by a GPU id unique on that node, and every free memory is finite and
    non-negative (so `inventory()` passes `place_replica`'s validation).
    """

    @property
    def clean(self) -> bool: ...

    def inventory(self) -> Sequence[GPU]: ...

    def available(self) -> Sequence[GPU]: ...

    def signatures(self) -> Mapping[Signature, Set[str]]:
        """Each signature with the prefixes of the nodes that have it (nodes with none omitted)."""
        ...

    def available_on(self, prefix: str) -> Sequence[GPU]: ...


def place_grouped(request: PlacementRequest, fleet: GroupedInventory) -> PlacementDecision:
    """The decision `place_replica(request, fleet.inventory())` makes, found from signatures."""
    if request.locality is not Locality.NODE or not fleet.clean:
        return _scanned(request, fleet)
    validate_request(request)
    count, need = request.gpus_required, request.memory_gib_per_gpu
    capabilities, revision = request.required_capabilities, request.model_revision
    ranked: list[tuple[tuple[int, int], list[float], Set[str]]] = []
    feasible = 0
    for signature, prefixes in fleet.signatures().items():
        resident_frees: list[float] = []
        other_frees: list[float] = []
        for (gpu_capabilities, free, resident_models), gpus in signature:
            if capabilities <= gpu_capabilities and free >= need:
                (resident_frees if revision in resident_models else other_frees).extend([free] * gpus)
        eligible = len(resident_frees) + len(other_frees)
        if eligible < count:
            continue
        feasible += len(prefixes)
        resident = min(count, len(resident_frees))
        # The free memories of the node's best group (`best_in_domain`), whatever its GPU ids.
        frees = sorted(resident_frees)[:count] + sorted(other_frees)[:count - resident]
        ranked.append(((-resident, eligible - count), frees, prefixes))
    if not ranked:
        return place_replica(request, fleet.inventory())
    best_key = min(key for key, _, _ in ranked)
    contenders = [(frees, prefixes) for key, frees, prefixes in ranked if key == best_key]
    rounded = [math.fsum(frees) for frees, _ in contenders]
    # As in `place_replica`: the rounded sum orders exact sums except on ties, settled exactly.
    least = min(rounded)
    tied = [entry for entry, total in zip(contenders, rounded, strict=True) if total == least]
    if len(tied) > 1:
        exact = [sum((Fraction(free) for free in frees), Fraction(0)) for frees, _ in tied]
        least_exact = min(exact)
        tied = [entry for entry, total in zip(tied, exact, strict=True) if total == least_exact]
    prefix = min(min(prefixes) for _, prefixes in tied)
    eligible_gpus = [g for g in fleet.available_on(prefix) if first_failed_gate(g, request) is None]
    group = best_in_domain(eligible_gpus, request)
    return selection(request, f"node:{group[0].node}", group, best_key[1], feasible)


def _scanned(request: PlacementRequest, fleet: GroupedInventory) -> PlacementDecision:
    if fleet.clean:
        decision = place_replica(request, fleet.available())
        if decision.placed:
            return decision
    return place_replica(request, fleet.inventory())
