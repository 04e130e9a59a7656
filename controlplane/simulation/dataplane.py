"""One replica's engine: continuous batching with chunked prefill, on a virtual clock (spec §1.3).

Each engine step every running request either decodes one token or, while its prompt is still
being computed, takes a share of the step's prefill budget in first-come order; the step that
finishes a prompt also samples its first token (as `policies.batching` does). Unlike the integer
reference, a step lasts `step_base + Σ KV reads of decoding requests + prefilled tokens × cost`.

Stretches of identical steps are taken in one stride: a stride ends at the next request to
finish, or before a prompt finishes prefilling (that step is taken alone). A request arriving
mid-stride joins at the first step boundary at or after its arrival: the stride is cut there.
Requests join while a lane is free and their worst-case KV (prompt + output) fits the replica.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from controlplane.simulation.costs import EngineCosts

_EPSILON = 1e-9


@dataclass(eq=False)
class Job:
    """A request on a replica: what it needs, and when it got a lane, its first and last token."""

    request_index: int
    prompt_tokens: int
    output_tokens: int
    prefill_tokens: int  # prompt tokens to compute; prefix-cache hits saved the rest
    submitted_seconds: float
    started_seconds: float | None = None
    first_token_seconds: float | None = None
    completed_seconds: float | None = None
    prefill_remaining: int = 0
    finish_step: int = 0
    step_cost_seconds: float = 0.0

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True)
class _Stride:
    steps: int
    step_seconds: float
    prefill_tokens_per_step: int  # > 0 only when the prefill head alone takes the budget
    single_step: bool  # a step that finishes at least one prompt, taken exactly
    end_seconds: float


@dataclass
class StepResult:
    """What a finished stride produced: prompts done (first token out) and requests done."""

    prefilled: list[Job] = field(default_factory=list)
    completed: list[Job] = field(default_factory=list)


class ReplicaEngine:
    """The data plane of one replica. `next_event_seconds` is when its current stride ends;
    `advance` finishes it; `submit` hands it a request at a time no earlier than its clock."""

    def __init__(self, costs: EngineCosts, kv_capacity_tokens: int, now_seconds: float) -> None:
        self.costs = costs
        self.kv_capacity_tokens = kv_capacity_tokens
        self.clock_seconds = now_seconds
        self.steps = 0
        self.waiting: deque[Job] = deque()
        self.prefilling: deque[Job] = deque()
        self.decoding: list[tuple[int, int, Job]] = []
        self.decode_cost_seconds = 0.0
        self.prefill_pending_tokens = 0
        self.kv_used_tokens = 0
        self.waiting_tokens = 0
        self.version = 0  # bumped whenever the stride is replanned; stale wake-ups are ignored
        self._sequence = 0
        self._stride: _Stride | None = None

    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def outstanding_tokens(self) -> int:
        """Worst-case tokens held or awaited: the load that routing balances."""
        return self.kv_used_tokens + self.waiting_tokens

    @property
    def idle(self) -> bool:
        return not self.waiting and self.running == 0

    def next_event_seconds(self) -> float | None:
        return self._stride.end_seconds if self._stride is not None else None

    def submit(self, job: Job, now_seconds: float) -> None:
        """Queue `job` on this replica; it starts at the first step boundary at or after now."""
        self._cut(now_seconds)
        job.prefill_remaining = max(1, job.prefill_tokens)
        self.waiting.append(job)
        self.waiting_tokens += job.kv_tokens
        if self._stride is None:
            self._plan()

    def advance(self) -> StepResult:
        """Finish the current stride at its end time; then plan the next one."""
        stride = self._stride
        assert stride is not None, "advance() without a stride"
        result = StepResult()
        if stride.single_step:
            self._single_step(stride, result)
        else:
            self._uniform_steps(stride.steps, stride)
        self.clock_seconds = stride.end_seconds
        while self.decoding and self.decoding[0][0] <= self.steps:
            _, _, job = heapq.heappop(self.decoding)
            self.decode_cost_seconds -= job.step_cost_seconds
            self._finish(job, result, stride.end_seconds)
        self._stride = None
        self._plan()
        return result

    def _cut(self, now_seconds: float) -> None:
        """Stop the stride at the first boundary at or after `now_seconds` (if before its end)."""
        stride = self._stride
        if stride is None:
            self.clock_seconds = max(self.clock_seconds, now_seconds)
            return
        done = math.ceil((now_seconds - self.clock_seconds) / stride.step_seconds - _EPSILON)
        if done >= stride.steps:
            return  # the stride ends first; the job joins at its end
        if done > 0:
            self._uniform_steps(done, stride)
            self.clock_seconds += done * stride.step_seconds
        self._stride = None

    def _uniform_steps(self, count: int, stride: _Stride) -> None:
        self.steps += count
        if stride.prefill_tokens_per_step:
            used = count * stride.prefill_tokens_per_step
            self.prefilling[0].prefill_remaining -= used
            self.prefill_pending_tokens -= used

    def _single_step(self, stride: _Stride, result: StepResult) -> None:
        self.steps += 1
        budget = self.costs.prefill_tokens_per_step
        while self.prefilling and budget > 0:
            job = self.prefilling[0]
            chunk = min(job.prefill_remaining, budget)
            job.prefill_remaining -= chunk
            self.prefill_pending_tokens -= chunk
            budget -= chunk
            if job.prefill_remaining > 0:
                break
            self.prefilling.popleft()
            job.first_token_seconds = stride.end_seconds
            result.prefilled.append(job)
            remaining = job.output_tokens - 1
            if remaining == 0:
                self._finish(job, result, stride.end_seconds)
                continue
            job.finish_step = self.steps + remaining
            self.decode_cost_seconds += job.step_cost_seconds
            self._sequence += 1
            heapq.heappush(self.decoding, (job.finish_step, self._sequence, job))

    def _finish(self, job: Job, result: StepResult, at_seconds: float) -> None:
        job.completed_seconds = at_seconds
        self.kv_used_tokens -= job.kv_tokens
        if not self.decoding and not self.prefilling:
            self.decode_cost_seconds = 0.0  # no float residue survives an empty batch
        result.completed.append(job)

    def _admit_waiting(self) -> None:
        costs = self.costs
        while self.waiting and self.running < costs.max_running_requests:
            job = self.waiting[0]
            # An empty replica always takes the head, so an oversized request cannot starve.
            if self.running and self.kv_used_tokens + job.kv_tokens > self.kv_capacity_tokens:
                break
            self.waiting.popleft()
            self.waiting_tokens -= job.kv_tokens
            self.kv_used_tokens += job.kv_tokens
            job.started_seconds = self.clock_seconds
            job.step_cost_seconds = costs.decode_seconds_per_step(
                job.prompt_tokens + job.output_tokens / 2)
            self.prefilling.append(job)
            self.prefill_pending_tokens += job.prefill_remaining

    def _plan(self) -> None:
        self._admit_waiting()
        self.version += 1
        if self.running == 0:
            self._stride = None
            return
        costs = self.costs
        base = costs.step_base_seconds + self.decode_cost_seconds
        until_finish = self.decoding[0][0] - self.steps if self.decoding else None
        if self.prefilling:
            budget = costs.prefill_tokens_per_step
            # Steps in which the head alone takes the whole budget and still is not done.
            uniform = (self.prefilling[0].prefill_remaining - 1) // budget
            if uniform == 0:
                used = min(budget, self.prefill_pending_tokens)
                seconds = base + used * costs.prefill_seconds_per_token
                self._stride = _Stride(1, seconds, 0, True, self.clock_seconds + seconds)
                return
            steps = uniform if until_finish is None else min(uniform, until_finish)
            seconds = base + budget * costs.prefill_seconds_per_token
            self._stride = _Stride(steps, seconds, budget, False,
                                   self.clock_seconds + steps * seconds)
            return
        assert until_finish is not None
        self._stride = _Stride(until_finish, base, 0, False, self.clock_seconds + until_finish * base)
