"""The simulated world's bookkeeping: each request's fate and each replica's life and engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from controlplane.simulation.dataplane import Job, ReplicaEngine
from controlplane.simulation.routing import BlockPrompt, ReplicaPrefixCache
from controlplane.simulation.traces import TraceRequest


class Fate(StrEnum):
    PENDING = "pending"
    ADMITTED = "admitted"
    QUEUED = "queued"
    SHED = "shed"
    COMPLETED = "completed"
    UNFINISHED = "unfinished"  # still queued when nothing was left to release it


class ReplicaState(StrEnum):
    WARMING = "warming"
    READY = "ready"
    RELEASED = "released"


@dataclass(eq=False)
class RequestState:
    """One trace request as the simulation saw it; times are seconds on the virtual clock."""

    trace: TraceRequest
    arrival_seconds: float
    arm: str = "baseline"
    fate: Fate = Fate.PENDING
    shed_code: str | None = None
    admitted_seconds: float | None = None
    replica_id: str | None = None
    saved_prefill_tokens: int = 0
    job: Job | None = None
    prompt: BlockPrompt | None = None

    @property
    def request_id(self) -> str:
        return f"req-{self.trace.index}"

    @property
    def tokens(self) -> int:
        return self.trace.prompt_tokens + self.trace.output_tokens

    @property
    def ttft_seconds(self) -> float:
        assert self.job is not None and self.job.first_token_seconds is not None
        return self.job.first_token_seconds - self.arrival_seconds

    @property
    def e2e_seconds(self) -> float:
        assert self.job is not None and self.job.completed_seconds is not None
        return self.job.completed_seconds - self.arrival_seconds

    @property
    def tpot_seconds(self) -> float:
        """Seconds per output token after the first (spec §1.2); 0 for a one-token answer."""
        assert self.job is not None and self.job.completed_seconds is not None
        assert self.job.first_token_seconds is not None
        if self.trace.output_tokens <= 1:
            return 0.0
        return (self.job.completed_seconds - self.job.first_token_seconds) \
            / (self.trace.output_tokens - 1)


@dataclass(eq=False)
class SimReplica:
    """A replica the control plane placed: its engine, its prefix cache and its lifetime."""

    replica_id: str
    tensor_parallel: int
    kv_capacity_tokens: int
    placed_seconds: float
    engine: ReplicaEngine
    prefix_cache: ReplicaPrefixCache
    state: ReplicaState = ReplicaState.WARMING
    ready_due_seconds: float | None = None
    ready_seconds: float | None = None
    released_seconds: float | None = None
    busy_until_seconds: float = 0.0
    jobs: dict[int, RequestState] = field(default_factory=dict)

    @property
    def load_tokens(self) -> int:
        return self.engine.outstanding_tokens

    def gpu_seconds(self, end_seconds: float) -> float:
        """GPU time held: from placement until released and drained (or the end of the run)."""
        stop = end_seconds if self.released_seconds is None else max(self.released_seconds,
                                                                      self.busy_until_seconds)
        return max(0.0, stop - self.placed_seconds) * self.tensor_parallel
