"""Staged rollouts through the log: start, record evidence, evaluate the stage (spec 1.11, ex. 11).

Evidence and judgement are two decisions. `RecordCanaryMeasurement` checks the evidence belongs
to the rollout's releases, runs the quantization and speculation gates on any gate evidence, and
records it; that decision ISSUES `EvaluateCanary` for the measurement (child id
`<command_id>:evaluate`), which walks the ladder warmup -> shadow -> canary steps -> promoted with
`advance_rollout`, or rolls back. An operator may submit `EvaluateCanary` too. A measurement
moves the ladder at most once (`evidence_already_used`), so re-evaluating one piece of canary
evidence cannot widen the canary twice. Requirements are fixed when the rollout starts.
"""

from __future__ import annotations

from typing import Any

from controlplane.commands.base import CommandBase
from controlplane.commands.rollout import EvaluateCanary, RecordCanaryMeasurement, StartRollout
from controlplane.decisions import (
    INBOX_STREAM,
    DecisionContext,
    append_to,
    decision_data,
    issue_command,
    new_event,
    rejection,
)
from controlplane.handlers.base import Handler, Precheck, RefuseExisting, Streams
from controlplane.policies.quantization import (
    QuantizationAction,
    QuantizationMeasurement,
    QuantizationRequirements,
    evaluate_quantization,
)
from controlplane.policies.reasons import PolicyInputError, Reason, to_plain
from controlplane.policies.rollouts import (
    GateEvidence,
    ReleaseMeasurement,
    ReleaseRequirements,
    RolloutAction,
    RolloutPlan,
    RolloutStage,
    RolloutState,
    TrafficMode,
    advance_rollout,
)
from controlplane.policies.speculative import (
    SpeculationCosts,
    SpeculationRound,
    evaluate_speculation_rounds,
    judge_measured_speedup,
)
from controlplane.policy_book import PolicyInForce
from controlplane.state.rollout import (
    CANARY_MEASUREMENT_RECORDED,
    ROLLOUT,
    ROLLOUT_ADVANCED,
    ROLLOUT_HELD,
    ROLLOUT_MEASUREMENT,
    ROLLOUT_PROMOTED,
    ROLLOUT_ROLLED_BACK,
    ROLLOUT_STARTED,
    measurement_key,
)
from events.model import StreamAppend

STAGE_EVENTS = {RolloutAction.HOLD: ROLLOUT_HELD, RolloutAction.ADVANCE: ROLLOUT_ADVANCED,
                RolloutAction.PROMOTE: ROLLOUT_PROMOTED, RolloutAction.ROLLBACK: ROLLOUT_ROLLED_BACK}
FINISHED = (RolloutStage.PROMOTED.value, RolloutStage.ROLLED_BACK.value)
REQUIREMENT_FIELDS = ("min_sample_count", "min_quality_score", "max_quality_drop",
                      "max_p95_ttft_seconds", "max_p95_tpot_seconds", "min_relative_throughput",
                      "max_error_rate")
MAX_COMMAND_ID = 100


def _refuse(command: CommandBase, ctx: DecisionContext, code: str, field: str, message: str,
            rollout_id: str) -> list[StreamAppend]:
    return rejection(command, ctx, PolicyInputError(code, field, message), f"rollout/{rollout_id}")


def handle_start_rollout(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Open a rollout at warmup with zero candidate traffic and its requirements fixed."""
    assert isinstance(command, StartRollout)
    if ctx.state.get(ROLLOUT, command.rollout_id) is not None:
        return _refuse(command, ctx, "rollout_exists", "rollout_id",
                       f"rollout {command.rollout_id} already exists", command.rollout_id)
    policy = None if command.requirements is not None else ctx.policies.in_force(ctx.state, "rollout")
    requirements = (command.requirements.model_dump(mode="json") if command.requirements is not None
                    else dict(policy.parameters) if policy is not None else {})
    quantization = (command.quantization_requirements.model_dump(mode="json")
                    if command.quantization_requirements is not None else None)
    if "quantization" in requirements["required_gates"] and quantization is None:
        return _refuse(command, ctx, "quantization_requirements_missing",
                       "quantization_requirements", "a required quantization gate needs thresholds",
                       command.rollout_id)
    rollout: dict[str, Any] = {
        "rollout_id": command.rollout_id, "pool_id": command.pool_id,
        "baseline_revision": command.baseline_revision,
        "candidate_revision": command.candidate_revision, "requirements": requirements,
        "quantization_requirements": quantization,
        "requirements_version": policy.version if policy is not None else "declared",
        "stage": RolloutStage.WARMUP.value, "canary_step": 0, "candidate_traffic_percent": 0.0,
        "deciding_codes": []}
    reason = Reason("rollout_started", "candidate warms up with zero user traffic",
                    {"stage": "warmup", "canary_traffic_percents":
                     requirements["canary_traffic_percents"]})
    data = decision_data(outcome="started", reasons=[reason], result=rollout, policy=policy,
                         inputs=command.payload(), ctx=ctx)
    return [append_to(f"rollout/{command.rollout_id}", ctx,
                      new_event(command, ctx, "decision", ROLLOUT_STARTED, data))]


def _gate_results(command: RecordCanaryMeasurement, rollout: dict[str, Any]) -> dict[str, Any]:
    """Run the gates this measurement brings evidence for; PolicyInputError on bad evidence."""
    gates: dict[str, Any] = {}
    if command.quantization is not None:
        thresholds = rollout["quantization_requirements"]
        if thresholds is None:
            raise PolicyInputError("quantization_requirements_missing", "quantization",
                                   "the rollout declared no quantization thresholds")
        quantized = evaluate_quantization(
            QuantizationMeasurement(**command.quantization.baseline.model_dump()),
            QuantizationMeasurement(**command.quantization.candidate.model_dump()),
            QuantizationRequirements(**thresholds))
        gates["quantization"] = {"passed": quantized.action is QuantizationAction.STAGE,
                                 "reasons": to_plain(quantized.reasons)}
    if command.speculation is not None:
        costs = command.speculation.costs
        summary = evaluate_speculation_rounds(
            [SpeculationRound(tuple(r.draft_tokens), tuple(r.target_tokens))
             for r in command.speculation.rounds],
            SpeculationCosts(costs.baseline_seconds_per_token, costs.draft_seconds_per_token,
                             costs.verification_seconds_per_round),
            rollout["requirements"]["speculation_minimum_speedup"])
        gates["speculation"] = {"passed": summary.enable, "reasons": to_plain(summary.reasons)}
    return gates


def handle_record_measurement(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Record evidence attributable to the rollout's releases, then issue its evaluation."""
    assert isinstance(command, RecordCanaryMeasurement)
    rollout = ctx.state.get(ROLLOUT, command.rollout_id)
    if rollout is None:
        return _refuse(command, ctx, "unknown_rollout", "rollout_id", "no such rollout",
                       command.rollout_id)
    if rollout["stage"] in FINISHED:
        return _refuse(command, ctx, "rollout_finished", "rollout_id",
                       f"the rollout is {rollout['stage']}", command.rollout_id)
    for role in ("baseline", "candidate"):
        if getattr(command, role).revision != rollout[f"{role}_revision"]:
            return _refuse(command, ctx, "measurement_revision_mismatch", f"{role}.revision",
                           f"the rollout's {role} is {rollout[f'{role}_revision']}",
                           command.rollout_id)
    try:
        gates = _gate_results(command, rollout)
    except PolicyInputError as error:
        return rejection(command, ctx, error, f"rollout/{command.rollout_id}")
    in_force = {**rollout["gates"], **gates}
    result = {"rollout_id": command.rollout_id, "measurement_id": command.command_id,
              "baseline": command.baseline.model_dump(mode="json"),
              "candidate": command.candidate.model_dump(mode="json"),
              "gates": gates, "gates_in_force": in_force,
              "stage": rollout["stage"], "canary_step": rollout["canary_step"]}
    reason = Reason("canary_evidence_recorded", "evidence recorded; evaluation issued", {
        "mode": command.candidate.mode, "warmed": command.candidate.warmed,
        "sample_count": command.candidate.sample_count, "stage": rollout["stage"],
        "gates_passed": {name: gate["passed"] for name, gate in sorted(in_force.items())}})
    data = decision_data(outcome="recorded", reasons=[reason], result=result, policy=None,
                         inputs=command.payload(), ctx=ctx, causes=[rollout["last_decision_event_id"]])
    recorded = new_event(command, ctx, "decision", CANARY_MEASUREMENT_RECORDED, data)
    suffix = ":evaluate"
    child_id = (command.command_id + suffix if len(command.command_id) + len(suffix) <= MAX_COMMAND_ID
                else f"{recorded.event_id}{suffix}")
    evaluation = EvaluateCanary(command_id=child_id, at=command.at, actor=command.actor,
                                tenant=command.tenant,
                                correlation_id=command.correlation_id or command.command_id,
                                rollout_id=command.rollout_id, measurement_id=command.command_id)
    return [append_to(f"rollout/{command.rollout_id}", ctx, recorded),
            issue_command(command, ctx, evaluation, recorded.event_id)]


def _rung_of(row: dict[str, Any]) -> tuple[str, int]:
    """The rung a rollout is on, or a measurement was taken on: its stage and canary step."""
    return row["stage"], row["canary_step"]


def _rung(stage: str, canary_step: int) -> str:
    return f"canary step {canary_step}" if stage == RolloutStage.CANARY.value else f"stage {stage}"


def _measurement(spec: dict[str, Any]) -> ReleaseMeasurement:
    return ReleaseMeasurement(**{**spec, "mode": TrafficMode(spec["mode"])})


def _gate_evidence(name: str, gate: dict[str, Any], requirements: dict[str, Any]) -> GateEvidence:
    """A gate's recorded verdict; the speculation gate's measured speedup is judged again by
    the minimum in the requirements this evaluation uses (a what-if's, when one applies)."""
    reasons = tuple(Reason(**r) for r in gate["reasons"])
    if name != "speculation":
        return GateEvidence(name, gate["passed"], reasons)
    passed, reason = judge_measured_speedup(reasons[0], requirements["speculation_minimum_speedup"])
    return GateEvidence(name, passed, (reason,))


def handle_evaluate_canary(command: CommandBase, ctx: DecisionContext) -> list[StreamAppend]:
    """Hold, advance, promote or roll back on one measurement's evidence; rollback is terminal."""
    assert isinstance(command, EvaluateCanary)
    rollout = ctx.state.get(ROLLOUT, command.rollout_id)
    if rollout is None:
        return _refuse(command, ctx, "unknown_rollout", "rollout_id", "no such rollout",
                       command.rollout_id)
    if rollout["stage"] in FINISHED:  # as a measurement is refused: nothing moves it any more
        return _refuse(command, ctx, "rollout_finished", "rollout_id",
                       f"the rollout is {rollout['stage']}", command.rollout_id)
    measurement_id = command.measurement_id or rollout["latest_measurement_id"]
    measurement = (ctx.state.get(ROLLOUT_MEASUREMENT, measurement_key(command.rollout_id,
                                                                       measurement_id))
                   if measurement_id is not None else None)
    if measurement is None:
        return _refuse(command, ctx, "unknown_measurement", "measurement_id",
                       "no such measurement for this rollout", command.rollout_id)
    if measurement["used_by_event_id"] is not None:
        return _refuse(command, ctx, "evidence_already_used", "measurement_id",
                       "this measurement already moved the rollout", command.rollout_id)
    # Each rung past warmup is cleared by evidence measured on it: two measurements taken at
    # 1% had widened the canary to 10% and then promoted it, nothing ever measured at 10%;
    # evidence recorded in shadow could clear the first rung, and evidence recorded in warmup,
    # before any shadow traffic, the shadow stage. (In warmup, only the evidence's warm flag
    # counts; a measurement recorded before its rung was recorded with it is not checked.)
    if measurement.get("stage") is not None and rollout["stage"] != RolloutStage.WARMUP.value \
            and _rung_of(measurement) != _rung_of(rollout):
        return _refuse(command, ctx, "evidence_from_another_step", "measurement_id",
                       f"this measurement was taken at {_rung(*_rung_of(measurement))}; the rollout is "
                       f"now at {_rung(*_rung_of(rollout))}",
                       command.rollout_id)
    requirements = rollout["requirements"]
    if rollout["requirements_version"] != "declared":
        # Copied from the rollout policy at the start: a what-if of that policy applies to it.
        requirements = ctx.policies.as_recorded("rollout", rollout["requirements_version"],
                                                requirements).parameters
    gates = [_gate_evidence(name, gate, requirements)
             for name, gate in sorted(measurement["gates_in_force"].items())]
    state = RolloutState(RolloutStage(rollout["stage"]), rollout["canary_step"],
                         rollout["candidate_traffic_percent"], tuple(rollout["deciding_codes"]))
    try:
        step, after = advance_rollout(
            state, _measurement(measurement["baseline"]), _measurement(measurement["candidate"]),
            ReleaseRequirements(**{name: requirements[name] for name in REQUIREMENT_FIELDS},
                                required_gates=frozenset(requirements["required_gates"])),
            RolloutPlan(tuple(requirements["canary_traffic_percents"])), gates)
    except PolicyInputError as error:
        return rejection(command, ctx, error, f"rollout/{command.rollout_id}")
    result = {"rollout_id": command.rollout_id, "measurement_id": measurement_id,
              "action": step.action.value, "from_stage": step.from_stage.value,
              "to_stage": step.to_stage.value, "canary_step": after.canary_step,
              "candidate_traffic_percent": step.candidate_traffic_percent,
              "deciding_codes": list(after.deciding_codes)}
    policy = PolicyInForce("rollout", rollout["requirements_version"],
                           {**requirements, "quantization": rollout["quantization_requirements"]})
    data = decision_data(outcome=step.action.value, reasons=step.reasons, result=result,
                         policy=policy, inputs={"command": command.payload(), "stage": state,
                                                "measurement": measurement}, ctx=ctx,
                         causes=[measurement["event_id"], rollout["last_decision_event_id"]])
    return [append_to(f"rollout/{command.rollout_id}", ctx,
                      new_event(command, ctx, "decision", STAGE_EVENTS[step.action], data))]


HANDLERS: dict[str, Handler] = {
    "StartRollout": handle_start_rollout,
    "RecordCanaryMeasurement": handle_record_measurement,
    "EvaluateCanary": handle_evaluate_canary,
}
PRECHECKS: dict[str, Precheck] = {
    "StartRollout": RefuseExisting(ROLLOUT, "rollout_id", "rollout")}
# Versions of the decision rules, each with what changed (see `handlers/base.py`).
RULES_VERSIONS: dict[str, int] = {
    # 2: a canary rung is cleared only by evidence measured on it.
    # 3: a quality drop or throughput ratio equal to its limit but for float rounding passes
    #    (`policies.gates`; 0.90 - 0.87 had exceeded a 0.03 allowance).
    # 4: a finished rollout's evaluation is refused (`rollout_finished`; it appended a hold
    #    each time).
    # 5: the shadow stage is cleared only by evidence measured in it: a shadow measurement
    #    recorded in warmup (with zero traffic) had cleared it (`evidence_from_another_step`).
    "EvaluateCanary": 5,
    # 2: the quantization gate as EvaluateCanary's version 3.
    "RecordCanaryMeasurement": 2,
}
# A measurement issues its rollout's evaluation to the inbox.
STREAMS: dict[str, Streams] = {"RecordCanaryMeasurement": lambda command: [INBOX_STREAM]}
