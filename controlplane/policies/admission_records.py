"""What admission remembers: requests, decisions, each pool's records, and how long they last.

Settled records (shed, released) are kept for `record_ttl_seconds` and at most
`max_settled_records` per pool, forgotten oldest first in the order they settled. The same two
predicates decide it for the pure pool state here and for the log-backed projection, whose
decisions record what they forgot, so replay forgets exactly the same records.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from controlplane.policies.reasons import Reason


class AdmissionAction(StrEnum):
    ADMIT = "admit"
    QUEUE = "queue"
    SHED = "shed"
    REJECT = "reject"
    RELEASE = "release"


@dataclass(frozen=True)
class AdmissionRequest:
    identifier: str
    prompt_tokens: int
    max_output_tokens: int
    deadline_at_seconds: float

    @property
    def maximum_live_tokens(self) -> int:
        return self.prompt_tokens + self.max_output_tokens


@dataclass(frozen=True)
class AdmissionPolicy:
    """The pool's bounds. `max_tokens_per_replica`, when known, is the most live tokens one of
    its replicas holds: a request runs on one replica, so the pooled budget alone (the sum of
    several) could admit a request none of them can serve."""

    max_live_tokens: int
    max_queued_requests: int
    max_tokens_per_request: int
    record_ttl_seconds: float = 3600.0
    max_settled_records: int = 10_000
    max_tokens_per_replica: int | None = None


@dataclass(frozen=True)
class AdmissionDecision:
    request_id: str
    action: AdmissionAction
    reserved_tokens: int
    reasons: tuple[Reason, ...]


@dataclass(frozen=True)
class AdmissionRecord:
    """A request and its current decision, made at `decided_at_seconds`."""

    request: AdmissionRequest
    decision: AdmissionDecision
    decided_at_seconds: float


@dataclass(frozen=True)
class PoolState:
    """One pool's admission state; `live_tokens` equals the reservations of admitted records."""

    live_tokens: int = 0
    queue: tuple[str, ...] = ()
    records: tuple[AdmissionRecord, ...] = ()

    @property
    def queued_requests(self) -> int:
        return len(self.queue)


SETTLED = (AdmissionAction.SHED, AdmissionAction.RELEASE)


def settled_record_expired(decided_at_seconds: float, now: float,
                           policy: AdmissionPolicy) -> bool:
    """A settled (shed or released) record is past its TTL: its id is judged afresh."""
    return decided_at_seconds + policy.record_ttl_seconds <= now


def forgets_oldest_settled(kept: int, oldest_decided_at_seconds: float, now: float,
                           policy: AdmissionPolicy) -> bool:
    """Whether the oldest of `kept` settled records is forgotten: past its TTL, or one too many."""
    return kept > policy.max_settled_records or settled_record_expired(
        oldest_decided_at_seconds, now, policy)


def find_record(state: PoolState, request_id: str, now: float,
                policy: AdmissionPolicy) -> AdmissionRecord | None:
    """The id's record, treating an expired settled record as already gone."""
    for record in state.records:
        if record.request.identifier == request_id:
            expired = (record.decision.action in SETTLED
                       and settled_record_expired(record.decided_at_seconds, now, policy))
            return None if expired else record
    return None


def forget_settled(state: PoolState, now: float, policy: AdmissionPolicy) -> PoolState:
    """Forget settled records in the order they settled while the oldest is forgettable.

    An expired record behind a live older one waits for its turn; `find_record` already treats
    it as gone, so no decision can tell, and the log-backed projection forgets in this order.
    """
    settled = [r for r in state.records if r.decision.action in SETTLED]
    forget = 0
    while forget < len(settled) and forgets_oldest_settled(
            len(settled) - forget, settled[forget].decided_at_seconds, now, policy):
        forget += 1
    if not forget:
        return state
    gone = {id(record) for record in settled[:forget]}
    return replace(state, records=tuple(r for r in state.records if id(r) not in gone))
