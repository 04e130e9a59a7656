"""Gateway read models: the registries, the budgets and the durable operations.

A pure fold of event data: registry events carry the whole record, budget events carry the
figures after the movement, operation events carry the state they moved to. Nothing here
computes a decision.
"""

from __future__ import annotations

from typing import Any

from controlplane.state.base import Projector
from events.model import RecordedEvent
from events.projections import StateStore

ENTITY = "entity"
# Registry projections, keyed by the entity kind a config event names in `result.kind`.
REGISTRIES = {
    "tenant": "gateway_tenant", "principal": "gateway_principal", "source": "gateway_source",
    "profile": "gateway_profile", "route": "gateway_route", "release": "gateway_release",
    "release-pointer": "gateway_pointer",
}
BUDGETS = "gateway_budget"
# Who owns each budget and who may draw on it; set only by `BudgetConfigured`.
BUDGET_ACCESS = "gateway_budget_access"
OPERATIONS = "gateway_operation"

TENANT_REGISTERED = "TenantRegistered"
NETWORK_POLICY_SET = "NetworkPolicySet"
PRINCIPAL_REGISTERED = "PrincipalRegistered"
PRINCIPAL_REVOKED = "PrincipalRevoked"
PRINCIPAL_RESTORED = "PrincipalRestored"
SOURCE_REGISTERED = "SourceRegistered"
SOURCE_REVOKED = "SourceRevoked"
SOURCE_RESTORED = "SourceRestored"
PROFILE_REGISTERED = "ProfileRegistered"
ROUTE_CONFIGURED = "RouteConfigured"
RELEASE_BUNDLE_CREATED = "ReleaseBundleCreated"
RELEASE_POINTER_MOVED = "ReleasePointerMoved"
BUDGET_CONFIGURED = "BudgetConfigured"
REGISTRY_EVENTS = (TENANT_REGISTERED, NETWORK_POLICY_SET, PRINCIPAL_REGISTERED, PRINCIPAL_REVOKED,
                   PRINCIPAL_RESTORED, SOURCE_REGISTERED, SOURCE_REVOKED, SOURCE_RESTORED, PROFILE_REGISTERED,
                   ROUTE_CONFIGURED, RELEASE_BUNDLE_CREATED, RELEASE_POINTER_MOVED)

DISPATCH_DENIED = "DispatchDenied"
OPERATION_RESERVED = "OperationReserved"
OPERATION_DISPATCHING = "OperationDispatching"
OPERATION_REPLAYED = "OperationReplayed"
OPERATION_COMPLETED = "OperationCompleted"
OPERATION_OUTCOME_UNKNOWN = "OperationOutcomeUnknown"
OPERATION_REFUSED = "OperationRefused"
OPERATION_RECONCILED = "OperationReconciled"
RECONCILE_REFUSED = "ReconcileRefused"
BUDGET_RESERVED = "BudgetReserved"
BUDGET_SETTLED = "BudgetSettled"
BUDGET_RELEASED = "BudgetReleased"
BUDGET_RECONCILED = "BudgetReconciled"
BUDGET_EVENTS = (BUDGET_CONFIGURED, BUDGET_RESERVED, BUDGET_SETTLED, BUDGET_RELEASED,
                 BUDGET_RECONCILED)


# Operations reserved and not yet marked dispatching (never sent): what a worker that died after
# deciding left to resume, kept apart so that finding them reads no other operation.
RESERVED_OPERATIONS = "operation_reserved"


def operation_key(tenant: str, idempotency_key: str) -> str:
    """The operation's projection key; tenant names and keys contain no "/"."""
    return f"{tenant}/{idempotency_key}"


def operation_stream(tenant: str, idempotency_key: str) -> str:
    return f"operation/{tenant}/{idempotency_key}"


def budget_stream(budget_id: str) -> str:
    return f"budget/{budget_id}"


def _registry(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    kind, key = result["kind"], result["key"]
    state.put(REGISTRIES[kind], key, {**result["record"], "event_id": event.event_id})
    state.put(ENTITY, f"{kind}/{key}", {"kind": kind, "tenant": event.tenant,
                                        "event_id": event.event_id})


def _budget(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    after = result["after"]
    state.put(BUDGETS, after["budget_id"], {**after, "event_id": event.event_id})
    if event.event_type == BUDGET_CONFIGURED:
        # A budget configured before ownership was recorded was open to every tenant: keep it so.
        access = result.get("access") or {"owner_tenant": event.tenant, "shared_with": [],
                                          "open_to_every_tenant": True}
        state.put(BUDGET_ACCESS, after["budget_id"], {**access, "event_id": event.event_id})
        state.put(ENTITY, f"budget/{after['budget_id']}",
                  {"kind": "budget", "tenant": access["owner_tenant"], "event_id": event.event_id})


def _update_operation(state: StateStore, event: RecordedEvent, changes: dict[str, Any]) -> None:
    key = operation_key(event.data["result"]["tenant"], event.data["result"]["idempotency_key"])
    row = state.get(OPERATIONS, key)
    if row is None:
        return
    state.put(OPERATIONS, key, {**row, **changes, "updated_position": event.position})


def _reserved(state: StateStore, event: RecordedEvent) -> None:
    """A new operation. Its lease is measured on two clocks: the request's own time
    (`created_at`, the command's) and the control plane's (`reserved_recorded_at`, the log's)."""
    operation = event.data["result"]["operation"]
    key = operation_key(operation["tenant"], operation["idempotency_key"])
    state.put(OPERATIONS, key,
              {**operation, "state": "reserved", "dispatch_count": 0, "outcome_code": None,
               "answer_event_id": None, "reserved_event_id": event.event_id, "replays": 0,
               "reserved_recorded_at": event.recorded_at, "updated_position": event.position})
    state.put(RESERVED_OPERATIONS, key, {"operation_id": operation["operation_id"]})


def _left_reserved(state: StateStore, event: RecordedEvent) -> None:
    """Marked, or settled before it was (reconciled, expired): no longer waiting to be sent."""
    result = event.data["result"]
    state.delete(RESERVED_OPERATIONS, operation_key(result["tenant"], result["idempotency_key"]))


def _dispatching(state: StateStore, event: RecordedEvent) -> None:
    """Marked: its dispatch lease starts, on the request's clock (`dispatching_at`) and on the
    control plane's (`dispatching_recorded_at`, when the mark was written)."""
    _update_operation(state, event, {"state": "dispatching", "dispatch_count": 1,
                                     "dispatching_at": event.occurred_at,
                                     "dispatching_recorded_at": event.recorded_at,
                                     "dispatching_event_id": event.event_id})
    _left_reserved(state, event)


def _settled_state(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    changes: dict[str, Any] = {"state": result["state"], "outcome_code": result["outcome_code"]}
    if result["state"] == "completed":
        changes["answer_event_id"] = event.event_id
    if event.event_type == OPERATION_RECONCILED:
        changes["reconciled_event_id"] = event.event_id
    _update_operation(state, event, changes)


def _replayed(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    row = state.get(OPERATIONS, operation_key(result["tenant"], result["idempotency_key"]))
    if row is not None:
        _update_operation(state, event, {"replays": row.get("replays", 0) + 1})


PROJECTORS: dict[str, list[Projector]] = {
    **{event_type: [_registry] for event_type in REGISTRY_EVENTS},
    **{event_type: [_budget] for event_type in BUDGET_EVENTS},
    OPERATION_RESERVED: [_reserved],
    OPERATION_DISPATCHING: [_dispatching],
    OPERATION_COMPLETED: [_settled_state],
    OPERATION_OUTCOME_UNKNOWN: [_settled_state],
    OPERATION_REFUSED: [_settled_state, _left_reserved],
    OPERATION_RECONCILED: [_settled_state, _left_reserved],
    OPERATION_REPLAYED: [_replayed],
}
