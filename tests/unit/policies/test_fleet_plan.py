"""Fleet plan capstone (spec §2.1-§2.5, tests/test_plan_fleet.py, §5 capstone extension, §7,
§8, §9 bug 7), loaded from the scenario fixture files so the files are proven to reproduce it."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.admission import AdmissionAction
from controlplane.policies.capacity import CapacityDimension, WorkloadClass
from controlplane.policies.fleet_plan import (
    FleetPlan,
    canonical_json,
    plan_to_plain,
    run_plan,
    scenario_digest,
    scenario_from_plain,
)
from controlplane.policies.fleet_plan_placement import reserve_gpus
from controlplane.policies.fleet_plan_scenario import (
    CONTROL_EVIDENCE,
    AdmissionBudgetMode,
    AdmissionOverride,
    ObservedAt,
    PlacementMode,
    Scenario,
    default_scenario,
)
from controlplane.policies.memory import GIB
from controlplane.policies.placement import GPU
from controlplane.policies.reasons import PolicyInputError, Reason, to_plain
from controlplane.policies.rollouts import RolloutAction

SCENARIOS = Path(__file__).resolve().parents[3] / "fixtures" / "scenarios"
REQUIRED = ["benign-admission", "canary-gate", "capacity-plan", "gpu-placement", "memory-fit",
            "oversize-shedding", "parallel-layout", "queue-scaling", "workload:generation",
            "workload:interactive"]
REQUIRED_GIB = 34.752177238464355
FAST = frozenset({"bf16", "fast-collective"})


def load_plain(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SCENARIOS / f"{name}.json").read_text(encoding="utf-8"))
    return data


def load(name: str) -> Scenario:
    return scenario_from_plain(load_plain(name))


def production(scenario: Scenario) -> Scenario:
    return replace(scenario, placement_mode=PlacementMode.ALL_REPLICAS,
                   admission_budget_mode=AdmissionBudgetMode.DERIVED)


def codes(reasons: tuple[Reason, ...]) -> list[str]:
    return [reason.code for reason in reasons]


def violation_codes(plan: FleetPlan) -> list[str]:
    return codes(plan.violations)


@pytest.fixture(scope="module")
def default_plan() -> FleetPlan:
    return run_plan(load("default"))


# --- §2.4: the default result -------------------------------------------------------------


def test_default_plan_is_release_ready_with_every_required_evidence(default_plan: FleetPlan
                                                                    ) -> None:
    assert default_plan.release_ready is True
    assert default_plan.violations == ()
    assert list(default_plan.required_evidence) == REQUIRED
    assert list(default_plan.observed_evidence) == REQUIRED
    assert codes(default_plan.reasons) == ["release_evidence_complete"]


def test_default_memory_fit_reproduces_the_reference_figures(default_plan: FleetPlan) -> None:
    memory = default_plan.decisions.memory
    assert memory.fits is True
    assert memory.weight_gib_per_gpu == pytest.approx(27.939677238464355)
    assert memory.kv_gib_per_gpu == pytest.approx(2.8125)
    assert memory.overhead_gib_per_gpu == pytest.approx(4.0)
    assert memory.required_gib_per_gpu == pytest.approx(REQUIRED_GIB)
    assert memory.usable_gib_per_gpu == pytest.approx(36.0)
    assert memory.max_concurrency == 8
    assert memory.kv_bytes_per_token == 245_760
    assert codes(memory.reasons) == ["fits_with_headroom"]
    assert memory.reasons[0].facts["headroom_gib_per_gpu"] == pytest.approx(1.2478, abs=1e-4)


def test_default_capacity_reproduces_the_reference_figures(default_plan: FleetPlan) -> None:
    capacity = default_plan.decisions.capacity
    assert capacity.release_ready is True
    assert capacity.required_replicas == 4
    assert capacity.bottleneck is CapacityDimension.DECODE_TOKENS
    assert capacity.binding_dimensions == (CapacityDimension.DECODE_TOKENS,)
    assert capacity.prompt_tokens_per_second == pytest.approx(1100.0)
    assert capacity.output_tokens_per_second == pytest.approx(825.0)
    assert capacity.concurrent_requests == pytest.approx(9.5)
    assert capacity.reserved_headroom_fraction == pytest.approx(0.25)
    assert capacity.hourly_cost == pytest.approx(17.0)
    assert capacity.cost_per_million_output_tokens == pytest.approx(5.723905723905724)
    assert capacity.violations == ()
    unrounded = {d.dimension: d.unrounded_replicas for d in capacity.demands}
    assert unrounded[CapacityDimension.PREFILL_TOKENS] == pytest.approx(1100 / 750)
    assert unrounded[CapacityDimension.DECODE_TOKENS] == pytest.approx(825 / 262.5)
    assert unrounded[CapacityDimension.REQUEST_CONCURRENCY] == pytest.approx(9.5 / 6)


def test_default_layout_and_placement_reproduce_the_reference_figures(default_plan: FleetPlan
                                                                      ) -> None:
    parallel = default_plan.decisions.parallelism
    assert (parallel.feasible, parallel.tensor_parallel, parallel.pipeline_parallel,
            parallel.data_parallel, parallel.expert_parallel) == (True, 2, 1, 4, 1)
    assert parallel.memory_gib_per_gpu == pytest.approx(REQUIRED_GIB)
    assert codes(parallel.reasons) == ["intra_node_tensor_split"]
    assert parallel.reasons[0].facts["weight_memory_gib"] == pytest.approx(55.879354476928711)
    assert parallel.reasons[0].facts["runtime_memory_gib_per_gpu"] == pytest.approx(6.8125)
    placement = default_plan.decisions.placement
    assert placement.placed is True
    assert (placement.requested_replicas, placement.placed_replicas) == (1, 1)
    (only,) = placement.replicas
    assert only.decision.gpu_ids == ("a0", "a1")
    assert only.decision.remaining_gib == pytest.approx(10.4956, abs=1e-4)
    assert only.decision.reasons[0].facts["resident_copies"] == 2


def test_default_admission_autoscaling_and_rollout_reproduce_the_reference(
        default_plan: FleetPlan) -> None:
    benign = default_plan.decisions.benign_admission
    oversize = default_plan.decisions.oversize_admission
    assert (benign.action, benign.reserved_tokens) == (AdmissionAction.ADMIT, 500)
    assert codes(benign.reasons) == ["live_tokens_reserved"]
    assert (oversize.action, oversize.reserved_tokens) == (AdmissionAction.SHED, 0)
    assert codes(oversize.reasons) == ["token_bound_exceeded"]
    assert oversize.reasons[0].facts["request_tokens"] == 9000
    scaling = default_plan.decisions.autoscaling
    assert (scaling.target_replicas, scaling.calculated_demand_replicas) == (4, 4)
    assert scaling.ready_capacity_tokens_per_second == pytest.approx(1050.0)
    assert codes(scaling.reasons) == ["demand_matches_desired"]
    rollout = default_plan.decisions.rollout
    assert rollout.action is RolloutAction.PROMOTE
    assert codes(rollout.reasons) == ["all_gates_passed"]
    assert rollout.reasons[0].facts["relative_throughput"] == pytest.approx(350 / 330)


def test_every_primary_decision_names_its_reason(default_plan: FleetPlan) -> None:
    assert list(default_plan.deciding_reasons) == list(CONTROL_EVIDENCE)
    expected = {"memory-fit": "fits_with_headroom", "capacity-plan": "fleet_sized_by_bottleneck",
                "parallel-layout": "intra_node_tensor_split",
                "gpu-placement": "all_replicas_placed",
                "benign-admission": "live_tokens_reserved",
                "oversize-shedding": "token_bound_exceeded",
                "queue-scaling": "demand_matches_desired", "canary-gate": "all_gates_passed"}
    for control, reasons in default_plan.deciding_reasons.items():
        assert reasons, control
        assert reasons[0].code == expected[control]
        assert all(re.fullmatch(r"[a-z][a-z0-9_]*", r.code) and r.message.strip()
                   for r in reasons)


def test_the_default_fixture_file_is_the_default_scenario() -> None:
    assert load("default") == default_scenario()
    assert scenario_digest(load("default")) == scenario_digest(default_scenario())


# --- §2.5: the counterfactuals -------------------------------------------------------------

COUNTERFACTUALS = [("drop-generation", ["workload:generation"]),
                   ("inventory-30gib", ["gpu-placement"]),
                   ("fits-weights-not-kv", ["gpu-placement"]),
                   ("cramped-topology", ["gpu-placement", "parallel-layout"]),
                   ("canary-tpot-regression", ["canary-gate"]),
                   ("bypass-oversize-shedding", ["oversize-shedding"])]


@pytest.mark.parametrize(("name", "missing"), COUNTERFACTUALS)
def test_each_counterfactual_fails_on_exactly_its_missing_evidence(name: str,
                                                                   missing: list[str]) -> None:
    plan = run_plan(load(name))
    assert plan.release_ready is False
    assert list(plan.missing_evidence) == missing
    assert violation_codes(plan) == ["missing_required_evidence"]
    assert plan.violations[0].facts["missing_evidence"] == missing
    assert list(plan.required_evidence) == REQUIRED
    assert set(plan.observed_evidence) == set(REQUIRED) - set(missing)


@pytest.mark.parametrize(("name", "missing"), [("default", []), *COUNTERFACTUALS])
def test_all_replicas_and_derived_budget_reach_the_reference_verdicts(name: str,
                                                                      missing: list[str]) -> None:
    plan = run_plan(production(load(name)))
    assert plan.release_ready is (not missing)
    assert list(plan.missing_evidence) == missing


def test_dropping_generation_resizes_to_the_replica_floor() -> None:
    plan = run_plan(load("drop-generation"))
    capacity = plan.decisions.capacity
    assert (capacity.prompt_tokens_per_second, capacity.output_tokens_per_second,
            capacity.concurrent_requests) == pytest.approx((900.0, 225.0, 4.5))
    unrounded = {d.dimension.value: d.unrounded_replicas for d in capacity.demands}
    rounded = {d.dimension.value: d.required_replicas for d in capacity.demands}
    assert unrounded == pytest.approx({"minimum_replica_floor": 2.0, "prefill_tokens": 1.2,
                                       "decode_tokens": 225 / 262.5, "request_concurrency": 0.75})
    assert rounded == {"minimum_replica_floor": 2, "prefill_tokens": 2, "decode_tokens": 1,
                       "request_concurrency": 1}
    assert capacity.required_replicas == 2
    assert capacity.bottleneck is CapacityDimension.MINIMUM_REPLICA_FLOOR
    assert capacity.binding_dimensions == (CapacityDimension.MINIMUM_REPLICA_FLOOR,
                                           CapacityDimension.PREFILL_TOKENS)
    assert capacity.hourly_cost == pytest.approx(8.5)
    assert capacity.cost_per_million_output_tokens == pytest.approx(10.4938, abs=1e-4)
    sizing = plan.deciding_reasons["capacity-plan"][0]
    assert sizing.facts["binding_dimensions"] == ["minimum_replica_floor", "prefill_tokens"]
    assert plan.decisions.parallelism.data_parallel == 2
    assert plan.decisions.autoscaling.target_replicas == 2
    assert plan.decisions.autoscaling.ready_capacity_tokens_per_second == pytest.approx(525.0)


@pytest.mark.parametrize("name", ["inventory-30gib", "fits-weights-not-kv"])
def test_gpus_short_of_the_kv_aware_requirement_are_not_placeable(name: str) -> None:
    plan = run_plan(load(name))
    placement = plan.decisions.placement
    assert placement.placed is False and placement.reserved_gpu_ids == ()
    assert codes(placement.reasons) == ["replica_placement_refused", "no_feasible_group"]
    assert placement.reasons[1].facts["domains_by_failure"] == {"insufficient_memory": 2}


def test_inventory_between_weights_and_full_requirement_sits_inside_the_kv_gap() -> None:
    scenario = load("fits-weights-not-kv")
    memory = run_plan(scenario).decisions.memory
    (value,) = {gpu.free_memory_gib for gpu in scenario.inventory}
    assert value == pytest.approx(33.3459, abs=1e-4)
    assert memory.weight_gib_per_gpu + memory.overhead_gib_per_gpu < value
    assert value < memory.required_gib_per_gpu


def test_cramped_topology_picks_a_layout_the_memory_plan_does_not_cover() -> None:
    plan = run_plan(load("cramped-topology"))
    parallel = plan.decisions.parallelism
    assert (parallel.tensor_parallel, parallel.pipeline_parallel, parallel.data_parallel,
            parallel.expert_parallel) == (1, 3, 2, 1)
    assert parallel.memory_gib_per_gpu == pytest.approx(25.43895149230957)
    assert codes(parallel.reasons)[0] == "replica_shortfall"
    assert (parallel.reasons[0].facts["data_parallel"],
            parallel.reasons[0].facts["target_replicas"]) == (2, 4)
    assert plan.layout_matches_memory_plan is False
    assert "layout_differs_from_memory_plan" in codes(plan.deciding_reasons["parallel-layout"])


def test_canary_tpot_regression_rolls_back_naming_the_gate() -> None:
    plan = run_plan(load("canary-tpot-regression"))
    assert plan.decisions.rollout.action is RolloutAction.ROLLBACK
    assert codes(plan.deciding_reasons["canary-gate"]) == ["p95_tpot_exceeds_objective"]


def test_bypassing_oversize_shedding_fails_only_the_shedding_evidence() -> None:
    plan = run_plan(load("bypass-oversize-shedding"))
    oversize = plan.decisions.oversize_admission
    assert (oversize.action, oversize.reserved_tokens) == (AdmissionAction.ADMIT, 9000)
    assert codes(oversize.reasons) == ["test_stimulus_override"]
    assert plan.decisions.benign_admission.action is AdmissionAction.ADMIT
    assert plan.decisions.placement.placed is True


# --- §9 bug 7 regressions ------------------------------------------------------------------


def test_layout_mismatch_requests_no_fallback_placement() -> None:
    scenario = load("cramped-topology")
    assert all(gpu.free_memory_gib >= 36.0 for gpu in scenario.inventory)  # a fallback would fit
    placement = run_plan(scenario).decisions.placement
    assert placement.replicas == () and placement.reserved_gpu_ids == ()
    assert placement.placed is False
    assert codes(placement.reasons) == ["placement_not_requested_layout_mismatch"]


def test_a_pipeline_split_the_memory_plan_did_not_size_earns_no_placement() -> None:
    # The reference only compared GPU counts; TP=1 x PP=2 also uses 2 GPUs but shards
    # differently from the TP=2 plan, so it must not count as matching.
    scenario = replace(default_scenario(), topology=replace(default_scenario().topology,
                                                            fast_intra_node_collectives=False))
    plan = run_plan(scenario)
    parallel = plan.decisions.parallelism
    assert (parallel.tensor_parallel, parallel.pipeline_parallel) == (1, 2)
    assert plan.layout_matches_memory_plan is False
    assert plan.decisions.placement.replicas == ()


def test_placement_reserves_the_kv_aware_memory_the_fit_check_computed() -> None:
    plan = run_plan(production(default_scenario()))
    memory = plan.decisions.memory
    assert memory.kv_gib_per_gpu > 0
    assert plan.decisions.parallelism.memory_gib_per_gpu == pytest.approx(
        memory.required_gib_per_gpu)
    for attempt in plan.decisions.placement.replicas:
        assert attempt.decision.reasons[0].facts["memory_gib_per_gpu"] == (
            memory.required_gib_per_gpu)


def test_layout_weights_derive_from_the_model_not_a_restated_constant() -> None:
    scenario = default_scenario()
    bigger = replace(scenario, model_memory=replace(scenario.model_memory,
                                                    parameters=20_000_000_000))
    facts = run_plan(bigger).decisions.parallelism.reasons[0].facts
    assert facts["weight_memory_gib"] == pytest.approx(20e9 * 2 / GIB)


def test_generation_workload_is_half_a_request_per_second() -> None:
    (generation,) = [w for w in load("default").workloads if w.name == "generation"]
    assert generation.requests_per_second == 0.5
    assert run_plan(load("default")).decisions.capacity.output_tokens_per_second == 825.0


# --- grading by set difference, §7 derivations ---------------------------------------------


def test_an_extra_workload_adds_evidence_without_failing() -> None:
    scenario = default_scenario()
    extra = replace(scenario, workloads=(*scenario.workloads,
                                         WorkloadClass("batch", 0.1, 100.0, 100.0, 1.0, 1.0)))
    plan = run_plan(extra)
    assert plan.release_ready is True
    assert "workload:batch" in plan.observed_evidence
    assert "workload:batch" not in plan.required_evidence


def test_removing_a_stimulus_cannot_remove_its_obligation() -> None:
    plan = run_plan(load("drop-generation"))
    assert "workload:generation" in plan.required_evidence
    assert "workload:generation" not in plan.observed_evidence


def test_required_evidence_may_not_drop_a_control() -> None:
    plain = load_plain("default")
    plain["required_evidence"].remove("gpu-placement")
    with pytest.raises(PolicyInputError) as caught:
        scenario_from_plain(plain)
    assert (caught.value.code, caught.value.field) == ("required_evidence_below_policy_floor",
                                                       "required_evidence")


@pytest.mark.parametrize(("probe", "action", "missing"),
                         [("interactive-request", AdmissionAction.SHED, "benign-admission"),
                          ("unbounded-request", AdmissionAction.SHED, "oversize-shedding")])
def test_a_block_all_or_wrong_reason_shed_earns_no_admission_evidence(
        probe: str, action: AdmissionAction, missing: str) -> None:
    override = AdmissionOverride(probe, action, 0, "shed for a reason other than the bound")
    plan = run_plan(replace(default_scenario(), test_stimulus_admission_overrides=(override,)))
    assert list(plan.missing_evidence) == [missing]


def test_downstream_inputs_derive_from_upstream_decisions() -> None:
    plan = run_plan(default_scenario())
    capacity = plan.decisions.capacity
    assert plan.decisions.autoscaling.reasons[0].facts["newest_arrival_tokens_per_second"] == (
        capacity.output_tokens_per_second)
    assert plan.decisions.parallelism.reasons[0].facts["target_replicas"] == (
        capacity.required_replicas)
    renamed = replace(default_scenario(), candidate_release=replace(
        default_scenario().candidate_release, revision="model@xyz"))
    (attempt,) = run_plan(renamed).decisions.placement.replicas
    assert attempt.decision.reasons[0].facts["resident_copies"] == 0


def test_derived_admission_budget_comes_from_the_memory_plan() -> None:
    reference = run_plan(default_scenario())
    derived = run_plan(production(default_scenario()))
    assert (reference.admission_policy.max_live_tokens,
            reference.admission_policy.max_tokens_per_request) == (8192, 4096)
    assert (derived.admission_policy.max_live_tokens,
            derived.admission_policy.max_tokens_per_request) == (4096 * 6, 4096)
    assert derived.decisions.benign_admission.reasons[0].facts["max_live_tokens"] == 24576


# --- all-replicas placement ----------------------------------------------------------------


def test_all_replicas_mode_places_every_required_replica_on_its_own_gpus() -> None:
    placement = run_plan(load("all-replicas")).decisions.placement
    assert placement.placed is True
    assert (placement.requested_replicas, placement.placed_replicas) == (4, 4)
    assert [a.decision.gpu_ids for a in placement.replicas] == [
        ("a0", "a1"), ("a2", "a3"), ("b0", "b1"), ("b2", "b3")]
    assert sorted(placement.reserved_gpu_ids) == sorted(g.identifier for g in
                                                        default_scenario().inventory)


def test_all_replicas_placement_stops_at_the_first_refusal() -> None:
    scenario = production(default_scenario())
    inventory = tuple(replace(g, free_memory_gib=20.0) if g.identifier == "b3" else g
                      for g in scenario.inventory)
    plan = run_plan(replace(scenario, inventory=inventory))
    placement = plan.decisions.placement
    assert (placement.placed, placement.placed_replicas, len(placement.replicas)) == (False, 3, 4)
    assert codes(placement.reasons) == ["replica_placement_refused", "no_feasible_group"]
    assert placement.reasons[0].facts["refused_replica"] == "replica-4"
    assert placement.reasons[1].facts["domains_by_failure"] == {"gpu_reserved": 1,
                                                                "insufficient_memory": 1}
    assert list(plan.missing_evidence) == ["gpu-placement"]


def test_reserving_a_gpu_twice_is_refused() -> None:
    inventory = reserve_gpus(default_scenario().inventory, ["a0"])
    with pytest.raises(ValueError):
        reserve_gpus(inventory, ["a0", "a1"])


GPUS = st.lists(st.tuples(st.sampled_from(["n0", "n1", "n2"]),
                          st.sampled_from([20.0, 34.0, REQUIRED_GIB, 40.0, 80.0]),
                          st.booleans(), st.booleans(), st.booleans()),
                min_size=0, max_size=12)


@settings(max_examples=60, deadline=None)
@given(GPUS)
def test_all_replicas_never_reserves_a_gpu_twice_and_places_what_fits(
        gpus: list[tuple[str, float, bool, bool, bool]]) -> None:
    inventory = tuple(GPU(f"g{i}", node, free, FAST if capable else frozenset({"bf16"}),
                          frozenset({"model@abc"}) if resident else frozenset(),
                          reserved=reserved)
                      for i, (node, free, capable, resident, reserved) in enumerate(gpus))
    plan = run_plan(replace(production(default_scenario()), inventory=inventory))
    placement = plan.decisions.placement
    chosen = [gpu for a in placement.replicas for gpu in a.decision.gpu_ids]
    assert len(chosen) == len(set(chosen)) == 2 * placement.placed_replicas
    by_id = {gpu.identifier: gpu for gpu in inventory}
    for attempt in placement.replicas:
        group = [by_id[i] for i in attempt.decision.gpu_ids]
        assert len({gpu.node for gpu in group}) <= 1
        assert all(not g.reserved and g.free_memory_gib >= REQUIRED_GIB for g in group)
    eligible: dict[str, int] = {}
    for gpu in inventory:
        if not gpu.reserved and gpu.capabilities >= FAST and gpu.free_memory_gib >= REQUIRED_GIB:
            eligible[gpu.node] = eligible.get(gpu.node, 0) + 1
    assert placement.placed_replicas == min(4, sum(n // 2 for n in eligible.values()))
    assert placement.placed is (placement.placed_replicas == 4)
    assert ("gpu-placement" in plan.observed_evidence) is placement.placed
    canonical_json(plan_to_plain(plan))


# --- digest, determinism, freshness, finiteness --------------------------------------------


def test_two_runs_give_byte_identical_canonical_json() -> None:
    first = canonical_json(plan_to_plain(run_plan(load("default"))))
    second = canonical_json(plan_to_plain(run_plan(load("default"))))
    assert first == second


def test_the_digest_is_the_sha256_of_the_scenarios_canonical_json() -> None:
    scenario = load("default")
    text = json.dumps(to_plain(scenario), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)
    assert run_plan(scenario).inputs_digest == hashlib.sha256(text.encode()).hexdigest()


def test_an_integer_for_a_float_field_binds_the_same_digest() -> None:
    plain = load_plain("default")
    plain["topology"]["gpu_memory_gib"] = 40
    assert scenario_digest(scenario_from_plain(plain)) == scenario_digest(default_scenario())


MUTATIONS: list[tuple[str, Callable[[Scenario, float], Scenario]]] = [
    ("hourly_cost", lambda s, v: replace(s, benchmark=replace(s.benchmark, hourly_cost=v))),
    ("free_memory", lambda s, v: replace(s, inventory=(
        replace(s.inventory[0], free_memory_gib=v), *s.inventory[1:]))),
    ("p95_tpot", lambda s, v: replace(s, candidate_release=replace(s.candidate_release,
                                                                   p95_tpot_seconds=v))),
    ("evaluated_at", lambda s, v: replace(s, evaluated_at_seconds=v)),
    ("rps", lambda s, v: replace(s, workloads=(replace(s.workloads[0], requests_per_second=v),
                                               *s.workloads[1:]))),
    ("observed_at", lambda s, v: replace(s, evidence_times=replace(
        s.evidence_times, benchmark=ObservedAt(v, 604_800.0)))),
]


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(MUTATIONS), st.floats(0, 1e6, allow_nan=False))
def test_changing_any_input_changes_the_digest(
        mutation: tuple[str, Callable[[Scenario, float], Scenario]], value: float) -> None:
    base = default_scenario()
    changed = mutation[1](base, value)
    assert (scenario_digest(changed) == scenario_digest(base)) is (changed == base)


@pytest.mark.parametrize("source", ["benchmark", "inventory", "baseline_release",
                                    "candidate_release"])
def test_stale_evidence_fails_release_with_its_own_code(source: str) -> None:
    scenario = default_scenario()
    times = replace(scenario.evidence_times, **{source: ObservedAt(10.0, 89.0)})
    plan = run_plan(replace(scenario, evidence_times=times))
    assert plan.release_ready is False
    assert violation_codes(plan) == ["evidence_stale"]
    assert plan.violations[0].facts["source"] == source
    assert plan.violations[0].facts["age_seconds"] == pytest.approx(90.0)
    assert plan.missing_evidence == ()


def test_evidence_exactly_at_its_maximum_age_is_fresh() -> None:
    scenario = default_scenario()
    times = replace(scenario.evidence_times, candidate_release=ObservedAt(10.0, 90.0))
    assert run_plan(replace(scenario, evidence_times=times)).release_ready is True


def test_evidence_dated_after_the_evaluation_is_refused() -> None:
    plain = load_plain("default")
    plain["evidence_times"]["benchmark"]["observed_at_seconds"] = 101.0
    with pytest.raises(PolicyInputError) as caught:
        scenario_from_plain(plain)
    assert (caught.value.code, caught.value.field) == (
        "evidence_from_the_future", "evidence_times.benchmark.observed_at_seconds")


def test_an_infeasible_layout_serialises_without_infinity() -> None:
    scenario = replace(default_scenario(), topology=replace(default_scenario().topology,
                                                            gpu_memory_gib=10.0))
    plain = plan_to_plain(run_plan(scenario))
    assert plain["decisions"]["parallelism"]["memory_gib_per_gpu"] is None
    assert "Infinity" not in canonical_json(plain) and "NaN" not in canonical_json(plain)


# --- parsing -------------------------------------------------------------------------------


def test_every_fixture_file_parses_and_round_trips() -> None:
    files = sorted(SCENARIOS.glob("*.json"))
    assert len(files) >= 8
    for path in files:
        scenario = load(path.stem)
        assert scenario.name == path.stem and scenario.description.strip()
        assert scenario_from_plain(to_plain(scenario)) == scenario


def _set(plain: dict[str, Any], path: str, value: object) -> None:
    *parents, last = path.split(".")
    node: Any = plain
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(last) if last.isdigit() else last] = value


@pytest.mark.parametrize(("path", "value", "code", "field"), [
    ("topology.gpu_memory_gib", float("nan"), "not_finite", "topology.gpu_memory_gib"),
    ("capacity_requirements.min_replicas", 2.5, "wrong_type",
     "capacity_requirements.min_replicas"),
    ("benchmark.surprise", 1, "unknown_field", "benchmark.surprise"),
    ("placement_mode", "every-other", "invalid_choice", "placement_mode"),
    ("inventory.0.capabilities", ["bf16", "bf16"], "duplicate_entry", "inventory[0].capabilities"),
    ("model_memory.kv_heads", 0, "model_field_not_positive", "model_memory.kv_heads"),
    ("inventory.2.free_memory_gib", -1.0, "free_memory_invalid", "inventory.free_memory_gib"),
    ("capacity_requirements.max_replicas", 1, "replica_bounds_invalid",
     "capacity_requirements.max_replicas"),
    ("candidate_release.quality_score", -0.1, "measurement_invalid",
     "candidate_release.quality_score"),
    ("benign_probe.request.prompt_tokens", -1, "token_count_negative",
     "benign_probe.request.prompt_tokens"),
    ("autoscaling.policy.target_utilization", 0.0, "target_utilization_out_of_range",
     "autoscaling.policy.target_utilization"),
    ("topology.usable_fraction", 1.5, "usable_fraction_out_of_range", "topology.usable_fraction"),
])
def test_bad_input_is_refused_naming_the_scenario_field(path: str, value: object, code: str,
                                                        field: str) -> None:
    plain = load_plain("default")
    _set(plain, path, value)
    with pytest.raises(PolicyInputError) as caught:
        scenario_from_plain(plain)
    assert (caught.value.code, caught.value.field) == (code, field)


def test_a_missing_field_or_a_non_object_is_refused() -> None:
    plain = load_plain("default")
    del plain["evaluated_at_seconds"]
    with pytest.raises(PolicyInputError) as caught:
        scenario_from_plain(plain)
    assert (caught.value.code, caught.value.field) == ("missing_field", "evaluated_at_seconds")
    with pytest.raises(PolicyInputError) as caught:
        scenario_from_plain([])
    assert caught.value.code == "not_an_object"


def test_an_override_must_name_a_probe() -> None:
    plain = load_plain("bypass-oversize-shedding")
    plain["test_stimulus_admission_overrides"][0]["request_id"] = "someone-else"
    with pytest.raises(PolicyInputError) as caught:
        scenario_from_plain(plain)
    assert (caught.value.code, caught.value.field) == (
        "admission_override_unknown_request", "test_stimulus_admission_overrides[0].request_id")


def test_a_placement_refused_on_an_inventory_unlike_the_declared_topology_says_so() -> None:
    """The layout is sized on the scenario's topology (2 nodes of 4 GPUs: tensor parallel 2 in
    a node); eight one-GPU nodes cannot hold that group, and the refusal names the mismatch."""
    scenario = default_scenario()
    single = tuple(replace(gpu, node=f"solo-{index}")
                   for index, gpu in enumerate(scenario.inventory))
    placement = run_plan(replace(scenario, inventory=single)).decisions.placement
    assert placement.placed is False
    assert codes(placement.reasons)[-1] == "inventory_differs_from_topology"
    assert placement.reasons[-1].facts == {
        "topology_nodes": 2, "topology_gpus_per_node": 4, "inventory_nodes": 8,
        "inventory_gpus_per_node": [1]}
    assert "8 nodes of 1 GPU" in placement.reasons[-1].message
    # The reference inventory has the topology's shape: its refusals add nothing (see above).
    assert "inventory_differs_from_topology" not in codes(
        run_plan(load("inventory-30gib")).decisions.placement.reasons)
