"""What `placement_log_bench.py` reports: its table and its figures for `run_all.py`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.common import format_table
from bench.figures import Figure

GOAL_MEDIAN_MS = 2.0
GOAL_PER_SECOND = 500.0


def figures(results: list[dict[str, Any]]) -> list[Figure]:
    """Per store: placements/s and the one-at-a-time median, beside same-run references."""
    found = []
    for r in results:
        found.append(Figure(
            f"placements/s with the reservation, {r['store']}, {r['nodes']:,} nodes, batched",
            r["placements_per_second"], 1000 / r["pure_scan_median_ms"], "placements/s",
            "the pure policy alone, scanning every GPU", f">= {GOAL_PER_SECOND:,.0f}",
            r["placements_per_second"] >= GOAL_PER_SECOND))
        found.append(Figure(
            f"median ms per placement with the reservation, {r['store']}, one at a time",
            r["single_median_ms"], r["decide_floor_median_ms"], "ms",
            "one AssessMemory decision, same path", f"< {GOAL_MEDIAN_MS:g} ms",
            r["single_median_ms"] < GOAL_MEDIAN_MS))
    return found


def table(results: list[dict[str, Any]]) -> str:
    headers = ["measurement", *[r["store"] for r in results]]

    def row(name: str, cell: Callable[[dict[str, Any]], str]) -> list[str]:
        return [name, *[cell(r) for r in results]]

    rows = [
        row("placements/s, batched (goal >= 500)", lambda r: f"{r['placements_per_second']:,.0f} "
            f"{'met' if r['placements_per_second'] >= GOAL_PER_SECOND else 'MISSED'}"),
        row("ms per decision, batched", lambda r: f"{r['batched_ms_per_decision']:.3f}"),
        row("placements/s, arriving from another process", lambda r:
            f"{r['arriving_per_second']:,.0f} "
            f"{'met' if r['arriving_per_second'] >= GOAL_PER_SECOND else 'MISSED'}"),
        row("ms median, one at a time (goal < 2)", lambda r: f"{r['single_median_ms']:.3f} "
            f"{'met' if r['single_median_ms'] < GOAL_MEDIAN_MS else 'MISSED'}"),
        row("ms p95, one at a time", lambda r: f"{r['single_p95_ms']:.3f}"),
        row("ms median, pure policy scanning every GPU", lambda r: f"{r['pure_scan_median_ms']:.3f}"),
        row("ms median, pure policy on the GPU index", lambda r: f"{r['pure_index_median_ms']:.3f}"),
        row("one at a time / pure scan", lambda r:
            f"{r['single_median_ms'] / r['pure_scan_median_ms']:.2f}"),
        row("ms median, decide floor (AssessMemory)", lambda r: f"{r['decide_floor_median_ms']:.3f}"),
        row("GPUs reserved, none twice", lambda r: f"{r['gpus_reserved']:,} {r['no_gpu_held_twice']}"),
        row("policies chose the recorded GPUs", lambda r: str(r["policies_chose_recorded_gpus"])),
    ]
    if "drifts" in results[0]:
        rows.append(row("replay --verify: decisions, drifts", lambda r:
                        f"{r['verified_decisions']:,}, {r['drifts']} ({r['verify_seconds']} s)"))
        rows.append(row("rebuilt projections equal live", lambda r: str(r["rebuild_equals_live"])))
    return format_table(headers, rows)
