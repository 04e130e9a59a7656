"""The fleet plan (spec §2): every decision family composed in a fixed order, graded on evidence.

Order: capacity, memory, parallel layout (KV-aware, derived from the model), placement (only for a
layout the memory plan covers), admission of a benign and an oversize probe, autoscaling,
rollout, evidence freshness, grading. Downstream inputs come from upstream decisions, never
restated (§7). Grading is a set difference against the scenario's declared required evidence, so
an extra workload adds evidence without failing and removing a stimulus cannot remove its
obligation. The plan is bound to its inputs by `inputs_digest`; it contains no NaN or infinity.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ParamSpec, TypeVar

from controlplane.policies.admission import (
    AdmissionDecision,
    AdmissionPolicy,
    AdmissionRequest,
    PoolState,
    admit,
)
from controlplane.policies.autoscaling import (
    AutoscalingPolicy,
    ScaleDecision,
    ScaleObservation,
    ScaleState,
    recommend_replicas,
)
from controlplane.policies.capacity import CapacityPlan, plan_capacity
from controlplane.policies.fleet_plan_evidence import (
    EvidenceFreshness,
    PlanDecisions,
    assess_freshness,
    capacity_deciding_reason,
    layout_mismatch_reason,
    observe_evidence,
)
from controlplane.policies.fleet_plan_parse import (
    check_scenario,
    parse_scenario_structure,
    relocate_error,
)
from controlplane.policies.fleet_plan_placement import (
    FleetPlacement,
    place_fleet,
    placement_not_requested,
)
from controlplane.policies.fleet_plan_scenario import (
    BENIGN_ADMISSION,
    CANARY_GATE,
    CAPACITY_PLAN,
    GPU_PLACEMENT,
    MEMORY_FIT,
    OVERSIZE_SHEDDING,
    PARALLEL_LAYOUT,
    QUEUE_SCALING,
    AdmissionBudgetMode,
    AdmissionProbe,
    PlacementMode,
    Scenario,
)
from controlplane.policies.memory import (
    GIB,
    DeploymentMemory,
    MemoryAssessment,
    ModelMemory,
    assess_memory,
)
from controlplane.policies.parallelism import (
    ClusterTopology,
    ParallelModel,
    ParallelPlan,
    plan_parallelism,
)
from controlplane.policies.reasons import PolicyInputError, Reason, to_plain
from controlplane.policies.rollouts import ReleaseRequirements, evaluate_rollout

_P = ParamSpec("_P")
_T = TypeVar("_T")


@dataclass(frozen=True)
class FleetPlan:
    """The graded plan: `release_ready` exactly when `violations` is empty."""

    release_ready: bool
    required_evidence: tuple[str, ...]
    observed_evidence: tuple[str, ...]
    violations: tuple[Reason, ...]
    decisions: PlanDecisions
    deciding_reasons: Mapping[str, tuple[Reason, ...]]
    missing_evidence: tuple[str, ...]
    evidence_freshness: tuple[EvidenceFreshness, ...]
    admission_policy: AdmissionPolicy
    layout_matches_memory_plan: bool
    scenario_name: str
    evaluated_at_seconds: float
    inputs_digest: str
    reasons: tuple[Reason, ...]


def canonical_json(value: Any) -> str:
    """Sorted-key, compact, UTF-8 JSON of plain data; refuses NaN and infinity."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def scenario_digest(scenario: Scenario) -> str:
    """sha256 of the scenario's canonical JSON: any changed input changes it."""
    return hashlib.sha256(canonical_json(to_plain(scenario)).encode("utf-8")).hexdigest()


def scenario_from_plain(plain: object) -> Scenario:
    """Parse and fully validate a scenario; any bad input raises PolicyInputError naming the
    scenario field, so a scenario that parses is one `run_plan` can decide."""
    scenario = parse_scenario_structure(plain)
    run_plan(scenario)
    return scenario


def plan_to_plain(plan: FleetPlan) -> dict[str, Any]:
    """The plan as JSON-safe plain data (the report's machine-readable form)."""
    plain: dict[str, Any] = to_plain(plan)
    return plain


def _scoped(sections: tuple[tuple[object, str], ...], call: Callable[_P, _T],
            *args: _P.args, **kwargs: _P.kwargs) -> _T:
    try:
        return call(*args, **kwargs)
    except PolicyInputError as error:
        raise relocate_error(error, sections) from error


def _admission_policy(scenario: Scenario) -> AdmissionPolicy:
    if scenario.admission_budget_mode is AdmissionBudgetMode.REFERENCE:
        return scenario.admission_policy
    # The budget memory-fit verified: target_concurrency requests at their full live length.
    deployment = scenario.deployment_memory
    return replace(scenario.admission_policy,
                   max_live_tokens=deployment.max_live_tokens_per_request
                   * deployment.target_concurrency,
                   max_tokens_per_request=deployment.max_live_tokens_per_request)


def _admit_probes(scenario: Scenario, policy: AdmissionPolicy) -> tuple[AdmissionDecision, ...]:
    overrides = {o.request_id: o for o in scenario.test_stimulus_admission_overrides}
    state = PoolState()
    decisions: list[AdmissionDecision] = []
    for name in ("benign_probe", "oversize_probe"):
        probe: AdmissionProbe = getattr(scenario, name)
        override = overrides.get(probe.request.identifier)
        if override is not None:
            # A test stimulus stands in for the decision; it is not a decision, so no state moves.
            reason = Reason("test_stimulus_override", f"test stimulus override: {override.note}",
                            {"request_id": override.request_id, "note": override.note})
            decisions.append(AdmissionDecision(override.request_id, override.action,
                                               override.reserved_tokens, (reason,)))
            continue
        sections: tuple[tuple[object, str], ...] = (
            (AdmissionPolicy, "admission_policy"), (AdmissionRequest, f"{name}.request"),
            ("now", f"{name}.now_seconds"),
            ("estimated_queue_seconds", f"{name}.estimated_queue_seconds"))
        decision, state = _scoped(sections, admit, state, probe.request, probe.now_seconds,
                                  probe.estimated_queue_seconds, policy)
        decisions.append(decision)
    return tuple(decisions)


def _placement(scenario: Scenario, capacity: CapacityPlan, memory: MemoryAssessment,
               parallel: ParallelPlan, layout_matches: bool) -> FleetPlacement:
    mode = scenario.placement_mode
    requested = 1 if mode is PlacementMode.REFERENCE_SINGLE else capacity.required_replicas
    if not layout_matches:
        return placement_not_requested(mode=mode, requested_replicas=requested,
                                       layout_facts=dict(layout_mismatch_reason(
                                           scenario.deployment_memory, parallel).facts))
    sections: tuple[tuple[object, str], ...] = (("inventory", "inventory"),
                                                ("replica", "candidate_release.revision"))
    return _scoped(sections, place_fleet, model_revision=scenario.candidate_release.revision,
                   gpus_per_replica=parallel.gpus_per_replica,
                   memory_gib_per_gpu=memory.required_gib_per_gpu,
                   required_capabilities=scenario.required_capabilities,
                   inventory=scenario.inventory, requested_replicas=requested, mode=mode)


def _autoscale(scenario: Scenario, capacity: CapacityPlan) -> ScaleDecision:
    probe = scenario.autoscaling
    observation = ScaleObservation(probe.observation_timestamp_seconds, probe.queued_tokens,
                                   capacity.output_tokens_per_second, probe.cpu_utilization)
    required = capacity.required_replicas
    state = ScaleState(required, required, 0, probe.last_scale_at_seconds)
    sections: tuple[tuple[object, str], ...] = (
        (AutoscalingPolicy, "autoscaling.policy"),
        ("last_scale_at_seconds", "autoscaling.last_scale_at_seconds"),
        ("timestamp_seconds", "autoscaling.observation_timestamp_seconds"),
        ("arrival_tokens_per_second", "autoscaling.queued_tokens"),
        ("now", "evaluated_at_seconds"))
    return _scoped(sections, recommend_replicas, (observation,), state, probe.policy,
                   now=scenario.evaluated_at_seconds)


def run_plan(scenario: Scenario) -> FleetPlan:
    """Decide and grade the fleet plan; pure, deterministic, bound to its inputs by digest."""
    check_scenario(scenario)
    capacity = _scoped((("requirements", "capacity_requirements"),), plan_capacity,
                       scenario.workloads, scenario.benchmark, scenario.capacity_requirements)
    memory = _scoped(((ModelMemory, "model_memory"), (DeploymentMemory, "deployment_memory")),
                     assess_memory, scenario.model_memory, scenario.deployment_memory)
    model = scenario.model_memory
    # Derived, not restated: unsharded weights from the model, and a per-GPU term that carries
    # the KV the memory plan reserves (a layout sized without KV once placed too little, bug 7).
    layout_model = ParallelModel(
        weight_memory_gib=model.parameters * model.weight_bits / 8 / GIB,
        runtime_memory_gib_per_gpu=scenario.deployment_memory.runtime_overhead_gib
        + memory.kv_gib_per_gpu)
    parallel = _scoped(((ClusterTopology, "topology"),), plan_parallelism, layout_model,
                       scenario.topology, capacity.required_replicas)
    deployment = scenario.deployment_memory
    layout_matches = (parallel.feasible
                      and parallel.tensor_parallel == deployment.tensor_parallel_size
                      and parallel.pipeline_parallel == deployment.pipeline_parallel_size)
    placement = _placement(scenario, capacity, memory, parallel, layout_matches)
    admission_policy = _admission_policy(scenario)
    benign, oversize = _admit_probes(scenario, admission_policy)
    scaling = _autoscale(scenario, capacity)
    rollout = _scoped((("baseline", "baseline_release"), ("candidate", "candidate_release"),
                       (ReleaseRequirements, "release_requirements")),
                      evaluate_rollout, scenario.baseline_release, scenario.candidate_release,
                      scenario.release_requirements)
    decisions = PlanDecisions(memory, capacity, parallel, placement, benign, oversize, scaling,
                              rollout)
    observed = observe_evidence(scenario, decisions, layout_matches)
    missing = tuple(sorted(scenario.required_evidence - observed))
    freshness = assess_freshness(scenario)
    violations: list[Reason] = list(capacity.violations)
    if missing:
        violations.append(Reason("missing_required_evidence",
                                 f"missing required evidence: {', '.join(missing)}",
                                 {"missing_evidence": list(missing)}))
    violations += [Reason("evidence_stale",
                          f"{item.source} evidence is {item.age_seconds:g}s old, older than "
                          f"its {item.max_age_seconds:g}s limit", to_plain(item))
                   for item in freshness if not item.fresh]
    layout_reasons = parallel.reasons if layout_matches else (
        *parallel.reasons, layout_mismatch_reason(deployment, parallel))
    deciding = {
        MEMORY_FIT: memory.reasons,
        CAPACITY_PLAN: (capacity_deciding_reason(capacity), *capacity.violations),
        PARALLEL_LAYOUT: layout_reasons,
        GPU_PLACEMENT: placement.reasons,
        BENIGN_ADMISSION: benign.reasons,
        OVERSIZE_SHEDDING: oversize.reasons,
        QUEUE_SCALING: scaling.reasons,
        CANARY_GATE: rollout.reasons,
    }
    ready = (Reason("release_evidence_complete",
                    "every required piece of evidence was observed, fresh, within capacity",
                    {"required_evidence": len(scenario.required_evidence)}),)
    return FleetPlan(
        release_ready=not violations,
        required_evidence=tuple(sorted(scenario.required_evidence)),
        observed_evidence=tuple(sorted(observed)),
        violations=tuple(violations),
        decisions=decisions,
        deciding_reasons=deciding,
        missing_evidence=missing,
        evidence_freshness=freshness,
        admission_policy=admission_policy,
        layout_matches_memory_plan=layout_matches,
        scenario_name=scenario.name,
        evaluated_at_seconds=scenario.evaluated_at_seconds,
        inputs_digest=scenario_digest(scenario),
        reasons=tuple(violations) or ready,
    )
