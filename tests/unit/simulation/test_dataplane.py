"""The replica engine: continuous batching with chunked prefill on a virtual clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.catalog.registry import load_catalog
from controlplane.policies.batching import BatchMode, BatchRequest, simulate_batching
from controlplane.simulation.costs import (
    HBM_EFFICIENCY,
    STEP_OVERHEAD_SECONDS,
    EngineCosts,
    PlacedMemory,
    engine_costs,
    service_tokens_per_second,
)
from controlplane.simulation.dataplane import Job, ReplicaEngine


def unit_steps(budget: int = 2_048, lanes: int = 256) -> EngineCosts:
    """Every step lasts one second whatever it does: steps and seconds coincide."""
    return EngineCosts(1.0, 0.0, 0.0, prefill_tokens_per_step=budget, max_running_requests=lanes)


def _job(index: int, prompt: int, output: int, at: float = 0.0) -> Job:
    return Job(index, prompt, output, prompt, at)


def _drive(engine: ReplicaEngine, arrivals: list[tuple[float, Job]]) -> None:
    """Hand each job over at its time and run the engine's strides in time order."""
    pending = sorted(arrivals, key=lambda item: (item[0], item[1].request_index))
    while pending or engine.next_event_seconds() is not None:
        wake = engine.next_event_seconds()
        if pending and (wake is None or pending[0][0] <= wake):
            moment, job = pending.pop(0)
            engine.submit(job, moment)
        else:
            engine.advance()


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 4), budget=st.integers(1, 12),
       requests=st.lists(st.tuples(st.integers(0, 15), st.integers(1, 6), st.integers(1, 30)),
                         min_size=1, max_size=8))
def test_unit_cost_steps_reproduce_the_reference_batching_simulator(
        capacity: int, budget: int, requests: list[tuple[int, int, int]]) -> None:
    engine = ReplicaEngine(unit_steps(budget, capacity), kv_capacity_tokens=10**9, now_seconds=0.0)
    jobs = [_job(i, prompt, output) for i, (_, output, prompt) in enumerate(requests)]
    _drive(engine, [(float(arrival), job) for (arrival, _, _), job in zip(requests, jobs, strict=True)])
    reference = simulate_batching(
        [BatchRequest(f"r{i:02d}", arrival, output, prompt)
         for i, (arrival, output, prompt) in enumerate(requests)],
        capacity, BatchMode.CONTINUOUS, budget)
    for completion in reference.completions:
        job = jobs[int(completion.identifier[1:])]
        assert (job.started_seconds, job.first_token_seconds, job.completed_seconds) == (
            completion.first_service_step, completion.first_token_step, completion.completion_step)


def test_a_request_arriving_mid_stride_starts_at_the_next_step_boundary() -> None:
    engine = ReplicaEngine(unit_steps(), 10**9, 0.0)
    long_job, late_job = _job(0, 1, 100), _job(1, 1, 2)
    _drive(engine, [(0.0, long_job), (3.4, late_job)])
    assert late_job.started_seconds == 4.0
    assert (late_job.first_token_seconds, late_job.completed_seconds) == (5.0, 6.0)
    assert long_job.completed_seconds == 100.0


def test_a_request_waits_for_kv_room_but_an_empty_replica_takes_any_request() -> None:
    engine = ReplicaEngine(unit_steps(), kv_capacity_tokens=100, now_seconds=0.0)
    first, second, oversized = _job(0, 40, 40), _job(1, 30, 20), _job(2, 150, 1)
    _drive(engine, [(0.0, first), (0.0, second), (0.0, oversized)])
    assert second.started_seconds == first.completed_seconds == 40.0
    assert oversized.started_seconds == second.completed_seconds
    assert engine.kv_used_tokens == 0 and engine.idle


def test_prefill_cost_delays_the_first_token_by_the_chunks_it_needs() -> None:
    costs = EngineCosts(step_base_seconds=0.01, kv_read_seconds_per_token=0.0,
                        prefill_seconds_per_token=0.001, prefill_tokens_per_step=100)
    engine = ReplicaEngine(costs, 10**9, 0.0)
    job = _job(0, 250, 3)
    _drive(engine, [(0.0, job)])
    # Two full chunks (0.01 + 0.1 s each), then the last 50 tokens with the first token.
    assert job.first_token_seconds == pytest.approx(0.22 + 0.06)
    assert job.completed_seconds == pytest.approx(0.28 + 2 * 0.01)


def test_decode_steps_slow_down_with_the_kv_each_running_request_reads() -> None:
    costs = EngineCosts(step_base_seconds=0.01, kv_read_seconds_per_token=1e-5,
                        prefill_seconds_per_token=0.0)
    alone, crowded = ReplicaEngine(costs, 10**9, 0.0), ReplicaEngine(costs, 10**9, 0.0)
    solo = _job(0, 100, 11)
    _drive(alone, [(0.0, solo)])
    batch = [_job(i, 100, 11) for i in range(4)]
    _drive(crowded, [(0.0, job) for job in batch])
    first, alone_done = batch[0], solo.completed_seconds
    assert first.completed_seconds is not None and first.first_token_seconds is not None
    assert alone_done is not None and first.completed_seconds > alone_done
    per_step = 0.01 + 4 * 105.5 * 1e-5
    assert first.completed_seconds - first.first_token_seconds == pytest.approx(10 * per_step)


def test_engine_costs_follow_the_placed_memory_and_the_gpus_bandwidth_and_compute() -> None:
    catalog = load_catalog()
    model, gpu = catalog.model("meta-llama/Llama-3.1-8B"), catalog.gpu("H100-SXM-80GB")
    costs = engine_costs(model, gpu, 1, PlacedMemory(model.bf16_weight_bytes, 131_072))
    bandwidth = 3350e9 * HBM_EFFICIENCY
    assert costs.step_base_seconds == pytest.approx(
        STEP_OVERHEAD_SECONDS + model.bf16_weight_bytes / bandwidth)
    assert costs.kv_read_seconds_per_token == pytest.approx(131_072 / bandwidth)
    halves = PlacedMemory(model.bf16_weight_bytes / 2, 65_536)
    assert engine_costs(model, gpu, 2, halves).prefill_seconds_per_token == pytest.approx(
        costs.prefill_seconds_per_token / 2)
    seconds_per_request = (1_000 * costs.prefill_seconds_per_token
                           + 200 * (costs.step_base_seconds / 32 + 1_100 * costs.kv_read_seconds_per_token))
    assert service_tokens_per_second(costs, 1_000, 200) == pytest.approx(1_200 / seconds_per_request)
