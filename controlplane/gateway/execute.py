"""Mark, execute and persist: the effect of `OperationReserved`, after it commits.

Guarantee: the adapter is called at most once per operation. Just before the call, the operation
is marked `dispatching` in a transaction of its own that finds it still `reserved` under the
append lock (spec §5.1 step 7); whoever finds it otherwise (another worker marked it, an operator
reconciled it) calls nothing. So this may run again for the same operation (a job delivered
again after its worker died resumes the operations it had not marked) and still calls at most
once. What the call produced is recorded as an observation:
- a result: the saved answer and the budget settlement in one transaction ("completed");
- a provable refusal before sending: "failed", the grant released;
- anything else (timeout after sending, reset, a crash of the adapter): "unknown", grant kept.
If the final write fails, a smaller write marks the operation unknown (`persist_failed`); if that
fails too, or the process dies, the operation stays "dispatching", which is just as safe: every
later request for the key is a replay, and a replay never calls a provider.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog

from controlplane.decisions import ACCEPTED
from controlplane.gateway.adapters import (
    AdapterRequest,
    AdapterResult,
    RefusedBeforeSend,
    adapter_for,
)
from controlplane.gateway.fixture_provider import PERSIST_FAULTS, fixture_provider
from controlplane.gateway.world import budget_of, route_pricing
from controlplane.policies.gateway_budget import BudgetMovement, release, settle
from controlplane.policies.gateway_worksheet import request_cost
from controlplane.policies.reasons import PolicyInputError, Reason, to_plain
from controlplane.policy_book import PolicyBook
from controlplane.state import gateway as gw
from controlplane.state.fold import apply_event
from events.model import NewEvent, RecordedEvent, StreamAppend, derived_event_id
from events.projections import SqlProjections
from events.store import EventStore
from events.transaction import LogTransaction

log = structlog.get_logger(__name__)
EXECUTOR = "gateway-executor"

Build = Callable[[LogTransaction, dict[str, Any]], list[StreamAppend]]


class PersistFault(RuntimeError):
    """The scripted store failure of the final write (fault injection)."""


def execute_dispatch(store: EventStore, reserved: RecordedEvent) -> None:
    """Mark the reserved operation dispatching, call its route's adapter once and record what was
    observed. Raises only when the mark could not be written: nothing was sent, and the job,
    failing, is delivered again to resume it. Once marked, never raises."""
    operation = reserved.data["result"]["operation"]
    if _state(store, operation) != "reserved":  # the common answer on a redelivery, lock-free
        return
    marked = _mark(store, reserved)
    if marked is None:
        return
    bound = log.bind(command_id=marked.command_id, stream_id=marked.stream_id,
                     event_id=marked.event_id)
    try:
        _execute(store, marked)
    except Exception as error:  # the operation stays "dispatching": unknown, never re-sent
        bound.error("gateway_outcome_unrecorded", error=repr(error))


ROUTE_FIELDS = ("route_id", "adapter_kind", "provider", "pool", "profile_id", "model_id",
                "input_tokens", "max_output_tokens", "network_policy")


def _mark(store: EventStore, reserved: RecordedEvent) -> RecordedEvent | None:
    """`OperationDispatching`, appended if the operation is still reserved; else None.

    A reservation older than the dispatch lease (its worker died, and the job came back late)
    is not sent at all: the caller was told the outcome is unknown past the lease and may have
    moved on, and the route, principal or sources it was authorised on may have changed since.
    It is settled as expired, its grant released, and None returned.
    """
    operation = reserved.data["result"]["operation"]
    with store.transaction() as tx:
        row = tx.projections.get(gw.OPERATIONS, gw.operation_key(operation["tenant"],
                                                                  operation["idempotency_key"]))
        if row is None or row["state"] != "reserved" \
                or row["operation_id"] != operation["operation_id"]:
            return None
        waited = _seconds_since(reserved.recorded_at)
        lease = PolicyBook().in_force(tx.projections, "gateway").parameters["dispatch_lease_seconds"]
        if waited > lease:
            for expired in tx.append(_expired(reserved, waited, lease)(tx, row)):
                apply_event(tx.projections, expired)
            log.warning("gateway_reservation_expired", command_id=reserved.command_id,
                        waited_seconds=round(waited, 1))
            return None
        result = {"tenant": row["tenant"], "idempotency_key": row["idempotency_key"],
                  "operation_id": row["operation_id"], **{k: row[k] for k in ROUTE_FIELDS},
                  "provider_idempotency_key": row["operation_id"], "dispatch_count": 1}
        # Stamped with the request's own (logical) time, as replays and reconciliations measure
        # the lease against their commands' times; the wall clock would mix two clocks.
        event = _observation(reserved, tx, "dispatching", gw.OPERATION_DISPATCHING, "dispatching",
                             [Reason("dispatch_marked", "the operation may reach the provider from "
                                     "now on; it will never be dispatched again",
                                     {"dispatch_count": 1})], result,
                             occurred_at=reserved.occurred_at)
        (marked,) = tx.append([StreamAppend(reserved.stream_id,
                                            tx.stream_version(reserved.stream_id), [event])])
        apply_event(tx.projections, marked)
    return marked


def _seconds_since(recorded_at: str) -> float:
    """Wall-clock seconds since a row's `recorded_at` (both this machine's clock, never a
    command's logical time)."""
    return (datetime.now(UTC) - datetime.fromisoformat(recorded_at)).total_seconds()


def _execute(store: EventStore, event: RecordedEvent) -> None:
    dispatch = event.data["result"]
    if _state(store, dispatch) != "dispatching":
        # Reconciled from evidence before we got here (it can only narrow, never widen, the calls).
        log.warning("gateway_call_skipped_after_reconcile", command_id=event.command_id)
        return
    request = _request(store, event, dispatch)
    try:
        result = adapter_for(dispatch["adapter_kind"]).call(request)
    except RefusedBeforeSend as refusal:
        _record(store, event, _refused(event, str(refusal)))
        return
    except Exception as error:  # after a possible send, any failure is an unknown outcome
        _record(store, event, _unknown(event, "outcome_unknown", type(error).__name__))
        return
    fault = fixture_provider().take_fault(PERSIST_FAULTS, request.route_id, request.tenant,
                                          request.idempotency_key)
    try:
        _record(store, event, _completed(event, result), fail=fault is not None)
    except Exception as error:
        log.warning("gateway_persist_failed", command_id=event.command_id, error=repr(error))
        _record(store, event, _unknown(event, "persist_failed", type(error).__name__),
                fail=fault == "persist_and_mark_fail")


def _state(store: EventStore, operation: dict[str, Any]) -> str | None:
    """The operation's state as last committed (None if it has no row), read without the lock."""
    with store.engine.connect() as conn:
        row = SqlProjections(conn).get(
            gw.OPERATIONS, gw.operation_key(operation["tenant"], operation["idempotency_key"]))
    return row["state"] if row is not None and row["operation_id"] == operation["operation_id"] \
        else None


def _request(store: EventStore, event: RecordedEvent, dispatch: dict[str, Any]) -> AdapterRequest:
    accepted = next(e for e in store.events_for_command(event.command_id or "")
                    if e.event_type == ACCEPTED)
    return AdapterRequest(
        operation_id=dispatch["operation_id"], tenant=dispatch["tenant"],
        idempotency_key=dispatch["idempotency_key"], route_id=dispatch["route_id"],
        adapter_kind=dispatch["adapter_kind"], provider=dispatch["provider"], pool=dispatch["pool"],
        model_id=dispatch["model_id"], input_text=accepted.data["command"]["input"],
        input_tokens=dispatch["input_tokens"], max_output_tokens=dispatch["max_output_tokens"],
        network_policy=dispatch["network_policy"],
        provider_idempotency_key=dispatch["provider_idempotency_key"])


def _record(store: EventStore, event: RecordedEvent, build: Build, fail: bool = False) -> None:
    """Append what `build` observed, only while the operation is still "dispatching".

    `fail` injects a store failure after the append and before the commit, so nothing is written.
    """
    dispatch = event.data["result"]
    with store.transaction() as tx:
        key = gw.operation_key(dispatch["tenant"], dispatch["idempotency_key"])
        operation = tx.projections.get(gw.OPERATIONS, key)
        if operation is None or operation["state"] != "dispatching":
            log.warning("gateway_late_observation_dropped", command_id=event.command_id,
                        state=operation["state"] if operation else None)
            return
        for recorded in tx.append(build(tx, operation)):
            apply_event(tx.projections, recorded)
        if fail:
            raise PersistFault("scripted failure of the final write")


def _observation(source: RecordedEvent, tx: LogTransaction, slot: str, event_type: str,
                 outcome: str, reasons: list[Reason], result: dict[str, Any],
                 occurred_at: str | None = None) -> NewEvent:
    """What an effect observed; it occurred now (wall clock) unless `occurred_at` says when."""
    data = {"outcome": outcome, "reasons": to_plain(reasons), "result": to_plain(result),
            "policy": None, "inputs": {}, "read_position": tx.head_position,
            "causes": [source.event_id], "observed": True}
    return NewEvent(event_id=derived_event_id(source.command_id or source.event_id, slot),
                    event_type=event_type, data=data,
                    occurred_at=occurred_at or datetime.now(UTC).isoformat(
                        timespec="microseconds").replace("+00:00", "Z"),
                    command_id=source.command_id, causation_id=source.event_id,
                    correlation_id=source.correlation_id, actor=EXECUTOR, tenant=source.tenant)


def _identity(operation: dict[str, Any], state: str, outcome_code: str) -> dict[str, Any]:
    return {"tenant": operation["tenant"], "idempotency_key": operation["idempotency_key"],
            "operation_id": operation["operation_id"], "state": state, "outcome_code": outcome_code}


def _budget_append(source: RecordedEvent, tx: LogTransaction, operation: dict[str, Any],
                   event_type: str, movement: BudgetMovement) -> StreamAppend:
    stream = gw.budget_stream(operation["budget_id"])
    result = {"budget_id": operation["budget_id"], "tenant": operation["tenant"],
              "idempotency_key": operation["idempotency_key"],
              "operation_id": operation["operation_id"], "grant_units": movement.grant_units,
              "committed_units": movement.committed_units, "released_units": movement.released_units,
              "before": movement.before, "after": movement.after}
    event = _observation(source, tx, "observed-budget", event_type, movement.outcome,
                         list(movement.reasons), result)
    return StreamAppend(stream, tx.stream_version(stream), [event])


def _cost(operation: dict[str, Any], tx: LogTransaction, result: AdapterResult) -> dict[str, Any] | None:
    """The worksheet's cost of this request, when its route is priced.

    Admission refused any route that could not price the grant, but usage may exceed the grant:
    a cost that still cannot be computed is recorded as such, never at the price of the answer.
    """
    prices, economics = route_pricing(tx.projections.get(gw.REGISTRIES["route"], operation["route_id"])
                                      or {})
    try:
        cost = request_cost(prices, economics, result.input_tokens, result.output_tokens)
    except PolicyInputError as error:
        return {"cost_units": None, "basis": "unpriced", "code": error.code}
    return {"cost_units": cost.cost_units, "basis": cost.outcome} if cost is not None else None


def _completed(source: RecordedEvent, result: AdapterResult) -> Build:
    def build(tx: LogTransaction, operation: dict[str, Any]) -> list[StreamAppend]:
        budget = budget_of(tx.projections, operation["budget_id"])
        assert budget is not None
        movement = settle(budget, operation["grant_units"], result.input_tokens + result.output_tokens)
        saved = {**_identity(operation, "completed", "completed"),
                 "answer": {"text": result.text},
                 "answer_sha256": hashlib.sha256(result.text.encode("utf-8")).hexdigest(),
                 "usage": {"input_tokens": result.input_tokens, "output_tokens": result.output_tokens},
                 "provider_request_id": result.provider_request_id,
                 "release_id": operation["release_id"], "profile_id": operation["profile_id"],
                 "route_id": operation["route_id"], "evidence": operation["evidence"],
                 "cost": _cost(operation, tx, result)}
        stream = source.stream_id
        answer = _observation(source, tx, "observed-result", gw.OPERATION_COMPLETED, "completed",
                              [Reason("answer_saved", "the answer was saved before success was reported",
                                      {"provider_request_id": result.provider_request_id})], saved)
        return [StreamAppend(stream, tx.stream_version(stream), [answer]),
                _budget_append(source, tx, operation, gw.BUDGET_SETTLED, movement)]
    return build


def _unknown(source: RecordedEvent, outcome_code: str, detail: str) -> Build:
    def build(tx: LogTransaction, operation: dict[str, Any]) -> list[StreamAppend]:
        reason = Reason(outcome_code, "the provider may have processed the request; it will not be "
                        "retried and its grant stays reserved",
                        {"detail": detail, "grant_units": operation["grant_units"]})
        event = _observation(source, tx, "observed-outcome", gw.OPERATION_OUTCOME_UNKNOWN, outcome_code,
                             [reason], {**_identity(operation, "unknown", outcome_code),
                                        "detail": detail})
        return [StreamAppend(source.stream_id, tx.stream_version(source.stream_id), [event])]
    return build


def _expired(source: RecordedEvent, waited: float, lease: float) -> Build:
    """A reservation never sent, found past the lease: failed, its grant released."""
    def build(tx: LogTransaction, operation: dict[str, Any]) -> list[StreamAppend]:
        budget = budget_of(tx.projections, operation["budget_id"])
        assert budget is not None
        movement = release(budget, operation["grant_units"], "grant_released_reservation_expired")
        reason = Reason("reservation_expired", "the request was never sent and its lease has run "
                        "out; it will not be sent", {"waited_seconds": round(waited, 3),
                                                     "lease_seconds": lease})
        event = _observation(source, tx, "observed-outcome", gw.OPERATION_REFUSED,
                             "reservation_expired", [reason],
                             {**_identity(operation, "failed", "reservation_expired"),
                              "detail": "never sent"})
        return [StreamAppend(source.stream_id, tx.stream_version(source.stream_id), [event]),
                _budget_append(source, tx, operation, gw.BUDGET_RELEASED, movement)]
    return build


def _refused(source: RecordedEvent, detail: str) -> Build:
    def build(tx: LogTransaction, operation: dict[str, Any]) -> list[StreamAppend]:
        budget = budget_of(tx.projections, operation["budget_id"])
        assert budget is not None
        movement = release(budget, operation["grant_units"], "grant_released_refused_before_send")
        reason = Reason("provider_refused", "the request never left; nothing was processed",
                        {"detail": detail})
        event = _observation(source, tx, "observed-outcome", gw.OPERATION_REFUSED, "provider_refused",
                             [reason], {**_identity(operation, "failed", "provider_refused"),
                                        "detail": detail})
        return [StreamAppend(source.stream_id, tx.stream_version(source.stream_id), [event]),
                _budget_append(source, tx, operation, gw.BUDGET_RELEASED, movement)]
    return build
