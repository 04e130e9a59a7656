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

from typing import Any

import structlog

from controlplane.decisions import ACCEPTED
from controlplane.gateway.adapters import (
    AdapterRequest,
    RefusedBeforeSend,
    adapter_for,
)
from controlplane.gateway.fixture_provider import PERSIST_FAULTS, fixture_provider
from controlplane.gateway.mark import mark_reserved
from controlplane.gateway.observations import EXECUTOR, Build, completed, refused, unknown
from controlplane.state import gateway as gw
from controlplane.state.fold import apply_event
from events.model import RecordedEvent
from events.projections import SqlProjections
from events.store import EventStore

log = structlog.get_logger(__name__)
__all__ = ["EXECUTOR", "PersistFault", "execute_dispatch"]


class PersistFault(RuntimeError):
    """The scripted store failure of the final write (fault injection)."""


def execute_dispatch(store: EventStore, reserved: RecordedEvent) -> None:
    """Mark the reserved operation dispatching, call its route's adapter once and record what was
    observed. Raises only when the mark could not be written: nothing was sent, and the job,
    failing, is delivered again to resume it. Once marked, never raises."""
    operation = reserved.data["result"]["operation"]
    if _state(store, operation) != "reserved":  # the common answer on a redelivery, lock-free
        return
    marked = mark_reserved(store, reserved)
    if marked is None:
        return
    bound = log.bind(command_id=marked.command_id, stream_id=marked.stream_id,
                     event_id=marked.event_id)
    try:
        _execute(store, marked)
    except Exception as error:  # the operation stays "dispatching": unknown, never re-sent
        bound.error("gateway_outcome_unrecorded", error=repr(error))


def _execute(store: EventStore, event: RecordedEvent) -> None:
    dispatch = event.data["result"]
    if _state(store, dispatch) != "dispatching":
        # Reconciled from evidence before we got here (it can only narrow, never widen, the calls).
        log.warning("gateway_call_skipped_after_reconcile", command_id=event.command_id)
        return
    request = _request(store, event, dispatch)
    try:
        adapter = adapter_for(dispatch["adapter_kind"])
    except Exception as error:  # no adapter to send with: nothing left, the grant goes back
        _record(store, event, refused(event, f"no adapter could be opened: "
                                             f"{type(error).__name__}: {error}"))
        return
    try:
        result = adapter.call(request)
    except RefusedBeforeSend as refusal:
        _record(store, event, refused(event, str(refusal)))
        return
    except Exception as error:  # after a possible send, any failure is an unknown outcome
        _record(store, event, unknown(event, "outcome_unknown", type(error).__name__))
        return
    fault = fixture_provider().take_fault(PERSIST_FAULTS, request.route_id, request.tenant,
                                          request.idempotency_key)
    try:
        _record(store, event, completed(event, result), fail=fault is not None)
    except Exception as error:
        log.warning("gateway_persist_failed", command_id=event.command_id, error=repr(error))
        _record(store, event, unknown(event, "persist_failed", type(error).__name__),
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
        profile_id=dispatch["profile_id"], model_id=dispatch["model_id"],
        input_text=accepted.data["command"]["input"],
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


