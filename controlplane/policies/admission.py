"""Admission: reserve worst-case live tokens before work starts, queue boundedly, shed explicitly.

The pool's state is an immutable value; `admit` and `release` are pure and return decision(s)
and the next state. `apply_decision` is the fold step: folding the recorded decisions (with the
`now` each was made at) rebuilds exactly the state the policy returned, without re-deciding.

Deliberate choices on the reference's quirks (spec §8):
- A replay returns the id's current decision (admission, promotion or release) and changes
  nothing; a replay with a different payload is `reject`ed with its own code.
- FIFO without overtaking: while anyone is queued a newcomer waits too, so a large queued
  request cannot be starved; `release` promotes the head while it fits, shedding a head whose
  deadline has passed. The queue estimate only decides the deadline of a request that would wait.
- A shed is permanent for the life of its record. Settled records (shed, released) expire after
  `record_ttl_seconds` and at most `max_settled_records` are kept per pool, forgotten in the
  order they settled (oldest first out); an expired or forgotten id is judged afresh. Admitted
  and queued records never expire: they hold the reservation. `records` lists a pool's records
  in the order of their last decision, so its settled ones are in the order they settled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from controlplane.policies.admission_records import (
    AdmissionAction,
    AdmissionDecision,
    AdmissionPolicy,
    AdmissionRecord,
    AdmissionRequest,
    PoolState,
    find_record,
    forget_settled,
)
from controlplane.policies.reasons import PolicyInputError, Reason, require

__all__ = ["AdmissionAction", "AdmissionController", "AdmissionDecision", "AdmissionPolicy",
           "AdmissionRecord", "AdmissionRequest", "PoolState", "admit", "apply_decision",
           "decide_admission", "promote", "release", "shed_without_capacity"]


_TRANSITIONS = {AdmissionAction.QUEUE: (AdmissionAction.ADMIT, AdmissionAction.SHED,
                                        AdmissionAction.RELEASE),
                AdmissionAction.ADMIT: (AdmissionAction.RELEASE,)}


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate_policy(policy: AdmissionPolicy) -> None:
    # Every decision validates its policy and request: a message is formatted only for the
    # check that fails.
    for name in ("max_live_tokens", "max_tokens_per_request", "max_settled_records"):
        value = getattr(policy, name)
        if not (_count(value) and value > 0):
            raise PolicyInputError("admission_capacity_invalid", name,
                                   f"{name} must be a positive integer")
    require(_count(policy.max_queued_requests) and policy.max_queued_requests >= 0,
            "admission_capacity_invalid", "max_queued_requests",
            "max_queued_requests must be a non-negative integer")
    ttl = policy.record_ttl_seconds
    require(math.isfinite(ttl) and ttl > 0, "admission_capacity_invalid", "record_ttl_seconds",
            "record_ttl_seconds must be positive and finite")
    per_replica = policy.max_tokens_per_replica
    require(per_replica is None or _count(per_replica) and per_replica > 0,
            "admission_capacity_invalid", "max_tokens_per_replica",
            "max_tokens_per_replica must be a positive integer when given")


def _over_a_bound(request: AdmissionRequest, tokens: int, policy: AdmissionPolicy,
                  facts: Mapping[str, object]) -> AdmissionDecision | None:
    """The shed of a request no capacity of the pool can ever admit (never retryable): over the
    policy's token bound (spec 1.8 step 3), or over what its largest replica holds."""
    if tokens > policy.max_tokens_per_request:
        return _shed(request, "token_bound_exceeded", "request token bound exceeds policy", False,
                     {**facts, "max_tokens_per_request": policy.max_tokens_per_request})
    per_replica = policy.max_tokens_per_replica
    if per_replica is not None and tokens > per_replica:
        return _shed(request, "larger_than_any_replica",
                     "the request needs more live tokens than any one replica of the pool holds",
                     False, {**facts, "max_tokens_per_replica": per_replica})
    return None


def _validate_time(now: float, field: str = "now") -> None:
    if not math.isfinite(now):
        raise PolicyInputError("time_not_finite", field, f"{field} must be a finite time")


def _validate_request(request: AdmissionRequest, estimated_queue_seconds: float) -> None:
    require(bool(request.identifier.strip()), "request_id_required", "identifier",
            "request identifier is required")
    for name in ("prompt_tokens", "max_output_tokens"):
        value = getattr(request, name)
        if not (_count(value) and value >= 0):
            raise PolicyInputError("token_count_negative", name,
                                   f"{name} must be a non-negative integer")
    require(request.maximum_live_tokens > 0, "request_reserves_nothing", "max_output_tokens",
            "a request must reserve at least one live token")
    _validate_time(request.deadline_at_seconds, "deadline_at_seconds")
    require(math.isfinite(estimated_queue_seconds) and estimated_queue_seconds >= 0,
            "queue_estimate_invalid", "estimated_queue_seconds",
            "the queue estimate must be finite and non-negative")


def _later(time: float, deadline: float) -> bool:
    """Whether `time` is after `deadline` by more than half a microsecond, the resolution of
    the commands' times: a start predicted exactly at the deadline passes (spec §1.8), also
    when the sum of a time and an estimate rounds up, as at epoch seconds it often does
    (1796043600.002 + 0.2 gives 1796043600.2020001)."""
    return time > deadline and not math.isclose(time, deadline, rel_tol=0, abs_tol=5e-7)


def shed_without_capacity(request: AdmissionRequest, now: float, estimated_queue_seconds: float,
                          policy: AdmissionPolicy, facts: Mapping[str, object],
                          retryable: bool) -> AdmissionDecision:
    """A pool with no ready capacity sheds every new request, but the request's own faults come
    first, as in `decide_admission` (spec §1.8): it is validated, and one over the token bound
    (or over every replica, warming ones too) is shed for that, never as retryable (no capacity
    can ever admit it)."""
    _validate_time(now)
    _validate_request(request, estimated_queue_seconds)
    tokens = request.maximum_live_tokens
    bounded = _over_a_bound(request, tokens, policy, {**facts, "request_tokens": tokens})
    if bounded is not None:
        return bounded
    return _shed(request, "no_ready_capacity", "the pool has no ready replica to reserve tokens on",
                 retryable, {**facts, "request_tokens": tokens})


def _shed(request: AdmissionRequest, code: str, message: str, retryable: bool,
          facts: Mapping[str, object]) -> AdmissionDecision:
    reason = Reason(code, message, {**facts, "retryable": retryable, "retry_with_new_id": True})
    return AdmissionDecision(request.identifier, AdmissionAction.SHED, 0, (reason,))


def decide_admission(state: PoolState, request: AdmissionRequest, now: float,
                     estimated_queue_seconds: float, policy: AdmissionPolicy) -> AdmissionDecision:
    """Judge a request against the state without changing it; replays answer from the record."""
    _validate_policy(policy)
    _validate_time(now)
    _validate_request(request, estimated_queue_seconds)
    record = find_record(state, request.identifier, now, policy)
    if record is not None:
        if record.request == request:
            return record.decision
        reason = Reason("replay_payload_mismatch",
                        "this request id was already decided for a different payload",
                        {"recorded_action": record.decision.action.value,
                         "recorded_at_seconds": record.decided_at_seconds})
        return AdmissionDecision(request.identifier, AdmissionAction.REJECT, 0, (reason,))
    tokens = request.maximum_live_tokens
    facts: dict[str, object] = {
        "request_tokens": tokens, "live_tokens": state.live_tokens,
        "max_live_tokens": policy.max_live_tokens, "queued_requests": state.queued_requests,
        "max_queued_requests": policy.max_queued_requests, "now_seconds": now,
        "deadline_at_seconds": request.deadline_at_seconds}
    bounded = _over_a_bound(request, tokens, policy, facts)
    if bounded is not None:
        return bounded
    fits_now = not state.queue and state.live_tokens + tokens <= policy.max_live_tokens
    if fits_now:
        if now > request.deadline_at_seconds:
            return _shed(request, "deadline_already_passed", "the deadline has already passed",
                         False, facts)
        reason = Reason("live_tokens_reserved", "worst-case live-token reservation fits",
                        {**facts, "live_tokens_after": state.live_tokens + tokens})
        return AdmissionDecision(request.identifier, AdmissionAction.ADMIT, tokens, (reason,))
    predicted_start = now + estimated_queue_seconds
    if _later(predicted_start, request.deadline_at_seconds):
        return _shed(request, "predicted_wait_misses_deadline",
                     "predicted queue wait misses the request deadline", True,
                     {**facts, "estimated_queue_seconds": estimated_queue_seconds,
                      "predicted_start_seconds": predicted_start})
    if state.queued_requests < policy.max_queued_requests:
        reason = Reason("queued_for_live_tokens",
                        "live-token budget full or queue non-empty; bounded queue slot reserved",
                        {**facts, "queue_position": state.queued_requests,
                         "estimated_queue_seconds": estimated_queue_seconds})
        return AdmissionDecision(request.identifier, AdmissionAction.QUEUE, 0, (reason,))
    return _shed(request, "live_budget_and_queue_full",
                 "live-token budget and bounded queue are full", True, facts)


def apply_decision(state: PoolState, decision: AdmissionDecision, now: float,
                   policy: AdmissionPolicy, request: AdmissionRequest | None = None) -> PoolState:
    """Fold one recorded decision into the state; a replay or a rejection changes nothing."""
    _validate_policy(policy)
    _validate_time(now)
    return _applied(state, decision, now, policy, request)


def _applied(state: PoolState, decision: AdmissionDecision, now: float, policy: AdmissionPolicy,
             request: AdmissionRequest | None = None) -> PoolState:
    """`apply_decision` for a caller that has validated `policy` and `now` already."""
    if decision.action is AdmissionAction.REJECT:
        return state
    record = find_record(state, decision.request_id, now, policy)
    if record is not None and record.decision == decision:
        return state
    state = forget_settled(state, now, policy)
    queue, live = state.queue, state.live_tokens
    if record is None:
        require(request is not None and request.identifier == decision.request_id
                and decision.action in (AdmissionAction.ADMIT, AdmissionAction.QUEUE,
                                        AdmissionAction.SHED),
                "decision_does_not_apply", "decision", "a new record needs its request")
        assert request is not None
        live += decision.reserved_tokens
        queue += (request.identifier,) if decision.action is AdmissionAction.QUEUE else ()
        new = AdmissionRecord(request, decision, now)
    else:
        was, becomes = record.decision.action, decision.action
        if becomes not in _TRANSITIONS.get(was, ()):
            raise PolicyInputError("decision_does_not_apply", "decision",
                                   f"a {becomes.value} decision cannot follow {was.value}")
        if was is AdmissionAction.QUEUE:
            queue = tuple(rid for rid in queue if rid != decision.request_id)
        live += decision.reserved_tokens - record.decision.reserved_tokens
        new = AdmissionRecord(record.request, decision, now)
    others = tuple(r for r in state.records if r.request.identifier != decision.request_id)
    return forget_settled(PoolState(live, queue, (*others, new)), now, policy)


def admit(state: PoolState, request: AdmissionRequest, now: float,
          estimated_queue_seconds: float,
          policy: AdmissionPolicy) -> tuple[AdmissionDecision, PoolState]:
    """Decide and record a request; only admit and queue change counters, a replay changes none."""
    decision = decide_admission(state, request, now, estimated_queue_seconds, policy)
    return decision, _applied(state, decision, now, policy, request)


def _promotions(state: PoolState, now: float, policy: AdmissionPolicy,
                message: str) -> list[AdmissionDecision]:
    decisions: list[AdmissionDecision] = []
    live = state.live_tokens
    records = {r.request.identifier: r for r in state.records}
    for request_id in state.queue:
        queued = records[request_id]
        tokens = queued.request.maximum_live_tokens
        facts = {"now_seconds": now, "queued_at_seconds": queued.decided_at_seconds,
                 "deadline_at_seconds": queued.request.deadline_at_seconds,
                 "request_tokens": tokens, "live_tokens": live,
                 "max_live_tokens": policy.max_live_tokens}
        # The bound first, as at the door (spec 1.8): a retry under a new id would be refused.
        # The bound was lowered, or the largest replica released, while it waited.
        bounded = _over_a_bound(queued.request, tokens, policy, facts)
        if bounded is not None:
            decisions.append(bounded)
            continue
        if now > queued.request.deadline_at_seconds:
            decisions.append(_shed(queued.request, "deadline_passed_in_queue",
                                   "the deadline passed while the request was queued", True,
                                   facts))
            continue
        if live + tokens > policy.max_live_tokens:
            break
        live += tokens
        reason = Reason("promoted_from_queue", message,
                        {**facts, "live_tokens_after": live,
                         "waited_seconds": now - queued.decided_at_seconds})
        decisions.append(AdmissionDecision(request_id, AdmissionAction.ADMIT, tokens, (reason,)))
    return decisions


def release(state: PoolState, request_id: str, now: float,
            policy: AdmissionPolicy) -> tuple[tuple[AdmissionDecision, ...], PoolState]:
    """Return a request's tokens or queue slot, then promote the queue in FIFO order while it fits.

    The first decision is the release; promotions and queue expiries follow in queue order.
    Releasing a shed id raises `shed_is_permanent`; releasing twice returns the recorded release.
    """
    _validate_policy(policy)
    _validate_time(now)
    record = find_record(state, request_id, now, policy)
    if record is None:
        raise PolicyInputError("unknown_request_id", "request_id",
                               f"no live admission record for request {request_id!r}")
    if record.decision.action is AdmissionAction.SHED:
        raise PolicyInputError("shed_is_permanent", "request_id",
                               f"request {request_id!r} was shed; a shed is permanent")
    if record.decision.action is AdmissionAction.RELEASE:
        return (record.decision,), state
    was_admitted = record.decision.action is AdmissionAction.ADMIT
    freed = record.decision.reserved_tokens
    reason = Reason("reservation_released" if was_admitted else "queued_request_withdrawn",
                    "live-token reservation returned" if was_admitted else "queue slot returned",
                    {"freed_tokens": freed, "live_tokens": state.live_tokens,
                     "live_tokens_after": state.live_tokens - freed, "now_seconds": now})
    released = AdmissionDecision(request_id, AdmissionAction.RELEASE, 0, (reason,))
    state = _applied(state, released, now, policy)
    promoted, state = _promote(state, now, policy, "freed live tokens admit the head of the queue")
    return (released, *promoted), state


# What a promotion says when the budget grew because capacity became ready.
CAPACITY_READY = "new ready capacity admits the head of the queue"
# ... and when a request at the door found heads ahead that could no longer be served.
QUEUE_CLEARED = "the head of the queue fits once the requests ahead of it are settled"


def promote(state: PoolState, now: float, policy: AdmissionPolicy, why: str = CAPACITY_READY,
            ) -> tuple[tuple[AdmissionDecision, ...], PoolState]:
    """Admit the queue's head while it fits under a budget that grew (FIFO, no overtaking).

    A head whose tokens exceed `max_tokens_per_request` (lowered while it waited), or whose
    deadline has passed, is shed and the walk goes on; the walk stops at the first head that does
    not fit. Nothing queued, or nothing that fits, decides nothing. `why` is the
    promotions' message (what grew the budget); their code is `promoted_from_queue`.
    """
    _validate_policy(policy)
    _validate_time(now)
    return _promote(state, now, policy, why)


def _promote(state: PoolState, now: float, policy: AdmissionPolicy,
             message: str) -> tuple[tuple[AdmissionDecision, ...], PoolState]:
    decisions = _promotions(state, now, policy, message)
    for decision in decisions:
        state = _applied(state, decision, now, policy)
    return tuple(decisions), state


class AdmissionController:
    """A convenience holder of one pool's state; every method delegates to the pure functions."""

    def __init__(self, policy: AdmissionPolicy, state: PoolState | None = None) -> None:
        _validate_policy(policy)
        self.policy = policy
        self.state = state if state is not None else PoolState()

    @property
    def live_tokens(self) -> int:
        return self.state.live_tokens

    @property
    def queued_requests(self) -> int:
        return self.state.queued_requests

    def decide(self, request: AdmissionRequest, *, now: float,
               estimated_queue_seconds: float) -> AdmissionDecision:
        """Admit, queue, shed or reject `request`, keeping the new state."""
        decision, self.state = admit(self.state, request, now, estimated_queue_seconds,
                                     self.policy)
        return decision

    def release(self, request_id: str, *, now: float) -> tuple[AdmissionDecision, ...]:
        """Release `request_id` and promote what now fits, keeping the new state."""
        decisions, self.state = release(self.state, request_id, now, self.policy)
        return decisions
