"""Placement benchmark: one 8-GPU replica on a 1,000-node fleet, beside exhaustive search.

Run `python bench/placement_bench.py`. Seeded and bounded (well under a minute). It prints the
median decision time of `place_replica` on 1,000 nodes x 8 GPUs (goal: 5 ms or less) and of
`place_grouped` on the GPU index of the same fleet (the path decisions take; it must decide as
`place_replica` does on the index's inventory). Every GPU here has its own free memory, so
nodes rarely share a signature: the index's worst case. Then the exhaustive search over every
combination on the largest prefix of the same fleet it can finish inside its time budget, with
`place_replica` timed on that same inventory and the two choices compared.
`bench/placement_log_bench.py` times whole decisions through the log.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from fractions import Fraction
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.figures import Figure, add_figures_argument, write_figures  # noqa: E402
from controlplane.policies.placement import (  # noqa: E402
    GPU,
    PlacementRequest,
    domain_of,
    first_failed_gate,
    place_replica,
)
from controlplane.policies.placement_grouped import place_grouped  # noqa: E402
from controlplane.state.gpu_index import GpuIndex  # noqa: E402

SEED = 20240611
NODES = 1_000
GPUS_PER_NODE = 8
DECISIONS = 101
EXHAUSTIVE_BUDGET_SECONDS = 20.0
COMBINATIONS_PER_SECOND_GUESS = 150_000.0
MODEL = "model@abc"
REQUEST = PlacementRequest("replica-bench", MODEL, GPUS_PER_NODE, 40.0,
                           frozenset({"bf16", "fast-collective"}))


def build_fleet(rng: random.Random, nodes: int) -> list[GPU]:
    """A mixed fleet: busy and idle GPUs, older nodes without fast links, cordons, residents."""
    fleet = []
    for node in range(nodes):
        capabilities = rng.choice([frozenset({"bf16", "fast-collective"}),
                                   frozenset({"bf16", "fp8", "fast-collective"}),
                                   frozenset({"bf16"})])
        resident = frozenset({MODEL}) if rng.random() < 0.02 else frozenset()
        cordoned_node = rng.random() < 0.03
        for index in range(GPUS_PER_NODE):
            fleet.append(GPU(
                identifier=f"n{node:04d}-g{index}", node=f"n{node:04d}",
                free_memory_gib=rng.choice([0.0, 12.5, 24.0, 39.5, 40.0, 55.0, 70.0, 80.0]),
                capabilities=capabilities, resident_models=resident,
                rack=f"r{node // 16:03d}", cordoned=cordoned_node,
                reserved=rng.random() < 0.05))
    return fleet


def indexed(fleet: Sequence[GPU]) -> GpuIndex:
    """The GPU index of `fleet`, fed node rows as the node projection holds them."""
    rows: dict[str, dict[str, object]] = {}
    for gpu in fleet:
        row = rows.setdefault(gpu.node, {"rack": gpu.rack, "link_domain": gpu.link_domain,
                                         "cordoned": gpu.cordoned, "gpus": {}})
        row["gpus"][gpu.identifier.split("-", 1)[1]] = {  # type: ignore[index]
            "memory_gib": gpu.free_memory_gib, "capabilities": sorted(gpu.capabilities),
            "resident_models": sorted(gpu.resident_models),
            "reserved_by": "other" if gpu.reserved else None}
    index = GpuIndex(1.0)
    for node, row in rows.items():
        index.apply(node, row)
    return index


def exhaustive(request: PlacementRequest, inventory: Sequence[GPU]) -> tuple[str, ...]:
    """Score every combination of eligible GPUs with the same objective, keep the best."""
    eligible = [g for g in inventory if first_failed_gate(g, request) is None]
    per_domain: dict[str, int] = {}
    for g in eligible:
        per_domain[domain_of(g, request.locality)] = per_domain.get(
            domain_of(g, request.locality), 0) + 1
    best = None
    for combo in combinations(eligible, request.gpus_required):
        domains = {domain_of(g, request.locality) for g in combo}
        if len(domains) != 1:
            continue
        key = (-sum(request.model_revision in g.resident_models for g in combo),
               per_domain[domains.pop()] - request.gpus_required,
               sum((Fraction(g.free_memory_gib) for g in combo), Fraction(0)),
               tuple(sorted(g.identifier for g in combo)))
        best = key if best is None or key < best else best
    return best[3] if best else ()


def timed(function: object, *args: object) -> tuple[float, object]:
    start = time.perf_counter()
    result = function(*args)  # type: ignore[operator]
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_figures_argument(parser)
    args = parser.parse_args()
    rng = random.Random(SEED)
    fleet = build_fleet(rng, NODES)
    place_replica(REQUEST, fleet)  # warm caches and imports before timing
    seconds = [timed(place_replica, REQUEST, fleet)[0] for _ in range(DECISIONS)]
    decision = place_replica(REQUEST, fleet)
    median_ms = statistics.median(seconds) * 1000
    index = indexed(fleet)
    grouped_seconds = [timed(place_grouped, REQUEST, index)[0] for _ in range(DECISIONS)]
    grouped_ms = statistics.median(grouped_seconds) * 1000
    # The index names GPUs `node:gpu` as the node projection does; compare on its inventory.
    grouped_same = place_grouped(REQUEST, index) == place_replica(REQUEST, index.inventory())

    # Grow a prefix of the same fleet while the projected exhaustive run fits the budget.
    largest = None
    spent = 0.0
    rate = COMBINATIONS_PER_SECOND_GUESS
    for nodes in range(2, NODES + 1):
        prefix = fleet[:nodes * GPUS_PER_NODE]
        eligible = sum(first_failed_gate(g, REQUEST) is None for g in prefix)
        combos = math.comb(eligible, REQUEST.gpus_required)
        if spent + combos / rate > EXHAUSTIVE_BUDGET_SECONDS:
            break
        elapsed, chosen = timed(exhaustive, REQUEST, prefix)
        spent += elapsed
        rate = max(combos / max(elapsed, 1e-9), 1.0) if combos > 1_000 else rate
        ours_elapsed, ours = timed(place_replica, REQUEST, prefix)
        largest = (nodes, len(prefix), eligible, combos, elapsed, ours_elapsed,
                   chosen == ours.gpu_ids)  # type: ignore[attr-defined]

    print(f"placement benchmark (seed {SEED})")
    print(f"{'search':<12}{'nodes':>7}{'GPUs':>7}{'eligible':>10}{'combinations':>15}"
          f"{'time ms':>12}  result")
    print(f"{'ours':<12}{NODES:>7}{len(fleet):>7}"
          f"{sum(first_failed_gate(g, REQUEST) is None for g in fleet):>10}{'-':>15}"
          f"{median_ms:>12.3f}  median of {DECISIONS}; goal <= 5 ms: "
          f"{'met' if median_ms <= 5 else 'MISSED'}; chose {decision.locality_domain}")
    print(f"{'ours, index':<12}{NODES:>7}{len(fleet):>7}{'':>10}{'-':>15}"
          f"{grouped_ms:>12.3f}  median of {DECISIONS}; {median_ms / grouped_ms:.0f}x faster than "
          f"the scan; same decision: {grouped_same}")
    figures = [Figure(f"placement policy, {NODES:,} nodes x {GPUS_PER_NODE} GPUs, median ms "
                      "(on the GPU index)", grouped_ms, median_ms, "ms", "the same policy scanning "
                      "every GPU", "same decision", grouped_same)]
    if largest is None:
        write_figures(args.figures_out, figures)
        print("exhaustive: no inventory finished inside the budget")
        return
    nodes, gpus, eligible, combos, elapsed, ours_elapsed, same = largest
    figures.append(Figure(f"placement policy vs exhaustive search, {nodes} nodes, ms",
                          ours_elapsed * 1000, elapsed * 1000, "ms",
                          "exhaustive search, largest fleet it finishes", "same group", same))
    write_figures(args.figures_out, figures)
    print(f"{'exhaustive':<12}{nodes:>7}{gpus:>7}{eligible:>10}{combos:>15,}"
          f"{elapsed * 1000:>12.1f}  largest inventory finished in budget")
    print(f"{'ours':<12}{nodes:>7}{gpus:>7}{eligible:>10}{'-':>15}"
          f"{ours_elapsed * 1000:>12.3f}  same group as exhaustive: {same}")


if __name__ == "__main__":
    main()
