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
from controlplane.handlers.base import Handler, Precheck, Reads, RefuseExisting, Warm
from controlplane.policies.memory import MemoryAssessment, ModelMemory
from controlplane.policies.placement import GPU, Locality
from controlplane.policies.placement_width import MemorySizing, ReplicaShape, place_at_width
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


def _sizing(model: dict[str, Any], command: PlaceReplica, policy: PolicyInForce) -> MemorySizing:
    return MemorySizing(ModelMemory(**model["memory"]), command.max_live_tokens_per_request,
                        command.target_concurrency, command.runtime_overhead_gib,
                        policy.parameters["usable_fraction"], model.get("attention_heads"))


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
    available = fleet.largest_available_gib(frozenset(command.required_capabilities))
    # With no GPU it could take, the largest of any, so the refusal still names a width.
    most_free = available if available is not None else fleet.largest_free_gib()
    inputs = {"command": command.payload(), "model": model, "gpus_considered": fleet.gpu_count}
    if most_free is None:
        return _refused(command, ctx, policy, inputs, [Reason(
            "no_gpus", "the fleet has no GPU to place a replica on", {"gpus_considered": 0})],
            command.tensor_parallel_size, None)
    sizing = _sizing(model, command, policy)
    commanded = command.tensor_parallel_size
    unsplit = sizing.split_reasons(commanded) if commanded is not None else ()
    if unsplit:  # a runtime would refuse to start the replica at that width
        return _refused(command, ctx, policy, inputs, list(unsplit), commanded, None)
    try:
        shape = ReplicaShape(command.replica_id, command.model_id,
                             frozenset(command.required_capabilities), Locality(command.locality))
        width = place_at_width(shape, sizing, fleet, command.tensor_parallel_size, available,
                               most_free, policy.parameters["max_tensor_parallel"])
    except PolicyInputError as error:
        return rejection(command, ctx, error, stream)
    tp, assessment, decision = width.tensor_parallel, width.assessment, width.decision
    if not decision.placed:
        return _refused(command, ctx, policy, inputs,
                        [width.layout, *assessment.reasons, *decision.reasons], tp,
                        _memory_record(assessment))
    by_node: dict[str, list[str]] = {}
    for qualified in decision.gpu_ids:
        node_id, gpu_id = qualified.split(GPU_ID_SEPARATOR, 1)
        by_node.setdefault(node_id, []).append(gpu_id)
    placed_memory = min(g.free_memory_gib for g in fleet.chosen(decision.gpu_ids))
    # On GPUs as large as those the width was sized on, the assessment is the width's own.
    on_chosen = (assessment if placed_memory == width.sized_on_free_gib
                 else sizing.assess(tp, placed_memory))
    replica = {"replica_id": command.replica_id, "model_id": command.model_id,
               "pool_id": command.pool_id, "tensor_parallel": tp, "gpus": by_node,
               "required_gib_per_gpu": assessment.required_gib_per_gpu,
               "kv_capacity_tokens": on_chosen.kv_capacity_tokens,
               "max_concurrency": on_chosen.max_concurrency,
               # The chosen GPUs' assessment, as the capacity beside it (the width's sizing on
               # the GPU it was judged on is in the layout reason's facts).
               "memory": _memory_record(on_chosen)}
    data = decision_data(outcome="placed", reasons=[width.layout, *decision.reasons], result=replica,
                         policy=policy, inputs=inputs, ctx=ctx)
    placed = new_event(command, ctx, "decision", REPLICA_PLACED, data)
    appends = [append_to(stream, ctx, placed)]
    for node_id, gpu_ids in sorted(by_node.items()):
        appends.append(append_to(f"node/{node_id}", ctx, new_event(
            command, ctx, f"reserve/{node_id}", GPUS_RESERVED,
            _gpu_change(ctx, node_id, gpu_ids, command.replica_id, command.model_id, placed.event_id))))
    return appends


def _refused(command: PlaceReplica, ctx: DecisionContext, policy: PolicyInForce,
             inputs: dict[str, Any], reasons: list[Reason], tensor_parallel: int | None,
             memory: dict[str, Any] | None) -> list[StreamAppend]:
    """The placement refused, with the width and memory it was judged at (if it got that far)."""
    data = decision_data(outcome="refused", reasons=reasons,
                         result={"replica_id": command.replica_id, "pool_id": command.pool_id,
                                 "tensor_parallel": tensor_parallel, "memory": memory},
                         policy=policy, inputs=inputs, ctx=ctx)
    return [append_to(f"replica/{command.replica_id}", ctx,
                      new_event(command, ctx, "decision", PLACEMENT_REFUSED, data))]


def _memory_record(assessment: MemoryAssessment) -> dict[str, Any]:
    """A memory assessment as a decision's result records it (its reasons are the decision's)."""
    record: dict[str, Any] = to_plain(assessment)
    del record["reasons"]
    return record


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


HANDLERS: dict[str, Handler] = {
    "PlaceReplica": handle_place_replica,
    "ReleaseReplica": handle_release_replica,
    "MarkReplicaReady": handle_mark_ready,
}
# A replica id is placed once (a released replica keeps its row): another placement under it
# is refused at submit; one accepted with it, or before it was placed, is a recorded rejection.
PRECHECKS: dict[str, Precheck] = {
    "PlaceReplica": RefuseExisting(REPLICA, "replica_id", "replica")}
# Versions of the decision rules, each with what changed (see `handlers/base.py`).
RULES_VERSIONS: dict[str, int] = {
    # 2: the automatic tensor-parallel width is sized on the GPUs the placement could take; a
    #    fleet with no GPU refuses with `no_gpus`.
    # 3: the automatic width is the smallest that places: each width is assessed on the largest
    #    GPU memory that many GPUs of one locality domain offer (a width the largest GPU fits
    #    but no domain can group is passed over), and `layout_none_fits` names why each width
    #    tried was not taken (`exceeds_largest_gpu` or `too_few_gpus`).
    # 4: a width refused because no GPU can be taken at all (every one cordoned, reserved or
    #    without a required capability) says so (`no_gpu_available`), and a domain short of
    #    GPUs "offers fewer than N such GPUs".
    # 5: a placed replica's `memory` block is assessed on the GPUs it was given, as its
    #    `kv_capacity_tokens` and `max_concurrency` are (it was the width's assessment on the
    #    largest GPU the placement could take, with other figures).
    # 6: a width the model's heads do not split over is refused when commanded and passed over
    #    by the automatic width (`heads_do_not_split`), as `fleetctl fit` gates it.
    "PlaceReplica": 6,
    # 2: a replica becoming ready promotes the heads of its pool's admission queue.
    # 3: a head needing more live tokens than the pool's largest replica holds is shed.
    "MarkReplicaReady": 3,
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
