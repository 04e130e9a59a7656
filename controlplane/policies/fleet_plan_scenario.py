"""The fleet-plan scenario: every input of the capstone pipeline, as one immutable value (§2.1).

A scenario holds stimuli (workloads, measurements, inventory, probe requests) and policy
(requirements, budgets, the required evidence) side by side, but the pipeline never derives a
requirement from a stimulus: `required_evidence` is declared here and graded by set difference.
Inputs the pipeline derives from upstream decisions (§7) are deliberately absent: the layout's
weight and per-GPU memory, the placement's memory and model revision, the autoscaling arrival
rate and desired count, and (in `derived` mode) the admission budget.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from controlplane.policies.admission import AdmissionAction, AdmissionPolicy, AdmissionRequest
from controlplane.policies.autoscaling import AutoscalingPolicy
from controlplane.policies.capacity import CapacityRequirements, ReplicaBenchmark, WorkloadClass
from controlplane.policies.memory import DeploymentMemory, ModelMemory
from controlplane.policies.parallelism import ClusterTopology
from controlplane.policies.placement import GPU
from controlplane.policies.reasons import PolicyInputError, to_plain
from controlplane.policies.rollouts import ReleaseMeasurement, ReleaseRequirements, TrafficMode

MEMORY_FIT = "memory-fit"
CAPACITY_PLAN = "capacity-plan"
PARALLEL_LAYOUT = "parallel-layout"
GPU_PLACEMENT = "gpu-placement"
BENIGN_ADMISSION = "benign-admission"
OVERSIZE_SHEDDING = "oversize-shedding"
QUEUE_SCALING = "queue-scaling"
CANARY_GATE = "canary-gate"
# The eight controls, in the order deciding reasons are reported. A scenario may require more
# evidence (one `workload:<name>` per workload class it must serve) but never fewer controls.
CONTROL_EVIDENCE = (MEMORY_FIT, CAPACITY_PLAN, PARALLEL_LAYOUT, GPU_PLACEMENT, BENIGN_ADMISSION,
                    OVERSIZE_SHEDDING, QUEUE_SCALING, CANARY_GATE)
EVIDENCE_SOURCES = ("benchmark", "inventory", "baseline_release", "candidate_release")
# The largest scenario a plan takes, measured as its canonical JSON (compact, after parsing):
# the bytes the PlanFleet command carries and every stage decision of the log records.
MAX_SCENARIO_BYTES = 1_000_000


def workload_evidence(name: str) -> str:
    """The evidence name a served workload class contributes."""
    return f"workload:{name}"


class PlacementMode(StrEnum):
    """`reference-single` places one replica as the reference does; `all-replicas` places every
    replica the capacity plan requires, each on GPUs no earlier replica reserved."""

    REFERENCE_SINGLE = "reference-single"
    ALL_REPLICAS = "all-replicas"


class AdmissionBudgetMode(StrEnum):
    """`reference` uses the admission policy's constants; `derived` takes the live-token budget
    (max_live_tokens_per_request x target_concurrency) and the per-request bound
    (max_live_tokens_per_request) from the memory plan that memory-fit verified."""

    REFERENCE = "reference"
    DERIVED = "derived"


@dataclass(frozen=True)
class AdmissionProbe:
    """A synthetic request sent through real admission, at its own logical time."""

    request: AdmissionRequest
    now_seconds: float
    estimated_queue_seconds: float


@dataclass(frozen=True)
class AdmissionOverride:
    """TEST STIMULUS: replace the decision reported for one probe, as if admission were bypassed.

    It exists so a counterfactual can prove that a weakened control fails the evidence gate; an
    override changes no pool state, and its reason says it was a test stimulus.
    """

    request_id: str
    action: AdmissionAction
    reserved_tokens: int
    note: str


@dataclass(frozen=True)
class AutoscalingProbe:
    """The one observation's non-derived parts (its arrival rate is the capacity plan's output
    tokens per second) and the controller's policy; desired = ready = required replicas, and the
    decision is made at the scenario's `evaluated_at_seconds`."""

    observation_timestamp_seconds: float
    queued_tokens: int
    cpu_utilization: float
    last_scale_at_seconds: float
    policy: AutoscalingPolicy


@dataclass(frozen=True)
class ObservedAt:
    """When a piece of evidence was measured, and how long it stays usable (inclusive)."""

    observed_at_seconds: float
    max_age_seconds: float


@dataclass(frozen=True)
class EvidenceTimes:
    benchmark: ObservedAt
    inventory: ObservedAt
    baseline_release: ObservedAt
    candidate_release: ObservedAt


@dataclass(frozen=True)
class Scenario:
    """Every input of one fleet plan; its canonical JSON is what `inputs_digest` binds."""

    name: str
    workloads: tuple[WorkloadClass, ...]
    benchmark: ReplicaBenchmark
    capacity_requirements: CapacityRequirements
    model_memory: ModelMemory
    deployment_memory: DeploymentMemory
    topology: ClusterTopology
    inventory: tuple[GPU, ...]
    required_capabilities: frozenset[str]
    baseline_release: ReleaseMeasurement
    candidate_release: ReleaseMeasurement
    release_requirements: ReleaseRequirements
    admission_policy: AdmissionPolicy
    benign_probe: AdmissionProbe
    oversize_probe: AdmissionProbe
    autoscaling: AutoscalingProbe
    required_evidence: frozenset[str]
    evaluated_at_seconds: float
    evidence_times: EvidenceTimes
    description: str = ""
    placement_mode: PlacementMode = PlacementMode.ALL_REPLICAS
    admission_budget_mode: AdmissionBudgetMode = AdmissionBudgetMode.DERIVED
    test_stimulus_admission_overrides: tuple[AdmissionOverride, ...] = ()


def canonical_json(value: Any) -> str:
    """Sorted-key, compact, UTF-8 JSON of plain data; refuses NaN and infinity."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def scenario_digest(scenario: Scenario) -> str:
    """sha256 of the scenario's canonical JSON: any changed input changes it."""
    return hashlib.sha256(canonical_json(to_plain(scenario)).encode("utf-8")).hexdigest()


def check_scenario_size(scenario: Scenario) -> None:
    """PolicyInputError (`scenario_too_large`, naming the largest top-level field) unless the
    scenario's canonical JSON is at most MAX_SCENARIO_BYTES."""
    plain: dict[str, Any] = to_plain(scenario)
    size = len(canonical_json(plain).encode("utf-8"))
    if size <= MAX_SCENARIO_BYTES:
        return
    sizes = {name: len(canonical_json(value).encode("utf-8")) for name, value in plain.items()}
    largest = max(sizes, key=sizes.__getitem__)  # the first in field order on a tie
    raise PolicyInputError("scenario_too_large", largest,
                           f"the scenario is {size} bytes as compact JSON, over the limit of "
                           f"{MAX_SCENARIO_BYTES} bytes; {largest} alone is {sizes[largest]} bytes")


DEFAULT_REQUIRED_EVIDENCE = frozenset(
    {workload_evidence("interactive"), workload_evidence("generation"), *CONTROL_EVIDENCE})
_FAST_BF16 = frozenset({"bf16", "fast-collective"})


def _default_inventory() -> tuple[GPU, ...]:
    return tuple(GPU(f"{node}{index}", f"node-{node}", 40.0, _FAST_BF16,
                     frozenset({"model@abc"}) if node == "a" and index < 2 else frozenset())
                 for node in "ab" for index in range(4))


def default_scenario() -> Scenario:
    """The reference fixtures of spec §2.1, run the reference's way (one placement, constant
    admission budget), so `run_plan` reproduces §2.4 exactly."""
    return Scenario(
        name="default",
        description="Spec §2.1 fixtures; reference-single placement and the reference admission "
                    "budget reproduce the §2.4 result exactly.",
        workloads=(WorkloadClass("interactive", 1.5, 400.0, 100.0, 2.0, 1.5),
                   WorkloadClass("generation", 0.5, 200.0, 600.0, 5.0, 2.0)),
        benchmark=ReplicaBenchmark("staging:model@abc:gpu-x", 1000.0, 350.0, 8.0, 4.25),
        capacity_requirements=CapacityRequirements(2, 8, 0.25, 40.0),
        model_memory=ModelMemory(30_000_000_000, 16, 60, 8, 128),
        deployment_memory=DeploymentMemory(40.0, 2, 2, 4096, 6, 4.0, 0.9),
        topology=ClusterTopology(2, 4, 40.0, 0.9, True),
        inventory=_default_inventory(),
        required_capabilities=_FAST_BF16,
        baseline_release=ReleaseMeasurement("stable", TrafficMode.CANARY, True, 10_000, 0.90,
                                            0.8, 0.10, 330.0, 0.001),
        candidate_release=ReleaseMeasurement("model@abc", TrafficMode.CANARY, True, 1_000, 0.89,
                                             0.8, 0.10, 350.0, 0.002),
        release_requirements=ReleaseRequirements(500, 0.86, 0.03, 1.0, 0.15, 0.95, 0.01),
        admission_policy=AdmissionPolicy(8192, 4, 4096),
        benign_probe=AdmissionProbe(AdmissionRequest("interactive-request", 400, 100, 5.0),
                                    0.0, 0.5),
        oversize_probe=AdmissionProbe(AdmissionRequest("unbounded-request", 4500, 4500, 30.0),
                                      0.0, 0.0),
        autoscaling=AutoscalingProbe(100.0, 0, 0.15, 0.0,
                                     AutoscalingPolicy(2, 8, 350.0, 0.75, 10.0, 5.0, 60.0)),
        required_evidence=DEFAULT_REQUIRED_EVIDENCE,
        evaluated_at_seconds=100.0,
        evidence_times=EvidenceTimes(benchmark=ObservedAt(0.0, 604_800.0),
                                     inventory=ObservedAt(100.0, 300.0),
                                     baseline_release=ObservedAt(0.0, 86_400.0),
                                     candidate_release=ObservedAt(90.0, 3_600.0)),
        placement_mode=PlacementMode.REFERENCE_SINGLE,
        admission_budget_mode=AdmissionBudgetMode.REFERENCE,
    )
