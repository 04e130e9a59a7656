"""The fleet plan (spec §2): every decision family composed in a fixed order, graded on evidence.

Order: capacity, memory, parallel layout (KV-aware, derived from the model), placement (only for a
layout the memory plan covers), admission of a benign and an oversize probe, autoscaling,
rollout, then the grade (evidence, freshness, verdict); see `fleet_plan_stages`. Grading is a set
difference against the scenario's declared required evidence, so an extra workload adds evidence
without failing and removing a stimulus cannot remove its obligation. The plan is bound to its
inputs by `inputs_digest`; it contains no NaN or infinity.

There is one implementation: `run_plan` runs the plain stages and assembles them with
`assemble_plan`, the same function that assembles a plan from recorded stage decisions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.policies.admission import AdmissionPolicy
from controlplane.policies.fleet_plan_evidence import (
    EvidenceFreshness,
    PlanDecisions,
    Results,
    deciding_reasons,
)
from controlplane.policies.fleet_plan_parse import from_plain, parse_scenario_structure
from controlplane.policies.fleet_plan_scenario import (
    Scenario,
    canonical_json,
    check_scenario_size,
    scenario_digest,
)
from controlplane.policies.fleet_plan_stages import STAGES, run_stages
from controlplane.policies.reasons import Reason, require, to_plain

__all__ = ["FleetPlan", "assemble_plan", "canonical_json", "plan_from_results", "plan_to_plain",
           "run_plan", "scenario_digest", "scenario_from_plain"]


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


def scenario_from_plain(plain: object) -> Scenario:
    """Parse and fully validate a scenario; any bad input raises PolicyInputError naming the
    scenario field, so a scenario that parses is one `run_plan` can decide and one a PlanFleet
    command can carry (at most MAX_SCENARIO_BYTES of canonical JSON)."""
    scenario = parse_scenario_structure(plain)
    check_scenario_size(scenario)
    run_stages(scenario)
    return scenario


def plan_to_plain(plan: FleetPlan) -> dict[str, Any]:
    """The plan as JSON-safe plain data (the report's machine-readable form)."""
    plain: dict[str, Any] = to_plain(plan)
    return plain


def assemble_plan(results: Results) -> dict[str, Any]:
    """The plain plan (`fleet-plan.json`, key order as emitted) from every stage's plain result.

    Pure assembly: it decides nothing, so a plan assembled from recorded stage decisions is
    the plan those decisions made.
    """
    missing = [stage for stage in STAGES if stage not in results]
    require(not missing, "plan_stage_missing", f"stages.{missing[0] if missing else ''}",
            f"the plan lacks the results of {', '.join(missing)}")
    grade, admission, layout = results["grade"], results["admission"], results["layout"]
    return {
        "release_ready": grade["release_ready"],
        "required_evidence": grade["required_evidence"],
        "observed_evidence": grade["observed_evidence"],
        "violations": grade["violations"],
        "decisions": {
            "memory": results["memory"],
            "capacity": results["capacity"],
            "parallelism": layout["plan"],
            "placement": results["placement"],
            "benign_admission": admission["benign"],
            "oversize_admission": admission["oversize"],
            "autoscaling": results["scaling"],
            "rollout": results["rollout"],
        },
        "deciding_reasons": deciding_reasons(results),
        "missing_evidence": grade["missing_evidence"],
        "evidence_freshness": grade["evidence_freshness"],
        "admission_policy": admission["policy"],
        "layout_matches_memory_plan": layout["matches_memory_plan"],
        "scenario_name": grade["scenario_name"],
        "evaluated_at_seconds": grade["evaluated_at_seconds"],
        "inputs_digest": grade["inputs_digest"],
        "reasons": grade["reasons"],
    }


def plan_from_results(results: Results) -> FleetPlan:
    """The typed plan from every stage's plain result, fresh or read back from a log: equal
    results give plans whose `plan_to_plain` is byte-identical JSON (reason facts key-sorted)."""
    return from_plain(FleetPlan, assemble_plan(results))


def run_plan(scenario: Scenario) -> FleetPlan:
    """Decide and grade the fleet plan; pure, deterministic, bound to its inputs by digest."""
    return plan_from_results(run_stages(scenario))
