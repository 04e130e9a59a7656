"""Inventory, model and policy handlers: the facts placement decides on."""

from __future__ import annotations

from typing import Any

from controlplane.catalog.architecture import Architecture
from controlplane.catalog.registry import load_catalog
from controlplane.catalog.sizing import model_memory
from controlplane.catalog.subject import serving_weight_dtype
from controlplane.commands.base import CommandBase
from controlplane.commands.fleet import CordonNode, DrainNode, RegisterModel, RegisterNode, SetPolicy
from controlplane.decisions import (
    DecisionContext,
    append_to,
    decision_data,
    merge_appends,
    new_event,
    rejection,
)
from controlplane.errors import InputError
from controlplane.handlers.admission_promotion import promote_on_policy
from controlplane.handlers.base import Handler, Precheck, RefuseExisting, Streams
from controlplane.handlers.placement import release_events
from controlplane.policies.memory import ModelMemory
from controlplane.policies.reasons import PolicyInputError, Reason, to_plain
from controlplane.policy_book import validate_parameters
from controlplane.state.fleet import (
    MODEL,
    MODEL_REGISTERED,
    NODE,
    NODE_CORDONED,
    NODE_REGISTERED,
    POLICY_SET,
    REPLICA,
)
from events.model import StreamAppend
from events.projections import StateView

CATALOG_STREAM = "catalog"  # every model registration's decision
KV_ELEMENT_BYTES = 2  # a registered model's KV cache is sized at 16 bits an element


def handle_register_node(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Record a node and its GPUs; a node id is registered once."""
    assert isinstance(command, RegisterNode)
    stream = f"node/{command.node_id}"
    if ctx.state.get(NODE, command.node_id) is not None:
        return rejection(command, ctx, PolicyInputError(
            "node_already_registered", "node_id", f"node {command.node_id} is already registered"),
            stream)
    node = {"node_id": command.node_id, "rack": command.rack,
            "link_domain": command.link_domain or command.node_id,
            "gpus": [gpu.model_dump() for gpu in command.gpus]}
    reason = Reason("node_registered", f"node {command.node_id} joins with {len(command.gpus)} GPU(s)",
                    {"gpus": len(command.gpus),
                     "memory_gib": sum(gpu.memory_gib for gpu in command.gpus)})
    data = decision_data(outcome="registered", reasons=[reason], result=node, policy=None,
                         inputs=command.payload(), ctx=ctx)
    return [append_to(stream, ctx, new_event(command, ctx, "decision", NODE_REGISTERED, data))]


def handle_cordon_node(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Cordon a node: no new replica lands on it."""
    assert isinstance(command, CordonNode)
    reason = Reason("node_cordoned", f"node {command.node_id} takes no new replicas",
                    {"operator_reason": command.reason})
    data = decision_data(outcome="cordoned", reasons=[reason], result={"node_id": command.node_id},
                         policy=None, inputs=command.payload(), ctx=ctx)
    return [append_to(f"node/{command.node_id}", ctx,
                      new_event(command, ctx, "decision", NODE_CORDONED, data))]


def handle_drain_node(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Cordon a node and release every live replica on it, in one transaction."""
    assert isinstance(command, DrainNode)
    node = ctx.state.get(NODE, command.node_id) or {"gpus": {}}
    replicas = sorted({gpu["reserved_by"] for gpu in node["gpus"].values() if gpu["reserved_by"]})
    reason = Reason("node_drained", f"node {command.node_id} cordoned; {len(replicas)} replica(s) released",
                    {"released_replicas": replicas, "operator_reason": command.reason})
    data = decision_data(outcome="drained", reasons=[reason],
                         result={"node_id": command.node_id, "released_replicas": replicas},
                         policy=None, inputs=command.payload(), ctx=ctx)
    decision = new_event(command, ctx, "decision", NODE_CORDONED, data)
    appends = [append_to(f"node/{command.node_id}", ctx, decision)]
    for replica_id in replicas:
        replica = ctx.state.get(REPLICA, replica_id)
        if replica is not None:
            appends = merge_appends(appends, release_events(command, ctx, replica, "node_drained",
                                                     decision.event_id))
    return appends


def handle_register_model(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Record a model's memory architecture, resolved from the catalog or as declared.

    The catalog entry used, or the error reading it raised, is recorded in the decision's
    inputs, and re-derivation takes it from there (`DecisionContext.read_outside`): a later
    change to the catalog files, or their absence, changes no recorded registration.
    """
    assert isinstance(command, RegisterModel)
    if ctx.state.get(MODEL, command.model_id) is not None:
        return rejection(command, ctx, PolicyInputError(
            "model_already_registered", "model_id", f"model {command.model_id} already registered"),
            CATALOG_STREAM)
    if command.memory is not None:
        memory = command.memory.model_dump()
        source = "declared"
    else:
        catalog_id = command.catalog_id or ""
        try:  # read from the catalog files live, from the recorded decision in replay
            entry = ctx.read_outside(f"catalog:{catalog_id}",
                                     lambda: _catalog_entry(catalog_id, command.weight_bits))
        except PolicyInputError as error:
            return rejection(command, ctx, error, CATALOG_STREAM)
        bits = command.weight_bits if command.weight_bits is not None else entry["checkpoint_bits"]
        memory = to_plain(ModelMemory(
            parameters=entry["parameters"], weight_bits=bits, layers=entry["layers"],
            kv_heads=entry["kv_heads"], head_dim=entry["head_dim"],
            kv_element_bytes=KV_ELEMENT_BYTES, kv_latent_dim=entry["kv_latent_dim"]))
        source = f"catalog:{entry['model_id']}"
    model = {"model_id": command.model_id, "source": source, "memory": memory}
    if command.memory is None and "attention_heads" in entry:  # recorded reads before rules 4
        model["attention_heads"] = entry["attention_heads"]  # lack it: registered as they were
    reason = Reason("model_registered", f"model {command.model_id} registered from {source}",
                    {"parameters": memory["parameters"], "layers": memory["layers"]})
    data = decision_data(outcome="registered", reasons=[reason], result=model, policy=None,
                         inputs=command.payload(), ctx=ctx)
    return [append_to(CATALOG_STREAM, ctx,
                      new_event(command, ctx, "decision", MODEL_REGISTERED, data))]


def _catalog_entry(catalog_id: str, weight_bits: int | None) -> dict[str, Any]:
    """What a registration uses of the catalog model `catalog_id` names, as plain data: its id,
    the figures its memory is sized from (`model_memory`) and, without `weight_bits`, the bits
    per weight its checkpoint is served in. A catalog that cannot be read, or an id it does not
    resolve, raises `PolicyInputError`."""
    entry = load_catalog().model(catalog_id)
    bits = weight_bits if weight_bits is not None else _checkpoint_bits(entry.architecture)
    sized = model_memory(entry.architecture, entry.parameters.total, bits, KV_ELEMENT_BYTES)
    read = {"model_id": entry.model_id, "parameters": sized.parameters, "layers": sized.layers,
            "kv_heads": sized.kv_heads, "head_dim": sized.head_dim,
            "kv_latent_dim": sized.kv_latent_dim,
            "attention_heads": entry.architecture.attention_heads}
    if weight_bits is None:
        read["checkpoint_bits"] = bits
    return read


def _checkpoint_bits(architecture: Architecture) -> int:
    """Bits per weight of the format the checkpoint is served in, as `fleetctl fit` takes it;
    a checkpoint quantized to a format its config does not tell is refused naming weight_bits."""
    try:
        return serving_weight_dtype(architecture).bits
    except PolicyInputError as error:
        raise PolicyInputError(error.code, "weight_bits", error.message) from None


def policy_stream(name: str) -> str:
    """The stream of a policy's versions."""
    return f"policy/{name}"


def handle_set_policy(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """A new version of a policy; decisions after it record the version they used. A new
    admission version that grows pools' budgets promotes their queues in the same decision."""
    assert isinstance(command, SetPolicy)
    stream = policy_stream(command.name)
    version = ctx.stream_version(stream) + 1
    parameters = validate_parameters(command.name, command.parameters)
    reason = Reason("policy_version_set", f"{command.name} policy version {version}",
                    {"version": version})
    data = decision_data(outcome="set", reasons=[reason],
                         result={"name": command.name, "version": version, "parameters": parameters},
                         policy=None, inputs=command.payload(), ctx=ctx)
    decided = new_event(command, ctx, "decision", POLICY_SET, data)
    appends = [append_to(stream, ctx, decided)]
    if command.name == "admission":  # a larger budget fraction admits what now fits
        in_force = ctx.policies.after_set(command.name, version, parameters)
        appends += promote_on_policy(command, ctx, in_force, decided.event_id)
    return appends


def _set_policy_streams(command: CommandBase) -> list[str]:
    assert isinstance(command, SetPolicy)
    return [policy_stream(command.name)]


def precheck_set_policy(command: CommandBase, state: StateView) -> list[tuple[str, str]]:
    assert isinstance(command, SetPolicy)
    try:
        validate_parameters(command.name, command.parameters)
    except InputError as error:
        return [("parameters", str(error))]
    return []


HANDLERS: dict[str, Handler] = {
    "RegisterNode": handle_register_node,
    "CordonNode": handle_cordon_node,
    "DrainNode": handle_drain_node,
    "RegisterModel": handle_register_model,
    "SetPolicy": handle_set_policy,
}
# A policy change that promotes queued requests appends to their pools' and requests' streams
# too: those are read when first used.
STREAMS: dict[str, Streams] = {
    "RegisterModel": lambda command: [CATALOG_STREAM],
    "SetPolicy": _set_policy_streams,
}
# Versions of the decision rules, each with what changed (see `handlers/base.py`).
RULES_VERSIONS: dict[str, int] = {
    # 2: an admission policy version with a larger budget fraction promotes queue heads.
    # 3: a head needing more live tokens than its pool's largest replica holds is shed.
    "SetPolicy": 3,
    # 2: a catalog model registered without weight_bits takes its checkpoint's precision
    #    (DeepSeek-V3: FP8, 8 bits), as `fleetctl fit` does; the default was 16. Commands
    #    recorded before carry weight_bits 16 in their payload and re-derive unchanged.
    # 3: the catalog entry used (or why it could not be read) is recorded in the decision's
    #    inputs (`outside_reads`), and re-derivation uses it instead of today's catalog files.
    # 4: a catalog model's record holds its attention heads, so a placement is never given a
    #    tensor-parallel width they do not split over.
    "RegisterModel": 4,
    # 2: each released replica's freed GPUs follow its release in the log (they had all been
    #    recorded with the cordon, before the releases that caused them).
    "DrainNode": 2,
}
PRECHECKS: dict[str, Precheck] = {
    "SetPolicy": precheck_set_policy,
    "RegisterNode": RefuseExisting(NODE, "node_id", "node"),
    "RegisterModel": RefuseExisting(MODEL, "model_id", "model"),
}
