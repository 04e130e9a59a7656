"""`Dispatch`: one inference request as a durable, budgeted operation (gateway spec §5 to §7).

The decision, in one transaction on `operation/<tenant>/<key>` (and `budget/<budget>` at the
version read):
- a denial at authorise, select, bound or reserve: one `DispatchDenied` audit event, nothing else;
- an existing key: a conflict (`DispatchDenied`), or a replay (`OperationReplayed`) that re-checks
  current authorisation and returns the recorded outcome, never dispatching;
- a new key admitted: `OperationReserved` and `BudgetReserved`, committed together (spec §4
  `reserved`). The `OperationReserved` effect then marks that operation `dispatching` in a
  transaction of its own, just before it calls the adapter (spec §5.1 step 7), one operation
  at a time: a worker that dies during one call leaves the batch's later operations reserved,
  never sent, and the job delivered again resumes them (`RESUMABLE`); marked together with the
  decision, they had all waited out the lease as unknown outcomes.
Because every decision holds the log's append lock, two requests for one key are decided one
after the other: the second always sees the first's operation.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from controlplane.commands.base import CommandBase
from controlplane.commands.gateway import Dispatch
from controlplane.decisions import DecisionContext, append_to, decision_data, new_event
from controlplane.gateway.execute import execute_dispatch
from controlplane.gateway.world import (
    budget_of,
    cause_ids,
    gateway_view,
    principal_of,
    refs_of,
    sources_of,
    tenant_of,
)
from controlplane.handlers.base import Effect, Handler, Precheck, Reads, Streams, Unfinished
from controlplane.policies.gateway import (
    DispatchRequest,
    NetworkPreference,
    OperationState,
    SourceRef,
    StepVerdict,
    TokenCounting,
    count_input_tokens,
)
from controlplane.policies.gateway_admission import Admission, admit, step_summary
from controlplane.policies.gateway_authorise import authorise_identity
from controlplane.policies.gateway_replay import (
    ReplayOutcome,
    StoredOperation,
    check_fingerprint,
    fingerprint,
    replay_operation,
)
from controlplane.policies.reasons import to_plain
from controlplane.policy_book import PolicyInForce
from controlplane.state import gateway as gw
from events import transaction
from events.model import StreamAppend
from events.projections import StateView


def request_of(command: Dispatch) -> DispatchRequest:
    """The policy's view of a `Dispatch` command."""
    return DispatchRequest(
        tenant_id=command.tenant, principal_id=command.principal_id,
        idempotency_key=command.idempotency_key, pointer_name=command.pointer_name,
        input_text=command.input, max_output_tokens=command.max_output_tokens,
        capabilities_requested=frozenset(command.capabilities_requested),
        network_preference=(NetworkPreference(command.network_preference)
                            if command.network_preference is not None else None),
        source_refs=tuple(SourceRef(r.source_ref, r.version) for r in command.source_refs))


def _inputs(command: Dispatch, request_fingerprint: str) -> dict[str, Any]:
    # Never the prompt itself: its digest and size identify it (spec §3.2 audit rule). The size
    # is in whitespace words whatever the profile (Bound's facts give the profile's own count).
    return {"tenant": command.tenant, "principal_id": command.principal_id,
            "idempotency_key": command.idempotency_key, "pointer_name": command.pointer_name,
            "input_sha256": hashlib.sha256(command.input.encode("utf-8")).hexdigest(),
            "input_tokens": count_input_tokens(command.input, TokenCounting.WHITESPACE_WORDS),
            "max_output_tokens": command.max_output_tokens,
            "capabilities_requested": sorted(command.capabilities_requested),
            "network_preference": command.network_preference,
            "source_refs": [r.model_dump() for r in command.source_refs],
            "fingerprint": request_fingerprint}


def _denied(command: Dispatch, ctx: DecisionContext, policy: PolicyInForce, request_fingerprint: str,
            verdict: StepVerdict, steps: list[dict[str, object]], causes: list[str]) -> list[StreamAppend]:
    result = {"tenant": command.tenant, "idempotency_key": command.idempotency_key,
              "principal_id": command.principal_id, "step": verdict.step.value,
              "code": verdict.code, "steps": steps}
    data = decision_data(outcome="denied", reasons=verdict.reasons, result=result, policy=policy,
                         inputs=_inputs(command, request_fingerprint), ctx=ctx, causes=causes)
    stream = gw.operation_stream(command.tenant, command.idempotency_key)
    return [append_to(stream, ctx, new_event(command, ctx, "denied", gw.DISPATCH_DENIED, data))]


def _stored(row: dict[str, Any]) -> StoredOperation:
    return StoredOperation(row["operation_id"], row["principal_id"], row["fingerprint"],
                           OperationState(row["state"]), refs_of(row["evidence"]),
                           row.get("outcome_code"), row["dispatch_count"])


def seconds_between(earlier_iso: str | None, later: datetime) -> float | None:
    """Logical seconds from a recorded `occurred_at` to a command's time."""
    if earlier_iso is None:
        return None
    return (later - datetime.fromisoformat(earlier_iso)).total_seconds()


def wall_seconds_since(recorded_at: str | None, ctx: DecisionContext) -> float | None:
    """Seconds on the control plane's clock from a row's recorded `recorded_at` to this
    decision's own (`DecisionContext.recorded_at`): both read from the log, so re-derivation
    computes the same figure.

    None when the row holds no such time (an operation folded from an older log, see
    `lease_expired`); 0 when the decision was given no clock: no time is known to have passed.
    """
    if recorded_at is None:
        return None
    if ctx.recorded_at is None:
        return 0.0
    return (datetime.fromisoformat(ctx.recorded_at)
            - datetime.fromisoformat(recorded_at)).total_seconds()


def _replay(command: Dispatch, ctx: DecisionContext, policy: PolicyInForce, request_fingerprint: str,
            row: dict[str, Any]) -> list[StreamAppend]:
    stored = _stored(row)
    same = check_fingerprint(stored, request_fingerprint)
    causes = [row["reserved_event_id"]]
    if not same.allowed:
        return _denied(command, ctx, policy, request_fingerprint, same, step_summary((same,)), causes)
    principal = principal_of(ctx.state, command.principal_id)
    assert principal is not None  # identity was authorised before the lookup
    decision = replay_operation(stored, principal, sources_of(ctx.state),
                                seconds_between(row.get("dispatching_at"), command.at),
                                wall_seconds_since(row.get("dispatching_recorded_at"), ctx),
                                policy.parameters["dispatch_lease_seconds"])
    if decision.outcome is ReplayOutcome.DENIED:
        return _denied(command, ctx, policy, request_fingerprint, decision.verdict,
                       step_summary((same, decision.verdict)), causes)
    answer_event_id = row.get("answer_event_id") if decision.outcome is ReplayOutcome.COMPLETED else None
    result = {"tenant": command.tenant, "idempotency_key": command.idempotency_key,
              "operation_id": row["operation_id"], "state": row["state"],
              "outcome_code": row.get("outcome_code"), "replayed": True,
              "release_id": row["release_id"], "profile_id": row["profile_id"],
              "route_id": row["route_id"], "answer_event_id": answer_event_id}
    data = decision_data(outcome=decision.outcome.value, reasons=decision.reasons, result=result,
                         policy=policy, inputs=_inputs(command, request_fingerprint), ctx=ctx,
                         causes=[answer_event_id] if answer_event_id else causes)
    stream = gw.operation_stream(command.tenant, command.idempotency_key)
    return [append_to(stream, ctx, new_event(command, ctx, "replayed", gw.OPERATION_REPLAYED, data))]


def _operation_row(command: Dispatch, admission: Admission, request_fingerprint: str) -> dict[str, Any]:
    plan = admission.plan
    assert plan is not None
    return {"operation_id": command.command_id, "tenant": command.tenant,
            "idempotency_key": command.idempotency_key, "principal_id": command.principal_id,
            "fingerprint": request_fingerprint, "pointer_name": command.pointer_name,
            "release_id": plan.release_id, "profile_id": plan.profile_id, "model_id": plan.model_id,
            "route_id": plan.route_id, "adapter_kind": plan.adapter_kind.value,
            "provider": plan.provider, "pool": plan.pool, "network_policy": plan.network_policy.value,
            "evidence": to_plain(plan.evidence), "input_tokens": plan.input_tokens,
            "max_output_tokens": plan.max_output_tokens, "grant_units": plan.grant_units,
            "budget_id": plan.budget_id, "created_at": command.occurred_at}


def _admitted(command: Dispatch, ctx: DecisionContext, policy: PolicyInForce, request_fingerprint: str,
              admission: Admission, causes: list[str]) -> list[StreamAppend]:
    operation = _operation_row(command, admission, request_fingerprint)
    identity = {"tenant": command.tenant, "idempotency_key": command.idempotency_key,
                "operation_id": command.command_id}
    inputs = _inputs(command, request_fingerprint)
    reserved = new_event(command, ctx, "reserved", gw.OPERATION_RESERVED, decision_data(
        outcome="reserved", reasons=admission.reasons,
        result={"operation": operation, "steps": step_summary(admission.steps)},
        policy=policy, inputs=inputs, ctx=ctx, causes=causes))
    budget = admission.steps[-1]
    budget_event = new_event(command, ctx, "budget", gw.BUDGET_RESERVED, decision_data(
        outcome="reserved", reasons=budget.reasons,
        result={**identity, "budget_id": operation["budget_id"],
                "grant_units": operation["grant_units"],
                "before": to_plain(budget_of(ctx.state, operation["budget_id"])),
                "after": to_plain(admission.budget_after)},
        policy=policy, inputs=inputs, ctx=ctx, causes=[reserved.event_id]))
    stream = gw.operation_stream(command.tenant, command.idempotency_key)
    return [append_to(stream, ctx, reserved),
            append_to(gw.budget_stream(operation["budget_id"]), ctx, budget_event)]


def handle_dispatch(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Authorise, then replay or conflict on an existing key, else select, bound and reserve."""
    assert isinstance(command, Dispatch)
    policy = ctx.policies.in_force(ctx.state, "gateway")
    request = request_of(command)
    request_fingerprint = fingerprint(request)
    identity = authorise_identity(command.tenant, command.principal_id,
                                  principal_of(ctx.state, command.principal_id),
                                  tenant_of(ctx.state, command.tenant))
    if not identity.allowed:
        return _denied(command, ctx, policy, request_fingerprint, identity,
                       step_summary((identity,)), [])
    existing = ctx.state.get(gw.OPERATIONS, gw.operation_key(command.tenant, command.idempotency_key))
    if existing is not None:
        return _replay(command, ctx, policy, request_fingerprint, existing)
    view = gateway_view(ctx.state, command.tenant, command.principal_id, command.pointer_name)
    admission = admit(request, view)
    causes = cause_ids(ctx.state, [
        (gw.REGISTRIES["release-pointer"], command.pointer_name),
        (gw.REGISTRIES["release"], view.bundle.release_id if view.bundle else ""),
        (gw.REGISTRIES["principal"], command.principal_id),
        (gw.BUDGETS, view.tenant.budget_id if view.tenant else "")])
    if admission.denial is not None:
        return _denied(command, ctx, policy, request_fingerprint, admission.denial,
                       step_summary(admission.steps), causes)
    return _admitted(command, ctx, policy, request_fingerprint, admission, causes)


def _dispatch_streams(command: CommandBase) -> list[str]:
    """The operation's stream (its budget's is known only from the tenant's row)."""
    assert isinstance(command, Dispatch)
    return [gw.operation_stream(command.tenant, command.idempotency_key)]


def _dispatch_reads(command: CommandBase) -> list[tuple[str, str]]:
    """The rows named by the request: its operation, tenant, principal and release pointer."""
    assert isinstance(command, Dispatch)
    return [(gw.OPERATIONS, gw.operation_key(command.tenant, command.idempotency_key)),
            (gw.REGISTRIES["tenant"], command.tenant),
            (gw.REGISTRIES["principal"], command.principal_id),
            (gw.REGISTRIES["release-pointer"], command.pointer_name)]


def unfinished_dispatches(state: StateView) -> list[str]:
    """Dispatch commands whose operation is reserved and was never marked: never sent, for
    `reconcile` to resume (a worker died after deciding them, its job was not delivered again)."""
    return [row["operation_id"] for _, row in state.items(gw.RESERVED_OPERATIONS)]


# How far ahead of the control plane's clock a request may be dated (the submitter's clock may
# run fast). Its time starts its lease on the command clock: a request dated ahead kept its
# operation, if stuck, from being reconciled until that date (never, late in year 9999).
MAX_DISPATCH_AHEAD_SECONDS = 300


def precheck_dispatch(command: CommandBase, state: StateView) -> list[tuple[str, str]]:
    assert isinstance(command, Dispatch)
    ahead = (command.at - datetime.fromisoformat(transaction.wall_clock())).total_seconds()
    if ahead > MAX_DISPATCH_AHEAD_SECONDS:
        return [("at", f"the request is dated {ahead:,.0f} s ahead of the control plane's clock "
                 f"(at most {MAX_DISPATCH_AHEAD_SECONDS} s): a request happens now")]
    return []


HANDLERS: dict[str, Handler] = {"Dispatch": handle_dispatch}
PRECHECKS: dict[str, Precheck] = {"Dispatch": precheck_dispatch}
# Versions of the decision rules, each with what changed (see `handlers/base.py`).
RULES_VERSIONS: dict[str, int] = {
    # 2: a replay of a failed operation no provider refused (never sent, or reconciled
    #    `not_processed`) answers `not_processed`, not `provider_refused`.
    # 3: a source of the caller's own tenant is readable whatever its access list (the list
    #    only adds readers); a replay reports a dispatching operation unknown only once its
    #    lease has run out on the control plane's clock too, not on the requests' times alone;
    #    a self-hosted route whose memory fit cannot be shown (no GPU plan, or a profile
    #    without memory parameters) is not compatible.
    "Dispatch": 3,
}
STREAMS: dict[str, Streams] = {"Dispatch": _dispatch_streams}
READS: dict[str, Reads] = {"Dispatch": _dispatch_reads}
EFFECTS: dict[str, Effect] = {gw.OPERATION_RESERVED: execute_dispatch}
RESUMABLE: set[str] = {gw.OPERATION_RESERVED}
UNFINISHED: list[Unfinished] = [unfinished_dispatches]
OBSERVATIONS: set[str] = {gw.OPERATION_DISPATCHING, gw.OPERATION_COMPLETED,
                          gw.OPERATION_OUTCOME_UNKNOWN, gw.OPERATION_REFUSED, gw.BUDGET_SETTLED,
                          gw.BUDGET_RELEASED}
