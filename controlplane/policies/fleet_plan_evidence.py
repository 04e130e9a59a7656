"""What a fleet plan's decisions prove (its observed evidence), and how fresh its measurements are.

Each control earns its evidence only when its own condition holds (spec §2.2 step 10); shedding
the oversize probe counts only when the token bound shed it, so a shed for another reason, or a
bypass, earns nothing. Freshness is judged at the scenario's evaluation time: evidence is usable
while its age is at most its declared maximum (inclusive).
"""

from __future__ import annotations

from dataclasses import dataclass

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
    workload_evidence,
)
from controlplane.policies.memory import DeploymentMemory, MemoryAssessment
from controlplane.policies.parallelism import ParallelPlan
from controlplane.policies.reasons import Reason
from controlplane.policies.rollouts import RolloutAction, RolloutDecision

TOKEN_BOUND_SHED = "token_bound_exceeded"


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


def observe_evidence(scenario: Scenario, decisions: PlanDecisions,
                     layout_matches: bool) -> frozenset[str]:
    """The evidence these decisions earn: one per served workload plus each passing control."""
    capacity = decisions.capacity
    required = capacity.required_replicas
    oversize = decisions.oversize_admission
    controls = {
        MEMORY_FIT: decisions.memory.fits,
        CAPACITY_PLAN: capacity.release_ready,
        PARALLEL_LAYOUT: layout_matches and decisions.parallelism.data_parallel >= required,
        GPU_PLACEMENT: decisions.placement.placed,
        BENIGN_ADMISSION: decisions.benign_admission.action is AdmissionAction.ADMIT,
        OVERSIZE_SHEDDING: (oversize.action is AdmissionAction.SHED
                            and [r.code for r in oversize.reasons[:1]] == [TOKEN_BOUND_SHED]),
        QUEUE_SCALING: decisions.autoscaling.target_replicas >= required,
        CANARY_GATE: decisions.rollout.action is RolloutAction.PROMOTE,
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


def capacity_deciding_reason(capacity: CapacityPlan) -> Reason:
    """The sizing reason, naming every binding dimension (the bottleneck alone hid ties, bug 7)."""
    sizing = capacity.reasons[0]
    binding = ", ".join(d.value.replace("_", " ") for d in capacity.binding_dimensions)
    return Reason(sizing.code, f"{sizing.message}; binding dimensions: {binding}", sizing.facts)


def layout_mismatch_reason(deployment: DeploymentMemory, parallel: ParallelPlan) -> Reason:
    """Why the layout earns no placement: it is not the sharding the memory plan sized."""
    return Reason("layout_differs_from_memory_plan",
                  "the chosen layout is not the tensor x pipeline split the memory plan sized",
                  {"layout_feasible": parallel.feasible,
                   "layout_tensor_parallel": parallel.tensor_parallel,
                   "layout_pipeline_parallel": parallel.pipeline_parallel,
                   "memory_plan_tensor_parallel": deployment.tensor_parallel_size,
                   "memory_plan_pipeline_parallel": deployment.pipeline_parallel_size})
