"""Fleet-plan commands: plan a fleet from a scenario; each stage of the plan is its own command.

`PlanFleet` carries the whole scenario (checked against the scenario rules when submitted, see
`handlers/plan.py`); its decision issues the first `DecidePlanStage`, and each stage's decision
issues the next, so the stages are decided in order by causation whatever the number of workers.
Stage commands have ids derived from the plan command's id: a plan's chain is the same chain
however often it is delivered.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar, Literal

from pydantic import field_validator

from controlplane.commands.base import CommandBase, Name
from controlplane.policies.fleet_plan_scenario import MAX_SCENARIO_BYTES, canonical_json
from controlplane.policies.fleet_plan_stages import STAGES

MAX_COMMAND_ID_LENGTH = 100
StageName = Literal["capacity", "memory", "layout", "placement", "admission", "scaling", "rollout",
                    "grade"]


class PlanFleet(CommandBase):
    """Decide the fleet plan of `scenario` (spec §2), one recorded decision per stage."""

    type: Literal["PlanFleet"] = "PlanFleet"
    plan_id: Name
    scenario: dict[str, Any]
    # `fleetctl plan` names the plan by its scenario's digest: the same plan_id is the same
    # scenario, however its file spelled it.
    IDENTITY_IGNORES: ClassVar[frozenset[str]] = frozenset({"scenario"})

    @field_validator("scenario")
    @classmethod
    def _plain_and_bounded(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            size = len(canonical_json(value).encode("utf-8"))
        except (TypeError, ValueError) as error:
            raise ValueError(f"the scenario must be finite JSON data ({error})") from None
        if size > MAX_SCENARIO_BYTES:
            raise ValueError(f"the scenario is {size} bytes as compact JSON, over the limit of "
                             f"{MAX_SCENARIO_BYTES} bytes")
        return value

    def creates(self) -> list[str]:
        return [f"plan/{self.plan_id}"]


class DecidePlanStage(CommandBase):
    """Decide one stage of a plan; only the plan's own chain issues these."""

    type: Literal["DecidePlanStage"] = "DecidePlanStage"
    plan_id: Name
    stage: StageName


def stage_command_id(plan_command_id: str, stage: str) -> str:
    """The id of `stage`'s command in the chain of plan command `plan_command_id` (stable)."""
    candidate = f"{plan_command_id}:{stage}"
    if len(candidate) <= MAX_COMMAND_ID_LENGTH:
        return candidate
    digest = hashlib.sha256(plan_command_id.encode("utf-8")).hexdigest()[:40]
    return f"plan-{digest}:{stage}"


def stage_command_ids(plan_command_id: str) -> dict[str, str]:
    """Every stage's command id, in stage order."""
    return {stage: stage_command_id(plan_command_id, stage) for stage in STAGES}


COMMANDS: list[type[CommandBase]] = [PlanFleet, DecidePlanStage]
