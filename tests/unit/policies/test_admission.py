"""Admission (spec §1.8, example 08, §2.4 admission figures, bug 5)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.admission import (
    AdmissionAction,
    AdmissionController,
    AdmissionDecision,
    AdmissionPolicy,
    AdmissionRequest,
    PoolState,
    admit,
    apply_decision,
    promote,
    release,
)
from controlplane.policies.reasons import PolicyInputError, to_plain

ADMIT, QUEUE, SHED = AdmissionAction.ADMIT, AdmissionAction.QUEUE, AdmissionAction.SHED
POLICY = AdmissionPolicy(100, 1, 80)


def request(name: str, prompt: int, output: int, deadline: float = 10.0) -> AdmissionRequest:
    return AdmissionRequest(name, prompt, output, deadline)


def code(decision: AdmissionDecision) -> str:
    return decision.reasons[0].code


@pytest.fixture
def pool() -> AdmissionController:
    return AdmissionController(POLICY)


def test_benign_request_traverses_the_real_reservation_path(pool: AdmissionController) -> None:
    decision = pool.decide(request("normal", 20, 30), now=0, estimated_queue_seconds=1)
    assert (decision.action, decision.reserved_tokens) == (ADMIT, 50)
    assert code(decision) == "live_tokens_reserved"
    assert pool.live_tokens == 50


def test_replayed_request_cannot_double_reserve_capacity(pool: AdmissionController) -> None:
    first = pool.decide(request("normal", 20, 30), now=0, estimated_queue_seconds=1)
    state = pool.state
    second = pool.decide(request("normal", 20, 30), now=1, estimated_queue_seconds=1)
    assert second == first
    assert pool.state is state
    assert pool.live_tokens == 50


def test_replay_with_a_different_payload_is_rejected_not_answered(
        pool: AdmissionController) -> None:
    pool.decide(request("normal", 20, 30), now=0, estimated_queue_seconds=1)
    state = pool.state
    decision = pool.decide(request("normal", 20, 31), now=1, estimated_queue_seconds=1)
    assert decision.action is AdmissionAction.REJECT
    assert code(decision) == "replay_payload_mismatch"
    assert decision.reasons[0].facts["recorded_action"] == "admit"
    assert pool.state is state


def test_oversize_request_is_shed_without_mutating_state(pool: AdmissionController) -> None:
    decision = pool.decide(request("huge", 50, 50), now=0, estimated_queue_seconds=1)
    assert (decision.action, decision.reserved_tokens) == (SHED, 0)
    assert code(decision) == "token_bound_exceeded"
    assert decision.reasons[0].facts["retryable"] is False
    assert (pool.live_tokens, pool.queued_requests) == (0, 0)


def test_request_exactly_at_the_per_request_bound_is_admitted(pool: AdmissionController) -> None:
    decision = pool.decide(request("edge", 30, 50), now=0, estimated_queue_seconds=1)
    assert (decision.action, decision.reserved_tokens) == (ADMIT, 80)


def test_overload_queues_once_then_sheds_instead_of_growing_unbounded(
        pool: AdmissionController) -> None:
    setup = pool.decide(request("active", 40, 40), now=0, estimated_queue_seconds=0)
    assert setup.action is ADMIT
    queued = pool.decide(request("queued", 30, 20), now=0, estimated_queue_seconds=1)
    assert queued.action is QUEUE and code(queued) == "queued_for_live_tokens"
    shed = pool.decide(request("shed", 30, 20), now=0, estimated_queue_seconds=1)
    assert shed.action is SHED and code(shed) == "live_budget_and_queue_full"
    assert (pool.live_tokens, pool.queued_requests) == (80, 1)


def test_example_08_admits_queues_and_sheds_in_order(pool: AdmissionController) -> None:
    actions = [pool.decide(request(name, prompt, output), now=0, estimated_queue_seconds=1).action
               for name, prompt, output in [("interactive", 30, 50), ("queued", 20, 30),
                                            ("overload", 20, 30)]]
    assert actions == [ADMIT, QUEUE, SHED]
    assert (pool.live_tokens, pool.queued_requests) == (80, 1)


def test_capstone_admits_the_benign_request_and_sheds_the_oversize_one_by_token_bound() -> None:
    pool = AdmissionController(AdmissionPolicy(8192, 4, 4096))
    benign = pool.decide(request("interactive-request", 400, 100, 5),
                         now=0, estimated_queue_seconds=0.5)
    oversize = pool.decide(request("unbounded-request", 4500, 4500, 30),
                           now=0, estimated_queue_seconds=0)
    assert (benign.action, benign.reserved_tokens, code(benign)) == \
        (ADMIT, 500, "live_tokens_reserved")
    assert (oversize.action, oversize.reserved_tokens, code(oversize)) == \
        (SHED, 0, "token_bound_exceeded")


def test_releasing_a_shed_request_raises_instead_of_reopening_it(
        pool: AdmissionController) -> None:
    """Regression (bug 5): release used to pop shed records, reopening the id to a new verdict."""
    pool.decide(request("huge", 50, 50), now=0, estimated_queue_seconds=1)
    with pytest.raises(PolicyInputError) as error:
        pool.release("huge", now=1)
    assert error.value.code == "shed_is_permanent"
    again = pool.decide(request("huge", 50, 50), now=2, estimated_queue_seconds=1)
    assert again.action is SHED


def test_releasing_an_admitted_request_returns_its_reserved_tokens(
        pool: AdmissionController) -> None:
    pool.decide(request("normal", 20, 30), now=0, estimated_queue_seconds=1)
    (released,) = pool.release("normal", now=1)
    assert released.action is AdmissionAction.RELEASE
    assert released.reasons[0].facts["freed_tokens"] == 50
    assert pool.live_tokens == 0


def test_replay_after_release_neither_reserves_again_nor_releases_twice(
        pool: AdmissionController) -> None:
    pool.decide(request("normal", 20, 30), now=0, estimated_queue_seconds=1)
    (released,) = pool.release("normal", now=1)
    assert pool.decide(request("normal", 20, 30), now=2, estimated_queue_seconds=1) == released
    assert pool.release("normal", now=3) == (released,)
    assert pool.live_tokens == 0


def test_releasing_an_unknown_request_is_refused(pool: AdmissionController) -> None:
    with pytest.raises(PolicyInputError) as error:
        pool.release("ghost", now=0)
    assert error.value.code == "unknown_request_id"


def test_predicted_deadline_failure_is_decided_before_queueing(
        pool: AdmissionController) -> None:
    pool.decide(request("active", 40, 40), now=0, estimated_queue_seconds=0)
    late = pool.decide(request("late", 10, 20, deadline=2), now=1, estimated_queue_seconds=2)
    assert late.action is SHED and code(late) == "predicted_wait_misses_deadline"
    assert late.reasons[0].facts["predicted_start_seconds"] == pytest.approx(3)
    assert (pool.live_tokens, pool.queued_requests) == (80, 0)


def test_queue_estimate_does_not_shed_a_request_admitted_immediately(
        pool: AdmissionController) -> None:
    """Deliberate (spec §8): the reference shed this; nothing here would wait, so it is admitted."""
    late = pool.decide(request("late", 10, 10, deadline=2), now=1, estimated_queue_seconds=2)
    assert (late.action, late.reserved_tokens) == (ADMIT, 20)


def test_a_request_whose_deadline_already_passed_is_shed(pool: AdmissionController) -> None:
    late = pool.decide(request("late", 10, 10, deadline=2), now=3, estimated_queue_seconds=0)
    assert late.action is SHED and code(late) == "deadline_already_passed"
    assert pool.live_tokens == 0


def test_deadline_equality_passes(pool: AdmissionController) -> None:
    pool.decide(request("active", 40, 40), now=0, estimated_queue_seconds=0)
    edge = pool.decide(request("edge", 10, 20, deadline=3), now=1, estimated_queue_seconds=2)
    assert edge.action is QUEUE


def test_deadline_equality_passes_at_epoch_seconds_where_the_sum_rounds_up(
        pool: AdmissionController) -> None:
    now, deadline = 1_796_043_600.002, 1_796_043_600.202
    assert now + 0.2 > deadline  # the float sum lands past the deadline it equals
    pool.decide(request("active", 40, 40, deadline=now + 99), now=now, estimated_queue_seconds=0)
    edge = pool.decide(request("edge", 10, 20, deadline=deadline), now=now,
                       estimated_queue_seconds=0.2)
    assert edge.action is QUEUE
    late = pool.decide(request("late", 10, 20, deadline=deadline - 1e-6), now=now,
                       estimated_queue_seconds=0.2)
    assert code(late) == "predicted_wait_misses_deadline"


def test_release_promotes_the_queue_in_fifo_order_while_it_fits() -> None:
    pool = AdmissionController(AdmissionPolicy(100, 3, 100))
    pool.decide(request("big", 50, 50, 99), now=0, estimated_queue_seconds=0)
    for name, tokens in [("first", 60), ("second", 30), ("third", 20)]:
        assert pool.decide(request(name, tokens, 0, 99), now=0,
                           estimated_queue_seconds=1).action is QUEUE
    released, *promoted = pool.release("big", now=5)
    assert [(d.request_id, d.action, d.reserved_tokens) for d in promoted] == \
        [("first", ADMIT, 60), ("second", ADMIT, 30)]
    assert [code(d) for d in promoted] == ["promoted_from_queue"] * 2
    assert promoted[0].reasons[0].facts["waited_seconds"] == pytest.approx(5)
    assert (pool.live_tokens, pool.state.queue) == (90, ("third",))


def test_a_queued_head_that_does_not_fit_blocks_smaller_followers() -> None:
    pool = AdmissionController(AdmissionPolicy(100, 3, 100))
    pool.decide(request("a", 60, 0, 99), now=0, estimated_queue_seconds=0)
    pool.decide(request("b", 30, 0, 99), now=0, estimated_queue_seconds=0)
    pool.decide(request("head", 70, 0, 99), now=0, estimated_queue_seconds=1)
    pool.decide(request("small", 5, 0, 99), now=0, estimated_queue_seconds=1)
    assert pool.state.queue == ("head", "small")
    (_,) = pool.release("b", now=1)
    assert (pool.live_tokens, pool.state.queue) == (60, ("head", "small"))


def test_a_newcomer_waits_behind_the_queue_even_when_it_would_fit() -> None:
    pool = AdmissionController(AdmissionPolicy(100, 3, 100))
    pool.decide(request("a", 60, 0, 99), now=0, estimated_queue_seconds=0)
    pool.decide(request("head", 70, 0, 99), now=0, estimated_queue_seconds=1)
    newcomer = pool.decide(request("small", 5, 0, 99), now=0, estimated_queue_seconds=1)
    assert newcomer.action is QUEUE
    assert pool.live_tokens == 60


def test_a_queued_request_past_its_deadline_is_shed_not_promoted() -> None:
    pool = AdmissionController(AdmissionPolicy(100, 2, 100))
    pool.decide(request("a", 100, 0, 99), now=0, estimated_queue_seconds=0)
    pool.decide(request("stale", 10, 0, 3), now=0, estimated_queue_seconds=1)
    pool.decide(request("fresh", 10, 0, 99), now=0, estimated_queue_seconds=1)
    _, expired, promoted = pool.release("a", now=5)
    assert (expired.request_id, expired.action, code(expired)) == \
        ("stale", SHED, "deadline_passed_in_queue")
    assert (promoted.request_id, promoted.action) == ("fresh", ADMIT)
    assert (pool.live_tokens, pool.queued_requests) == (10, 0)


def test_a_queued_request_over_a_lowered_token_bound_is_shed_not_promoted() -> None:
    pool = AdmissionController(AdmissionPolicy(100, 2, 100))
    pool.decide(request("a", 100, 0, 99), now=0, estimated_queue_seconds=0)
    pool.decide(request("wide", 60, 0, 99), now=0, estimated_queue_seconds=1)
    pool.decide(request("narrow", 20, 0, 99), now=0, estimated_queue_seconds=1)
    lowered = AdmissionPolicy(100, 2, 50)
    _, refused, promoted = release(pool.state, "a", 5, lowered)[0]
    assert (refused.request_id, refused.action, code(refused)) == \
        ("wide", SHED, "token_bound_exceeded")
    assert refused.reasons[0].facts["max_tokens_per_request"] == 50
    assert (promoted.request_id, promoted.action) == ("narrow", ADMIT)
    decisions, after = promote(pool.state, 5, lowered)
    assert [(d.request_id, d.action) for d in decisions] == [("wide", SHED)]
    assert after.queue == ("narrow",)


def test_a_queued_request_late_and_over_a_lowered_bound_is_shed_for_the_bound() -> None:
    pool = AdmissionController(AdmissionPolicy(100, 1, 100))
    pool.decide(request("a", 100, 0, 99), now=0, estimated_queue_seconds=0)
    pool.decide(request("wide", 60, 0, 3), now=0, estimated_queue_seconds=1)
    _, refused = release(pool.state, "a", 5, AdmissionPolicy(100, 1, 50))[0]
    assert (code(refused), refused.reasons[0].facts["retryable"]) == ("token_bound_exceeded", False)


def test_a_request_over_the_largest_replica_is_shed_after_the_policy_bound_and_before_the_budget(
) -> None:
    """The pooled budget (100) would hold 60 tokens; no replica (50 each) can."""
    per_replica = AdmissionPolicy(100, 1, 80, max_tokens_per_replica=50)
    wide, _ = admit(PoolState(), request("wide", 60, 0), 0, 0, per_replica)
    assert (wide.action, code(wide), wide.reasons[0].facts["retryable"]) == \
        (SHED, "larger_than_any_replica", False)
    assert wide.reasons[0].facts["max_tokens_per_replica"] == 50
    over_both, _ = admit(PoolState(), request("huge", 90, 0), 0, 0, per_replica)
    assert code(over_both) == "token_bound_exceeded"  # spec 1.8 step 3 first
    exact, _ = admit(PoolState(), request("exact", 50, 0), 0, 0, per_replica)
    assert exact.action is ADMIT


def test_a_queued_head_over_the_largest_replica_left_is_shed_when_the_queue_moves() -> None:
    pool = AdmissionController(AdmissionPolicy(100, 2, 100))
    pool.decide(request("a", 100, 0, 99), now=0, estimated_queue_seconds=0)
    pool.decide(request("wide", 60, 0, 99), now=0, estimated_queue_seconds=1)
    pool.decide(request("narrow", 20, 0, 99), now=0, estimated_queue_seconds=1)
    smaller = AdmissionPolicy(100, 2, 100, max_tokens_per_replica=50)
    _, refused, promoted = release(pool.state, "a", 5, smaller)[0]
    assert (refused.request_id, code(refused)) == ("wide", "larger_than_any_replica")
    assert (promoted.request_id, promoted.action) == ("narrow", ADMIT)


def test_a_per_replica_bound_must_be_a_positive_integer() -> None:
    with pytest.raises(PolicyInputError) as refused:
        admit(PoolState(), request("a", 1, 0), 0, 0,
              AdmissionPolicy(100, 1, 80, max_tokens_per_replica=0))
    assert refused.value.field == "max_tokens_per_replica"


def test_a_grown_budget_promotes_the_queue_head_first_and_never_past_one_that_does_not_fit(
        ) -> None:
    pool = AdmissionController(AdmissionPolicy(100, 4, 1_000))
    pool.decide(request("a", 100, 0, 99), now=0, estimated_queue_seconds=0)
    for name, tokens, deadline in [("stale", 10, 3), ("head", 80, 99), ("big", 200, 99),
                                   ("small", 5, 99)]:
        assert pool.decide(request(name, tokens, 0, deadline), now=0,
                           estimated_queue_seconds=1).action is QUEUE
    # Under the same full budget only the head past its deadline goes (shed); nothing is admitted.
    same_budget, _ = promote(pool.state, 5, AdmissionPolicy(100, 4, 1_000))
    assert [(d.request_id, d.action) for d in same_budget] == [("stale", SHED)]
    decisions, after = promote(pool.state, 5, AdmissionPolicy(250, 4, 1_000))
    assert [(d.request_id, d.action, code(d)) for d in decisions] == [
        ("stale", SHED, "deadline_passed_in_queue"), ("head", ADMIT, "promoted_from_queue")]
    assert decisions[1].reasons[0].facts["max_live_tokens"] == 250
    assert (after.live_tokens, after.queue) == (180, ("big", "small"))
    # Folding the recorded decisions rebuilds exactly the state the policy returned.
    folded = pool.state
    for decision in decisions:
        folded = apply_decision(folded, decision, 5, AdmissionPolicy(250, 4, 1_000))
    assert folded == after


def test_promoting_an_empty_queue_decides_nothing() -> None:
    state = PoolState(40, ())
    assert promote(state, 1, POLICY) == ((), state)


def test_withdrawing_a_queued_request_frees_its_slot() -> None:
    pool = AdmissionController(AdmissionPolicy(100, 1, 100))
    pool.decide(request("a", 100, 0, 99), now=0, estimated_queue_seconds=0)
    pool.decide(request("q", 10, 0, 99), now=0, estimated_queue_seconds=1)
    (withdrawn,) = pool.release("q", now=1)
    assert code(withdrawn) == "queued_request_withdrawn"
    assert (pool.live_tokens, pool.queued_requests) == (100, 0)


def test_a_shed_record_expires_after_its_ttl_and_the_id_is_judged_afresh() -> None:
    pool = AdmissionController(AdmissionPolicy(100, 0, 80, record_ttl_seconds=60))
    pool.decide(request("busy", 80, 0, 999), now=0, estimated_queue_seconds=0)
    assert pool.decide(request("retry", 30, 0, 999), now=0, estimated_queue_seconds=0).action \
        is SHED
    pool.release("busy", now=10)
    assert pool.decide(request("retry", 30, 0, 999), now=59.5,
                       estimated_queue_seconds=0).action is SHED
    again = pool.decide(request("retry", 30, 0, 999), now=60, estimated_queue_seconds=0)
    assert again.action is ADMIT
    pool.decide(request("later", 1, 0, 999), now=70, estimated_queue_seconds=0)
    assert "busy" not in {r.request.identifier for r in pool.state.records}


def test_settled_records_are_bounded_evicting_the_oldest_first() -> None:
    pool = AdmissionController(AdmissionPolicy(100, 0, 10, max_settled_records=2))
    for second, name in enumerate(["s1", "s2", "s3"]):
        pool.decide(request(name, 50, 0), now=second, estimated_queue_seconds=0)
    assert [r.request.identifier for r in pool.state.records] == ["s2", "s3"]
    assert pool.decide(request("s1", 5, 0), now=4, estimated_queue_seconds=0).action is ADMIT


def test_settled_records_are_forgotten_in_the_order_they_settled() -> None:
    pool = AdmissionController(AdmissionPolicy(100, 0, 10, max_settled_records=2))
    # Logical time may step back between commands; the oldest is the one that settled first.
    for now, name in ((5, "s1"), (3, "s2"), (4, "s3")):
        pool.decide(request(name, 50, 0), now=now, estimated_queue_seconds=0)
    assert [r.request.identifier for r in pool.state.records] == ["s2", "s3"]


def test_pool_state_is_plain_json_data() -> None:
    pool = AdmissionController(POLICY)
    pool.decide(request("a", 40, 40), now=0, estimated_queue_seconds=0)
    pool.decide(request("b", 10, 20), now=0, estimated_queue_seconds=0)
    plain = to_plain(pool.state)
    assert json.loads(json.dumps(plain, allow_nan=False)) == plain
    assert plain["queue"] == ["b"]


@pytest.mark.parametrize(("bad", "field", "code_"), [
    (request(" ", 1, 1), "identifier", "request_id_required"),
    (request("x", -1, 5), "prompt_tokens", "token_count_negative"),
    (request("x", 0, 0), "max_output_tokens", "request_reserves_nothing"),
    (request("x", 1, 1, math.nan), "deadline_at_seconds", "time_not_finite"),
])
def test_invalid_requests_are_refused_and_record_nothing(
        bad: AdmissionRequest, field: str, code_: str) -> None:
    with pytest.raises(PolicyInputError) as error:
        admit(PoolState(), bad, 0, 0, POLICY)
    assert (error.value.field, error.value.code) == (field, code_)


@pytest.mark.parametrize(("now", "estimate", "field"), [
    (math.inf, 0, "now"), (0, -1, "estimated_queue_seconds"),
    (0, math.nan, "estimated_queue_seconds")])
def test_invalid_time_inputs_are_refused(now: float, estimate: float, field: str) -> None:
    with pytest.raises(PolicyInputError) as error:
        admit(PoolState(), request("x", 1, 1), now, estimate, POLICY)
    assert error.value.field == field


@pytest.mark.parametrize(("policy", "field"), [
    (AdmissionPolicy(0, 1, 80), "max_live_tokens"),
    (AdmissionPolicy(100, -1, 80), "max_queued_requests"),
    (AdmissionPolicy(100, 1, 0), "max_tokens_per_request"),
    (AdmissionPolicy(100, 1, 80, record_ttl_seconds=0), "record_ttl_seconds"),
])
def test_invalid_policies_are_refused(policy: AdmissionPolicy, field: str) -> None:
    with pytest.raises(PolicyInputError) as error:
        AdmissionController(policy)
    assert (error.value.code, error.value.field) == ("admission_capacity_invalid", field)


admit_ops = st.tuples(st.just("admit"), st.sampled_from("abcdefg"), st.integers(0, 60),
                      st.integers(0, 60), st.integers(0, 40), st.integers(0, 5))
release_ops = st.tuples(st.just("release"), st.sampled_from("abcdefg"))
operations = st.lists(st.tuples(st.integers(0, 3), st.one_of(admit_ops, release_ops)),
                      max_size=40)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_counters_stay_consistent_and_folding_the_decisions_rebuilds_the_state(
        ops: list[tuple[int, tuple[object, ...]]]) -> None:
    policy = AdmissionPolicy(100, 2, 80, record_ttl_seconds=30, max_settled_records=3)
    state, now = PoolState(), 0.0
    events: list[tuple[AdmissionDecision, float, AdmissionRequest | None]] = []
    for step, op in ops:
        now += step
        if op[0] == "admit":
            _, name, prompt, output, deadline, estimate = op
            candidate = AdmissionRequest(str(name), int(str(prompt)), int(str(output)),
                                         now + int(str(deadline)))
            if candidate.maximum_live_tokens == 0:
                continue
            decision, new_state = admit(state, candidate, now, int(str(estimate)), policy)
            if decision.action in (SHED, AdmissionAction.REJECT):
                # An admission-time shed or rejection changes no counter.
                assert (new_state.live_tokens, new_state.queue) == (state.live_tokens,
                                                                    state.queue)
            replayed, replay_state = admit(new_state, candidate, now, 0, policy)
            assert decision.action is AdmissionAction.REJECT or replayed == decision
            assert replay_state is new_state
            events.append((decision, now, candidate))
            state = new_state
        else:
            try:
                decisions, state = release(state, str(op[1]), now, policy)
            except PolicyInputError as error:
                assert error.code in ("unknown_request_id", "shed_is_permanent")
                continue
            events.extend((decision, now, None) for decision in decisions)
        admitted = [r for r in state.records if r.decision.action is ADMIT]
        assert state.live_tokens == sum(r.decision.reserved_tokens for r in admitted)
        assert state.live_tokens <= policy.max_live_tokens
        assert len(state.queue) <= policy.max_queued_requests
        assert {r.request.identifier for r in state.records
                if r.decision.action is QUEUE} == set(state.queue)
        settled = [r for r in state.records if r.decision.action in (SHED,
                                                                      AdmissionAction.RELEASE)]
        assert len(settled) <= policy.max_settled_records
    folded = PoolState()
    for decision, at, original in events:
        folded = apply_decision(folded, decision, at, policy, original)
    assert folded == state


def _refusal(refused: object) -> str:
    with pytest.raises(PolicyInputError) as error:
        refused()  # type: ignore[operator]
    return error.value.message


def test_a_refusal_keeps_the_message_its_rejection_records() -> None:
    """A rejection records the message in the log: formatting it only when its check fails
    must not change a character of it."""
    pool = AdmissionController(POLICY)
    pool.decide(request("a", 1, 1), now=0, estimated_queue_seconds=0)
    pool.release("a", now=1)
    assert _refusal(lambda: admit(PoolState(), request("x", -1, 5), 0, 0, POLICY)) \
        == "prompt_tokens must be a non-negative integer"
    assert _refusal(lambda: admit(PoolState(), request("x", 1, 1, math.nan), 0, 0, POLICY)) \
        == "deadline_at_seconds must be a finite time"
    assert _refusal(lambda: admit(PoolState(), request("x", 1, 1), math.inf, 0, POLICY)) \
        == "now must be a finite time"
    assert _refusal(lambda: AdmissionController(AdmissionPolicy(0, 1, 80))) \
        == "max_live_tokens must be a positive integer"
    assert _refusal(lambda: apply_decision(pool.state, AdmissionDecision("a", ADMIT, 2, ()), 2,
                                           POLICY)) == "a admit decision cannot follow release"
