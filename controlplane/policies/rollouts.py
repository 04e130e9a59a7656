"""Rollouts: a release gate on measured evidence and a staged ladder around it (§1.11, ex. 11).

`evaluate_rollout` judges one piece of candidate evidence against requirements declared apart
from it: an immature candidate (unwarmed, too few samples, missing required gate evidence) is
held, not punished; otherwise every failing gate is reported, in a fixed order, and any failure
rolls back; a passing shadow is held for canary evidence; a passing canary promotes.

`advance_rollout` walks the ladder warmup -> shadow -> canary steps -> promoted, rolling back
from shadow or any canary step on a failing gate. Rollback and promotion are terminal; a rolled
back state routes no user traffic to the candidate and keeps the gates that removed it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from controlplane.policies.gates import below, exceeds
from controlplane.policies.reasons import PolicyInputError, Reason, require


class TrafficMode(StrEnum):
    SHADOW = "shadow"
    CANARY = "canary"


class RolloutAction(StrEnum):
    HOLD = "hold"
    ADVANCE = "advance"
    PROMOTE = "promote"
    ROLLBACK = "rollback"


class RolloutStage(StrEnum):
    WARMUP = "warmup"
    SHADOW = "shadow"
    CANARY = "canary"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"


@dataclass(frozen=True)
class ReleaseMeasurement:
    revision: str
    mode: TrafficMode
    warmed: bool
    sample_count: int
    quality_score: float
    p95_ttft_seconds: float
    p95_tpot_seconds: float
    output_tokens_per_second: float
    error_rate: float


@dataclass(frozen=True)
class ReleaseRequirements:
    """Trusted policy, declared before and apart from any measurement."""

    min_sample_count: int
    min_quality_score: float
    max_quality_drop: float
    max_p95_ttft_seconds: float
    max_p95_tpot_seconds: float
    min_relative_throughput: float
    max_error_rate: float
    required_gates: frozenset[str] = frozenset()


@dataclass(frozen=True)
class GateEvidence:
    """The outcome of another evaluator (e.g. quantization, speculation) for this candidate."""

    name: str
    passed: bool
    reasons: tuple[Reason, ...] = ()


@dataclass(frozen=True)
class RolloutDecision:
    action: RolloutAction
    reasons: tuple[Reason, ...]


@dataclass(frozen=True)
class RolloutPlan:
    canary_traffic_percents: tuple[float, ...] = (1.0, 10.0)


@dataclass(frozen=True)
class RolloutState:
    stage: RolloutStage = RolloutStage.WARMUP
    canary_step: int = 0
    candidate_traffic_percent: float = 0.0
    deciding_codes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RolloutStep:
    action: RolloutAction
    from_stage: RolloutStage
    to_stage: RolloutStage
    candidate_traffic_percent: float
    reasons: tuple[Reason, ...]


def _validate_measurement(measurement: ReleaseMeasurement, role: str) -> None:
    require(bool(measurement.revision.strip()), "revision_required", f"{role}.revision",
            f"{role} revision is required")
    require(isinstance(measurement.sample_count, int) and measurement.sample_count >= 0,
            "sample_count_negative", f"{role}.sample_count",
            f"{role} sample count must be a non-negative integer")
    # Spec §1.11's order: throughput first, then the other values.
    throughput = measurement.output_tokens_per_second
    require(math.isfinite(throughput), "measurement_invalid", f"{role}.output_tokens_per_second",
            f"{role} output_tokens_per_second must be finite and non-negative")
    require(throughput > 0, "throughput_not_positive",
            f"{role}.output_tokens_per_second", f"{role} throughput must be positive")
    for name in ("quality_score", "p95_ttft_seconds", "p95_tpot_seconds", "error_rate"):
        value = getattr(measurement, name)
        require(math.isfinite(value) and value >= 0, "measurement_invalid", f"{role}.{name}",
                f"{role} {name} must be finite and non-negative")


def _validate(baseline: ReleaseMeasurement, candidate: ReleaseMeasurement,
              requirements: ReleaseRequirements, gates: Sequence[GateEvidence]) -> None:
    _validate_measurement(baseline, "baseline")
    _validate_measurement(candidate, "candidate")
    # Each is finite and positive, yet their ratio can still overflow (a baseline of 5e-324).
    require(math.isfinite(candidate.output_tokens_per_second / baseline.output_tokens_per_second),
            "relative_throughput_not_finite", "baseline.output_tokens_per_second",
            "candidate throughput over baseline throughput must be a finite number")
    require(isinstance(requirements.min_sample_count, int) and requirements.min_sample_count > 0,
            "min_sample_count_not_positive", "min_sample_count",
            "the minimum sample count must be a positive integer")
    for name in ("min_quality_score", "max_quality_drop", "max_p95_ttft_seconds",
                 "max_p95_tpot_seconds", "min_relative_throughput", "max_error_rate"):
        value = getattr(requirements, name)
        require(math.isfinite(value) and value >= 0, "requirement_invalid", name,
                f"{name} must be finite and non-negative")
    names = [gate.name for gate in gates]
    require(all(name.strip() for name in names) and len(set(names)) == len(names),
            "gate_names_invalid", "gates", "gate evidence needs unique, non-blank names")


def evaluate_rollout(baseline: ReleaseMeasurement, candidate: ReleaseMeasurement,
                     requirements: ReleaseRequirements,
                     gates: Sequence[GateEvidence] = ()) -> RolloutDecision:
    """Hold immature evidence; roll back on any failing gate, all reported; else hold or promote."""
    _validate(baseline, candidate, requirements, gates)
    readiness = []
    if not candidate.warmed:
        readiness.append(Reason("candidate_not_warmed",
                                "candidate has not completed model warmup", {}))
    if candidate.sample_count < requirements.min_sample_count:
        readiness.append(Reason("insufficient_samples",
                                "candidate sample is below the independent minimum",
                                {"sample_count": candidate.sample_count,
                                 "min_sample_count": requirements.min_sample_count}))
    supplied = {gate.name for gate in gates}
    missing = sorted(requirements.required_gates - supplied)
    if missing:
        readiness.append(Reason("required_gate_evidence_missing",
                                "required gate evidence has not been supplied",
                                {"missing_gates": missing}))
    if readiness:
        return RolloutDecision(RolloutAction.HOLD, tuple(readiness))
    drop = baseline.quality_score - candidate.quality_score
    relative = candidate.output_tokens_per_second / baseline.output_tokens_per_second
    checks = [
        ("quality_below_floor", "quality score below absolute floor",
         candidate.quality_score < requirements.min_quality_score,
         {"quality_score": candidate.quality_score,
          "min_quality_score": requirements.min_quality_score}),
        ("quality_regression_exceeds_allowance", "quality regression exceeds allowance",
         exceeds(drop, requirements.max_quality_drop),
         {"quality_drop": drop, "max_quality_drop": requirements.max_quality_drop}),
        ("p95_ttft_exceeds_objective", "p95 TTFT exceeds rollout objective",
         candidate.p95_ttft_seconds > requirements.max_p95_ttft_seconds,
         {"p95_ttft_seconds": candidate.p95_ttft_seconds,
          "max_p95_ttft_seconds": requirements.max_p95_ttft_seconds}),
        ("p95_tpot_exceeds_objective", "p95 TPOT exceeds rollout objective",
         candidate.p95_tpot_seconds > requirements.max_p95_tpot_seconds,
         {"p95_tpot_seconds": candidate.p95_tpot_seconds,
          "max_p95_tpot_seconds": requirements.max_p95_tpot_seconds}),
        ("relative_throughput_below_objective", "relative throughput below rollout objective",
         below(relative, requirements.min_relative_throughput),
         {"relative_throughput": relative,
          "min_relative_throughput": requirements.min_relative_throughput}),
        ("error_rate_exceeds_objective", "error rate exceeds rollout objective",
         candidate.error_rate > requirements.max_error_rate,
         {"error_rate": candidate.error_rate, "max_error_rate": requirements.max_error_rate}),
    ]
    failures = [Reason(code, message, facts) for code, message, failed, facts in checks if failed]
    # Supplied gate evidence follows the built-in gates, ordered by name so input order is moot.
    failures += [Reason("gate_evidence_failed", f"{gate.name} gate failed",
                        {"gate": gate.name, "gate_reason_codes": [r.code for r in gate.reasons]})
                 for gate in sorted(gates, key=lambda g: g.name) if not gate.passed]
    if failures:
        return RolloutDecision(RolloutAction.ROLLBACK, tuple(failures))
    if candidate.mode is TrafficMode.SHADOW:
        return RolloutDecision(RolloutAction.HOLD, (Reason(
            "shadow_passed_canary_required",
            "shadow passed, but user-facing canary evidence is still required", {}),))
    return RolloutDecision(RolloutAction.PROMOTE, (Reason(
        "all_gates_passed", "warmed canary passed every independent release gate",
        {"relative_throughput": relative, "quality_drop": drop}),))


def _validate_plan(plan: RolloutPlan) -> None:
    steps = plan.canary_traffic_percents
    require(len(steps) > 0 and all(math.isfinite(s) and 0 < s < 100 for s in steps)
            and all(a < b for a, b in zip(steps, steps[1:], strict=False)),
            "canary_steps_invalid", "canary_traffic_percents",
            "canary steps must be increasing percentages strictly between 0 and 100")


def advance_rollout(state: RolloutState, baseline: ReleaseMeasurement,
                    candidate: ReleaseMeasurement, requirements: ReleaseRequirements,
                    plan: RolloutPlan, gates: Sequence[GateEvidence] = (),
                    ) -> tuple[RolloutStep, RolloutState]:
    """Move one rung up the ladder, hold, or roll back; shadow evidence never promotes."""
    _validate_plan(plan)
    _validate(baseline, candidate, requirements, gates)
    stage = state.stage
    require(stage is not RolloutStage.CANARY
            or 0 <= state.canary_step < len(plan.canary_traffic_percents),
            "canary_step_out_of_range", "canary_step", "the canary step is not in the plan")

    def step(action: RolloutAction, new: RolloutState,
             reasons: tuple[Reason, ...]) -> tuple[RolloutStep, RolloutState]:
        return (RolloutStep(action, stage, new.stage, new.candidate_traffic_percent, reasons),
                new)

    if stage in (RolloutStage.PROMOTED, RolloutStage.ROLLED_BACK):
        return step(RolloutAction.HOLD, state, (Reason(
            "rollout_finished", "the rollout already finished", {"stage": stage.value}),))
    if stage is RolloutStage.WARMUP:
        if not candidate.warmed:
            return step(RolloutAction.HOLD, state, (Reason(
                "candidate_not_warmed", "candidate has not completed model warmup", {}),))
        return step(RolloutAction.ADVANCE, replace(state, stage=RolloutStage.SHADOW), (Reason(
            "warmup_complete", "warmed with zero traffic; shadowing next", {}),))
    expected = TrafficMode.SHADOW if stage is RolloutStage.SHADOW else TrafficMode.CANARY
    if candidate.mode is not expected:
        raise PolicyInputError("evidence_mode_mismatch", "candidate.mode",
                               f"the {stage.value} stage needs {expected.value} evidence")
    decision = evaluate_rollout(baseline, candidate, requirements, gates)
    if decision.action is RolloutAction.ROLLBACK:
        rolled_back = RolloutState(RolloutStage.ROLLED_BACK, state.canary_step, 0.0,
                                   tuple(reason.code for reason in decision.reasons))
        return step(RolloutAction.ROLLBACK, rolled_back, decision.reasons)
    ready = (decision.action is RolloutAction.PROMOTE
             or decision.reasons[0].code == "shadow_passed_canary_required")
    if not ready:
        return step(RolloutAction.HOLD, state, decision.reasons)
    steps = plan.canary_traffic_percents
    index = 0 if stage is RolloutStage.SHADOW else state.canary_step + 1
    if index < len(steps):
        reason = Reason("stage_gates_passed", "every gate passed; widening the canary",
                        {"canary_step": index, "candidate_traffic_percent": steps[index]})
        return step(RolloutAction.ADVANCE,
                    RolloutState(RolloutStage.CANARY, index, steps[index]), (reason,))
    return step(RolloutAction.PROMOTE,
                RolloutState(RolloutStage.PROMOTED, state.canary_step, 100.0), decision.reasons)
