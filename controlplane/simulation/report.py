"""The simulation's report: latency percentiles, shedding, fleet over time, cost, cache, decisions.

Percentiles use the nearest rank (spec §1.2): the value at rank ceil(q·n/100) of the sorted
values, so p50 <= p95 <= p99 always and each is a latency some request really had. Figures
over no requests are None, never NaN.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from controlplane.settings import redacted_url
from controlplane.simulation.config import SimulationConfig
from controlplane.simulation.fleet import Fleet
from controlplane.simulation.sampling import Samples
from controlplane.simulation.traces import Trace
from controlplane.simulation.world import Fate, RequestState

PERCENTS = (50, 95, 99)
TIMELINE_POINTS = 200


@dataclass
class SimulationRun:
    """Everything a report needs: the requests' fates, the fleet's life, the log's decisions."""

    config: SimulationConfig
    trace: Trace
    fleet: Fleet
    requests: list[RequestState]
    samples: Samples
    decisions: dict[str, int]
    end_seconds: float
    rollout: dict[str, Any] | None
    placements_refused: int = 0
    notes: list[str] = field(default_factory=list)


def nearest_rank(values: Sequence[float], percent: int) -> float:
    """The nearest-rank percentile; integer arithmetic so the rank never depends on rounding."""
    if not values:
        raise ValueError("no values to rank")
    ordered = sorted(values)
    return ordered[max(1, (percent * len(ordered) + 99) // 100) - 1]


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{q}": (round(nearest_rank(values, q), 6) if values else None) for q in PERCENTS}


def _latency(completed: list[RequestState]) -> dict[str, dict[str, float | None]]:
    return {"ttft": percentiles([r.ttft_seconds for r in completed]),
            "tpot": percentiles([r.tpot_seconds for r in completed]),
            "e2e": percentiles([r.e2e_seconds for r in completed])}


def _cache(run: SimulationRun) -> dict[str, Any]:
    lookups = hit_lookups = lookup_blocks = hit_blocks = 0
    for replica in run.fleet.replicas.values():
        counters = replica.prefix_cache.cache.state.counters
        lookups += counters.lookups
        hit_lookups += counters.hit_lookups
        lookup_blocks += counters.lookup_blocks
        hit_blocks += counters.hit_blocks
    saved = sum(r.saved_prefill_tokens for r in run.requests)
    routed_prompt = sum(r.trace.prompt_tokens for r in run.requests if r.job is not None)
    return {"block_size_tokens": run.fleet.block_size_tokens, "lookups": lookups,
            "hit_lookups": hit_lookups, "lookup_blocks": lookup_blocks, "hit_blocks": hit_blocks,
            "block_hit_rate": round(hit_blocks / lookup_blocks, 6) if lookup_blocks else None,
            "request_hit_rate": round(hit_lookups / lookups, 6) if lookups else None,
            "saved_prefill_tokens": saved,
            "computed_prefill_tokens": routed_prompt - saved}


def _timeline(run: SimulationRun) -> dict[str, Any]:
    series = run.samples.downsampled(TIMELINE_POINTS)
    times = series["times_seconds"]
    ttft: list[list[float]] = [[] for _ in times]
    for request in run.requests:
        if request.fate is Fate.COMPLETED and request.job is not None and times:
            assert request.job.first_token_seconds is not None
            index = min(len(times) - 1, _bucket(times, request.job.first_token_seconds))
            ttft[index].append(request.ttft_seconds)
    series["p95_ttft_seconds"] = [round(nearest_rank(v, 95), 6) if v else None for v in ttft]
    return series


def _bucket(times: list[float], moment: float) -> int:
    low, high = 0, len(times) - 1
    while low < high:  # the first bucket whose end is at or after the moment
        middle = (low + high) // 2
        if times[middle] < moment:
            low = middle + 1
        else:
            high = middle
    return low


def build_report(run: SimulationRun, wall_seconds: float, log_url: str,
                 chart_path: str | None) -> dict[str, Any]:
    """The whole report as JSON-safe data."""
    requests = run.requests
    fates = Counter(r.fate.value for r in requests)
    completed = [r for r in requests if r.fate is Fate.COMPLETED]
    decisions = dict(sorted(run.decisions.items()))
    total_decisions = sum(decisions.values())
    replicas = run.fleet.replicas.values()
    output_served = sum(r.trace.output_tokens for r in completed)
    return {
        "trace": {"path": run.trace.path, "kind": run.trace.kind, "requests": len(requests),
                  "prompt_tokens": run.trace.prompt_tokens, "output_tokens": run.trace.output_tokens,
                  "span_seconds": round(run.trace.span_seconds, 6)},
        "config": {**asdict(run.config), "routing": run.config.routing.value,
                   "canary_traffic_percents": list(run.config.canary_traffic_percents)},
        "fleet": {"model": run.fleet.model.model_id, "gpu": run.fleet.gpu.gpu_id,
                  "tensor_parallel": sorted({r.tensor_parallel for r in replicas}),
                  "kv_capacity_tokens_per_replica": sorted({r.kv_capacity_tokens for r in replicas}),
                  "service_tokens_per_second_per_replica": run.fleet.service_tokens_per_second},
        "requests": {"total": len(requests), "completed": fates.get("completed", 0),
                     "shed": fates.get("shed", 0), "unfinished": fates.get("unfinished", 0),
                     "shed_rate": round(fates.get("shed", 0) / len(requests), 6),
                     "shed_by_code": dict(sorted(Counter(r.shed_code for r in requests
                                                         if r.shed_code).items())),
                     "prompt_tokens_completed": sum(r.trace.prompt_tokens for r in completed),
                     "output_tokens_completed": output_served},
        "latency_seconds": _latency(completed),
        "output_tokens_per_second": round(output_served / run.end_seconds, 3)
        if run.end_seconds > 0 else None,
        "replicas": {"placed": len(run.fleet.replicas),
                     "released": sum(1 for r in replicas if r.released_seconds is not None),
                     "placements_refused": run.placements_refused,
                     "max_ready": run.samples.maximum("ready_replicas"),
                     "max_admission_queue": run.samples.maximum("admission_queue"),
                     "max_engine_waiting": run.samples.maximum("engine_waiting")},
        "gpu_hours": round(sum(r.gpu_seconds(run.end_seconds) for r in replicas) / 3600, 6),
        "prefix_cache": _cache(run),
        "decisions": {"by_command": decisions, "total": total_decisions},
        "rollout": run.rollout,
        "simulated_seconds": round(run.end_seconds, 6),
        "wall_seconds": round(wall_seconds, 3),
        "decisions_per_second": round(total_decisions / wall_seconds, 1) if wall_seconds > 0 else None,
        "log": redacted_url(log_url),
        "chart": chart_path,
        "notes": run.notes,
        "timeline": _timeline(run),
    }


def render(report: dict[str, Any]) -> str:
    """The report for people: the headline figures, one topic a line."""
    trace, requests, cache = report["trace"], report["requests"], report["prefix_cache"]

    def triple(name: str) -> str:
        values = report["latency_seconds"][name]
        return " / ".join("-" if values[f"p{q}"] is None else f"{values[f'p{q}']:.3f}"
                          for q in PERCENTS)

    hit = cache["block_hit_rate"]
    rollout = report["rollout"]
    lines = [
        f"trace      {trace['path']} ({trace['kind']}): {trace['requests']} requests, "
        f"{trace['prompt_tokens']} prompt + {trace['output_tokens']} output tokens",
        f"fleet      {report['fleet']['model']} on {report['fleet']['gpu']}, "
        f"routing {report['config']['routing']}",
        f"served     {requests['completed']} completed, {requests['shed']} shed "
        f"({requests['shed_rate']:.2%}), {requests['unfinished']} unfinished",
        f"latency    p50 / p95 / p99 seconds: TTFT {triple('ttft')} | TPOT {triple('tpot')} | "
        f"E2E {triple('e2e')}",
        f"replicas   {report['replicas']['placed']} placed, max {report['replicas']['max_ready']} "
        f"ready, {report['replicas']['released']} released; {report['gpu_hours']:.3f} GPU-hours",
        f"queue      max {report['replicas']['max_admission_queue']} in admission, "
        f"max {report['replicas']['max_engine_waiting']} waiting in engines",
        f"cache      hit rate {'-' if hit is None else f'{hit:.2%}'} of blocks, "
        f"{cache['saved_prefill_tokens']} prefill tokens saved",
        f"decisions  {report['decisions']['total']} through the log "
        f"({', '.join(f'{k} {v}' for k, v in report['decisions']['by_command'].items())})",
    ]
    if rollout is not None:
        lines.append(f"rollout    {rollout['rollout_id']}: stage {rollout['stage']}, candidate "
                     f"{rollout['candidate_traffic_percent']:g}% after "
                     f"{rollout['measurements']} measurements")
    lines.append(f"time       {report['simulated_seconds']:.0f} s simulated in "
                 f"{report['wall_seconds']:.1f} s ({report['decisions_per_second']} decisions/s)")
    lines.append(f"log        {report['log']}" + (f"   chart {report['chart']}" if report["chart"]
                                                   else ""))
    lines += [f"note       {note}" for note in report["notes"]]
    return "\n".join(lines)
