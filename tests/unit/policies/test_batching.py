"""Batching simulator (spec §1.3, example 03, tests/test_batching.py, §9 bug 3, prefill model)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.batching import BatchMode, BatchRequest, BatchRun, simulate_batching
from controlplane.policies.reasons import PolicyInputError, to_plain

WORKLOAD = (BatchRequest("short", 0, 1), BatchRequest("long", 0, 3), BatchRequest("late", 1, 1))


def timeline(run: BatchRun) -> dict[str, tuple[int, int]]:
    return {c.identifier: (c.first_service_step, c.completion_step) for c in run.completions}


def test_example_03_static_then_continuous() -> None:
    requests = (BatchRequest("short", 0, 1), BatchRequest("long", 0, 5),
                BatchRequest("arrives-later", 1, 1))
    static = simulate_batching(requests, 2, BatchMode.STATIC)
    continuous = simulate_batching(requests, 2, BatchMode.CONTINUOUS)
    assert (static.makespan_steps, static.total_wait_steps) == (6, 4)
    assert timeline(static) == {"arrives-later": (5, 6), "long": (0, 5), "short": (0, 1)}
    assert (continuous.makespan_steps, continuous.total_wait_steps) == (5, 0)
    assert timeline(continuous) == {"arrives-later": (1, 2), "long": (0, 5), "short": (0, 1)}
    assert [c.identifier for c in static.completions] == ["arrives-later", "long", "short"]
    assert json.loads(json.dumps(to_plain(static)))["mode"] == "static"


def test_continuous_batching_refills_the_lane_freed_by_short_work() -> None:
    run = simulate_batching(WORKLOAD, 2, BatchMode.CONTINUOUS)
    assert timeline(run)["late"] == (1, 2)
    assert (run.total_wait_steps, run.makespan_steps) == (0, 3)


def test_static_batching_exhibits_head_of_line_blocking() -> None:
    run = simulate_batching(WORKLOAD, 2, BatchMode.STATIC)
    assert timeline(run)["late"] == (3, 4)
    assert (run.total_wait_steps, run.makespan_steps) == (2, 4)


def test_same_stimulus_produces_a_shorter_continuous_makespan() -> None:
    continuous = simulate_batching(WORKLOAD, 2, BatchMode.CONTINUOUS)
    static = simulate_batching(WORKLOAD, 2, BatchMode.STATIC)
    assert continuous.makespan_steps < static.makespan_steps


@pytest.mark.parametrize("mode", list(BatchMode))
def test_makespan_is_a_span_not_the_absolute_final_step(mode: BatchMode) -> None:
    """Regression (spec §9 bug 3): makespan was the absolute last step, so a shift changed it."""
    shifted = tuple(BatchRequest(r.identifier, r.arrival_step + 100, r.output_tokens)
                    for r in WORKLOAD)
    assert (simulate_batching(shifted, 2, mode).makespan_steps
            == simulate_batching(WORKLOAD, 2, mode).makespan_steps)


def test_idle_gap_counts_toward_makespan_but_not_toward_wait() -> None:
    run = simulate_batching((BatchRequest("a", 0, 1), BatchRequest("b", 5, 2)), 1,
                            BatchMode.CONTINUOUS)
    assert (run.makespan_steps, run.total_wait_steps) == (7, 0)


def test_without_a_prefill_budget_prompts_cost_nothing() -> None:
    with_prompts = tuple(BatchRequest(r.identifier, r.arrival_step, r.output_tokens, 5000)
                         for r in WORKLOAD)
    assert (simulate_batching(with_prompts, 2, BatchMode.CONTINUOUS).completions
            == simulate_batching(WORKLOAD, 2, BatchMode.CONTINUOUS).completions)


def test_prefill_delays_the_first_token_until_the_prompt_is_processed() -> None:
    run = simulate_batching((BatchRequest("a", 0, 3, 1000),), 1, BatchMode.CONTINUOUS,
                            prefill_tokens_per_step=512)
    (done,) = run.completions
    # Step 0 prefills 512, step 1 the remaining 488 and samples the first token.
    assert (done.first_service_step, done.first_token_step, done.completion_step) == (0, 2, 4)
    assert run.total_ttft_steps == 2


def test_a_prompt_within_the_budget_costs_no_extra_step() -> None:
    run = simulate_batching((BatchRequest("a", 0, 3, 512),), 1, BatchMode.CONTINUOUS,
                            prefill_tokens_per_step=512)
    assert run.completions[0].first_token_step == 1
    assert run.makespan_steps == 3


def test_prefill_budget_is_shared_first_come_first_served() -> None:
    requests = (BatchRequest("first", 0, 1, 600), BatchRequest("second", 0, 1, 600))
    run = simulate_batching(requests, 2, BatchMode.CONTINUOUS, prefill_tokens_per_step=800)
    # Step 0 spends 600 on the first prompt and 200 on the second; step 1 finishes the second.
    assert timeline(run) == {"first": (0, 1), "second": (0, 2)}


def test_long_prefill_in_a_lane_delays_the_request_behind_it() -> None:
    requests = (BatchRequest("prompt-heavy", 0, 1, 4096), BatchRequest("queued", 0, 1))
    cheap = simulate_batching(requests, 1, BatchMode.CONTINUOUS)
    costly = simulate_batching(requests, 1, BatchMode.CONTINUOUS, prefill_tokens_per_step=1024)
    assert timeline(cheap)["queued"] == (1, 2)
    assert timeline(costly)["queued"] == (4, 5)


@pytest.mark.parametrize(("requests", "capacity", "budget", "code", "field"), [
    (WORKLOAD, 0, 0, "capacity_not_positive", "capacity"),
    (WORKLOAD, 2, -1, "prefill_budget_negative", "prefill_tokens_per_step"),
    ((), 2, 0, "requests_empty", "requests"),
    ((BatchRequest(" ", 0, 1),), 2, 0, "request_identifier_blank", "requests[0].identifier"),
    ((BatchRequest("same", 0, 1), BatchRequest("same", 1, 2)), 2, 0,
     "request_identifier_duplicate", "requests"),
    ((BatchRequest("a", -1, 1),), 2, 0, "arrival_step_negative", "requests[0].arrival_step"),
    ((BatchRequest("a", 0, 0),), 2, 0, "output_tokens_not_positive", "requests[0].output_tokens"),
    ((BatchRequest("a", 0, 1, -3),), 2, 0, "prompt_tokens_negative",
     "requests[0].prompt_tokens"),
    ((BatchRequest("a", float("inf"), 1),), 2, 0, "not_an_integer",  # type: ignore[arg-type]
     "requests[0].arrival_step"),
])
def test_invalid_inputs_are_refused_with_code_and_field(
        requests: tuple[BatchRequest, ...], capacity: int, budget: int, code: str,
        field: str) -> None:
    with pytest.raises(PolicyInputError) as error:
        simulate_batching(requests, capacity, BatchMode.CONTINUOUS, budget)
    assert (error.value.code, error.value.field) == (code, field)


_requests = st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, 8), st.integers(0, 3000)),
    min_size=1, max_size=12,
).map(lambda rows: tuple(BatchRequest(f"r{index:02d}", arrival, output, prompt)
                         for index, (arrival, output, prompt) in enumerate(rows)))
_budgets = st.sampled_from([0, 256, 1024])


@settings(max_examples=150, deadline=None)
@given(_requests, st.integers(1, 4), _budgets)
def test_continuous_batching_never_leaves_a_free_lane_idle_while_work_waits(
        requests: tuple[BatchRequest, ...], capacity: int, budget: int) -> None:
    run = simulate_batching(requests, capacity, BatchMode.CONTINUOUS, budget)
    for step in range(min(r.arrival_step for r in requests), max(c.completion_step
                                                               for c in run.completions)):
        waiting = sum(1 for c in run.completions if c.arrival_step <= step < c.first_service_step)
        busy = sum(1 for c in run.completions if c.first_service_step <= step < c.completion_step)
        assert waiting == 0 or busy == capacity


@settings(max_examples=150, deadline=None)
@given(_requests, st.integers(1, 4), st.sampled_from(list(BatchMode)), _budgets,
       st.integers(1, 1000))
def test_makespan_and_waits_are_invariant_under_a_uniform_shift_of_arrivals(
        requests: tuple[BatchRequest, ...], capacity: int, mode: BatchMode, budget: int,
        shift: int) -> None:
    shifted = tuple(BatchRequest(r.identifier, r.arrival_step + shift, r.output_tokens,
                                 r.prompt_tokens) for r in requests)
    base = simulate_batching(requests, capacity, mode, budget)
    moved = simulate_batching(shifted, capacity, mode, budget)
    assert moved.makespan_steps == base.makespan_steps
    assert moved.total_wait_steps == base.total_wait_steps
    assert [c.completion_step - shift for c in moved.completions] == [
        c.completion_step for c in base.completions]


@settings(max_examples=150, deadline=None)
@given(_requests, st.integers(1, 4), st.sampled_from(list(BatchMode)), _budgets)
def test_each_request_completes_once_and_decodes_one_token_per_step_after_its_first(
        requests: tuple[BatchRequest, ...], capacity: int, mode: BatchMode,
        budget: int) -> None:
    run = simulate_batching(requests, capacity, mode, budget)
    by_id = {r.identifier: r for r in requests}
    assert sorted(c.identifier for c in run.completions) == sorted(by_id)
    for completion in run.completions:
        request = by_id[completion.identifier]
        assert completion.arrival_step <= completion.first_service_step
        assert completion.completion_step - completion.first_token_step == (
            request.output_tokens - 1)
        if budget == 0:
            assert completion.first_token_step == completion.first_service_step + 1
        else:
            # The prompt needs at least ceil(prompt / budget) steps of prefill work.
            prefill_steps = max(1, -(-request.prompt_tokens // budget))
            assert completion.first_token_step - completion.first_service_step >= prefill_steps


def test_work_beyond_the_step_bound_is_refused_before_stepping() -> None:
    """Idle stretches are skipped, so only work bounds the loop: 1e12 output tokens had run for
    hours; the bound is checked first, naming it."""
    from controlplane.policies.batching import MAX_WORK_STEPS

    huge = [BatchRequest("a", 0, 10**12)]
    with pytest.raises(PolicyInputError) as error:
        simulate_batching(huge, 1, BatchMode.CONTINUOUS)
    assert error.value.code == "work_too_large"
    prompt_heavy = [BatchRequest("a", 0, 1, prompt_tokens=MAX_WORK_STEPS * 4)]
    with pytest.raises(PolicyInputError):
        simulate_batching(prompt_heavy, 1, BatchMode.CONTINUOUS, prefill_tokens_per_step=2)
    simulate_batching([BatchRequest("a", 10**15, 3)], 1, BatchMode.STATIC)  # far arrival: cheap


def test_a_non_string_identifier_is_refused_naming_it() -> None:
    with pytest.raises(PolicyInputError) as error:
        simulate_batching([BatchRequest(7, 0, 1)], 1, BatchMode.STATIC)  # type: ignore[arg-type]
    assert (error.value.code, error.value.field) == ("not_a_string", "requests[0].identifier")
