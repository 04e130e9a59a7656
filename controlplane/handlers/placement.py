"""Replica placement with an atomic GPU reservation, release, and readiness.

A placement appends `ReplicaPlaced` to the replica's stream and `GpusReserved` to every node
stream it touches, each at the version the decision read, in one transaction: two deciders
racing for the same GPUs cannot both commit. A refusal is a decision too, whose facts list every
GPU group considered and the first constraint each failed.
"""

from __future__ import annotations

from typing import Any

from controlplane.commands.base import CommandBase
from controlplane.commands.fleet import MarkReplicaReady, PlaceReplica, ReleaseReplica
from controlplane.decisions import DecisionContext, append_to, decision_data, new_event, rejection
from controlplane.handlers.admission_promotion import promote_on_ready
from controlplane.handlers.base import Handler, Precheck, Reads, Warm
from controlplane.policies.memory import (
    DeploymentMemory,
    MemoryAssessment,
    ModelMemory,
    assess_memory,
    kv_shards_under_tensor_parallel,
)
from controlplane.policies.placement import GPU, Locality, PlacementRequest
from controlplane.policies.placement_grouped import place_grouped
from controlplane.policies.reasons import PolicyInputError, Reason, to_plain
from controlplane.policy_book import PolicyBook, PolicyInForce
from controlplane.state.autoscaling import AUTOSCALER
from controlplane.state.fleet import (
    GPUS_RELEASED,
    GPUS_RESERVED,
    MODEL,
    NODE,
    PLACEMENT_REFUSED,
    POOL,
    REPLICA,
    REPLICA_PLACED,
    REPLICA_READY,
    REPLICA_RELEASED,
)
from controlplane.state.gpu_index import GPU_ID_SEPARATOR, GpuIndex, gpu_index, node_gpus
from events.model import StreamAppend
from events.projections import StateView


def inventory(state: StateView, usable_fraction: float) -> list[GPU]:
    """Every GPU of the fleet as the placement policy sees it, in a stable order."""
    return [gpu for node_id, node in state.items(NODE)
            for gpu in node_gpus(node_id, node, usable_fraction)]


def _assess(model: dict[str, Any], command: PlaceReplica, tp: int, gpu_memory_gib: float,
            usable_fraction: float) -> MemoryAssessment:
    memory = ModelMemory(**model["memory"])
    latent = memory.kv_latent_dim > 0
    return assess_memory(memory, DeploymentMemory(
        gpu_memory_gib=gpu_memory_gib, tensor_parallel_size=tp,
        kv_shards=kv_shards_under_tensor_parallel(memory.kv_heads, tp, latent),
        max_live_tokens_per_request=command.max_live_tokens_per_request,
        target_concurrency=command.target_concurrency,
        runtime_overhead_gib=command.runtime_overhead_gib, usable_fraction=usable_fraction))


def _layout(model: dict[str, Any], command: PlaceReplica, most_free: float,
            policy: PolicyInForce) -> tuple[int, MemoryAssessment, Reason]:
    """The tensor-parallel width: as commanded, else the smallest power of two that fits the
    largest GPU the placement could take (`most_free`, see `_most_free`)."""
    fraction = policy.parameters["usable_fraction"]
    largest = most_free / fraction  # division is monotonic: the largest GPU's memory
    if command.tensor_parallel_size is not None:
        tp = command.tensor_parallel_size
        return tp, _assess(model, command, tp, largest, fraction), Reason(
            "layout_commanded", f"tensor parallel {tp} as commanded", {"tensor_parallel": tp})
    tp, tried = 1, []
    while True:
        assessment = _assess(model, command, tp, largest, fraction)
        tried.append({"tensor_parallel": tp, "required_gib_per_gpu": assessment.required_gib_per_gpu})
        if assessment.fits or tp * 2 > policy.parameters["max_tensor_parallel"]:
            break
        tp *= 2
    return tp, assessment, Reason(
        "layout_smallest_fitting" if assessment.fits else "layout_none_fits",
        f"tensor parallel {tp} is the smallest power of two that fits the largest GPU"
        if assessment.fits else "no tensor-parallel width up to the policy maximum fits",
        {"tried": tried, "largest_gpu_memory_gib": largest})


def handle_place_replica(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Memory fit, layout and placement against current GPU state, then an atomic reservation."""
    assert isinstance(command, PlaceReplica)
    stream = f"replica/{command.replica_id}"
    if ctx.state.get(REPLICA, command.replica_id) is not None:
        return rejection(command, ctx, PolicyInputError(
            "replica_exists", "replica_id", f"replica {command.replica_id} already exists"), stream)
    model = ctx.state.get(MODEL, command.model_id)
    if model is None:
        return rejection(command, ctx, PolicyInputError(
            "unknown_model", "model_id", f"model {command.model_id} is not registered"), stream)
    policy = ctx.policies.in_force(ctx.state, "placement")
    fleet = fleet_index(ctx.state, policy)
    most_free = _most_free(fleet, command)
    inputs = {"command": command.payload(), "model": model, "gpus_considered": fleet.gpu_count}
    if most_free is None:
        return _refused(command, ctx, policy, inputs, [Reason(
            "no_gpus", "the fleet has no GPU to place a replica on", {"gpus_considered": 0})],
            command.tensor_parallel_size, None)
    try:
        tp, assessment, layout = _layout(model, command, most_free, policy)
        request = PlacementRequest(
            replica=command.replica_id, model_revision=command.model_id, gpus_required=tp,
            memory_gib_per_gpu=assessment.required_gib_per_gpu,
            required_capabilities=frozenset(command.required_capabilities),
            locality=Locality(command.locality))
        decision = place_grouped(request, fleet)
    except PolicyInputError as error:
        return rejection(command, ctx, error, stream)
    memory = to_plain(assessment)
    del memory["reasons"]
    if not decision.placed:
        return _refused(command, ctx, policy, inputs,
                        [layout, *assessment.reasons, *decision.reasons], tp, memory)
    by_node: dict[str, list[str]] = {}
    for qualified in decision.gpu_ids:
        node_id, gpu_id = qualified.split(GPU_ID_SEPARATOR, 1)
        by_node.setdefault(node_id, []).append(gpu_id)
    placed_memory = min(g.free_memory_gib for g in fleet.chosen(decision.gpu_ids))
    # On GPUs as large as the largest, the assessment is the one the layout made (same inputs).
    on_chosen = assessment if placed_memory == most_free else _assess(
        model, command, tp, placed_memory / policy.parameters["usable_fraction"],
        policy.parameters["usable_fraction"])
    replica = {"replica_id": command.replica_id, "model_id": command.model_id,
               "pool_id": command.pool_id, "tensor_parallel": tp, "gpus": by_node,
               "required_gib_per_gpu": assessment.required_gib_per_gpu,
               "kv_capacity_tokens": on_chosen.kv_capacity_tokens,
               "max_concurrency": on_chosen.max_concurrency, "memory": memory}
    data = decision_data(outcome="placed", reasons=[layout, *decision.reasons], result=replica,
                         policy=policy, inputs=inputs, ctx=ctx, causes=_causes(command))
    placed = new_event(command, ctx, "decision", REPLICA_PLACED, data)
    appends = [append_to(stream, ctx, placed)]
    for node_id, gpu_ids in sorted(by_node.items()):
        appends.append(append_to(f"node/{node_id}", ctx, new_event(
            command, ctx, f"reserve/{node_id}", GPUS_RESERVED,
            _gpu_change(ctx, node_id, gpu_ids, command.replica_id, command.model_id, placed.event_id))))
    return appends


def _most_free(fleet: GpuIndex, command: PlaceReplica) -> float | None:
    """The free memory a layout is sized on: the largest GPU this placement could take (free,
    on a node not cordoned, with its capabilities). With none, the largest of all, so that the
    refusal still names the width and what was short; None for a fleet with no GPU at all.

    Sized on every GPU, a drained or full large node made the automatic width too narrow for
    the GPUs actually available, and every such placement was refused."""
    available = fleet.largest_available_gib(frozenset(command.required_capabilities))
    return available if available is not None else fleet.largest_free_gib()


def _refused(command: PlaceReplica, ctx: DecisionContext, policy: PolicyInForce,
             inputs: dict[str, Any], reasons: list[Reason], tensor_parallel: int | None,
             memory: dict[str, Any] | None) -> list[StreamAppend]:
    """The placement refused, with the width and memory it was judged at (if it got that far)."""
    data = decision_data(outcome="refused", reasons=reasons,
                         result={"replica_id": command.replica_id, "pool_id": command.pool_id,
                                 "tensor_parallel": tensor_parallel, "memory": memory},
                         policy=policy, inputs=inputs, ctx=ctx, causes=_causes(command))
    return [append_to(f"replica/{command.replica_id}", ctx,
                      new_event(command, ctx, "decision", PLACEMENT_REFUSED, data))]


def _causes(command: CommandBase) -> list[str]:
    cause = getattr(command, "caused_by", None)
    return [cause] if cause else []


def _gpu_change(ctx: DecisionContext, node_id: str, gpu_ids: list[str], replica_id: str,
                model_id: str, decision_event_id: str) -> dict[str, Any]:
    reason = Reason("gpus_changed", f"{len(gpu_ids)} GPU(s) on {node_id} for {replica_id}",
                    {"gpu_ids": gpu_ids})
    return decision_data(outcome="applied", reasons=[reason],
                         result={"node_id": node_id, "gpu_ids": sorted(gpu_ids),
                                 "replica_id": replica_id, "model_id": model_id},
                         policy=None, inputs={}, ctx=ctx, causes=[decision_event_id])


def release_events(command: CommandBase, ctx: DecisionContext, replica: dict[str, Any], code: str,
                   cause_event_id: str | None = None) -> list[StreamAppend]:
    """Release a live replica and free its GPUs on every node stream, atomically."""
    reason = Reason(code, f"replica {replica['replica_id']} released", {"gpus": replica["gpus"]})
    data = decision_data(outcome="released", reasons=[reason],
                         result={"replica_id": replica["replica_id"], "pool_id": replica["pool_id"]},
                         policy=None, inputs={"replica": replica["replica_id"]}, ctx=ctx,
                         causes=[cause_event_id] if cause_event_id else [])
    slot = f"release/{replica['replica_id']}"
    released = new_event(command, ctx, slot, REPLICA_RELEASED, data)
    appends = [append_to(f"replica/{replica['replica_id']}", ctx, released)]
    for node_id, gpu_ids in sorted(replica["gpus"].items()):
        appends.append(append_to(f"node/{node_id}", ctx, new_event(
            command, ctx, f"{slot}/{node_id}", GPUS_RELEASED,
            _gpu_change(ctx, node_id, gpu_ids, replica["replica_id"], replica["model_id"],
                        released.event_id))))
    return appends


def handle_release_replica(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Free a replica's GPUs; releasing one that is not live is refused, not repeated."""
    assert isinstance(command, ReleaseReplica)
    replica = ctx.state.get(REPLICA, command.replica_id)
    stream = f"replica/{command.replica_id}"
    if replica is None or replica["state"] == "released":
        return rejection(command, ctx, PolicyInputError(
            "replica_not_live", "replica_id", f"replica {command.replica_id} is not live"), stream)
    return release_events(command, ctx, replica, "released_by_operator")


def handle_mark_ready(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """A warming replica becomes ready, adds its KV capacity to its pool and admits the head of
    the pool's queue while it fits (`promote_on_ready`)."""
    assert isinstance(command, MarkReplicaReady)
    replica = ctx.state.get(REPLICA, command.replica_id)
    stream = f"replica/{command.replica_id}"
    if replica is None or replica["state"] != "warming":
        return rejection(command, ctx, PolicyInputError(
            "replica_not_warming", "replica_id", f"replica {command.replica_id} is not warming"),
            stream)
    reason = Reason("replica_ready", f"replica {command.replica_id} serves traffic",
                    {"kv_capacity_tokens": replica["kv_capacity_tokens"]})
    data = decision_data(outcome="ready", reasons=[reason],
                         result={"replica_id": command.replica_id, "pool_id": replica["pool_id"]},
                         policy=None, inputs=command.payload(), ctx=ctx,
                         causes=[replica["decision_event_id"]])
    ready = new_event(command, ctx, "decision", REPLICA_READY, data)
    return [append_to(stream, ctx, ready),
            *promote_on_ready(command, ctx, replica, ready.event_id)]


def precheck_place_replica(command: CommandBase, state: StateView) -> list[tuple[str, str]]:
    assert isinstance(command, PlaceReplica)
    if state.get(REPLICA, command.replica_id) is not None:
        return [("replica_id", f"replica {command.replica_id!r} already exists")]
    return []


HANDLERS: dict[str, Handler] = {
    "PlaceReplica": handle_place_replica,
    "ReleaseReplica": handle_release_replica,
    "MarkReplicaReady": handle_mark_ready,
}
# A replica id is placed once (a released replica keeps its row): another placement under it
# is refused at submit; one accepted with it, or before it was placed, is a recorded rejection.
PRECHECKS: dict[str, Precheck] = {"PlaceReplica": precheck_place_replica}
# Versions of the decision rules, each with what changed (see `handlers/base.py`).
RULES_VERSIONS: dict[str, int] = {
    # 2: the automatic tensor-parallel width is sized on the GPUs the placement could take; a
    #    fleet with no GPU refuses with `no_gpus`.
    "PlaceReplica": 2,
    # 2: a replica becoming ready promotes the heads of its pool's admission queue.
    "MarkReplicaReady": 2,
}


def _replica_reads(command: CommandBase) -> list[tuple[str, str]]:
    """The replica's row; for a placement also the model and the pool's rows its fold updates
    (the pool's replicas, its autoscaler's members), so none is read alone under the lock."""
    assert isinstance(command, PlaceReplica | ReleaseReplica | MarkReplicaReady)
    reads = [(REPLICA, command.replica_id)]
    if isinstance(command, PlaceReplica):
        reads += [(MODEL, command.model_id), (POOL, command.pool_id),
                  (AUTOSCALER, command.pool_id)]
    return reads


def fleet_index(state: StateView, policy: PolicyInForce) -> GpuIndex:
    """The GPU index a placement decides on, under the placement policy's usable fraction."""
    return gpu_index(state, policy.parameters["usable_fraction"])


def _warm_fleet_index(state: StateView, policies: PolicyBook) -> None:
    """Built for every batch with a placement, even one the handler then rejects before
    consulting it (an existing replica, an unknown model): the index is the process's to keep."""
    fleet_index(state, policies.in_force(state, "placement"))


WARMS: dict[str, Warm] = {"PlaceReplica": _warm_fleet_index}
READS: dict[str, Reads] = {"PlaceReplica": _replica_reads, "ReleaseReplica": _replica_reads,
                           "MarkReplicaReady": _replica_reads}
