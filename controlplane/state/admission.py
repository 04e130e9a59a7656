"""Admission read models: each pool's live-token reservations and FIFO queue, and each request.

`admission` (keyed by pool) is written only from `PoolAdmissionChanged`, which records the
pool's admission state after the decision in full, so folding is a copy; the pool's budget stays
in the fleet domain's `pool` row. `admission_request` (keyed by request id) holds each request's
current decision, enough to answer a replayed id and to promote it from the queue.
"""

from __future__ import annotations

from typing import Any

from controlplane.state.base import Projector
from controlplane.state.fleet import ENTITY
from events.model import RecordedEvent
from events.projections import StateStore

ADMISSION, ADMISSION_REQUEST = "admission", "admission_request"

REQUEST_ADMITTED = "RequestAdmitted"
REQUEST_QUEUED = "RequestQueued"
REQUEST_SHED = "RequestShed"
REQUEST_RELEASED = "RequestReleased"
ADMISSION_REPLAYED = "AdmissionReplayed"
POOL_ADMISSION_CHANGED = "PoolAdmissionChanged"
REQUEST_DECISIONS = (REQUEST_ADMITTED, REQUEST_QUEUED, REQUEST_SHED, REQUEST_RELEASED)


def empty_pool_admission(pool_id: str) -> dict[str, Any]:
    """A pool's admission state before its first decision."""
    return {"pool_id": pool_id, "live_tokens": 0, "queue": [],
            "decisions": {"admit": 0, "queue": 0, "shed": 0, "release": 0},
            "last_event_id": None}


def _request_decided(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    state.put(ADMISSION_REQUEST, result["request_id"], {
        **result, "reason_codes": [reason["code"] for reason in event.data["reasons"]],
        "decision_event_id": event.event_id})
    state.put(ENTITY, f"request/{result['request_id']}", {})


def _pool_admission_changed(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    state.put(ADMISSION, result["pool_id"], {**result, "last_event_id": event.event_id})


PROJECTORS: dict[str, list[Projector]] = {
    **{event_type: [_request_decided] for event_type in REQUEST_DECISIONS},
    POOL_ADMISSION_CHANGED: [_pool_admission_changed],
}
