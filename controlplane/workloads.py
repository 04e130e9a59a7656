"""Deterministic mixed workloads: whole fleets of commands for tests, the demo and benchmarks.

A workload is a list of phases; each phase is a list of command payloads that may be decided
together, and phases must be decided in order (a phase may reference what earlier ones create).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

Payload = dict[str, Any]
EPOCH = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
BASELINE = {"revision": "stable", "mode": "canary", "warmed": True, "sample_count": 10_000,
            "quality_score": 0.90, "p95_ttft_seconds": 0.8, "p95_tpot_seconds": 0.10,
            "output_tokens_per_second": 330.0, "error_rate": 0.001}
CANDIDATE = {**BASELINE, "revision": "candidate", "sample_count": 1_000, "quality_score": 0.89,
             "output_tokens_per_second": 350.0, "error_rate": 0.002}


def at(seconds: float) -> str:
    return (EPOCH + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def inventory(nodes: int, gpus_per_node: int, prefix: str = "n") -> list[Payload]:
    """Nodes of H100-class GPUs spread over racks of four nodes."""
    return [{"type": "RegisterNode", "command_id": f"register-{prefix}{i:04d}",
             "node_id": f"{prefix}{i:04d}", "rack": f"rack-{i // 4}", "at": at(0),
             "gpus": [{"gpu_id": f"g{g}", "gpu_type": "H100-SXM-80GB", "memory_gib": 79.19,
                       "capabilities": ["bf16", "fp8"]} for g in range(gpus_per_node)]}
            for i in range(nodes)]


def model(model_id: str = "llama-8b", catalog_id: str = "meta-llama/Llama-3.1-8B") -> Payload:
    return {"type": "RegisterModel", "command_id": f"model-{model_id}", "model_id": model_id,
            "catalog_id": catalog_id, "at": at(0)}


def placement(replica_id: str, pool_id: str, model_id: str = "llama-8b", seconds: float = 1,
              **extra: Any) -> Payload:
    return {"type": "PlaceReplica", "command_id": f"place-{replica_id}", "replica_id": replica_id,
            "model_id": model_id, "pool_id": pool_id, "tensor_parallel_size": 1,
            "max_live_tokens_per_request": 8_192, "target_concurrency": 8, "at": at(seconds),
            **extra}


def ready(replica_id: str, seconds: float = 2) -> Payload:
    return {"type": "MarkReplicaReady", "command_id": f"ready-{replica_id}",
            "replica_id": replica_id, "at": at(seconds)}


def assessment(command_id: str, model_name: str, seconds: float = 1) -> Payload:
    """An 8B model's memory fit on one 80 GiB GPU: a decision that reads no fleet state
    (only the memory policy)."""
    return {"type": "AssessMemory", "command_id": command_id, "at": at(seconds),
            "model_name": model_name,
            "model": {"parameters": 8_030_261_248, "weight_bits": 16, "layers": 32, "kv_heads": 8,
                      "head_dim": 128},
            "deployment": {"gpu_memory_gib": 79.19, "tensor_parallel_size": 1, "kv_shards": 1,
                           "max_live_tokens_per_request": 8_192, "target_concurrency": 8,
                           "runtime_overhead_gib": 2.0}}


def observe(command_id: str, pool_id: str, seconds: float, arrival_tokens_per_second: float,
            queued_tokens: int = 0) -> Payload:
    return {"type": "ObserveLoad", "command_id": command_id, "pool_id": pool_id, "at": at(seconds),
            "observations": [{"observed_at": at(seconds), "queued_tokens": queued_tokens,
                              "arrival_tokens_per_second": arrival_tokens_per_second}]}


def rollout(rollout_id: str, pool_id: str, seconds: float) -> Payload:
    return {"type": "StartRollout", "command_id": f"start-{rollout_id}", "rollout_id": rollout_id,
            "pool_id": pool_id, "baseline_revision": "stable", "candidate_revision": "candidate",
            "at": at(seconds)}


def measurement(command_id: str, rollout_id: str, mode: str, seconds: float,
                **candidate: Any) -> Payload:
    return {"type": "RecordCanaryMeasurement", "command_id": command_id, "rollout_id": rollout_id,
            "baseline": BASELINE, "candidate": {**CANDIDATE, "mode": mode, **candidate},
            "at": at(seconds)}


def canary_ladder(rollout_id: str, pool_id: str, seconds: float,
                  regress: bool) -> list[list[Payload]]:
    """A rollout walked through shadow and canary, one rung per phase: its start, then a
    measurement per rung, each to be submitted once the previous one's evaluation is decided
    (evidence clears only the rung it was taken on). `regress` makes its canary TPOT regress."""
    steps = [("shadow", {}), ("shadow", {}), ("canary", {}),
             ("canary", {"p95_tpot_seconds": 0.3} if regress else {})]
    return [[rollout(rollout_id, pool_id, seconds)]] + [
        [measurement(f"{rollout_id}-m{i}", rollout_id, mode, seconds + i + 1, **extra)]
        for i, (mode, extra) in enumerate(steps)]


def two_canaries(pool_id: str, seconds: float) -> list[list[Payload]]:
    """A canary that promotes and one whose p95 TPOT regresses, rung by rung side by side."""
    return [good + bad for good, bad in zip(canary_ladder("canary-good", pool_id, seconds, False),
                                            canary_ladder("canary-bad", pool_id, seconds + 10, True),
                                            strict=True)]


def mixed_fleet(seed: int, requests: int, nodes: int = 16, gpus_per_node: int = 8,
                replicas: int = 8, pool_id: str = "chat") -> list[list[Payload]]:
    """Inventory, placements, admissions and releases, autoscaler ticks and two canaries.

    Roughly `2 * requests + nodes + replicas * 2 + requests // 100 + 12` decisions.
    """
    rng = random.Random(seed)
    phases: list[list[Payload]] = [inventory(nodes, gpus_per_node) + [model()] + [
        {"type": "SetPolicy", "command_id": "policy-autoscaling", "name": "autoscaling",
         "at": at(0), "parameters": {"min_replicas": 1, "max_replicas": replicas + 4,
                                     "service_tokens_per_second_per_replica": 2_000.0,
                                     "scale_up_cooldown_seconds": 30.0,
                                     "scale_down_stabilization_seconds": 120.0}}]]
    names = [f"{pool_id}-{i:03d}" for i in range(replicas)]
    phases.append([placement(name, pool_id) for name in names])
    phases.append([ready(name) for name in names])
    traffic: list[Payload] = []
    live: list[str] = []
    clock = 10.0
    for index in range(requests):
        clock += rng.expovariate(20.0)
        request_id = f"{pool_id}-req-{index:06d}"
        traffic.append({"type": "AdmitRequest", "command_id": f"admit-{request_id}",
                        "request_id": request_id, "pool_id": pool_id, "at": at(clock),
                        "prompt_tokens": rng.randint(50, 4_000),
                        "max_output_tokens": rng.randint(16, 1_000),
                        "deadline_at": at(clock + 30)})
        live.append(request_id)
        while live and (len(live) > 40 or rng.random() < 0.45):
            done = live.pop(rng.randrange(len(live)) if rng.random() < 0.3 else 0)
            traffic.append({"type": "ReleaseRequest", "command_id": f"release-{done}",
                            "request_id": done, "at": at(clock)})
        if index % 100 == 99:
            traffic.append(observe(f"tick-{index:06d}", pool_id, clock,
                                   rng.uniform(2_000, 30_000), rng.randint(0, 50_000)))
    traffic += [{"type": "ReleaseRequest", "command_id": f"release-{done}", "request_id": done,
                 "at": at(clock + 1)} for done in live]
    phases.append(traffic)
    phases.extend(two_canaries(pool_id, clock + 10))
    return phases


def admission_and_placement(seed: int, commands: int, pools: int = 4, nodes: int = 125,
                            placement_share: float = 0.2,
                            replicas_per_pool: int = 8) -> tuple[list[list[Payload]], list[Payload]]:
    """A fleet to decide against, then `commands` mixed admission and placement commands.

    The setup phases register `nodes` 8-GPU nodes, the model, and two ready replicas per pool.
    The traffic is exactly `commands` payloads: about `placement_share` of them place a
    single-GPU replica in a pool, or, once the pool has `replicas_per_pool` placed ones, release
    its oldest (freeing its GPUs); the rest admit and release requests over the `pools` pools,
    each release naming a request admitted earlier in the list.
    """
    rng = random.Random(seed)
    pool_ids = [f"pool-{p}" for p in range(pools)]
    seeded = [f"{pool}-r{i}" for pool in pool_ids for i in range(2)]
    setup = [inventory(nodes, 8) + [model()],
             [placement(name, name.rsplit("-r", 1)[0]) for name in seeded],
             [ready(name) for name in seeded]]
    traffic: list[Payload] = []
    live: list[str] = []
    placed: dict[str, list[str]] = {pool: [] for pool in pool_ids}
    clock = 10.0
    while len(traffic) < commands:
        clock += rng.expovariate(50.0)
        if rng.random() < placement_share:
            pool = rng.choice(pool_ids)
            if len(placed[pool]) >= replicas_per_pool:
                oldest = placed[pool].pop(0)
                traffic.append({"type": "ReleaseReplica", "command_id": f"release-{oldest}",
                                "replica_id": oldest, "at": at(clock)})
            else:
                name = f"{pool}-x{len(traffic):06d}"
                placed[pool].append(name)
                traffic.append(placement(name, pool, seconds=clock))
        elif live and (len(live) > 64 or rng.random() < 0.45):
            done = live.pop(rng.randrange(len(live)))
            traffic.append({"type": "ReleaseRequest", "command_id": f"release-{done}",
                            "request_id": done, "at": at(clock)})
        else:
            request_id = f"req-{len(traffic):06d}"
            traffic.append({"type": "AdmitRequest", "command_id": f"admit-{request_id}",
                            "request_id": request_id, "pool_id": rng.choice(pool_ids),
                            "at": at(clock), "prompt_tokens": rng.randint(50, 4_000),
                            "max_output_tokens": rng.randint(16, 1_000),
                            "deadline_at": at(clock + 30)})
            live.append(request_id)
    return setup, traffic
