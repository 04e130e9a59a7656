"""Rollout read models: each rollout's stage, traffic and gate evidence, and each measurement.

`rollout` (keyed by rollout id) carries the declared requirements, the stage the ladder is on,
the candidate's traffic share, the accumulated gate evidence and every stage transition.
`rollout_measurement` (keyed `<rollout_id>/<measurement_id>`) keeps each measurement with the
gate evidence in force when it was recorded, and which stage decision (if any) used it.
"""

from __future__ import annotations

from controlplane.state.base import Projector
from controlplane.state.fleet import ENTITY
from events.model import RecordedEvent
from events.projections import StateStore

ROLLOUT, ROLLOUT_MEASUREMENT = "rollout", "rollout_measurement"

ROLLOUT_STARTED = "RolloutStarted"
CANARY_MEASUREMENT_RECORDED = "CanaryMeasurementRecorded"
ROLLOUT_HELD = "RolloutHeld"
ROLLOUT_ADVANCED = "RolloutAdvanced"
ROLLOUT_PROMOTED = "RolloutPromoted"
ROLLOUT_ROLLED_BACK = "RolloutRolledBack"
STAGE_DECISIONS = (ROLLOUT_HELD, ROLLOUT_ADVANCED, ROLLOUT_PROMOTED, ROLLOUT_ROLLED_BACK)


def measurement_key(rollout_id: str, measurement_id: str) -> str:
    return f"{rollout_id}/{measurement_id}"


def _rollout_started(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    state.put(ROLLOUT, result["rollout_id"], {
        **result, "gates": {}, "latest_measurement_id": None, "measurements": 0,
        "started_event_id": event.event_id, "last_decision_event_id": event.event_id,
        "last_evaluation_event_id": None, "transitions": []})
    state.put(ENTITY, f"rollout/{result['rollout_id']}", {})


def _measurement_recorded(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    rollout = state.get(ROLLOUT, result["rollout_id"])
    if rollout is None:
        return
    state.put(ROLLOUT_MEASUREMENT, measurement_key(result["rollout_id"], result["measurement_id"]),
              {**result, "event_id": event.event_id, "used_by_event_id": None})
    state.put(ROLLOUT, result["rollout_id"], {
        **rollout, "gates": result["gates_in_force"],
        "latest_measurement_id": result["measurement_id"],
        "measurements": rollout["measurements"] + 1})


def _stage_decided(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    rollout = state.get(ROLLOUT, result["rollout_id"])
    if rollout is None:
        return
    moved = result["action"] != "hold"
    transitions = rollout["transitions"] + ([{
        "action": result["action"], "from_stage": result["from_stage"],
        "to_stage": result["to_stage"], "candidate_traffic_percent":
        result["candidate_traffic_percent"], "event_id": event.event_id}] if moved else [])
    state.put(ROLLOUT, result["rollout_id"], {
        **rollout, "stage": result["to_stage"], "canary_step": result["canary_step"],
        "candidate_traffic_percent": result["candidate_traffic_percent"],
        "deciding_codes": result["deciding_codes"], "last_evaluation_event_id": event.event_id,
        # A hold changes nothing, so later decisions are caused by the last rung actually moved.
        "last_decision_event_id": event.event_id if moved else rollout["last_decision_event_id"],
        "transitions": transitions})
    key = measurement_key(result["rollout_id"], result["measurement_id"])
    measurement = state.get(ROLLOUT_MEASUREMENT, key)
    if moved and measurement is not None:
        state.put(ROLLOUT_MEASUREMENT, key, {**measurement, "used_by_event_id": event.event_id})


PROJECTORS: dict[str, list[Projector]] = {
    ROLLOUT_STARTED: [_rollout_started],
    CANARY_MEASUREMENT_RECORDED: [_measurement_recorded],
    **{event_type: [_stage_decided] for event_type in STAGE_DECISIONS},
}
