"""The simulated fleet, built through the log: nodes, the model, policies, the first replicas.

Everything here is a command decided by the control plane; the simulation learns each
replica's tensor-parallel width, KV capacity and what its GPUs hold (which its step costs are
priced from) from its recorded placement, never on its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from controlplane.catalog.errors import CatalogError
from controlplane.catalog.gpus import GpuType
from controlplane.catalog.registry import FIXTURES_ENV, CatalogModel, load_catalog
from controlplane.commands.base import CommandBase
from controlplane.commands.fleet import (
    GpuSpec,
    MarkReplicaReady,
    PlaceReplica,
    RegisterModel,
    RegisterNode,
    SetPolicy,
)
from controlplane.errors import FleetError, InputError
from controlplane.simulation.config import SimulationConfig
from controlplane.simulation.control import ControlPlane, Decided
from controlplane.simulation.costs import (
    PlacedMemory,
    dense_bf16_tflops,
    engine_costs,
    service_tokens_per_second,
)
from controlplane.simulation.dataplane import ReplicaEngine
from controlplane.simulation.routing import ReplicaPrefixCache
from controlplane.simulation.traces import Trace
from controlplane.simulation.world import ReplicaState, SimReplica
from controlplane.state.fleet import PLACEMENT_REFUSED, REPLICA_PLACED

DEFAULT_BLOCK_TOKENS = 16  # vLLM's page size; used when a trace carries no block hashes
MAX_TOKENS_PER_REQUEST = 131_072


class PlacementRefusedError(FleetError):
    """The control plane refused to place the first replica: nothing can be simulated."""

    exit_code = 1


@dataclass
class Fleet:
    """What the simulation knows of the fleet, all of it read from recorded decisions."""

    model: CatalogModel
    gpu: GpuType
    service_tokens_per_second: float
    block_size_tokens: int
    replicas: dict[str, SimReplica]

    def ready(self) -> list[SimReplica]:
        return [r for r in self.replicas.values() if r.state is ReplicaState.READY]


def resolve_catalog(config: SimulationConfig) -> tuple[CatalogModel, GpuType]:
    """The catalog model and a GPU the engines can be costed on, as the run names them;
    InputError naming the option otherwise."""
    try:
        catalog = load_catalog()
    except CatalogError as error:  # the catalog's files: where FLEET_FIXTURES_DIR points
        raise InputError(f"{FIXTURES_ENV}: {error.message}") from None
    try:
        model, gpu = catalog.model(config.model_id), catalog.gpu(config.gpu_id)
    except CatalogError as error:
        raise InputError(f"--{error.field}: {error.message}") from None
    dense_bf16_tflops(gpu)  # a GPU the engines cannot be costed on is refused here, not mid-run
    return model, gpu


def place_command(config: SimulationConfig, model: CatalogModel, number: int,
                  at: datetime) -> PlaceReplica:
    return PlaceReplica(command_id=f"place-{number}", at=at, actor="simulation",
                        replica_id=f"{config.pool_id}-r{number}", model_id=model.model_id,
                        pool_id=config.pool_id)


def replica_from(decided: Decided, fleet: Fleet, now_seconds: float) -> SimReplica | None:
    """The replica a PlaceReplica decision placed (None when it was refused)."""
    placed = decided.first(REPLICA_PLACED)
    if placed is None:
        return None
    result = placed.data["result"]
    kv_tokens = int(result["kv_capacity_tokens"])
    tp = int(result["tensor_parallel"])
    costs = engine_costs(fleet.model, fleet.gpu, tp, PlacedMemory.from_record(result["memory"]))
    return SimReplica(result["replica_id"], tp, kv_tokens, now_seconds,
                      ReplicaEngine(costs, kv_tokens, now_seconds),
                      ReplicaPrefixCache(fleet.block_size_tokens, kv_tokens // fleet.block_size_tokens))


def build_fleet(control: ControlPlane, config: SimulationConfig, trace: Trace,
                at: Callable[[float], datetime]) -> Fleet:
    """Register nodes and the model, set policies, place and ready the initial replicas."""
    model, gpu = resolve_catalog(config)
    start = at(0.0)
    gpus = [GpuSpec(gpu_id=f"g{i}", gpu_type=gpu.gpu_id, memory_gib=gpu.memory_gib)
            for i in range(config.gpus_per_node)]

    def node(number: int) -> RegisterNode:
        return RegisterNode(command_id=f"node-{number}", at=start, actor="simulation",
                            node_id=f"node-{number}", rack=f"rack-{number // 4}", gpus=gpus)

    first = control.run([node(1), RegisterModel(command_id="model", at=start, actor="simulation",
                                                model_id=model.model_id, catalog_id=model.model_id),
                         place_command(config, model, 1, start)])
    fleet = Fleet(model, gpu, 0.0, trace.block_size_tokens or DEFAULT_BLOCK_TOKENS, {})
    replica = replica_from(first[-1], fleet, 0.0)
    if replica is None:
        refused = first[-1].first(PLACEMENT_REFUSED) or first[-1].events[0]
        codes = [reason["code"] for reason in refused.data.get("reasons", [])]
        raise PlacementRefusedError(f"the control plane refused to place {model.model_id} on "
                                    f"{gpu.gpu_id}: {', '.join(codes)}")
    fleet.replicas[replica.replica_id] = replica
    nodes = math.ceil(config.max_replicas * replica.tensor_parallel / config.gpus_per_node)
    mean_prompt = trace.prompt_tokens / len(trace.requests)
    mean_output = trace.output_tokens / len(trace.requests)
    fleet.service_tokens_per_second = config.service_tokens_per_second or round(
        service_tokens_per_second(replica.engine.costs, mean_prompt, mean_output), 1)
    commands: list[CommandBase] = [node(n) for n in range(2, nodes + 1)]
    commands += [place_command(config, model, n, start)
                 for n in range(2, config.initial_replicas + 1)]
    commands += _policies(config, fleet, replica.kv_capacity_tokens, start)
    for decided in control.run(commands):
        placed = replica_from(decided, fleet, 0.0) if decided.command_type == "PlaceReplica" else None
        if placed is not None:
            fleet.replicas[placed.replica_id] = placed
    ready = [MarkReplicaReady(command_id=f"ready-{rid}", at=start, actor="simulation", replica_id=rid)
             for rid in fleet.replicas]
    for decided in control.run(ready):
        fleet.replicas[decided.result["replica_id"]].state = ReplicaState.READY
    for replica in fleet.replicas.values():
        replica.ready_seconds = 0.0
    return fleet


def _policies(config: SimulationConfig, fleet: Fleet, kv_capacity_tokens: int,
              start: datetime) -> list[CommandBase]:
    admission = {"max_queued_requests": config.max_queued_requests,
                 # A request larger than one replica's KV could never run: shed it up front.
                 "max_tokens_per_request": min(MAX_TOKENS_PER_REQUEST, kv_capacity_tokens)}
    autoscaling = {"min_replicas": config.min_replicas, "max_replicas": config.max_replicas,
                   "service_tokens_per_second_per_replica": fleet.service_tokens_per_second}
    if not config.autoscale:
        autoscaling.update(min_replicas=config.initial_replicas,
                           max_replicas=config.initial_replicas)
    return [SetPolicy(command_id=f"policy-{name}", at=start, actor="simulation", name=name,
                      parameters=parameters)
            for name, parameters in (("admission", admission), ("autoscaling", autoscaling))]
