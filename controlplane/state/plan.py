"""Fleet-plan read model: each plan's scenario and the plain result of every decided stage.

Folded from the plan's own decision events on stream `plan/<plan_id>`; a stage handler reads its
upstream results here, so a stage decided live and re-derived in replay see the same inputs.
"""

from __future__ import annotations

from typing import Any

from controlplane.decisions import REJECTED
from controlplane.state.base import Projector
from controlplane.state.fleet import ENTITY
from events.model import RecordedEvent
from events.projections import StateStore

FLEET_PLAN = "fleet_plan"
FLEET_PLAN_STARTED = "FleetPlanStarted"
STAGE_EVENTS = {
    "capacity": "FleetPlanCapacitySized",
    "memory": "FleetPlanMemoryAssessed",
    "layout": "FleetPlanLayoutChosen",
    "placement": "FleetPlanPlacementDecided",
    "admission": "FleetPlanProbesAdmitted",
    "scaling": "FleetPlanScalingRecommended",
    "rollout": "FleetPlanRolloutGated",
    "grade": "FleetPlanGraded",
}
EVENT_STAGES = {event_type: stage for stage, event_type in STAGE_EVENTS.items()}
DECIDING, GRADED, REFUSED = "deciding", "graded", "refused"


def plan_stream(plan_id: str) -> str:
    return f"plan/{plan_id}"


def _plan_started(state: StateStore, event: RecordedEvent) -> None:
    result = event.data["result"]
    state.put(FLEET_PLAN, result["plan_id"], {
        "plan_id": result["plan_id"],
        "command_id": event.command_id,
        "started_event_id": event.event_id,
        "inputs_digest": result["inputs_digest"],
        "scenario": result["scenario"],
        "stage_command_ids": result["stage_command_ids"],
        "stages": {},
        "status": DECIDING,
        "refusal": None,
    })
    state.put(ENTITY, plan_stream(result["plan_id"]), {"position": event.position})


def _stage_decided(state: StateStore, event: RecordedEvent) -> None:
    plan_id = event.stream_id.removeprefix("plan/")
    plan = state.get(FLEET_PLAN, plan_id)
    if plan is None:
        return
    stage = EVENT_STAGES[event.event_type]
    stages: dict[str, Any] = {**plan["stages"], stage: {
        "event_id": event.event_id, "command_id": event.command_id,
        "outcome": event.data["outcome"], "result": event.data["result"]}}
    status = GRADED if stage == "grade" else plan["status"]
    state.put(FLEET_PLAN, plan_id, {**plan, "stages": stages, "status": status})


def _stage_refused(state: StateStore, event: RecordedEvent) -> None:
    if not event.stream_id.startswith("plan/"):
        return
    plan = state.get(FLEET_PLAN, event.stream_id.removeprefix("plan/"))
    # Only the plan's own chain can stall it; any other refusal on its stream changes nothing.
    if plan is None or event.command_id not in plan["stage_command_ids"].values():
        return
    state.put(FLEET_PLAN, plan["plan_id"], {**plan, "status": REFUSED, "refusal": {
        "event_id": event.event_id, "command_id": event.command_id,
        "reasons": event.data["reasons"]}})


PROJECTORS: dict[str, list[Projector]] = {
    FLEET_PLAN_STARTED: [_plan_started],
    REJECTED: [_stage_refused],
    **{event_type: [_stage_decided] for event_type in STAGE_EVENTS.values()},
}
