"""Explanations: a decision, its reasons and inputs, and the chain of decisions that caused it."""

from __future__ import annotations

from typing import Any

from controlplane.decisions import ACCEPTED, REJECTED
from controlplane.errors import InputError
from controlplane.gateway.explain import explain_operation
from controlplane.state.fold import reading
from events.model import RecordedEvent
from events.store import EventStore

MAX_CHAIN = 50


def _step(event: RecordedEvent) -> dict[str, Any]:
    data = event.data
    step: dict[str, Any] = {"position": event.position, "event_id": event.event_id,
                            "event_type": event.event_type, "stream_id": event.stream_id,
                            "command_id": event.command_id, "occurred_at": event.occurred_at}
    with reading(event):
        if "outcome" in data:
            step.update(outcome=data["outcome"], reasons=data["reasons"], result=data["result"],
                        policy=data.get("policy"), inputs=data.get("inputs"),
                        read_position=data.get("read_position"))
        elif "command" in data:
            step["command"] = data["command"]
    return step


# Streams an identifier may name, in the order they are tried: `explain req-42` finds the
# latest decision about request req-42.
NAMED_STREAMS = ("request", "replica", "rollout", "plan", "node", "pool", "memory")


def _resolve(store: EventStore, identifier: str) -> list[RecordedEvent]:
    event = store.find_event(identifier)
    if event is not None:
        return [event]
    recorded = store.events_for_command(identifier)
    events = [e for e in recorded if e.event_type != ACCEPTED]
    if events:
        return events
    if recorded:  # accepted, not decided yet: its acceptance is all there is to show
        return recorded
    # A stream id as given (`catalog` holds no `/`), after the named kinds it may be short for.
    candidates = [identifier] if "/" in identifier else \
        [*(f"{kind}/{identifier}" for kind in NAMED_STREAMS), identifier]
    for stream_id in candidates:
        # The latest decision about the entity, read newest first (a pool's stream holds an
        # event per admission): what decided its state, not a command refused about it since
        # (a rollout's rollback, not the evaluation refused after it), unless refusals are all
        # there is.
        refused: RecordedEvent | None = None
        for event in store.iter_stream(stream_id, newest_first=True):
            if "outcome" not in event.data:
                continue
            if event.event_type != REJECTED:
                return [event]
            refused = refused or event
        if refused is not None:
            return [refused]
    raise InputError(f"no event, command, request, replica or stream with id {identifier!r}")


def explain_id(store: EventStore, identifier: str) -> dict[str, Any]:
    """The decision named by `identifier` and, following causation links, what led to it; for
    a command accepted but not decided yet, its acceptance (`awaiting_decision`).

    `operation/<tenant>/<key>` explains a gateway operation: its steps, evidence and budget.
    """
    if identifier.startswith("operation/") and identifier.count("/") == 2:
        _, tenant, key = identifier.split("/")
        return {"identifier": identifier, "operation": explain_operation(store, tenant, key),
                "chain": [_step(e) for e in store.read_stream(identifier)]}
    decided = _resolve(store, identifier)
    if decided[0].event_type == ACCEPTED and decided[0].command_id == identifier:
        return {"identifier": identifier, "awaiting_decision": True,
                "chain": [_step(e) for e in decided]}
    if decided[0].event_type == ACCEPTED and decided[0].command_id:
        # An acceptance named by its event id: say whether, and where, its command was decided.
        decision = [e for e in store.events_for_command(decided[0].command_id)
                    if e.event_type != ACCEPTED]
        return {"identifier": identifier, "awaiting_decision": not decision,
                "decided_at": [e.position for e in decision],
                "chain": [_step(e) for e in decided]}
    chain = [_step(e) for e in decided]
    seen = {e.event_id for e in decided}
    cause_ids = [e.causation_id for e in decided if e.causation_id]
    for cause in decided[0].data.get("causes", []) if decided else []:
        cause_ids.append(cause)
    while cause_ids and len(chain) < MAX_CHAIN:
        cause_id = cause_ids.pop(0)
        if cause_id in seen:
            continue
        seen.add(cause_id)
        cause = store.find_event(cause_id)
        if cause is None:
            continue
        chain.append(_step(cause))
        if cause.causation_id:
            cause_ids.append(cause.causation_id)
        cause_ids.extend(cause.data.get("causes", []))
    return {"identifier": identifier, "chain": chain}
