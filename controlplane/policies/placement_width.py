"""A replica's tensor-parallel width: as commanded, else the smallest power of two that places.

A width `tp` needs `tp` GPUs of one locality domain, each with the memory assessment's
`required_gib_per_gpu` free, and that need does not depend on which GPU takes it. So `tp`
places exactly when one domain offers `tp` available GPUs, with the required capabilities,
of at least the need each: when the need is at most `groupable_gib(tp)`, the largest free
memory `tp` GPUs of one domain all have (`place_replica`'s own gates and domains). Each width
is therefore assessed on that GPU, and the first whose assessment fits is the one
`place_grouped` is asked to place. A width not taken failed on memory (its need exceeds the
largest GPU the placement could take, `exceeds_largest_gpu`) or on GPUs (no domain offers `tp`
GPUs that large, `too_few_gpus`); the decision's layout reason lists every width tried.

Cost: width 1 is sized on the largest available GPU (one GPU is a group in any domain), so a
placement that fits there costs what it did before: one assessment, one `place_grouped` call.
`groupable_gib` runs only for a wider width whose need fits the largest GPU: one pass over the
node signatures, which stops at the first node offering `tp` of the largest GPUs (on a fleet of
alike nodes, at once; where every node differs, about as long as `place_grouped`'s own pass).
A width that fails is known without calling `place_grouped` (bar a need within rounding of a
GPU's free memory, which `place_grouped` then settles); a refusal calls it once, to list every
GPU and the first gate it failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from controlplane.policies.memory import (
    DeploymentMemory,
    MemoryAssessment,
    ModelMemory,
    assess_memory,
    kv_shards_under_tensor_parallel,
)
from controlplane.policies.placement import (
    Locality,
    PlacementDecision,
    PlacementRequest,
    domain_of,
)
from controlplane.policies.placement_grouped import GroupedInventory, place_grouped
from controlplane.policies.reasons import Reason

TAKEN, EXCEEDS_LARGEST_GPU, TOO_FEW_GPUS = "taken", "exceeds_largest_gpu", "too_few_gpus"


@dataclass(frozen=True)
class MemorySizing:
    """What a replica's memory assessment needs besides its width and GPU."""

    model: ModelMemory
    max_live_tokens_per_request: int
    target_concurrency: int
    runtime_overhead_gib: float
    usable_fraction: float

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


def groupable_gib(fleet: GroupedInventory, count: int, capabilities: frozenset[str],
                  locality: Locality, ceiling: float) -> float | None:
    """The most free memory that `count` available GPUs with `capabilities` in one `locality`
    domain all have (None: no domain offers `count`); stops early at `ceiling`, the largest."""
    best: float | None = None
    if locality is Locality.NODE:
        floor = -math.inf
        for signature in fleet.signatures():
            # Only GPUs with more free memory than the best so far can make a node better.
            frees = [(free, gpus) for (gpu_capabilities, free, _), gpus in signature
                     if free > floor and capabilities <= gpu_capabilities]
            found = _count_th_largest(frees, count)
            if found is not None:
                if found >= ceiling:
                    return found
                best = floor = found
        return best
    domains: dict[str, list[tuple[float, int]]] = {}
    for gpu in fleet.available():
        if capabilities <= gpu.capabilities:
            domains.setdefault(domain_of(gpu, locality), []).append((gpu.free_memory_gib, 1))
    for frees in domains.values():
        found = _count_th_largest(frees, count)
        if found is not None and (best is None or found > best):
            best = found
    return best


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


def place_at_width(request: PlacementRequest, sizing: MemorySizing, fleet: GroupedInventory,
                   commanded: int | None, available_gib: float | None, largest_gib: float,
                   max_tensor_parallel: int) -> WidthDecision:
    """Place `request` at the commanded width, else at the smallest power of two up to
    `max_tensor_parallel` that places, else refuse naming why each width was not taken.

    `available_gib` is the largest free memory of a GPU the placement could take (None: none);
    `largest_gib` is that, or without one the largest of any GPU, so a refusal still has a width."""
    if commanded is not None:
        assessment = sizing.assess(commanded, largest_gib)
        return WidthDecision(commanded, assessment, largest_gib, place_grouped(replace(
            request, gpus_required=commanded,
            memory_gib_per_gpu=assessment.required_gib_per_gpu), fleet), Reason(
            "layout_commanded", f"tensor parallel {commanded} as commanded",
            {"tensor_parallel": commanded}))
    tried: list[dict[str, object]] = []
    judged: list[tuple[int, MemoryAssessment, float, PlacementDecision | None]] = []
    tp = 1
    while tp <= max_tensor_parallel:
        on_largest = sizing.assess(tp, largest_gib)
        need = on_largest.required_gib_per_gpu
        sized_on: float | None = None
        outcome, assessment, decision = EXCEEDS_LARGEST_GPU, on_largest, None
        if on_largest.fits:
            outcome = TOO_FEW_GPUS
            if available_gib is not None:
                sized_on = available_gib if tp == 1 else groupable_gib(
                    fleet, tp, request.required_capabilities, request.locality, available_gib)
            if sized_on is not None:
                assessment = on_largest if sized_on == largest_gib else sizing.assess(tp, sized_on)
                if assessment.fits:
                    decision = place_grouped(replace(
                        request, gpus_required=tp, memory_gib_per_gpu=need), fleet)
                    outcome = TAKEN if decision.placed else TOO_FEW_GPUS
        tried.append({"tensor_parallel": tp, "required_gib_per_gpu": need,
                      "largest_group_usable_gib": sized_on, "outcome": outcome})
        judged.append((tp, assessment, largest_gib if sized_on is None else sized_on, decision))
        if outcome == TAKEN:
            break
        tp *= 2
    facts = {"tried": tried, "largest_gpu_memory_gib": largest_gib / sizing.usable_fraction,
             "locality": request.locality.value}
    if tried[-1]["outcome"] == TAKEN:
        tp, assessment, sized_on_gib, decision = judged[-1]
        assert decision is not None
        return WidthDecision(tp, assessment, sized_on_gib, decision, Reason(
            "layout_smallest_fitting", f"tensor parallel {tp} is the smallest power of two whose "
            "memory fits GPUs the placement can group", facts))
    # The refusal's GPU facts are judged at the first width only GPUs stopped, else the widest.
    shown = next((i for i, t in enumerate(tried) if t["outcome"] == TOO_FEW_GPUS), -1)
    tp, assessment, sized_on_gib, decision = judged[shown]
    if decision is None:
        decision = place_grouped(replace(
            request, gpus_required=tp, memory_gib_per_gpu=assessment.required_gib_per_gpu), fleet)
    return WidthDecision(tp, assessment, sized_on_gib, decision, Reason(
        "layout_none_fits", f"no tensor-parallel width up to {max_tensor_parallel} can be "
        f"placed: {_why_not(tried, request.locality, largest_gib)}", facts))


def _why_not(tried: list[dict[str, object]], locality: Locality, largest_gib: float) -> str:
    """Each width tried and why it was not taken, for people (the facts carry the numbers)."""
    domain = "the fleet" if locality is Locality.ANY else f"one {locality.value}"
    reasons = []
    for t in tried:
        width, group_gib = t["tensor_parallel"], t["largest_group_usable_gib"]
        why = (f"more than the largest GPU offers ({largest_gib:.2f} GiB)"
               if t["outcome"] == EXCEEDS_LARGEST_GPU
               else f"but {domain} offers no {width} such GPUs" if group_gib is None
               else f"but {width} GPUs of {domain} offer at most {group_gib:.2f} GiB each")
        reasons.append(f"width {width} needs {t['required_gib_per_gpu']:.2f} GiB per GPU, {why}")
    return "; ".join(reasons)
