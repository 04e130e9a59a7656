"""The fleet plan split into plain stages: stages fed results read back from a log decide the
same plan, each stage sees only its declared upstream and scenario fields, and `run_plan` is
their composition."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from controlplane.policies.fleet_plan import (
    FleetPlan,
    assemble_plan,
    canonical_json,
    plan_from_results,
    plan_to_plain,
    run_plan,
    scenario_from_plain,
)
from controlplane.policies.fleet_plan_parse import from_plain
from controlplane.policies.fleet_plan_scenario import (
    AdmissionBudgetMode,
    Scenario,
    default_scenario,
)
from controlplane.policies.fleet_plan_stages import (
    STAGE_INPUT_FIELDS,
    STAGE_POLICY_FIELDS,
    STAGE_UPSTREAM,
    STAGES,
    run_stage,
    run_stages,
    stage_verdict,
)
from controlplane.policies.reasons import PolicyInputError

SCENARIOS = Path(__file__).resolve().parents[3] / "fixtures" / "scenarios"
NAMES = sorted(path.stem for path in SCENARIOS.glob("*.json"))


def load(name: str) -> Scenario:
    return scenario_from_plain(json.loads((SCENARIOS / f"{name}.json").read_text("utf-8")))


def as_recorded(value: dict[str, Any]) -> dict[str, Any]:
    """What a log gives back: canonical JSON, keys sorted."""
    recorded: dict[str, Any] = json.loads(canonical_json(value))
    return recorded


@pytest.mark.parametrize("name", NAMES)
def test_stages_fed_recorded_results_decide_the_byte_identical_plan(name: str) -> None:
    scenario = load(name)
    recorded: dict[str, dict[str, Any]] = {}
    for stage in STAGES:
        upstream = {u: recorded[u] for u in STAGE_UPSTREAM[stage]}
        recorded[stage] = as_recorded(run_stage(stage, scenario, upstream))
    from_log = json.dumps(plan_to_plain(plan_from_results(recorded)), indent=2)
    assert from_log == json.dumps(plan_to_plain(run_plan(scenario)), indent=2)


def test_every_stage_depends_only_on_stages_before_it() -> None:
    assert set(STAGE_UPSTREAM) == set(STAGES) == set(STAGE_POLICY_FIELDS) == set(STAGE_INPUT_FIELDS)
    for index, stage in enumerate(STAGES):
        assert set(STAGE_UPSTREAM[stage]) <= set(STAGES[:index]), stage
    assert STAGE_UPSTREAM["grade"] == STAGES[:-1]


def test_a_stage_without_its_upstream_results_is_refused() -> None:
    results = run_stages(default_scenario())
    with pytest.raises(PolicyInputError) as caught:
        run_stage("placement", default_scenario(), {"capacity": results["capacity"],
                                                    "memory": results["memory"]})
    assert (caught.value.code, caught.value.field) == ("upstream_stage_missing", "upstream.layout")
    with pytest.raises(PolicyInputError) as caught:
        run_stage("deploy", default_scenario(), results)
    assert caught.value.code == "unknown_stage"


def test_a_plan_cannot_be_assembled_without_every_stage() -> None:
    results = run_stages(default_scenario())
    del results["grade"]
    with pytest.raises(PolicyInputError) as caught:
        assemble_plan(results)
    assert (caught.value.code, caught.value.field) == ("plan_stage_missing", "stages.grade")


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_reads_only_the_scenario_fields_it_declares(stage: str) -> None:
    # Every other field comes from scenarios that differ in workloads, inventory, topology,
    # releases and overrides; the stage must not notice.
    declared = set(STAGE_POLICY_FIELDS[stage]) | set(STAGE_INPUT_FIELDS[stage])
    for base_name, other_name in [("default", "drop-generation"), ("default", "cramped-topology"),
                                  ("inventory-30gib", "canary-tpot-regression"),
                                  ("bypass-oversize-shedding", "all-replicas")]:
        base, other = load(base_name), load(other_name)
        hybrid = replace(other, **{name: getattr(base, name) for name in declared})
        upstream = run_stages(base)
        expected = run_stage(stage, base, upstream)
        got = run_stage(stage, hybrid, upstream)
        if stage == "grade":  # the digest binds every input, read or not
            expected, got = ({k: v for k, v in r.items() if k != "inputs_digest"}
                             for r in (expected, got))
        assert got == expected, (stage, base_name, other_name)


def test_declared_scenario_fields_are_real_fields() -> None:
    names = {item.name for item in fields(Scenario)}
    for stage in STAGES:
        assert set(STAGE_POLICY_FIELDS[stage]) | set(STAGE_INPUT_FIELDS[stage]) <= names


@pytest.mark.parametrize(("name", "outcomes"), [
    ("default", {"capacity": "within_requirements", "memory": "fits",
                 "layout": "matches_memory_plan", "placement": "placed",
                 "admission": "benign_admit_oversize_shed", "scaling": "hold",
                 "rollout": "promote", "grade": "release_ready"}),
    ("cramped-topology", {"layout": "differs_from_memory_plan", "placement": "not_requested",
                          "grade": "not_release_ready"}),
    ("inventory-30gib", {"placement": "not_placed"}),
    ("canary-tpot-regression", {"rollout": "rollback"}),
    ("bypass-oversize-shedding", {"admission": "benign_admit_oversize_admit"}),
])
def test_stage_verdicts_name_each_stage_outcome(name: str, outcomes: dict[str, str]) -> None:
    results = run_stages(load(name))
    assert {stage: stage_verdict(stage, results[stage])[0] for stage in outcomes} == outcomes


def test_stage_verdict_reasons_carry_every_decisions_reasons_in_order() -> None:
    results = run_stages(load("cramped-topology"))
    codes = {stage: [r["code"] for r in stage_verdict(stage, results[stage])[1]] for stage in STAGES}
    assert codes["layout"][-1] == "layout_differs_from_memory_plan"
    assert codes["admission"] == ["admission_budget_declared", "live_tokens_reserved",
                                  "token_bound_exceeded"]
    assert codes["grade"] == ["missing_required_evidence"]


def test_the_derived_admission_budget_is_recorded_with_its_memory_basis() -> None:
    scenario = replace(default_scenario(), admission_budget_mode=AdmissionBudgetMode.DERIVED)
    budget = run_stages(scenario)["admission"]["budget"]
    assert budget["code"] == "admission_budget_from_memory_plan"
    assert (budget["facts"]["max_live_tokens"], budget["facts"]["max_live_tokens_per_request"],
            budget["facts"]["target_concurrency"], budget["facts"]["memory_plan_fits"]) == (
        24_576, 4096, 6, True)


@pytest.mark.parametrize("name", ["default", "cramped-topology", "all-replicas"])
def test_a_plan_round_trips_through_its_plain_form(name: str) -> None:
    plan = run_plan(load(name))
    assert from_plain(FleetPlan, plan_to_plain(plan)) == plan


def test_rebuilding_refuses_malformed_results_naming_the_field() -> None:
    plain = plan_to_plain(run_plan(default_scenario()))
    plain["decisions"]["memory"]["max_concurrency"] = "eight"
    with pytest.raises(PolicyInputError) as caught:
        from_plain(FleetPlan, plain)
    assert (caught.value.code, caught.value.field) == ("wrong_type",
                                                       "decisions.memory.max_concurrency")
