"""Pipeline stages: the weights per GPU are those of the largest stage, not the average one.

Layers split as evenly as possible, so a stage holds at most ceil(layers / stages); the first
stage also holds the input embeddings, the last the output head (`PipelineSplit`).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.policies.fleet_plan_scenario import default_scenario
from controlplane.policies.fleet_plan_stages import memory_stage
from controlplane.policies.memory import (
    GIB,
    DeploymentMemory,
    ModelMemory,
    PipelineSplit,
    assess_memory,
    largest_stage_parameters,
)
from controlplane.policies.reasons import PolicyInputError

# Llama-3.1-8B (research-data §1.1): 32 layers of 218,112,000 parameters, 128,256 x 4,096
# embeddings and an untied head of the same size, a final norm of 4,096.
LLAMA_8B = ModelMemory(parameters=8_030_261_248, weight_bits=16, layers=32, kv_heads=8,
                       head_dim=128)
EMBEDDINGS = 128_256 * 4_096
LLAMA_8B_SPLIT = PipelineSplit(layer_parameters=218_112_000, first_stage_parameters=EMBEDDINGS,
                               last_stage_parameters=EMBEDDINGS + 4_096)


def deployment(stages: int) -> DeploymentMemory:
    return DeploymentMemory(gpu_memory_gib=80, tensor_parallel_size=1, kv_shards=1,
                            max_live_tokens_per_request=8_192, target_concurrency=1,
                            runtime_overhead_gib=2, pipeline_parallel_size=stages)


def test_the_split_accounts_for_every_parameter_of_llama_8b() -> None:
    # One stage holds the whole model: the split's parts add up to the published count.
    assert (32 * LLAMA_8B_SPLIT.layer_parameters + LLAMA_8B_SPLIT.first_stage_parameters
            + LLAMA_8B_SPLIT.last_stage_parameters) == LLAMA_8B.parameters


def test_four_stages_of_llama_8b_put_the_last_stage_on_each_gpu_13_percent_over_average() -> None:
    assessed = assess_memory(LLAMA_8B, deployment(4), LLAMA_8B_SPLIT)
    last_stage = 8 * 218_112_000 + EMBEDDINGS + 4_096  # 8 layers, the head and the final norm
    assert assessed.weight_gib_per_gpu == last_stage * 16 / 8 / GIB
    average = LLAMA_8B.parameters * 16 / 8 / 4 / GIB
    assert assessed.weight_gib_per_gpu / average == pytest.approx(1.1308, abs=1e-4)


def test_without_a_split_a_stage_holds_ceil_layers_of_evenly_spread_parameters() -> None:
    model = ModelMemory(parameters=61 * GIB, weight_bits=8, layers=61, kv_heads=1, head_dim=1)
    assessed = assess_memory(model, deployment(2))
    assert assessed.weight_gib_per_gpu == 31.0  # ceil(61 / 2) layers of 1 GiB each
    assert largest_stage_parameters(model, 4) == 16 * GIB


def test_one_stage_holds_the_whole_count_whatever_the_split_says() -> None:
    assert largest_stage_parameters(LLAMA_8B, 1, LLAMA_8B_SPLIT) == LLAMA_8B.parameters
    with_split = assess_memory(LLAMA_8B, deployment(1), LLAMA_8B_SPLIT)
    assert with_split == assess_memory(LLAMA_8B, deployment(1))


def test_uneven_layers_put_ceil_layers_beside_the_larger_end() -> None:
    split = PipelineSplit(layer_parameters=10, first_stage_parameters=7,
                          last_stage_parameters=3, every_stage_parameters=5)
    model = ModelMemory(parameters=5 + 61 * 10 + 7 + 3, weight_bits=16, layers=61, kv_heads=1,
                        head_dim=1)
    assert largest_stage_parameters(model, 4, split) == 5 + 16 * 10 + 7


@pytest.mark.parametrize("name", ["layer_parameters", "first_stage_parameters",
                                  "last_stage_parameters", "every_stage_parameters"])
def test_a_negative_or_fractional_split_is_refused_naming_the_field(name: str) -> None:
    for bad in (-1, 1.5):
        split = PipelineSplit(**{"layer_parameters": 1, name: bad})  # type: ignore[arg-type]
        with pytest.raises(PolicyInputError) as refused:
            assess_memory(LLAMA_8B, deployment(2), split)
        assert (refused.value.code, refused.value.field) == ("pipeline_split_invalid", name)


def test_the_fleet_plan_memory_stage_sizes_the_largest_stage_of_its_declared_model() -> None:
    """The spec's 30B model on 7 stages: 60 layers put ceil(60 / 7) = 9 on a GPU, not 60 / 7."""
    scenario = default_scenario()
    staged = replace(scenario, deployment_memory=replace(scenario.deployment_memory,
                                                         pipeline_parallel_size=7))
    weight_gib = memory_stage(staged, {})["weight_gib_per_gpu"]
    assert weight_gib == 30_000_000_000 * 9 / 60 * 16 / 8 / 2 / GIB
    # One stage keeps the spec's §2.4 figure.
    assert memory_stage(scenario, {})["weight_gib_per_gpu"] == 27.939677238464355
