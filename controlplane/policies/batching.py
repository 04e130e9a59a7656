"""Static versus continuous batching over integer decode steps, with optional prefill (spec §1.3).

A step is one engine iteration: every request holding a lane either decodes one token or, while
its prompt is still being prefilled, takes a share of that step's prefill token budget. With a
prefill budget of 0 prompts cost nothing, which is exactly the reference simulator.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from controlplane.policies.reasons import Reason, require

# The steps of work a simulation may need at most (about a few seconds of stepping).
MAX_WORK_STEPS = 10_000_000


class BatchMode(StrEnum):
    STATIC = "static"
    CONTINUOUS = "continuous"


@dataclass(frozen=True)
class BatchRequest:
    """One request: when it arrives, how many tokens it emits and how long its prompt is."""

    identifier: str
    arrival_step: int
    output_tokens: int
    prompt_tokens: int = 0


@dataclass(frozen=True)
class Completion:
    """When a request got a lane, when its first token was out and when its last token was out."""

    identifier: str
    arrival_step: int
    first_service_step: int
    first_token_step: int
    completion_step: int


@dataclass(frozen=True)
class BatchRun:
    mode: BatchMode
    completions: tuple[Completion, ...]
    makespan_steps: int
    total_wait_steps: int
    total_ttft_steps: int
    reasons: tuple[Reason, ...]


@dataclass
class _Lane:
    request: BatchRequest
    first_service_step: int
    prefill_remaining_tokens: int
    remaining_tokens: int
    first_token_step: int | None = None


def _validate(requests: Sequence[BatchRequest], capacity: int, mode: BatchMode,
              prefill_tokens_per_step: int) -> None:
    require(mode in tuple(BatchMode), "mode_unknown", "mode", "mode must be static or continuous")
    for name, value in (("capacity", capacity),
                        ("prefill_tokens_per_step", prefill_tokens_per_step)):
        require(isinstance(value, int) and not isinstance(value, bool), "not_an_integer", name,
                f"{name} must be an integer")
    require(capacity > 0, "capacity_not_positive", "capacity", "capacity must be positive")
    require(prefill_tokens_per_step >= 0, "prefill_budget_negative", "prefill_tokens_per_step",
            "the prefill budget may not be negative")
    require(len(requests) > 0, "requests_empty", "requests", "at least one request is required")
    for index, request in enumerate(requests):
        for name in ("arrival_step", "output_tokens", "prompt_tokens"):
            value = getattr(request, name)
            # Steps are discrete; a float (or an infinity) would never drain the loop cleanly.
            require(isinstance(value, int) and not isinstance(value, bool), "not_an_integer",
                    f"requests[{index}].{name}", f"{name} must be an integer")
        require(isinstance(request.identifier, str), "not_a_string",
                f"requests[{index}].identifier", "identifier must be a string")
        require(bool(request.identifier.strip()), "request_identifier_blank",
                f"requests[{index}].identifier", "every request needs an identifier")
    identifiers = [request.identifier for request in requests]
    # A duplicate id would silently overwrite another request's bookkeeping.
    require(len(set(identifiers)) == len(identifiers), "request_identifier_duplicate",
            "requests", "request identifiers must be unique")
    for index, request in enumerate(requests):
        where = f"requests[{index}]"
        require(request.arrival_step >= 0, "arrival_step_negative", f"{where}.arrival_step",
                "arrival steps may not be negative")
        require(request.output_tokens > 0, "output_tokens_not_positive",
                f"{where}.output_tokens", "every request must emit at least one token")
        require(request.prompt_tokens >= 0, "prompt_tokens_negative", f"{where}.prompt_tokens",
                "prompt lengths may not be negative")
    # Idle stretches are skipped, so the loop runs at most one step per unit of work: bounded.
    work = sum(r.output_tokens + (-(-r.prompt_tokens // prefill_tokens_per_step)
                                  if prefill_tokens_per_step > 0 else 0) for r in requests)
    require(work <= MAX_WORK_STEPS, "work_too_large", "requests",
            f"the requests need up to {work} engine steps; at most {MAX_WORK_STEPS:,} are simulated")


def _run_step(active: list[_Lane], step: int, prefill_tokens_per_step: int) -> list[_Lane]:
    """Advance every lane by one step; returns the lanes that finished in it."""
    budget_tokens = prefill_tokens_per_step
    finished: list[_Lane] = []
    for lane in active:  # lane order is admission order, so prefill is served first come first
        if lane.prefill_remaining_tokens > 0:
            chunk_tokens = min(lane.prefill_remaining_tokens, budget_tokens)
            lane.prefill_remaining_tokens -= chunk_tokens
            budget_tokens -= chunk_tokens
            if lane.prefill_remaining_tokens > 0:
                continue
        # The step that finishes a prompt also samples its first token, as real engines do.
        if lane.first_token_step is None:
            lane.first_token_step = step + 1
        lane.remaining_tokens -= 1
        if lane.remaining_tokens == 0:
            finished.append(lane)
    return finished


def simulate_batching(requests: Sequence[BatchRequest], capacity: int, mode: BatchMode,
                      prefill_tokens_per_step: int = 0) -> BatchRun:
    """Replay the requests through `capacity` lanes; continuous mode never idles a lane with work
    waiting, and the makespan is a span, unchanged by shifting every arrival alike."""
    _validate(requests, capacity, mode, prefill_tokens_per_step)
    mode = BatchMode(mode)
    pending = deque(sorted(requests, key=lambda r: (r.arrival_step, r.identifier)))
    waiting: deque[BatchRequest] = deque()
    active: list[_Lane] = []
    completions: list[Completion] = []
    first_arrival_step = pending[0].arrival_step
    step = first_arrival_step
    while pending or waiting or active:
        while pending and pending[0].arrival_step <= step:
            waiting.append(pending.popleft())
        # Static batching forms a new batch only once the previous one has fully drained.
        if mode is BatchMode.CONTINUOUS or not active:
            while waiting and len(active) < capacity:
                request = waiting.popleft()
                prefill_tokens = request.prompt_tokens if prefill_tokens_per_step > 0 else 0
                active.append(_Lane(request, step, prefill_tokens, request.output_tokens))
        if not active:
            step = pending[0].arrival_step
            continue
        for lane in _run_step(active, step, prefill_tokens_per_step):
            active.remove(lane)
            assert lane.first_token_step is not None
            completions.append(Completion(lane.request.identifier, lane.request.arrival_step,
                                          lane.first_service_step, lane.first_token_step,
                                          step + 1))
        step += 1
    completions.sort(key=lambda c: c.identifier)
    # A span, not the absolute last step (spec §9 bug 3).
    makespan_steps = step - first_arrival_step
    total_wait_steps = sum(c.first_service_step - c.arrival_step for c in completions)
    total_ttft_steps = sum(c.first_token_step - c.arrival_step for c in completions)
    reason = Reason("batches_simulated", f"{mode.value} batching drained every request",
                    {"mode": mode.value, "capacity": capacity,
                     "prefill_tokens_per_step": prefill_tokens_per_step,
                     "makespan_steps": makespan_steps, "total_wait_steps": total_wait_steps,
                     "total_ttft_steps": total_ttft_steps})
    return BatchRun(mode=mode, completions=tuple(completions), makespan_steps=makespan_steps,
                    total_wait_steps=total_wait_steps, total_ttft_steps=total_ttft_steps,
                    reasons=(reason,))
