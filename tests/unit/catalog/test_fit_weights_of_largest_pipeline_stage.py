"""`fleetctl fit --pp`: weights per GPU are the largest stage's, with the embeddings on the first
stage and the output head on the last, never the average stage."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.catalog.fit import FitRequest, plan_fit
from controlplane.catalog.registry import load_catalog
from controlplane.catalog.subject import ArchitectureOverrides, pipeline_split
from controlplane.policies.memory import GIB
from controlplane.policies.reasons import Reason

CATALOG = load_catalog()


def fit_weights(model: str, stages: int, **changes: Any) -> tuple[float, Reason | None]:
    report = plan_fit(FitRequest(model=model, gpu_memory_gib=1000, pipeline_parallel_size=stages,
                                 max_model_len_tokens=4096, **changes), CATALOG)
    note = next((n for n in report.notes if n.code == "weights_of_largest_stage"), None)
    return report.weight_gib_per_gpu, note


def test_llama_8b_on_four_stages_holds_its_largest_stage_per_gpu() -> None:
    weights, note = fit_weights("meta-llama/Llama-3.1-8B", 4)
    embeddings = 128_256 * 4_096
    last_stage = 8 * 218_112_000 + embeddings + 4_096  # 8 layers, the untied head, final norm
    assert weights == last_stage * 16 / 8 / GIB
    assert weights > 1.13 * 8_030_261_248 * 2 / 4 / GIB  # ~13% over the average stage
    assert note is not None and note.facts["stage_parameters"] == last_stage
    assert note.facts["layers_per_stage"] == 8


def _uniform_layers(model_id: str) -> bool:
    experts = CATALOG.model(model_id).architecture.experts
    return experts is None or experts.dense_layers == 0


UNIFORM = sorted(m for m in CATALOG.models if _uniform_layers(m))


@pytest.mark.parametrize("model_id", UNIFORM)
def test_the_split_of_a_catalog_model_adds_up_to_its_published_count(model_id: str) -> None:
    """Layers, embeddings, the untied head (a tied one is a copy) and the final norm."""
    entry = CATALOG.model(model_id)
    arch = entry.architecture
    split = pipeline_split(arch)
    untied_head = 0 if arch.tie_word_embeddings else split.first_stage_parameters
    assert (arch.layers * split.layer_parameters + split.first_stage_parameters + untied_head
            + arch.hidden_size) == entry.parameters.total


def test_deepseek_v3_s_largest_layer_is_a_mixture_of_experts_layer() -> None:
    """research-data §1.3: MLA attention, 2 norms, 256 routed + 1 shared experts of 3 x 7168 x
    2048, a router of 256 x 7168; its 3 leading dense layers are smaller."""
    arch = CATALOG.model("deepseek-ai/DeepSeek-V3").architecture
    d, heads = 7_168, 128
    query = d * 1_536 + 1_536 + 1_536 * heads * (128 + 64)
    key_value = d * (512 + 64) + 512 + 512 * heads * (128 + 128)
    attention = query + key_value + heads * 128 * d
    moe_layer = attention + 2 * d + 257 * 3 * d * 2_048 + 256 * d
    dense_layer = attention + 2 * d + 3 * d * 18_432
    split = pipeline_split(arch)
    assert split.layer_parameters == moe_layer > dense_layer
    assert (3 * dense_layer + 58 * moe_layer + 2 * 129_280 * d + d
            == CATALOG.model("deepseek-ai/DeepSeek-V3").parameters.total)


def test_a_tied_model_s_last_stage_holds_its_own_copy_of_the_embeddings() -> None:
    gemma = CATALOG.model("google/gemma-2-9b")
    split = pipeline_split(gemma.architecture)
    embeddings = 256_000 * 3_584
    assert gemma.architecture.tie_word_embeddings
    assert (split.first_stage_parameters, split.last_stage_parameters) == (
        embeddings, embeddings + 3_584)
    weights, _ = fit_weights("google/gemma-2-9b", 2)
    assert weights == (21 * split.layer_parameters + embeddings + 3_584) * 16 / 8 / GIB


def test_deepseek_v3_stages_are_sized_by_mixture_of_experts_layers() -> None:
    deepseek = CATALOG.model("deepseek-ai/DeepSeek-V3")
    split = pipeline_split(deepseek.architecture)
    weights, note = fit_weights("deepseek-ai/DeepSeek-V3", 4)
    stage = 16 * split.layer_parameters + split.last_stage_parameters  # ceil(61 / 4) layers
    assert note is not None and note.facts["stage_parameters"] == stage
    assert weights == stage * 8 / 8 / GIB  # FP8 checkpoint
    assert stage > deepseek.parameters.total * 16 / 61


def test_one_stage_is_the_whole_model_as_before() -> None:
    weights, note = fit_weights("meta-llama/Llama-3.1-8B", 1)
    assert weights == 8_030_261_248 * 16 / 8 / GIB and note is None


def test_a_declared_count_is_spread_evenly_over_ceil_layers_per_stage() -> None:
    weights, note = fit_weights("meta-llama/Llama-3.1-8B", 3,
                                overrides=ArchitectureOverrides(parameters=32 * GIB))
    assert weights == 11 * GIB * 16 / 8 / GIB  # ceil(32 / 3) = 11 layers of 1 GiB
    assert note is not None and "evenly" in note.message
