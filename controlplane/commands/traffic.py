"""Traffic commands: admit and release requests against a pool's live-token budget, observe load.

Times are absolute (`deadline_at`, `observed_at`) and compared with the command's logical `at`;
no handler reads a clock.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from controlplane.commands.base import MAX_TOKENS, CommandBase, Frozen, Name, as_utc

MAX_QUEUE_ESTIMATE_SECONDS = 10_000_000.0
MAX_TOKENS_PER_SECOND = 1_000_000_000.0
MAX_OBSERVATIONS = 1_000


UtcTime = Annotated[datetime, AfterValidator(as_utc)]
TokenCount = Annotated[int, Field(strict=True, ge=0, le=MAX_TOKENS)]


def seconds(moment: datetime) -> float:
    """A logical time as seconds since the epoch: the clock every traffic policy reads."""
    return moment.timestamp()


class AdmitRequest(CommandBase):
    """Admit, queue or shed one request against its pool's live-token budget (spec 1.8).

    Idempotent by `request_id`: the same request again gets its recorded decision; a different
    payload under the same id is refused with `replay_payload_mismatch`.
    """

    type: Literal["AdmitRequest"] = "AdmitRequest"
    request_id: Name
    pool_id: Name
    prompt_tokens: TokenCount
    max_output_tokens: TokenCount
    deadline_at: UtcTime
    estimated_queue_seconds: Annotated[float, Field(strict=True, ge=0, le=MAX_QUEUE_ESTIMATE_SECONDS,
                                                    allow_inf_nan=False)] = 0.0

    @model_validator(mode="after")
    def _reserves_something(self) -> AdmitRequest:
        if self.prompt_tokens + self.max_output_tokens <= 0:
            raise ValueError("a request must reserve at least one live token")
        return self

    def references(self) -> list[tuple[str, str]]:
        return [("pool_id", f"pool/{self.pool_id}")]

    def creates(self) -> list[str]:
        return [f"request/{self.request_id}"]


class ReleaseRequest(CommandBase):
    """Return a request's reservation (or queue slot) and promote the queue in FIFO order."""

    type: Literal["ReleaseRequest"] = "ReleaseRequest"
    request_id: Name

    def references(self) -> list[tuple[str, str]]:
        return [("request_id", f"request/{self.request_id}")]


class TokenObservation(Frozen):
    """Token demand seen on a pool at one moment: backlog and arrival rate (never CPU)."""

    observed_at: UtcTime
    queued_tokens: Annotated[int, Field(strict=True, ge=0, le=1_000_000_000_000)]
    arrival_tokens_per_second: Annotated[float, Field(strict=True, ge=0, le=MAX_TOKENS_PER_SECOND,
                                                      allow_inf_nan=False)]


class ObserveLoad(CommandBase):
    """Feed token observations to a pool's autoscaler, which decides a replica target (spec 1.10)."""

    type: Literal["ObserveLoad"] = "ObserveLoad"
    pool_id: Name
    observations: Annotated[list[TokenObservation], Field(min_length=1, max_length=MAX_OBSERVATIONS)]

    @model_validator(mode="after")
    def _not_in_the_future(self) -> ObserveLoad:
        if any(observation.observed_at > self.at for observation in self.observations):
            raise ValueError("observations may not be later than the command's `at`")
        return self

    def references(self) -> list[tuple[str, str]]:
        return [("pool_id", f"pool/{self.pool_id}")]


COMMANDS: list[type[CommandBase]] = [AdmitRequest, ReleaseRequest, ObserveLoad]
