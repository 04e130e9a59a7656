"""Builders of valid commands and events for tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from events.model import NewEvent, StreamAppend, derived_event_id


def assess_memory(command_id: str, *, parameters: int = 8_000_000_000, layers: int = 32,
                  gpu_memory_gib: float = 40.0, max_live_tokens: int = 4_096,
                  concurrency: int = 8, usable_fraction: float | None = None,
                  model_name: str | None = None) -> dict[str, Any]:
    deployment: dict[str, Any] = {
        "gpu_memory_gib": gpu_memory_gib, "tensor_parallel_size": 1, "kv_shards": 1,
        "max_live_tokens_per_request": max_live_tokens, "target_concurrency": concurrency,
        "runtime_overhead_gib": 4.0,
    }
    if usable_fraction is not None:
        deployment["usable_fraction"] = usable_fraction
    return {
        "type": "AssessMemory", "command_id": command_id,
        "at": "2026-11-30T12:00:00Z",
        "model_name": model_name or f"model-{command_id}",
        "model": {"parameters": parameters, "weight_bits": 16, "layers": layers,
                  "kv_heads": 8, "head_dim": 128},
        "deployment": deployment,
    }


def event(slot: str, data: dict[str, Any] | None = None, command_id: str = "cmd") -> NewEvent:
    return NewEvent(event_id=derived_event_id(command_id, slot), event_type="Tested",
                    data=data if data is not None else {"slot": slot},
                    occurred_at="2026-11-30T12:00:00Z", command_id=command_id)


def append_marker(tx: Any) -> None:
    """Append an event of its own to the transaction `tx`: projection rows a test writes by
    hand must move the log head with them, as every real change does."""
    marker = NewEvent(event_id=str(uuid.uuid4()), event_type="Tested", data={},
                      occurred_at="2026-11-30T12:00:00Z", command_id="marker")
    tx.append([StreamAppend("test/markers", None, [marker])])


def register_node(node_id: str, gpus: int = 4, memory_gib: float = 80.0, rack: str = "rack-0",
                  capabilities: tuple[str, ...] = ("bf16",)) -> dict[str, Any]:
    return {"type": "RegisterNode", "command_id": f"register-{node_id}", "node_id": node_id,
            "rack": rack, "at": "2026-11-30T12:00:00Z",
            "gpus": [{"gpu_id": f"g{i}", "gpu_type": "H100-SXM-80GB", "memory_gib": memory_gib,
                      "capabilities": list(capabilities)} for i in range(gpus)]}


def register_model(model_id: str = "llama-8b", catalog_id: str = "meta-llama/Llama-3.1-8B") \
        -> dict[str, Any]:
    return {"type": "RegisterModel", "command_id": f"model-{model_id}", "model_id": model_id,
            "catalog_id": catalog_id, "at": "2026-11-30T12:00:00Z"}


def place_replica(replica_id: str, model_id: str = "llama-8b", pool_id: str = "chat",
                  tp: int | None = 1, **extra: Any) -> dict[str, Any]:
    payload = {"type": "PlaceReplica", "command_id": f"place-{replica_id}",
               "replica_id": replica_id, "model_id": model_id, "pool_id": pool_id,
               "max_live_tokens_per_request": 4_096, "target_concurrency": 4,
               "at": "2026-11-30T12:00:00Z", **extra}
    if tp is not None:
        payload["tensor_parallel_size"] = tp
    return payload


def wall_clock_after(seconds: float) -> Callable[[], str]:
    """A stand-in for `events.transaction.wall_clock` running `seconds` ahead of this machine's
    clock: how a test lets a lease run out on the control plane's clock without waiting."""
    def clock() -> str:
        return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat(timespec="microseconds")
    return clock
