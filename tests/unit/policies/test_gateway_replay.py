"""Idempotency: fingerprints, conflicts and replays of a recorded operation (spec §5.2, §6, §7)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.gateway import (
    DispatchRequest,
    NetworkPreference,
    OperationState,
    Principal,
    Source,
    SourceRef,
    Step,
)
from controlplane.policies.gateway_replay import (
    ReplayOutcome,
    StoredOperation,
    check_fingerprint,
    fingerprint,
    replay_operation,
)
from controlplane.policies.reasons import PolicyInputError

ALICE = Principal("alice", "acme", True)
SOURCES = {"doc-a": Source("doc-a", "acme", 3, True), "doc-b": Source("doc-b", "acme", 1, True)}
REQUEST = DispatchRequest("acme", "alice", "k1", "acme/assistant", "A quick question",
                          max_output_tokens=256)
STORED = StoredOperation("op-1", "alice", fingerprint(REQUEST), OperationState.COMPLETED,
                         (SourceRef("doc-a", 3), SourceRef("doc-b", 1)), "completed")
LEASE = 900.0


def outcome(stored: StoredOperation, sources: dict[str, Source] = SOURCES,
            elapsed: float | None = 1.0, wall_elapsed: float | None = None) -> ReplayOutcome:
    """The replay's outcome, `elapsed` on the requests' clock and (unless told) the same on the
    control plane's."""
    wall = elapsed if wall_elapsed is None else wall_elapsed
    return replay_operation(stored, ALICE, sources, elapsed, wall, LEASE).outcome


def test_the_fingerprint_ignores_tenant_and_key_but_not_principal_pointer_or_input() -> None:
    assert fingerprint(replace(REQUEST, tenant_id="beta", idempotency_key="k2")) == STORED.fingerprint
    for change in ({"principal_id": "bob"}, {"pointer_name": "acme/other"},
                   {"input_text": "B quick question"}, {"max_output_tokens": None},
                   {"network_preference": NetworkPreference.PRIVATE},
                   {"capabilities_requested": frozenset({"tools"})},
                   {"source_refs": (SourceRef("doc-a", 3),)}):
        assert fingerprint(replace(REQUEST, **change)) != STORED.fingerprint, change


def test_the_fingerprint_does_not_depend_on_the_order_of_sets() -> None:
    one = replace(REQUEST, capabilities_requested=frozenset({"text", "tools"}),
                  source_refs=(SourceRef("doc-a", 3), SourceRef("doc-b", 1)))
    two = replace(one, source_refs=(SourceRef("doc-b", 1), SourceRef("doc-a", 3)))
    assert fingerprint(one) == fingerprint(two)


def test_a_different_input_under_the_same_key_is_a_conflict() -> None:
    verdict = check_fingerprint(STORED, fingerprint(replace(REQUEST, input_text="B")))
    assert (verdict.allowed, verdict.code, verdict.step) == (False, "idempotency_conflict", Step.RESERVE)
    assert check_fingerprint(STORED, STORED.fingerprint).allowed


def test_each_recorded_state_replays_as_its_typed_outcome() -> None:
    assert outcome(STORED) is ReplayOutcome.COMPLETED
    unknown = replace(STORED, state=OperationState.UNKNOWN, outcome_code="outcome_unknown")
    assert outcome(unknown) is ReplayOutcome.OUTCOME_UNKNOWN
    persist = replace(unknown, outcome_code="persist_failed")
    assert outcome(persist) is ReplayOutcome.PERSIST_FAILED
    assert outcome(replace(STORED, state=OperationState.FAILED)) is ReplayOutcome.PROVIDER_REFUSED
    dispatching = replace(STORED, state=OperationState.DISPATCHING, outcome_code=None)
    assert outcome(dispatching) is ReplayOutcome.IN_PROGRESS


def test_a_failed_operation_no_provider_refused_replays_as_not_processed() -> None:
    failed = replace(STORED, state=OperationState.FAILED)
    assert outcome(replace(failed, outcome_code="provider_refused")) is ReplayOutcome.PROVIDER_REFUSED
    assert outcome(replace(failed, outcome_code="not_processed")) is ReplayOutcome.NOT_PROCESSED
    never_sent = replace(failed, outcome_code="reservation_expired", dispatch_count=0)
    assert outcome(never_sent) is ReplayOutcome.NOT_PROCESSED


def test_a_dispatching_operation_past_its_lease_is_reported_unknown_at_the_boundary() -> None:
    dispatching = replace(STORED, state=OperationState.DISPATCHING, outcome_code=None)
    assert outcome(dispatching, elapsed=LEASE - 0.001) is ReplayOutcome.IN_PROGRESS
    decision = replay_operation(dispatching, ALICE, SOURCES, LEASE, LEASE, LEASE)
    assert decision.outcome is ReplayOutcome.OUTCOME_UNKNOWN
    assert decision.reasons[0].facts["lease"] == "dispatch_lease_expired"
    assert decision.reasons[0].facts["since_dispatch_wall_seconds"] == LEASE


def test_a_request_dated_past_the_lease_is_in_progress_until_the_control_planes_clock_agrees(
        ) -> None:
    """The requests' times are their submitters' claims: a replay dated 1,000 s after a call
    made 2 s ago must not report as abandoned a call that may still answer."""
    dispatching = replace(STORED, state=OperationState.DISPATCHING, outcome_code=None)
    assert outcome(dispatching, elapsed=1_000.0, wall_elapsed=2.0) is ReplayOutcome.IN_PROGRESS
    assert outcome(dispatching, elapsed=2.0, wall_elapsed=1_000.0) is ReplayOutcome.IN_PROGRESS
    assert outcome(dispatching, elapsed=1_000.0, wall_elapsed=LEASE) is \
        ReplayOutcome.OUTCOME_UNKNOWN


def test_an_operation_folded_without_its_wall_clock_dispatch_time_is_judged_on_request_times(
        ) -> None:
    """A row from a log older than the two-clock rule (not rebuilt) decides as it did then."""
    dispatching = replace(STORED, state=OperationState.DISPATCHING, outcome_code=None)
    decision = replay_operation(dispatching, ALICE, SOURCES, LEASE, None, LEASE)
    assert decision.outcome is ReplayOutcome.OUTCOME_UNKNOWN
    assert replay_operation(dispatching, ALICE, SOURCES, 1.0, None, LEASE).outcome is \
        ReplayOutcome.IN_PROGRESS


def test_a_revoked_original_source_withholds_the_saved_answer_and_restoring_serves_it() -> None:
    revoked = {**SOURCES, "doc-b": replace(SOURCES["doc-b"], active=False)}
    decision = replay_operation(STORED, ALICE, revoked, 1.0, 1.0, LEASE)
    assert decision.outcome is ReplayOutcome.DENIED and decision.verdict.step is Step.REPLAY
    assert decision.verdict.code == "source_revoked"
    assert decision.reasons[0].facts["source_refs"] == ["doc-b"]
    assert outcome(STORED, SOURCES) is ReplayOutcome.COMPLETED


def test_an_unknown_outcome_is_also_withheld_from_a_caller_who_lost_the_evidence() -> None:
    unknown = replace(STORED, state=OperationState.UNKNOWN, outcome_code="outcome_unknown")
    assert outcome(unknown, {"doc-a": SOURCES["doc-a"]}) is ReplayOutcome.DENIED


def test_a_non_positive_or_non_finite_lease_is_refused() -> None:
    for lease in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(PolicyInputError) as error:
            replay_operation(STORED, ALICE, SOURCES, 1.0, 1.0, lease)
        assert error.value.field == "lease_seconds"


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(list(OperationState)), st.sets(st.sampled_from(["doc-a", "doc-b"])),
       st.floats(0, 10_000, allow_nan=False))
def test_a_replay_serves_an_answer_only_for_a_completed_operation_with_all_evidence_active(
        state: OperationState, revoked: set[str], elapsed: float) -> None:
    sources = {name: replace(s, active=name not in revoked) for name, s in SOURCES.items()}
    result = outcome(replace(STORED, state=state), sources, elapsed)
    served = result is ReplayOutcome.COMPLETED
    assert served == (state is OperationState.COMPLETED and not revoked)
    if revoked:
        assert result is ReplayOutcome.DENIED
