"""What the gateway's effect records: observations of a provider call, and of a reservation
settled without one. Each is appended by `controlplane.gateway.execute` (or `mark`), never
re-derived by replay: no policy produced it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from controlplane.gateway.adapters import AdapterResult
from controlplane.gateway.world import budget_of, route_pricing
from controlplane.policies.gateway_budget import BudgetMovement, release, settle
from controlplane.policies.gateway_worksheet import request_cost
from controlplane.policies.reasons import PolicyInputError, Reason, to_plain
from controlplane.state import gateway as gw
from events.model import NewEvent, RecordedEvent, StreamAppend, derived_event_id
from events.transaction import LogTransaction

EXECUTOR = "gateway-executor"

Build = Callable[[LogTransaction, dict[str, Any]], list[StreamAppend]]


def observation(source: RecordedEvent, tx: LogTransaction, slot: str, event_type: str,
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


def identity(operation: dict[str, Any], state: str, outcome_code: str) -> dict[str, Any]:
    return {"tenant": operation["tenant"], "idempotency_key": operation["idempotency_key"],
            "operation_id": operation["operation_id"], "state": state, "outcome_code": outcome_code}


def budget_append(source: RecordedEvent, tx: LogTransaction, operation: dict[str, Any],
                  event_type: str, movement: BudgetMovement) -> StreamAppend:
    stream = gw.budget_stream(operation["budget_id"])
    result = {"budget_id": operation["budget_id"], "tenant": operation["tenant"],
              "idempotency_key": operation["idempotency_key"],
              "operation_id": operation["operation_id"], "grant_units": movement.grant_units,
              "committed_units": movement.committed_units, "released_units": movement.released_units,
              "before": movement.before, "after": movement.after}
    event = observation(source, tx, "observed-budget", event_type, movement.outcome,
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


def completed(source: RecordedEvent, result: AdapterResult) -> Build:
    def build(tx: LogTransaction, operation: dict[str, Any]) -> list[StreamAppend]:
        budget = budget_of(tx.projections, operation["budget_id"])
        assert budget is not None
        movement = settle(budget, operation["grant_units"], result.input_tokens + result.output_tokens)
        saved = {**identity(operation, "completed", "completed"),
                 "answer": {"text": result.text},
                 "answer_sha256": hashlib.sha256(result.text.encode("utf-8")).hexdigest(),
                 "usage": {"input_tokens": result.input_tokens, "output_tokens": result.output_tokens},
                 "provider_request_id": result.provider_request_id,
                 "release_id": operation["release_id"], "profile_id": operation["profile_id"],
                 "route_id": operation["route_id"], "evidence": operation["evidence"],
                 "cost": _cost(operation, tx, result)}
        stream = source.stream_id
        answer = observation(source, tx, "observed-result", gw.OPERATION_COMPLETED, "completed",
                             [Reason("answer_saved", "the answer was saved before success was reported",
                                     {"provider_request_id": result.provider_request_id})], saved)
        return [StreamAppend(stream, tx.stream_version(stream), [answer]),
                budget_append(source, tx, operation, gw.BUDGET_SETTLED, movement)]
    return build


def unknown(source: RecordedEvent, outcome_code: str, detail: str) -> Build:
    def build(tx: LogTransaction, operation: dict[str, Any]) -> list[StreamAppend]:
        reason = Reason(outcome_code, "the provider may have processed the request; it will not be "
                        "retried and its grant stays reserved",
                        {"detail": detail, "grant_units": operation["grant_units"]})
        event = observation(source, tx, "observed-outcome", gw.OPERATION_OUTCOME_UNKNOWN, outcome_code,
                            [reason], {**identity(operation, "unknown", outcome_code),
                                       "detail": detail})
        return [StreamAppend(source.stream_id, tx.stream_version(source.stream_id), [event])]
    return build


def _failed_unprocessed(source: RecordedEvent, reasons: list[Reason], detail: str,
                        release_code: str) -> Build:
    """Failed with nothing processed (named by the first reason's code), the grant released."""
    code = reasons[0].code

    def build(tx: LogTransaction, operation: dict[str, Any]) -> list[StreamAppend]:
        budget = budget_of(tx.projections, operation["budget_id"])
        assert budget is not None
        movement = release(budget, operation["grant_units"], release_code)
        event = observation(source, tx, "observed-outcome", gw.OPERATION_REFUSED, code, reasons,
                            {**identity(operation, "failed", code), "detail": detail})
        return [StreamAppend(source.stream_id, tx.stream_version(source.stream_id), [event]),
                budget_append(source, tx, operation, gw.BUDGET_RELEASED, movement)]
    return build


def unsent(source: RecordedEvent, reasons: list[Reason]) -> Build:
    """A reservation settled without ever being sent: failed, its grant released."""
    return _failed_unprocessed(source, reasons, "never sent", f"grant_released_{reasons[0].code}")


def refused(source: RecordedEvent, detail: str) -> Build:
    """The provider refused before anything was sent: failed, its grant released."""
    reason = Reason("provider_refused", "the request never left; nothing was processed",
                    {"detail": detail})
    return _failed_unprocessed(source, [reason], detail, "grant_released_refused_before_send")
