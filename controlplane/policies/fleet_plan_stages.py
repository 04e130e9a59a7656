"""The fleet plan as stages, each plain data in and plain data out (spec §2.2, in that order).

A stage reads the scenario and the plain results of the stages it depends on (`STAGE_UPSTREAM`,
always earlier in `STAGES`) and returns its own JSON-safe result, so a stage decided from
recorded events equals the stage decided in one call. Downstream inputs come from upstream
results, never restated (§7): the layout from the memory plan's KV and the capacity plan's
replica count, placement from the layout and memory plan, the admission budget from the memory
plan, autoscaling from capacity. `STAGE_POLICY_FIELDS` and `STAGE_INPUT_FIELDS` name the
scenario fields each stage reads, so its decision can record exactly those.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
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
    ScaleObservation,
    ScaleState,
    recommend_replicas,
)
from controlplane.policies.capacity import plan_capacity
from controlplane.policies.fleet_plan_evidence import Results, grade_plan, layout_mismatch_reason
from controlplane.policies.fleet_plan_parse import check_scenario, relocate_error
from controlplane.policies.fleet_plan_placement import (
    inventory_shape_reason,
    place_fleet,
    placement_not_requested,
)
from controlplane.policies.fleet_plan_scenario import (
    AdmissionBudgetMode,
    AdmissionProbe,
    PlacementMode,
    Scenario,
)
from controlplane.policies.memory import GIB, DeploymentMemory, ModelMemory, assess_memory
from controlplane.policies.parallelism import ClusterTopology, ParallelModel, plan_parallelism
from controlplane.policies.reasons import PolicyInputError, Reason, require, to_plain
from controlplane.policies.rollouts import ReleaseRequirements, evaluate_rollout

_P = ParamSpec("_P")
_T = TypeVar("_T")
Plain = dict[str, Any]

STAGES = ("capacity", "memory", "layout", "placement", "admission", "scaling", "rollout", "grade")
STAGE_UPSTREAM: dict[str, tuple[str, ...]] = {
    "capacity": (), "memory": (), "layout": ("capacity", "memory"),
    "placement": ("capacity", "memory", "layout"), "admission": ("memory",),
    "scaling": ("capacity",), "rollout": (), "grade": STAGES[:-1],
}
STAGE_POLICY_FIELDS: dict[str, tuple[str, ...]] = {
    "capacity": ("capacity_requirements",), "memory": (), "layout": (),
    "placement": ("placement_mode", "required_capabilities"),
    "admission": ("admission_policy", "admission_budget_mode"),
    "scaling": ("autoscaling",), "rollout": ("release_requirements",),
    "grade": ("required_evidence",),
}
STAGE_INPUT_FIELDS: dict[str, tuple[str, ...]] = {
    "capacity": ("workloads", "benchmark"), "memory": ("model_memory", "deployment_memory"),
    "layout": ("model_memory", "deployment_memory", "topology"),
    "placement": ("inventory", "candidate_release", "deployment_memory", "topology"),
    "admission": ("deployment_memory", "benign_probe", "oversize_probe",
                  "test_stimulus_admission_overrides"),
    "scaling": ("evaluated_at_seconds",),
    "rollout": ("baseline_release", "candidate_release"),
    # The grade binds the plan to every input through the digest; these are what it reads.
    "grade": ("name", "workloads", "evidence_times", "evaluated_at_seconds"),
}


def _scoped(sections: tuple[tuple[object, str], ...], call: Callable[_P, _T],
            *args: _P.args, **kwargs: _P.kwargs) -> _T:
    try:
        return call(*args, **kwargs)
    except PolicyInputError as error:
        raise relocate_error(error, sections) from error


def capacity_stage(scenario: Scenario, upstream: Results) -> Plain:
    """The capacity plan of the scenario's workloads on its benchmarked replica."""
    plan = _scoped((("requirements", "capacity_requirements"),), plan_capacity,
                   scenario.workloads, scenario.benchmark, scenario.capacity_requirements)
    result: Plain = to_plain(plan)
    return result


def memory_stage(scenario: Scenario, upstream: Results) -> Plain:
    """The memory fit of the model under the deployment's memory plan."""
    assessment = _scoped(((ModelMemory, "model_memory"), (DeploymentMemory, "deployment_memory")),
                         assess_memory, scenario.model_memory, scenario.deployment_memory)
    result: Plain = to_plain(assessment)
    return result


def layout_stage(scenario: Scenario, upstream: Results) -> Plain:
    """The KV-aware layout for the capacity plan's replicas, and whether it is the split the
    memory plan sized (tensor and pipeline degrees both; a GPU count alone is not enough)."""
    model, deployment = scenario.model_memory, scenario.deployment_memory
    # Derived, not restated: unsharded weights from the model, and a per-GPU term that carries
    # the KV the memory plan reserves (a layout sized without KV once placed too little, bug 7).
    layout_model = ParallelModel(
        weight_memory_gib=model.parameters * model.weight_bits / 8 / GIB,
        runtime_memory_gib_per_gpu=deployment.runtime_overhead_gib
        + upstream["memory"]["kv_gib_per_gpu"])
    parallel = _scoped(((ClusterTopology, "topology"),), plan_parallelism, layout_model,
                       scenario.topology, upstream["capacity"]["required_replicas"])
    plan: Plain = to_plain(parallel)
    matches = (parallel.feasible
               and parallel.tensor_parallel == deployment.tensor_parallel_size
               and parallel.pipeline_parallel == deployment.pipeline_parallel_size)
    reasons = parallel.reasons if matches else (*parallel.reasons,
                                                layout_mismatch_reason(deployment, plan))
    return {"plan": plan, "gpus_per_replica": parallel.gpus_per_replica,
            "matches_memory_plan": matches, "reasons": to_plain(reasons)}


def placement_stage(scenario: Scenario, upstream: Results) -> Plain:
    """GPU groups for the layout at the memory plan's per-GPU requirement; nothing is requested
    for a layout the memory plan does not cover (bug 7: never a convenient fallback shape). A
    refusal on an inventory shaped unlike the declared topology the layout was sized for says
    so (`inventory_differs_from_topology`)."""
    mode = scenario.placement_mode
    layout = upstream["layout"]
    requested = (1 if mode is PlacementMode.REFERENCE_SINGLE
                 else upstream["capacity"]["required_replicas"])
    if not layout["matches_memory_plan"]:
        mismatch = layout_mismatch_reason(scenario.deployment_memory, layout["plan"])
        refused: Plain = to_plain(placement_not_requested(
            mode=mode, requested_replicas=requested, layout_facts=dict(mismatch.facts)))
        return refused
    sections: tuple[tuple[object, str], ...] = (("inventory", "inventory"),
                                                ("replica", "candidate_release.revision"))
    placement = _scoped(sections, place_fleet, model_revision=scenario.candidate_release.revision,
                        gpus_per_replica=layout["gpus_per_replica"],
                        memory_gib_per_gpu=upstream["memory"]["required_gib_per_gpu"],
                        required_capabilities=scenario.required_capabilities,
                        inventory=scenario.inventory, requested_replicas=requested, mode=mode)
    shape = None if placement.placed else inventory_shape_reason(scenario.topology,
                                                                 scenario.inventory)
    if shape is not None:
        placement = replace(placement, reasons=(*placement.reasons, shape))
    result: Plain = to_plain(placement)
    return result


def _admission_budget(scenario: Scenario, memory: Mapping[str, Any]
                      ) -> tuple[AdmissionPolicy, Reason]:
    deployment = scenario.deployment_memory
    facts = {"mode": scenario.admission_budget_mode.value,
             "max_live_tokens_per_request": deployment.max_live_tokens_per_request,
             "target_concurrency": deployment.target_concurrency,
             "memory_plan_fits": memory["fits"]}
    if scenario.admission_budget_mode is AdmissionBudgetMode.REFERENCE:
        policy = scenario.admission_policy
        return policy, Reason("admission_budget_declared", "the admission policy's own budget",
                              {**facts, "max_live_tokens": policy.max_live_tokens})
    # The budget memory-fit verified: target_concurrency requests at their full live length.
    policy = replace(scenario.admission_policy,
                     max_live_tokens=deployment.max_live_tokens_per_request
                     * deployment.target_concurrency,
                     max_tokens_per_request=deployment.max_live_tokens_per_request)
    return policy, Reason("admission_budget_from_memory_plan",
                          "live-token budget is the concurrency the memory plan sized",
                          {**facts, "max_live_tokens": policy.max_live_tokens})


def admission_stage(scenario: Scenario, upstream: Results) -> Plain:
    """The benign then the oversize probe through one real admission pool, in that order."""
    policy, budget = _admission_budget(scenario, upstream["memory"])
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
    benign, oversize = decisions
    return {"policy": to_plain(policy), "budget": to_plain(budget), "benign": to_plain(benign),
            "oversize": to_plain(oversize)}


# Per capacity dimension: the workload field its demand sums and the benchmark field it divides.
_DIMENSION_FIELDS = {"prefill_tokens": ("prompt_tokens", "prefill_tokens_per_second"),
                     "decode_tokens": ("output_tokens", "output_tokens_per_second"),
                     "request_concurrency": ("mean_service_seconds", "max_concurrent_requests")}


def _ready_capacity_field(scenario: Scenario, capacity: Mapping[str, Any]) -> str:
    """Of the scenario fields the ready capacity multiplies out (the capacity plan's replicas x
    service rate x utilisation), the one furthest from 1 in orders of magnitude: the one to fix."""
    policy, requirements = scenario.autoscaling.policy, scenario.capacity_requirements
    values: dict[str, float] = {
        "autoscaling.policy.service_tokens_per_second_per_replica":
            policy.service_tokens_per_second_per_replica,
        "autoscaling.policy.target_utilization": policy.target_utilization,
        "capacity_requirements.min_replicas": requirements.min_replicas}
    if capacity["bottleneck"] in _DIMENSION_FIELDS:
        per_request, per_replica = _DIMENSION_FIELDS[capacity["bottleneck"]]
        for index, workload in enumerate(scenario.workloads):
            for name in ("requests_per_second", per_request, "burst_multiplier"):
                values[f"workloads[{index}].{name}"] = getattr(workload, name)
        values[f"benchmark.{per_replica}"] = getattr(scenario.benchmark, per_replica)
        values["capacity_requirements.reserved_headroom_fraction"] = (
            1 - requirements.reserved_headroom_fraction)
    return max(values, key=lambda name: abs(math.log10(values[name])) if values[name] > 0 else 0)


def scaling_stage(scenario: Scenario, upstream: Results) -> Plain:
    """Autoscaling on the capacity plan's token demand, desired = ready = required replicas."""
    capacity = upstream["capacity"]
    probe = scenario.autoscaling
    observation = ScaleObservation(probe.observation_timestamp_seconds, probe.queued_tokens,
                                   capacity["output_tokens_per_second"], probe.cpu_utilization)
    required = capacity["required_replicas"]
    state = ScaleState(required, required, 0, probe.last_scale_at_seconds)
    sections: tuple[tuple[object, str], ...] = (
        (AutoscalingPolicy, "autoscaling.policy"),
        ("last_scale_at_seconds", "autoscaling.last_scale_at_seconds"),
        ("timestamp_seconds", "autoscaling.observation_timestamp_seconds"),
        ("arrival_tokens_per_second", "autoscaling.queued_tokens"),
        ("queued_tokens", "autoscaling.queued_tokens"),
        ("now", "evaluated_at_seconds"))
    try:
        decision = _scoped(sections, recommend_replicas, (observation,), state, probe.policy,
                           now=scenario.evaluated_at_seconds)
    except PolicyInputError as error:
        if error.code != "ready_capacity_not_finite":
            raise
        # The ready count is derived, not an input: name the scenario field that inflated it.
        raise PolicyInputError(
            error.code, _ready_capacity_field(scenario, capacity),
            f"the ready capacity (the capacity plan's {float(required):.3g} replicas x the "
            "autoscaling service rate x target_utilization) is out of numeric range"
        ) from None
    result: Plain = to_plain(decision)
    return result


def rollout_stage(scenario: Scenario, upstream: Results) -> Plain:
    """The canary gate: the candidate against the baseline under the release requirements."""
    decision = _scoped((("baseline", "baseline_release"), ("candidate", "candidate_release"),
                        (ReleaseRequirements, "release_requirements")),
                       evaluate_rollout, scenario.baseline_release, scenario.candidate_release,
                       scenario.release_requirements)
    result: Plain = to_plain(decision)
    return result


STAGE_FUNCTIONS: dict[str, Callable[[Scenario, Results], Plain]] = {
    "capacity": capacity_stage, "memory": memory_stage, "layout": layout_stage,
    "placement": placement_stage, "admission": admission_stage, "scaling": scaling_stage,
    "rollout": rollout_stage, "grade": grade_plan,
}


def run_stage(stage: str, scenario: Scenario, upstream: Results) -> Plain:
    """Decide one stage from the scenario and its declared upstream results (others unseen)."""
    require(stage in STAGE_FUNCTIONS, "unknown_stage", "stage", f"no plan stage named {stage!r}")
    missing = [name for name in STAGE_UPSTREAM[stage] if name not in upstream]
    require(not missing, "upstream_stage_missing", f"upstream.{missing[0] if missing else ''}",
            f"stage {stage} needs the results of {', '.join(missing)}")
    declared = {name: upstream[name] for name in STAGE_UPSTREAM[stage]}
    return STAGE_FUNCTIONS[stage](scenario, declared)


def run_stages(scenario: Scenario) -> dict[str, Plain]:
    """Every stage in order, each fed its upstream results; pure and deterministic."""
    check_scenario(scenario)
    results: dict[str, Plain] = {}
    for stage in STAGES:
        results[stage] = run_stage(stage, scenario, results)
    return results


def stage_verdict(stage: str, result: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """A stage result's outcome word and the reasons its decision records, in a fixed order."""
    if stage == "capacity":
        outcome = "within_requirements" if result["release_ready"] else "violates_requirements"
        # The capacity plan's reasons are its sizing then its violations: each recorded once.
        return outcome, list(result["reasons"])
    if stage == "memory":
        return ("fits" if result["fits"] else "does_not_fit"), list(result["reasons"])
    if stage == "layout":
        outcome = ("matches_memory_plan" if result["matches_memory_plan"]
                   else "differs_from_memory_plan" if result["plan"]["feasible"] else "infeasible")
        return outcome, list(result["reasons"])
    if stage == "placement":
        outcome = ("placed" if result["placed"] else "not_placed" if result["replicas"]
                   else "not_requested")
        return outcome, list(result["reasons"])
    if stage == "admission":
        benign, oversize = result["benign"], result["oversize"]
        outcome = f"benign_{benign['action']}_oversize_{oversize['action']}"
        return outcome, [result["budget"], *benign["reasons"], *oversize["reasons"]]
    if stage in ("scaling", "rollout"):
        return str(result["action"]), list(result["reasons"])
    require(stage == "grade", "unknown_stage", "stage", f"no plan stage named {stage!r}")
    return ("release_ready" if result["release_ready"] else "not_release_ready",
            list(result["reasons"]))
