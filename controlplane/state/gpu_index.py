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


# A GPU as the index keeps it: id on its node, free GiB, capabilities, resident models, reserved.
GpuFacts = tuple[str, float, frozenset[str], frozenset[str], bool]
# A node as the index keeps it: rack, link domain, cordoned, its GPUs in id order.
NodeFacts = tuple[str, str, bool, tuple[GpuFacts, ...]]


class GpuIndex:
    """Every GPU under one usable fraction, with available GPUs grouped by node signature.

    A node's GPUs become `GPU` objects only when a decision needs them (the chosen node, a
    refusal, another locality), so keeping the index current costs little per reservation.
    """

    def __init__(self, usable_fraction: float) -> None:
        self.usable_fraction = usable_fraction
        self._nodes: dict[str, NodeFacts] = {}
        self._built: dict[str, tuple[GPU, ...]] = {}
        self._groups: dict[Signature, set[str]] = {}
        self._signatures: dict[str, Signature] = {}
        self._free_values: Counter[float] = Counter()
        self._unclean: set[str] = set()
        self._sets: dict[tuple[str, ...], frozenset[str]] = {}
        self._inventory: list[GPU] | None = None

    def _frozen(self, values: list[str]) -> frozenset[str]:
        key = tuple(values)
        found = self._sets.get(key)
        if found is None:
            found = self._sets[key] = frozenset(key)
        return found

    def apply(self, key: str, value: dict[str, Any] | None) -> None:
        """Node `key`'s row changed (None: removed): replace its GPUs everywhere."""
        self._inventory = None
        self._remove(key)
        if value is None:
            return
        fraction = self.usable_fraction
        gpus = tuple((gpu_id, gpu["memory_gib"] * fraction, self._frozen(gpu["capabilities"]),
                      self._frozen(gpu["resident_models"]), gpu["reserved_by"] is not None)
                     for gpu_id, gpu in sorted(value["gpus"].items()))
        self._nodes[key] = (value["rack"], value["link_domain"], value["cordoned"], gpus)
        for _, free, _, _, _ in gpus:
            self._free_values[free] += 1
        if not key or GPU_ID_SEPARATOR in key or not all(0 <= g[1] < math.inf for g in gpus):
            self._unclean.add(key)
        if value["cordoned"]:
            return
        shapes = Counter((capabilities, free, resident)
                         for _, free, capabilities, resident, reserved in gpus if not reserved)
        if shapes:
            prefix, signature = prefix_of(key), frozenset(shapes.items())
            self._signatures[prefix] = signature
            self._groups.setdefault(signature, set()).add(prefix)

    def _remove(self, key: str) -> None:
        node = self._nodes.pop(key, None)
        if node is None:
            return
        self._built.pop(key, None)
        for _, free, _, _, _ in node[3]:
            self._free_values[free] -= 1
            if not self._free_values[free]:
                del self._free_values[free]
        self._unclean.discard(key)
        signature = self._signatures.pop(prefix_of(key), None)
        if signature is not None:
            members = self._groups[signature]
            members.discard(prefix_of(key))
            if not members:
                del self._groups[signature]

    def _gpus(self, node_id: str) -> tuple[GPU, ...]:
        built = self._built.get(node_id)
        if built is None:
            rack, link_domain, cordoned, gpus = self._nodes[node_id]
            built = self._built[node_id] = tuple(
                GPU(f"{node_id}{GPU_ID_SEPARATOR}{gpu_id}", node_id, free, capabilities, resident,
                    rack, link_domain, cordoned, reserved)
                for gpu_id, free, capabilities, resident, reserved in gpus)
        return built

    @property
    def clean(self) -> bool:
        return not self._unclean

    @property
    def gpu_count(self) -> int:
        return sum(self._free_values.values())

    def largest_free_gib(self) -> float | None:
        """The most free memory of any GPU, available or not; None for an empty fleet."""
        return max(self._free_values) if self._free_values else None

    def largest_available_gib(self, required: Set[str]) -> float | None:
        """The most free memory of any GPU a placement could take: unreserved, on a node not
        cordoned, with every capability in `required`; None if there is none. Read from the node
        signatures (a few distinct shapes), not GPU by GPU."""
        best: float | None = None
        for signature in self._groups:
            for (capabilities, free, _), _count in signature:
                if (best is None or free > best) and required <= capabilities:
                    best = free
        return best

    def chosen(self, identifiers: Sequence[str]) -> list[GPU]:
        """The GPUs with these identifiers (on a fleet that is not clean, found by a scan)."""
        wanted = set(identifiers)
        if self.clean:
            nodes = {identifier.split(GPU_ID_SEPARATOR, 1)[0] for identifier in identifiers}
            return [gpu for node in sorted(nodes) for gpu in self._gpus(node)
                    if gpu.identifier in wanted]
        return [gpu for gpu in self.inventory() if gpu.identifier in wanted]

    def inventory(self) -> Sequence[GPU]:
        """Every GPU, by node id then GPU id (the order the node projection lists them)."""
        if self._inventory is None:
            self._inventory = [gpu for node in sorted(self._nodes) for gpu in self._gpus(node)]
        return self._inventory

    def available(self) -> Sequence[GPU]:
        return [gpu for gpu in self.inventory() if not gpu.cordoned and not gpu.reserved]

    def signatures(self) -> Mapping[Signature, Set[str]]:
        return self._groups

    def available_on(self, prefix: str) -> Sequence[GPU]:
        node_id = prefix[:-len(GPU_ID_SEPARATOR)]
        return [gpu for gpu in self._gpus(node_id) if not gpu.cordoned and not gpu.reserved]


def gpu_index(state: StateView, usable_fraction: float) -> GpuIndex:
    """The fleet's GPU index under `usable_fraction`, current with `state`."""
    return table_view(state, NODE, ("gpu_index", usable_fraction), lambda: GpuIndex(usable_fraction))
