"""Parallel layout (spec §1.7, example 07, §2.4/§2.5 layout figures)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.memory import GIB, DeploymentMemory, ModelMemory, assess_memory
from controlplane.policies.parallelism import (
    MAX_GPUS_PER_NODE,
    ClusterTopology,
    ParallelModel,
    divisors,
    plan_parallelism,
)
from controlplane.policies.reasons import PolicyInputError, to_plain


def codes(plan: object) -> list[str]:
    return [reason.code for reason in plan.reasons]  # type: ignore[attr-defined]


def capstone_model() -> ParallelModel:
    """The capstone derives the layout input from the memory plan instead of restating it."""
    memory = assess_memory(ModelMemory(30_000_000_000, 16, 60, 8, 128),
                           DeploymentMemory(40, 2, 2, 4096, 6, 4))
    weight_gib = 30_000_000_000 * 16 / 8 / GIB
    return ParallelModel(weight_gib, memory.overhead_gib_per_gpu + memory.kv_gib_per_gpu)


def test_fast_intra_node_link_prefers_tensor_parallel_fit() -> None:
    plan = plan_parallelism(ParallelModel(60, 4), ClusterTopology(2, 4, 40, 0.9, True), 2)
    assert plan.feasible
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.data_parallel) == (2, 1, 2)
    assert plan.expert_parallel == 1
    assert plan.memory_gib_per_gpu == pytest.approx(34.0)
    assert codes(plan) == ["intra_node_tensor_split"]


def test_without_fast_collectives_pipeline_parallelism_carries_the_split() -> None:
    plan = plan_parallelism(ParallelModel(60, 4), ClusterTopology(1, 4, 40, 0.9, False), 1)
    assert (plan.tensor_parallel, plan.pipeline_parallel) == (1, 2)
    assert codes(plan) == ["pipeline_split"]


@pytest.mark.parametrize(("fast", "tensor", "pipeline", "code"), [
    (True, 2, 1, "intra_node_tensor_split"),
    (False, 1, 2, "pipeline_split"),
])
def test_example_07_moe_layouts_for_fast_and_slow_links(
        fast: bool, tensor: int, pipeline: int, code: str) -> None:
    plan = plan_parallelism(ParallelModel(60, 4, experts=8),
                            ClusterTopology(2, 4, 40, 0.9, fast), 2)
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.data_parallel,
            plan.expert_parallel) == (tensor, pipeline, 2, 2)
    assert plan.memory_gib_per_gpu == pytest.approx(34.0)
    assert codes(plan) == [code]


def test_moe_plan_reports_an_expert_partition_that_divides_experts() -> None:
    plan = plan_parallelism(ParallelModel(100, 4, experts=8),
                            ClusterTopology(1, 4, 40, 0.9, True), 1)
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.expert_parallel) == (4, 1, 4)
    assert plan.memory_gib_per_gpu == pytest.approx(29.0)


def test_reports_replica_shortfall_instead_of_claiming_target_capacity() -> None:
    plan = plan_parallelism(ParallelModel(60, 4), ClusterTopology(1, 2, 40, 0.9, True), 2)
    assert plan.data_parallel == 1
    assert codes(plan)[0] == "replica_shortfall"
    assert plan.reasons[0].facts["data_parallel"] == 1
    assert plan.reasons[0].facts["target_replicas"] == 2


def test_single_gpu_fit_leaves_the_rest_to_data_parallelism() -> None:
    plan = plan_parallelism(ParallelModel(10, 4), ClusterTopology(1, 4, 40, 0.9, True), 3)
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.data_parallel) == (1, 1, 3)
    assert codes(plan) == ["single_gpu_replica"]


def test_capstone_layout_is_tp2_with_four_replicas_at_the_memory_plan_size() -> None:
    plan = plan_parallelism(capstone_model(), ClusterTopology(2, 4, 40, 0.9, True), 4)
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.data_parallel,
            plan.expert_parallel) == (2, 1, 4, 1)
    assert plan.memory_gib_per_gpu == pytest.approx(34.752177238464355, abs=1e-12)
    assert codes(plan) == ["intra_node_tensor_split"]


def test_cramped_capstone_topology_picks_three_stage_pipeline_and_reports_shortfall() -> None:
    plan = plan_parallelism(capstone_model(), ClusterTopology(2, 4, 36, 0.9, True), 4)
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.data_parallel,
            plan.expert_parallel) == (1, 3, 2, 1)
    assert plan.memory_gib_per_gpu == pytest.approx(25.43895149230957, abs=1e-12)
    assert plan.gpus_per_replica == 3
    assert codes(plan) == ["replica_shortfall", "pipeline_split"]
    assert (plan.reasons[0].facts["data_parallel"], plan.reasons[0].facts["target_replicas"]) \
        == (2, 4)


def test_infeasible_layout_reports_no_size_instead_of_infinity() -> None:
    plan = plan_parallelism(ParallelModel(1000, 4), ClusterTopology(2, 4, 40, 0.9, True), 4)
    assert not plan.feasible
    assert plan.memory_gib_per_gpu is None
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.data_parallel) == (0, 0, 0)
    assert codes(plan) == ["no_layout_fits"]
    assert plan.reasons[0].facts["smallest_memory_gib_per_gpu"] == pytest.approx(129.0)
    json.dumps(to_plain(plan), allow_nan=False)


def test_runtime_alone_exceeding_usable_memory_is_infeasible() -> None:
    plan = plan_parallelism(ParallelModel(1, 40), ClusterTopology(1, 8, 40, 0.9, True), 1)
    assert not plan.feasible


@pytest.mark.parametrize(("model", "topology", "target", "field"), [
    (ParallelModel(0, 4), ClusterTopology(1, 4, 40, 0.9, True), 1, "weight_memory_gib"),
    (ParallelModel(60, -1), ClusterTopology(1, 4, 40, 0.9, True), 1,
     "runtime_memory_gib_per_gpu"),
    (ParallelModel(math.nan, 4), ClusterTopology(1, 4, 40, 0.9, True), 1, "weight_memory_gib"),
    (ParallelModel(60, 4, 0), ClusterTopology(1, 4, 40, 0.9, True), 1, "experts"),
    (ParallelModel(60, 4), ClusterTopology(0, 4, 40, 0.9, True), 1, "nodes"),
    (ParallelModel(60, 4), ClusterTopology(1, 4, math.inf, 0.9, True), 1, "gpu_memory_gib"),
    (ParallelModel(60, 4), ClusterTopology(1, 4, 40, 1.5, True), 1, "usable_fraction"),
    (ParallelModel(60, 4), ClusterTopology(1, 4, 40, 0.9, True), 0, "target_replicas"),
])
def test_invalid_inputs_are_refused_naming_the_field(
        model: ParallelModel, topology: ClusterTopology, target: int, field: str) -> None:
    with pytest.raises(PolicyInputError) as error:
        plan_parallelism(model, topology, target)
    assert error.value.field == field


def test_a_node_of_more_gpus_than_the_limit_is_refused_naming_gpus_per_node() -> None:
    """Regression: gpus_per_node had no bound; 720,720,000 took minutes to enumerate."""
    for per_node in (MAX_GPUS_PER_NODE + 1, 720_720_000, 10**18):
        with pytest.raises(PolicyInputError) as error:
            plan_parallelism(ParallelModel(60, 4), ClusterTopology(1, per_node, 40, 0.9, True), 1)
        assert (error.value.code, error.value.field) == ("gpus_per_node_above_limit",
                                                         "gpus_per_node")
    plan = plan_parallelism(ParallelModel(60, 4),
                            ClusterTopology(1, MAX_GPUS_PER_NODE, 40, 0.9, True), 1)
    assert (plan.tensor_parallel, plan.pipeline_parallel) == (2, 1)


class _CountingModulus(int):
    """An integer that counts the trial divisions made of it."""

    divisions = 0

    def __mod__(self, other: int) -> int:  # type: ignore[override]
        _CountingModulus.divisions += 1
        return int(self) % other


def test_divisors_are_found_with_square_root_many_trial_divisions() -> None:
    assert divisors(1) == [1] and divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert all(divisors(n) == [d for d in range(1, n + 1) if n % d == 0] for n in range(1, 1500))
    assert len(divisors(720_720_000)) == 960
    _CountingModulus.divisions = 0
    assert divisors(_CountingModulus(10**6)) == [d for d in range(1, 10**6 + 1) if 10**6 % d == 0]
    assert _CountingModulus.divisions == 1000


def reference_plan(model: ParallelModel, topology: ClusterTopology,
                   target: int) -> tuple[int, int, int, int] | None:
    """The spec's scan over every (tp, pp) pair, used as an oracle."""
    total = topology.nodes * topology.gpus_per_node
    usable = topology.gpu_memory_gib * topology.usable_fraction
    widths = [w for w in range(1, topology.gpus_per_node + 1) if topology.gpus_per_node % w == 0]
    if not topology.fast_intra_node_collectives:
        widths = [1]
    candidates = []
    for tp in widths:
        for pp in range(1, total // tp + 1):
            if model.weight_memory_gib / (tp * pp) + model.runtime_memory_gib_per_gpu <= usable:
                preference = pp if topology.fast_intra_node_collectives else tp
                candidates.append((tp * pp, preference, tp, pp))
    if not candidates:
        return None
    gpus, _, tp, pp = min(candidates)
    ep = max(d for d in range(1, model.experts + 1) if model.experts % d == 0 and d <= gpus)
    return tp, pp, min(target, total // gpus), ep


@settings(max_examples=300, deadline=None)
@given(weight=st.floats(0.5, 2000), runtime=st.floats(0, 60), experts=st.integers(1, 64),
       nodes=st.integers(1, 6), per_node=st.integers(1, 8), memory=st.floats(8, 192),
       fraction=st.floats(0.05, 1.0), fast=st.booleans(), target=st.integers(1, 12))
def test_layout_equals_the_exhaustive_scan_and_never_exceeds_usable_memory(
        weight: float, runtime: float, experts: int, nodes: int, per_node: int, memory: float,
        fraction: float, fast: bool, target: int) -> None:
    model = ParallelModel(weight, runtime, experts)
    topology = ClusterTopology(nodes, per_node, memory, fraction, fast)
    plan = plan_parallelism(model, topology, target)
    expected = reference_plan(model, topology, target)
    json.dumps(to_plain(plan), allow_nan=False)
    if expected is None:
        assert not plan.feasible and plan.memory_gib_per_gpu is None
        return
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.data_parallel,
            plan.expert_parallel) == expected
    assert plan.memory_gib_per_gpu is not None
    assert plan.memory_gib_per_gpu <= memory * fraction
    assert per_node % plan.tensor_parallel == 0
    assert experts % plan.expert_parallel == 0
    assert 1 <= plan.data_parallel <= target
    assert plan.data_parallel * plan.gpus_per_replica <= nodes * per_node
