"""A reconciliation is refused when the operation's own record contradicts its evidence.

More output than the operation let the provider produce would commit more than was granted
(and can take the shared budget past its limit); "not_processed" for a `persist_failed`
operation would release the grant of work the provider did (spec §5.1 step 9, §8 Q5).
"""

from __future__ import annotations

from controlplane.commands.gateway import ReconcileOperation
from controlplane.gateway.fixture_provider import Fault
from controlplane.gateway.scenario import GatewayDriver, dispatch
from controlplane.state import gateway as gw


def budget_figures(gateway: GatewayDriver) -> tuple[int, int]:
    budget = gateway.budget()
    return budget["reserved_units"], budget["committed_units"]


def refusal(gateway: GatewayDriver, key: str) -> tuple[str, dict[str, object]]:
    last = gateway.store.read_stream(gw.operation_stream("acme", key))[-1]
    assert last.event_type == gw.RECONCILE_REFUSED
    return last.data["reasons"][0]["code"], last.data["reasons"][0]["facts"]


def completed(key: str, output_tokens: int) -> ReconcileOperation:
    return ReconcileOperation(tenant="acme", idempotency_key=key, resolution="completed",
                              evidence_ref="provider-ledger", answer_text="late answer",
                              output_tokens=output_tokens)


def test_a_reconciliation_cannot_report_more_output_than_the_operation_allowed(
        gateway: GatewayDriver) -> None:
    gateway.provider.script(Fault("timeout_after_send", idempotency_key="ka"))
    assert gateway.send(dispatch("alice", "ka"))["outcome"] == "outcome_unknown"  # 100 in, 256 out
    gateway.run(completed("ka", 50_000))
    code, facts = refusal(gateway, "ka")
    assert (code, facts["output_tokens"], facts["limit_tokens"]) == ("output_limit_exceeded", 50_000, 256)
    assert gateway.operation("acme", "ka")["state"] == "unknown"  # type: ignore[index]
    assert budget_figures(gateway) == (356, 0)
    gateway.run(completed("ka", 256))  # the most the provider could have produced
    assert gateway.operation("acme", "ka")["state"] == "completed"  # type: ignore[index]
    assert budget_figures(gateway) == (0, 356)


def test_a_persist_failed_operation_cannot_be_reconciled_as_not_processed(
        gateway: GatewayDriver) -> None:
    gateway.provider.script(Fault("persist_fails", idempotency_key="kb"))
    assert gateway.send(dispatch("alice", "kb"))["outcome"] == "persist_failed"
    gateway.run(ReconcileOperation(tenant="acme", idempotency_key="kb", resolution="not_processed",
                                   evidence_ref="provider-ledger"))
    code, facts = refusal(gateway, "kb")
    assert (code, facts["outcome_code"]) == ("provider_returned_a_result", "persist_failed")
    operation = gateway.operation("acme", "kb")
    assert operation is not None and (operation["state"], operation["outcome_code"]) == \
        ("unknown", "persist_failed")
    assert budget_figures(gateway) == (356, 0) and gateway.calls(key="kb") == 1
    gateway.run(completed("kb", 10))  # importing the provider's answer is still allowed
    assert gateway.operation("acme", "kb")["state"] == "completed"  # type: ignore[index]
    assert budget_figures(gateway) == (0, 110)
