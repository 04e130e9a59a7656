"""Placement through the log: 1,000 nodes x 8 GPUs, decided with the atomic reservation.

Run `python bench/placement_log_bench.py [--nodes N] [--placements N] [--postgres-url URL]
[--json]`. On a log of its own (SQLite in a temporary directory; PostgreSQL in a
`fleet_bench_<random>` database on `--postgres-url`'s server, default FLEET_TEST_DATABASE_URL,
dropped after) it registers the fleet and a model, accepts every command untimed, then times
`controlplane.service.decide` (state read, policy, `ReplicaPlaced` plus `GpusReserved` on each
node stream appended in one transaction, projections updated, commit):

  - batched: 2,000 single-GPU and 300 multi-GPU (2, 4 and 8 GPU) placements, seeded order, in
    jobs of `--batch-size` command ids as workers decide them: placements per second;
  - arriving: `--arriving` single-GPU placements accepted batch by batch through another
    engine (as `fleetctl submit` in another process would), each batch decided after its
    accept: the deciders find the log moved every time (their cache cannot be trusted);
  - one at a time: `--singles` further placements, one `decide` call (one transaction) each:
    the median and p95 decision time;
  - in the same run, on the state just before every tenth of those decisions: the pure policy
    `place_replica` scanning every GPU, and `place_grouped` on the GPU index, with the check that
    both choose the GPUs the log recorded;
  - the decide floor: one-at-a-time `AssessMemory` decisions (no fleet state) on the same log.

Then every GPU must be reserved at most once, `replay --verify` must re-derive every decision
identically and the rebuilt projections must equal the live ones.
Goals (issue 8): median decision time under 2 ms and at least 500 placements per second.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    DEFAULT_POSTGRES_URL,
    BenchSkipped,
    count,
    postgres_database,
)
from bench.figures import add_figures_argument, write_figures  # noqa: E402
from bench.machine import load_average  # noqa: E402
from bench.placement_log_results import figures, table  # noqa: E402
from controlplane.commands import command_adapter  # noqa: E402
from controlplane.faults.invariants import gpu_holds  # noqa: E402
from controlplane.handlers.placement import inventory  # noqa: E402
from controlplane.logging import configure_logging  # noqa: E402
from controlplane.policies.placement import Locality, PlacementRequest, place_replica  # noqa: E402
from controlplane.policies.placement_grouped import place_grouped  # noqa: E402
from controlplane.replay import compare_with_live  # noqa: E402
from controlplane.replay.verify import verify_decisions  # noqa: E402
from controlplane.runtime import open_store  # noqa: E402
from controlplane.service import accept, decide  # noqa: E402
from controlplane.state.fleet import NODE  # noqa: E402
from controlplane.state.gpu_index import gpu_index  # noqa: E402
from controlplane.workloads import assessment, model, placement  # noqa: E402
from controlplane.workloads import inventory as node_commands  # noqa: E402
from events.projections import MemoryProjections, SqlProjections  # noqa: E402
from events.store import EventStore  # noqa: E402

SEED = 20261201
# Multi-GPU placements per single-GPU one in the batched phase, by tensor-parallel width.
MULTI_GPU_SHARE = {2: 0.075, 4: 0.05, 8: 0.025}
POLICY_SAMPLE_EVERY = 10
FLOOR_DECISIONS = 100


def validated(payloads: list[dict[str, Any]]) -> list[Any]:
    return [command_adapter.validate_python(p) for p in payloads]


def accept_all(store: EventStore, payloads: list[dict[str, Any]]) -> list[str]:
    ids: list[str] = []
    for start in range(0, len(payloads), 2_000):
        ids += accept(store, validated(payloads[start:start + 2_000]))
    return ids


def placements(rng: random.Random, prefix: str, singles: int, multi: dict[int, int],
               pools: int) -> list[dict[str, Any]]:
    """Seeded PlaceReplica payloads: `singles` one-GPU replicas and `multi` wider ones."""
    widths = [1] * singles + [tp for tp, count in multi.items() for _ in range(count)]
    rng.shuffle(widths)
    return [placement(f"{prefix}{i:05d}", f"pool-{rng.randrange(pools):02d}", seconds=1 + i,
                      tensor_parallel_size=tp) for i, tp in enumerate(widths)]


def milliseconds(samples: list[float]) -> tuple[float, float]:
    """(median, p95) of `samples` seconds, in milliseconds."""
    ordered = sorted(samples)
    return (statistics.median(ordered) * 1000,
            ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))] * 1000)


def timed(function: Callable[[], object]) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def nodes_now(store: EventStore) -> MemoryProjections:
    """The node rows as committed, read on a connection of their own (not the deciders')."""
    state = MemoryProjections()
    with store.engine.connect() as conn:
        for key, row in SqlProjections(conn).items(NODE):
            state.put(NODE, key, row)
    return state


def policy_sample(store: EventStore, command_id: str, before: MemoryProjections,
                  fraction: float) -> tuple[float, float, bool]:
    """Both pure policies on the state before the recorded decision: (scan s, index s, same)."""
    decided = next(e for e in store.events_for_command(command_id)
                   if e.event_type in ("ReplicaPlaced", "PlacementRefused"))
    command, result = decided.data["inputs"]["command"], decided.data["result"]
    request = PlacementRequest(command["replica_id"], command["model_id"], result["tensor_parallel"],
                               result["memory"]["required_gib_per_gpu"],
                               frozenset(command["required_capabilities"]),
                               Locality(command["locality"]))
    gpus = inventory(before, fraction)
    index = gpu_index(before, fraction)
    scan_seconds = timed(lambda: place_replica(request, gpus))
    index_seconds = timed(lambda: place_grouped(request, index))
    recorded = sorted(f"{node}:{gpu}" for node, ids in result.get("gpus", {}).items() for gpu in ids)
    same = list(place_replica(request, gpus).gpu_ids) == recorded == list(
        place_grouped(request, index).gpu_ids)
    return scan_seconds, index_seconds, same


def held_at_most_once(store: EventStore) -> tuple[int, bool]:
    """(GPUs reserved now, whether no GPU is held twice), folded by hand from the log."""
    held = gpu_holds(store.read_all())
    return sum(held.values()), all(count in (0, 1) for count in held.values())


def run(url: str, label: str, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(SEED)
    store = open_store(url)
    setup = node_commands(args.nodes, args.gpus_per_node) + [model()]
    ids = accept_all(store, setup)
    for start in range(0, len(ids), 500):
        decide(store, ids[start:start + 500])
    multi = {tp: round(args.placements * share) for tp, share in MULTI_GPU_SHARE.items()}
    batched_ids = accept_all(store, placements(rng, "b", args.placements, multi, args.pools))
    arriving = placements(rng, "a", args.arriving, {}, args.pools)
    single_ids = accept_all(store, placements(rng, "s", args.singles, {}, args.pools))
    floor_ids = accept_all(store, [assessment(f"floor-{i}", f"floor-model-{i}")
                                 for i in range(FLOOR_DECISIONS)])

    started = time.perf_counter()
    for start in range(0, len(batched_ids), args.batch_size):
        decide(store, batched_ids[start:start + args.batch_size])
    batched_seconds = time.perf_counter() - started

    # Commands arriving from another process (its own engine and store, as `fleetctl submit`
    # would be): each batch finds the log moved, so its deciders cannot trust their cache.
    inbox = open_store(url)
    arriving_seconds = 0.0
    for start in range(0, len(arriving), args.batch_size):
        ids = accept_all(inbox, arriving[start:start + args.batch_size])
        arriving_seconds += timed(lambda ids=ids: decide(store, ids))
    inbox.engine.dispose()

    single_seconds, scan_seconds, index_seconds, all_same = [], [], [], True
    for number, command_id in enumerate(single_ids):
        before = nodes_now(store) if number % POLICY_SAMPLE_EVERY == 0 else None
        single_seconds.append(timed(lambda command_id=command_id: decide(store, [command_id])))
        if before is not None:
            scan, indexed, same = policy_sample(store, command_id, before, 0.90)
            scan_seconds.append(scan)
            index_seconds.append(indexed)
            all_same = all_same and same
    floor_seconds = [timed(lambda command_id=command_id: decide(store, [command_id]))
                     for command_id in floor_ids]

    reserved, exclusive = held_at_most_once(store)
    checks: dict[str, Any] = {"gpus_reserved": reserved, "no_gpu_held_twice": exclusive,
                              "policies_chose_recorded_gpus": all_same}
    if args.verify:
        verify_started = time.perf_counter()
        report = verify_decisions(store)
        checks.update(verified_decisions=report.decisions_checked, drifts=len(report.drifts),
                      rebuild_equals_live=compare_with_live(store) == [],
                      verify_seconds=round(time.perf_counter() - verify_started, 2))
    store.engine.dispose()
    median_ms, p95_ms = milliseconds(single_seconds)
    scan_ms, _ = milliseconds(scan_seconds)
    index_ms, _ = milliseconds(index_seconds)
    floor_ms, _ = milliseconds(floor_seconds)
    return {"store": label, "nodes": args.nodes, "gpus": args.nodes * args.gpus_per_node,
            "batched_placements": len(batched_ids), "batch_size": args.batch_size,
            "batched_seconds": round(batched_seconds, 3),
            "placements_per_second": round(len(batched_ids) / batched_seconds, 1),
            "batched_ms_per_decision": round(batched_seconds / len(batched_ids) * 1000, 3),
            "arriving_placements": len(arriving),
            "arriving_per_second": round(len(arriving) / arriving_seconds, 1),
            "single_decisions": len(single_ids), "single_median_ms": round(median_ms, 3),
            "single_p95_ms": round(p95_ms, 3), "policy_samples": len(scan_seconds),
            "pure_scan_median_ms": round(scan_ms, 3), "pure_index_median_ms": round(index_ms, 3),
            "decide_floor_median_ms": round(floor_ms, 3), **checks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=count(), default=1_000)
    parser.add_argument("--gpus-per-node", type=count(), default=8)
    parser.add_argument("--placements", type=count(), default=2_000,
                        help="single-GPU placements in the batched phase (plus 15%% multi-GPU)")
    parser.add_argument("--singles", type=count(), default=300, help="one-at-a-time placements")
    parser.add_argument("--arriving", type=count(), default=1_000,
                        help="placements accepted by another process batch by batch")
    parser.add_argument("--pools", type=count(), default=50, help="pools the replicas are spread over")
    parser.add_argument("--batch-size", type=count(), default=200)
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL,
                        help="a PostgreSQL server to run on too, in a database of its own "
                             "(default FLEET_TEST_DATABASE_URL, else the local server; skipped "
                             "when unreachable)")
    parser.add_argument("--no-verify", dest="verify", action="store_false")
    parser.add_argument("--json", action="store_true")
    add_figures_argument(parser)
    args = parser.parse_args()
    configure_logging("WARNING")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        results.append(run(f"sqlite:///{scratch}/placement.db", "sqlite", args))
    if args.postgres_url:
        try:
            with postgres_database(args.postgres_url) as url:
                results.append(run(url, "postgres", args))
        except BenchSkipped as skipped:
            print(f"postgres skipped: {skipped}", file=sys.stderr)
    write_figures(args.figures_out, figures(results))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"placement through the log (seed {SEED}, {args.nodes:,} nodes x {args.gpus_per_node} GPUs,"
          f" {args.pools} pools, load average {load_average()})")
    print(table(results))


if __name__ == "__main__":
    main()
