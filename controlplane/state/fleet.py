"""Fleet read models: nodes and their GPUs, models, replicas, pools' serving capacity, policies.

Every projector folds recorded facts only; reservations and releases carry the GPUs they touch,
so rebuilding never needs a policy.
"""

from __future__ import annotations

from typing import Any

from controlplane.state.base import Projector
from events.model import RecordedEvent
from events.projections import StateStore

NODE, MODEL, REPLICA, POOL, POLICY, ENTITY = "node", "model", "replica", "pool", "policy", "entity"

NODE_REGISTERED = "NodeRegistered"
NODE_CORDONED = "NodeCordoned"
MODEL_REGISTERED = "ModelRegistered"
POLICY_SET = "PolicySet"
REPLICA_PLACED = "ReplicaPlaced"
PLACEMENT_REFUSED = "PlacementRefused"
GPUS_RESERVED = "GpusReserved"
GPUS_RELEASED = "GpusReleased"
REPLICA_RELEASED = "ReplicaReleased"
REPLICA_READY = "ReplicaReady"


def _result(event: RecordedEvent) -> dict[str, Any]:
    result: dict[str, Any] = event.data["result"]
    return result


def _node_registered(state: StateStore, event: RecordedEvent) -> None:
    node = _result(event)
    state.put(NODE, node["node_id"], {
        "node_id": node["node_id"], "rack": node["rack"], "link_domain": node["link_domain"],
        "cordoned": False,
        "gpus": {gpu["gpu_id"]: {**gpu, "reserved_by": None, "resident_models": []}
                 for gpu in node["gpus"]},
    })
    state.put(ENTITY, f"node/{node['node_id']}", {"position": event.position})


def _node_cordoned(state: StateStore, event: RecordedEvent) -> None:
    node_id = _result(event)["node_id"]
    node = state.get(NODE, node_id)
    if node is not None:
        state.put(NODE, node_id, {**node, "cordoned": True})


def _model_registered(state: StateStore, event: RecordedEvent) -> None:
    model = _result(event)
    state.put(MODEL, model["model_id"], model)
    state.put(ENTITY, f"model/{model['model_id']}", {"position": event.position})


def _policy_set(state: StateStore, event: RecordedEvent) -> None:
    policy = _result(event)
    state.put(POLICY, policy["name"], {"version": policy["version"],
                                       "parameters": policy["parameters"],
                                       "event_id": event.event_id})


def _gpus_changed(state: StateStore, event: RecordedEvent) -> None:
    change = _result(event)
    node = state.get(NODE, change["node_id"])
    if node is None:
        return
    gpus = dict(node["gpus"])
    for gpu_id in change["gpu_ids"]:
        gpu = dict(gpus[gpu_id])
        if event.event_type == GPUS_RESERVED:
            gpu["reserved_by"] = change["replica_id"]
        else:
            gpu["reserved_by"] = None
            # The weights stay cached on the GPU: a later replica of the model loads faster.
            gpu["resident_models"] = [change["model_id"]]
        gpus[gpu_id] = gpu
    state.put(NODE, change["node_id"], {**node, "gpus": gpus})


def _pool(state: StateStore, pool_id: str) -> dict[str, Any]:
    return state.get(POOL, pool_id) or {"pool_id": pool_id, "ready": {}, "warming": {},
                                         "live_token_budget": 0}


def _put_pool(state: StateStore, pool: dict[str, Any]) -> None:
    pool["live_token_budget"] = sum(pool["ready"].values())
    state.put(POOL, pool["pool_id"], pool)
    state.put(ENTITY, f"pool/{pool['pool_id']}", {})


def _replica_placed(state: StateStore, event: RecordedEvent) -> None:
    replica = _result(event)
    state.put(REPLICA, replica["replica_id"], {**replica, "state": "warming",
                                               "decision_event_id": event.event_id})
    state.put(ENTITY, f"replica/{replica['replica_id']}", {})
    pool = _pool(state, replica["pool_id"])
    pool["warming"] = {**pool["warming"], replica["replica_id"]: replica["kv_capacity_tokens"]}
    _put_pool(state, pool)


def _replica_ready(state: StateStore, event: RecordedEvent) -> None:
    replica_id = _result(event)["replica_id"]
    replica = state.get(REPLICA, replica_id)
    if replica is None:
        return
    state.put(REPLICA, replica_id, {**replica, "state": "ready"})
    pool = _pool(state, replica["pool_id"])
    warming = dict(pool["warming"])
    tokens = warming.pop(replica_id, replica["kv_capacity_tokens"])
    pool.update(warming=warming, ready={**pool["ready"], replica_id: tokens})
    _put_pool(state, pool)


def _replica_released(state: StateStore, event: RecordedEvent) -> None:
    replica_id = _result(event)["replica_id"]
    replica = state.get(REPLICA, replica_id)
    if replica is None:
        return
    state.put(REPLICA, replica_id, {**replica, "state": "released"})
    pool = _pool(state, replica["pool_id"])
    pool["ready"] = {k: v for k, v in pool["ready"].items() if k != replica_id}
    pool["warming"] = {k: v for k, v in pool["warming"].items() if k != replica_id}
    _put_pool(state, pool)


PROJECTORS: dict[str, list[Projector]] = {
    NODE_REGISTERED: [_node_registered],
    NODE_CORDONED: [_node_cordoned],
    MODEL_REGISTERED: [_model_registered],
    POLICY_SET: [_policy_set],
    GPUS_RESERVED: [_gpus_changed],
    GPUS_RELEASED: [_gpus_changed],
    REPLICA_PLACED: [_replica_placed],
    REPLICA_READY: [_replica_ready],
    REPLICA_RELEASED: [_replica_released],
}
