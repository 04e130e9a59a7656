"""The placement GPU index: every GPU of the node projection, grouped for `place_grouped`.

A table view of the `node` projection (see `events.projections.table_view`): built once from
the node rows, then updated node by node as reservations, releases and cordons rewrite them, so
it always equals a fresh build from the rows. It is derived from the projection, not stored:
replay and re-derivation build it from the same rows and get the same GPUs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence, Set
from typing import Any

from controlplane.policies.placement import GPU
from controlplane.policies.placement_grouped import Signature, prefix_of
from controlplane.state.fleet import NODE
from events.projections import StateView, table_view

GPU_ID_SEPARATOR = ":"


def node_gpus(node_id: str, node: dict[str, Any], usable_fraction: float) -> tuple[GPU, ...]:
    """A node row's GPUs as the placement policy sees them, in GPU id order."""
    return tuple(GPU(
        identifier=f"{node_id}{GPU_ID_SEPARATOR}{gpu_id}", node=node_id,
        free_memory_gib=gpu["memory_gib"] * usable_fraction,
        capabilities=frozenset(gpu["capabilities"]),
        resident_models=frozenset(gpu["resident_models"]), rack=node["rack"],
        link_domain=node["link_domain"], cordoned=node["cordoned"],
        reserved=gpu["reserved_by"] is not None)
        for gpu_id, gpu in sorted(node["gpus"].items()))


def _clean(node_id: str, gpus: Sequence[GPU]) -> bool:
    return (bool(node_id) and GPU_ID_SEPARATOR not in node_id
            and all(0 <= gpu.free_memory_gib < math.inf for gpu in gpus))


class GpuIndex:
    """Every GPU under one usable fraction, with available GPUs grouped by node signature."""

    def __init__(self, usable_fraction: float) -> None:
        self.usable_fraction = usable_fraction
        self._gpus: dict[str, tuple[GPU, ...]] = {}
        self._available: dict[str, tuple[GPU, ...]] = {}
        self._signatures: dict[str, Signature] = {}
        self._groups: dict[Signature, set[str]] = {}
        self._by_identifier: dict[str, GPU] = {}
        self._free_values: Counter[float] = Counter()
        self._unclean: set[str] = set()
        self._inventory: list[GPU] | None = None
        self._available_list: list[GPU] | None = None

    def apply(self, key: str, value: dict[str, Any] | None) -> None:
        """Node `key`'s row changed (None: removed): replace its GPUs everywhere."""
        self._remove(key)
        if value is None:
            return
        gpus = node_gpus(key, value, self.usable_fraction)
        self._gpus[key] = gpus
        self._by_identifier.update((gpu.identifier, gpu) for gpu in gpus)
        self._free_values.update(gpu.free_memory_gib for gpu in gpus)
        if not _clean(key, gpus):
            self._unclean.add(key)
        available = tuple(g for g in gpus if not g.cordoned and not g.reserved)
        if available:
            prefix = prefix_of(key)
            signature = frozenset(Counter(
                (g.capabilities, g.free_memory_gib, g.resident_models) for g in available).items())
            self._available[prefix] = available
            self._signatures[prefix] = signature
            self._groups.setdefault(signature, set()).add(prefix)

    def _remove(self, key: str) -> None:
        self._inventory = self._available_list = None
        gpus = self._gpus.pop(key, ())
        for gpu in gpus:
            self._by_identifier.pop(gpu.identifier, None)
        self._free_values.subtract(gpu.free_memory_gib for gpu in gpus)
        self._free_values += Counter()  # drop the values no GPU has any more
        self._unclean.discard(key)
        prefix = prefix_of(key)
        self._available.pop(prefix, None)
        signature = self._signatures.pop(prefix, None)
        if signature is not None:
            members = self._groups[signature]
            members.discard(prefix)
            if not members:
                del self._groups[signature]

    @property
    def clean(self) -> bool:
        return not self._unclean

    @property
    def gpu_count(self) -> int:
        return sum(self._free_values.values())

    def largest_free_gib(self) -> float | None:
        """The most free memory of any GPU, available or not; None for an empty fleet."""
        return max(self._free_values) if self._free_values else None

    def chosen(self, identifiers: Sequence[str]) -> list[GPU]:
        """The GPUs with these identifiers (on a fleet that is not clean, found by a scan)."""
        if self.clean:
            return [self._by_identifier[identifier] for identifier in identifiers]
        wanted = set(identifiers)
        return [gpu for gpu in self.inventory() if gpu.identifier in wanted]

    def inventory(self) -> Sequence[GPU]:
        """Every GPU, by node id then GPU id (the order the node projection lists them)."""
        if self._inventory is None:
            self._inventory = [gpu for node in sorted(self._gpus) for gpu in self._gpus[node]]
        return self._inventory

    def available(self) -> Sequence[GPU]:
        if self._available_list is None:
            self._available_list = [gpu for prefix in sorted(self._available)
                                    for gpu in self._available[prefix]]
        return self._available_list

    def signatures(self) -> Mapping[Signature, Set[str]]:
        return self._groups

    def available_on(self, prefix: str) -> Sequence[GPU]:
        return self._available[prefix]


def gpu_index(state: StateView, usable_fraction: float) -> GpuIndex:
    """The fleet's GPU index under `usable_fraction`, current with `state`."""
    return table_view(state, NODE, ("gpu_index", usable_fraction), lambda: GpuIndex(usable_fraction))
