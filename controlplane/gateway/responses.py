"""What the caller of a `Dispatch` is told, assembled from the log.

Guarantee (spec G3): "completed" with an answer is reported only when the saved answer is in the
log; otherwise the typed outcome (denied with a code, unknown, persist_failed, refused, in
progress) and never any answer text.
"""

from __future__ import annotations

from typing import Any

from controlplane.decisions import ACCEPTED
from controlplane.state import gateway as gw
from events.store import EventStore

_OBSERVED = {gw.OPERATION_COMPLETED, gw.OPERATION_OUTCOME_UNKNOWN, gw.OPERATION_REFUSED}


def _answer(store: EventStore, answer_event_id: str | None) -> dict[str, Any] | None:
    if answer_event_id is None:
        return None
    event = store.find_event(answer_event_id)
    return event.data["result"].get("answer") if event is not None else None


def response_for(store: EventStore, command_id: str) -> dict[str, Any]:
    """The response to the `Dispatch` command `command_id`, or `{"outcome": None}` if undecided."""
    events = [e for e in store.events_for_command(command_id) if e.event_type != ACCEPTED]
    by_type = {e.event_type: e for e in events}
    if gw.DISPATCH_DENIED in by_type:
        result = by_type[gw.DISPATCH_DENIED].data["result"]
        return {"outcome": "denied", "code": result["code"], "step": result["step"],
                "codes": [r["code"] for r in by_type[gw.DISPATCH_DENIED].data["reasons"]],
                "answer": None}
    if gw.OPERATION_REPLAYED in by_type:
        data = by_type[gw.OPERATION_REPLAYED].data
        result = data["result"]
        return {"outcome": data["outcome"], "code": data["outcome"], "replayed": True,
                "answer": _answer(store, result.get("answer_event_id")),
                **{k: result[k] for k in ("operation_id", "release_id", "profile_id", "route_id")}}
    if gw.OPERATION_RESERVED not in by_type:
        return {"outcome": None, "code": None, "answer": None}
    operation = by_type[gw.OPERATION_RESERVED].data["result"]["operation"]
    pinned = {k: operation[k] for k in ("operation_id", "release_id", "profile_id", "route_id")}
    observed = next((e for e in events if e.event_type in _OBSERVED), None)
    if observed is None:
        # Dispatched, no result recorded: in flight, or lost with its worker. Never re-sent.
        return {"outcome": "dispatching", "code": "operation_in_progress", "replayed": False,
                "answer": None, **pinned}
    answer = observed.data["result"].get("answer") if observed.event_type == gw.OPERATION_COMPLETED \
        else None
    return {"outcome": observed.data["outcome"], "code": observed.data["outcome"], "replayed": False,
            "answer": answer, **pinned}
