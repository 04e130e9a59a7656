"""What a fleet plan's decisions prove (its observed evidence), how fresh its measurements are,
and the grade that turns both into the release verdict. Everything here reads the stages' plain
results, so a grade decided from recorded events is the grade `run_plan` computes.

Each control earns its evidence only when its own condition holds (spec §2.2 step 10); shedding
the oversize probe counts only when the token bound shed it, so a shed for another reason, or a
bypass, earns nothing. Freshness is judged at the scenario's evaluation time: evidence is usable
while its age is at most its declared maximum (inclusive).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.policies.admission import AdmissionAction, AdmissionDecision
from controlplane.policies.autoscaling import ScaleDecision
from controlplane.policies.capacity import CapacityPlan
from controlplane.policies.fleet_plan_placement import FleetPlacement
from controlplane.policies.fleet_plan_scenario import (
    BENIGN_ADMISSION,
    CANARY_GATE,
    CAPACITY_PLAN,
    EVIDENCE_SOURCES,
    GPU_PLACEMENT,
    MEMORY_FIT,
    OVERSIZE_SHEDDING,
    PARALLEL_LAYOUT,
    QUEUE_SCALING,
    ObservedAt,
    Scenario,
    scenario_digest,
    workload_evidence,
)
from controlplane.policies.memory import DeploymentMemory, MemoryAssessment
from controlplane.policies.parallelism import ParallelPlan
from controlplane.policies.reasons import Reason, to_plain
from controlplane.policies.rollouts import RolloutAction, RolloutDecision

TOKEN_BOUND_SHED = "token_bound_exceeded"
Results = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class PlanDecisions:
    """Every decision of the plan, in pipeline order."""

    memory: MemoryAssessment
    capacity: CapacityPlan
    parallelism: ParallelPlan
    placement: FleetPlacement
    benign_admission: AdmissionDecision
    oversize_admission: AdmissionDecision
    autoscaling: ScaleDecision
    rollout: RolloutDecision


@dataclass(frozen=True)
class EvidenceFreshness:
    source: str
    observed_at_seconds: float
    max_age_seconds: float
    age_seconds: float
    fresh: bool


def observe_evidence(scenario: Scenario, results: Results) -> frozenset[str]:
    """The evidence the stage results earn: one per served workload plus each passing control."""
    capacity = results["capacity"]
    required = capacity["required_replicas"]
    layout = results["layout"]
    admission = results["admission"]
    oversize = admission["oversize"]
    controls = {
        MEMORY_FIT: results["memory"]["fits"],
        CAPACITY_PLAN: capacity["release_ready"],
        PARALLEL_LAYOUT: layout["matches_memory_plan"] and layout["plan"]["data_parallel"] >= required,
        GPU_PLACEMENT: results["placement"]["placed"],
        BENIGN_ADMISSION: admission["benign"]["action"] == AdmissionAction.ADMIT.value,
        OVERSIZE_SHEDDING: (oversize["action"] == AdmissionAction.SHED.value
                            and [r["code"] for r in oversize["reasons"][:1]] == [TOKEN_BOUND_SHED]),
        QUEUE_SCALING: results["scaling"]["target_replicas"] >= required,
        CANARY_GATE: results["rollout"]["action"] == RolloutAction.PROMOTE.value,
    }
    workloads = {workload_evidence(workload.name) for workload in scenario.workloads}
    return frozenset(workloads | {name for name, held in controls.items() if held})


def assess_freshness(scenario: Scenario) -> tuple[EvidenceFreshness, ...]:
    """Each measured source's age at the evaluation time, in a fixed source order."""
    results = []
    for source in EVIDENCE_SOURCES:
        observed: ObservedAt = getattr(scenario.evidence_times, source)
        age = scenario.evaluated_at_seconds - observed.observed_at_seconds
        results.append(EvidenceFreshness(source, observed.observed_at_seconds,
                                         observed.max_age_seconds, age,
                                         age <= observed.max_age_seconds))
    return tuple(results)


def capacity_deciding_reason(capacity: Mapping[str, Any]) -> dict[str, Any]:
    """The sizing reason, naming every binding dimension (the bottleneck alone hid ties, bug 7)."""
    sizing = capacity["reasons"][0]
    binding = ", ".join(d.replace("_", " ") for d in capacity["binding_dimensions"])
    return {**sizing, "message": f"{sizing['message']}; binding dimensions: {binding}"}


def layout_mismatch_reason(deployment: DeploymentMemory, layout: Mapping[str, Any]) -> Reason:
    """Why the layout earns no placement: it is not the sharding the memory plan sized."""
    return Reason("layout_differs_from_memory_plan",
                  "the chosen layout is not the tensor x pipeline split the memory plan sized",
                  {"layout_feasible": layout["feasible"],
                   "layout_tensor_parallel": layout["tensor_parallel"],
                   "layout_pipeline_parallel": layout["pipeline_parallel"],
                   "memory_plan_tensor_parallel": deployment.tensor_parallel_size,
                   "memory_plan_pipeline_parallel": deployment.pipeline_parallel_size})


def deciding_reasons(results: Results) -> dict[str, list[dict[str, Any]]]:
    """Each control's deciding reasons, in the fixed control order (spec §2.2 step 11)."""
    capacity = results["capacity"]
    admission = results["admission"]
    return {
        MEMORY_FIT: list(results["memory"]["reasons"]),
        CAPACITY_PLAN: [capacity_deciding_reason(capacity), *capacity["violations"]],
        PARALLEL_LAYOUT: list(results["layout"]["reasons"]),
        GPU_PLACEMENT: list(results["placement"]["reasons"]),
        BENIGN_ADMISSION: list(admission["benign"]["reasons"]),
        OVERSIZE_SHEDDING: list(admission["oversize"]["reasons"]),
        QUEUE_SCALING: list(results["scaling"]["reasons"]),
        CANARY_GATE: list(results["rollout"]["reasons"]),
    }


def grade_plan(scenario: Scenario, results: Results) -> dict[str, Any]:
    """The release verdict: ready exactly when capacity holds, every required piece of evidence
    was observed (set difference) and every measurement is fresh; each failure is one reason."""
    observed = observe_evidence(scenario, results)
    missing = sorted(scenario.required_evidence - observed)
    freshness = assess_freshness(scenario)
    violations: list[Any] = list(results["capacity"]["violations"])
    if missing:
        violations.append(Reason("missing_required_evidence",
                                 f"missing required evidence: {', '.join(missing)}",
                                 {"missing_evidence": missing}))
    violations += [Reason("evidence_stale",
                          f"{item.source} evidence is {item.age_seconds:g}s old, older than "
                          f"its {item.max_age_seconds:g}s limit", to_plain(item))
                   for item in freshness if not item.fresh]
    ready = Reason("release_evidence_complete",
                   "every required piece of evidence was observed, fresh, within capacity",
                   {"required_evidence": len(scenario.required_evidence)})
    return {
        "release_ready": not violations,
        "required_evidence": sorted(scenario.required_evidence),
        "observed_evidence": sorted(observed),
        "violations": to_plain(violations),
        "missing_evidence": missing,
        "evidence_freshness": to_plain(freshness),
        "scenario_name": scenario.name,
        "evaluated_at_seconds": scenario.evaluated_at_seconds,
        "inputs_digest": scenario_digest(scenario),
        "reasons": to_plain(violations or [ready]),
    }
