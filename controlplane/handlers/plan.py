"""Fleet-plan handlers: start a plan, then decide its stages one command at a time (spec §2).

`PlanFleet` records the normalised scenario and its digest and issues the first stage. Each
`DecidePlanStage` reads the scenario and its upstream stages' results from the plan projection,
runs that one pure stage, records the result with its reasons, the scenario fields it read and
the decisions it depended on (`causes`), and issues the next stage; the last stage (grade)
records the release verdict. Order is guaranteed by causation: a stage's command exists only
once the stage before it is decided, whatever the number of workers.
"""

from __future__ import annotations

from typing import Any

from controlplane.commands.base import CommandBase
from controlplane.commands.plan import DecidePlanStage, PlanFleet, stage_command_ids
from controlplane.decisions import (
    INBOX_STREAM,
    DecisionContext,
    append_to,
    decision_data,
    issue_command,
    new_event,
    rejection,
)
from controlplane.handlers.base import Handler, Precheck, Streams
from controlplane.policies.fleet_plan import scenario_from_plain
from controlplane.policies.fleet_plan_parse import parse_scenario_structure
from controlplane.policies.fleet_plan_scenario import scenario_digest
from controlplane.policies.fleet_plan_stages import (
    STAGE_INPUT_FIELDS,
    STAGE_POLICY_FIELDS,
    STAGE_UPSTREAM,
    STAGES,
    run_stage,
    stage_verdict,
)
from controlplane.policies.reasons import PolicyInputError, Reason, to_plain
from controlplane.policy_book import PolicyInForce
from controlplane.state.plan import FLEET_PLAN, FLEET_PLAN_STARTED, STAGE_EVENTS, plan_stream
from events.model import StreamAppend
from events.projections import StateView


def _refuse(command: CommandBase, ctx: DecisionContext, plan_id: str, code: str, field: str,
            message: str) -> list[StreamAppend]:
    return rejection(command, ctx, PolicyInputError(code, field, message), plan_stream(plan_id))


def _next_stage(command: CommandBase, ctx: DecisionContext, plan_id: str, stage: str,
                command_ids: dict[str, str], cause_event_id: str) -> StreamAppend:
    child = DecidePlanStage(command_id=command_ids[stage], at=command.at, actor=command.actor,
                            tenant=command.tenant,
                            correlation_id=command.correlation_id or command.command_id,
                            plan_id=plan_id, stage=stage)
    return issue_command(command, ctx, child, cause_event_id)


def handle_plan_fleet(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Record the plan's scenario (normalised) and its digest, then issue the first stage."""
    assert isinstance(command, PlanFleet)
    if ctx.state.get(FLEET_PLAN, command.plan_id) is not None:
        return _refuse(command, ctx, command.plan_id, "plan_exists", "plan_id",
                       f"plan {command.plan_id} already exists")
    try:
        scenario = parse_scenario_structure(command.scenario)
    except PolicyInputError as error:
        return _refuse(command, ctx, command.plan_id, error.code, f"scenario.{error.field}",
                       error.message)
    digest = scenario_digest(scenario)
    command_ids = stage_command_ids(command.command_id)
    result = {"plan_id": command.plan_id, "inputs_digest": digest, "scenario": to_plain(scenario),
              "stages": list(STAGES), "stage_command_ids": command_ids}
    reason = Reason("fleet_plan_started", f"plan {scenario.name} issued its first stage",
                    {"scenario_name": scenario.name, "inputs_digest": digest,
                     "stages": list(STAGES)})
    data = decision_data(outcome="started", reasons=[reason], result=result, policy=None,
                         inputs={"plan_id": command.plan_id, "inputs_digest": digest}, ctx=ctx)
    started = new_event(command, ctx, "decision", FLEET_PLAN_STARTED, data)
    return [append_to(plan_stream(command.plan_id), ctx, started),
            _next_stage(command, ctx, command.plan_id, STAGES[0], command_ids, started.event_id)]


def _stage_problem(command: DecidePlanStage, plan: dict[str, Any]) -> tuple[str, str, str] | None:
    if plan["stage_command_ids"][command.stage] != command.command_id:
        return ("stage_not_issued_by_plan", "command_id",
                f"stage {command.stage} of plan {command.plan_id} is decided by its own chain")
    if command.stage in plan["stages"]:
        return "stage_already_decided", "stage", f"stage {command.stage} is already decided"
    missing = [name for name in STAGE_UPSTREAM[command.stage] if name not in plan["stages"]]
    if missing:
        return ("upstream_stage_missing", "stage",
                f"stage {command.stage} needs {', '.join(missing)} decided first")
    return None


def handle_decide_plan_stage(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Decide one stage from the recorded scenario and upstream results; issue the next stage."""
    assert isinstance(command, DecidePlanStage)
    stage = command.stage
    plan = ctx.state.get(FLEET_PLAN, command.plan_id)
    if plan is None:
        return _refuse(command, ctx, command.plan_id, "unknown_plan", "plan_id",
                       f"no plan {command.plan_id}")
    problem = _stage_problem(command, plan)
    if problem is not None:
        return _refuse(command, ctx, command.plan_id, *problem)
    upstream = {name: plan["stages"][name] for name in STAGE_UPSTREAM[stage]}
    try:
        scenario = parse_scenario_structure(plan["scenario"])
        result = run_stage(stage, scenario, {name: u["result"] for name, u in upstream.items()})
    except PolicyInputError as error:
        return _refuse(command, ctx, command.plan_id, error.code, error.field, error.message)
    outcome, reasons = stage_verdict(stage, result)
    recorded = plan["scenario"]
    policy_fields = {name: recorded[name] for name in STAGE_POLICY_FIELDS[stage]}
    policy = (PolicyInForce(f"fleet-plan.{stage}", f"scenario:{plan['inputs_digest']}",
                            policy_fields) if policy_fields else None)
    inputs = {"plan_id": command.plan_id, "stage": stage, "inputs_digest": plan["inputs_digest"],
              "scenario": {name: recorded[name] for name in STAGE_INPUT_FIELDS[stage]},
              "upstream_event_ids": {name: u["event_id"] for name, u in upstream.items()}}
    data = decision_data(outcome=outcome, reasons=[Reason(**r) for r in reasons], result=result,
                         policy=policy, inputs=inputs, ctx=ctx,
                         causes=[plan["started_event_id"],
                                 *(u["event_id"] for u in upstream.values())])
    decided = new_event(command, ctx, "decision", STAGE_EVENTS[stage], data)
    appends = [append_to(plan_stream(command.plan_id), ctx, decided)]
    position = STAGES.index(stage)
    if position + 1 < len(STAGES):
        appends.append(_next_stage(command, ctx, command.plan_id, STAGES[position + 1],
                                   plan["stage_command_ids"], decided.event_id))
    return appends


def precheck_plan_fleet(command: CommandBase, state: StateView) -> list[tuple[str, str]]:
    """A bad scenario or a taken plan id refuses the submission; nothing is written."""
    assert isinstance(command, PlanFleet)
    if state.get(FLEET_PLAN, command.plan_id) is not None:
        return [("plan_id", f"plan {command.plan_id!r} already exists")]
    try:
        scenario_from_plain(command.scenario)
    except PolicyInputError as error:
        return [(f"scenario.{error.field}", f"{error.message} [{error.code}]")]
    return []


def precheck_decide_plan_stage(command: CommandBase, state: StateView) -> list[tuple[str, str]]:
    """Stages are issued by their plan's chain only; submitting one would race the chain."""
    return [("type", "DecidePlanStage is issued by a plan's own decisions; submit PlanFleet")]


def _stage_streams(command: CommandBase) -> list[str]:
    """The plan's stream, and the inbox the next stage is issued to."""
    assert isinstance(command, DecidePlanStage)
    return [plan_stream(command.plan_id), INBOX_STREAM]


RULES_VERSIONS: dict[str, int] = {
    # 2: a scenario whose evidence age overflows a float is refused (it was started).
    # 3: an inventory with a duplicate GPU id or a bad free memory is refused whatever layout
    #    the plan computes (it was checked only when the layout matched the memory plan).
    "PlanFleet": 3,
    # 2: the capacity stage records each violation once among its reasons (it listed them
    #    twice); a figure overflowing a float (scaling's ready capacity, times, queued tokens,
    #    an evidence age) refuses the stage naming the scenario field (it failed as
    #    `decision_failed`); the layout stage refuses gpus_per_node above 1,024.
    # 3: the canary gate passes a quality drop or throughput ratio equal to its limit but for
    #    float rounding (`policies.gates`).
    # 4: the memory stage sizes pipeline weights by the largest stage (ceil(layers / pp)
    #    layers), not the average: a pp that does not divide the layers needs more per GPU;
    #    the placement stage names a duplicate GPU id before a bad free memory (spec 1.9).
    # 5: a refused placement on an inventory shaped unlike the scenario's topology (its node
    #    count, or GPUs on a node) adds `inventory_differs_from_topology`, and the placement
    #    stage's recorded inputs include the topology it compares.
    "DecidePlanStage": 5,
}
HANDLERS: dict[str, Handler] = {
    "PlanFleet": handle_plan_fleet,
    "DecidePlanStage": handle_decide_plan_stage,
}
# A plan issues its first stage to the inbox (its own stream it creates, so it is named).
STREAMS: dict[str, Streams] = {"PlanFleet": lambda command: [INBOX_STREAM],
                               "DecidePlanStage": _stage_streams}
PRECHECKS: dict[str, Precheck] = {
    "PlanFleet": precheck_plan_fleet,
    "DecidePlanStage": precheck_decide_plan_stage,
}
