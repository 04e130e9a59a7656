"""`ReconcileOperation`: settle an unknown outcome from out-of-band evidence (spec §4, §13.3).

Only an operator or a reconciliation job with evidence (a provider-side lookup) moves an
operation out of `unknown`, or out of `dispatching` once its lease has expired on both the
commands' clock and the control plane's own. It never calls a provider: "completed" imports
the provider's answer and commits its usage; "not_processed" marks the operation failed and
releases the grant. A settled operation cannot be reconciled again, and
evidence the log contradicts is refused: more output than the operation let the provider produce,
or "not_processed" for an operation whose provider returned a result that only saving lost
(`persist_failed`: the work was done, so its grant stays charged, spec §5.1 step 9).
"""

from __future__ import annotations

import hashlib
from typing import Any

from controlplane.commands.base import CommandBase
from controlplane.commands.gateway import ReconcileOperation
from controlplane.decisions import DecisionContext, append_to, decision_data, new_event
from controlplane.gateway.world import budget_of
from controlplane.handlers.base import Handler, Reads, Streams
from controlplane.handlers.gateway import seconds_between, wall_seconds_since
from controlplane.policies.gateway import lease_expired
from controlplane.policies.gateway_budget import BudgetMovement, release, settle
from controlplane.policies.reasons import PolicyInputError, Reason, to_plain
from controlplane.policy_book import PolicyInForce
from controlplane.state import gateway as gw
from events.model import StreamAppend


def _refused(command: ReconcileOperation, ctx: DecisionContext, policy: PolicyInForce,
             reason: Reason) -> list[StreamAppend]:
    data = decision_data(outcome="refused", reasons=[reason],
                         result={"tenant": command.tenant, "idempotency_key": command.idempotency_key},
                         policy=policy, inputs=_inputs(command), ctx=ctx)
    stream = gw.operation_stream(command.tenant, command.idempotency_key)
    return [append_to(stream, ctx, new_event(command, ctx, "refused", gw.RECONCILE_REFUSED, data))]


def _inputs(command: ReconcileOperation) -> dict[str, Any]:
    return {"tenant": command.tenant, "idempotency_key": command.idempotency_key,
            "resolution": command.resolution, "evidence_ref": command.evidence_ref,
            "output_tokens": command.output_tokens, "note": command.note}


def _contradiction(command: ReconcileOperation, row: dict[str, Any]) -> Reason | None:
    """Why the operation's own record rules out the evidence `command` brings; None if nothing does."""
    facts = {"operation_id": row["operation_id"], "state": row["state"],
             "outcome_code": row.get("outcome_code")}
    if command.resolution == "not_processed" and row.get("outcome_code") == "persist_failed":
        return Reason("provider_returned_a_result", "the provider returned a result that only saving "
                      "lost; the work was done and its grant stays charged", facts)
    if command.output_tokens is not None and command.output_tokens > row["max_output_tokens"]:
        return Reason("output_limit_exceeded", "the evidence reports more output than the operation "
                      "allowed the provider to produce",
                      {**facts, "output_tokens": command.output_tokens,
                       "limit_tokens": row["max_output_tokens"]})
    return None


def _movement(command: ReconcileOperation, ctx: DecisionContext,
              row: dict[str, Any]) -> BudgetMovement:
    budget = budget_of(ctx.state, row["budget_id"])
    if budget is None:
        raise PolicyInputError("budget_not_configured", "budget_id", "the operation's budget is gone")
    if command.resolution == "completed":
        return settle(budget, row["grant_units"], row["input_tokens"] + (command.output_tokens or 0))
    return release(budget, row["grant_units"], "grant_released_on_evidence")


def _lease_running(command: ReconcileOperation, ctx: DecisionContext, policy: PolicyInForce,
                   row: dict[str, Any]) -> dict[str, Any] | None:
    """The lease's figures while it still runs on either clock; None once it has run out on
    both (`lease_expired`).

    A dispatching operation's lease starts at its mark; a reserved one's (never marked, so
    never sent) at its reservation: once that has passed its worker is gone and its job given
    up, so "not_processed" may release its grant. The command's time is its submitter's claim,
    so the control plane's own clock must agree: otherwise a reconciliation dated ahead would
    settle an operation whose call is still running and drop the result it brings.
    """
    lease = policy.parameters["dispatch_lease_seconds"]
    reserved = row["state"] == "reserved"
    elapsed = seconds_between(row.get("created_at") if reserved else row.get("dispatching_at"),
                              command.at)
    wall = wall_seconds_since(row.get("reserved_recorded_at") if reserved
                              else row.get("dispatching_recorded_at"), ctx)
    if lease_expired(elapsed, wall, lease):
        return None
    return {"since_dispatch_seconds": elapsed, "since_dispatch_wall_seconds": wall,
            "lease_seconds": lease}


def handle_reconcile_operation(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Resolve an unknown (or lease-expired dispatching or reserved) operation from evidence,
    once."""
    assert isinstance(command, ReconcileOperation)
    policy = ctx.policies.in_force(ctx.state, "gateway")
    row = ctx.state.get(gw.OPERATIONS, gw.operation_key(command.tenant, command.idempotency_key))
    if row is None:
        return _refused(command, ctx, policy, Reason("operation_not_found", "no operation for this key"))
    facts = {"operation_id": row["operation_id"], "state": row["state"]}
    if row["state"] in ("completed", "failed"):
        return _refused(command, ctx, policy, Reason(
            "operation_already_settled", "a settled operation is never reconciled again", facts))
    reserved = row["state"] == "reserved"
    if reserved and command.resolution != "not_processed":
        return _refused(command, ctx, policy, Reason(
            "operation_never_dispatched", "the operation was never sent to a provider, so it "
            "cannot have completed", facts))
    if row["state"] != "unknown":
        running = _lease_running(command, ctx, policy, row)
        if running is not None:
            return _refused(command, ctx, policy, Reason(
                "operation_in_progress", "the dispatch lease has not expired; its result may "
                "still come", {**facts, **running}))
    contradiction = _contradiction(command, row)
    if contradiction is not None:
        return _refused(command, ctx, policy, contradiction)
    try:
        movement = _movement(command, ctx, row)
    except PolicyInputError as error:
        return _refused(command, ctx, policy, Reason(error.code, error.message, {"field": error.field}))
    completed = command.resolution == "completed"
    result: dict[str, Any] = {
        "tenant": command.tenant, "idempotency_key": command.idempotency_key,
        "operation_id": row["operation_id"], "state": "completed" if completed else "failed",
        "outcome_code": "completed" if completed else "not_processed", "reconciled": True,
        "previous_state": row["state"], "evidence_ref": command.evidence_ref,
        "release_id": row["release_id"], "profile_id": row["profile_id"], "route_id": row["route_id"],
        "evidence": row["evidence"]}
    if completed:
        text = command.answer_text or ""
        result.update(answer={"text": text},
                      answer_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
                      usage={"input_tokens": row["input_tokens"],
                             "output_tokens": command.output_tokens})
    reason = Reason("reconciled_" + ("completed" if completed else "not_processed"),
                    "the outcome was settled from out-of-band evidence; no provider was called",
                    {**facts, "evidence_ref": command.evidence_ref})
    reconciled = new_event(command, ctx, "reconciled", gw.OPERATION_RECONCILED, decision_data(
        outcome=result["outcome_code"], reasons=[reason], result=result, policy=policy,
        inputs=_inputs(command), ctx=ctx,
        causes=[row.get("dispatching_event_id") or row["reserved_event_id"]]))
    budget_event = new_event(command, ctx, "budget", gw.BUDGET_RECONCILED, decision_data(
        outcome=movement.outcome, reasons=movement.reasons,
        result={"budget_id": row["budget_id"], "tenant": command.tenant,
                "idempotency_key": command.idempotency_key, "operation_id": row["operation_id"],
                "grant_units": movement.grant_units, "committed_units": movement.committed_units,
                "released_units": movement.released_units, "before": to_plain(movement.before),
                "after": to_plain(movement.after)},
        policy=policy, inputs=_inputs(command), ctx=ctx, causes=[reconciled.event_id]))
    return [append_to(gw.operation_stream(command.tenant, command.idempotency_key), ctx, reconciled),
            append_to(gw.budget_stream(row["budget_id"]), ctx, budget_event)]


def _streams(command: CommandBase) -> list[str]:
    """The operation's stream (its budget's is known only from the operation's row)."""
    assert isinstance(command, ReconcileOperation)
    return [gw.operation_stream(command.tenant, command.idempotency_key)]


def _reads(command: CommandBase) -> list[tuple[str, str]]:
    """The operation's row."""
    assert isinstance(command, ReconcileOperation)
    return [(gw.OPERATIONS, gw.operation_key(command.tenant, command.idempotency_key))]


HANDLERS: dict[str, Handler] = {"ReconcileOperation": handle_reconcile_operation}
# Versions of the decision rules, each with what changed (see `handlers/base.py`).
RULES_VERSIONS: dict[str, int] = {
    # 2: the lease of a dispatching or reserved operation must have run out on the control
    #    plane's clock (the log's `recorded_at`) as well as between the commands' own times.
    "ReconcileOperation": 2,
}
STREAMS: dict[str, Streams] = {"ReconcileOperation": _streams}
READS: dict[str, Reads] = {"ReconcileOperation": _reads}
