"""Marking a reserved operation `dispatching`, just before its call (spec §5.1 step 7).

Only a transaction that finds the operation still `reserved`, under the append lock, marks it,
and only the marker calls: so marking may be attempted again (a job delivered again after its
worker died) and still at most one call is made. A reservation that should no longer be sent is
settled instead (`observations.unsent`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import structlog

from controlplane.gateway.observations import observation, unsent
from controlplane.gateway.world import (
    bundle_of,
    principal_of,
    profile_of,
    refs_of,
    route_of,
    sources_of,
    tenant_of,
)
from controlplane.policies.gateway import NetworkPolicy
from controlplane.policies.gateway_authorise import authorise_evidence, authorise_identity
from controlplane.policies.gateway_select import reserved_route_verdict, stricter_policy
from controlplane.policies.reasons import Reason
from controlplane.policy_book import PolicyBook
from controlplane.state import gateway as gw
from controlplane.state.fold import apply_event
from events.model import RecordedEvent, StreamAppend
from events.projections import StateView
from events.store import EventStore

log = structlog.get_logger(__name__)

ROUTE_FIELDS = ("route_id", "adapter_kind", "provider", "pool", "profile_id", "model_id",
                "input_tokens", "max_output_tokens", "network_policy")


def mark_reserved(store: EventStore, reserved: RecordedEvent) -> RecordedEvent | None:
    """`OperationDispatching`, appended if the operation is still reserved; else None.

    A reservation older than the dispatch lease (its worker died, and the job came back late)
    is not sent at all: the caller was told the outcome is unknown past the lease and may have
    moved on. Nor is one whose authorisation no longer holds (its principal or a source revoked
    or unreadable; its route, the route's provider or the profile no longer approved, compatible
    or ready; the route outside the request's or the tenant's current network policy), which a
    resumed reservation may meet. Either is settled as failed, its grant released, and None
    returned.
    """
    operation = reserved.data["result"]["operation"]
    with store.transaction() as tx:
        row = tx.projections.get(gw.OPERATIONS, gw.operation_key(operation["tenant"],
                                                                  operation["idempotency_key"]))
        if row is None or row["state"] != "reserved" \
                or row["operation_id"] != operation["operation_id"]:
            return None
        waited = seconds_since(reserved.recorded_at, tx.clock())
        lease = PolicyBook().in_force(tx.projections, "gateway").parameters["dispatch_lease_seconds"]
        why_not = [Reason("reservation_expired", "the request was never sent and its lease has "
                          "run out; it will not be sent", {"waited_seconds": round(waited, 3),
                                                           "lease_seconds": lease})] \
            if waited > lease else withdrawn(tx.projections, row)
        if why_not:
            for settled in tx.append(unsent(reserved, why_not)(tx, row)):
                apply_event(tx.projections, settled)
            log.warning("gateway_reservation_not_sent", command_id=reserved.command_id,
                        reason=why_not[0].code)
            return None
        result = {"tenant": row["tenant"], "idempotency_key": row["idempotency_key"],
                  "operation_id": row["operation_id"], **{k: row[k] for k in ROUTE_FIELDS},
                  "network_policy": effective_policy(tx.projections, row).value,
                  "provider_idempotency_key": row["operation_id"], "dispatch_count": 1}
        # Stamped with the request's own (logical) time, as replays and reconciliations measure
        # the lease against their commands' times; its `recorded_at` keeps the control plane's
        # clock, which they measure it against too (a command's time is its submitter's claim).
        event = observation(reserved, tx, "dispatching", gw.OPERATION_DISPATCHING, "dispatching",
                            [Reason("dispatch_marked", "the operation may reach the provider from "
                                    "now on; it will never be dispatched again",
                                    {"dispatch_count": 1})], result,
                            occurred_at=reserved.occurred_at)
        (marked,) = tx.append([StreamAppend(reserved.stream_id,
                                            tx.stream_version(reserved.stream_id), [event])])
        apply_event(tx.projections, marked)
    return marked


def seconds_since(recorded_at: str, now: str) -> float:
    """Wall-clock seconds from a row's `recorded_at` to `now` (both the control plane's clock,
    `events.transaction.wall_clock`, never a command's logical time)."""
    return (datetime.fromisoformat(now) - datetime.fromisoformat(recorded_at)).total_seconds()


def effective_policy(state: StateView, operation: dict[str, Any]) -> NetworkPolicy:
    """The network policy the call is made under: the request's effective one at reservation,
    or the tenant's current one where that is stricter (the route was checked against it)."""
    reserved = NetworkPolicy(operation["network_policy"])
    tenant = tenant_of(state, operation["tenant"])
    return stricter_policy(reserved, tenant.network_policy) if tenant is not None else reserved


def withdrawn(state: StateView, operation: dict[str, Any]) -> list[Reason]:
    """Why the reservation's authorisation no longer holds (empty when it does): what a
    decision checked, checked again just before the call."""
    principal = principal_of(state, operation["principal_id"])
    tenant = tenant_of(state, operation["tenant"])
    identity = authorise_identity(operation["tenant"], operation["principal_id"], principal, tenant)
    if not identity.allowed or principal is None or tenant is None:
        return list(identity.reasons)
    evidence = authorise_evidence(principal, refs_of(operation["evidence"]), sources_of(state))
    if not evidence.allowed:
        return list(evidence.reasons)
    route = reserved_route_verdict(bundle_of(state, operation["release_id"]),
                                   profile_of(state, operation["profile_id"]),
                                   route_of(state, operation["route_id"]),
                                   NetworkPolicy(operation["network_policy"]), tenant.network_policy)
    return [] if route.allowed else list(route.reasons)
