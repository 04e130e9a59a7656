"""Parallel layout: the smallest tensor x pipeline split that fits, then data parallelism (§1.7).

Decision order: fewest GPUs per replica first; on a tie, a fast intra-node link prefers the wider
tensor split (fewer pipeline bubbles) and a slow one the deeper pipeline. Tensor groups never cross
a node; pipeline stages may. No layer-divisibility or runtime-support table is consulted, so a
feasible plan is a memory-feasible layout, not a certified one.

`reasons[0]` is the deciding reason (a replica shortfall outranks the layout explanation); when
there is a shortfall, the layout explanation follows it. An infeasible plan reports
`memory_gib_per_gpu=None` and the smallest per-GPU size any layout could reach, never infinity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controlplane.policies.reasons import Reason, require

# The most GPUs a node may hold. A node is the tensor-parallel domain (tensor groups never cross
# it), and every node in research-data/ has 4 or 8 GPUs (DGX-class H100/H200 boards; an MI300X
# node's 8 GPUs, each with 7 XGMI peers; vidur's 4- and 8-GPU nodes); the largest NVLink domain
# sold as one system, GB200 NVL72, has 72. 1,024 leaves room for larger domains, matches the
# tensor_parallel_size bound of the memory commands, and keeps the layout search small.
MAX_GPUS_PER_NODE = 1_024


@dataclass(frozen=True)
class ParallelModel:
    """What a replica must hold: unsharded weights plus a per-GPU runtime term that never shards."""

    weight_memory_gib: float
    runtime_memory_gib_per_gpu: float
    experts: int = 1


@dataclass(frozen=True)
class ClusterTopology:
    nodes: int
    gpus_per_node: int
    gpu_memory_gib: float
    usable_fraction: float
    fast_intra_node_collectives: bool


@dataclass(frozen=True)
class ParallelPlan:
    """A layout, or `feasible=False` with zero degrees and `memory_gib_per_gpu=None`."""

    feasible: bool
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    expert_parallel: int
    memory_gib_per_gpu: float | None
    reasons: tuple[Reason, ...]

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate(model: ParallelModel, topology: ClusterTopology, target_replicas: int) -> None:
    weight = model.weight_memory_gib
    require(math.isfinite(weight) and weight > 0, "model_memory_invalid", "weight_memory_gib",
            "weight memory must be a positive finite number of GiB")
    runtime = model.runtime_memory_gib_per_gpu
    require(math.isfinite(runtime) and runtime >= 0, "model_memory_invalid",
            "runtime_memory_gib_per_gpu", "runtime memory must be finite and non-negative")
    require(_is_count(model.experts) and model.experts > 0, "expert_count_not_positive",
            "experts", "expert count must be a positive integer")
    for name in ("nodes", "gpus_per_node"):
        value = getattr(topology, name)
        require(_is_count(value) and value > 0, "cluster_capacity_not_positive", name,
                f"{name} must be a positive integer")
    require(topology.gpus_per_node <= MAX_GPUS_PER_NODE, "gpus_per_node_above_limit",
            "gpus_per_node", f"gpus_per_node may be at most {MAX_GPUS_PER_NODE}")
    memory = topology.gpu_memory_gib
    require(math.isfinite(memory) and memory > 0, "cluster_capacity_not_positive",
            "gpu_memory_gib", "GPU memory must be a positive finite number of GiB")
    fraction = topology.usable_fraction
    require(math.isfinite(fraction) and 0 < fraction <= 1, "usable_fraction_out_of_range",
            "usable_fraction", "usable_fraction must be in (0, 1]")
    require(_is_count(target_replicas) and target_replicas > 0, "target_replicas_not_positive",
            "target_replicas", "target_replicas must be a positive integer")


def _memory_gib_per_gpu(model: ParallelModel, tensor: int, pipeline: int) -> float:
    return model.weight_memory_gib / (tensor * pipeline) + model.runtime_memory_gib_per_gpu


def _smallest_fitting_pipeline(model: ParallelModel, tensor: int, max_pipeline: int,
                               usable_gib: float) -> int | None:
    """The least pipeline depth whose per-GPU memory fits, found without scanning every depth."""
    spare_gib = usable_gib - model.runtime_memory_gib_per_gpu
    if spare_gib <= 0:
        return None
    # The closed form is only a starting guess: the fit test itself is the float formula, and
    # it is monotone in depth, so stepping settles on exactly the depth a full scan would find.
    ratio = model.weight_memory_gib / (tensor * spare_gib)
    depth = max(1, math.ceil(ratio)) if ratio < max_pipeline else max_pipeline
    while depth > 1 and _memory_gib_per_gpu(model, tensor, depth - 1) <= usable_gib:
        depth -= 1
    while depth <= max_pipeline and _memory_gib_per_gpu(model, tensor, depth) > usable_gib:
        depth += 1
    return depth if depth <= max_pipeline else None


def divisors(number: int) -> list[int]:
    """Every divisor of a positive `number`, ascending, from trial divisions up to its root."""
    low = [divisor for divisor in range(1, math.isqrt(number) + 1) if number % divisor == 0]
    return low + [number // divisor for divisor in reversed(low) if divisor * divisor != number]


def _largest_divisor_at_most(number: int, bound: int) -> int:
    return max(divisor for divisor in divisors(number) if divisor <= bound)


def plan_parallelism(model: ParallelModel, topology: ClusterTopology,
                     target_replicas: int) -> ParallelPlan:
    """Choose the fewest-GPU layout that fits usable memory; never reports an infinite size."""
    _validate(model, topology, target_replicas)
    total_gpus = topology.nodes * topology.gpus_per_node
    usable_gib = topology.gpu_memory_gib * topology.usable_fraction
    fast = topology.fast_intra_node_collectives
    widths = divisors(topology.gpus_per_node) if fast else [1]
    best: tuple[int, int, int, int] | None = None  # (gpus, preference, tensor, pipeline)
    for tensor in widths:
        pipeline = _smallest_fitting_pipeline(model, tensor, total_gpus // tensor, usable_gib)
        if pipeline is None:
            continue
        key = (tensor * pipeline, pipeline if fast else tensor, tensor, pipeline)
        if best is None or key < best:
            best = key
    facts = {"usable_gib_per_gpu": usable_gib, "total_gpus": total_gpus,
             "weight_memory_gib": model.weight_memory_gib,
             "runtime_memory_gib_per_gpu": model.runtime_memory_gib_per_gpu,
             "fast_intra_node_collectives": fast, "target_replicas": target_replicas}
    if best is None:
        smallest_gib = _memory_gib_per_gpu(model, max(widths), total_gpus // max(widths))
        reason = Reason("no_layout_fits",
                        "no tensor/pipeline layout fits usable GPU memory",
                        {**facts, "smallest_memory_gib_per_gpu": smallest_gib})
        return ParallelPlan(False, 0, 0, 0, 0, None, (reason,))
    gpus, _, tensor, pipeline = best
    memory_gib = _memory_gib_per_gpu(model, tensor, pipeline)
    replicas = min(target_replicas, total_gpus // gpus)
    experts = _largest_divisor_at_most(model.experts, gpus)
    facts = {**facts, "tensor_parallel": tensor, "pipeline_parallel": pipeline,
             "gpus_per_replica": gpus, "memory_gib_per_gpu": memory_gib,
             "data_parallel": replicas, "expert_parallel": experts, "experts": model.experts}
    reasons: list[Reason] = []
    if replicas < target_replicas:
        reasons.append(Reason("replica_shortfall",
                              f"layout fits, but the cluster supplies {replicas}/"
                              f"{target_replicas} requested replicas", facts))
    if pipeline > 1 and tensor == 1:
        reasons.append(Reason("pipeline_split",
                              "pipeline split chosen: tensor collectives are unavailable or "
                              "unnecessary", facts))
    elif tensor > 1:
        reasons.append(Reason("intra_node_tensor_split",
                              "intra-node tensor split is the smallest fast-link layout that fits",
                              facts))
    else:
        reasons.append(Reason("single_gpu_replica",
                              "one GPU per replica fits; the other GPUs add data parallelism",
                              facts))
    return ParallelPlan(True, tensor, pipeline, replicas, experts, memory_gib, tuple(reasons))
