"""Idempotency: the request fingerprint, conflicts, and the replay of an existing operation
(spec §5.2, §6, §7).

Guarantee (spec G2, G7): a replay never selects, bounds, reserves or dispatches; it re-checks the
caller's current right to the original evidence and then returns what the operation recorded:
the saved answer, the same typed uncertainty, the same typed failure (`provider_refused` only when
a provider refused it, else `not_processed`), or "in progress".
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from controlplane.policies.gateway import (
    DispatchRequest,
    OperationState,
    Principal,
    Source,
    SourceRef,
    Step,
    StepVerdict,
    allow,
    deny,
    lease_expired,
)
from controlplane.policies.gateway_authorise import authorise_evidence
from controlplane.policies.reasons import Reason, require


def fingerprint(request: DispatchRequest) -> str:
    """A digest of what makes two requests "the same input" (spec §5.2).

    The principal and the pointer *name* are in it (another caller's key is a conflict; a moved
    release is not); the tenant and key are the lookup itself, so they are not.
    """
    body = {
        "principal_id": request.principal_id,
        "pointer_name": request.pointer_name,
        "input": request.input_text,
        "max_output_tokens": request.max_output_tokens,
        "capabilities": sorted(request.capabilities_requested),
        "network_preference": (request.network_preference.value
                               if request.network_preference is not None else None),
        "source_refs": sorted([ref.source_ref, ref.version] for ref in request.source_refs),
    }
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class StoredOperation:
    """What the operation store holds about an existing (tenant, key)."""

    operation_id: str
    principal_id: str
    fingerprint: str
    state: OperationState
    evidence: tuple[SourceRef, ...]
    outcome_code: str | None = None
    dispatch_count: int = 1


class ReplayOutcome(StrEnum):
    COMPLETED = "completed"
    OUTCOME_UNKNOWN = "outcome_unknown"
    PERSIST_FAILED = "persist_failed"
    PROVIDER_REFUSED = "provider_refused"
    NOT_PROCESSED = "not_processed"
    IN_PROGRESS = "operation_in_progress"
    DENIED = "denied"


@dataclass(frozen=True)
class ReplayDecision:
    """The answer to a replay; `verdict` is the re-authorisation (a denial withholds everything)."""

    outcome: ReplayOutcome
    verdict: StepVerdict
    reasons: tuple[Reason, ...]


def check_fingerprint(stored: StoredOperation, request_fingerprint: str) -> StepVerdict:
    """Allow a replay only of the very same input; anything else under the key is a conflict."""
    if stored.fingerprint != request_fingerprint:
        return deny(Step.RESERVE, [Reason("idempotency_conflict",
                                          "the key was used with a different request",
                                          {"operation_id": stored.operation_id})])
    return allow(Step.REPLAY, "same_request", "the request matches the operation's fingerprint",
                 operation_id=stored.operation_id)


def _failed(stored: StoredOperation, verdict: StepVerdict, facts: dict[str, str]) -> ReplayDecision:
    """A failed operation's typed error: a refusal only when a provider refused it.

    One never sent, or settled by an operator's "not_processed" evidence, was refused by no one:
    it answers `not_processed`, with the recorded code saying why (spec §4 `failed`: the same
    typed error on every replay). It is never re-executed: the key stays this operation's
    (spec G2, §4: no second operation for a key), and a reconciliation is never reopened by a
    caller's retry (spec §13.3); a new request takes a new key.
    """
    if stored.outcome_code == "not_processed" or stored.dispatch_count == 0:
        reason = Reason("not_processed", "the request was not processed and will not be sent; "
                        "send it again under a new key",
                        {**facts, "outcome_code": stored.outcome_code,
                         "dispatch_count": stored.dispatch_count})
        return ReplayDecision(ReplayOutcome.NOT_PROCESSED, verdict, (reason,))
    reason = Reason("provider_refused", "the provider refused the request before processing it",
                    facts)
    return ReplayDecision(ReplayOutcome.PROVIDER_REFUSED, verdict, (reason,))


def replay_operation(stored: StoredOperation, principal: Principal, sources: Mapping[str, Source],
                     since_dispatch_seconds: float | None,
                     since_dispatch_wall_seconds: float | None,
                     lease_seconds: float) -> ReplayDecision:
    """Re-authorise the original evidence now, then report the operation's recorded outcome.

    A `dispatching` operation whose lease has run out on both clocks (`lease_expired`: the
    requests' own times and the control plane's) is reported as an unknown outcome: its call
    may have happened and it will never be made again. A request dated ahead of its clock
    cannot make a call still running look abandoned.
    """
    require(math.isfinite(lease_seconds) and lease_seconds > 0, "lease_not_positive",
            "lease_seconds", "the dispatch lease must be a positive number of seconds")
    for name, elapsed in (("since_dispatch_seconds", since_dispatch_seconds),
                          ("since_dispatch_wall_seconds", since_dispatch_wall_seconds)):
        require(elapsed is None or math.isfinite(elapsed), "elapsed_not_finite", name,
                "elapsed time must be finite")
    checked = authorise_evidence(principal, stored.evidence, sources)
    if not checked.allowed:
        verdict = StepVerdict(Step.REPLAY, False, checked.reasons)
        return ReplayDecision(ReplayOutcome.DENIED, verdict, checked.reasons)
    verdict = StepVerdict(Step.REPLAY, True, checked.reasons)
    facts = {"operation_id": stored.operation_id, "state": stored.state.value}
    if stored.state is OperationState.COMPLETED:
        reason = Reason("saved_answer_replayed", "the saved answer is returned, not regenerated", facts)
        return ReplayDecision(ReplayOutcome.COMPLETED, verdict, (reason,))
    if stored.state is OperationState.UNKNOWN:
        outcome = (ReplayOutcome.PERSIST_FAILED if stored.outcome_code == "persist_failed"
                   else ReplayOutcome.OUTCOME_UNKNOWN)
        reason = Reason(outcome.value, "the provider may have processed this request; "
                        "it will not be retried", facts)
        return ReplayDecision(outcome, verdict, (reason,))
    if stored.state is OperationState.FAILED:
        return _failed(stored, verdict, facts)
    if lease_expired(since_dispatch_seconds, since_dispatch_wall_seconds, lease_seconds):
        reason = Reason("outcome_unknown", "the dispatch lease expired without a recorded result; "
                        "it will not be retried",
                        {**facts, "since_dispatch_seconds": since_dispatch_seconds,
                         "since_dispatch_wall_seconds": since_dispatch_wall_seconds,
                         "lease_seconds": lease_seconds, "lease": "dispatch_lease_expired"})
        return ReplayDecision(ReplayOutcome.OUTCOME_UNKNOWN, verdict, (reason,))
    reason = Reason("operation_in_progress", "the operation is still in progress", facts)
    return ReplayDecision(ReplayOutcome.IN_PROGRESS, verdict, (reason,))
