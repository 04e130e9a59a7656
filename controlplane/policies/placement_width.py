"""A replica's tensor-parallel width: as commanded, else the smallest power of two that places.

A width `tp` needs `tp` GPUs of one locality domain, each with the memory assessment's
`required_gib_per_gpu` free, and that need does not depend on which GPU takes it. So `tp`
places exactly when one domain offers `tp` available GPUs, with the required capabilities,
of at least the need each: when the need is at most `GroupOffers.most_for(tp)`, the largest
free memory `tp` GPUs of one domain all have (`place_replica`'s own gates and domains). Each
width is therefore assessed on that GPU, and the first whose assessment fits is the one
`place_grouped` is asked to place. A width not taken failed on the model (its heads do not
split over `tp` GPUs, `heads_do_not_split`: `head_split_reasons`, as `fleetctl fit` gates), on
memory (its need exceeds the largest GPU the placement could take, `exceeds_largest_gpu`) or
on GPUs (no domain offers `tp` GPUs that large, `too_few_gpus`; none at all can be taken,
`no_gpu_available`); the decision's layout reason lists every width tried.

Cost: width 1 is sized on the largest available GPU (one GPU is a group in any domain), so a
placement that fits there costs what it did before: one assessment, one `place_grouped` call.
A wider width whose need fits the largest GPU reads `GroupOffers`, built once per decision in
one pass over the node signatures (node locality: a few on a fleet of alike nodes, one a node
where every node differs) or over the available GPUs (rack, link domain, any), then a pass over
the domains per width. A width that fails is known without calling `place_grouped` (bar a need
within rounding of a GPU's free memory, which `place_grouped` then settles); a refusal calls it
once, to list every GPU and the first gate it failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controlplane.policies.memory import (
    DeploymentMemory,
    MemoryAssessment,
    ModelMemory,
    assess_memory,
    head_split_reasons,
    kv_shards_under_tensor_parallel,
)
from controlplane.policies.placement import (
    Locality,
    PlacementDecision,
    PlacementRequest,
)
from controlplane.policies.placement_grouped import GroupedInventory, place_grouped
from controlplane.policies.reasons import Reason

TAKEN, EXCEEDS_LARGEST_GPU, TOO_FEW_GPUS = "taken", "exceeds_largest_gpu", "too_few_gpus"
NO_GPU_AVAILABLE, HEADS_DO_NOT_SPLIT = "no_gpu_available", "heads_do_not_split"


@dataclass(frozen=True)
class MemorySizing:
    """What a replica's memory assessment needs besides its width and GPU."""

    model: ModelMemory
    max_live_tokens_per_request: int
    target_concurrency: int
    runtime_overhead_gib: float
    usable_fraction: float
    attention_heads: int | None = None  # None: not known (a model declared by its memory)

    def split_reasons(self, tensor_parallel: int) -> tuple[Reason, ...]:
        """Why the model's heads do not split over `tensor_parallel` GPUs (empty: they do)."""
        return head_split_reasons(tensor_parallel, self.model.kv_heads, self.model.kv_latent_dim,
                                  self.attention_heads)

    def assess(self, tensor_parallel: int, free_gib: float) -> MemoryAssessment:
        """The assessment at `tensor_parallel` on a GPU with `free_gib` usable (free) memory."""
        latent = self.model.kv_latent_dim > 0
        return assess_memory(self.model, DeploymentMemory(
            gpu_memory_gib=free_gib / self.usable_fraction, tensor_parallel_size=tensor_parallel,
            kv_shards=kv_shards_under_tensor_parallel(self.model.kv_heads, tensor_parallel, latent),
            max_live_tokens_per_request=self.max_live_tokens_per_request,
            target_concurrency=self.target_concurrency,
            runtime_overhead_gib=self.runtime_overhead_gib, usable_fraction=self.usable_fraction))


@dataclass(frozen=True)
class WidthDecision:
    """The width judged, its assessment (on `sized_on_free_gib`), and the placement at it."""

    tensor_parallel: int
    assessment: MemoryAssessment
    sized_on_free_gib: float
    decision: PlacementDecision
    layout: Reason


class GroupOffers:
    """What groups of GPUs one placement (its capabilities and locality) could take.

    Node locality reads the node signatures (nodes of one shape offer alike) once per width,
    keeping only GPUs that could beat the best node so far and stopping at the first node that
    offers `ceiling` (the largest GPU: no group offers more). Any other locality groups the
    available GPUs by domain once, on first use, each domain's free memory sorted from the
    most; each width is then a pass over the domains."""

    def __init__(self, fleet: GroupedInventory, capabilities: frozenset[str],
                 locality: Locality, ceiling: float = math.inf) -> None:
        self._fleet, self._capabilities, self._locality = fleet, capabilities, locality
        self._ceiling = ceiling
        self._domains: list[list[float]] | None = None

    def most_for(self, count: int) -> float | None:
        """The most free memory that `count` available GPUs with the capabilities, all in one
        domain, each have; None when no domain offers `count` of them."""
        if self._locality is Locality.NODE:
            return self._most_on_one_node(count)
        offers = [frees[count - 1] for frees in self._by_domain() if len(frees) >= count]
        return max(offers) if offers else None

    def _most_on_one_node(self, count: int) -> float | None:
        best: float | None = None
        floor = -math.inf
        for signature in self._fleet.signatures():
            # Only GPUs with more free memory than the best so far can make a node better.
            frees = [(free, gpus) for (gpu_capabilities, free, _), gpus in signature
                     if free > floor and self._capabilities <= gpu_capabilities]
            found = _count_th_largest(frees, count)
            if found is not None:
                if found >= self._ceiling:
                    return found
                best = floor = found
        return best

    def _by_domain(self) -> list[list[float]]:
        if self._domains is None:
            # `domain_of`'s domains, keyed without building its strings for every GPU.
            domains: dict[object, list[float]] = {}
            capabilities, locality = self._capabilities, self._locality
            for gpu in self._fleet.available():
                if capabilities <= gpu.capabilities:
                    shared = (gpu.rack if locality is Locality.RACK
                              else gpu.link_domain if locality is Locality.LINK_DOMAIN else "any")
                    key = (True, shared) if shared else (False, gpu.node)
                    frees = domains.get(key)
                    if frees is None:
                        domains[key] = [gpu.free_memory_gib]
                    else:
                        frees.append(gpu.free_memory_gib)
            self._domains = [sorted(frees, reverse=True) for frees in domains.values()]
        return self._domains


def _count_th_largest(frees: list[tuple[float, int]], count: int) -> float | None:
    """The `count`-th largest free memory of (free GiB, GPUs with it) pairs; None if fewer."""
    if sum(gpus for _, gpus in frees) < count:
        return None
    seen = 0
    for free, gpus in sorted(frees, reverse=True):
        seen += gpus
        if seen >= count:
            return free
    return None  # unreachable: the total was at least `count`


@dataclass(frozen=True)
class ReplicaShape:
    """What a replica asks of its GPUs before its width is chosen; the width sets how many
    GPUs it takes and the memory each must have free (`at`)."""

    replica: str
    model_revision: str
    required_capabilities: frozenset[str] = frozenset()
    locality: Locality = Locality.NODE

    def at(self, gpus: int, memory_gib_per_gpu: float) -> PlacementRequest:
        return PlacementRequest(self.replica, self.model_revision, gpus, memory_gib_per_gpu,
                                self.required_capabilities, self.locality)


def place_at_width(shape: ReplicaShape, sizing: MemorySizing, fleet: GroupedInventory,
                   commanded: int | None, available_gib: float | None, largest_gib: float,
                   max_tensor_parallel: int) -> WidthDecision:
    """Place a replica of `shape` at the commanded width, else at the smallest power of two up to
    `max_tensor_parallel` that places, else refuse naming why each width was not taken.

    `available_gib` is the largest free memory of a GPU the placement could take (None: none);
    `largest_gib` is that, or without one the largest of any GPU, so a refusal still has a width."""
    if commanded is not None:
        assessment = sizing.assess(commanded, largest_gib)
        return WidthDecision(commanded, assessment, largest_gib, place_grouped(
            shape.at(commanded, assessment.required_gib_per_gpu), fleet), Reason(
            "layout_commanded", f"tensor parallel {commanded} as commanded",
            {"tensor_parallel": commanded}))
    tried: list[dict[str, object]] = []
    judged: list[tuple[int, MemoryAssessment, float, PlacementDecision | None]] = []
    offers = GroupOffers(fleet, shape.required_capabilities, shape.locality,
                         available_gib if available_gib is not None else math.inf)
    tp = 1
    while tp <= max_tensor_parallel:
        on_largest = sizing.assess(tp, largest_gib)
        need = on_largest.required_gib_per_gpu
        sized_on: float | None = None
        outcome, assessment, decision = EXCEEDS_LARGEST_GPU, on_largest, None
        if sizing.split_reasons(tp):
            outcome = HEADS_DO_NOT_SPLIT
        elif on_largest.fits:
            outcome = TOO_FEW_GPUS if available_gib is not None else NO_GPU_AVAILABLE
            if available_gib is not None:
                sized_on = available_gib if tp == 1 else offers.most_for(tp)
            if sized_on is not None:
                assessment = on_largest if sized_on == largest_gib else sizing.assess(tp, sized_on)
                if assessment.fits:
                    decision = place_grouped(shape.at(tp, need), fleet)
                    outcome = TAKEN if decision.placed else TOO_FEW_GPUS
        tried.append({"tensor_parallel": tp, "required_gib_per_gpu": need,
                      "largest_group_usable_gib": sized_on, "outcome": outcome})
        judged.append((tp, assessment, largest_gib if sized_on is None else sized_on, decision))
        if outcome == TAKEN:
            break
        tp *= 2
    facts = {"tried": tried, "largest_gpu_memory_gib": largest_gib / sizing.usable_fraction,
             "locality": shape.locality.value}
    if tried[-1]["outcome"] == TAKEN:
        tp, assessment, sized_on_gib, decision = judged[-1]
        assert decision is not None
        return WidthDecision(tp, assessment, sized_on_gib, decision, Reason(
            "layout_smallest_fitting", f"tensor parallel {tp} is the smallest power of two whose "
            "memory fits GPUs the placement can group", facts))
    # The refusal's GPU facts are judged at the first width only GPUs stopped, else the widest
    # the model's heads split over (width 1 always does): a width they do not split over may
    # well be placeable, and the refusal must not place it.
    shown = next((i for i, t in enumerate(tried)
                  if t["outcome"] in (TOO_FEW_GPUS, NO_GPU_AVAILABLE)),
                 max(i for i, t in enumerate(tried) if t["outcome"] != HEADS_DO_NOT_SPLIT))
    tp, assessment, sized_on_gib, decision = judged[shown]
    if decision is None:
        decision = place_grouped(shape.at(tp, assessment.required_gib_per_gpu), fleet)
    return WidthDecision(tp, assessment, sized_on_gib, decision, Reason(
        "layout_none_fits", f"no tensor-parallel width up to {max_tensor_parallel} can be "
        f"placed: {_why_not(tried, shape.locality, largest_gib)}", facts))


def _why_not(tried: list[dict[str, object]], locality: Locality, largest_gib: float) -> str:
    """Each width tried and why it was not taken, for people (the facts carry the numbers)."""
    domain = "the fleet" if locality is Locality.ANY else f"one {locality.value}"
    reasons = []
    for t in tried:
        width, group_gib = t["tensor_parallel"], t["largest_group_usable_gib"]
        why = (f"more than the largest GPU offers ({largest_gib:.2f} GiB)"
               if t["outcome"] == EXCEEDS_LARGEST_GPU
               else "but the model's heads do not split over that many GPUs"
               if t["outcome"] == HEADS_DO_NOT_SPLIT
               else "but no GPU can be taken (each is cordoned, reserved or lacks a required "
               "capability)" if t["outcome"] == NO_GPU_AVAILABLE
               else f"but {domain} offers fewer than {width} such GPUs" if group_gib is None
               else f"but {width} GPUs of {domain} offer at most {group_gib:.2f} GiB each")
        reasons.append(f"width {width} needs {t['required_gib_per_gpu']:.2f} GiB per GPU, {why}")
    return "; ".join(reasons)
