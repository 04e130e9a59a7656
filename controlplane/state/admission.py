"""Admission read models: each pool's live-token reservations and FIFO queue, and each request.

`admission` (keyed by pool) is written only from `PoolAdmissionChanged`, which records the
pool's admission state after the decision in full, so folding is a copy; the pool's budget stays
in the fleet domain's `pool` row. `admission_request` (keyed by request id) holds each request's
current decision, enough to answer a replayed id and to promote it from the queue.

Bounded in the log's length: a pool numbers its settled records (shed, released) in the order
they settle (`settled_sequence`) and keeps those numbered `settled_first` to `settled_next - 1`,
each in an `admission_settled` slot. A decision that forgets settled records (past their TTL, or
beyond the policy's maximum) names them in its `PoolAdmissionChanged` (`forgotten_request_ids`,
`settled_first`); folding it deletes exactly those rows, their slots and their `request/<id>`
entities. The fold applies what the log says and never judges retention itself, so a rebuild
forgets exactly what the live decisions forgot.
"""

from __future__ import annotations

from typing import Any

from controlplane.state.base import Projector
from controlplane.state.fleet import ENTITY
from events.model import RecordedEvent
from events.projections import StateStore, StateView

ADMISSION, ADMISSION_REQUEST = "admission", "admission_request"
ADMISSION_SETTLED = "admission_settled"

REQUEST_ADMITTED = "RequestAdmitted"
REQUEST_QUEUED = "RequestQueued"
REQUEST_SHED = "RequestShed"
REQUEST_RELEASED = "RequestReleased"
ADMISSION_REPLAYED = "AdmissionReplayed"
POOL_ADMISSION_CHANGED = "PoolAdmissionChanged"
REQUEST_DECISIONS = (REQUEST_ADMITTED, REQUEST_QUEUED, REQUEST_SHED, REQUEST_RELEASED)
FORGOTTEN = "forgotten_request_ids"


def empty_pool_admission(pool_id: str) -> dict[str, Any]:
    """A pool's admission state before its first decision."""
    return {"pool_id": pool_id, "live_tokens": 0, "queue": [],
            "decisions": {"admit": 0, "queue": 0, "shed": 0, "release": 0},
            "settled_first": 0, "settled_next": 0, "last_event_id": None}


def settled_slot(pool_id: str, sequence: int) -> str:
    """The key of a pool's settled record number `sequence`."""
    return f"{pool_id}/{sequence}"


def settled_window(pool: dict[str, Any]) -> tuple[int, int]:
    """The sequence numbers a pool keeps settled records under: `range(first, next)`."""
    # A pool row written before records were numbered keeps none.
    return pool.get("settled_first", 0), pool.get("settled_next", 0)


def settled_request(state: StateView, pool_id: str, sequence: int) -> str | None:
    """The request id kept in a pool's settled slot, if the slot is still kept."""
    slot = state.get(ADMISSION_SETTLED, settled_slot(pool_id, sequence))
    return slot["request_id"] if slot is not None else None


def _request_decided(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    request_id = result["request_id"]
    state.put(ADMISSION_REQUEST, request_id, {
        **result, "reason_codes": [reason["code"] for reason in event.data["reasons"]],
        "decision_event_id": event.event_id})
    state.put(ENTITY, f"request/{request_id}", {})
    sequence = result.get("settled_sequence")
    if sequence is not None:
        state.put(ADMISSION_SETTLED, settled_slot(result["pool_id"], sequence),
                  {"request_id": request_id})


def _pool_admission_changed(state: StateStore, event: RecordedEvent) -> None:
    after = {**event.data["result"], "last_event_id": event.event_id}
    pool_id = after["pool_id"]
    before = state.get(ADMISSION, pool_id)
    first_before = settled_window(before)[0] if before is not None else 0
    for sequence in range(first_before, after.get("settled_first", first_before)):
        state.delete(ADMISSION_SETTLED, settled_slot(pool_id, sequence))
    for request_id in after.pop(FORGOTTEN, ()):
        state.delete(ADMISSION_REQUEST, request_id)
        state.delete(ENTITY, f"request/{request_id}")
    state.put(ADMISSION, pool_id, after)


PROJECTORS: dict[str, list[Projector]] = {
    **{event_type: [_request_decided] for event_type in REQUEST_DECISIONS},
    POOL_ADMISSION_CHANGED: [_pool_admission_changed],
}
