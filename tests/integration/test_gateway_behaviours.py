"""The gateway spec's twelve behaviours (§10), each through the queue and the log.

Every test asserts the adapter calls per route (the fixture provider's ledger), the stored
operation and its state, and the shared budget; and the log re-derives and rebuilds exactly.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from controlplane.commands.gateway import (
    MoveReleasePointer,
    ReconcileOperation,
    RegisterPrincipal,
    RestorePrincipal,
    RestoreSource,
    RevokePrincipal,
    RevokeSource,
)
from controlplane.gateway.fixture_provider import FIXTURE_DIR_ENV, Fault
from controlplane.gateway.scenario import GatewayDriver, dispatch, route, words
from controlplane.state import gateway as gw
from events import transaction
from tests.factories import wall_clock_after


def budget_figures(gateway: GatewayDriver) -> tuple[int, int]:
    budget = gateway.budget()
    return budget["reserved_units"], budget["committed_units"]


def assert_denied_without_trace(gateway: GatewayDriver, response: dict[str, Any], key: str, step: str,
                                code: str, tenant: str = "acme") -> None:
    """A denial in steps 1 to 4: its code, one audit event, no operation, no call (spec G5, G6)."""
    assert (response["outcome"], response["step"], response["code"]) == ("denied", step, code)
    assert response["answer"] is None
    assert gateway.operation(tenant, key) is None
    assert gateway.denials(tenant, key) == [(step, code)]
    assert gateway.stream_types(tenant, key) == [gw.DISPATCH_DENIED]
    assert gateway.calls(tenant=tenant, key=key) == 0


def test_1_approved_dispatch_completes_once_and_replays_the_saved_answer(
        gateway: GatewayDriver) -> None:
    first = gateway.send(dispatch("alice", "k1"))
    assert (first["outcome"], first["answer"], first["replayed"]) == \
        ("completed", {"text": "ANSWER-sh-1-1"}, False)
    assert (gateway.calls("sh-1"), gateway.calls("hc-1")) == (1, 0)
    operation = gateway.operation("acme", "k1")
    assert operation is not None
    assert (operation["state"], operation["dispatch_count"], operation["release_id"],
            operation["profile_id"], operation["route_id"]) == \
        ("completed", 1, "rel-1", "chat-small-v1", "sh-1")
    assert operation["evidence"] == [{"source_ref": "doc-a", "version": 3},
                                     {"source_ref": "doc-b", "version": 1}]
    assert budget_figures(gateway) == (0, 356)
    second = gateway.send(dispatch("alice", "k1"))
    assert (second["outcome"], second["answer"], second["replayed"]) == \
        ("completed", {"text": "ANSWER-sh-1-1"}, True)
    assert gateway.calls("sh-1") == 1 and budget_figures(gateway) == (0, 356)
    assert gateway.stream_types("acme", "k1").count(gw.OPERATION_RESERVED) == 1
    assert gateway.denials("acme", "k1") == []


def test_2_readiness_and_private_constraints_never_fall_back_to_a_forbidden_route(
        gateway: GatewayDriver) -> None:
    gateway.run(route("sh-1", ready=False))
    assert_denied_without_trace(gateway, gateway.send(dispatch("alice", "k2")), "k2", "select",
                                "route_not_ready")
    gateway.run(route("sh-1"))
    assert_denied_without_trace(gateway, gateway.send(dispatch("alice", "k3",
                                                               network_preference="hosted")),
                                "k3", "bound", "network_policy_downgrade")
    gateway.run(route("sh-1", private=False))
    assert_denied_without_trace(gateway, gateway.send(dispatch("alice", "k4")), "k4", "select",
                                "private_route_required")
    assert gateway.calls() == 0 and budget_figures(gateway) == (0, 0)
    gateway.run(route("sh-1", ready=False))
    carol = gateway.send(dispatch("carol", "k5"))
    assert carol["outcome"] == "completed" and carol["route_id"] == "hc-1"
    assert (gateway.calls("hc-1"), gateway.calls("sh-1")) == (1, 0)
    assert gateway.operation("beta", "k5")["state"] == "completed"  # type: ignore[index]
    assert budget_figures(gateway) == (0, 356)


def test_3_an_unknown_profile_or_unvetted_provider_is_denied_at_select(
        gateway: GatewayDriver) -> None:
    gateway.run(MoveReleasePointer(tenant="acme", pointer_name="acme/assistant", release_id="rel-bad"))
    assert_denied_without_trace(gateway, gateway.send(dispatch("alice", "k6")), "k6", "select",
                                "profile_unknown")
    gateway.run(MoveReleasePointer(tenant="acme", pointer_name="acme/assistant", release_id="rel-1"),
                route("sh-1", compatible_profiles=["chat-large-v2"]),
                route("hc-1", compatible_profiles=["chat-large-v2"]))
    assert_denied_without_trace(gateway, gateway.send(dispatch("alice", "k7")), "k7", "select",
                                "provider_not_approved")
    assert gateway.calls() == 0 and budget_figures(gateway) == (0, 0)


@pytest.mark.parametrize(("key", "fields", "code"), [
    ("k4a", {"input_words": 8_192, "max_output_tokens": None}, "input_too_large"),
    ("k4b", {"max_output_tokens": 2_000}, "output_limit_exceeded"),
    ("k4c", {"input_words": 7_500, "max_output_tokens": 1_000}, "context_window_exceeded"),
    ("k4d", {"capabilities_requested": ["tools"]}, "capability_not_allowed"),
])
def test_4_context_and_output_bounds_deny_before_anything_is_reserved(
        gateway: GatewayDriver, key: str, fields: dict[str, Any], code: str) -> None:
    assert_denied_without_trace(gateway, gateway.send(dispatch("alice", key, **fields)), key,
                                "bound", code)
    assert budget_figures(gateway) == (0, 0)
    admitted = gateway.send(dispatch("alice", key + "-ok", max_output_tokens=None))
    assert admitted["outcome"] == "completed"
    assert gateway.provider.calls(idempotency_key=key + "-ok")[0]["max_output_tokens"] == 1_024
    assert budget_figures(gateway) == (0, 1_124)


def test_5_quota_is_checked_before_transport_and_a_denied_key_can_be_retried(
        gateway: GatewayDriver) -> None:
    gateway.provider.script(Fault("timeout_after_send", tenant="beta", times=2))
    gateway.send(dispatch("carol", "c1", input_words=7_000, max_output_tokens=1_000))
    gateway.send(dispatch("carol", "c2", input_words=1_644, max_output_tokens=256))
    assert budget_figures(gateway) == (9_900, 0)  # the budget is shared across tenants
    calls_before = gateway.calls()
    assert_denied_without_trace(gateway, gateway.send(dispatch("alice", "k8")), "k8", "reserve",
                                "quota_exceeded")
    assert gateway.calls() == calls_before and budget_figures(gateway) == (9_900, 0)
    gateway.run(ReconcileOperation(tenant="beta", idempotency_key="c2", resolution="not_processed",
                                   evidence_ref="provider-ledger:c2"))
    assert budget_figures(gateway) == (8_000, 0)
    retried = gateway.send(dispatch("alice", "k8"))
    assert retried["outcome"] == "completed" and gateway.calls(key="k8") == 1
    assert budget_figures(gateway) == (8_000, 356)
    assert gateway.operation("acme", "k8")["grant_units"] == 356  # type: ignore[index]


def test_6_an_unknown_outcome_replays_as_unknown_without_retry_or_fallback(
        gateway: GatewayDriver) -> None:
    gateway.provider.script(Fault("timeout_after_send", route_id="sh-1", idempotency_key="k9"))
    first = gateway.send(dispatch("alice", "k9"))
    assert (first["outcome"], first["answer"]) == ("outcome_unknown", None)
    assert (gateway.calls("sh-1"), gateway.calls("hc-1")) == (1, 0)
    operation = gateway.operation("acme", "k9")
    assert operation is not None
    assert (operation["state"], operation["dispatch_count"], operation["outcome_code"]) == \
        ("unknown", 1, "outcome_unknown")
    assert budget_figures(gateway) == (356, 0)
    assert gw.OPERATION_COMPLETED not in gateway.stream_types("acme", "k9")
    second = gateway.send(dispatch("alice", "k9"))
    assert (second["outcome"], second["replayed"], second["answer"]) == ("outcome_unknown", True, None)
    assert gateway.calls("sh-1") == 1 and budget_figures(gateway) == (356, 0)
    assert gateway.operation("acme", "k9")["state"] == "unknown"  # type: ignore[index]


def test_a_refusal_before_sending_releases_the_grant_and_is_never_sent_again(
        gateway: GatewayDriver) -> None:
    gateway.provider.script(Fault("refuse_before_send", idempotency_key="k9r"))
    assert gateway.send(dispatch("alice", "k9r"))["outcome"] == "provider_refused"
    assert gateway.operation("acme", "k9r")["state"] == "failed"  # type: ignore[index]
    assert budget_figures(gateway) == (0, 0)
    replay = gateway.send(dispatch("alice", "k9r"))
    assert (replay["outcome"], replay["replayed"]) == ("provider_refused", True)
    assert gateway.calls(key="k9r") == 1


def test_a_provider_that_cannot_be_opened_is_a_refusal_before_sending_not_an_unknown_outcome(
        gateway: GatewayDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The adapter failed to open before any send, yet the operation was recorded as an unknown
    # outcome, its grant held until someone reconciled it by hand.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(FIXTURE_DIR_ENV, str(blocker / "provider"))
    response = gateway.send(dispatch("alice", "k9n"))
    assert response["outcome"] == "provider_refused", response
    assert gateway.operation("acme", "k9n")["state"] == "failed"  # type: ignore[index]
    assert budget_figures(gateway) == (0, 0)


def test_7_a_replay_keeps_the_original_bundle_after_the_release_moves(
        gateway: GatewayDriver) -> None:
    original = gateway.send(dispatch("alice", "k10"))
    gateway.provider.script(Fault("timeout_after_send", idempotency_key="k10u"))
    gateway.send(dispatch("alice", "k10u"))
    gateway.run(MoveReleasePointer(tenant="acme", pointer_name="acme/assistant", release_id="rel-2"))
    replay = gateway.send(dispatch("alice", "k10"))
    assert (replay["outcome"], replay["answer"], replay["release_id"], replay["profile_id"],
            replay["route_id"]) == ("completed", original["answer"], "rel-1", "chat-small-v1", "sh-1")
    uncertain = gateway.send(dispatch("alice", "k10u"))
    assert (uncertain["outcome"], uncertain["release_id"]) == ("outcome_unknown", "rel-1")
    assert gateway.calls() == 2
    fresh = gateway.send(dispatch("alice", "k11"))
    assert (fresh["outcome"], fresh["release_id"], fresh["profile_id"]) == \
        ("completed", "rel-2", "chat-large-v2")
    assert gateway.operation("acme", "k11")["evidence"] == [  # type: ignore[index]
        {"source_ref": "doc-c", "version": 2}]
    assert gateway.calls() == 3 and budget_figures(gateway) == (356, 712)


def test_8_a_saved_answer_is_withheld_while_its_evidence_or_caller_is_revoked(
        gateway: GatewayDriver) -> None:
    gateway.send(dispatch("alice", "k12"))
    gateway.run(RevokeSource(tenant="acme", source_ref="doc-a"))
    denied = gateway.send(dispatch("alice", "k12"))
    assert (denied["outcome"], denied["step"], denied["code"], denied["answer"]) == \
        ("denied", "replay", "source_revoked", None)
    assert gateway.calls() == 1 and gateway.operation("acme", "k12")["state"] == "completed"  # type: ignore[index]
    assert gateway.stream_types("acme", "k12").count(gw.OPERATION_COMPLETED) == 1
    gateway.run(RestoreSource(tenant="acme", source_ref="doc-a"))
    assert gateway.send(dispatch("alice", "k12"))["outcome"] == "completed"
    gateway.send(dispatch("bob", "k13"))
    gateway.run(RevokePrincipal(tenant="acme", principal_id="bob"))
    revoked = gateway.send(dispatch("bob", "k13"))
    assert (revoked["step"], revoked["code"]) == ("authorise", "identity_revoked")
    assert gateway.operation("acme", "k13")["state"] == "completed"  # type: ignore[index]
    assert gateway.calls() == 2 and budget_figures(gateway) == (0, 712)


def test_registering_a_revoked_principal_again_keeps_it_revoked_until_it_is_restored(
        gateway: GatewayDriver) -> None:
    """An "ensure it exists" sync that registers every principal again had made a revoked one
    active, serving its saved answers; only `RestorePrincipal` undoes a revocation."""
    assert gateway.send(dispatch("bob", "k13"))["outcome"] == "completed"
    gateway.run(RevokePrincipal(tenant="acme", principal_id="bob"))
    gateway.run(RegisterPrincipal(tenant="acme", principal_id="bob"))
    again = gateway.send(dispatch("bob", "k13"))
    assert (again["code"], again["answer"]) == ("identity_revoked", None)
    gateway.run(RestorePrincipal(tenant="acme", principal_id="bob"))
    assert gateway.send(dispatch("bob", "k13"))["outcome"] == "completed"
    assert gateway.calls() == 1


def test_9_a_different_input_or_caller_under_a_key_is_a_conflict_but_keys_are_per_tenant(
        gateway: GatewayDriver) -> None:
    text_a, text_b = words(100, "a"), words(100, "b")
    gateway.send(dispatch("alice", "k14", text=text_a))
    fingerprint = gateway.operation("acme", "k14")["fingerprint"]  # type: ignore[index]
    for principal, text in (("alice", text_b), ("bob", text_a)):
        conflict = gateway.send(dispatch(principal, "k14", text=text))
        assert (conflict["step"], conflict["code"]) == ("reserve", "idempotency_conflict")
    assert gateway.calls() == 1 and budget_figures(gateway) == (0, 356)
    operation = gateway.operation("acme", "k14")
    assert operation is not None and (operation["state"], operation["fingerprint"]) == \
        ("completed", fingerprint)
    assert gateway.send(dispatch("carol", "k14", text=text_a))["outcome"] == "completed"
    assert gateway.calls(tenant="beta", key="k14") == 1 and budget_figures(gateway) == (0, 712)
    gateway.provider.script(Fault("persist_and_mark_fail", idempotency_key="k14d"))
    gateway.send(dispatch("alice", "k14d", text=text_a))
    assert gateway.operation("acme", "k14d")["state"] == "dispatching"  # type: ignore[index]
    assert gateway.send(dispatch("alice", "k14d", text=text_b))["code"] == "idempotency_conflict"
    assert gateway.send(dispatch("alice", "k14d", text=text_a))["outcome"] == "operation_in_progress"
    assert gateway.calls(key="k14d") == 1


def test_10_a_model_too_large_for_the_self_hosted_plan_has_no_compatible_route(
        gateway: GatewayDriver) -> None:
    gateway.run(MoveReleasePointer(tenant="acme", pointer_name="acme/assistant", release_id="rel-70b"))
    assert_denied_without_trace(gateway, gateway.send(dispatch("alice", "k70")), "k70", "select",
                                "no_compatible_route")
    tp2 = {"gpu_memory_gib": 80.0, "usable_fraction": 0.9, "tensor_parallel_size": 2,
           "max_concurrent_sequences": 5}
    gateway.run(route("sh-1", gpu_plan=tp2))
    assert gateway.send(dispatch("alice", "k70b"))["route_id"] == "sh-1"
    assert gateway.calls("sh-1") == 1 and budget_figures(gateway) == (0, 356)


def test_11_a_failed_final_write_is_never_acknowledged_as_completed_nor_sent_again(
        gateway: GatewayDriver) -> None:
    gateway.provider.script(Fault("persist_fails", idempotency_key="k15"))
    first = gateway.send(dispatch("alice", "k15"))
    assert (first["outcome"], first["answer"]) == ("persist_failed", None)
    operation = gateway.operation("acme", "k15")
    assert operation is not None and (operation["state"], operation["outcome_code"]) == \
        ("unknown", "persist_failed")
    assert gw.OPERATION_COMPLETED not in gateway.stream_types("acme", "k15")
    assert budget_figures(gateway) == (356, 0) and gateway.calls("sh-1") == 1
    replay = gateway.send(dispatch("alice", "k15"))
    assert (replay["outcome"], replay["answer"]) == ("persist_failed", None)
    assert gateway.calls("sh-1") == 1


def test_11b_when_even_the_unknown_mark_fails_the_operation_stays_dispatching_until_reconciled(
        gateway: GatewayDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    sent_at = datetime.now(UTC)
    gateway.provider.script(Fault("persist_and_mark_fail", idempotency_key="k15d"))
    assert gateway.send(dispatch("alice", "k15d", at=sent_at))["outcome"] == "dispatching"
    assert gateway.operation("acme", "k15d")["state"] == "dispatching"  # type: ignore[index]
    later = sent_at + timedelta(seconds=901)
    monkeypatch.setattr(transaction, "wall_clock", wall_clock_after(901))  # the lease runs out
    assert gateway.send(dispatch("alice", "k15d", at=later))["outcome"] == "outcome_unknown"
    early = ReconcileOperation(tenant="acme", idempotency_key="k15d", resolution="completed",
                               evidence_ref="ledger", answer_text="late answer", output_tokens=10,
                               at=sent_at + timedelta(seconds=5))
    gateway.run(early)
    assert gateway.stream_types("acme", "k15d")[-1] == gw.RECONCILE_REFUSED
    gateway.run(early.model_copy(update={"command_id": "reconcile-k15d", "at": later}))
    operation = gateway.operation("acme", "k15d")
    assert operation is not None and (operation["state"], operation["outcome_code"]) == \
        ("completed", "completed")
    assert budget_figures(gateway) == (0, 110)
    replay = gateway.send(dispatch("alice", "k15d", at=later))
    assert (replay["outcome"], replay["answer"]) == ("completed", {"text": "late answer"})
    assert gateway.calls(key="k15d") == 1


def test_12_partial_revocation_withholds_the_whole_answer_and_blocks_new_requests(
        gateway: GatewayDriver) -> None:
    gateway.send(dispatch("alice", "k16"))
    gateway.run(RevokeSource(tenant="acme", source_ref="doc-b"))
    replay = gateway.send(dispatch("alice", "k16"))
    assert (replay["code"], replay["answer"]) == ("source_revoked", None)
    denial = gateway.store.read_stream(gw.operation_stream("acme", "k16"))[-1]
    assert denial.data["reasons"][0]["facts"]["source_refs"] == ["doc-b"]
    assert gateway.operation("acme", "k16")["state"] == "completed"  # type: ignore[index]
    assert_denied_without_trace(gateway, gateway.send(dispatch("alice", "k17")), "k17",
                                "authorise", "source_revoked")
    assert gateway.calls() == 1 and budget_figures(gateway) == (0, 356)
